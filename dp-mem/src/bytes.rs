//! Human-readable byte counts for reports and error messages.

use std::fmt;

/// Formats a byte count with a binary unit (`512 B`, `1.50 KiB`, `8.00 MiB`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

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
    fn honours_width_and_alignment() {
        assert_eq!(format!("{:>10}", ByteSize(2048)), "  2.00 KiB");
    }
}
