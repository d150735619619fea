//! A private libvirtd for the libvirt live tests, in a network namespace the test makes.
//!
//! PID 1 is not systemd here, so the harness starts `virtlogd` and `libvirtd` itself, inside
//! `ip netns exec` (whose mount namespace is private): there `/etc/libvirt`, `/run/libvirt`,
//! `/var/lib/libvirt`, `/var/cache/libvirt` and `/var/log/libvirt` are bind mounts of the
//! test's own directories, so nothing of the host's libvirt state is read or written. Its
//! qemu.conf runs QEMU as root without relabelling (`dynamic_ownership = 0`), which also
//! spares the ~50 s re-probe of QEMU per define that PVM's /dev/kvm causes with the stock one.
//! Its sockets are in the test's directory (`qemu:///system?socket=...`), so a test never talks
//! to another libvirtd. The only network is isolated (no `<forward>`): every packet stays in
//! the namespace. `nubo` itself runs inside the namespace too, to reach the guest's address.
//!
//! Teardown (drop), in the order that leaves nothing: destroy and undefine every domain,
//! destroy and undefine networks (stops dnsmasq) and pools, TERM libvirtd and virtlogd by PID,
//! delete the namespace. QEMU processes outlive libvirtd, hence domains first.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::cli::{run, Out};
use crate::Guard;

const QUICK: Duration = Duration::from_secs(120);
/// The first connection waits for libvirtd's QEMU capability probe.
const START: Duration = Duration::from_secs(180);
/// The isolated network's bridge subnet (inside the namespace only).
pub const SUBNET: &str = "192.168.150";

pub struct Libvirtd {
    dir: tempfile::TempDir,
    pub ns: String,
    pub uri: String,
    /// With [`Options::tls`]: `qemu+tls://<addr>/system` and the client's `--tls-dir`.
    pub tls: Option<(String, PathBuf)>,
    libvirtd: Option<Guard>,
}

fn write(p: &Path, text: &str) -> Result<(), String> {
    fs::write(p, text).map_err(|e| format!("cannot write {}: {e}", p.display()))
}

/// The shell commands that give libvirtd, in the namespace's private mount namespace, the
/// test's directories as its own. `/run/libvirt` is made on a tmpfs over `/run` there: the
/// host's `/run` gets no mount point (an empty `/run/libvirt` was left behind before), and no
/// test removes one another test's libvirtd still has mounted. `/run/lock` (`/var/lock`) is
/// made again there: libvirtd locks a console's pty in it.
fn mounts(d: &Path) -> String {
    let p = |s: &str| d.join(s).display().to_string();
    format!(
        "set -e; mount -t tmpfs -o mode=0755 nubo-run /run; mkdir /run/libvirt; mkdir -m 1777 /run/lock; \
         mount --bind {etc} /etc/libvirt; mount --bind {run} /run/libvirt; mount --bind {lib} /var/lib/libvirt; \
         mount --bind {cache} /var/cache/libvirt; mount --bind {log} /var/log/libvirt",
        etc = p("etc"),
        run = p("run"),
        lib = p("lib"),
        cache = p("cache"),
        log = p("log"),
    )
}

/// How a test's libvirtd differs from the default one.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// The read-write socket open to every user (`unix_sock_rw_perms = "0777"`, no auth, its
    /// directories traversable), for a test that runs `nubo` as an unprivileged caller.
    pub open_socket: bool,
    /// libvirt's `dynamic_ownership = 1`: it chowns every file of a domain to the domain's DAC
    /// label unless the label says `relabel='no'` (the default test libvirtd never relabels).
    pub dynamic_ownership: bool,
    /// Listen for TLS (`qemu+tls://`) on the namespace's end of a veth pair: libvirtd at
    /// `.0`, this host's end at `.1` (a /30 of 10.250.0.0/16, nothing routed beyond it), with
    /// certificates the harness makes ([`crate::libvirt_tls`]).
    pub tls: Option<TlsListen>,
}

/// The veth pair of a TLS-listening libvirtd: addresses `<net>.1` (namespace, libvirtd) and
/// `<net>.2` (this host), a /30.
#[derive(Debug, Clone, Copy)]
pub struct TlsListen {
    /// The first three octets, e.g. `10.250.77`.
    pub net: &'static str,
}

impl TlsListen {
    pub fn server_addr(&self) -> String {
        format!("{}.1", self.net)
    }
}

impl Libvirtd {
    /// Starts libvirtd and virtlogd in a new network namespace, with the isolated network
    /// `default` (DHCP on `SUBNET`.0/24) started.
    pub fn start() -> Result<Libvirtd, String> {
        Libvirtd::start_with(Options::default())
    }

