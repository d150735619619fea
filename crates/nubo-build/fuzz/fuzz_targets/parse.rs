#![no_main]
//! The VMfile parser and the build-argument resolution must never panic or hang on any bytes.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        let _ = nubo_build::parse_bytes(data);
        return;
    };
    if let Ok(file) = nubo_build::parse(text) {
        let args = [("A".to_owned(), "x y".to_owned()), ("B".to_owned(), "$A".to_owned())];
        let _ = nubo_build::resolve(&file, &args);
    }
});
