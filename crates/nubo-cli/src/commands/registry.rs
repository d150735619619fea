//! `nubo registry login | logout`, and the registry settings every OCI command shares:
//! credentials (nubo's own file, then $REGISTRY_AUTH_FILE, then docker's), TLS trust, and plain
//! http for the one registry given `--insecure-registry`.

use std::io::{BufRead, IsTerminal, Read, Write};
use std::path::PathBuf;

use anyhow::{bail, Context};
use nubo_image::oci::{AuthFile, Client, ClientSettings, Credentials};
use nubo_image::TlsSettings;

use crate::cli::registry::{LoginArgs, LogoutArgs, RegistryCmd};
use crate::settings::Settings;

pub fn run(cmd: RegistryCmd, settings: &Settings) -> anyhow::Result<()> {
    match cmd {
        RegistryCmd::Login(a) => login(&a, settings),
        RegistryCmd::Logout(a) => logout(&a, settings),
    }
}

/// The credentials for `registry`: the first of nubo's file, $REGISTRY_AUTH_FILE, docker's
/// config that has an entry (the library's lookup over [`Settings::pull_config`]'s source).
pub fn credentials(registry: &str, settings: &Settings) -> anyhow::Result<Option<Credentials>> {
    Ok(settings.pull_config().credentials.lookup(registry)?)
}

pub fn client_settings(
    registry: &str,
    ca_cert: &[PathBuf],
    insecure: bool,
    limits: nubo_image::http::Limits,
    settings: &Settings,
) -> anyhow::Result<ClientSettings> {
    Ok(ClientSettings {
        tls: TlsSettings {
            ca_bundle: settings.ssl_cert_file.clone(),
            extra_ca: ca_cert.to_vec(),
        },
        insecure,
        credentials: credentials(registry, settings)?,
        retries: 5,
        limits,
        // Ctrl-C ends a blob's transfer between reads ([`crate::interrupt`]).
        cancel: Some(crate::interrupt::install()),
    })
}

/// `host[:port]`, checked the way a reference's registry part is.
fn registry_name(s: &str) -> anyhow::Result<String> {
    let s = s.trim_end_matches('/');
    let s = s.strip_prefix("https://").unwrap_or(s);
    match nubo_image::OciRef::parse(&format!("{s}/x")) {
        Ok(r) if r.registry.as_deref() == Some(s) => Ok(s.to_owned()),
        _ => bail!("`{s}` is not a registry host: write `host[:port]`, e.g. `registry.example:5000`"),
    }
}

/// The longest password or token read from standard input: registry tokens (JWTs included)
/// are well under this.
const MAX_PASSWORD: u64 = 8 * 1024;

fn login(a: &LoginArgs, settings: &Settings) -> anyhow::Result<()> {
    let registry = registry_name(&a.registry)?;
    let username = match &a.username {
        Some(u) => u.clone(),
        None if settings.stdin_tty && !a.password_stdin => prompt("username: ")?,
        None => bail!("no username: pass -u USER"),
    };
    let password = if a.password_stdin {
        // Bounded: `</dev/zero` or an endless pipe is refused at the bound, not read until killed.
        let bytes = nubo_core::input::read_small_input(std::path::Path::new("-"), "--password-stdin", MAX_PASSWORD)?;
        let text = String::from_utf8(bytes)
            .map_err(|_| anyhow::anyhow!("--password-stdin: the password is not UTF-8 text"))?;
        let line = text.lines().next().unwrap_or_default();
        line.trim_end_matches(['\n', '\r']).to_owned()
    } else if settings.stdin_tty {
        read_hidden("password: ")?
    } else {
        bail!("no password: pass --password-stdin and write it to stdin")
    };
    if username.is_empty() || password.is_empty() || username.contains(':') {
        bail!("the username must be non-empty without `:`, and the password non-empty");
    }
    let creds = Credentials { username, password };
    let mut cs = client_settings(&registry, &a.ca_cert, a.insecure_registry, a.limits.limits(), settings)?;
    cs.credentials = Some(creds.clone());
    Client::new(&registry, &cs)?
        .ping()
        .with_context(|| format!("logging in to {registry}"))?;
    let mut file = AuthFile::load(&settings.auth_file)?;
    file.set(&registry, &creds);
    file.save(&settings.auth_file)?;
    println!(
        "logged in to {registry} as {}; credentials in {}",
        creds.username,
        settings.auth_file.display()
    );
    Ok(())
}

