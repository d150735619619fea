//! Durations as users write them (`90s`, `5m`, `1h 30m`), always within bounds, and deadlines
//! that cannot overflow. A timeout of `18446744073709551615s` once panicked `Instant + Duration`
//! in `vm wait`; every duration from user input goes through [`parse_duration`] and every
//! deadline through [`deadline`], so no input reaches a panic.

use std::time::{Duration, Instant};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("duration `{value}` is not a duration ({why}): write a number with a unit, e.g. `90s`, `5m` or `1h 30m`")]
    Malformed { value: String, why: String },
    #[error("duration `{value}` is outside the allowed range {min} to {max}: give a value in it, e.g. `{example}`")]
    OutOfRange {
        value: String,
        min: String,
        max: String,
        example: String,
    },
}

/// Parses `s` with humantime's grammar and refuses values outside `min..=max`. A bare number
/// (`120`) is refused rather than guessed at: seconds and milliseconds are both plausible.
pub fn parse_duration(s: &str, min: Duration, max: Duration) -> Result<Duration, DurationError> {
    let value = s.trim();
    let d = humantime::parse_duration(value).map_err(|e| DurationError::Malformed {
        value: s.to_owned(),
        why: e.to_string(),
    })?;
    if d < min || d > max {
        return Err(DurationError::OutOfRange {
            value: s.to_owned(),
            min: humantime::format_duration(min).to_string(),
            max: humantime::format_duration(max).to_string(),
            example: humantime::format_duration(min.max(max / 2)).to_string(),
        });
    }
    Ok(d)
}

/// `start + timeout`, or the latest representable instant short of it when the sum overflows:
/// an absurd timeout means "wait very long", never a panic.
pub fn deadline(start: Instant, timeout: Duration) -> Instant {
    let mut t = timeout;
    loop {
        if let Some(d) = start.checked_add(t) {
            return d;
        }
        // Halving reaches zero, and `start + 0` always exists, so the loop ends.
        t /= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIN: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(24 * 3600);

    #[test]
    fn parse_duration_minutes_is_accepted() {
        let d = parse_duration("5m", MIN, MAX);

        assert_eq!(d, Ok(Duration::from_secs(300)));
    }

    #[test]
    fn parse_duration_compound_is_accepted() {
        let d = parse_duration("1h 30m", MIN, MAX);

        assert_eq!(d, Ok(Duration::from_secs(5400)));
    }

    #[test]
    fn parse_duration_u64_max_seconds_is_refused() {
        let err = parse_duration("18446744073709551615s", MIN, MAX).unwrap_err();

        assert!(err.to_string().contains("`18446744073709551615s`"), "{err}");
    }

    #[test]
    fn parse_duration_over_max_names_bounds() {
        let err = parse_duration("25h", MIN, MAX).unwrap_err();

        let msg = err.to_string();
        assert!(
            msg.contains("1s") && msg.contains("1day") && msg.contains("`25h`"),
            "{msg}"
        );
    }

    #[test]
    fn parse_duration_under_min_is_refused() {
        let err = parse_duration("0s", MIN, MAX);

        assert!(matches!(err, Err(DurationError::OutOfRange { .. })));
    }

    #[test]
    fn parse_duration_bare_number_is_refused_with_example() {
        let err = parse_duration("120", MIN, MAX).unwrap_err();

        assert!(err.to_string().contains("`90s`"), "{err}");
    }

    #[test]
    fn deadline_overflowing_timeout_saturates() {
        let start = Instant::now();

        let d = deadline(start, Duration::MAX);

        assert!(d > start + Duration::from_secs(100 * 365 * 24 * 3600));
    }

    #[test]
    fn deadline_small_timeout_is_exact() {
        let start = Instant::now();

        let d = deadline(start, Duration::from_secs(5));

        assert_eq!(d, start + Duration::from_secs(5));
    }

    proptest! {
        #[test]
        fn parse_duration_arbitrary_string_never_panics_and_stays_in_bounds(s in ".*") {
            if let Ok(d) = parse_duration(&s, MIN, MAX) {
                prop_assert!((MIN..=MAX).contains(&d));
            }
        }

        #[test]
        fn parse_duration_number_with_unit_never_panics_and_stays_in_bounds(
            n in any::<u64>(),
            unit in prop::sample::select(vec!["ns", "us", "ms", "s", "m", "h", "d", "w", "M", "y", "x", ""]),
        ) {
            if let Ok(d) = parse_duration(&format!("{n}{unit}"), MIN, MAX) {
                prop_assert!((MIN..=MAX).contains(&d));
            }
        }

        #[test]
        fn deadline_arbitrary_timeout_never_panics(secs in any::<u64>(), nanos in 0u32..1_000_000_000) {
            let start = Instant::now();

            let d = deadline(start, Duration::new(secs, nanos));

            prop_assert!(d >= start);
        }
    }
}
