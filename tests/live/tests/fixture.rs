//! Proves the live-test fixture is real: the bootstrapped `debian:12` boots with QEMU (BIOS,
//! UEFI, direct kernel), reads a NoCloud seed the test made, applies its hostname and runs its
//! runcmd, gets 10.0.2.15 from user-mode DHCP and starts sshd — all read from the serial
//! console. The base image's sha256 is unchanged after booting an overlay of it.
//!
//! The image's cloud-init zygote (bootstrap recipe 5), from the same console: the BIOS and UEFI
//! boots ran all four stages in its children; the direct-kernel boot masks it on the kernel
//! command line (`systemd.mask=`), and each stage falls back to a plain `cloud-init` process,
//! with the same result.
//!
//! TCG on purpose (`-accel tcg -cpu max`): /dev/kvm on this machine kind is PVM, which cannot
//! run a stock kernel. One VM at a time, each bounded at 300 s and killed by PID on every path.

use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use nubo_live::net::free_port;
use nubo_live::prereq::{OVMF_CODE, OVMF_VARS};
use nubo_live::{run_with_timeout, DebianImage, Guard, LiveTest, TestResult, TestRoot};
use nubo_seed::{SeedFormat, SeedSpec};

const BOOT_TIMEOUT: Duration = Duration::from_secs(300);

fn main() -> ExitCode {
    nubo_live::run(vec![
        LiveTest::new(
            "fixture_bios_cloud_localds_seed",
            &["qemu", "bootstrap", "cloud-localds"],
            || boot(Mode::Bios),
        ),
        LiveTest::new(
            "fixture_efi_iso_seed_on_ide_cdrom",
            &["qemu", "bootstrap", "ovmf"],
            || boot(Mode::Efi),
        ),
        LiveTest::new("fixture_direct_kernel_vfat_seed", &["qemu", "bootstrap"], || {
            boot(Mode::DirectKernel)
        }),
    ])
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Bios,
    Efi,
    DirectKernel,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Bios => "bios",
            Mode::Efi => "efi",
            Mode::DirectKernel => "direct-kernel",
        }
    }
}

fn boot(mode: Mode) -> TestResult {
    let root = TestRoot::new()?;
    let image = root.with_debian_image()?;
    let dir = root.root().to_path_buf();
    let tag = format!("{:08x}", rand_u32());
    let hostname = format!("nubo-{}-{tag}", mode.label());
    let marker = format!("NUBO-MARKER-{tag}");
    let user_data = format!("#cloud-config\nruncmd:\n  - echo \"{marker} host=$(hostname)\" > /dev/ttyS0\n");

    let overlay = dir.join("overlay.qcow2");
    let mut create = Command::new("qemu-img");
    create
        .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
        .arg(&image.qcow2)
        .arg(&overlay);
    run_with_timeout(&mut create, Duration::from_secs(60))?;

    let seed = make_seed(mode, &dir, &hostname, &user_data)?;
    let log = dir.join("serial.log");
    let port = free_port()?;
    let mut qemu = qemu_command(mode, &image, &dir, &overlay, &seed, &log, port)?;
    let started = Instant::now();
    let mut vm = Guard::spawn(&mut qemu, &format!("qemu ({} boot)", mode.label()))?;

    let seen = vm.wait_for_line(&log, BOOT_TIMEOUT, |l| {
        l.contains("Cloud-init v.") && l.contains(" finished at ")
    })?;
    let boot_secs = started.elapsed().as_secs_f64();
    let finished = seen
        .lines()
        .rev()
        .find(|l| l.contains(" finished at "))
        .unwrap_or_default()
        .to_owned();
    let banner = ssh_banner(port);
    vm.kill();

    if !finished.contains("DataSourceNoCloud [seed=") {
        return Err(format!("cloud-init finished without reading the seed: {finished}"));
    }
    let expected = format!("{marker} host={hostname}");
    if !seen.contains(&expected) {
        return Err(format!(
            "runcmd marker `{expected}` not on the console (hostname or runcmd not applied); log {}",
            log.display()
        ));
    }
    if !seen.contains("10.0.2.15") {
        return Err(format!(
            "the guest did not report 10.0.2.15 from user-mode DHCP; log {}",
            log.display()
        ));
    }
    zygote(mode, &seen).map_err(|e| format!("{e}; log {}", log.display()))?;
    let banner = banner?;
    let digest = sha256_file(&image.qcow2)?;
    if digest != image.digest {
        return Err(format!(
            "base image {} changed: sha256 {digest}, record says {}",
            image.qcow2.display(),
            image.digest
        ));
    }
    println!(
        "timing {}: qemu start -> cloud-init finished {boot_secs:.1}s (guest {}), accel tcg; {finished_ds}; ssh banner `{banner}`",
        mode.label(),
        uptime(&finished).unwrap_or_else(|| "?".into()),
        finished_ds = finished.split("Datasource ").nth(1).unwrap_or("").split(']').next().unwrap_or("").to_owned() + "]",
    );
    Ok(())
}

/// The four stages' console lines: served by the zygote, or (its unit masked) each run the
/// normal way.
fn zygote(mode: Mode, console: &str) -> TestResult {
    for stage in ["init --local", "init", "modules --mode=config", "modules --mode=final"] {
        let served = console.contains(&format!("nubo-cloud-init-zygote: cloud-init {stage}: in child "));
        match mode {
            Mode::Bios | Mode::Efi if !served => return Err(format!("the zygote did not serve `{stage}`")),
            Mode::DirectKernel if served => {
                return Err(format!("the zygote served `{stage}` though its unit was masked"))
            }
            _ => {}
        }
    }
    let fell_back = "nubo-cloud-init-stage: the zygote is not answering";
    if mode == Mode::DirectKernel && console.matches(fell_back).count() != 4 {
        return Err(format!(
            "with the zygote masked, the console does not say `{fell_back}` once for each of the four stages"
        ));
    }
    Ok(())
}