fn logout(a: &LogoutArgs, settings: &Settings) -> anyhow::Result<()> {
    let registry = registry_name(&a.registry)?;
    let mut file = AuthFile::load(&settings.auth_file)?;
    if file.remove(&registry) {
        file.save(&settings.auth_file)?;
        println!("logged out of {registry}");
    } else {
        println!(
            "not logged in to {registry} (nothing in {})",
            settings.auth_file.display()
        );
    }
    let elsewhere: Vec<_> = settings
        .foreign_auth_files
        .iter()
        .filter(|p| {
            AuthFile::load(p)
                .ok()
                .and_then(|f| f.get(&registry, p).ok().flatten())
                .is_some()
        })
        .collect();
    for p in elsewhere {
        eprintln!(
            "note: {} still holds credentials for {registry}, which nubo reads but never changes",
            p.display()
        );
    }
    Ok(())
}

fn prompt(label: &str) -> anyhow::Result<String> {
    eprint!("{label}");
    std::io::stderr().flush().ok();
    Ok(
        read_line_bounded(&mut std::io::stdin().lock(), label.trim_end_matches([':', ' ']))?
            .trim()
            .to_owned(),
    )
}

/// The longest answer a prompt reads: a user name or a password, never megabytes from a pipe.
const MAX_PROMPT_LINE: u64 = 8 * 1024;

/// One line of `r`, at most [`MAX_PROMPT_LINE`] bytes: a longer one is refused, not read on.
fn read_line_bounded(r: &mut impl BufRead, what: &str) -> anyhow::Result<String> {
    let mut line = String::new();
    r.take(MAX_PROMPT_LINE + 1)
        .read_line(&mut line)
        .with_context(|| format!("reading the {what}"))?;
    if line.len() as u64 > MAX_PROMPT_LINE {
        bail!("the {what} is longer than {MAX_PROMPT_LINE} bytes: that is not a {what}; check what is piped in");
    }
    Ok(line)
}

/// Reads a line from the terminal with echo off (restored even on error).
fn read_hidden(label: &str) -> anyhow::Result<String> {
    use nix::sys::termios::{tcgetattr, tcsetattr, LocalFlags, SetArg};
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        bail!("no terminal to ask the password on: pass --password-stdin");
    }
    let saved = tcgetattr(&stdin).context("reading terminal settings")?;
    let mut quiet = saved.clone();
    quiet.local_flags.remove(LocalFlags::ECHO);
    tcsetattr(&stdin, SetArg::TCSANOW, &quiet).context("turning echo off")?;
    eprint!("{label}");
    std::io::stderr().flush().ok();
    let r = read_line_bounded(&mut stdin.lock(), "password");
    let _ = tcsetattr(&stdin, SetArg::TCSANOW, &saved);
    eprintln!();
    Ok(r?.trim_end_matches(['\n', '\r']).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_line_bounded_reads_one_line() {
        let mut r = std::io::Cursor::new(b"alice\nbob\n".to_vec());

        assert_eq!(read_line_bounded(&mut r, "username").unwrap(), "alice\n");
    }

    #[test]
    fn read_line_bounded_endless_line_refused_without_reading_on() {
        let mut r = std::io::BufReader::new(std::io::repeat(b'a'));

        let err = read_line_bounded(&mut r, "username").unwrap_err();

        assert!(err.to_string().contains("longer than 8192 bytes"), "{err}");
    }
}
