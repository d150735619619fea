//! A remote libvirt host over `qemu+ssh://` (issue 22): the test's libvirtd in its own network
//! namespace ([`Libvirtd`]), and an sshd the test owns in the same namespace (its own config,
//! host key and authorized key, listening only on the namespace's address, killed by PID),
//! whose sessions see that libvirtd's socket at `/run/libvirt/libvirt-sock`. `nubo` runs in
//! the root namespace as a user the test adds, whose home is a directory the test made: the URI
//! carries no key file nor host-key option (nubo refuses them), so the `ssh` libvirt runs finds
//! the key and `known_hosts` the ordinary way, in `~/.ssh` (OpenSSH takes `~` from the passwd
//! entry, not `$HOME`), and nothing is written into root's `~/.ssh`.
//!
//! - a host key that is not the one `known_hosts` names is refused with an error naming the fix,
//!   and nothing is made (no VM, no volume);
//! - `doctor --connect` reaches the daemon through ssh;
//! - one VM on the namespace's isolated network, created over ssh with `--wait`, reaches
//!   cloud-init done; `vm ssh --jump root@NSADDR:PORT` through the test's sshd reads its
//!   instance-id (= the domain UUID) from the leased address only that host reaches;
//! - that create uploads the base through libvirt's volume stream into the pool as
//!   `nubo-base-<sha256/16>.qcow2`, verified (its bytes hash to the store's digest), the disk
//!   volume backs onto it; `vm ls`/`vm inspect` show the VM, stop/start follow libvirt, `rm`
//!   leaves the base, `image prune --connect` removes it.
//!
//! That is the one boot: the domain is stopped right after the later start.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use nubo_live::cli::{inspect, ls_state, nubo, run, vms_empty, Cleanup};
use nubo_live::libvirtd::{Libvirtd, Options, TlsListen};
use nubo_live::{Guard, LiveTest, TestResult, TestRoot};

const QUICK: Duration = Duration::from_secs(180);
/// A create uploads the ~400 MiB base through ssh and reads it back.
const CREATE: Duration = Duration::from_secs(480);
/// The upload, then a TCG boot to cloud-init done on a shared machine.
const CREATE_WAIT: Duration = Duration::from_secs(1500);
const NET: &str = "10.250.78";
const PORT: &str = "2222";
const VM: &str = "rs1";

fn main() -> ExitCode {
    nubo_live::run(vec![LiveTest::new(
        "remote_ssh_create_upload_verify_stop_start_rm_prune_wrong_host_key_refused",
        &["qemu", "bootstrap", "libvirt-tls", "sshd"],
        || nubo_live::timed("remote_ssh", remote_ssh),
    )])
}

fn sh(cmd: &mut Command) -> TestResult {
    run(cmd, QUICK)?.require().map(|_| ())
}

fn keygen(path: &Path, comment: &str) -> TestResult {
    sh(Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
        .arg(path))
}

fn read(p: &Path) -> Result<String, String> {
    fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))
}

fn write(p: &Path, text: &str, mode: u32) -> TestResult {
    fs::write(p, text).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).map_err(|e| format!("chmod {}: {e}", p.display()))
}

/// The test's sshd: in the libvirtd's namespace, in a mount namespace of its own (`ip netns
/// exec` makes one) where `/run` is a tmpfs holding its privilege-separation directory and
/// `/run/libvirt` is the test libvirtd's socket directory, so `virt-ssh-helper` in a session
/// reaches that daemon as `qemu:///system`. Killed by PID on drop (the [`Guard`]).
struct Sshd {
    _guard: Guard,
    /// `ssh-ed25519 AAAA...` of its host key.
    host_pub: String,
    /// The client key, whose public half is the only authorized key.
    client_key: std::path::PathBuf,
}

