//! Prerequisite probes, each run at most once per process. Names are what `NUBO_LIVE_REQUIRE`
//! lists.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

static CACHE: Mutex<Option<HashMap<String, Result<(), String>>>> = Mutex::new(None);

/// `Ok` when `name` is usable here, else why not (with the package that fixes it).
pub fn check(name: &str) -> Result<(), String> {
    let mut cache = CACHE.lock().expect("prereq cache poisoned");
    let cache = cache.get_or_insert_with(HashMap::new);
    if let Some(r) = cache.get(name) {
        return r.clone();
    }
    let r = probe(name);
    cache.insert(name.to_owned(), r.clone());
    r
}

fn probe(name: &str) -> Result<(), String> {
    match name {
        "qemu" => tool("qemu-system-x86_64", "qemu-system-x86 (from bookworm-backports)"),
        // qemu-io ships in the same package; the disk tests write through overlays with it.
        "qemu-img" => tool("qemu-img", "qemu-utils").and_then(|()| tool("qemu-io", "qemu-utils")),
        // The seed interop tests: independent readers of nubo's ISO and VFAT seeds, and the
        // tools whose images nubo's reader must read.
        "iso-tools" => tool("xorriso", "xorriso")
            .and_then(|()| tool("isoinfo", "genisoimage"))
            .and_then(|()| tool("blkid", "util-linux")),
        "pycdlib" => pycdlib_python().map(|_| ()),
        "7z" => tool("7z", "p7zip-full"),
        "bsdtar" => tool("bsdtar", "libarchive-tools"),
        "mtools" => tool("mdir", "mtools").and_then(|()| tool("mtype", "mtools")),
        "dosfstools" => tool("mkfs.vfat", "dosfstools"),
        "genisoimage" => tool("genisoimage", "genisoimage"),
        "cloud-localds" => tool("cloud-localds", "cloud-image-utils"),
        "ovmf" => file(OVMF_CODE, "ovmf").and_then(|()| file(OVMF_VARS, "ovmf")),
        // The host tools of `nubo image bootstrap`, and root or mmdebstrap's unshare mode.
        "bootstrap" => nubo_bootstrap::Host::probe().map(|_| ()).map_err(|e| e.to_string()),
        // `image from-container --format iso`: grub-mkrescue, xorriso, mformat, resize2fs.
        "iso-build" => nubo_bootstrap::iso::probe_tools().map(|_| ()).map_err(|e| e.to_string()),
        // The shared Cloud Hypervisor build (no registry ships it) and a /dev/kvm it can use.
        "cloud-hypervisor" => cloud_hypervisor_binary().and_then(|_| {
            if Path::new("/dev/kvm").exists() {
                Ok(())
            } else {
                Err("/dev/kvm does not exist: Cloud Hypervisor needs KVM".to_owned())
            }
        }),
        // vm.snapshot saves vCPU state with KVM_GET_NESTED_STATE, which kvm_pvm refuses.
        "ch-snapshot" => probe("cloud-hypervisor").and_then(|()| not_pvm("Cloud Hypervisor's vm.snapshot fails on it (\"Could not get vCPU state GetNestedState(Invalid argument)\"): kvm_pvm does not implement KVM_GET_NESTED_STATE")),
        // A stock distro kernel (cloud-init's guest) hangs under PVM.
        "ch-kvm" => probe("cloud-hypervisor").and_then(|()| not_pvm("stock distro kernels hang under PVM, so a cloud-init guest cannot boot on Cloud Hypervisor here")),
        // The OCI registry tests: a real registry (distribution 2.8) the test starts itself, its
        // htpasswd file made with apache2-utils' bcrypt, and a peer client.
        "docker-registry" => {
            tool("docker-registry", "docker-registry").and_then(|()| tool("htpasswd", "apache2-utils"))
        }
        "skopeo" => tool("skopeo", "skopeo"),
        // from_container gives its container image a file capability, as a package's postinst does.
        "setcap" => tool("setcap", "libcap2-bin"),
        // The libvirt backend's tests: libvirtd and virtlogd (started by the test itself in a
        // network namespace), virsh to observe, dnsmasq for the isolated network's DHCP, the
        // library nubo loads at run time, and `ip netns`.
        "libvirt" => tool("libvirtd", "libvirt-daemon libvirt-daemon-driver-qemu libvirt-daemon-driver-network libvirt-daemon-driver-storage (bookworm-backports)")
            .and_then(|()| tool("virtlogd", "libvirt-daemon"))
            .and_then(|()| tool("virsh", "libvirt-clients"))
            .and_then(|()| tool("dnsmasq", "dnsmasq-base"))
            .and_then(|()| tool("ip", "iproute2"))
            .and_then(|()| file("/usr/lib/x86_64-linux-gnu/libvirt.so.0", "libvirt0"))
            .and_then(|()| {
                if nix::unistd::geteuid().is_root() {
                    Ok(())
                } else {
                    Err("the test's libvirtd runs in a network namespace it makes: run as root".to_owned())
                }
            }),
        // A libvirtd listening for TLS in its namespace (the remote-host test): libvirt's
        // prerequisites, and openssl to make its CA, server and client certificates.
        "libvirt-tls" => probe("libvirt").and_then(|()| tool("openssl", "openssl")),
        // The qemu+ssh test: an sshd the test starts in the libvirtd's namespace, keys made
        // with ssh-keygen, and the client `ssh` libvirt runs (as a user the test adds).
        "sshd" => file("/usr/sbin/sshd", "openssh-server")
            .and_then(|()| tool("ssh-keygen", "openssh-client"))
            .and_then(|()| tool("ssh", "openssh-client"))
            .and_then(|()| tool("useradd", "passwd"))
            .and_then(|()| tool("setpriv", "util-linux")),
        // Shared folders over virtio-fs (vm create --mount): found where the qemu backend looks.
        "virtiofsd" => nubo_backend::qemu::mounts::find_virtiofsd(&nubo_backend::HostEnv::from_process()).map(|_| ()).ok_or_else(|| {
            "virtiofsd not found on PATH or in /usr/libexec: run scripts/install-deps.sh (Debian 12 has no package; it builds virtiofsd 1.14.0 from crates.io)".to_owned()
        }),
        // A genuine kube-apiserver + etcd + kubectl (the shared run-apiserver.sh, built in its
        // cache outside the clone), for the Kubernetes controller's test.
        "kube-apiserver" => crate::kube::probe(),
        other => Err(format!("unknown prerequisite `{other}` (a bug in the test)")),
    }
}

