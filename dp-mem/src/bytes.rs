//! Human-readable byte counts for reports, error messages and budgets given as text.

use std::fmt;
use std::str::FromStr;

/// Formats a byte count with a binary unit (`512 B`, `1.50 KiB`, `8.00 MiB`), and parses one
/// (`12GiB`, `1.5 GiB`, `512MiB`, `4096`): the units are binary whichever way they are
/// spelled (`GB` and `G` mean GiB, as memory is sold and as `ulimit` and `free` count it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
        let (number, unit) = (text[..split].trim(), text[split..].trim());
        let shift = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => 0,
            "k" | "kb" | "kib" => 10,
            "m" | "mb" | "mib" => 20,
            "g" | "gb" | "gib" => 30,
            "t" | "tb" | "tib" => 40,
            _ => return Err(format!("`{text}`: unknown unit `{unit}` (B, KiB, MiB, GiB or TiB)")),
        };
        let value: f64 =
            number.parse().map_err(|_| format!("`{text}` is not a size such as 12GiB"))?;
        let bytes = value * (1u64 << shift) as f64;
        if !(bytes.is_finite() && bytes < u64::MAX as f64) {
            return Err(format!("`{text}` is too large"));
        }
        Ok(ByteSize(bytes.round() as u64))
    }
}

/// Written exactly, in the largest unit that divides it (`"512MiB"`), as configs spell it.
impl serde::Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let unit = ["TiB", "GiB", "MiB", "KiB"]
            .into_iter()
            .zip([40, 30, 20, 10])
            .find(|&(_, shift)| self.0 > 0 && self.0.is_multiple_of(1 << shift));
        match unit {
            Some((unit, shift)) => serializer.serialize_str(&format!("{}{unit}", self.0 >> shift)),
            None => serializer.serialize_str(&self.0.to_string()),
        }
    }
}

/// Read as text with a unit (`"12GiB"`, `"1.5 GiB"`) or as a plain number of bytes.
impl<'de> serde::Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Written {
            Bytes(u64),
            Text(String),
        }
        match Written::deserialize(deserializer)? {
            Written::Bytes(bytes) => Ok(ByteSize(bytes)),
            Written::Text(text) => text.parse().map_err(serde::de::Error::custom),
        }
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
        let text = if self.0 < 1024 {
            format!("{} B", self.0)
        } else {
            let mut value = self.0 as f64 / 1024.0;
            let mut unit = 0;
            while value >= 1024.0 && unit + 1 < UNITS.len() {
                value /= 1024.0;
                unit += 1;
            }
            format!("{value:.2} {}", UNITS[unit])
        };
        f.pad(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_largest_unit_below_1024() {
        assert_eq!(ByteSize(0).to_string(), "0 B");
        assert_eq!(ByteSize(1023).to_string(), "1023 B");
        assert_eq!(ByteSize(1024).to_string(), "1.00 KiB");
        assert_eq!(ByteSize(1536).to_string(), "1.50 KiB");
        assert_eq!(ByteSize(8 << 20).to_string(), "8.00 MiB");
        assert_eq!(ByteSize(u64::MAX).to_string(), "16.00 EiB");
    }

    #[test]
    fn configs_write_sizes_exactly_and_read_text_or_bytes() {
        let json = |size: u64| serde_json::to_string(&ByteSize(size)).unwrap();
        assert_eq!(json(512 << 20), "\"512MiB\"");
        assert_eq!(json(3 << 29), "\"1536MiB\"");
        assert_eq!(json(1000), "\"1000\"");
        assert_eq!(json(0), "\"0\"");
        let read = |text: &str| serde_json::from_str::<ByteSize>(text).map(|b| b.0);
        assert_eq!(read("\"12GiB\"").unwrap(), 12 << 30);
        assert_eq!(read("4096").unwrap(), 4096);
        assert!(read("\"12 parsecs\"").unwrap_err().to_string().contains("unknown unit"));
        for size in [0, 1, 1023, 1 << 10, 25 << 20, 5 << 40] {
            assert_eq!(read(&json(size)).unwrap(), size);
        }
    }

    #[test]
    fn parses_sizes_with_binary_units() {
        let parse = |s: &str| s.parse::<ByteSize>().map(|b| b.0);
        assert_eq!(parse("12GiB"), Ok(12 << 30));
        assert_eq!(parse("1.5 GiB"), Ok(3 << 29));
        assert_eq!(parse("512mb"), Ok(512 << 20));
        assert_eq!(parse("4096"), Ok(4096));
        assert_eq!(parse(" 2 K "), Ok(2048));
        assert!(parse("12 parsecs").unwrap_err().contains("unknown unit"));
        assert!(parse("GiB").is_err());
        assert!(parse("1.2.3GiB").is_err());
        assert!(parse("99999999999TiB").unwrap_err().contains("too large"));
    }

    #[test]
    fn honours_width_and_alignment() {
        assert_eq!(format!("{:>10}", ByteSize(2048)), "  2.00 KiB");
    }
}
