//! A q35 + UEFI VM on libvirt (`--machine q35 --firmware efi`), booted beside the main test's
//! VM so its boot costs no extra wall time (TCG runs a vCPU per core; the machine has two).
//!
//! `--firmware efi` boots through OVMF and the image's own GRUB, not the recorded kernel
//! directly. It proves: cloud-init's closing line names `DataSourceNoCloud` with the seed on
//! `/dev/sr0` (the CD-ROM on virtio-scsi, which Debian's cloud kernel drives; SATA it could
//! not see); libvirt chose the firmware itself (plain OVMF, Secure Boot off, which nubo's
//! unsigned GRUB needs) and made a per-VM NVRAM file from its template; the guest kernel says
//! it was started by EDK II on a Q35 machine; `vm rm` removes the NVRAM with the domain.
//! The same boot proves the day-one features on libvirt ([`super::day_one`]): shared folders,
//! a published port, pause and resume.

use std::fs;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nubo_live::cli::{inspect, nubo};
use nubo_live::libvirtd::Libvirtd;
use nubo_live::{Guard, TestResult, TestRoot};

use super::day_one::DayOne;

pub const NAME: &str = "lv-efi";
const QUICK: Duration = Duration::from_secs(180);

/// The create running in the background (killed on drop). The VM itself is removed on every
/// path out by the main test's `Cleanup`, which names it: a `Cleanup` of its own would kill
/// every QEMU under the shared root, the main VM's too.
pub struct EfiBoot {
    guard: Guard,
    logs: tempfile::TempDir,
    started: Instant,
    day_one: DayOne,
}

/// Starts `nubo vm create lv-efi --machine q35 --firmware efi --wait` in the background.
pub fn spawn(root: &TestRoot, boot: Duration) -> Result<EfiBoot, String> {
    let logs = tempfile::tempdir().map_err(|e| format!("cannot create a temp dir: {e}"))?;
    let day_one = DayOne::prepare(root, NAME)?;
    let file = |n: &str| {
        let p = logs.path().join(n);
        fs::File::create(&p).map_err(|e| format!("creating {}: {e}", p.display()))
    };
    let mut cmd = root.cmd()?;
    cmd.args([
        "vm",
        "create",
        NAME,
        "--image",
        "debian:12",
        "--backend",
        "libvirt",
        "--machine",
        "q35",
        "--firmware",
        "efi",
        "--memory",
        "768M",
        "--hostname",
        NAME,
        "--wait",
        "--boot-timeout",
        &format!("{}s", boot.as_secs()),
    ])
    .args(day_one.args())
    .stdin(Stdio::null())
    .stdout(Stdio::from(file("out")?))
    .stderr(Stdio::from(file("err")?));
    let guard = Guard::spawn(&mut cmd, "nubo vm create (q35, efi)")?;
    Ok(EfiBoot {
        guard,
        logs,
        started: Instant::now(),
        day_one,
    })
}

