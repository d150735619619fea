//! `nubo doctor`: this host's prerequisites, one line each, with the package or command that
//! fixes each problem. The probes are the libraries' own (the same ones `vm create`, the bootstrap
//! and the live-test skips use); turning their answers into checks, the verdict and the output
//! shapes are pure functions, tested below.

use std::path::{Path, PathBuf};

use nubo_backend::{CheckStatus, HostCheck};
use nubo_bootstrap::{BootstrapError, Host};
use nubo_core::roots::MAX_SOCKET_PATH;
use nubo_core::ByteSize;
use serde::Serialize;

use crate::cli::DoctorArgs;
use crate::output::{self, Format};
use crate::settings::Settings;

/// Below this, one base image plus a few overlays and a bootstrap's scratch space no longer fit.
const MIN_FREE: u64 = 5 << 30;
/// The longest socket name the engine puts in a VM's run dir (next to `qmp.sock`).
const LONGEST_SOCKET: &str = "serial.sock";
const MAX_NAME_LEN: usize = nubo_core::name::MAX_NAME_LEN;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Status {
    Ok,
    /// Something works less well or a feature other than `vm create` is unavailable.
    Warn,
    /// Needed by `vm create` and not installed.
    Missing,
    /// Needed by `vm create`, installed, and not working.
    Broken,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Missing => "missing",
            Status::Broken => "broken",
        }
    }

    fn blocks_create(self) -> bool {
        matches!(self, Status::Missing | Status::Broken)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct Check {
    name: String,
    status: Status,
    detail: String,
    /// The Debian package to install or the command to run; `None` when nothing is wrong.
    fix: Option<String>,
}

impl Check {
    fn new(name: &str, status: Status, detail: impl Into<String>, fix: Option<String>) -> Check {
        Check {
            name: name.to_owned(),
            status,
            detail: detail.into(),
            fix,
        }
    }

    fn ok(name: &str, detail: impl Into<String>) -> Check {
        Check::new(name, Status::Ok, detail, None)
    }
}

/// What `-o json` prints: a stable shape for scripts (`ready` is the exit code's meaning).
#[derive(Debug, Serialize)]
struct Report<'a> {
    ready: bool,
    checks: &'a [Check],
}

pub fn run(args: &DoctorArgs, settings: &Settings) -> anyhow::Result<()> {
    let mut checks = gather(settings);
    if let Some(c) = &args.connect {
        checks.extend(remote_checks(c, args.tls_dir.as_deref())?);
    }
    match args.output {
        Format::Json => output::print_json(&Report {
            ready: verdict(&checks).is_ok(),
            checks: &checks,
        })?,
        Format::Table => {
            output::print_table(&["STATUS", "CHECK", "DETAIL"], &rows(&checks))?;
            if verdict(&checks).is_ok() {
                println!("{}", summary(&checks));
            }
        }
    }
    verdict(&checks).map_err(anyhow::Error::msg)
}

/// `--connect URI [--tls-dir DIR]`: for qemu+tls, the client certificates libvirt will read,
/// then the daemon at `uri` as the libvirt backend sees it.
fn remote_checks(connect: &str, tls_dir: Option<&Path>) -> anyhow::Result<Vec<Check>> {
    use nubo_backend::libvirt::tls;
    let uri = nubo_spec::ConnectUri::parse(connect, nubo_spec::uri::Origin::Spec)?;
    let mut out = Vec::new();
    if uri.transport() == nubo_spec::uri::Transport::Tls {
        let files = match tls_dir {
            Some(d) => tls::in_dir(&std::path::absolute(d)?),
            None => tls::default_files(
                nix::unistd::geteuid().is_root(),
                std::env::var_os("HOME").map(PathBuf::from).as_deref(),
            ),
        };
        let host = tls::checks(&files);
        let broken = host.iter().any(|c| c.status == CheckStatus::Broken);
        out.extend(host);
        if broken {
            return Ok(backend_checks(&[("libvirt", false, out)]));
        }
    } else if tls_dir.is_some() {
        anyhow::bail!("--tls-dir: `{uri}` is not a qemu+tls URI, so it reads no TLS directory");
    }
    let uri = match tls_dir {
        Some(d) => super::remote::connect_uri(connect, Some(d))?,
        None => uri,
    };
    let b = nubo_backend::libvirt::LibvirtBackend::new(Some(uri));
    out.extend(nubo_backend::Backend::host_checks(&b).into_iter().map(|c| HostCheck {
        name: format!("remote {}", c.name),
        ..c
    }));
    Ok(backend_checks(&[("libvirt", false, out)]))
}

