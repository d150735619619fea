//! Any bytes: parse_qcow2_header returns Ok or Err, never panics, and what it accepts is
//! self-consistent (names lie inside the input, sizes inside qcow2's bounds).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = nubo_disk::parse_qcow2_header(data) {
        assert!((9..=21).contains(&h.cluster_bits));
        assert!(h.version == 2 || h.version == 3);
        assert!(h.refcount_order <= 6);
        assert!(h.header_length as usize <= data.len());
        if let Some(name) = &h.backing_file {
            assert!(name.len() <= 1023);
            assert!(h.backing_file_offset as usize + name.len() <= data.len());
            assert!(!name.contains('\0'));
        }
        if let Some(f) = &h.backing_format {
            assert!(f.len() <= 15);
        }
        for e in &h.extensions {
            assert!(e.offset + 8 + e.len as usize <= data.len());
        }
    }
});
