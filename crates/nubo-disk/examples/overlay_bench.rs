//! `scripts/bench/disk.sh`: wall time of `create_overlay` against `qemu-img create -f qcow2
//! -F qcow2 -b BASE` (a whole process, as a user or script would run it), over N runs each in
//! the same invocation, printed as medians and a ratio. Never a pass/fail timing.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

type Step<'a> = &'a mut dyn FnMut(&Path) -> Result<(), Box<dyn std::error::Error>>;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runs: usize = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(200);
    let dir = tempfile::tempdir()?;
    let base = dir.path().join("base.qcow2");
    nubo_disk::create_qcow2(&base, 20 << 30)?;
    let time = |f: Step<'_>| {
        let mut samples = Vec::with_capacity(runs);
        for i in 0..runs {
            let out = dir.path().join(format!("o{i}.qcow2"));
            let t = Instant::now();
            f(&out)?;
            samples.push(t.elapsed());
            std::fs::remove_file(&out)?;
        }
        Ok::<_, Box<dyn std::error::Error>>(median(samples))
    };
    let nubo = time(&mut |out| Ok(nubo_disk::create_overlay(&base, nubo_disk::Format::Qcow2, out, None)?))?;
    let qemu = time(&mut |out| {
        let st = Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
            .arg(&base)
            .arg(out)
            .status()?;
        if st.success() {
            Ok(())
        } else {
            Err(format!("qemu-img create failed: {st}").into())
        }
    })?;
    println!("overlay creation, median of {runs} runs each (20G qcow2 base):");
    println!(
        "  nubo create_overlay (in-process, fsync file + dir): {:>9.3} ms",
        nubo.as_secs_f64() * 1e3
    );
    println!(
        "  qemu-img create -f qcow2 -F qcow2 -b (process):     {:>9.3} ms",
        qemu.as_secs_f64() * 1e3
    );
    println!(
        "  ratio qemu-img / nubo: {:.1}x",
        qemu.as_secs_f64() / nubo.as_secs_f64()
    );
    Ok(())
}
