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

pub fn overlay(ids: &Ids) -> Vec<OverlayFile> {
    let f = |path, contents: String| OverlayFile { path, contents };
    vec![
        // Without it cloud-init's cc_locale tries to generate a locale minbase cannot.
        f("etc/default/locale", "LANG=C.UTF-8\n".into()),
        // Only NoCloud (and None as the explicit fallback): otherwise cloud-init probes network
        // datasources and waits for metadata servers that are not there.
        f("etc/cloud/cloud.cfg.d/90_nubo.cfg", "datasource_list: [ NoCloud, None ]\n".into()),
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
    ]
}

/// Runs in the tree after the packages are in, before mmdebstrap's own cleanup (which empties
/// machine-id and the apt caches).
pub fn customize_script() -> String {
    hook_script(&[
        // Every VM from this image must get its own host keys.
        r#"rm -f "$1"/etc/ssh/ssh_host_*"#,
        // The build host's resolver: the guest's DHCP client writes its own.
        r#"rm -f "$1"/etc/resolv.conf"#,
        r#"mkdir -p "$1"/boot/efi "$1"/etc/systemd/system/ssh.service.wants"#,
        &format!(
            r#"ln -sf /etc/systemd/system/{SSH_KEYGEN_UNIT_NAME} "$1"/etc/systemd/system/ssh.service.wants/{SSH_KEYGEN_UNIT_NAME}"#
        ),
    ])
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
        assert_eq!(ds.contents, "datasource_list: [ NoCloud, None ]\n");
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
        assert_eq!(
            customize_script(),
            "set -eu\n\
             rm -f \"$1\"/etc/ssh/ssh_host_*\n\
             rm -f \"$1\"/etc/resolv.conf\n\
             mkdir -p \"$1\"/boot/efi \"$1\"/etc/systemd/system/ssh.service.wants\n\
             ln -sf /etc/systemd/system/nubo-ssh-keygen.service \"$1\"/etc/systemd/system/ssh.service.wants/nubo-ssh-keygen.service"
        );
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
