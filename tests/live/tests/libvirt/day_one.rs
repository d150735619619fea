//! Issue 25's day-one features on the libvirt backend, proven on the q35 + UEFI VM's boot
//! ([`super::efi`]) so they cost no boot of their own:
//!
//! - `--mount` read-write and read-only: the domain has a virtio-fs `<filesystem>` per folder
//!   (the read-only one `<readonly/>`) on shared memfd memory; libvirt's own virtiofsd serves
//!   them; cloud-init has mounted both over virtio-fs when it reports done; a host file reads in
//!   the guest, a guest write lands on the host, and a write to the read-only folder fails even
//!   after the guest remounts it read-write (the device refuses, not the guest); no virtiofsd
//!   is left after `vm rm`; `vm mount` hot-plugs a third folder (q35: a spare root port) and
//!   `vm umount` takes it away;
//! - `--publish` on `--restrict-network`: the forward reaches python3's HTTP server in the guest
//!   (started by the user-data's runcmd), from inside libvirtd's network namespace where QEMU
//!   listens; `vm ls` and `vm inspect` show it;
//! - `vm pause` stops the guest's clock and `vm ls`/libvirt say paused; `vm resume` restarts it.

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nubo_live::cli::{guest, inspect, ls_state, no_virtiofsd, nubo, virtiofsds};
use nubo_live::libvirtd::Libvirtd;
use nubo_live::net::{http_get_ok, in_netns};
use nubo_live::{TestResult, TestRoot};

/// The published host port, in libvirtd's own network namespace (nothing else listens there).
const HOST_PORT: u16 = 18080;
const GUEST_HTTP: u16 = 8000;
const QUICK: Duration = Duration::from_secs(180);
const PAUSE: Duration = Duration::from_secs(12);

/// The VM's shared folders and user-data, made before its create.
pub struct DayOne {
    rw: PathBuf,
    ro: PathBuf,
    user_data: PathBuf,
}