/// Runs every probe once, in the order a user fixes things.
fn gather(settings: &Settings) -> Vec<Check> {
    let which = |cmd: &str| settings.host.which(cmd);
    // Each backend reports what it needs from the host (its binary, accelerator, firmware);
    // doctor knows no backend's details.
    let registry = nubo_backend::builtin_registry_from(&settings.backend_config());
    let backends: Vec<_> = registry
        .iter()
        .map(|b| (b.id(), b.auto_selectable(), b.host_checks()))
        .collect();
    let store = nearest_existing(&settings.roots.root);

    let mut checks = backend_checks(&backends);
    checks.push(file_check(
        "qemu-img",
        which("qemu-img"),
        "qemu-utils",
        false,
        "needed by image import, convert and bootstrap",
    ));
    checks.push(file_check(
        "ssh-keygen",
        which("ssh-keygen"),
        "openssh-client",
        true,
        "vm create makes nubo's SSH key with it",
    ));
    checks.push(file_check(
        "ssh",
        which("ssh"),
        "openssh-client",
        false,
        "needed by nubo vm ssh",
    ));
    checks.push(bootstrap_check(&Host::probe_in(settings.host.path.as_deref())));
    checks.push(space_check(&settings.roots.root, &store, free_bytes(&store)));
    checks.push(socket_check(&settings.roots.run_dir));
    checks
}

/// The backends' own host checks. A check that fails only a feature (UEFI boots without
/// OVMF) is a warning naming the feature; a backend that cannot run at all blocks `vm create`
/// only when no other auto-selectable backend can take its place.
fn backend_checks(backends: &[(&str, bool, Vec<HostCheck>)]) -> Vec<Check> {
    let usable = |checks: &[HostCheck]| {
        !checks
            .iter()
            .any(|c| c.status == CheckStatus::Broken && c.blocks.is_none())
    };
    let any_usable = backends.iter().any(|(_, auto, c)| *auto && usable(c));
    backends
        .iter()
        .flat_map(|(_, _, checks)| checks.iter())
        .map(|c| {
            let status = match (c.status, &c.blocks) {
                (CheckStatus::Ok, _) => Status::Ok,
                (CheckStatus::Warn, _) | (CheckStatus::Broken, Some(_)) => Status::Warn,
                (CheckStatus::Broken, None) if any_usable => Status::Warn,
                (CheckStatus::Broken, None) => Status::Missing,
            };
            let detail = match &c.blocks {
                Some(b) if c.status == CheckStatus::Broken => format!("{}; without it: no {b}", c.detail),
                _ => c.detail.clone(),
            };
            Check::new(&c.name, status, detail, c.fix.clone())
        })
        .collect()
}

/// A file or command: found, or missing with its package. `why` says what needs it.
fn file_check(name: &str, found: Option<PathBuf>, package: &str, required: bool, why: &str) -> Check {
    match found {
        Some(p) => Check::ok(name, p.display().to_string()),
        None => Check::new(
            name,
            if required { Status::Missing } else { Status::Warn },
            format!("{name} not found ({why})"),
            Some(format!("install {package}")),
        ),
    }
}

/// `nubo image bootstrap` is how a host without internet access gets an image, but `vm create`
/// does not need it: problems here are warnings.
fn bootstrap_check(host: &Result<Host, BootstrapError>) -> Check {
    let name = "bootstrap";
    match host {
        Ok(h) => Check::ok(
            name,
            format!(
                "mmdebstrap and the build tools found; runs in {} mode",
                h.mode.mmdebstrap_mode()
            ),
        ),
        Err(BootstrapError::MissingTools(missing)) => {
            let what: Vec<&str> = missing.iter().map(|(c, _)| c.as_str()).collect();
            let mut packages: Vec<&str> = missing.iter().map(|(_, p)| p.as_str()).collect();
            packages.dedup();
            Check::new(
                name,
                Status::Warn,
                format!("image bootstrap cannot run: {} not found", what.join(", ")),
                Some(format!("install {}", packages.join(" "))),
            )
        }
        // NoPrivilege's text carries its own fix (run as root, or the sysctl to change).
        Err(e) => Check::new(name, Status::Warn, format!("image bootstrap cannot run: {e}"), None),
    }
}

/// The directory statvfs can ask about: the store itself, or where it will be created.
fn nearest_existing(p: &Path) -> PathBuf {
    p.ancestors()
        .find(|a| a.exists())
        .unwrap_or(Path::new("/"))
        .to_path_buf()
}

fn free_bytes(p: &Path) -> Result<u64, String> {
    let s = nix::sys::statvfs::statvfs(p).map_err(|e| e.to_string())?;
    // The field widths differ between platforms, hence the casts.
    Ok(s.blocks_available() as u64 * s.fragment_size() as u64)
}