fn start_sshd(lv: &Libvirtd, dir: &Path) -> Result<Sshd, String> {
    let host_key = dir.join("host_ed25519");
    let client_key = dir.join("client_ed25519");
    keygen(&host_key, "nubo-test-host")?;
    keygen(&client_key, "nubo-test-client")?;
    let auth = dir.join("authorized_keys");
    write(&auth, &read(&dir.join("client_ed25519.pub"))?, 0o600)?;
    // StrictModes off: the test's files lie under /tmp (mode 1777), which sshd's walk up
    // from root's authorized keys file refuses; the files themselves are root's and 0600.
    let config = dir.join("sshd_config");
    let d = dir.display();
    write(
        &config,
        &format!(
            "Port {PORT}\nListenAddress {NET}.1\nHostKey {hk}\nPidFile {d}/sshd.pid\n\
             AuthorizedKeysFile {auth}\nPermitRootLogin prohibit-password\nPubkeyAuthentication yes\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n\
             AllowTcpForwarding yes\nX11Forwarding no\nPrintMotd no\nLogLevel VERBOSE\n",
            hk = host_key.display(),
            auth = auth.display(),
        ),
        0o600,
    )?;
    let script = format!(
        "set -e; mount -t tmpfs -o mode=0755 nubo-sshd-run /run; mkdir -m 0755 /run/sshd /run/libvirt; \
         mount --bind {sock} /run/libvirt; exec /usr/sbin/sshd -D -e -f {config} 2>>{d}/sshd.log",
        sock = lv.dir().join("sock").display(),
        config = config.display(),
    );
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &lv.ns, "sh", "-c", &script]);
    let mut guard = Guard::spawn(&mut cmd, "sshd")?;
    let t0 = Instant::now();
    let addr: std::net::SocketAddr = format!("{NET}.1:{PORT}").parse().map_err(|e| format!("{e}"))?;
    loop {
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok() {
            break;
        }
        if let Some(s) = guard.exited() {
            return Err(format!(
                "sshd exited with {s}: {}",
                fs::read_to_string(dir.join("sshd.log")).unwrap_or_default()
            ));
        }
        if t0.elapsed() > Duration::from_secs(30) {
            return Err("sshd did not listen within 30s".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let host_pub = read(&dir.join("host_ed25519.pub"))?
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    Ok(Sshd {
        _guard: guard,
        host_pub,
        client_key,
    })
}

/// A system user the test adds with `useradd` (home: a directory the test made and owns for
/// it) and removes with `userdel` on every path out.
struct Caller {
    name: String,
    uid: u32,
    gid: u32,
}

impl Caller {
    fn add(home: &Path) -> Result<Caller, String> {
        let name = format!("nubossh{}", std::process::id());
        sh(Command::new("useradd")
            .args([
                "--system",
                "--user-group",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                "--home-dir",
            ])
            .arg(home)
            .arg(&name))?;
        let mut caller = Caller { name, uid: 0, gid: 0 };
        let user = nix::unistd::User::from_name(&caller.name)
            .ok()
            .flatten()
            .ok_or_else(|| format!("useradd made no user {}", caller.name))?;
        caller.uid = user.uid.as_raw();
        caller.gid = user.gid.as_raw();
        Ok(caller)
    }
}

impl Drop for Caller {
    fn drop(&mut self) {
        // The caller's last `ssh` may still be exiting: userdel refuses a user with processes.
        let t0 = Instant::now();
        loop {
            match run(Command::new("userdel").arg(&self.name), QUICK) {
                Ok(o) if o.ok => return,
                other if t0.elapsed() > Duration::from_secs(20) => {
                    eprintln!("cleanup: `userdel {}` failed: {other:?}", self.name);
                    return;
                }
                _ => std::thread::sleep(Duration::from_millis(500)),
            }
        }
    }
}

/// Gives `dir` to `id`: every directory, and every file that is not a hard link of the shared
/// image cache (chowning one of those would change the cache's own inode).
fn give(dir: &Path, id: (u32, u32)) -> TestResult {
    let own = |p: &Path| {
        nix::unistd::chown(
            p,
            Some(nix::unistd::Uid::from_raw(id.0)),
            Some(nix::unistd::Gid::from_raw(id.1)),
        )
        .map_err(|e| format!("chown {}: {e}", p.display()))
    };
    own(dir)?;
    for e in fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))? {
        let p = e.map_err(|e| format!("reading {}: {e}", dir.display()))?.path();
        let m = fs::symlink_metadata(&p).map_err(|e| format!("stat {}: {e}", p.display()))?;
        if m.is_dir() {
            give(&p, id)?;
        } else if m.is_file() && m.nlink() == 1 {
            own(&p)?;
        }
    }
    Ok(())
}

fn sha256(p: &Path) -> Result<String, String> {
    let out = run(Command::new("sha256sum").arg(p), QUICK)?.require()?;
    Ok(out.stdout.split_whitespace().next().unwrap_or_default().to_owned())
}

