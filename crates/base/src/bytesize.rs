//! Byte counts as users type them, read the same way by every gdx command.
//!
//! One rule everywhere (`gdx cp`, `serve`, `bench`, `calibrate`, `stream`), the one `dd` and
//! the SI/IEC standards use:
//!
//! | suffix | factor |
//! |---|---|
//! | none, `B` | 1 (a plain number is bytes) |
//! | `KB` `MB` `GB` `TB` | 10^3, 10^6, 10^9, 10^12 |
//! | `KiB` `MiB` `GiB` `TiB` | 2^10, 2^20, 2^30, 2^40 |
//! | `K` `M` `G` `T` | 2^10 … 2^40 (the `dd`/`ls -h` shorthand) |
//!
//! Suffixes are case-insensitive (`kib`, `Gb`). A fraction is allowed when the result is a
//! whole number of bytes (`1.5GB` = 1 500 000 000, `0.5KiB` = 512); arithmetic is exact
//! integer arithmetic, so `18446744073709551615` round-trips and anything larger is an error,
//! never a wrap or a float rounding.
//!
//! Before this type, `gdx cp` read `1GB` as 2^30 and `gdx serve` as 10^9.

use std::fmt;
use std::str::FromStr;

/// What [`ByteSize::from_str`] and [`parse_size_list`] reject, with the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// Empty input.
    #[error("empty size: give a byte count such as 4096, 64KiB or 1GB")]
    Empty,
    /// The input is not a size of the kind asked for; `problem` says how.
    #[error("'{input}' {problem}")]
    Invalid {
        /// The whole input.
        input: String,
        /// What is wrong with it.
        problem: SizeProblem,
    },
    /// The suffix is not one of the units above.
    #[error("'{input}' has an unknown unit '{unit}' (use B, KB/MB/GB/TB = 10^3.., KiB/MiB/GiB/TiB = 2^10..)")]
    UnknownUnit {
        /// The whole input.
        input: String,
        /// The unit part.
        unit: String,
    },
    /// A malformed list or range item (`--size 8:1GiB:x2`).
    #[error("invalid size list item '{item}': {why}")]
    List {
        /// The item.
        item: String,
        /// What is wrong with it.
        why: String,
    },
}

/// How an input fails to be a size ([`SizeError::Invalid`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SizeProblem {
    /// The number part is not a number.
    #[error("is not a byte count (e.g. 4096, 64KiB, 1.5GB)")]
    NotANumber,
    /// A fraction that does not come out at a whole number of bytes.
    #[error("is not a whole number of bytes")]
    Fraction,
    /// Larger than `u64::MAX` bytes.
    #[error("is too large (the limit is 2^64 - 1 bytes)")]
    TooLarge,
    /// A rate without its `/s` (`--rate 40GB/s`), or a rate of zero.
    #[error("is not a rate: give bytes per second such as 40GB/s, 500MiB/s or 409.6MB/s")]
    NotARate,
}

impl SizeError {
    fn invalid(input: &str, problem: SizeProblem) -> SizeError {
        SizeError::Invalid {
            input: input.to_string(),
            problem,
        }
    }
}

/// A byte count. `Display` writes the shortest exact form (`4KiB`, `1GB`, `1000B`), so a printed
/// size parses back to the same value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

/// The help text clap flags carry, so every command documents the same rule.
pub const SIZE_HELP: &str =
    "plain numbers are bytes; KB/MB/GB = 10^3/10^6/10^9; KiB/MiB/GiB (or K/M/G) = 2^10/2^20/2^30";

impl ByteSize {
    /// The count.
    pub const fn bytes(self) -> u64 {
        self.0
    }

    /// Parse one size (the clap `value_parser` form).
    pub fn parse(s: &str) -> Result<u64, SizeError> {
        s.parse::<ByteSize>().map(|b| b.0)
    }
}

impl From<ByteSize> for u64 {
    fn from(b: ByteSize) -> u64 {
        b.0
    }
}

fn unit_factor(unit: &str) -> Option<u64> {
    Some(match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        _ => return None,
    })
}

impl FromStr for ByteSize {
    type Err = SizeError;

