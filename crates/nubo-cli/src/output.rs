//! Listings: aligned tables for people, `-o json` for programs.

use std::io::{self, Write};

use clap::ValueEnum;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Format {
    #[default]
    Table,
    Json,
}

/// Prints `rows` under `header`, columns padded to their widest cell.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) -> io::Result<()> {
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

pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    // Serialised first so a closed stdout surfaces as an io::Error (which `main` treats as a
    // clean exit), not hidden inside a serde_json::Error.
    let mut text = serde_json::to_vec_pretty(value)?;
    text.push(b'\n');
    io::stdout().lock().write_all(&text)?;
    Ok(())
}