/// `measured` is `root` itself or, before the store exists, the parent it will be created in.
fn space_check(root: &Path, measured: &Path, free: Result<u64, String>) -> Check {
    let name = "store space";
    let dir = if root == measured {
        root.display().to_string()
    } else {
        format!("{} (for {}, not created yet)", measured.display(), root.display())
    };
    match free {
        Ok(b) if b >= MIN_FREE => Check::ok(name, format!("{} free at {dir}", ByteSize(b))),
        Ok(b) => Check::new(
            name,
            Status::Warn,
            format!("only {} free at {dir} (under {})", ByteSize(b), ByteSize(MIN_FREE)),
            Some("free some space, or set NUBO_ROOT to a larger filesystem".into()),
        ),
        Err(e) => Check::new(
            name,
            Status::Warn,
            format!("cannot read the free space of {dir}: {e}"),
            None,
        ),
    }
}

/// The longest VM name whose sockets (`<run_dir>/<name>/serial.sock`) fit AF_UNIX's limit.
fn socket_check(run_dir: &Path) -> Check {
    let name = "socket paths";
    let fixed = run_dir.as_os_str().len() + 2 + LONGEST_SOCKET.len();
    let room = MAX_SOCKET_PATH.saturating_sub(fixed);
    let fix = || Some("set NUBO_RUN_DIR to a shorter directory (e.g. /tmp/nubo-$UID)".to_owned());
    let dir = run_dir.display();
    if room >= MAX_NAME_LEN {
        Check::ok(
            name,
            format!("{dir}: every VM name (up to {MAX_NAME_LEN} characters) fits"),
        )
    } else if room > 0 {
        Check::new(
            name,
            Status::Warn,
            format!("{dir}: VM names longer than {room} characters would exceed the unix socket limit ({MAX_SOCKET_PATH} bytes)"),
            fix(),
        )
    } else {
        Check::new(
            name,
            Status::Broken,
            format!("{dir} is too long: no VM's sockets fit the unix socket limit ({MAX_SOCKET_PATH} bytes)"),
            fix(),
        )
    }
}

/// Ok when `vm create` can run (warnings allowed); else the error line naming what to install.
fn verdict(checks: &[Check]) -> Result<(), String> {
    let blocking: Vec<String> = checks
        .iter()
        .filter(|c| c.status.blocks_create())
        .map(|c| match &c.fix {
            Some(f) => format!("{} ({f})", c.name),
            None => c.name.clone(),
        })
        .collect();
    if blocking.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "`nubo vm create` cannot run on this host: {}",
            blocking.join(", ")
        ))
    }
}

fn rows(checks: &[Check]) -> Vec<Vec<String>> {
    checks
        .iter()
        .map(|c| {
            let detail = match &c.fix {
                Some(f) => format!("{}: {f}", c.detail),
                None => c.detail.clone(),
            };
            vec![c.status.label().to_owned(), c.name.clone(), detail]
        })
        .collect()
}

