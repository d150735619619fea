//! In-process seed build for a typical VM: 1 KiB of user-data with an SSH key, meta-data and a
//! network-config. The brief's target is <= 60 us per ISO seed.

use criterion::{criterion_group, criterion_main, Criterion};
use nubo_seed::{build, read, SeedFormat, SeedSpec};

fn typical() -> SeedSpec {
    let mut user_data = String::from(
        "#cloud-config\nhostname: web-1\nssh_authorized_keys:\n  - \"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKa0n8b2hK4x0lq1Xy3u7m2dQ4Yk5bZfX8wJ9t3sVh1Q bench@nubo\"\npackage_update: false\nruncmd:\n",
    );
    while user_data.len() < 1024 {
        user_data.push_str("  - [sh, -c, \"echo nubo-bench-marker >> /run/nubo-bench\"]\n");
    }
    user_data.truncate(1024);
    SeedSpec {
        instance_id: "0e9c1c5e-6f43-4a4b-9d0e-1a2b3c4d5e6f".into(),
        local_hostname: "web-1".into(),
        user_data: Some(user_data.into_bytes()),
        network_config: Some(
            b"version: 2\nethernets:\n  nic0:\n    match:\n      macaddress: \"52:54:00:12:34:56\"\n    dhcp4: true\n"
                .to_vec(),
        ),
        vendor_data: None,
    }
}

fn bench(c: &mut Criterion) {
    let spec = typical();
    c.bench_function("seed_build_iso_typical", |b| {
        b.iter(|| build(&spec, SeedFormat::Iso).expect("typical seed builds"))
    });
    c.bench_function("seed_build_vfat_typical", |b| {
        b.iter(|| build(&spec, SeedFormat::Vfat).expect("typical seed builds"))
    });
    let iso = build(&spec, SeedFormat::Iso).expect("typical seed builds");
    c.bench_function("seed_read_iso_typical", |b| {
        b.iter(|| read(&iso).expect("own seed reads"))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
