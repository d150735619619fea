//! Emitting YAML scalars safely. nubo writes YAML (meta-data, generated `#cloud-config`) but never
//! re-serialises user YAML, so a tiny emitter with one rule beats a YAML serialiser dependency:
//! a value is written plain only when no YAML 1.1 reader (cloud-init uses PyYAML) could read it as
//! anything but that string; otherwise it is double-quoted with escapes.

/// Words YAML 1.1 resolves to booleans or null when plain.
const YAML11_KEYWORDS: &[&str] = &["y", "yes", "n", "no", "true", "false", "on", "off", "null", "~"];

/// `value` as a YAML scalar that reads back as exactly `value`.
pub(crate) fn scalar(value: &str) -> String {
    if is_plain_safe(value) {
        return value.to_owned();
    }
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            // Line separators and BOMs break lines or vanish in some readers: escape them too.
            c if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{feff}') => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A letter first rules out numbers, dates, sexagesimals and indicators; the rest are keywords.
fn is_plain_safe(value: &str) -> bool {
    let mut chars = value.chars();
    let first_is_letter = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    first_is_letter
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && !YAML11_KEYWORDS.iter().any(|k| k.eq_ignore_ascii_case(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_simple_name_is_plain() {
        assert_eq!(scalar("ubuntu-01.example"), "ubuntu-01.example");
    }

    #[test]
    fn scalar_number_like_is_quoted() {
        assert_eq!(scalar("0644"), "\"0644\"");
    }

    #[test]
    fn scalar_yaml11_bool_is_quoted() {
        assert_eq!(scalar("Yes"), "\"Yes\"");
    }

    #[test]
    fn scalar_quotes_backslash_and_newline_are_escaped() {
        assert_eq!(scalar("a\"b\\c\nd"), "\"a\\\"b\\\\c\\nd\"");
    }

    #[test]
    fn scalar_space_and_colon_are_quoted() {
        assert_eq!(scalar("ssh-ed25519 AAAA x@y"), "\"ssh-ed25519 AAAA x@y\"");
    }

    #[test]
    fn scalar_empty_is_quoted() {
        assert_eq!(scalar(""), "\"\"");
    }
}
