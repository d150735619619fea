//! Any bytes: sniff is total, and the header readers behind inspect never panic, whatever
//! format the bytes claim to be.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nubo_disk::{foreign, Format};

fuzz_target!(|data: &[u8]| {
    let format = nubo_disk::sniff(data);
    let _ = format.as_str();
    for f in [Format::Vmdk, Format::Vdi, Format::Vpc] {
        let _ = foreign::parse_foreign(f, data);
    }
    let _ = foreign::vhdx_metadata_region(data);
    let _ = foreign::parse_vhdx(data);
    let _ = foreign::vhdx_has_parent(data);
    let _ = foreign::vpc_footer(data);
});