impl EfiBoot {
    /// Waits for the create, checks what libvirt and the guest show, removes the VM.
    pub fn finish(mut self, root: &TestRoot, lv: &Libvirtd, timeout: Duration) -> TestResult {
        let remaining = timeout.saturating_sub(self.started.elapsed());
        let status = self.guard.wait_timeout(remaining);
        let err = fs::read_to_string(self.logs.path().join("err")).unwrap_or_default();
        let console_path = root.root().join("vms").join(NAME).join("console.log");
        // Lossy: OVMF and GRUB write bytes that are not UTF-8 before the kernel does.
        let console = String::from_utf8_lossy(&fs::read(&console_path).unwrap_or_default()).into_owned();
        let tail = |s: &str| {
            s.lines()
                .rev()
                .take(25)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        };
        match status {
            Ok(s) if s.success() => {}
            other => {
                return Err(format!(
                    "the q35 + EFI create failed ({other:?}):\n{err}\nconsole {}:\n{}",
                    console_path.display(),
                    tail(&console)
                ))
            }
        }
        println!(
            "timing q35 + EFI create --wait (TCG boot, beside the main one): {:.1}s",
            self.started.elapsed().as_secs_f64()
        );

        // Cloud-init read the seed from the virtio-scsi CD-ROM.
        let closing = console
            .lines()
            .find(|l| l.contains("Cloud-init v.") && l.contains("finished at"))
            .unwrap_or_default();
        if !closing.contains("DataSourceNoCloud") || !closing.contains("seed=/dev/sr0") {
            return Err(format!(
                "cloud-init's closing line does not name DataSourceNoCloud on /dev/sr0: {closing:?}\n{}",
                tail(&console)
            ));
        }
        // The guest kernel was started by UEFI firmware on a Q35 machine.
        for want in ["efi: EFI v", "by EDK II", "Q35"] {
            if !console.contains(want) {
                return Err(format!("the guest's console never says `{want}`:\n{}", tail(&console)));
            }
        }

        // libvirt picked the firmware (plain OVMF, Secure Boot off) and made the VM's NVRAM.
        let xml = lv.virsh(&["dumpxml", NAME])?.require()?.stdout;
        let doc = roxmltree::Document::parse(&xml).map_err(|e| format!("dumpxml {NAME}: {e}"))?;
        let os = doc
            .descendants()
            .find(|n| n.has_tag_name("os"))
            .ok_or_else(|| format!("no <os> in:\n{xml}"))?;
        let child = |name: &str| os.children().find(|n| n.has_tag_name(name));
        let machine = child("type").and_then(|t| t.attribute("machine")).unwrap_or_default();
        let loader = child("loader").and_then(|l| l.text()).unwrap_or_default();
        let secure = child("loader").and_then(|l| l.attribute("secure")).unwrap_or("no");
        let nvram = child("nvram").and_then(|l| l.text()).unwrap_or_default().to_owned();
        if os.attribute("firmware") != Some("efi")
            || !machine.contains("q35")
            || !loader.contains("OVMF_CODE")
            || secure != "no"
            || !nvram.ends_with(&format!("/{NAME}_VARS.fd"))
        {
            return Err(format!(
                "libvirt did not auto-select plain OVMF with a per-VM NVRAM on q35 (machine {machine}, loader {loader}, secure {secure}, nvram {nvram}):\n{xml}"
            ));
        }
        // The NVRAM, seen from the host: libvirtd's /var/lib/libvirt is the harness's lib/.
        let nvram_host: PathBuf = lv.dir().join("lib").join(
            nvram
                .strip_prefix("/var/lib/libvirt/")
                .ok_or_else(|| format!("NVRAM {nvram} is not under /var/lib/libvirt"))?,
        );
        if !nvram_host.is_file() {
            return Err(format!("the NVRAM {} does not exist", nvram_host.display()));
        }
        let scsi = doc.descendants().any(|n| {
            n.has_tag_name("controller")
                && n.attribute("type") == Some("scsi")
                && n.attribute("model") == Some("virtio-scsi")
        });
        let blk = lv.virsh(&["domblklist", NAME, "--details"])?.require()?.stdout;
        let cdrom: Vec<&str> = blk
            .lines()
            .find(|l| l.contains("cdrom"))
            .map(|l| l.split_whitespace().collect())
            .unwrap_or_default();
        if !scsi || cdrom.get(2) != Some(&"sda") || cdrom.last() != Some(&format!("{NAME}-cidata.iso").as_str()) {
            return Err(format!(
                "the seed is not the CD-ROM sda on virtio-scsi (controller: {scsi}):\n{blk}"
            ));
        }
        let rec = inspect(root, NAME)?;
        if rec["backend"] != "libvirt" {
            return Err(format!("record backend is {}", rec["backend"]));
        }

        self.day_one.check(root, lv, NAME)?;

        // rm removes the domain, its NVRAM and libvirt's virtiofsd.
        nubo(root, &["vm", "rm", "--force", NAME], QUICK)?.require()?;
        self.day_one.after_rm()?;
        let domains = lv.virsh(&["list", "--all", "--name"])?.require()?.stdout;
        if domains.split_whitespace().any(|d| d == NAME) {
            return Err(format!("after rm the domain {NAME} is still defined"));
        }
        if nvram_host.exists() {
            return Err(format!("after rm the NVRAM {} is still there", nvram_host.display()));
        }
        Ok(())
    }
}
