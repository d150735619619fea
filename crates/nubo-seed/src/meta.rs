//! `meta-data`: the instance-id and local-hostname cloud-init's NoCloud datasource reads.

use nubo_core::file::escape_control;
use nubo_core::name;

use crate::error::SeedError;
use crate::yaml::{quote, scalar};

/// cloud-init makes `/var/lib/cloud/instances/<id>`: an id must be a safe, short file name.
const MAX_INSTANCE_ID: usize = 255;

/// Checks `h` as an RFC 1123 host name: [`nubo_core::name::NameKind::Hostname`], nubo's one
/// grammar for names. Non-ASCII names are refused rather than converted: the guest's `hostname`
/// needs the punycode form, and converting silently would make the name the user sees differ
/// from the VM's.
pub fn validate_hostname(h: &str) -> Result<(), SeedError> {
    match name::hostname_problem(h) {
        None => Ok(()),
        Some((hostname, why)) => Err(SeedError::InvalidHostname { hostname, why }),
    }
}

/// Checks an instance-id: cloud-init uses it as a directory name, so it is kept to a portable
/// file-name alphabet (a UUID, `iid-local01` or `i-0abc` all fit).
pub fn validate_instance_id(id: &str) -> Result<(), SeedError> {
    let fail = |why: String| {
        Err(SeedError::InvalidInstanceId {
            id: quote(id),
            why: escape_control(&why),
        })
    };
    if id.is_empty() {
        return fail("it is empty: use the VM's UUID".into());
    }
    if id.len() > MAX_INSTANCE_ID {
        return fail(format!(
            "it is {} bytes long, over the limit of {MAX_INSTANCE_ID}",
            id.len()
        ));
    }
    if id == "." || id == ".." {
        return fail("it is a directory name cloud-init cannot use".into());
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':')))
    {
        return fail(format!(
            "`{}` is not allowed: use letters, digits and `.`, `_`, `-`, `:`",
            c.escape_debug()
        ));
    }
    Ok(())
}

/// `instance-id: <id>\nlocal-hostname: <h>\n`, each value validated and YAML-quoted when needed.
/// An empty `local_hostname` leaves the line out, so the image keeps its own hostname (what
/// cloud-localds does without a meta-data file); nubo's engine always gives one.
pub fn render_meta_data(instance_id: &str, local_hostname: &str) -> Result<Vec<u8>, SeedError> {
    validate_instance_id(instance_id)?;
    let mut out = format!("instance-id: {}\n", scalar(instance_id));
    if !local_hostname.is_empty() {
        validate_hostname(local_hostname)?;
        out.push_str(&format!("local-hostname: {}\n", scalar(local_hostname)));
    }
    Ok(out.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_meta_data_plain_values_match_contract() {
        let md = render_meta_data("iid-local01", "web-1").unwrap();

        assert_eq!(md, b"instance-id: iid-local01\nlocal-hostname: web-1\n");
    }

    #[test]
    fn render_meta_data_uuid_starting_with_digit_is_quoted() {
        let md = render_meta_data("0e9c1c5e-6f43-4a4b-9d0e-1a2b3c4d5e6f", "h").unwrap();

        assert_eq!(
            md,
            b"instance-id: \"0e9c1c5e-6f43-4a4b-9d0e-1a2b3c4d5e6f\"\nlocal-hostname: h\n"
        );
    }

    #[test]
    fn render_meta_data_numeric_hostname_is_quoted() {
        let md = render_meta_data("i", "123").unwrap();

        assert_eq!(md, b"instance-id: i\nlocal-hostname: \"123\"\n");
    }

    #[test]
    fn render_meta_data_empty_hostname_omits_line() {
        let md = render_meta_data("i", "").unwrap();

        assert_eq!(md, b"instance-id: i\n");
    }

    #[test]
    fn validate_hostname_non_ascii_is_refused_with_punycode_hint() {
        let err = validate_hostname("café").unwrap_err();

        assert!(err.to_string().contains("punycode"), "{err}");
    }

    #[test]
    fn validate_hostname_escape_sequence_is_quoted_escaped() {
        let err = validate_hostname("a\x1b[2Jb").unwrap_err();

        let msg = err.to_string();
        assert!(!msg.contains('\x1b') && msg.contains("a\\u{1b}[2Jb"), "{msg}");
    }

    #[test]
    fn validate_hostname_option_shaped_is_refused() {
        let err = validate_hostname("-oProxyCommand=x").unwrap_err();

        assert!(err.to_string().contains("contains '='"), "{err}");
    }

    #[test]
    fn validate_hostname_bidi_override_is_quoted_escaped() {
        let err = validate_hostname("ab\u{202e}cd").unwrap_err();

        assert!(!err.to_string().contains('\u{202e}'), "{err}");
    }

    #[test]
    fn validate_hostname_fqdn_is_accepted() {
        assert!(validate_hostname("web-1.example.org").is_ok());
    }

    #[test]
    fn validate_hostname_underscore_is_refused() {
        assert!(validate_hostname("web_1").is_err());
    }

    #[test]
    fn validate_hostname_trailing_dot_is_refused() {
        assert!(validate_hostname("web.").is_err());
    }

    #[test]
    fn validate_hostname_leading_hyphen_is_refused() {
        assert!(validate_hostname("-web").is_err());
    }

    #[test]
    fn validate_hostname_long_label_is_refused() {
        assert!(validate_hostname(&"a".repeat(64)).is_err());
    }

    #[test]
    fn validate_hostname_empty_is_refused() {
        assert!(validate_hostname("").is_err());
    }

    #[test]
    fn validate_instance_id_slash_is_refused() {
        assert!(validate_instance_id("a/b").is_err());
    }

    #[test]
    fn validate_instance_id_newline_is_refused() {
        assert!(validate_instance_id("a\nlocal-hostname: evil").is_err());
    }

    #[test]
    fn validate_instance_id_dotdot_is_refused() {
        assert!(validate_instance_id("..").is_err());
    }
}