fn summary(checks: &[Check]) -> String {
    match checks.iter().filter(|c| c.status == Status::Warn).count() {
        0 => "ready for `nubo vm create`".into(),
        1 => "ready for `nubo vm create` (1 warning)".into(),
        n => format!("ready for `nubo vm create` ({n} warnings)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(name: &str, status: Status) -> Check {
        Check::new(name, status, "d", Some(format!("install {name}-pkg")))
    }

    #[test]
    fn verdict_only_warnings_is_ready() {
        let checks = [check("kvm", Status::Warn), Check::ok("qemu-img", "/usr/bin/qemu-img")];

        assert_eq!(verdict(&checks), Ok(()));
    }

    #[test]
    fn verdict_missing_and_broken_block_naming_fixes() {
        let checks = [
            check("seabios", Status::Missing),
            check("ssh", Status::Warn),
            check("backend qemu", Status::Broken),
        ];

        let err = verdict(&checks).unwrap_err();

        assert_eq!(
            err,
            "`nubo vm create` cannot run on this host: seabios (install seabios-pkg), backend qemu (install backend qemu-pkg)"
        );
    }

    fn host_check(name: &str, status: CheckStatus, blocks: Option<&str>) -> HostCheck {
        HostCheck {
            name: name.into(),
            status,
            detail: "d".into(),
            fix: Some(format!("install {name}-pkg")),
            blocks: blocks.map(str::to_owned),
        }
    }

    #[test]
    fn backend_checks_only_backend_missing_blocks_with_package() {
        let backends = [(
            "qemu",
            true,
            vec![host_check("backend qemu", CheckStatus::Broken, None)],
        )];

        let c = backend_checks(&backends);

        assert_eq!(c[0].status, Status::Missing);
        assert_eq!(c[0].fix.as_deref(), Some("install backend qemu-pkg"));
    }

    #[test]
    fn backend_checks_missing_with_another_available_warns() {
        let backends = [
            ("qemu", true, vec![host_check("backend qemu", CheckStatus::Ok, None)]),
            (
                "libvirt",
                true,
                vec![host_check("backend libvirt", CheckStatus::Broken, None)],
            ),
        ];

        let c = backend_checks(&backends);

        assert_eq!([c[0].status, c[1].status], [Status::Ok, Status::Warn]);
    }

    /// Issue 10: SeaBIOS missing blocked `vm create` for every backend.
    #[test]
    fn backend_checks_missing_firmware_warns_naming_feature() {
        let backends = [(
            "qemu",
            true,
            vec![
                host_check("backend qemu", CheckStatus::Ok, None),
                host_check("seabios", CheckStatus::Broken, Some("qemu BIOS boots")),
            ],
        )];

        let c = backend_checks(&backends);

        assert_eq!(c[1].status, Status::Warn);
        assert!(c[1].detail.contains("qemu BIOS boots"), "{}", c[1].detail);
    }

    #[test]
    fn file_check_optional_missing_warns() {
        let c = file_check("qemu-img", None, "qemu-utils", false, "needed by image convert");

        assert_eq!(c.status, Status::Warn);
        assert_eq!(c.fix.as_deref(), Some("install qemu-utils"));
    }

    #[test]
    fn bootstrap_check_missing_tools_lists_packages_once() {
        let err = BootstrapError::MissingTools(vec![
            ("mmd".into(), "mtools".into()),
            ("mcopy".into(), "mtools".into()),
            ("sfdisk".into(), "fdisk".into()),
        ]);

        let c = bootstrap_check(&Err(err));

        assert_eq!(c.status, Status::Warn);
        assert_eq!(c.fix.as_deref(), Some("install mtools fdisk"));
    }

    #[test]
    fn space_check_under_5g_warns() {
        let c = space_check(Path::new("/var/lib/nubo"), Path::new("/var/lib"), Ok(1 << 30));

        assert_eq!(c.status, Status::Warn);
        assert!(
            c.detail
                .starts_with("only 1G free at /var/lib (for /var/lib/nubo, not created yet)"),
            "{}",
            c.detail
        );
    }

    #[test]
    fn space_check_plenty_ok() {
        assert_eq!(
            space_check(Path::new("/"), Path::new("/"), Ok(100 << 30)).status,
            Status::Ok
        );
    }

    #[test]
    fn nearest_existing_missing_store_is_parent() {
        assert_eq!(nearest_existing(Path::new("/nonexistent-nubo/a/b")), PathBuf::from("/"));
    }

    #[test]
    fn socket_check_short_run_dir_ok() {
        assert_eq!(socket_check(Path::new("/run/user/1000/nubo")).status, Status::Ok);
    }

    #[test]
    fn socket_check_long_run_dir_warns_with_limit() {
        let dir = PathBuf::from(format!("/{}", "d".repeat(59)));

        let c = socket_check(&dir);

        assert_eq!(c.status, Status::Warn);
        assert!(c.detail.contains("longer than 34 characters"), "{}", c.detail);
    }

    #[test]
    fn socket_check_overlong_run_dir_broken() {
        let dir = PathBuf::from(format!("/{}", "d".repeat(100)));

        assert_eq!(socket_check(&dir).status, Status::Broken);
    }

    #[test]
    fn report_json_shape_is_stable() {
        let checks = [Check::ok("kvm", "usable"), check("ssh", Status::Warn)];

        let v = serde_json::to_value(Report {
            ready: true,
            checks: &checks,
        })
        .unwrap();

        assert_eq!(
            v,
            serde_json::json!({
                "ready": true,
                "checks": [
                    {"name": "kvm", "status": "ok", "detail": "usable", "fix": null},
                    {"name": "ssh", "status": "warn", "detail": "d", "fix": "install ssh-pkg"},
                ]
            })
        );
    }

    #[test]
    fn rows_append_fix_to_detail() {
        let r = rows(&[check("ssh", Status::Warn)]);

        assert_eq!(r[0], ["warn", "ssh", "d: install ssh-pkg"]);
    }

    #[test]
    fn summary_counts_warnings() {
        let checks = [
            check("kvm", Status::Warn),
            check("ssh", Status::Warn),
            Check::ok("a", "b"),
        ];

        assert_eq!(summary(&checks), "ready for `nubo vm create` (2 warnings)");
    }
}
