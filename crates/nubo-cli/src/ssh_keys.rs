//! `--ssh-key` as `vm create` and `seed` both take it: a key line, the path of a `.pub` file
//! (as users type it after `ssh-keygen`), or `@FILE` (every key line of the file, like
//! authorized_keys; `@-` and `@<(...)` read a pipe, bounded like every small input).
//!
//! A private key (text or file) is refused with the path of its public half. A bad line of a
//! file is named by its number, never quoted: the file may be a secret (`@/etc/shadow`).

use std::path::{Path, PathBuf};

use anyhow::bail;
use nubo_core::file::escape_control;

/// Prefixes of OpenSSH public key lines (`ssh-keygen -l` knows no others).
const KEY_TYPES: &[&str] = &["ssh-", "ecdsa-sha2-", "sk-ssh-", "sk-ecdsa-sha2-"];

/// The public keys `arg` gives. `home` expands a leading `~/`, which reaches nubo unexpanded
/// when quoted or written after `@`.
pub fn parse(arg: &str, home: Option<&Path>) -> anyhow::Result<Vec<String>> {
    let file = match arg.strip_prefix('@') {
        Some(path) => Some(path),
        None if is_key(arg.trim()) => None,
        None if looks_like_path(arg) => Some(arg),
        None => None,
    };
    let Some(path) = file else {
        return literal(arg);
    };
    let path = expand_home(path, home)?;
    let shown = escape_control(&path.display().to_string());
    let bytes = nubo_core::input::read_small_input(&path, "--ssh-key file", nubo_seed::MAX_SSH_KEY_FILE)?;
    if bytes.windows(11).any(|w| w == b"PRIVATE KEY") {
        bail!(
            "--ssh-key {shown}: this is a private key, which must never leave this host: give its public half, `{shown}.pub`"
        );
    }
    let Ok(text) = String::from_utf8(bytes) else {
        bail!("--ssh-key file {shown} is not text: give the public key file (`.pub`)");
    };
    let mut keys = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if !is_key(line) {
            bail!(
                "--ssh-key file {shown}: line {} is not an OpenSSH public key (expected e.g. `ssh-ed25519 AAAA...`): give the `.pub` file",
                n + 1
            );
        }
        keys.push(line.to_owned());
    }
    if keys.is_empty() {
        bail!("--ssh-key file {shown} holds no public key: expected a line such as `ssh-ed25519 AAAA... user@host`");
    }
    Ok(keys)
}

/// A key given on the command line.
fn literal(arg: &str) -> anyhow::Result<Vec<String>> {
    let k = arg.trim();
    if k.contains("PRIVATE KEY") {
        bail!("--ssh-key: this is a private key, which must never leave this host: give its public half (the `.pub` file)");
    }
    if !is_key(k) || k.contains('\n') {
        bail!(
            "--ssh-key: `{}` is not an OpenSSH public key (expected e.g. `ssh-ed25519 AAAA...`): give the key line, the path of its .pub file, or @FILE",
            escape_control(&k.chars().take(40).collect::<String>())
        );
    }
    Ok(vec![k.to_owned()])
}

/// A public key line starts with its type.
fn is_key(line: &str) -> bool {
    KEY_TYPES.iter().any(|t| line.starts_with(t))
}

/// A file name rather than a key: one word with a `/`, a leading `~`, or a `.pub` ending.
fn looks_like_path(text: &str) -> bool {
    !text.contains(char::is_whitespace) && (text.contains('/') || text.starts_with('~') || text.ends_with(".pub"))
}

