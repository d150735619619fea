//! Listings: aligned tables for people, `-o json` for programs.

use std::io::{self, Write};

use clap::ValueEnum;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Format {
    #[default]
    Table,
    Json,
}

/// Prints `rows` under `header`, columns padded to their widest cell. Every cell is shown on
/// one line with its control characters escaped: names and descriptions read back from disk
/// (a snapshot's, an image's) can hold anything, and must not move the cursor or add rows.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) -> io::Result<()> {
    let rows: Vec<Vec<String>> = rows.iter().map(|r| r.iter().map(|c| one_line(c)).collect()).collect();
    let rows = &rows;
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = io::stdout().lock();
    let line = |out: &mut dyn Write, cells: &mut dyn Iterator<Item = &str>| -> io::Result<()> {
        let cells: Vec<&str> = cells.collect();
        let last = cells.len().saturating_sub(1);
        for (i, cell) in cells.iter().enumerate() {
            if i == last {
                write!(out, "{cell}")?;
            } else {
                write!(out, "{cell:<w$}   ", w = widths[i])?;
            }
        }
        writeln!(out)
    };
    line(&mut out, &mut header.iter().copied())?;
    for row in rows {
        line(&mut out, &mut row.iter().map(String::as_str))?;
    }
    out.flush()
}

/// `cell` with every control character (newlines and tabs too) and bidirectional override
/// escaped, as Rust writes them.
fn one_line(cell: &str) -> String {
    let mut out = String::with_capacity(cell.len());
    for c in cell.chars() {
        match c {
            c if c.is_control() => out.extend(c.escape_default()),
            // Bidirectional overrides reorder what the terminal shows (Trojan Source).
            '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => out.extend(c.escape_unicode()),
            c => out.push(c),
        }
    }
    out
}

pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    // Serialised first so a closed stdout surfaces as an io::Error (which `main` treats as a
    // clean exit), not hidden inside a serde_json::Error.
    let mut text = serde_json::to_vec_pretty(value)?;
    text.push(b'\n');
    io::stdout().lock().write_all(&text)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_escapes_controls_newlines_and_bidi() {
        assert_eq!(one_line("a\nb\tc\x1b[2J\u{202e}d"), "a\\nb\\tc\\u{1b}[2J\\u{202e}d");
    }

    #[test]
    fn one_line_keeps_printable_text() {
        assert_eq!(one_line("snap-1 \"x\" é"), "snap-1 \"x\" é");
    }
}
