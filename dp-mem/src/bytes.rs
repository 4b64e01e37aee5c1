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