fn expand_home(path: &str, home: Option<&Path>) -> anyhow::Result<PathBuf> {
    match path.strip_prefix("~/") {
        Some(rest) => match home {
            Some(h) => Ok(h.join(rest)),
            None => bail!(
                "--ssh-key {}: HOME is not set, so `~/` means nothing: give the full path",
                escape_control(path)
            ),
        },
        None => Ok(PathBuf::from(path)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_literal_key_is_returned() {
        assert_eq!(
            parse("ssh-ed25519 AAAAC3 a@b", None).unwrap(),
            ["ssh-ed25519 AAAAC3 a@b"]
        );
    }

    #[test]
    fn parse_private_key_text_refused() {
        let err = parse("-----BEGIN OPENSSH PRIVATE KEY-----", None).unwrap_err();

        assert!(err.to_string().contains("private key"), "{err}");
    }

    #[test]
    fn parse_bad_key_is_quoted_escaped() {
        let err = parse("\x1b[2Jssh", None).unwrap_err();

        assert!(!err.to_string().contains('\x1b'), "{err}");
        assert!(err.to_string().contains("not an OpenSSH public key"), "{err}");
    }

    #[test]
    fn parse_file_skips_blank_and_comment_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("keys");
        std::fs::write(&p, "# mine\nssh-ed25519 A a\n\necdsa-sha2-nistp256 B b\n").unwrap();

        let keys = parse(&format!("@{}", p.display()), None).unwrap();

        assert_eq!(keys, ["ssh-ed25519 A a", "ecdsa-sha2-nistp256 B b"]);
    }

    #[test]
    fn parse_pub_path_without_at_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("id_ed25519.pub");
        std::fs::write(&p, "ssh-ed25519 AAAA me@host\n").unwrap();

        assert_eq!(
            parse(&p.display().to_string(), None).unwrap(),
            ["ssh-ed25519 AAAA me@host"]
        );
    }

    #[test]
    fn parse_tilde_path_uses_home() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(".ssh")).unwrap();
        std::fs::write(dir.path().join(".ssh/id.pub"), "ssh-rsa BBBB x\n").unwrap();

        assert_eq!(parse("~/.ssh/id.pub", Some(dir.path())).unwrap(), ["ssh-rsa BBBB x"]);
        assert_eq!(parse("@~/.ssh/id.pub", Some(dir.path())).unwrap(), ["ssh-rsa BBBB x"]);
    }

    #[test]
    fn parse_tilde_without_home_refused() {
        let err = parse("~/.ssh/id.pub", None).unwrap_err();

        assert!(err.to_string().contains("HOME is not set"), "{err}");
    }

    #[test]
    fn parse_private_key_path_refused_with_pub_fix_not_quoting_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("id_ed25519");
        std::fs::write(
            &p,
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----\n",
        )
        .unwrap();

        let err = parse(&p.display().to_string(), None).unwrap_err().to_string();

        assert!(
            err.contains("private key") && err.contains(&format!("{}.pub", p.display())),
            "{err}"
        );
        assert!(!err.contains("b3Blbn"), "{err}");
    }

    #[test]
    fn parse_missing_pub_path_names_file() {
        let err = parse("/nonexistent/id.pub", None).unwrap_err();

        assert!(format!("{err:#}").contains("/nonexistent/id.pub"), "{err:#}");
    }

    #[test]
    fn parse_fifo_without_writer_is_refused_without_hanging() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("fifo");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::S_IRWXU).unwrap();

        let err = parse(&format!("@{}", p.display()), None).unwrap_err();

        assert!(format!("{err:#}").contains("nothing was written"), "{err:#}");
    }

    #[test]
    fn parse_secret_file_line_is_not_quoted() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("shadow");
        std::fs::write(&p, "root:$6$SECRETMARKER:19000:0:99999:7:::\n").unwrap();

        let err = format!("{:#}", parse(&format!("@{}", p.display()), None).unwrap_err());

        assert!(!err.contains("SECRETMARKER"), "{err}");
        assert!(err.contains("line 1"), "{err}");
    }

    #[test]
    fn parse_device_file_is_refused() {
        let err = parse("@/dev/zero", None).unwrap_err();

        assert!(format!("{err:#}").contains("character device"), "{err:#}");
    }

    #[test]
    fn parse_empty_file_says_no_key() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("empty.pub");
        std::fs::write(&p, "# nothing\n").unwrap();

        let err = parse(&p.display().to_string(), None).unwrap_err();

        assert!(err.to_string().contains("holds no public key"), "{err}");
    }
}
