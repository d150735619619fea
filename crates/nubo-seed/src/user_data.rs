//! Which user-data nubo passes to a guest: only what cloud-init would act on. Passing anything
//! else through means a VM that boots "fine" and silently ignores its configuration.

use crate::error::SeedError;
use crate::yaml::{check_bounded, Limits, TopLevel};

const CLOUD_CONFIG: &str = "#cloud-config";
const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
const UTF8_BOM: &[u8] = &[0xef, 0xbb, 0xbf];

/// Headers of cloud-init's other documented user-data formats, passed through unchecked.
const OTHER_HEADERS: &[&str] = &[
    "#!",
    "#include",
    "#cloud-boothook",
    "#part-handler",
    "#cloud-config-archive",
    "#cloud-config-jsonp",
    "## template: jinja",
];

/// MIME multipart starts with one of these headers (matched without regard to case).
const MIME_HEADERS: &[&str] = &["content-type:", "mime-version:"];

/// Refuses user-data that is not `#cloud-config`, a `#!` script, MIME multipart or gzip (or one of
/// cloud-init's other documented headers); a `#cloud-config` must be one YAML mapping within
/// [`Limits::DEFAULT`], and a refusal names its line and column. Empty user-data is accepted: it
/// means "none".
pub fn validate_user_data(bytes: &[u8]) -> Result<(), SeedError> {
    validate_payload(bytes, "user-data")
}

/// vendor-data goes through the same handlers as user-data in cloud-init, so the same rules.
pub fn validate_vendor_data(bytes: &[u8]) -> Result<(), SeedError> {
    validate_payload(bytes, "vendor-data")
}

/// A network-config must be one YAML mapping (`version: 1` or `2`, or under `network:`) within
/// [`Limits::DEFAULT`]; empty means "none".
pub fn validate_network_config(bytes: &[u8]) -> Result<(), SeedError> {
    let docs = check_bounded(bytes, &Limits::DEFAULT).map_err(|e| SeedError::yaml("network-config", e))?;
    match top_level(&docs) {
        None => Ok(()),
        Some(found) => Err(SeedError::InvalidNetworkConfig {
            why: format!("its top level is {found}: it must be one mapping such as `version: 2`"),
        }),
    }
}

fn validate_payload(bytes: &[u8], what: &'static str) -> Result<(), SeedError> {
    if bytes.is_empty() || bytes.starts_with(GZIP_MAGIC) {
        return Ok(());
    }
    if bytes.starts_with(UTF8_BOM) {
        return unsupported(
            what,
            "it starts with a UTF-8 byte-order mark, which hides its header from cloud-init: remove it".into(),
        );
    }
    if OTHER_HEADERS.iter().any(|h| bytes.starts_with(h.as_bytes())) || is_mime(bytes) {
        return Ok(());
    }
    if bytes.starts_with(CLOUD_CONFIG.as_bytes()) {
        return validate_cloud_config(bytes, what);
    }
    // The line itself is never quoted: a file named by mistake may be a secret (`/etc/shadow`).
    unsupported(
        what,
        "its line 1 is no header cloud-init acts on: begin it with `#cloud-config` (YAML) or `#!` (a script), or give a MIME multipart or gzip file".into(),
    )
}

fn unsupported(what: &'static str, why: String) -> Result<(), SeedError> {
    Err(SeedError::UnsupportedUserData { what, why })
}

fn is_mime(bytes: &[u8]) -> bool {
    MIME_HEADERS
        .iter()
        .any(|h| bytes.len() >= h.len() && bytes[..h.len()].eq_ignore_ascii_case(h.as_bytes()))
}

fn validate_cloud_config(bytes: &[u8], what: &'static str) -> Result<(), SeedError> {
    let shown = match what {
        "vendor-data" => "vendor-data `#cloud-config`",
        _ => "user-data `#cloud-config`",
    };
    let docs = check_bounded(bytes, &Limits::DEFAULT).map_err(|e| SeedError::yaml(shown, e))?;
    match top_level(&docs) {
        None => Ok(()),
        Some(found) => unsupported(
            what,
            format!("its `#cloud-config` top level is {found}: it must be one mapping of keys such as `runcmd:`"),
        ),
    }
}

