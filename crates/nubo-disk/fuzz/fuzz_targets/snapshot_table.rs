//! Any bytes: read_snapshot_table returns Ok or Err, never panics, and what it accepts stays
//! within qemu's limits (entry count, names inside the input).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(entries) = nubo_disk::read_snapshot_table(data) {
        assert!(entries.len() <= nubo_disk::snapshots::MAX_SNAPSHOTS as usize);
        for e in &entries {
            assert!(e.name.len() + e.id.len() <= data.len() * 3);
        }
    }
});
