//! Byte sizes as users write them (`2G`, `512M`, `20GiB`, `1048576`): binary multiples, as
//! QEMU and qemu-img read them.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ByteSize(pub u64);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("size `{0}` is not a number with an optional unit: write e.g. `2G`, `512M` or `20GiB`")]
    Malformed(String),
    #[error("size `{0}` has unknown unit `{1}`: use K, M, G or T (binary multiples)")]
    Unit(String, String),
    #[error("size `{0}` is too large")]
    Overflow(String),
}

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
pub const TIB: u64 = 1 << 40;

impl ByteSize {
    pub fn parse(s: &str) -> Result<Self, SizeError> {
        let t = s.trim();
        let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        if num.is_empty() {
            return Err(SizeError::Malformed(s.to_owned()));
        }
        let mult = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => KIB,
            "m" | "mb" | "mib" => MIB,
            "g" | "gb" | "gib" => GIB,
            "t" | "tb" | "tib" => TIB,
            other => return Err(SizeError::Unit(s.to_owned(), other.to_owned())),
        };
        let bytes = if let Some((int, frac)) = num.split_once('.') {
            // Fractions like `1.5G`: exact for the binary multiples users write.
            let int: u64 = int.parse().map_err(|_| SizeError::Malformed(s.to_owned()))?;
            let digits = frac.len() as u32;
            let frac_n: u64 = frac.parse().map_err(|_| SizeError::Malformed(s.to_owned()))?;
            let scale = 10u64
                .checked_pow(digits)
                .ok_or_else(|| SizeError::Overflow(s.to_owned()))?;
            int.checked_mul(mult)
                .and_then(|v| v.checked_add(frac_n.checked_mul(mult)? / scale))
                .ok_or_else(|| SizeError::Overflow(s.to_owned()))?
        } else {
            let n: u64 = num.parse().map_err(|_| SizeError::Malformed(s.to_owned()))?;
            n.checked_mul(mult).ok_or_else(|| SizeError::Overflow(s.to_owned()))?
        };
        Ok(ByteSize(bytes))
    }

    pub fn bytes(self) -> u64 {
        self.0
    }

    pub fn mib(self) -> u64 {
        self.0 / MIB
    }
}

impl std::str::FromStr for ByteSize {
    type Err = SizeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ByteSize::parse(s)
    }
}

/// Human form: the largest binary unit that divides exactly, else one decimal (`1.5G`).
impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        for (mult, unit) in [(TIB, "T"), (GIB, "G"), (MIB, "M"), (KIB, "K")] {
            if b >= mult {
                if b.is_multiple_of(mult) {
                    return write!(f, "{}{}", b / mult, unit);
                }
                return write!(f, "{:.1}{}", b as f64 / mult as f64, unit);
            }
        }
        write!(f, "{b}B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_gigabytes_binary() {
        assert_eq!(ByteSize::parse("2G").unwrap().0, 2 * GIB);
    }

    #[test]
    fn parse_gib_suffix() {
        assert_eq!(ByteSize::parse("20GiB").unwrap().0, 20 * GIB);
    }

    #[test]
    fn parse_fraction() {
        assert_eq!(ByteSize::parse("1.5G").unwrap().0, GIB + GIB / 2);
    }

    #[test]
    fn parse_plain_bytes() {
        assert_eq!(ByteSize::parse("4096").unwrap().0, 4096);
    }

    #[test]
    fn parse_unknown_unit_rejected() {
        assert!(matches!(ByteSize::parse("2Q"), Err(SizeError::Unit(..))));
    }

    #[test]
    fn parse_empty_rejected() {
        assert!(matches!(ByteSize::parse("G"), Err(SizeError::Malformed(_))));
    }

    #[test]
    fn parse_overflow_rejected() {
        assert!(matches!(ByteSize::parse("99999999999T"), Err(SizeError::Overflow(_))));
    }

    #[test]
    fn display_exact_and_fractional() {
        assert_eq!(ByteSize(2 * GIB).to_string(), "2G");
        assert_eq!(ByteSize(GIB + GIB / 2).to_string(), "1.5G");
        assert_eq!(ByteSize(100).to_string(), "100B");
    }
}
