//! Durations and sizes as every flag (and its environment variable) of every binary spells them:
//! the controller, router, runtime, CLI and agent parse with these functions, so that a value
//! one binary takes, every other takes too.
//!
//! - A **duration** is a decimal number of seconds (`300`, `0.25`), or one or more decimal
//!   numbers each with a unit, as Go writes them (`500ms`, `90s`, `1.5h`, `1h30m`); the units are
//!   `ns`, `us` (or `µs`), `ms`, `s`, `m` and `h`. A leading `+` is allowed, a sign `-`, an
//!   exponent, `inf` or `nan` are not. At most [`MAX_DURATION`], exactly to the nanosecond
//!   (no floating point).
//! - A **size** is a whole number of bytes with an optional binary unit, in any letter case and
//!   optionally after a space: `4096`, `64KiB`, `16 MiB`, `1GiB`, `16M` (`K`, `KB` and `KiB` all
//!   mean 1024; likewise `M` and `G`). Above 0.
//!
//! Errors are one sentence naming the value, for clap to print after the flag.

use std::time::Duration;

/// The longest duration any flag takes: 10 years. A claim or token cannot outlive it, and no
/// deadline arithmetic (`Instant + Duration`) can overflow below it.
pub const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// [`MAX_DURATION`] as errors name it.
pub const MAX_DURATION_TEXT: &str = "87600h (10 years)";

const NANOS_PER_SECOND: u128 = 1_000_000_000;

/// Fraction digits that can still matter: an hour is 3.6e12 ns, so digits past the 13th are
/// below a nanosecond; more are read but ignored (which also keeps the arithmetic in `u128`).
const FRACTION_DIGITS: usize = 18;

/// Parses a duration (see the module docs): `0` and `0s` are allowed.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let body = text.strip_prefix('+').unwrap_or(text);
    let invalid = || {
        format!("invalid duration {text:?}: expected e.g. 500ms, 30s, 1h30m or a number of seconds")
    };
    if body.is_empty() {
        return Err(invalid());
    }
    let mut total: u128 = 0;
    let mut rest = body;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(number_end);
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_end);
        let unit_nanos: u128 = match unit {
            // A bare number is seconds, but only alone: `1h30` is a typo, not 1h30s.
            "" if rest.len() == body.len() && next.is_empty() => NANOS_PER_SECOND,
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => NANOS_PER_SECOND,
            "m" => 60 * NANOS_PER_SECOND,
            "h" => 3600 * NANOS_PER_SECOND,
            "" => {
                return Err(format!(
                    "invalid duration {text:?}: every number after the first needs a unit (ns, us, ms, s, m or h)"
                ));
            }
            _ => {
                return Err(format!(
                    "invalid duration unit in {text:?}: use ns, us, ms, s, m or h"
                ));
            }
        };
        let nanos = decimal_times(number, unit_nanos).ok_or_else(invalid)?;
        total = total.saturating_add(nanos);
        rest = next;
    }
    if total > MAX_DURATION.as_nanos() {
        return Err(format!(
            "duration {text:?} is too long: the maximum is {MAX_DURATION_TEXT}"
        ));
    }
    let seconds = u64::try_from(total / NANOS_PER_SECOND).map_err(|_| invalid())?;
    let nanos = u32::try_from(total % NANOS_PER_SECOND).map_err(|_| invalid())?;
    Ok(Duration::new(seconds, nanos))
}

/// Parses a duration above 0: timeouts, intervals and grace periods, where 0 would mean
/// "at once" and is a mistake.
pub fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    let duration = parse_duration(text)?;
    if duration.is_zero() {
        return Err(format!("duration {:?} must be above 0", text.trim()));
    }
    Ok(duration)
}

/// `number` (digits with at most one `.`, at least one digit) times `unit`, truncated to a
/// whole number; saturates instead of overflowing (the caller's maximum then refuses it).
/// `None` when `number` is not a decimal number.
fn decimal_times(number: &str, unit: u128) -> Option<u128> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = |part: &str| part.bytes().all(|b| b.is_ascii_digit());
    if whole.len() + fraction.len() == 0 || !digits(whole) || !digits(fraction) {
        return None;
    }
    let whole_value = whole.bytes().try_fold(0u128, |value, digit| {
        value.checked_mul(10)?.checked_add(u128::from(digit - b'0'))
    });
    let Some(whole_value) = whole_value else {
        return Some(u128::MAX);
    };
    let fraction = &fraction[..fraction.len().min(FRACTION_DIGITS)];
    let (fraction_value, scale) = fraction
        .bytes()
        .fold((0u128, 1u128), |(value, scale), digit| {
            (value * 10 + u128::from(digit - b'0'), scale * 10)
        });
    Some(
        whole_value
            .saturating_mul(unit)
            .saturating_add(fraction_value * unit / scale),
    )
}