fn make_seed(mode: Mode, dir: &Path, hostname: &str, user_data: &str) -> Result<PathBuf, String> {
    let instance_id = format!("iid-{hostname}");
    match mode {
        Mode::Bios => {
            let (ud, md, out) = (dir.join("user-data"), dir.join("meta-data"), dir.join("seed.img"));
            std::fs::write(&ud, user_data).map_err(|e| e.to_string())?;
            std::fs::write(&md, format!("instance-id: {instance_id}\nlocal-hostname: {hostname}\n"))
                .map_err(|e| e.to_string())?;
            let mut c = Command::new("cloud-localds");
            c.arg(&out).arg(&ud).arg(&md);
            run_with_timeout(&mut c, Duration::from_secs(60))?;
            Ok(out)
        }
        Mode::Efi | Mode::DirectKernel => {
            let spec = SeedSpec {
                instance_id,
                local_hostname: hostname.to_owned(),
                user_data: Some(user_data.as_bytes().to_vec()),
                ..SeedSpec::default()
            };
            let (format, name) = if mode == Mode::Efi {
                (SeedFormat::Iso, "seed.iso")
            } else {
                (SeedFormat::Vfat, "seed.vfat")
            };
            let bytes = nubo_seed::build(&spec, format).map_err(|e| format!("nubo_seed::build: {e}"))?;
            let out = dir.join(name);
            std::fs::write(&out, bytes).map_err(|e| e.to_string())?;
            Ok(out)
        }
    }
}

fn qemu_command(
    mode: Mode,
    image: &DebianImage,
    dir: &Path,
    overlay: &Path,
    seed: &Path,
    log: &Path,
    port: u16,
) -> Result<Command, String> {
    let mut c = Command::new("qemu-system-x86_64");
    c.args([
        "-machine",
        "pc",
        "-accel",
        "tcg",
        "-cpu",
        "max",
        "-smp",
        "2",
        "-m",
        "1024",
        "-display",
        "none",
        "-no-reboot",
    ])
    .arg("-serial")
    .arg(format!("file:{}", log.display()))
    .arg("-drive")
    .arg(format!("file={},if=virtio,format=qcow2", overlay.display()))
    .arg("-netdev")
    .arg(format!("user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:22"))
    .args(["-device", "virtio-net-pci,netdev=n0"])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    match mode {
        // cloud-localds output on virtio-blk.
        Mode::Bios => c
            .arg("-drive")
            .arg(format!("file={},if=virtio,format=raw,readonly=on", seed.display())),
        // ISO seed as an IDE CD-ROM on pc: the cloud kernel has no AHCI, so never SATA.
        Mode::Efi => {
            let vars = dir.join("OVMF_VARS.fd");
            std::fs::copy(OVMF_VARS, &vars).map_err(|e| format!("cannot copy {OVMF_VARS}: {e}"))?;
            c.arg("-drive")
                .arg(format!("if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}"))
                .arg("-drive")
                .arg(format!("if=pflash,format=raw,unit=1,file={}", vars.display()))
                .arg("-drive")
                .arg(format!(
                    "file={},if=ide,media=cdrom,format=raw,readonly=on",
                    seed.display()
                ))
        }
        // VFAT seed on virtio-blk; kernel, initrd and command line from the image record, with
        // the cloud-init zygote masked: the stages' fallback.
        Mode::DirectKernel => c
            .arg("-kernel")
            .arg(&image.kernel)
            .arg("-initrd")
            .arg(&image.initrd)
            .arg("-append")
            .arg(format!(
                "{} systemd.mask=nubo-cloud-init-zygote.service console=ttyS0,115200",
                image.cmdline
            ))
            .arg("-drive")
            .arg(format!("file={},if=virtio,format=raw,readonly=on", seed.display())),
    };
    Ok(c)
}

/// sshd answering on the forwarded port proves it started with host keys made on first boot.
fn ssh_banner(port: u16) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let attempt = TcpStream::connect(("127.0.0.1", port)).and_then(|mut s| {
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf)?;
            Ok(String::from_utf8_lossy(&buf[..n]).trim().to_owned())
        });
        match attempt {
            Ok(b) if b.starts_with("SSH-2.0-") => return Ok(b),
            _ if Instant::now() >= deadline => {
                return Err(format!(
                    "no SSH banner on 127.0.0.1:{port} (forwarded to the guest's :22): {attempt:?}"
                ))
            }
            _ => std::thread::sleep(Duration::from_secs(1)),
        }
    }
}

fn sha256_file(p: &Path) -> Result<String, String> {
    nubo_bootstrap::digest::file_digest(p).map_err(|e| format!("cannot hash {}: {e}", p.display()))
}

/// `Up 72.42 seconds` from cloud-init's closing line.
fn uptime(finished: &str) -> Option<String> {
    let up = finished.split("Up ").nth(1)?;
    Some(format!("{}s uptime", up.split_whitespace().next()?))
}

fn rand_u32() -> u32 {
    let mut b = [0u8; 4];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_or_else(
            |_| std::process::id() ^ Instant::now().elapsed().subsec_nanos(),
            |()| u32::from_le_bytes(b),
        )
}
