//! The root tree: mmdebstrap's command line and the files nubo lays over what the packages
//! install. Pure: paths in, argv and file contents out.

use std::path::Path;

use crate::commands::operand;
use crate::grub;
use crate::recipe::Recipe;

/// A file nubo writes into the root tree (path relative to `/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlayFile {
    pub path: &'static str,
    pub contents: String,
}

pub use crate::identity::Ids;

/// Where the facts hook leaves what the build records (package versions, the newest packaged
/// file's time) inside the tree; mmdebstrap's cleanup empties `/run` afterwards.
pub const FACTS_DIR: &str = "/run/nubo-facts";

/// Host keys must not be baked into an image every VM shares. cloud-init's `ssh` module makes
/// them on first boot (it runs before sshd); this unit is the fallback for a boot where
/// cloud-init did not run, so sshd never starts without keys.
const SSH_KEYGEN_UNIT: &str = "\
[Unit]
Description=Generate missing SSH host keys (nubo bootstrap image)
After=cloud-init.service
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A

[Install]
WantedBy=ssh.service
";

pub const SSH_KEYGEN_UNIT_NAME: &str = "nubo-ssh-keygen.service";

/// cloud-init makes only the ed25519 host key at first boot (an RSA key alone costs seconds
/// under TCG, and every client nubo knows prefers ed25519); this makes the others once
/// cloud-init is done, off the boot's critical path. Per instance too: cloud-init deletes
/// every host key of an earlier instance, so the RSA key is missing again. sshd is not
/// reloaded for them (it serves them from its next start): a reload re-executes sshd, and a
/// connection arriving in that moment, just after cloud-init's closing line, when users and
/// `image build` connect, was reset (`kex_exchange_identification: Connection reset by peer`).
const SSH_KEYGEN_REST_UNIT: &str = "\
[Unit]
Description=Generate the remaining SSH host keys after cloud-init (nubo bootstrap image)
After=cloud-final.service ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_rsa_key

[Service]
Type=oneshot
Nice=10
ExecStart=/usr/bin/ssh-keygen -A

[Install]
WantedBy=cloud-init.target
";

pub const SSH_KEYGEN_REST_UNIT_NAME: &str = "nubo-ssh-keygen-rest.service";

/// cloud-init limited to what a nubo VM uses: the NoCloud seed (and None as the explicit
/// fallback), no probing of other clouds; only the ed25519 host key at first boot (see
/// [`SSH_KEYGEN_REST_UNIT`]); and module lists without the modules for other distributions'
/// or clouds' tooling (snap, landscape, lxd, puppet, chef, ubuntu-advantage...), which each
/// cost an import in every stage. What a user's cloud-config commonly asks for stays: users,
/// ssh keys, hostname, write_files, mounts, growpart, bootcmd/runcmd, packages, apt, locale,
/// timezone, passwords, scripts, power state, and final-message (nubo's readiness line).
const CLOUD_CFG: &str = "\
datasource_list: [ NoCloud, None ]
ssh_genkeytypes: [ ed25519 ]
cloud_init_modules:
 - seed_random
 - bootcmd
 - write-files
 - growpart
 - resizefs
 - disk_setup
 - mounts
 - set_hostname
 - update_hostname
 - update_etc_hosts
 - ca-certs
 - users-groups
 - ssh
cloud_config_modules:
 - ssh-import-id
 - keyboard
 - locale
 - set-passwords
 - apt-configure
 - ntp
 - timezone
 - runcmd
cloud_final_modules:
 - package-update-upgrade-install
 - write-files-deferred
 - scripts-vendor
 - scripts-per-once
 - scripts-per-boot
 - scripts-per-instance
 - scripts-user
 - phone-home
 - final-message
 - power-state-change
";

/// cloud-init's zygote (recipe 5, issue 25): one python3 per boot imports cloud-init, then
/// forks a child per stage, instead of four processes each importing it (most of first boot
/// under TCG). `@PRELOAD@` becomes the modules the stages import beyond `cloudinit.cmd.main`.
const ZYGOTE_PY: &str = include_str!("zygote/cloud-init-zygote");