    fn from_str(s: &str) -> Result<Self, SizeError> {
        let t = s.trim();
        if t.is_empty() {
            return Err(SizeError::Empty);
        }
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let factor = unit_factor(unit.trim()).ok_or_else(|| SizeError::UnknownUnit {
            input: s.to_string(),
            unit: unit.trim().to_string(),
        })?;
        let (int, frac) = match num.split_once('.') {
            Some((i, f)) => (i, f),
            None => (num, ""),
        };
        let all_digits = |x: &str| x.bytes().all(|b| b.is_ascii_digit());
        if (int.is_empty() && frac.is_empty()) || !all_digits(int) || !all_digits(frac) {
            return Err(SizeError::invalid(s, SizeProblem::NotANumber));
        }
        let too_large = || SizeError::invalid(s, SizeProblem::TooLarge);
        // Exact: value = (int * 10^f + frac) * factor / 10^f, all in u128.
        let digits = format!("{int}{frac}");
        let digits = digits.trim_start_matches('0');
        if digits.len() > 38 {
            return Err(too_large());
        }
        let mantissa: u128 = if digits.is_empty() {
            0
        } else {
            digits
                .parse()
                .map_err(|_| SizeError::invalid(s, SizeProblem::NotANumber))?
        };
        let scale = 10u128
            .checked_pow(u32::try_from(frac.len()).map_err(|_| too_large())?)
            .ok_or_else(too_large)?;
        let scaled = mantissa
            .checked_mul(u128::from(factor))
            .ok_or_else(too_large)?;
        if scaled % scale != 0 {
            return Err(SizeError::invalid(s, SizeProblem::Fraction));
        }
        u64::try_from(scaled / scale)
            .map(ByteSize)
            .map_err(|_| too_large())
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        if n == 0 {
            return write!(f, "0B");
        }
        for (factor, unit) in [
            (1u64 << 40, "TiB"),
            (1 << 30, "GiB"),
            (1 << 20, "MiB"),
            (1 << 10, "KiB"),
            (1_000_000_000_000, "TB"),
            (1_000_000_000, "GB"),
            (1_000_000, "MB"),
            (1_000, "KB"),
        ] {
            if n.is_multiple_of(factor) {
                return write!(f, "{}{unit}", n / factor);
            }
        }
        write!(f, "{n}B")
    }
}

/// A byte count for people, the one byte formatter of gdx's reports (bench tables, storage and
/// planner messages): exact when a binary unit divides it, in the largest such unit (`7 B`,
/// `4 KiB`, `4000 KiB`, `1536 MiB`), so a benchmark's size reads as what was moved; below
/// 1 MiB otherwise in bytes (`2049 B`: beside a `2 KiB` limit, the byte matters); above, the
/// largest unit not above it to two decimals (`117.74 MiB`, `3.00 GiB` for 3 GiB + 1 B).
/// [`ByteSize`]'s `Display` is the other direction's form: what a user types (`64KiB`, `1GB`).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
    if let Some((unit, shift)) = UNITS
        .iter()
        .find(|(_, shift)| n >= 1 << shift && n.trailing_zeros() >= *shift)
    {
        return format!("{} {unit}", n >> shift);
    }
    match UNITS.iter().find(|(_, shift)| n >= 1 << shift) {
        Some((unit, shift)) if *shift >= 20 => {
            format!("{:.2} {unit}", n as f64 / (1u64 << shift) as f64)
        }
        _ => format!("{n} B"),
    }
}

/// Parse a rate in bytes per second: a size followed by `/s` (`40GB/s` = 4·10^10,
/// `500MiB/s`, `409.6MB/s`), the same units as [`ByteSize`]; zero is refused.
pub fn parse_rate(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let size = t
        .strip_suffix("/s")
        .or_else(|| t.strip_suffix("/S"))
        .ok_or_else(|| SizeError::invalid(s, SizeProblem::NotARate))?;
    match ByteSize::parse(size)? {
        0 => Err(SizeError::invalid(s, SizeProblem::NotARate)),
        n => Ok(n),
    }
}