    /// [`Libvirtd::start`] with `opts`.
    pub fn start_with(opts: Options) -> Result<Libvirtd, String> {
        let dir = tempfile::Builder::new()
            .prefix("nlv")
            .tempdir_in("/tmp")
            .map_err(|e| format!("cannot create the libvirtd directory: {e}"))?;
        let d = dir.path().to_path_buf();
        let ns = format!(
            "nubo-lv-{}",
            d.file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("x")
                .trim_start_matches("nlv")
        );
        for sub in ["etc", "run", "lib", "cache", "log", "sock"] {
            fs::create_dir_all(d.join(sub)).map_err(|e| format!("cannot create {sub}: {e}"))?;
        }
        let out = run(
            Command::new("cp").arg("-a").arg("/etc/libvirt/.").arg(d.join("etc")),
            QUICK,
        )?;
        out.require()?;
        // No network of the host's configuration comes along (the test defines its own).
        let _ = fs::remove_dir_all(d.join("etc/qemu/networks"));
        let sock = d.join("sock");
        let mut conf = format!(
            "unix_sock_dir = \"{}\"\nunix_sock_rw_perms = \"{}\"\nauth_unix_rw = \"none\"\nauth_unix_ro = \"none\"\n",
            sock.display(),
            if opts.open_socket { "0777" } else { "0700" }
        );
        let mut tls = None;
        if let Some(t) = opts.tls {
            let pki = crate::libvirt_tls::make(&d.join("pki"), &t.server_addr())?;
            let s = |f: &str| pki.server.join(f).display().to_string();
            conf.push_str(&format!(
                "listen_tls = 1\nlisten_tcp = 0\nlisten_addr = \"{}\"\nauth_tls = \"none\"\nca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
                t.server_addr(),
                s("cacert.pem"),
                s("servercert.pem"),
                s("serverkey.pem")
            ));
            tls = Some((format!("qemu+tls://{}/system", t.server_addr()), pki.client));
        }
        write(&d.join("etc/libvirtd.conf"), &conf)?;
        write(
            &d.join("etc/qemu.conf"),
            &format!(
                "user = \"root\"\ngroup = \"root\"\ndynamic_ownership = {}\nremember_owner = 0\n",
                u8::from(opts.dynamic_ownership)
            ),
        )?;
        if opts.open_socket {
            use std::os::unix::fs::PermissionsExt;
            for p in [d.clone(), sock.clone()] {
                fs::set_permissions(&p, fs::Permissions::from_mode(0o755))
                    .map_err(|e| format!("cannot open {} to other users: {e}", p.display()))?;
            }
        }
        let mut me = Libvirtd {
            uri: format!("qemu:///system?socket={}/libvirt-sock", sock.display()),
            ns: ns.clone(),
            tls,
            dir,
            libvirtd: None,
        };
        run(Command::new("ip").args(["netns", "add", &ns]), QUICK)?.require()?;
        run(
            Command::new("ip").args(["netns", "exec", &ns, "ip", "link", "set", "lo", "up"]),
            QUICK,
        )?
        .require()?;
        if let Some(t) = opts.tls {
            me.veth(&t)?;
        }
        let script = format!(
            "{}; virtlogd </dev/null >{d}/virtlogd.out 2>&1 & echo $! > {d}/virtlogd.pid; \
             exec libvirtd {listen}--pid-file {d}/libvirtd.pid </dev/null >{d}/libvirtd.out 2>&1",
            mounts(&d),
            d = d.display(),
            listen = if opts.tls.is_some() { "--listen " } else { "" }
        );
        me.spawn(&script)?;
        let net = d.join("net.xml");
        write(
            &net,
            &format!(
                "<network><name>default</name><bridge name='nlvbr0'/><ip address='{SUBNET}.1' netmask='255.255.255.0'><dhcp><range start='{SUBNET}.10' end='{SUBNET}.200'/></dhcp></ip></network>"
            ),
        )?;
        me.virsh(&["net-define", &net.display().to_string()])?.require()?;
        me.virsh(&["net-start", "default"])?.require()?;
        Ok(me)
    }

    /// The veth pair of [`Options::tls`]: the host end named after the namespace, its peer
    /// moved in; deleting the namespace deletes both.
    fn veth(&self, t: &TlsListen) -> Result<(), String> {
        let host = format!("nlvh{}", &self.ns[self.ns.len().saturating_sub(6)..]);
        let sh = |args: &[&str]| -> Result<(), String> {
            run(Command::new("ip").args(args), QUICK)?.require()?;
            Ok(())
        };
        sh(&[
            "link", "add", &host, "type", "veth", "peer", "name", "nlvtls0", "netns", &self.ns,
        ])?;
        sh(&["addr", "add", &format!("{}.2/30", t.net), "dev", &host])?;
        sh(&["link", "set", &host, "up"])?;
        let ns = |args: &[&str]| -> Result<(), String> {
            let mut full = vec!["netns", "exec", &self.ns, "ip"];
            full.extend_from_slice(args);
            sh(&full)
        };
        ns(&["addr", "add", &format!("{}/30", t.server_addr()), "dev", "nlvtls0"])?;
        ns(&["link", "set", "nlvtls0", "up"])
    }

