//! What the build learns from the installed tree and records: the package versions (a recipe
//! key alone does not say which versions a mirror served) and the epoch the image's times are
//! clamped to. Pure: the facts hook's files in, checked values out. The text comes from inside
//! the image, so it is checked like any other input.

use std::collections::BTreeMap;

use crate::recipe::is_package_name;

/// A bootstrap installs a few hundred packages; far more means the file is not what the hook wrote.
const MAX_PACKAGES: usize = 20_000;
/// Debian versions are short; the longest in the archive are well under this.
const MAX_VERSION_LEN: usize = 128;

/// `packages` as the facts hook wrote it (`NAME<TAB>VERSION` a line) as a map, name to version.
pub fn parse_packages(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.is_empty() {
            continue;
        }
        let n = i + 1;
        let (name, version) = line
            .split_once('\t')
            .ok_or_else(|| format!("line {n} is not NAME<TAB>VERSION"))?;
        if !is_package_name(name) {
            return Err(format!("line {n}: `{}` is not a package name", shown(name)));
        }
        if !is_installed_version(version) {
            return Err(format!("line {n}: `{}` is not a package version", shown(version)));
        }
        if out.insert(name.to_owned(), version.to_owned()).is_some() {
            return Err(format!("line {n}: package {name} is listed twice"));
        }
        if out.len() > MAX_PACKAGES {
            return Err(format!("more than {MAX_PACKAGES} packages"));
        }
    }
    if out.is_empty() {
        return Err("no packages are listed".into());
    }
    Ok(out)
}

/// A version as dpkg records it: `[epoch:]upstream[-revision]`, alphanumerics and `. + ~ : -`.
fn is_installed_version(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= MAX_VERSION_LEN
        && v.starts_with(|c: char| c.is_ascii_alphanumeric())
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '~' | ':' | '-'))
}

/// `newest` as the hook wrote it: Unix seconds, `0` when no packaged file was found.
pub fn parse_newest(text: &str) -> Result<u64, String> {
    let t = text.trim();
    t.parse::<u64>()
        .map_err(|_| format!("`{}` is not a number of seconds", shown(t)))
}

/// The image's `SOURCE_DATE_EPOCH`: the newest file any package shipped, so no packaged file's
/// time moves (a `.pyc` is checked against its source's mtime), and never before the release.
/// Only a function of the recipe and the package versions, as the shipped files' times are
/// those of the packages' builds.
pub fn source_date_epoch(released: u64, newest_packaged: u64) -> u64 {
    released.max(newest_packaged)
}

fn shown(s: &str) -> String {
    nubo_core::file::escape_control(&s.chars().take(60).collect::<String>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_packages_maps_names_to_versions() {
        let p = parse_packages("apt\t2.6.1\nlibc6\t2.36-9+deb12u9\nsystemd\t252.33-1~deb12u1\n").unwrap();

        assert_eq!(p.len(), 3);
        assert_eq!(p["libc6"], "2.36-9+deb12u9");
    }

    #[test]
    fn parse_packages_epoch_version_accepted() {
        assert!(parse_packages("vim\t2:9.0.1378-2\n").is_ok());
    }

    #[test]
    fn parse_packages_hostile_lines_refused() {
        for text in [
            "",
            "apt 2.6.1\n",
            "apt\t\n",
            "Apt\t1\n",
            "apt\t1 2\n",
            "apt\t1\napt\t2\n",
            "apt\t\x1b[2J\n",
            "../x\t1\n",
        ] {
            assert!(parse_packages(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn parse_packages_error_escapes_control_characters() {
        let e = parse_packages("apt\t\x1b[2J\n").unwrap_err();

        assert!(!e.contains('\x1b'), "{e}");
    }

    #[test]
    fn parse_newest_number_accepted_garbage_refused() {
        assert_eq!(parse_newest("1733000000\n"), Ok(1_733_000_000));
        assert!(parse_newest("-1").is_err() && parse_newest("").is_err());
    }

    #[test]
    fn source_date_epoch_newest_package_wins_over_release() {
        assert_eq!(source_date_epoch(100, 200), 200);
    }

    #[test]
    fn source_date_epoch_never_before_release() {
        assert_eq!(source_date_epoch(100, 0), 100);
    }
}