/// UEFI firmware for the EFI boots: code read-only, a copy of the variable store per VM.
pub const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
pub const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";

fn file(path: &str, package: &str) -> Result<(), String> {
    if Path::new(path).is_file() {
        Ok(())
    } else {
        Err(format!("{path} not found: install {package}"))
    }
}

/// An executable on PATH.
pub fn tool(cmd: &str, package: &str) -> Result<(), String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|d| is_executable(&d.join(cmd))) {
        Ok(())
    } else {
        Err(format!("`{cmd}` not found on PATH: install {package}"))
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A Python that can `import pycdlib`: Debian's python3-pycdlib lives in /usr/bin/python3's
/// dist-packages, which a pyenv or venv `python3` earlier on PATH does not see.
pub fn pycdlib_python() -> Result<String, String> {
    for py in ["python3", "/usr/bin/python3"] {
        let ok = std::process::Command::new(py)
            .args(["-c", "import pycdlib"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(py.to_owned());
        }
    }
    Err("no python3 can `import pycdlib`: install python3-pycdlib".to_owned())
}

/// The environment variable that names a Cloud Hypervisor binary for the live tests.
pub const CLOUD_HYPERVISOR_ENV: &str = "NUBO_CLOUD_HYPERVISOR";

/// The Cloud Hypervisor binary the live tests use: `$NUBO_CLOUD_HYPERVISOR`, else
/// `cloud-hypervisor` on PATH, else the shared build beside the repository
/// (`../shared/tools/cloud-hypervisor/`), else the same at `/work/shared/tools/` (where it lives
/// on the machines this project is built on, whatever directory CI clones into).
pub fn cloud_hypervisor_binary() -> Result<std::path::PathBuf, String> {
    if let Some(p) = std::env::var_os(CLOUD_HYPERVISOR_ENV).filter(|v| !v.is_empty()) {
        let p = std::path::PathBuf::from(p);
        return if is_executable(&p) {
            Ok(p)
        } else {
            Err(format!(
                "{CLOUD_HYPERVISOR_ENV}={} is not an executable file",
                p.display()
            ))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    if let Some(p) = std::env::split_paths(&path)
        .map(|d| d.join("cloud-hypervisor"))
        .find(|p| is_executable(p))
    {
        return Ok(p);
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let shared = [
        repo.join("../shared/tools/cloud-hypervisor/cloud-hypervisor"),
        std::path::PathBuf::from("/work/shared/tools/cloud-hypervisor/cloud-hypervisor"),
    ];
    shared.iter().find(|p| is_executable(p)).cloned().ok_or_else(|| {
        format!(
            "no Cloud Hypervisor: not in {CLOUD_HYPERVISOR_ENV}, not on PATH, not at {} or {} (no package registry ships it: put a release binary on PATH)",
            shared[0].display(),
            shared[1].display()
        )
    })
}

fn not_pvm(why: &str) -> Result<(), String> {
    if Path::new("/sys/module/kvm_pvm").exists() {
        Err(format!("this host's /dev/kvm is PVM (kvm_pvm): {why}"))
    } else {
        Ok(())
    }
}
