//! Any bytes: the image inspector every untrusted image goes through returns an acceptance or a
//! refusal, never panics, and what it accepts is bounded and self-contained.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nubo_disk::{Format, Usage, MAX_VIRTUAL_SIZE};

fuzz_target!(|data: &[u8]| {
    let _ = nubo_disk::identify(data, data, data.len() as u64);
    if let Ok(found) = nubo_disk::inspect_image(data) {
        assert!(found.virtual_size > 0 && found.virtual_size <= MAX_VIRTUAL_SIZE);
        assert!(found.backing.is_none());
        if let Some(h) = &found.qcow2 {
            assert!(h.backing_file.is_none() && h.data_file.is_none());
        }
        match found.format {
            Format::Vdi | Format::Vhdx | Format::Vpc => assert_eq!(found.usage, Usage::ConvertOnly),
            _ => assert_eq!(found.usage, Usage::Base),
        }
        if found.format == Format::Raw {
            assert_eq!(found.virtual_size, data.len() as u64);
        }
    }
});
