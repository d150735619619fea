//! Overlay creation in-process (header, refcounts, fsync of file and directory) and the pure
//! layout computation alone. `scripts/bench/disk.sh` compares the first with `qemu-img create`.

use criterion::{criterion_group, criterion_main, Criterion};
use nubo_disk::{create_overlay, create_qcow2, layout, Format};

fn overlay(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path().join("base.qcow2");
    create_qcow2(&base, 20 << 30).expect("base");
    let mut i = 0u64;
    c.bench_function("create_overlay 20G qcow2 base", |b| {
        b.iter(|| {
            i += 1;
            let out = dir.path().join(format!("o{i}.qcow2"));
            create_overlay(&base, Format::Qcow2, &out, None).expect("overlay");
            std::fs::remove_file(&out).expect("cleanup");
        })
    });
    c.bench_function("layout 2T overlay", |b| {
        let backing = layout::BackingRef {
            name: "/var/lib/nubo/images/sha256/abc",
            driver: "qcow2",
        };
        b.iter(|| layout::layout(2 << 40, Some(backing)).expect("layout"))
    });
}

criterion_group!(benches, overlay);
criterion_main!(benches);
