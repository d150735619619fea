//! The default `--mirror`: the Debian archive the host's apt already uses, so a machine that can
//! install packages can bootstrap without being told where from.

use std::fs;
use std::path::Path;

use crate::error::BootstrapError;

/// Reads `<etc_apt>/sources.list`, `sources.list.d/*.list` and `sources.list.d/*.sources` and
/// returns the archive root of the first `deb` entry that is Debian's main archive (not
/// security, not a third-party repository).
pub fn host_mirror(etc_apt: &Path) -> Result<String, BootstrapError> {
    let mut texts = Vec::new();
    if let Ok(t) = fs::read_to_string(etc_apt.join("sources.list")) {
        texts.push((false, t));
    }
    let dir = etc_apt.join("sources.list.d");
    let mut entries: Vec<_> = fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for p in entries {
        let deb822 = match p.extension().and_then(|e| e.to_str()) {
            Some("sources") => true,
            Some("list") => false,
            _ => continue,
        };
        if let Ok(t) = fs::read_to_string(&p) {
            texts.push((deb822, t));
        }
    }
    texts
        .iter()
        .flat_map(|(deb822, t)| if *deb822 { parse_deb822(t) } else { parse_one_line(t) })
        .find(|s| is_debian_archive(s))
        .map(|s| uri_of(&s).trim_end_matches('/').to_owned())
        .ok_or_else(|| BootstrapError::NoMirror(etc_apt.display().to_string()))
}

/// `deb [opts] URI suite components...` lines; yields `URI suite`.
fn parse_one_line(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter_map(|l| {
            let rest = l.strip_prefix("deb ")?.trim_start();
            // Options are `[key=value ...]` and may contain spaces.
            let rest = match rest.strip_prefix('[') {
                Some(r) => r.split_once(']')?.1.trim_start(),
                None => rest,
            };
            let mut words = rest.split_whitespace();
            let uri = words.next()?;
            let suite = words.next()?;
            Some(format!("{uri} {suite}"))
        })
        .collect()
}

/// deb822 stanzas (`Types:`, `URIs:`, `Suites:`); yields `URI suite` per URI and suite.
fn parse_deb822(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for stanza in text.split("\n\n") {
        let field = |name: &str| {
            stanza.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
            })
        };
        let enabled = !matches!(field("Enabled"), Some(v) if v.eq_ignore_ascii_case("no"));
        let is_deb = field("Types").is_some_and(|t| t.split_whitespace().any(|t| t == "deb"));
        if !(enabled && is_deb) {
            continue;
        }
        let (Some(uris), Some(suites)) = (field("URIs"), field("Suites")) else {
            continue;
        };
        for uri in uris.split_whitespace() {
            for suite in suites.split_whitespace() {
                out.push(format!("{uri} {suite}"));
            }
        }
    }
    out
}

/// The main archive serves `<suite>` itself (bookworm, bookworm-updates); the security archive
/// and backports are not where a bootstrap's base comes from.
fn is_debian_archive(uri_suite: &str) -> bool {
    let Some((uri, suite)) = uri_suite.split_once(' ') else {
        return false;
    };
    let path_is_debian = uri.trim_end_matches('/').ends_with("/debian");
    let plain_suite = !suite.contains('-') && !suite.contains('/');
    (uri.starts_with("http://") || uri.starts_with("https://") || uri.starts_with("file:/"))
        && path_is_debian
        && plain_suite
}

/// The archive root from a `URI suite` pair.
fn uri_of(uri_suite: &str) -> &str {
    uri_suite.split_once(' ').map_or(uri_suite, |(u, _)| u)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_deb822_skips_security_and_disabled() {
        let text = "Types: deb\nURIs: http://m.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n\
                    Types: deb\nURIs: http://m.example/debian-security\nSuites: bookworm-security\n\n\
                    Enabled: no\nTypes: deb\nURIs: http://x/debian\nSuites: trixie\n";

        let found: Vec<_> = parse_deb822(text)
            .into_iter()
            .filter(|s| is_debian_archive(s))
            .collect();

        assert_eq!(found, vec!["http://m.example/debian bookworm"]);
    }

    #[test]
    fn parse_one_line_with_options() {
        let text = "# comment\ndeb [arch=amd64 signed-by=/k.gpg] http://m.example/debian/ bookworm main\n";

        assert_eq!(parse_one_line(text), vec!["http://m.example/debian/ bookworm"]);
    }

    #[test]
    fn is_debian_archive_rejects_third_party() {
        assert!(!is_debian_archive("https://deb.nodesource.example/node_20.x nodistro"));
    }

    #[test]
    fn host_mirror_reads_sources_dir() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("sources.list.d")).unwrap();
        fs::write(
            dir.path().join("sources.list.d/a.list"),
            "deb http://m.example/ubuntu noble main\n",
        )
        .unwrap();
        fs::write(
            dir.path().join("sources.list.d/debian.sources"),
            "Types: deb\nURIs: http://m.example/debian\nSuites: bookworm\n",
        )
        .unwrap();

        let m = host_mirror(dir.path()).unwrap();

        assert_eq!(m, "http://m.example/debian");
    }

    #[test]
    fn host_mirror_none_names_fix() {
        let dir = tempfile::tempdir().unwrap();

        let e = host_mirror(dir.path()).unwrap_err();

        assert!(e.to_string().contains("--mirror"));
    }
}
