//! Checksum files come from mirrors: every parser must return, never panic, on any bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nubo_image::checksum::{parse_bsd, parse_gnu, parse_sidecar, Algorithm};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = parse_gnu(&text, Algorithm::Sha256);
    let _ = parse_gnu(&text, Algorithm::Sha512);
    let _ = parse_bsd(&text);
    let _ = parse_sidecar(&text, Algorithm::Sha256, "image.qcow2");
    let _ = nubo_image::catalog::newest_ubuntu_serial(&text);
});