/// What is wrong with a document list that should be one mapping (or nothing), in words.
fn top_level(docs: &[TopLevel]) -> Option<&'static str> {
    match docs {
        [] | [TopLevel::Mapping] | [TopLevel::Null] => None,
        [TopLevel::Sequence] => Some("a list"),
        [_] => Some("a single value"),
        [..] => Some("several YAML documents"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cloud_config_error(bytes: &[u8]) -> (usize, usize) {
        match validate_user_data(bytes) {
            Err(SeedError::InvalidYaml { line, column, .. }) => (line, column),
            other => panic!("expected InvalidYaml, got {other:?}"),
        }
    }

    #[test]
    fn validate_user_data_cloud_config_mapping_is_accepted() {
        assert!(validate_user_data(b"#cloud-config\nruncmd:\n  - [touch, /x]\nmode: 0644\n").is_ok());
    }

    #[test]
    fn validate_user_data_header_only_is_accepted() {
        assert!(validate_user_data(b"#cloud-config\n").is_ok());
    }

    #[test]
    fn validate_user_data_crlf_cloud_config_is_accepted() {
        assert!(validate_user_data(b"#cloud-config\r\nhostname: a\r\n").is_ok());
    }

    #[test]
    fn validate_user_data_empty_is_accepted() {
        assert!(validate_user_data(b"").is_ok());
    }

    #[test]
    fn validate_user_data_script_is_accepted() {
        assert!(validate_user_data(b"#!/bin/sh\necho hi\n").is_ok());
    }

    #[test]
    fn validate_user_data_gzip_is_accepted() {
        assert!(validate_user_data(&[0x1f, 0x8b, 8, 0]).is_ok());
    }

    #[test]
    fn validate_user_data_mime_is_accepted() {
        assert!(validate_user_data(b"Content-Type: multipart/mixed; boundary=\"x\"\nMIME-Version: 1.0\n").is_ok());
    }

    #[test]
    fn validate_user_data_lowercase_mime_is_accepted() {
        assert!(validate_user_data(b"mime-version: 1.0\n").is_ok());
    }

    #[test]
    fn validate_user_data_plain_text_is_refused_naming_line_not_quoting_it() {
        let err = validate_user_data(b"root:$6$SECRETMARKER:19000::\n").unwrap_err();

        assert!(err.to_string().contains("line 1"), "{err}");
        assert!(!err.to_string().contains("SECRETMARKER"), "{err}");
    }

    #[test]
    fn validate_user_data_bom_is_refused() {
        let err = validate_user_data(b"\xef\xbb\xbf#cloud-config\n").unwrap_err();

        assert!(err.to_string().contains("byte-order mark"), "{err}");
    }

    #[test]
    fn validate_user_data_bad_yaml_names_line_and_column() {
        let pos = cloud_config_error(b"#cloud-config\nruncmd:\n  - a\nb: c: d\n");

        assert_eq!(pos, (4, 5));
    }

    #[test]
    fn validate_user_data_unclosed_quote_names_line() {
        let pos = cloud_config_error(b"#cloud-config\nhostname: \"abc\nx: 1\n");

        assert_eq!(pos.0, 2);
    }

    #[test]
    fn validate_user_data_tab_indent_names_line() {
        let pos = cloud_config_error(b"#cloud-config\nruncmd:\n\t- a\n");

        assert_eq!(pos.0, 3);
    }

    #[test]
    fn validate_user_data_non_utf8_names_position() {
        let pos = cloud_config_error(b"#cloud-config\nab: \xff\n");

        assert_eq!(pos, (2, 5));
    }

    #[test]
    fn validate_user_data_top_level_list_is_refused() {
        let err = validate_user_data(b"#cloud-config\n- a\n").unwrap_err();

        assert!(err.to_string().contains("a list"), "{err}");
    }

    /// Regression (issue 9): a 373-byte user-data of nested aliases took 17 GB in 60 s.
    #[test]
    fn validate_user_data_billion_laughs_is_refused() {
        let mut bomb = String::from("#cloud-config\na: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
        for (prev, name) in ["a", "b", "c", "d", "e", "f", "g", "h"]
            .iter()
            .zip(["b", "c", "d", "e", "f", "g", "h", "i"])
        {
            bomb.push_str(&format!(
                "{name}: &{name} [{}]\n",
                vec![format!("*{prev}"); 9].join(", ")
            ));
        }

        let err = validate_user_data(bomb.as_bytes()).unwrap_err();

        assert!(err.to_string().contains("alias bomb"), "{err}");
    }

    #[test]
    fn validate_user_data_escape_sequence_in_first_line_is_not_printed() {
        let err = validate_user_data(b"\x1b]0;owned\x07hi\n").unwrap_err();

        let msg = err.to_string();
        assert!(!msg.contains('\x1b') && !msg.contains("owned"), "{msg}");
    }

    #[test]
    fn validate_vendor_data_plain_text_is_refused_naming_vendor_data() {
        let err = validate_vendor_data(b"hello\n").unwrap_err();

        assert!(err.to_string().starts_with("vendor-data "), "{err}");
    }

    #[test]
    fn validate_network_config_v2_mapping_is_accepted() {
        assert!(validate_network_config(b"version: 2\nethernets: {}\n").is_ok());
    }

    #[test]
    fn validate_network_config_list_is_refused() {
        let err = validate_network_config(b"- version: 2\n").unwrap_err();

        assert!(err.to_string().contains("a list"), "{err}");
    }

    #[test]
    fn validate_network_config_deep_nesting_is_refused() {
        let text = format!("version: 2\nx: {}{}\n", "[".repeat(200), "]".repeat(200));

        let err = validate_network_config(text.as_bytes()).unwrap_err();

        assert!(err.to_string().contains("nest deeper than 128"), "{err}");
    }
}
