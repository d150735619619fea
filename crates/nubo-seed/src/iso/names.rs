//! File identifiers for both trees: level-1 8.3 names for the primary tree (which cloud-init
//! never looks at, but every reader expects) and UCS-2 big-endian names for the Joliet tree.

use crate::error::SeedError;

/// Joliet allows 128 bytes (64 UCS-2 units) per identifier.
pub(crate) const MAX_JOLIET_CHARS: usize = 64;
/// Characters Joliet forbids in identifiers, besides controls.
const JOLIET_FORBIDDEN: &[char] = &['*', '/', ':', ';', '?', '\\'];

/// The UCS-2 BE identifier, or why `name` cannot be one.
pub(crate) fn joliet(name: &str) -> Result<Vec<u8>, SeedError> {
    let fail = |why: &str| {
        Err(SeedError::InvalidFileName {
            name: name.to_owned(),
            why: why.to_owned(),
        })
    };
    if name.is_empty() || name == "." || name == ".." {
        return fail("a seed file needs a real name");
    }
    if let Some(c) = name.chars().find(|c| c.is_control() || JOLIET_FORBIDDEN.contains(c)) {
        return fail(&format!("Joliet names cannot contain `{}`", c.escape_debug()));
    }
    if name.ends_with('.') {
        return fail("Joliet names cannot end with `.`: Linux drops it, so the guest would see another name");
    }
    if name.chars().any(|c| c as u32 > 0xffff) {
        return fail("Joliet names are UCS-2: characters beyond U+FFFF cannot be stored");
    }
    let units: Vec<u16> = name.encode_utf16().collect();
    if units.len() > MAX_JOLIET_CHARS {
        return fail(&format!("Joliet names are at most {MAX_JOLIET_CHARS} characters"));
    }
    Ok(units.iter().flat_map(|u| u.to_be_bytes()).collect())
}

/// Level-1 identifiers (`USER_DAT.;1`) for `names`, unique, in the same order. A clash after
/// truncation gets a numeric tail (`USER_D01.;1`), as mkisofs does.
pub(crate) fn primary_all(names: &[&str]) -> Vec<Vec<u8>> {
    let mut taken: Vec<Vec<u8>> = Vec::with_capacity(names.len());
    for name in names {
        let (base, ext) = level1_parts(name);
        let mut id = identifier(&base, &ext);
        let mut n = 1u32;
        while taken.contains(&id) {
            let tail = format!("{n:02}");
            let keep = base.len().min(8 - tail.len().min(8));
            let numbered: String = base[..keep].to_owned() + &tail;
            id = identifier(&numbered, &ext);
            n += 1;
        }
        taken.push(id);
    }
    taken
}

fn identifier(base: &str, ext: &str) -> Vec<u8> {
    format!("{base}.{ext};1").into_bytes()
}

/// Base (<= 8) and extension (<= 3) in d-characters: upper-case letters, digits, `_`.
fn level1_parts(name: &str) -> (String, String) {
    let d_chars = |s: &str, max: usize| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_uppercase()
                } else {
                    '_'
                }
            })
            .take(max)
            .collect()
    };
    match name.rsplit_once('.') {
        Some((base, ext)) if !base.is_empty() => (d_chars(base, 8), d_chars(ext, 3)),
        _ => (d_chars(name, 8), String::new()),
    }
}

/// ECMA-119 9.3: records sort by name then extension, each padded with spaces.
pub(crate) fn primary_order(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    let split = |id: &[u8]| -> (Vec<u8>, Vec<u8>) {
        let id = id.split(|c| *c == b';').next().unwrap_or_default();
        let mut parts = id.splitn(2, |c| *c == b'.');
        let base = parts.next().unwrap_or_default().to_vec();
        let ext = parts.next().unwrap_or_default().to_vec();
        (base, ext)
    };
    let pad = |mut v: Vec<u8>, n: usize| {
        v.resize(n.max(v.len()), b' ');
        v
    };
    let ((ab, ae), (bb, be)) = (split(a), split(b));
    let n = ab.len().max(bb.len());
    let m = ae.len().max(be.len());
    (pad(ab, n), pad(ae, m)).cmp(&(pad(bb, n), pad(be, m)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primary_all_seed_names_are_level1() {
        let ids = primary_all(&["meta-data", "network-config", "user-data", "vendor-data"]);

        let ids: Vec<String> = ids.into_iter().map(|i| String::from_utf8(i).unwrap()).collect();
        assert_eq!(ids, ["META_DAT.;1", "NETWORK_.;1", "USER_DAT.;1", "VENDOR_D.;1"]);
    }

    #[test]
    fn primary_all_extension_is_kept_to_three() {
        let ids = primary_all(&["config.yaml"]);

        assert_eq!(ids[0], b"CONFIG.YAM;1");
    }

    #[test]
    fn primary_all_clash_gets_numeric_tail() {
        let ids = primary_all(&["user-data", "user-data2"]);

        assert_eq!(ids[1], b"USER_D01.;1");
    }

    #[test]
    fn joliet_seed_name_is_ucs2_be() {
        assert_eq!(joliet("ab").unwrap(), [0, b'a', 0, b'b']);
    }

    #[test]
    fn joliet_slash_is_refused() {
        assert!(joliet("a/b").is_err());
    }

    #[test]
    fn joliet_trailing_dot_is_refused() {
        assert!(joliet("a.").is_err());
    }

    #[test]
    fn joliet_astral_char_is_refused() {
        assert!(joliet("a\u{1f600}").is_err());
    }

    #[test]
    fn joliet_65_chars_is_refused() {
        assert!(joliet(&"a".repeat(65)).is_err());
    }

    #[test]
    fn primary_order_shorter_base_sorts_first() {
        assert_eq!(primary_order(b"AB.;1", b"AB_C.;1"), std::cmp::Ordering::Less);
    }
}