/// Parses a size in bytes (see the module docs).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a size (e.g. 4096, 64KiB, 16MiB, 1GiB)"))?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => {
            return Err(format!(
                "`{text}` has an unknown unit (use B, KiB, MiB or GiB)"
            ));
        }
    };
    let bytes = number
        .checked_mul(multiplier)
        .ok_or_else(|| format!("`{text}` is too large"))?;
    if bytes == 0 {
        return Err(format!("`{text}` must be above 0"));
    }
    Ok(bytes)
}

/// [`parse_size`] for a size held in memory (a `usize`).
pub fn parse_size_usize(text: &str) -> Result<usize, String> {
    let bytes = parse_size(text)?;
    usize::try_from(bytes).map_err(|_| format!("`{text}` is too large for this machine"))
}

/// A Kubernetes resource quantity (`resources.limits` values: `512Mi`, `1G`, `500m`, `0.5`,
/// `2e9`) in thousandths of its unit, rounded up as the API server rounds: `500m` is 500, `2`
/// is 2000, `1Ki` is 1 024 000. Negative quantities and unknown suffixes are refused.
pub fn parse_quantity_milli(text: &str) -> Result<u128, String> {
    let invalid = || format!("`{text}` is not a Kubernetes quantity (e.g. 512Mi, 1G, 500m, 0.5)");
    let body = text.trim().strip_prefix('+').unwrap_or(text.trim());
    let split = body
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(split);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return Err(invalid());
    }
    // The value as digits / 10^scale, then times the suffix's factor (a power of 2 or 10).
    let digits = format!("{whole}{fraction}");
    let digits: u128 = digits
        .trim_start_matches('0')
        .chars()
        .take(30)
        .collect::<String>()
        .parse()
        .or_else(|_| {
            if digits.chars().all(|c| c == '0') {
                Ok(0)
            } else {
                Err(invalid())
            }
        })?;
    let mut scale = i32::try_from(fraction.len()).map_err(|_| invalid())?;
    let binary: Option<u32> = match suffix {
        "Ki" => Some(10),
        "Mi" => Some(20),
        "Gi" => Some(30),
        "Ti" => Some(40),
        "Pi" => Some(50),
        "Ei" => Some(60),
        _ => None,
    };
    let mut exponent: i32 = match suffix {
        _ if binary.is_some() => 0,
        "" => 0,
        "n" => -9,
        "u" => -6,
        "m" => -3,
        "k" => 3,
        "M" => 6,
        "G" => 9,
        "T" => 12,
        "P" => 15,
        "E" => 18,
        other => {
            let digits = other
                .strip_prefix('e')
                .or_else(|| other.strip_prefix('E'))
                .ok_or_else(invalid)?;
            digits.parse::<i32>().map_err(|_| invalid())?
        }
    };
    // Thousandths.
    exponent += 3;
    let mut value = digits;
    if let Some(shift) = binary {
        value = value
            .checked_shl(shift)
            .filter(|v| v >> shift == digits)
            .ok_or_else(invalid)?;
    }
    scale -= exponent;
    if scale <= 0 {
        let factor = 10u128
            .checked_pow(scale.unsigned_abs())
            .ok_or_else(invalid)?;
        value.checked_mul(factor).ok_or_else(invalid)
    } else {
        let divisor = 10u128
            .checked_pow(scale.unsigned_abs())
            .unwrap_or(u128::MAX);
        Ok(value.div_ceil(divisor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    #[test]
    fn durations_in_every_documented_form() {
        // Go-style, as the controller's, CLI's and agent's flags are documented.
        assert_eq!(parse_duration("500ms"), Ok(ms(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1m30.5s"), Ok(ms(90_500)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("87600h"), Ok(MAX_DURATION));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("250µs"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("7ns"), Ok(Duration::from_nanos(7)));
        // Plain seconds, as the `*-seconds` flags are documented.
        assert_eq!(parse_duration("300"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("0.25"), Ok(ms(250)));
        assert_eq!(parse_duration("0.5"), Ok(ms(500)));
        assert_eq!(parse_duration(".5"), Ok(ms(500)));
        assert_eq!(parse_duration("5."), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration(" 3 "), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("+3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        // Exact, where floating point would round.
        assert_eq!(parse_duration("0.1"), Ok(ms(100)));
        assert_eq!(
            parse_duration("1.123456789123s"),
            Ok(Duration::new(1, 123_456_789))
        );
    }

    #[test]
    fn durations_that_are_refused() {
        for bad in [
            "",
            " ",
            "+",
            "-5",
            "-5s",
            "nan",
            "inf",
            "NaN",
            "1e3",
            "2 days",
            "5 m",
            "1.2.3",
            ".",
            "s",
            "1h30",
            "10x",
            "1d",
            "0x10",
            "not-a-number",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert!(
            parse_duration("1d")
                .unwrap_err()
                .contains("use ns, us, ms, s, m or h")
        );
        for long in [
            "87600h1ns",
            "87601h",
            "100000000h",
            "99999999999999999999999s",
            &"9".repeat(60),
        ] {
            assert_eq!(
                parse_duration(long),
                Err(format!(
                    "duration {long:?} is too long: the maximum is 87600h (10 years)"
                ))
            );
        }
    }

    #[test]
    fn positive_durations() {
        assert_eq!(parse_positive_duration("300"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_positive_duration("1ns"), Ok(Duration::from_nanos(1)));
        for zero in ["0", "0.0", "0s", "0h0m", "0.0000000001"] {
            assert_eq!(
                parse_positive_duration(zero),
                Err(format!("duration {zero:?} must be above 0"))
            );
        }
        assert!(parse_positive_duration("-5").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("32KiB"), Ok(32 << 10));
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("16 MiB"), Ok(16 << 20));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("16 GiB"), Ok(16 << 30));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("10B"), Ok(10));
        assert_eq!(parse_size_usize("1MiB"), Ok(1 << 20));
        for bad in [
            "0",
            "0KiB",
            "-1",
            "1TiB",
            "abc",
            "lots",
            "",
            "1.5MiB",
            "99999999999999999999GiB",
            "18446744073709551615GiB",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// Go-style parts add up, exactly, in any combination of units.
        #[test]
        fn duration_parts_add_up(
            hours in 0u64..1000,
            minutes in 0u64..1000,
            seconds in 0u64..1000,
            millis in 0u64..1000,
            nanos in 0u64..1000,
        ) {
            let text = format!("{hours}h{minutes}m{seconds}s{millis}ms{nanos}ns");
            let expected = Duration::from_secs(hours * 3600 + minutes * 60 + seconds)
                + Duration::from_millis(millis)
                + Duration::from_nanos(nanos);
            prop_assert_eq!(parse_duration(&text), Ok(expected));
        }

        /// Plain seconds with up to nine decimals mean exactly that many seconds.
        #[test]
        fn plain_seconds_are_exact(seconds in 0u64..315_360_000, nanos in 0u32..1_000_000_000) {
            let text = format!("{seconds}.{nanos:09}");
            prop_assert_eq!(parse_duration(&text), Ok(Duration::new(seconds, nanos)));
            prop_assert_eq!(parse_duration(&format!("{text}s")), Ok(Duration::new(seconds, nanos)));
        }

        /// Whatever the input, the answer is an error or a duration within the maximum, and the
        /// parser never panics.
        #[test]
        fn never_beyond_the_maximum(text in "[0-9.+hmsnuµ -]{0,30}|\\PC{0,12}") {
            if let Ok(duration) = parse_duration(&text) {
                prop_assert!(duration <= MAX_DURATION);
            }
        }

        /// Sizes scale by their unit, whatever its case or spacing.
        #[test]
        fn sizes_scale_by_their_unit(
            number in 1u64..1_000_000,
            unit in prop_oneof![
                Just(("", 1u64)), Just(("B", 1)), Just(("K", 1 << 10)), Just(("kb", 1 << 10)),
                Just(("KiB", 1 << 10)), Just(("M", 1 << 20)), Just(("MiB", 1 << 20)),
                Just(("mb", 1 << 20)), Just(("G", 1 << 30)), Just(("GiB", 1 << 30)),
            ],
            space in any::<bool>(),
        ) {
            let (unit, scale) = unit;
            let text = format!("{number}{}{unit}", if space { " " } else { "" });
            prop_assert_eq!(parse_size(&text), Ok(number * scale));
        }
    }

    #[test]
    fn kubernetes_quantities_in_thousandths() {
        assert_eq!(parse_quantity_milli("500m"), Ok(500));
        assert_eq!(parse_quantity_milli("2"), Ok(2000));
        assert_eq!(parse_quantity_milli("0.5"), Ok(500));
        assert_eq!(parse_quantity_milli("1Ki"), Ok(1_024_000));
        assert_eq!(parse_quantity_milli("512Mi"), Ok(512 * (1 << 20) * 1000));
        assert_eq!(parse_quantity_milli("1.5Gi"), Ok(3 * (1 << 29) * 1000));
        assert_eq!(parse_quantity_milli("1G"), Ok(1_000_000_000_000));
        assert_eq!(parse_quantity_milli("2e3"), Ok(2_000_000));
        assert_eq!(parse_quantity_milli("1E"), Ok(10u128.pow(21)));
        // Rounded up, as the API server does.
        assert_eq!(parse_quantity_milli("1n"), Ok(1));
        assert_eq!(parse_quantity_milli("0"), Ok(0));
        for bad in ["", "-1", "1x", "Mi", "1..2", "1e", "."] {
            assert!(parse_quantity_milli(bad).is_err(), "{bad:?}");
        }
    }
}
