//! Text bound for the terminal: what nubo prints about user input never drives it. Names are
//! quoted escaped where they are checked (`nubo_core::name::quote`); this is the last line of
//! defence for the messages that quote input some other way (paths, clap's usage errors).

/// `text` with every control character but the line breaks and tabs of the message itself
/// escaped, and each argument in `argv` that holds a control character (a newline in a file
/// name, say) replaced by its quoted form, so its newline cannot start a forged line.
pub fn sanitize(text: &str, argv: &[String]) -> String {
    let mut text = text.to_owned();
    for a in argv {
        if a.chars().any(char::is_control) {
            text = text.replace(a.as_str(), &nubo_core::name::quote(a));
        }
    }
    nubo_core::file::escape_control(&text)
}

/// The program's arguments as text (lossily: a non-UTF-8 argument cannot match UTF-8 output).
pub fn argv() -> Vec<String> {
    std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_escape_sequence_is_escaped() {
        assert_eq!(sanitize("error: `a\x1b[31mb`\n", &[]), "error: `a\\u{1b}[31mb`\n");
    }

    #[test]
    fn sanitize_newline_inside_argument_is_escaped_message_newline_kept() {
        let argv = vec!["nubo".to_owned(), "m\nforged".to_owned()];

        let shown = sanitize("error: reading m\nforged: not found\n  hint", &argv);

        assert_eq!(shown, "error: reading m\\nforged: not found\n  hint");
    }

    #[test]
    fn sanitize_osc_sequence_is_escaped() {
        assert!(!sanitize("x\x1b]0;title\x07y", &[]).contains(['\x1b', '\x07']));
    }
}