/// The stage units' client: hands its argv, environment and stdio to the zygote and exits with
/// the stage's status, or runs the stage the normal way when the zygote is not there.
const STAGE_PY: &str = include_str!("zygote/cloud-init-stage");

pub const ZYGOTE_PATH: &str = "/usr/lib/nubo/cloud-init-zygote";
pub const STAGE_PATH: &str = "/usr/lib/nubo/cloud-init-stage";
pub const ZYGOTE_UNIT_NAME: &str = "nubo-cloud-init-zygote.service";

/// Started as early as boot allows (only the journal first; the root filesystem is readable,
/// read-only, from the initramfs on), pulled in and waited for by the stage units' drop-ins
/// (`Wants=`/`After=`), so it runs exactly when cloud-init does and adds no ordering cycle:
/// it is ordered after nothing a stage unit comes before. `Type=notify`: ready once cloud-init
/// is imported; past `TimeoutStartSec` systemd stops it and the stages run the normal way.
/// `KillMode=process`, as cloud-final.service: what runcmd starts (a child of the final stage's
/// process, which lives in this unit) survives the zygote's exit.
const ZYGOTE_UNIT: &str = "\
[Unit]
Description=cloud-init imported once for the boot's four stages (nubo bootstrap image)
DefaultDependencies=no
After=systemd-journald.socket
Before=cloud-init-local.service shutdown.target
Conflicts=shutdown.target
ConditionPathExists=!/etc/cloud/cloud-init.disabled
ConditionKernelCommandLine=!cloud-init=disabled

[Service]
Type=notify
ExecStart=/usr/bin/python3 -I /usr/lib/nubo/cloud-init-zygote
RuntimeDirectory=nubo-cloud-init
RuntimeDirectoryMode=0700
RuntimeDirectoryPreserve=yes
TimeoutStartSec=300
KillMode=process
StandardOutput=journal+console
";

/// The four stage units as Debian 12's cloud-init ships them: (the drop-in nubo adds, the argv
/// the unit's ExecStart gives /usr/bin/cloud-init).
pub const STAGE_DROPINS: &[(&str, &str)] = &[
    (
        "etc/systemd/system/cloud-init-local.service.d/nubo-zygote.conf",
        "init --local",
    ),
    ("etc/systemd/system/cloud-init.service.d/nubo-zygote.conf", "init"),
    (
        "etc/systemd/system/cloud-config.service.d/nubo-zygote.conf",
        "modules --mode=config",
    ),
    (
        "etc/systemd/system/cloud-final.service.d/nubo-zygote.conf",
        "modules --mode=final",
    ),
];

/// A stage unit's drop-in: same name, ordering and type, its ExecStart through the zygote.
fn stage_dropin(args: &str) -> String {
    format!(
        "[Unit]\nWants={ZYGOTE_UNIT_NAME}\nAfter={ZYGOTE_UNIT_NAME}\n\n[Service]\nExecStart=\nExecStart=/usr/bin/python3 -I -S {STAGE_PATH} {args}\n"
    )
}

/// The zygote with its preload list: every module CLOUD_CFG names (`cloudinit.config.cc_*`)
/// and what the stages load besides (the NoCloud datasource, Debian's distro, the network
/// renderers, the user-data handlers, schema validation).
fn zygote_script() -> String {
    let mut preload: Vec<String> = [
        "cloudinit.stages",
        "cloudinit.config.modules",
        "cloudinit.config.schema",
        "cloudinit.sources.DataSourceNoCloud",
        "cloudinit.sources.DataSourceNone",
        "cloudinit.distros.debian",
        "cloudinit.net.eni",
        "cloudinit.net.netplan",
        "cloudinit.net.networkd",
        "cloudinit.net.sysconfig",
        "cloudinit.net.renderers",
        "cloudinit.net.activators",
        "cloudinit.net.dhcp",
        "cloudinit.net.cmdline",
        "cloudinit.handlers.boot_hook",
        "cloudinit.handlers.cloud_config",
        "cloudinit.handlers.jinja_template",
        "cloudinit.handlers.shell_script",
        "cloudinit.handlers.shell_script_by_frequency",
        "cloudinit.templater",
        "cloudinit.ssh_util",
        "cloudinit.url_helper",
        "jsonschema",
        "yaml",
        "jinja2",
    ]
    .iter()
    .map(|m| m.to_string())
    .collect();
    preload.extend(
        CLOUD_CFG
            .lines()
            .filter_map(|l| l.strip_prefix(" - "))
            .map(|m| format!("cloudinit.config.cc_{}", m.replace('-', "_"))),
    );
    let list = preload
        .iter()
        .map(|m| format!("\"{m}\""))
        .collect::<Vec<_>>()
        .join(", ");
    ZYGOTE_PY.replace("@PRELOAD@", &format!("[{list}]"))
}