    /// Runs `script` (mounts, then `exec libvirtd`) in the namespace and waits for libvirtd.
    fn spawn(&mut self, script: &str) -> Result<(), String> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns, "sh", "-c", script]);
        self.libvirtd = Some(Guard::spawn(&mut cmd, "libvirtd")?);
        let t0 = Instant::now();
        loop {
            if self.virsh(&["version"]).is_ok_and(|o| o.ok) {
                return Ok(());
            }
            if let Some(g) = self.libvirtd.as_mut() {
                if let Some(s) = g.exited() {
                    return Err(format!("libvirtd exited with {s}: {}", self.log()));
                }
            }
            if t0.elapsed() > START {
                return Err(format!(
                    "libvirtd did not answer within {}s: {}",
                    START.as_secs(),
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Stops libvirtd (SIGTERM, by PID) while its VMs keep running, and starts it again on the
    /// same state: QEMU outlives it, and the new libvirtd reconnects to it.
    pub fn restart(&mut self) -> Result<(), String> {
        if let Some(mut g) = self.libvirtd.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(g.pid() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            g.wait_timeout(Duration::from_secs(30))?;
        }
        let d = self.dir.path().to_path_buf();
        let script = format!(
            "{}; exec libvirtd {listen}--pid-file {d}/libvirtd.pid </dev/null >>{d}/libvirtd.out 2>&1",
            mounts(&d),
            d = d.display(),
            listen = if self.tls.is_some() { "--listen " } else { "" }
        );
        self.spawn(&script)
    }

    /// `virsh -c URI ARGS` (the tests observe libvirt with it; nubo never runs virsh).
    pub fn virsh(&self, args: &[&str]) -> Result<Out, String> {
        run(
            Command::new("virsh").arg("-q").arg("-c").arg(&self.uri).args(args),
            QUICK,
        )
    }

    /// The command prefix that runs a program inside the namespace.
    pub fn wrapper(&self) -> Vec<String> {
        vec!["ip".into(), "netns".into(), "exec".into(), self.ns.clone()]
    }

    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("libvirtd.out")).unwrap_or_default()
    }

    fn names(&self, args: &[&str]) -> Vec<String> {
        self.virsh(args)
            .map(|o| {
                o.stdout
                    .lines()
                    .map(|l| l.trim().to_owned())
                    .filter(|l| !l.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The PID in a daemon's PID file, if it holds one.
fn read_pid(path: &Path) -> Option<i32> {
    fs::read_to_string(path).ok().and_then(|s| s.trim().parse().ok())
}

impl Drop for Libvirtd {
    fn drop(&mut self) {
        if self.libvirtd.as_mut().is_some_and(|g| g.exited().is_none()) {
            for d in self.names(&["list", "--all", "--name"]) {
                let _ = self.virsh(&["destroy", &d]);
                let _ = self.virsh(&["undefine", "--nvram", "--snapshots-metadata", &d]);
            }
            for n in self.names(&["net-list", "--all", "--name"]) {
                let _ = self.virsh(&["net-destroy", &n]);
                let _ = self.virsh(&["net-undefine", &n]);
            }
            for p in self.names(&["pool-list", "--all", "--name"]) {
                let _ = self.virsh(&["pool-destroy", &p]);
                let _ = self.virsh(&["pool-undefine", &p]);
            }
        }
        let pidfile = self.dir.path().join("virtlogd.pid");
        let virtlogd = read_pid(&pidfile);
        if let Some(g) = self.libvirtd.as_mut() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(g.pid() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            if g.wait_timeout(Duration::from_secs(15)).is_err() {
                eprintln!("libvirtd: killed after SIGTERM did not end it");
            }
        }
        // A libvirtd that had to be killed leaves its children running (the network's
        // dnsmasq, a domain's QEMU): each is ended by the PID libvirt recorded for it, if that
        // PID still runs the program named.
        for (sub, program) in [("run/network", "dnsmasq"), ("run/qemu", "qemu")] {
            for e in fs::read_dir(self.dir.path().join(sub)).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !name.ends_with(".pid") || name == "driver.pid" {
                    continue;
                }
                let Some(pid) = read_pid(&e.path()) else {
                    continue;
                };
                let runs = fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(program));
                if runs {
                    eprintln!("libvirtd: ending its leftover {program} (pid {pid})");
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
                }
            }
        }
        if let Some(pid) = virtlogd {
            let pid = nix::unistd::Pid::from_raw(pid);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let t0 = Instant::now();
            while nix::sys::signal::kill(pid, None).is_ok() && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(100));
            }
            if nix::sys::signal::kill(pid, None).is_ok() {
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            }
        }
        let _ = run(Command::new("ip").args(["netns", "delete", &self.ns]), QUICK);
    }
}
