//! The bounded YAML check faces every user-data, network-config and manifest: it must return
//! (refusal or not) without panicking, overflowing the stack or growing past its bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = nubo_seed::yaml::check_bounded(data, &nubo_seed::yaml::Limits::DEFAULT);
    let _ = nubo_seed::validate_user_data(data);
});
