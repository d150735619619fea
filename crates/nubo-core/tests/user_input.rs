//! No path from a user's size or duration text to a panic (issue 9): the parsers the CLI and
//! manifests feed with untrusted strings are total, and what they accept is within bounds.

use std::time::Duration;

use nubo_core::duration::parse_duration;
use nubo_core::ByteSize;
use proptest::prelude::*;

proptest! {
    #[test]
    fn byte_size_parse_arbitrary_string_never_panics(s in ".*") {
        let _ = ByteSize::parse(&s);
    }

    #[test]
    fn byte_size_parse_number_with_unit_never_panics(
        int in any::<u64>(),
        frac in prop::option::of("[0-9]{0,25}"),
        unit in prop::sample::select(vec!["", "b", "K", "kib", "M", "G", "gb", "T", "TiB", "P", " g"]),
    ) {
        let s = match frac {
            Some(f) => format!("{int}.{f}{unit}"),
            None => format!("{int}{unit}"),
        };

        let _ = ByteSize::parse(&s);
    }

    #[test]
    fn parse_duration_wide_bounds_arbitrary_string_stays_in_bounds(
        s in "[0-9 .]{0,30}(ns|us|ms|s|m|h|d|w|M|y|years)?",
        min_s in any::<u64>(),
        max_s in any::<u64>(),
    ) {
        let (min, max) = (Duration::from_secs(min_s.min(max_s)), Duration::from_secs(min_s.max(max_s)));

        let parsed = parse_duration(&s, min, max);

        if let Ok(d) = parsed {
            prop_assert!(min <= d && d <= max);
        }
    }
}