impl DayOne {
    /// Makes the folders (a host file in the read-only one) and the user-data under the root.
    pub fn prepare(root: &TestRoot, name: &str) -> Result<DayOne, String> {
        let dir = root.root().join(format!("{name}-day-one"));
        let rw = dir.join("share-rw");
        let ro = dir.join("share-ro");
        for d in [&rw, &ro] {
            fs::create_dir_all(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
        }
        fs::write(ro.join("hello.txt"), "from-host\n").map_err(|e| format!("writing hello.txt: {e}"))?;
        let user_data = dir.join("user-data");
        fs::write(
            &user_data,
            format!(
                "#cloud-config\nhostname: {name}\nwrite_files:\n  - path: /srv/www/hello.txt\n    content: \"hello from {name}\\n\"\nruncmd:\n  - [systemd-run, --unit=nubo-web, python3, -m, http.server, \"{GUEST_HTTP}\", --directory, /srv/www]\n"
            ),
        )
        .map_err(|e| format!("writing {}: {e}", user_data.display()))?;
        Ok(DayOne { rw, ro, user_data })
    }

    /// The create's arguments for the folders, the forward and the user-data.
    pub fn args(&self) -> Vec<String> {
        vec![
            "--restrict-network".into(),
            "--publish".into(),
            format!("{HOST_PORT}:{GUEST_HTTP}"),
            "--mount".into(),
            format!("{}:/mnt/rw", self.rw.display()),
            "--mount".into(),
            format!("{}:/mnt/ro:ro", self.ro.display()),
            "--user-data".into(),
            self.user_data.display().to_string(),
        ]
    }

    /// Everything above but what `vm rm` must leave, on the booted VM.
    pub fn check(&self, root: &TestRoot, lv: &Libvirtd, name: &str) -> TestResult {
        self.domain_xml(lv, name)?;
        self.folders(root, name)?;
        self.hot_plug(root, lv, name)?;
        published(root, lv, name)?;
        pause_resume(root, lv, name)
    }

    /// After `vm rm`: no virtiofsd serves either folder.
    pub fn after_rm(&self) -> TestResult {
        no_virtiofsd(&self.rw.display().to_string(), "after vm rm")?;
        no_virtiofsd(&self.ro.display().to_string(), "after vm rm")
    }

    fn domain_xml(&self, lv: &Libvirtd, name: &str) -> TestResult {
        let xml = lv.virsh(&["dumpxml", name])?.require()?.stdout;
        let doc = roxmltree::Document::parse(&xml).map_err(|e| format!("dumpxml {name}: {e}"))?;
        let shares: Vec<(String, bool)> = doc
            .descendants()
            .filter(|n| n.has_tag_name("filesystem"))
            .filter(|n| child(*n, "driver").and_then(|d| d.attribute("type")) == Some("virtiofs"))
            .map(|n| {
                let dir = child(n, "source").and_then(|s| s.attribute("dir")).unwrap_or_default();
                (dir.to_owned(), child(n, "readonly").is_some())
            })
            .collect();
        let want = vec![
            (self.rw.display().to_string(), false),
            (self.ro.display().to_string(), true),
        ];
        let memfd = doc
            .descendants()
            .find(|n| n.has_tag_name("memoryBacking"))
            .is_some_and(|m| {
                child(m, "source").and_then(|s| s.attribute("type")) == Some("memfd")
                    && child(m, "access").and_then(|s| s.attribute("mode")) == Some("shared")
            });
        if shares != want || !memfd {
            return Err(format!(
                "the domain does not share the folders over virtio-fs (read-only marked) on shared memfd memory: {shares:?} (memfd shared: {memfd}):\n{xml}"
            ));
        }
        // virtiofsd sandboxes itself in a forked child: two processes per folder.
        let servers = self.virtiofsds();
        println!("  libvirt's virtiofsd: {servers:?}");
        let serving = |dir: &PathBuf, readonly: bool| {
            let dir = format!("--shared-dir {}", dir.display());
            let of: Vec<_> = servers.iter().filter(|(_, c)| c.contains(&dir)).collect();
            !of.is_empty() && of.iter().all(|(_, c)| c.contains("--readonly") == readonly)
        };
        if !serving(&self.rw, false) || !serving(&self.ro, true) {
            return Err(format!(
                "expected libvirt's virtiofsd on each folder, with --readonly on the read-only one only: {servers:?}"
            ));
        }
        Ok(())
    }

    fn folders(&self, root: &TestRoot, name: &str) -> TestResult {
        let fstype = guest(root, name, "findmnt -n -o FSTYPE /mnt/rw; findmnt -n -o FSTYPE /mnt/ro")?;
        if fstype.split_whitespace().collect::<Vec<_>>() != ["virtiofs", "virtiofs"] {
            return Err(format!(
                "/mnt/rw and /mnt/ro are not both virtiofs in the guest: {fstype:?}"
            ));
        }
        let hello = guest(root, name, "cat /mnt/ro/hello.txt")?;
        if hello != "from-host" {
            return Err(format!(
                "the guest read {hello:?} from /mnt/ro/hello.txt, not the host's file"
            ));
        }
        guest(
            root,
            name,
            "echo from-guest | sudo tee /mnt/rw/guest.txt >/dev/null && sync",
        )?;
        let seen = fs::read_to_string(self.rw.join("guest.txt"))
            .map_err(|e| format!("the guest's file is not on the host: {e}"))?;
        if seen.trim() != "from-guest" {
            return Err(format!("the host reads {seen:?} from the guest's file"));
        }
        let write_ro = "sudo sh -c 'echo x > /mnt/ro/nope.txt' 2>&1 && echo WROTE || echo REFUSED";
        let first = guest(root, name, write_ro)?;
        let remounted = guest(
            root,
            name,
            &format!("sudo mount -o remount,rw /mnt/ro 2>&1; findmnt -n -o OPTIONS /mnt/ro; {write_ro}"),
        )?;
        println!("  libvirt write to /mnt/ro: {first:?}; after remount,rw: {remounted:?}");
        if !first.ends_with("REFUSED") || !remounted.ends_with("REFUSED") || self.ro.join("nope.txt").exists() {
            return Err(format!(
                "a write to the read-only folder was not refused: {first:?}, after remount: {remounted:?}"
            ));
        }
        Ok(())
    }

    /// `vm mount` hot-plugs a third folder into the q35 guest (a spare root port) through
    /// libvirt, which starts its virtiofsd; the guest has it mounted, a guest write reaches the
    /// host; `vm umount` takes it away again: unmounted in the guest, out of the domain, its
    /// virtiofsd gone.
    fn hot_plug(&self, root: &TestRoot, lv: &Libvirtd, name: &str) -> TestResult {
        let more = self.rw.with_file_name("share-more");
        fs::create_dir_all(&more).map_err(|e| format!("creating {}: {e}", more.display()))?;
        fs::write(more.join("more.txt"), "hot\n").map_err(|e| format!("writing more.txt: {e}"))?;
        let t = Instant::now();
        nubo(
            root,
            &["vm", "mount", name, &format!("{}:/mnt/more", more.display())],
            QUICK,
        )?
        .require()?;
        println!(
            "timing libvirt vm mount (hot-plug, q35): {:.1}s",
            t.elapsed().as_secs_f64()
        );
        let filesystems = |lv: &Libvirtd| -> Result<usize, String> {
            Ok(lv
                .virsh(&["dumpxml", name])?
                .require()?
                .stdout
                .matches("<filesystem ")
                .count())
        };
        if filesystems(lv)? != 3 || virtiofsds(&more.display().to_string()).is_empty() {
            return Err(format!(
                "after vm mount the domain has {} filesystems and libvirt's virtiofsds for {} are {:?}",
                filesystems(lv)?,
                more.display(),
                virtiofsds(&more.display().to_string())
            ));
        }
        let seen = guest(
            root,
            name,
            "findmnt -n -o FSTYPE /mnt/more; cat /mnt/more/more.txt; echo back | sudo tee /mnt/more/back.txt >/dev/null && sync",
        )?;
        let back = fs::read_to_string(more.join("back.txt")).unwrap_or_default();
        if seen.split_whitespace().collect::<Vec<_>>() != ["virtiofs", "hot"] || back.trim() != "back" {
            return Err(format!("the hot-plugged /mnt/more: guest {seen:?}, host {back:?}"));
        }
        nubo(root, &["vm", "umount", name, "/mnt/more"], QUICK)?.require()?;
        let gone = guest(
            root,
            name,
            "findmnt -n /mnt/more >/dev/null && echo MOUNTED || echo GONE",
        )?;
        if gone != "GONE" || filesystems(lv)? != 2 {
            return Err(format!(
                "after vm umount: guest {gone:?}, the domain has {} filesystems",
                filesystems(lv)?
            ));
        }
        no_virtiofsd(&more.display().to_string(), "after vm umount")
    }

    /// virtiofsd processes whose command line names one of the folders: (pid, command line).
    fn virtiofsds(&self) -> Vec<(i32, String)> {
        let mut all = virtiofsds(&self.rw.display().to_string());
        all.extend(virtiofsds(&self.ro.display().to_string()));
        all
    }
}

/// `n`'s first child element named `tag`.
fn child<'a, 'i>(n: roxmltree::Node<'a, 'i>, tag: &str) -> Option<roxmltree::Node<'a, 'i>> {
    n.children().find(|c| c.has_tag_name(tag))
}

/// The forward reaches the guest's HTTP server; `vm inspect` and `vm ls` show it.
fn published(root: &TestRoot, lv: &Libvirtd, name: &str) -> TestResult {
    let forward = format!("127.0.0.1:{HOST_PORT}->{GUEST_HTTP}/tcp");
    let rec = inspect(root, name)?;
    if rec["ports"][0] != forward.as_str() {
        return Err(format!("`vm inspect` shows ports {}, not {forward}", rec["ports"]));
    }
    let ls = nubo(root, &["vm", "ls"], QUICK)?.require()?;
    if !ls.stdout.contains(&forward) {
        return Err(format!("`vm ls` does not show {forward}:\n{}", ls.stdout));
    }
    let reply = in_netns(&lv.ns, || http_get_ok(HOST_PORT, "/hello.txt"))?;
    if !reply.contains(&format!("hello from {name}")) {
        return Err(format!("the published port answered something else:\n{reply}"));
    }
    println!(
        "  libvirt published 127.0.0.1:{HOST_PORT} -> guest :{GUEST_HTTP}: {}",
        reply.lines().next().unwrap_or("")
    );
    Ok(())
}

fn uptime(root: &TestRoot, name: &str) -> Result<f64, String> {
    let out = guest(root, name, "cut -d' ' -f1 /proc/uptime")?;
    out.trim()
        .parse()
        .map_err(|_| format!("cannot read the guest's uptime: {out:?}"))
}

/// Pause stops the guest's clock (libvirt says paused), resume restarts it.
fn pause_resume(root: &TestRoot, lv: &Libvirtd, name: &str) -> TestResult {
    let u0 = uptime(root, name)?;
    let h0 = Instant::now();
    nubo(root, &["vm", "pause", name], QUICK)?.require()?;
    let state = lv.virsh(&["domstate", name])?.require()?.stdout;
    if ls_state(root, name)? != "paused" || state.trim() != "paused" {
        return Err(format!(
            "after vm pause `vm ls` says {} and libvirt {state:?}",
            ls_state(root, name)?
        ));
    }
    std::thread::sleep(PAUSE);
    nubo(root, &["vm", "resume", name], QUICK)?.require()?;
    let u1 = uptime(root, name)?;
    let host = h0.elapsed().as_secs_f64();
    let guest_s = u1 - u0;
    println!(
        "  libvirt paused {}s: the host saw {host:.1}s pass, the guest {guest_s:.1}s",
        PAUSE.as_secs()
    );
    if guest_s > host - (PAUSE.as_secs_f64() - 4.0) {
        return Err(format!(
            "the guest's clock ran while paused: {guest_s:.1}s of uptime over {host:.1}s on the host"
        ));
    }
    if ls_state(root, name)? != "running" {
        return Err("`vm ls` does not say running after resume".into());
    }
    Ok(())
}
