//! The `mounts:` cloud-config entries for shared folders: cloud-init's mounts module (an init
//! stage module) writes them to fstab, creates the mount points and mounts them, so they are
//! there when cloud-init reports done. `nofail`: a folder that cannot be mounted does not hold
//! the guest's boot at emergency mode (cloud-init reports the failure instead).

/// One shared folder as the guest mounts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestMount {
    /// The device's tag (`mount0`): the fstab "device".
    pub tag: String,
    /// The mount point.
    pub path: String,
    /// `virtiofs` or `9p`.
    pub fs_type: String,
    pub read_only: bool,
}

/// 9p's mount options: virtio transport, the Linux dialect, 512 KiB messages (the default 8 KiB
/// is slow).
const NINEP_OPTIONS: &str = "trans=virtio,version=9p2000.L,msize=524288";

/// The `mounts:` key as cloud-config lines, to append to a generated `#cloud-config` document
/// (user-data or vendor-data); empty for no mounts. Every value is double-quoted, so a path
/// cannot end the flow sequence or inject a key.
pub fn render_mounts(mounts: &[GuestMount]) -> String {
    if mounts.is_empty() {
        return String::new();
    }
    let mut out = String::from("mounts:\n");
    for m in mounts {
        let mut options = Vec::new();
        if m.fs_type == "9p" {
            options.push(NINEP_OPTIONS);
        } else {
            options.push("defaults");
        }
        if m.read_only {
            options.push("ro");
        }
        options.push("nofail");
        out.push_str(&format!(
            "  - [{}, {}, {}, {}, \"0\", \"0\"]\n",
            quoted(&m.tag),
            quoted(&m.path),
            quoted(&m.fs_type),
            quoted(&options.join(","))
        ));
    }
    out
}

/// A YAML double-quoted scalar: `\` and `"` escaped, control characters as `\xNN`/`\uNNNN`.
fn quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(tag: &str, path: &str, fs: &str, ro: bool) -> GuestMount {
        GuestMount {
            tag: tag.into(),
            path: path.into(),
            fs_type: fs.into(),
            read_only: ro,
        }
    }

    #[test]
    fn render_mounts_empty_is_nothing() {
        assert_eq!(render_mounts(&[]), "");
    }

    #[test]
    fn render_mounts_virtiofs_and_9p_golden() {
        let out = render_mounts(&[
            m("mount0", "/srv/data", "virtiofs", false),
            m("mount1", "/mnt/ro", "9p", true),
        ]);

        assert_eq!(
            out,
            "mounts:\n  - [\"mount0\", \"/srv/data\", \"virtiofs\", \"defaults,nofail\", \"0\", \"0\"]\n  - [\"mount1\", \"/mnt/ro\", \"9p\", \"trans=virtio,version=9p2000.L,msize=524288,ro,nofail\", \"0\", \"0\"]\n"
        );
    }

    #[test]
    fn render_mounts_hostile_path_stays_one_value() {
        let hostile = "/a\", x]\nruncmd: [reboot]\n#\\\u{85}";
        let doc = format!(
            "#cloud-config\n{}",
            render_mounts(&[m("mount0", hostile, "virtiofs", false)])
        );

        let docs = yaml_rust2::YamlLoader::load_from_str(&doc).unwrap();

        let map = docs[0].as_hash().unwrap();
        assert_eq!(map.len(), 1, "{doc}");
        assert_eq!(docs[0]["mounts"][0][1].as_str(), Some(hostile), "{doc}");
    }

    #[test]
    fn render_mounts_appended_to_cloud_config_validates() {
        let mut doc = crate::render_cloud_config(&crate::CloudConfig {
            hostname: Some("h".into()),
            ssh_authorized_keys: vec!["ssh-ed25519 AAAA k".into()],
        });
        doc.extend_from_slice(render_mounts(&[m("mount0", "/srv/data", "virtiofs", true)]).as_bytes());

        assert!(crate::validate_user_data(&doc).is_ok());
    }
}
