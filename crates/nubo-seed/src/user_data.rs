//! Which user-data nubo passes to a guest: only what cloud-init would act on. Passing anything
//! else through means a VM that boots "fine" and silently ignores its configuration.

use yaml_rust2::{Yaml, YamlLoader};

use crate::error::SeedError;

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
/// cloud-init's other documented headers); a `#cloud-config` must be one YAML mapping, and a
/// syntax error names its line and column. Empty user-data is accepted: it means "none".
pub fn validate_user_data(bytes: &[u8]) -> Result<(), SeedError> {
    if bytes.is_empty() || bytes.starts_with(GZIP_MAGIC) {
        return Ok(());
    }
    if bytes.starts_with(UTF8_BOM) {
        return unsupported(
            "it starts with a UTF-8 byte-order mark, which hides its header from cloud-init: remove it",
        );
    }
    if OTHER_HEADERS.iter().any(|h| bytes.starts_with(h.as_bytes())) || is_mime(bytes) {
        return Ok(());
    }
    if bytes.starts_with(CLOUD_CONFIG.as_bytes()) {
        return validate_cloud_config(bytes);
    }
    let first_line = bytes.split(|b| *b == b'\n').next().unwrap_or_default();
    let shown: String = String::from_utf8_lossy(first_line).chars().take(40).collect();
    unsupported(&format!(
        "it starts with `{}`: begin it with `#cloud-config` (YAML) or `#!` (a script), or give a MIME multipart or gzip file",
        shown.trim_end()
    ))
}

fn unsupported(why: &str) -> Result<(), SeedError> {
    Err(SeedError::UnsupportedUserData { why: why.to_owned() })
}

fn is_mime(bytes: &[u8]) -> bool {
    MIME_HEADERS
        .iter()
        .any(|h| bytes.len() >= h.len() && bytes[..h.len()].eq_ignore_ascii_case(h.as_bytes()))
}

fn validate_cloud_config(bytes: &[u8]) -> Result<(), SeedError> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let (line, column) = line_column(bytes, e.valid_up_to());
        SeedError::InvalidCloudConfig {
            line,
            column,
            why: "the bytes here are not UTF-8".into(),
        }
    })?;
    let docs = YamlLoader::load_from_str(text).map_err(|e| SeedError::InvalidCloudConfig {
        line: e.marker().line(),
        column: e.marker().col() + 1,
        why: e.info().to_owned(),
    })?;
    let found = match docs.as_slice() {
        [] | [Yaml::Hash(_)] | [Yaml::Null] => return Ok(()),
        [Yaml::Array(_)] => "a list",
        [_] => "a single value",
        [..] => "several YAML documents",
    };
    Err(SeedError::UnsupportedUserData {
        why: format!("its `#cloud-config` top level is {found}: it must be one mapping of keys such as `runcmd:`"),
    })
}

/// 1-based line and column (in characters) of byte `offset`.
fn line_column(bytes: &[u8], offset: usize) -> (usize, usize) {
    let before = &bytes[..offset.min(bytes.len())];
    let line_start = before.iter().rposition(|b| *b == b'\n').map_or(0, |p| p + 1);
    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
    let column = String::from_utf8_lossy(&before[line_start..]).chars().count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cloud_config_error(bytes: &[u8]) -> (usize, usize) {
        match validate_user_data(bytes) {
            Err(SeedError::InvalidCloudConfig { line, column, .. }) => (line, column),
            other => panic!("expected InvalidCloudConfig, got {other:?}"),
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
    fn validate_user_data_plain_text_is_refused_naming_first_line() {
        let err = validate_user_data(b"hostname: a\n").unwrap_err();

        assert!(err.to_string().contains("`hostname: a`"), "{err}");
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

    #[test]
    fn line_column_second_line_counts_characters() {
        assert_eq!(line_column("a\né x".as_bytes(), 5), (2, 3));
    }
}