/// Parse a size list: `8,4KiB,1MiB`, a range `8:1GiB` (x4 steps), `4KiB:1GiB:x2`. The result is
/// sorted and deduplicated; empty lists and zero-sized ranges are errors.
pub fn parse_size_list(s: &str) -> Result<Vec<u64>, SizeError> {
    let mut v = Vec::new();
    let bad = |item: &str, why: &str| SizeError::List {
        item: item.to_string(),
        why: why.to_string(),
    };
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let parts: Vec<&str> = item.split(':').collect();
        match parts.as_slice() {
            [one] => v.push(ByteSize::parse(one)?),
            [lo, hi] | [lo, hi, _] => {
                let (lo, hi) = (ByteSize::parse(lo)?, ByteSize::parse(hi)?);
                let step = match parts.get(2) {
                    Some(st) => st
                        .trim_start_matches(['x', 'X'])
                        .parse::<u64>()
                        .ok()
                        .filter(|n| *n >= 2)
                        .ok_or_else(|| bad(item, "the step is x2, x4, ..."))?,
                    None => 4,
                };
                if lo == 0 || lo > hi {
                    return Err(bad(item, "a range needs 0 < LO <= HI"));
                }
                let mut x = lo;
                while x < hi {
                    v.push(x);
                    x = x.saturating_mul(step);
                }
                v.push(hi);
            }
            _ => return Err(bad(item, "use SIZE or LO:HI[:xN]")),
        }
    }
    if v.is_empty() {
        return Err(SizeError::Empty);
    }
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_is_exact_in_the_largest_dividing_unit_else_two_decimals() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(7), "7 B");
        assert_eq!(human_bytes(1000), "1000 B");
        assert_eq!(human_bytes(4096), "4 KiB");
        assert_eq!(human_bytes(4_096_000), "4000 KiB");
        assert_eq!(human_bytes(1536), "1536 B");
        assert_eq!(human_bytes(2049), "2049 B");
        assert_eq!(human_bytes(123_456_789), "117.74 MiB");
        assert_eq!(human_bytes(3 << 20), "3 MiB");
        assert_eq!(human_bytes(1 << 30), "1 GiB");
        assert_eq!(human_bytes(3 << 29), "1536 MiB");
        assert_eq!(human_bytes((3 << 30) + 1), "3.00 GiB");
        assert_eq!(human_bytes(1 << 40), "1 TiB");
        assert_eq!(human_bytes(u64::MAX), "16777216.00 TiB");
    }
    use proptest::prelude::*;

    #[test]
    fn decimal_and_binary_units() {
        assert_eq!(ByteSize::parse("1GB"), Ok(1_000_000_000));
        assert_eq!(ByteSize::parse("1GiB"), Ok(1 << 30));
        assert_eq!(ByteSize::parse("1G"), Ok(1 << 30));
        assert_eq!(ByteSize::parse("4096"), Ok(4096));
        assert_eq!(ByteSize::parse("8B"), Ok(8));
        assert_eq!(ByteSize::parse("64kb"), Ok(64_000));
        assert_eq!(ByteSize::parse("64KiB"), Ok(65_536));
        assert_eq!(ByteSize::parse("1.5GB"), Ok(1_500_000_000));
        assert_eq!(ByteSize::parse("0.5KiB"), Ok(512));
        assert_eq!(ByteSize::parse("1TB"), Ok(1_000_000_000_000));
        assert_eq!(ByteSize::parse(" 2 MiB "), Ok(2 << 20));
    }

    #[test]
    fn limits_and_errors() {
        assert_eq!(
            ByteSize::parse("18446744073709551615"),
            Ok(u64::MAX),
            "u64::MAX is a valid count"
        );
        assert!(matches!(
            ByteSize::parse("18446744073709551616"),
            Err(SizeError::Invalid {
                problem: SizeProblem::TooLarge,
                ..
            })
        ));
        assert!(matches!(
            ByteSize::parse("99999999999T"),
            Err(SizeError::Invalid {
                problem: SizeProblem::TooLarge,
                ..
            })
        ));
        assert!(matches!(
            ByteSize::parse("0.3B"),
            Err(SizeError::Invalid {
                problem: SizeProblem::Fraction,
                ..
            })
        ));
        assert!(matches!(
            ByteSize::parse("12Q"),
            Err(SizeError::UnknownUnit { .. })
        ));
        assert!(matches!(ByteSize::parse(""), Err(SizeError::Empty)));
        assert!(matches!(
            ByteSize::parse("1.2.3"),
            Err(SizeError::Invalid {
                problem: SizeProblem::NotANumber,
                ..
            })
        ));
        assert!(matches!(
            ByteSize::parse("."),
            Err(SizeError::Invalid {
                problem: SizeProblem::NotANumber,
                ..
            })
        ));
        assert!(matches!(
            ByteSize::parse("-1"),
            Err(SizeError::UnknownUnit { .. })
        ));
    }

    #[test]
    fn lists_and_ranges() {
        assert_eq!(parse_size_list("8,4KiB"), Ok(vec![8, 4096]));
        assert_eq!(parse_size_list("1KiB:16KiB"), Ok(vec![1024, 4096, 16384]));
        assert_eq!(
            parse_size_list("1KiB:8KiB:x2"),
            Ok(vec![1024, 2048, 4096, 8192])
        );
        assert_eq!(parse_size_list("1KB,1KiB,1KB"), Ok(vec![1000, 1024]));
        assert!(parse_size_list("").is_err());
        assert!(parse_size_list("0:8").is_err());
        assert!(parse_size_list("8:4").is_err());
        assert!(parse_size_list("1:8:x1").is_err());
        assert!(parse_size_list("1:2:3:4").is_err());
    }

    #[test]
    fn rates_are_sizes_per_second() {
        assert_eq!(parse_rate("40GB/s"), Ok(40_000_000_000));
        assert_eq!(parse_rate("500MiB/s"), Ok(500 << 20));
        assert_eq!(parse_rate("409.6MB/s"), Ok(409_600_000));
        assert_eq!(parse_rate(" 1kb/S "), Ok(1000));
        assert!(matches!(
            parse_rate("40GB"),
            Err(SizeError::Invalid {
                problem: SizeProblem::NotARate,
                ..
            })
        ));
        assert!(matches!(
            parse_rate("0GB/s"),
            Err(SizeError::Invalid {
                problem: SizeProblem::NotARate,
                ..
            })
        ));
        assert!(matches!(
            parse_rate("fastGB/s"),
            Err(SizeError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_rate("1.2.3GB/s"),
            Err(SizeError::Invalid {
                problem: SizeProblem::NotANumber,
                ..
            })
        ));
    }

    proptest! {
        #[test]
        fn display_round_trips(n in any::<u64>()) {
            let shown = ByteSize(n).to_string();
            prop_assert_eq!(ByteSize::parse(&shown), Ok(n), "{}", shown);
        }
    }
}