/// The initramfs holds only what finds and mounts the root of a nubo VM: virtio disks (PCI or
/// MMIO transport, as the microvm machine has) and ext4 (with crc32c for its metadata checksums). `MODULES=list` instead of Debian's
/// `most`: a smaller image to unpack and no udev coldplug of drivers a VM never has.
const INITRAMFS_MODULES: &str = "\
virtio_pci
virtio_mmio
virtio_blk
virtio_scsi
sd_mod
ext4
crc32c_generic
";

/// Units that do nothing useful in a short-lived VM and cost boot time or wake it later:
/// apt's daily download/upgrade timers, e2scrub (LVM snapshots; nubo's root is not on LVM),
/// man-db's cache rebuild, and fstrim (the overlay is discarded with the VM).
pub const MASKED_UNITS: &[&str] = &[
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "man-db.timer",
    "fstrim.timer",
];

pub fn overlay(ids: &Ids) -> Vec<OverlayFile> {
    let f = |path, contents: String| OverlayFile { path, contents };
    let mut files = vec![
        // Without it cloud-init's cc_locale tries to generate a locale minbase cannot.
        f("etc/default/locale", "LANG=C.UTF-8\n".into()),
        // Only NoCloud (and None as the explicit fallback): otherwise cloud-init probes network
        // datasources and waits for metadata servers that are not there. See CLOUD_CFG.
        f("etc/cloud/cloud.cfg.d/90_nubo.cfg", CLOUD_CFG.into()),
        f("etc/initramfs-tools/conf.d/90-nubo.conf", "MODULES=list\n".into()),
        f("etc/initramfs-tools/modules", INITRAMFS_MODULES.into()),
        f(
            "etc/fstab",
            format!(
                "# <file system> <mount point> <type> <options> <dump> <pass>\n\
                 UUID={} / ext4 rw,discard,errors=remount-ro 0 1\n\
                 UUID={} /boot/efi vfat umask=0077,nofail 0 0\n",
                ids.root_uuid, ids.esp_id
            ),
        ),
        // cloud-init sets the real name from the seed's local-hostname; not the build host's.
        f("etc/hostname", "localhost\n".into()),
        f("etc/hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n".into()),
        f("boot/grub/grub.cfg", grub::grub_cfg(&ids.root_uuid)),
        f("etc/systemd/system/nubo-ssh-keygen.service", SSH_KEYGEN_UNIT.into()),
        f("etc/systemd/system/nubo-ssh-keygen-rest.service", SSH_KEYGEN_REST_UNIT.into()),
        f("usr/lib/nubo/cloud-init-zygote", zygote_script()),
        f("usr/lib/nubo/cloud-init-stage", STAGE_PY.into()),
        f("etc/systemd/system/nubo-cloud-init-zygote.service", ZYGOTE_UNIT.into()),
    ];
    files.extend(STAGE_DROPINS.iter().map(|(path, args)| f(path, stage_dropin(args))));
    files
}