/// The volumes of `pool`, by name (none when the pool does not exist yet).
fn volumes(lv: &Libvirtd, pool: &str) -> Vec<String> {
    lv.virsh(&["vol-list", "--pool", pool])
        .map(|o| {
            o.stdout
                .lines()
                .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn remote_ssh() -> TestResult {
    let lv = Libvirtd::start_with(Options {
        tls: Some(TlsListen { net: NET }),
        ..Options::default()
    })?;
    let ssh_dir = tempfile::Builder::new()
        .prefix("nsshd")
        .tempdir_in("/tmp")
        .map_err(|e| format!("temp dir: {e}"))?;
    let sshd = start_sshd(&lv, ssh_dir.path())?;
    let uri = format!("qemu+ssh://root@{NET}.1:{PORT}/system");

    // The caller's home: ~/.ssh with the client key and known_hosts, nothing else.
    let home = tempfile::Builder::new()
        .prefix("nsshh")
        .tempdir_in("/tmp")
        .map_err(|e| format!("temp dir: {e}"))?;
    let caller = Caller::add(home.path())?;
    let id = (caller.uid, caller.gid);
    let dot = home.path().join(".ssh");
    fs::create_dir(&dot).map_err(|e| format!("mkdir {}: {e}", dot.display()))?;
    fs::set_permissions(&dot, fs::Permissions::from_mode(0o700)).map_err(|e| format!("chmod: {e}"))?;
    write(&dot.join("id_ed25519"), &read(&sshd.client_key)?, 0o600)?;
    let known = dot.join("known_hosts");
    // First a host key that is not the server's.
    let wrong = ssh_dir.path().join("wrong_ed25519");
    keygen(&wrong, "not-the-host")?;
    let wrong_pub = read(&wrong.with_extension("pub"))?
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    write(&known, &format!("[{NET}.1]:{PORT} {wrong_pub}\n"), 0o644)?;
    give(home.path(), id)?;

    let mut root = TestRoot::new()?;
    let image = root.with_debian_image()?;
    let base_sha = sha256(&image.qcow2)?;
    give(root.root(), id)?;
    give(root.run_dir(), id)?;
    let (uid, gid) = (id.0.to_string(), id.1.to_string());
    root.wrap(
        ["setpriv", "--reuid", &uid, "--regid", &gid, "--clear-groups", "--"]
            .map(String::from)
            .to_vec(),
        // $HOME points elsewhere on purpose: ssh must take ~ from the passwd entry. The URI is
        // also the default one, so no probe autostarts a session daemon as the caller.
        vec![
            ("HOME".into(), root.root().display().to_string()),
            ("NUBO_LIBVIRT_URI".into(), uri.clone()),
        ],
    );
    let _cleanup = Cleanup::new(&root, &[VM]);
    let pool_dir = root.root().join("libvirt-pool");
    let create = |root: &TestRoot, extra: &[&str], timeout: Duration| {
        let mut args = vec![
            "vm",
            "create",
            VM,
            "--image",
            "debian:12",
            "--backend",
            "libvirt",
            "--connect",
            &uri,
            "--memory",
            "512M",
            "--vcpus",
            "1",
        ];
        args.extend_from_slice(extra);
        nubo(root, &args, timeout)
    };

    // A host key known_hosts does not name: refused, the fix named, nothing made.
    let r = create(&root, &["--restrict-network"], CREATE)?;
    println!("wrong host key:\n{}", r.stderr);
    r.refused(&["host key", "known_hosts"])?;
    vms_empty(&root, "after the wrong host key")?;
    if lv.virsh(&["list", "--all", "--name"])?.stdout.trim() != "" {
        return Err("the refused create defined a domain".into());
    }
    if fs::read_dir(&pool_dir).into_iter().flatten().next().is_some() {
        return Err(format!("the refused create left files in {}", pool_dir.display()));
    }

    // The right host key from now on.
    write(&known, &format!("[{NET}.1]:{PORT} {}\n", sshd.host_pub), 0o644)?;
    give(home.path(), id)?;

    let d = nubo(&root, &["doctor", "--connect", &uri], QUICK)?;
    let line = d
        .stdout
        .lines()
        .find(|l| l.contains("remote libvirt daemon"))
        .unwrap_or_default();
    if !line.trim_start().starts_with("ok") {
        return Err(format!("doctor over ssh:\n{}\n{}", d.stdout, d.stderr));
    }

    // The one boot: on the namespace's isolated network, followed to cloud-init done through
    // the console stream over ssh. The guests' subnet is routed into the namespace, which
    // forwards nothing: readiness's probes of the leased address stay on this machine. The
    // route goes with the veth when the namespace is deleted.
    sh(Command::new("ip").args([
        "route",
        "replace",
        &format!("{}.0/24", nubo_live::libvirtd::SUBNET),
        "via",
        &format!("{NET}.1"),
    ]))?;
    let t = Instant::now();
    let made = create(
        &root,
        &["--network", "default", "--wait", "--boot-timeout", "1200s"],
        CREATE_WAIT,
    )?
    .require()?;
    println!(
        "timing create over ssh with base upload and --wait: {:.1}s",
        t.elapsed().as_secs_f64()
    );
    if !made.stderr.contains(&format!("vm `{VM}` is ready: cloud-init")) {
        return Err(format!("--wait did not report cloud-init done:\n{}", made.stderr));
    }
    let rec = inspect(&root, VM)?;
    let uuid = lv.virsh(&["domuuid", VM])?.require()?.stdout.trim().to_owned();
    // The namespace forwards nothing, so the route above gives this host no path to the
    // guest: only the jump host reaches it.
    let fwd = run(
        Command::new("ip").args(["netns", "exec", &lv.ns, "sysctl", "-n", "net.ipv4.ip_forward"]),
        QUICK,
    )?
    .require()?;
    if fwd.stdout.trim() != "0" {
        return Err(format!("the namespace forwards (ip_forward = {})", fwd.stdout.trim()));
    }
    // `vm ssh --jump` through the test's sshd (the caller's own ssh setup: key and
    // known_hosts in ~/.ssh) to the guest's leased address, which only that host reaches.
    let jump = format!("root@{NET}.1:{PORT}");
    let iid = nubo(
        &root,
        &[
            "vm",
            "ssh",
            "--jump",
            &jump,
            VM,
            "--",
            "cat",
            "/var/lib/cloud/data/instance-id",
        ],
        QUICK,
    )?
    .require()?;
    if iid.stdout.trim() != uuid {
        return Err(format!(
            "instance-id through the jump host {:?} is not the domain UUID {uuid}",
            iid.stdout.trim()
        ));
    }
    nubo(&root, &["vm", "stop", "--force", VM], QUICK)?.require()?;
    let pool = rec
        .pointer("/backend_state/pool")
        .and_then(|v| v.as_str())
        .ok_or_else(|| format!("no pool in the record: {rec}"))?
        .to_owned();
    if rec.pointer("/backend_state/uri").and_then(|v| v.as_str()) != Some(uri.as_str())
        && !rec.to_string().contains(&uri)
    {
        return Err(format!("the record does not name {uri}: {rec}"));
    }
    if rec.get("uuid").and_then(|v| v.as_str()) != Some(uuid.as_str()) {
        return Err(format!("domain UUID {uuid} is not the record's: {rec}"));
    }
    let bases: Vec<String> = volumes(&lv, &pool)
        .into_iter()
        .filter(|v| v.starts_with("nubo-base-"))
        .collect();
    if bases.len() != 1 || !bases[0].starts_with(&format!("nubo-base-{}", &base_sha[..16])) {
        return Err(format!(
            "pool `{pool}` holds base volumes {bases:?}, not one named after {base_sha}"
        ));
    }
    let base_path = lv
        .virsh(&["vol-path", "--pool", &pool, &bases[0]])?
        .require()?
        .stdout
        .trim()
        .to_owned();
    if sha256(Path::new(&base_path))? != base_sha {
        return Err(format!(
            "base volume {base_path} does not hash to the store's {base_sha}"
        ));
    }
    let disk_xml = lv
        .virsh(&["vol-dumpxml", "--pool", &pool, &format!("{VM}.qcow2")])?
        .require()?
        .stdout;
    if !disk_xml.contains(&format!("<path>{base_path}</path>")) {
        return Err(format!(
            "disk volume of {VM} does not back onto {base_path}:\n{disk_xml}"
        ));
    }

    // vm ls, stop/start as libvirt sees them.
    let domstate =
        || -> Result<String, String> { Ok(lv.virsh(&["domstate", VM])?.require()?.stdout.trim().to_owned()) };
    if ls_state(&root, VM)? != "stopped" || domstate()? != "shut off" {
        return Err(format!("{VM} is not stopped after stop ({})", domstate()?));
    }
    nubo(&root, &["vm", "start", VM], QUICK)?.require()?;
    if ls_state(&root, VM)? != "running" || domstate()? != "running" {
        return Err(format!("{VM} is not running after start ({})", domstate()?));
    }
    nubo(&root, &["vm", "stop", "--force", VM], QUICK)?.require()?;

    // rm leaves the base volume and nothing else; prune removes it.
    nubo(&root, &["vm", "rm", "--force", VM], QUICK)?.require()?;
    if volumes(&lv, &pool) != bases {
        return Err(format!(
            "after rm, pool `{pool}` holds {:?}, not just {bases:?}",
            volumes(&lv, &pool)
        ));
    }
    if lv.virsh(&["list", "--all", "--name"])?.stdout.trim() != "" {
        return Err("a domain is left after rm".into());
    }
    let p = nubo(&root, &["image", "prune", "--connect", &uri], QUICK)?.require()?;
    if !p.stdout.contains(&format!("removed base volume {}", bases[0])) {
        return Err(format!("prune did not say it removed {}:\n{}", bases[0], p.stdout));
    }
    if !volumes(&lv, &pool).is_empty() {
        return Err("a volume is left after prune".into());
    }
    vms_empty(&root, "at the end")?;
    // Root's own ~/.ssh was never needed nor written: the caller's known_hosts is as written.
    if read(&known)? != format!("[{NET}.1]:{PORT} {}\n", sshd.host_pub) {
        return Err("ssh rewrote the caller's known_hosts".into());
    }
    Ok(())
}
