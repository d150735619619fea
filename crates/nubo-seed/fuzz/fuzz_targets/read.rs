//! The seed reader faces untrusted bytes (`nubo seed inspect` on any file): it must return an
//! error, never panic, loop or allocate without bound.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = nubo_seed::read(data);
    // Also fuzz the ISO reader behind a valid-looking header: most random inputs fail the magic.
    if data.len() > 4 {
        let mut iso = nubo_seed::build(
            &nubo_seed::SeedSpec { instance_id: "i".into(), local_hostname: "h".into(), ..Default::default() },
            nubo_seed::SeedFormat::Iso,
        )
        .expect("a fixed seed builds");
        let at = usize::from(u16::from_le_bytes([data[0], data[1]])) % iso.len();
        let end = (at + data.len() - 2).min(iso.len());
        iso[at..end].copy_from_slice(&data[2..2 + end - at]);
        let _ = nubo_seed::read(&iso);
    }
});