/// Runs in the tree after the packages are in, before mmdebstrap's own cleanup (which empties
/// machine-id and the apt caches).
pub fn customize_script() -> String {
    let mask = MASKED_UNITS
        .iter()
        .map(|u| format!(r#"ln -sf /dev/null "$1"/etc/systemd/system/{u}"#))
        .collect::<Vec<_>>();
    let mut lines = vec![
        // Every VM from this image must get its own host keys.
        r#"rm -f "$1"/etc/ssh/ssh_host_*"#.to_owned(),
        // The build host's resolver: the guest's DHCP client writes its own.
        r#"rm -f "$1"/etc/resolv.conf"#.to_owned(),
        r#"mkdir -p "$1"/boot/efi "$1"/etc/systemd/system/ssh.service.wants "$1"/etc/systemd/system/cloud-init.target.wants"#.to_owned(),
        format!(
            r#"ln -sf /etc/systemd/system/{SSH_KEYGEN_UNIT_NAME} "$1"/etc/systemd/system/ssh.service.wants/{SSH_KEYGEN_UNIT_NAME}"#
        ),
        format!(
            r#"ln -sf /etc/systemd/system/{SSH_KEYGEN_REST_UNIT_NAME} "$1"/etc/systemd/system/cloud-init.target.wants/{SSH_KEYGEN_REST_UNIT_NAME}"#
        ),
    ];
    lines.extend(mask);
    lines.extend([
        // The initramfs again, with the overlay's MODULES=list.
        r#"chroot "$1" update-initramfs -u -k all"#.to_owned(),
        // Python's .pyc files as timestamp-checked ones: with SOURCE_DATE_EPOCH set (as it is
        // while the packages install) py3compile writes hash-checked ones, and every import
        // at boot then reads and hashes its source. A package's .py keeps its own time in the
        // image (see ext4_times), so the recorded time matches and the bytes are reproducible.
        r#"chroot "$1" sh -c 'python3 -m compileall -q -f --invalidation-mode timestamp /usr/lib/python3/dist-packages /usr/lib/python3.[0-9]*'"#.to_owned(),
    ]);
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    hook_script(&refs)
}

/// Runs last among the hooks: writes `packages` (one `NAME<TAB>VERSION` a line, as installed)
/// and `newest` (the latest mtime of any regular file a package shipped, in seconds) into
/// [`FACTS_DIR`]. Inside the chroot, so no path in a package's file list can reach the host's
/// files through an absolute symlink.
pub fn facts_script() -> String {
    hook_script(&[
        &format!(r#"mkdir -p "$1"{FACTS_DIR}"#),
        &format!(r#"chroot "$1" dpkg-query -W -f '${{Package}}\t${{Version}}\n' > "$1"{FACTS_DIR}/packages"#),
        &format!(
            r#"chroot "$1" sh -c 'cat /var/lib/dpkg/info/*.list | sort -u | xargs -r -d "\n" stat -c "%Y %F" -- 2>/dev/null; true' | awk '$2 == "regular" && $1 > m {{ m = $1 }} END {{ print m + 0 }}' > "$1"{FACTS_DIR}/newest"#
        ),
    ])
}

/// A hook's shell text: `lines` after `set -eu`, so the first failing line fails the build.
fn hook_script(lines: &[&str]) -> String {
    std::iter::once("set -eu")
        .chain(lines.iter().copied())
        .collect::<Vec<_>>()
        .join("\n")
}

/// mmdebstrap's arguments. `cache` holds .debs between builds: mmdebstrap keeps what it
/// downloaded (`--skip=download/empty`), hooks copy the cache in before apt runs and back out
/// after, and its cleanup then empties the image's copy.
pub fn mmdebstrap_args(
    recipe: &Recipe,
    mode: &str,
    overlay_dir: &Path,
    cache: Option<&Path>,
    facts_dir: &Path,
    target: &Path,
) -> Vec<String> {
    // mmdebstrap's special hooks split their text with shellwords and hand the words to tar
    // and friends: quoted, and never starting with `-`.
    let q = |p: &Path| shell_quote(&operand(p).display().to_string());
    let mut a = vec![
        format!("--mode={mode}"),
        "--variant=minbase".into(),
        "--architectures=amd64".into(),
        "--format=directory".into(),
        // No recommends: minbase's apt config already says so; keep it for the install phase too.
        "--aptopt=APT::Install-Recommends \"false\"".into(),
        format!("--include={}", recipe.packages().join(",")),
    ];
    if let Some(c) = cache {
        a.push("--skip=download/empty".into());
        a.push(r#"--setup-hook=mkdir -p "$1"/var/cache/apt/archives"#.into());
        a.push(format!("--setup-hook=sync-in {} /var/cache/apt/archives", q(c)));
        a.push(format!("--customize-hook=sync-out /var/cache/apt/archives {}", q(c)));
    }
    a.push(format!("--customize-hook=sync-in {} /", q(overlay_dir)));
    a.push(format!("--customize-hook={}", customize_script()));
    a.push(format!("--customize-hook={}", facts_script()));
    a.push(format!("--customize-hook=sync-out {FACTS_DIR} {}", q(facts_dir)));
    // mmdebstrap's Getopt::Long permutes: without `--`, a positional that looks like an option
    // (a mirror of `--customize-hook=...`) would be parsed as one.
    a.push("--".into());
    a.push(recipe.release.suite.into());
    a.push(operand(target).display().to_string());
    a.push(recipe.mirror.clone());
    a
}

/// Single-quotes `s` for `sh`, as mmdebstrap runs hooks through it.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recipe::{Release, DEFAULT_SIZE};
    use std::path::PathBuf;

    fn ids() -> Ids {
        Ids {
            root_uuid: "11111111-2222-3333-4444-555555555555".into(),
            esp_id: "ABCD-1234".into(),
            ..Ids::derive("sha256:test")
        }
    }

    #[test]
    fn overlay_restricts_datasources() {
        let files = overlay(&ids());

        let ds = files
            .iter()
            .find(|f| f.path == "etc/cloud/cloud.cfg.d/90_nubo.cfg")
            .unwrap();
        assert!(
            ds.contents.starts_with("datasource_list: [ NoCloud, None ]\n"),
            "{}",
            ds.contents
        );
    }

    #[test]
    fn overlay_fstab_mounts_root_by_uuid() {
        let files = overlay(&ids());

        let fstab = files.iter().find(|f| f.path == "etc/fstab").unwrap();
        assert!(fstab
            .contents
            .contains("UUID=11111111-2222-3333-4444-555555555555 / ext4"));
    }

    #[test]
    fn overlay_sets_utf8_locale() {
        assert!(overlay(&ids()).contains(&OverlayFile {
            path: "etc/default/locale",
            contents: "LANG=C.UTF-8\n".into()
        }));
    }

    #[test]
    fn customize_script_removes_host_keys() {
        assert!(customize_script().contains(r#"rm -f "$1"/etc/ssh/ssh_host_*"#));
    }

    #[test]
    fn customize_script_is_exactly_its_lines_after_set_eu() {
        let s = customize_script();
        let lines: Vec<&str> = s.lines().collect();

        assert_eq!(
            &lines[..6],
            &[
                "set -eu",
                "rm -f \"$1\"/etc/ssh/ssh_host_*",
                "rm -f \"$1\"/etc/resolv.conf",
                "mkdir -p \"$1\"/boot/efi \"$1\"/etc/systemd/system/ssh.service.wants \"$1\"/etc/systemd/system/cloud-init.target.wants",
                "ln -sf /etc/systemd/system/nubo-ssh-keygen.service \"$1\"/etc/systemd/system/ssh.service.wants/nubo-ssh-keygen.service",
                "ln -sf /etc/systemd/system/nubo-ssh-keygen-rest.service \"$1\"/etc/systemd/system/cloud-init.target.wants/nubo-ssh-keygen-rest.service",
            ]
        );
        assert_eq!(lines.len(), 6 + MASKED_UNITS.len() + 2, "{s}");
        assert_eq!(lines[6], "ln -sf /dev/null \"$1\"/etc/systemd/system/apt-daily.timer");
    }

    #[test]
    fn customize_script_rebuilds_initramfs_then_compiles_timestamp_pyc() {
        let s = customize_script();
        let lines: Vec<&str> = s.lines().collect();

        assert_eq!(lines[lines.len() - 2], "chroot \"$1\" update-initramfs -u -k all");
        assert!(
            lines[lines.len() - 1]
                .contains("compileall -q -f --invalidation-mode timestamp /usr/lib/python3/dist-packages"),
            "{s}"
        );
    }

    #[test]
    fn overlay_cloud_cfg_keeps_final_message_and_user_modules() {
        let files = overlay(&ids());
        let cfg = &files
            .iter()
            .find(|f| f.path == "etc/cloud/cloud.cfg.d/90_nubo.cfg")
            .unwrap()
            .contents;

        // final-message is nubo's readiness line; the rest is what users' cloud-config asks for.
        for m in [
            "final-message",
            "runcmd",
            "write-files",
            "users-groups",
            "ssh",
            "mounts",
            "growpart",
            "package-update-upgrade-install",
        ] {
            assert!(cfg.contains(&format!("\n - {m}\n")), "{m} missing:\n{cfg}");
        }
        assert!(cfg.contains("ssh_genkeytypes: [ ed25519 ]\n"), "{cfg}");
    }

    #[test]
    fn overlay_initramfs_lists_virtio_and_ext4() {
        let files = overlay(&ids());
        let get = |p: &str| &files.iter().find(|f| f.path == p).unwrap().contents;

        assert_eq!(get("etc/initramfs-tools/conf.d/90-nubo.conf"), "MODULES=list\n");
        let modules: Vec<&str> = get("etc/initramfs-tools/modules").lines().collect();
        for m in ["virtio_pci", "virtio_mmio", "virtio_blk", "ext4"] {
            assert!(modules.contains(&m), "{m} missing: {modules:?}");
        }
    }

    fn file(path: &str) -> String {
        overlay(&ids())
            .into_iter()
            .find(|f| f.path == path)
            .unwrap_or_else(|| panic!("{path} not in the overlay"))
            .contents
    }

    #[test]
    fn overlay_stage_dropins_clear_execstart_and_run_the_client() {
        let expected = [
            ("cloud-init-local.service", "init --local"),
            ("cloud-init.service", "init"),
            ("cloud-config.service", "modules --mode=config"),
            ("cloud-final.service", "modules --mode=final"),
        ];
        for (unit, args) in expected {
            let d = file(&format!("etc/systemd/system/{unit}.d/nubo-zygote.conf"));

            assert_eq!(
                d,
                format!(
                    "[Unit]\nWants=nubo-cloud-init-zygote.service\nAfter=nubo-cloud-init-zygote.service\n\n\
                     [Service]\nExecStart=\nExecStart=/usr/bin/python3 -I -S /usr/lib/nubo/cloud-init-stage {args}\n"
                )
            );
        }
        assert_eq!(STAGE_DROPINS.len(), expected.len());
    }

    #[test]
    fn zygote_unit_starts_early_notifies_and_keeps_runcmd_processes() {
        let u = file("etc/systemd/system/nubo-cloud-init-zygote.service");

        for line in [
            "DefaultDependencies=no",
            "After=systemd-journald.socket",
            "Before=cloud-init-local.service shutdown.target",
            "Type=notify",
            "ExecStart=/usr/bin/python3 -I /usr/lib/nubo/cloud-init-zygote",
            "RuntimeDirectoryMode=0700",
            "KillMode=process",
            "ConditionPathExists=!/etc/cloud/cloud-init.disabled",
        ] {
            assert!(u.lines().any(|l| l == line), "{line} missing:\n{u}");
        }
        // Ordered after nothing the stage units come before: no ordering cycle.
        let after: Vec<&str> = u.lines().filter(|l| l.starts_with("After=")).collect();
        assert_eq!(after, ["After=systemd-journald.socket"]);
        assert!(
            !u.contains("[Install]"),
            "pulled in by the stage units, not enabled:\n{u}"
        );
    }

    #[test]
    fn zygote_script_preloads_every_configured_module() {
        let z = file("usr/lib/nubo/cloud-init-zygote");

        assert!(!z.contains("@PRELOAD@"), "{z}");
        let preload = z.lines().find(|l| l.starts_with("PRELOAD = [")).unwrap();
        for m in [
            "\"cloudinit.config.cc_write_files\"",
            "\"cloudinit.config.cc_users_groups\"",
            "\"cloudinit.config.cc_final_message\"",
            "\"cloudinit.config.cc_package_update_upgrade_install\"",
            "\"cloudinit.sources.DataSourceNoCloud\"",
        ] {
            assert!(preload.contains(m), "{m} missing: {preload}");
        }
        assert_eq!(
            preload.matches("cloudinit.config.cc_").count(),
            CLOUD_CFG.lines().filter(|l| l.starts_with(" - ")).count()
        );
        assert!(z.contains("import cloudinit.cmd.main as main_module"), "{z}");
        // Only the four stages are served, and the zygote ends with the last one.
        assert!(z.contains("FINAL = [\"modules\", \"--mode=final\"]"), "{z}");
    }

    #[test]
    fn stage_client_falls_back_to_plain_cloud_init() {
        let c = file("usr/lib/nubo/cloud-init-stage");

        assert!(c.contains("CLOUD_INIT = \"/usr/bin/cloud-init\""), "{c}");
        assert!(c.contains("os.execv(CLOUD_INIT, [CLOUD_INIT] + sys.argv[1:])"), "{c}");
        // -S: builtin modules only, nothing from site-packages.
        for l in c.lines().filter(|l| l.starts_with("import ")) {
            assert!(["import _socket", "import os", "import sys"].contains(&l), "{l}");
        }
    }

    /// The rendered zygote and client for real, with python3, against a stand-in
    /// `cloudinit.cmd.main` in a temporary directory (paths rewritten to it): a stage runs in
    /// the zygote's child with the client's environment and stdout, its exit status comes back,
    /// a request that is not a stage and a missing zygote both run `cloud-init` the normal way
    /// (here `echo`), and the zygote exits after the final stage.
    #[test]
    fn zygote_and_client_run_stages_and_fall_back() {
        use std::process::{Command, Stdio};
        let Ok(py) = which("python3") else {
            panic!("python3 is needed (it is in every Debian; scripts/install-deps.sh)");
        };
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        let run = d.join("run");
        std::fs::create_dir_all(d.join("py/cloudinit/cmd")).unwrap();
        std::fs::write(d.join("py/cloudinit/__init__.py"), "").unwrap();
        std::fs::write(d.join("py/cloudinit/cmd/__init__.py"), "").unwrap();
        std::fs::write(
            d.join("py/cloudinit/cmd/main.py"),
            "import os, sys\ndef main(args):\n    print('stage', ' '.join(args[1:]), os.environ.get('STAGE_ENV'), os.getppid())\n    \
             if args[1:] == ['modules', '--mode=config']:\n        sys.exit(3)\n    return 0\n",
        )
        .unwrap();
        let rewrite = |s: &str| {
            s.replace("/run/nubo-cloud-init", &run.display().to_string())
                .replace("/usr/bin/cloud-init", "/bin/echo")
        };
        std::fs::write(d.join("zygote"), rewrite(&file("usr/lib/nubo/cloud-init-zygote"))).unwrap();
        std::fs::write(d.join("stage"), rewrite(&file("usr/lib/nubo/cloud-init-stage"))).unwrap();
        let stage = |args: &[&str]| {
            let out = Command::new(&py)
                .args(["-I", "-S"])
                .arg(d.join("stage"))
                .args(args)
                .env("STAGE_ENV", "from-client")
                .stdin(Stdio::null())
                .output()
                .unwrap();
            (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
        };

        // No zygote yet: the normal way.
        assert_eq!(stage(&["init", "--local"]), (Some(0), "init --local\n".into()));

        let mut zygote = Command::new(&py)
            .arg(d.join("zygote"))
            .env("PYTHONPATH", d.join("py"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let sock = run.join("zygote.sock");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !sock.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let zpid = zygote.id().to_string();
        let served = |args: &[&str], code: i32| {
            let (c, out) = stage(args);
            assert_eq!(c, Some(code), "{args:?}: {out}");
            assert_eq!(
                out,
                format!("stage {} from-client {zpid}\n", args.join(" ")),
                "{args:?}"
            );
        };
        served(&["init", "--local"], 0);
        served(&["init"], 0);
        served(&["modules", "--mode=config"], 3);
        assert_eq!(stage(&["status", "--wait"]), (Some(0), "status --wait\n".into()));
        served(&["modules", "--mode=final"], 0);

        let status = zygote.wait().unwrap();
        assert!(status.success(), "{status}");
        assert!(!sock.exists());
        let log = std::fs::read_to_string(run.join("served")).unwrap();
        let stages: Vec<&str> = log.lines().map(|l| l.split(" pid ").next().unwrap()).collect();
        assert_eq!(
            stages,
            ["init --local", "init", "modules --mode=config", "modules --mode=final"]
        );
        // Gone after the final stage: the normal way again.
        assert_eq!(stage(&["init"]), (Some(0), "init\n".into()));
    }

    fn which(name: &str) -> Result<PathBuf, ()> {
        std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
            .ok_or(())
    }

    #[test]
    fn facts_script_starts_with_set_eu_and_has_three_commands() {
        let s = facts_script();

        assert!(s.starts_with("set -eu\nmkdir -p \"$1\"/run/nubo-facts\nchroot "), "{s}");
        assert_eq!(s.lines().count(), 4, "{s}");
    }

    /// Debian 12 from a plain mirror, with no extra packages.
    fn bookworm() -> Recipe {
        Recipe::new(
            Release::find("debian", "12").unwrap(),
            "http://m/debian".into(),
            DEFAULT_SIZE,
            vec![],
        )
        .unwrap()
    }

    #[test]
    fn mmdebstrap_args_cache_hooks_and_positionals() {
        let r = bookworm();

        let a = mmdebstrap_args(
            &r,
            "root",
            &PathBuf::from("/w/overlay"),
            Some(&PathBuf::from("/c/debs")),
            &PathBuf::from("/w/facts"),
            &PathBuf::from("/w/root"),
        );

        assert!(a.contains(&"--skip=download/empty".to_string()));
        assert!(a.contains(&"--customize-hook=sync-out /var/cache/apt/archives '/c/debs'".to_string()));
        assert_eq!(&a[a.len() - 4..], &["--", "bookworm", "/w/root", "http://m/debian"]);
    }

    /// Defence in depth: even a recipe built without `Recipe::new`'s checks cannot smuggle an
    /// option in through the mirror, the target or the cache directory.
    #[test]
    fn mmdebstrap_args_option_shaped_values_land_as_operands() {
        let r = Recipe {
            release: Release::find("debian", "12").unwrap(),
            mirror: "--customize-hook=touch /tmp/x".into(),
            size: DEFAULT_SIZE,
            extra_packages: vec![],
        };

        let a = mmdebstrap_args(
            &r,
            "root",
            &PathBuf::from("-x"),
            Some(&PathBuf::from("-oProxyCommand=x")),
            &PathBuf::from("-f"),
            &PathBuf::from("--customize-hook=y"),
        );

        let dashes = a.iter().position(|x| x == "--").unwrap();
        assert_eq!(
            &a[dashes..],
            &[
                "--",
                "bookworm",
                "./--customize-hook=y",
                "--customize-hook=touch /tmp/x"
            ]
        );
        assert!(a.contains(&"--customize-hook=sync-in './-x' /".to_string()), "{a:?}");
        assert!(
            a.contains(&"--customize-hook=sync-out /run/nubo-facts './-f'".to_string()),
            "{a:?}"
        );
        assert!(
            a.contains(&"--setup-hook=sync-in './-oProxyCommand=x' /var/cache/apt/archives".to_string()),
            "{a:?}"
        );
        assert!(
            !a[..dashes].iter().any(|x| x.starts_with("--customize-hook=touch")),
            "{a:?}"
        );
    }

    #[test]
    fn mmdebstrap_args_facts_hooks_run_last() {
        let r = bookworm();

        let a = mmdebstrap_args(
            &r,
            "root",
            Path::new("/o"),
            None,
            Path::new("/w/facts"),
            Path::new("/t"),
        );

        let dashes = a.iter().position(|x| x == "--").unwrap();
        assert_eq!(a[dashes - 2], format!("--customize-hook={}", facts_script()));
        assert_eq!(a[dashes - 1], "--customize-hook=sync-out /run/nubo-facts '/w/facts'");
    }

    #[test]
    fn facts_script_queries_dpkg_inside_chroot() {
        let s = facts_script();

        assert!(
            s.contains(r#"chroot "$1" dpkg-query -W -f '${Package}\t${Version}\n' > "$1"/run/nubo-facts/packages"#),
            "{s}"
        );
    }

    #[test]
    fn shell_quote_escapes_single_quote() {
        assert_eq!(shell_quote("a'b"), r"'a'\''b'");
    }
}
