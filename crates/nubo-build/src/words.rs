//! Splitting an instruction's arguments into words: whitespace separates them, `"..."` and
//! `'...'` group, `\` escapes the next character outside single quotes. Pure.

/// The words of `s`, or why it cannot be split (an unclosed quote).
pub fn split(s: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => cur.push(c),
                        None => return Err("a single quote is not closed".into()),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c) => cur.push(c),
                            None => return Err("a double quote is not closed".into()),
                        },
                        Some(c) => cur.push(c),
                        None => return Err("a double quote is not closed".into()),
                    }
                }
            }
            '\\' => {
                in_word = true;
                if let Some(c) = chars.next() {
                    cur.push(c);
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

/// `s` quoted for a POSIX shell: one word whatever it holds.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:@+,".contains(&b))
    {
        return s.to_owned();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_quotes_group_words() {
        assert_eq!(split(r#"a "b c" 'd e' f\ g"#).unwrap(), vec!["a", "b c", "d e", "f g"]);
    }

    #[test]
    fn split_empty_quotes_are_a_word() {
        assert_eq!(split(r#"K="""#).unwrap(), vec!["K="]);
    }

    #[test]
    fn split_unclosed_quote_is_an_error() {
        assert!(split("a 'b").is_err());
    }

    #[test]
    fn shell_quote_escapes_single_quotes() {
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("plain"), "plain");
        assert_eq!(shell_quote(""), "''");
    }
}
