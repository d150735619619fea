//! The VMfile parser: pure, line-numbered errors, `#` comments, `\` continuations, exec (JSON
//! array) and shell forms. Every limit here exists so hostile text cannot make nubo spend
//! unbounded memory or time.

use nubo_core::ByteSize;

use crate::vmfile::{Command, FromSource, Instruction, Op, VmFile};
use crate::words::split;

/// A VMfile larger than this is not a build recipe.
pub const MAX_VMFILE: usize = 1 << 20;
/// More instructions than this is not a build recipe either (and each is a cache layer).
pub const MAX_INSTRUCTIONS: usize = 1000;
/// QEMU's own vCPU ceiling for the machines nubo uses.
const MAX_VCPUS: u32 = 1024;

/// A problem in a VMfile, at the line its instruction starts on (0: the file as a whole).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", if *.line > 0 { format!("line {}: ", .line) } else { String::new() })]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

fn err<T>(line: usize, message: impl Into<String>) -> Result<T, ParseError> {
    Err(ParseError {
        line,
        message: message.into(),
    })
}

/// Parses VMfile bytes: UTF-8 without NUL, at most [`MAX_VMFILE`].
pub fn parse_bytes(bytes: &[u8]) -> Result<VmFile, ParseError> {
    if bytes.len() > MAX_VMFILE {
        return err(0, format!("the VMfile is {} bytes, more than the {MAX_VMFILE} nubo reads: split the work into fewer, longer RUN steps or a script COPYed in", bytes.len()));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| ParseError {
        line: line_of(bytes, e.valid_up_to()),
        message: "the VMfile is not UTF-8 text".into(),
    })?;
    parse(text)
}

fn line_of(bytes: &[u8], offset: usize) -> usize {
    bytes[..offset.min(bytes.len())].iter().filter(|&&b| b == b'\n').count() + 1
}

/// Joins continuation lines and drops comments and blank lines: `(first line, text)` per
/// instruction.
fn logical_lines(text: &str) -> Result<Vec<(usize, String)>, ParseError> {
    let mut out: Vec<(usize, String)> = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        if raw.contains('\0') {
            return err(n, "the line holds a NUL byte: a VMfile is text");
        }
        let trimmed = raw.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && pending.is_none()) {
            // A comment inside a continuation is skipped too, as in a Dockerfile.
            continue;
        }
        let (body, continues) = match trimmed.strip_suffix('\\') {
            Some(b) => (b, true),
            None => (trimmed, false),
        };
        let (start, mut acc) = pending.take().unwrap_or((n, String::new()));
        if !acc.is_empty() && !body.is_empty() {
            acc.push(' ');
        }
        acc.push_str(body.trim_end());
        if continues {
            pending = Some((start, acc));
        } else if !acc.trim().is_empty() {
            out.push((start, acc));
        }
        if out.len() > MAX_INSTRUCTIONS {
            return err(
                start,
                format!("more than {MAX_INSTRUCTIONS} instructions: join RUN steps with `&&`"),
            );
        }
    }
    if let Some((start, _)) = pending {
        return err(
            start,
            "the last instruction ends with `\\` but no line follows it: remove the trailing backslash",
        );
    }
    Ok(out)
}

/// Parses a VMfile. FROM comes first and exactly once; SIZE comes before any step that writes.
pub fn parse(text: &str) -> Result<VmFile, ParseError> {
    if text.len() > MAX_VMFILE {
        return parse_bytes(text.as_bytes());
    }
    let mut instructions: Vec<Instruction> = Vec::new();
    let mut from: Option<FromSource> = None;
    let mut first_write: Option<(usize, &'static str)> = None;
    for (line, text) in logical_lines(text)? {
        let (keyword, rest) = match text.split_once(char::is_whitespace) {
            Some((k, r)) => (k, r.trim()),
            None => (text.as_str(), ""),
        };
        let op = instruction(line, keyword, rest)?;
        match (&op, instructions.is_empty()) {
            (Op::From(f), true) => from = Some(f.clone()),
            (Op::From(_), false) => {
                return err(
                    line,
                    "a second FROM: a VMfile builds one image from exactly one FROM, its first instruction",
                )
            }
            (other, true) => {
                return err(
                    line,
                    format!("{} before FROM: a VMfile starts with `FROM <image>`", other.keyword()),
                )
            }
            _ => {}
        }
        if let Op::Size(_) = op {
            if let Some((at, kw)) = first_write {
                return err(line, format!("SIZE after {kw} (line {at}): the disk must grow before any step writes to it, since growing after the disk filled is too late: move SIZE above line {at}"));
            }
        }
        if op.writes() && first_write.is_none() {
            first_write = Some((line, op.keyword()));
        }
        let once = matches!(
            op,
            Op::Size(_) | Op::CloudInit(_) | Op::Hypervisor(_) | Op::Defaults { .. } | Op::Appliance
        );
        if once {
            if let Some(prev) = instructions.iter().find(|i| i.op.keyword() == op.keyword()) {
                return err(
                    line,
                    format!(
                        "a second {} (the first is on line {}): give it once",
                        op.keyword(),
                        prev.line
                    ),
                );
            }
        }
        instructions.push(Instruction { line, text, op });
    }
    let Some(from) = from else {
        return err(0, "the VMfile has no instructions: it needs at least `FROM <image>`");
    };
    let appliance = instructions.iter().find(|i| i.op == Op::Appliance);
    let cloud = instructions.iter().find(|i| matches!(i.op, Op::CloudInit(_)));
    if let (Some(a), Some(c)) = (appliance, cloud) {
        return err(
            c.line,
            format!(
                "CLOUDINIT with APPLIANCE (line {}): an appliance has no cloud-init to read it; remove one of them",
                a.line
            ),
        );
    }
    Ok(VmFile { from, instructions })
}

fn instruction(line: usize, keyword: &str, rest: &str) -> Result<Op, ParseError> {
    let kw = keyword.to_ascii_uppercase();
    let need = |what: &str| -> Result<(), ParseError> {
        if rest.is_empty() {
            return err(line, format!("{kw} needs {what}"));
        }
        Ok(())
    };
    let words = || {
        split(rest).map_err(|m| ParseError {
            line,
            message: format!("{kw}: {m}"),
        })
    };
    match kw.as_str() {
        "FROM" => {
            need("an image: `FROM debian:12` or `FROM <url> CHECKSUM sha256:<hex>`")?;
            let w = words()?;
            match w.as_slice() {
                [r] if r.starts_with("oci://") => {
                    let reference = &r["oci://".len()..];
                    if reference.is_empty() || !reference.contains('/') {
                        return err(line, format!("FROM {r}: name the container image as `oci://REGISTRY/REPO@sha256:<hex>`"));
                    }
                    Ok(Op::From(FromSource::Container { reference: reference.to_owned() }))
                }
                [r] if r.contains("://") => err(line, format!("FROM {r}: a URL needs its checksum: `FROM {r} CHECKSUM sha256:<hex>`")),
                [r] => Ok(Op::From(FromSource::Image { reference: r.clone() })),
                [u, c, sum] if c.eq_ignore_ascii_case("CHECKSUM") => {
                    if !u.starts_with("https://") && !u.starts_with("http://") {
                        return err(line, format!("FROM {u}: only http(s) URLs take a CHECKSUM"));
                    }
                    check_checksum(line, sum)?;
                    Ok(Op::From(FromSource::Url { url: u.clone(), checksum: sum.clone() }))
                }
                _ => err(line, "FROM takes one image, or `<url> CHECKSUM sha256:<hex>`"),
            }
        }
        "SIZE" => {
            need("a disk size such as `20G`")?;
            let s = ByteSize::parse(rest).map_err(|e| ParseError { line, message: format!("SIZE: {e}") })?;
            if s.bytes() < nubo_core::size::MIB {
                return err(line, format!("SIZE {rest} is smaller than 1M: give the disk's whole size, e.g. `20G`"));
            }
            Ok(Op::Size(s))
        }
        "CLOUDINIT" => {
            need("a cloud-config file of the build context")?;
            let w = words()?;
            let [p] = w.as_slice() else {
                return err(line, "CLOUDINIT takes one file of the build context");
            };
            check_context_path(line, "CLOUDINIT", p)?;
            Ok(Op::CloudInit(p.clone()))
        }
        "RUN" => {
            need("a command")?;
            Ok(Op::Run(command(line, rest)?))
        }
        "COPY" => {
            need("sources and a destination: `COPY file dir/ /guest/path`")?;
            let w = match exec_form(line, "COPY", rest)? {
                Some(w) => w,
                None => words()?,
            };
            if w.len() < 2 {
                return err(line, "COPY needs at least one source and a destination");
            }
            let (dest, sources) = w.split_last().expect("checked: two or more words");
            for s in sources {
                check_context_path(line, "COPY", s)?;
            }
            if !dest.starts_with('/') && !dest.contains('$') {
                return err(line, format!("COPY destination `{dest}` is relative: give an absolute path in the guest"));
            }
            check_guest_path(line, dest)?;
            Ok(Op::Copy { sources: sources.to_vec(), dest: dest.clone() })
        }
        "ENV" => {
            need("`KEY=value`")?;
            let w = words()?;
            let pairs = if w.len() == 2 && !w[0].contains('=') {
                // The legacy form `ENV KEY value`.
                vec![(w[0].clone(), w[1].clone())]
            } else {
                key_values(line, "ENV", &w)?
            };
            for (k, _) in &pairs {
                check_var(line, "ENV", k)?;
            }
            Ok(Op::Env(pairs))
        }
        "ARG" => {
            need("a name, `ARG NAME` or `ARG NAME=default`")?;
            let w = words()?;
            let [a] = w.as_slice() else {
                return err(line, "ARG takes one `NAME` or `NAME=default`");
            };
            let (name, default) = match a.split_once('=') {
                Some((n, d)) => (n.to_owned(), Some(d.to_owned())),
                None => (a.clone(), None),
            };
            check_var(line, "ARG", &name)?;
            Ok(Op::Arg { name, default })
        }
        "LABEL" => {
            need("`key=value`")?;
            let pairs = key_values(line, "LABEL", &words()?)?;
            for (k, _) in &pairs {
                let ok = k.len() <= 128 && k.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b));
                if !ok {
                    return err(line, format!("LABEL key `{}` is not letters, digits, `.`, `_`, `-` and `/` (at most 128)", nubo_core::file::escape_control(k)));
                }
            }
            Ok(Op::Label(pairs))
        }
        "HYPERVISOR" => {
            need("a backend: `qemu`, `libvirt` or `cloud-hypervisor`")?;
            let ok = rest.len() <= 32 && rest.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !ok {
                return err(line, format!("HYPERVISOR `{}` is not a backend name: use `qemu`, `libvirt` or `cloud-hypervisor`", nubo_core::file::escape_control(rest)));
            }
            Ok(Op::Hypervisor(rest.to_owned()))
        }
        "DEFAULTS" => {
            need("`vcpus=N` and/or `memory=SIZE`")?;
            let mut vcpus = None;
            let mut memory = None;
            for (k, v) in key_values(line, "DEFAULTS", &words()?)? {
                match k.as_str() {
                    "vcpus" => {
                        let n: u32 = v.parse().ok().filter(|n| (1..=MAX_VCPUS).contains(n)).ok_or_else(|| ParseError {
                            line,
                            message: format!("DEFAULTS vcpus=`{v}` is not a whole number from 1 to {MAX_VCPUS}"),
                        })?;
                        vcpus = Some(n);
                    }
                    "memory" => {
                        let m = ByteSize::parse(&v).map_err(|e| ParseError { line, message: format!("DEFAULTS memory: {e}") })?;
                        if m.bytes() < 64 * nubo_core::size::MIB {
                            return err(line, format!("DEFAULTS memory={v} is less than 64M, which no cloud image boots in"));
                        }
                        memory = Some(m);
                    }
                    other => return err(line, format!("DEFAULTS has no key `{}`: use vcpus=N and memory=SIZE", nubo_core::file::escape_control(other))),
                }
            }
            Ok(Op::Defaults { vcpus, memory })
        }
        "APPLIANCE" => {
            if !rest.is_empty() {
                return err(line, "APPLIANCE takes no arguments");
            }
            Ok(Op::Appliance)
        }
        "ADD" | "CMD" | "ENTRYPOINT" | "WORKDIR" | "USER" | "EXPOSE" | "VOLUME" => err(
            line,
            format!("{kw} is a Dockerfile instruction a VMfile does not have: use RUN, COPY, ENV, CLOUDINIT (first-boot behaviour) instead"),
        ),
        _ => err(
            line,
            format!(
                "unknown instruction `{}`: a VMfile has FROM, SIZE, CLOUDINIT, RUN, COPY, ENV, ARG, LABEL, HYPERVISOR, DEFAULTS and APPLIANCE",
                nubo_core::file::escape_control(keyword)
            ),
        ),
    }
}

/// `RUN ["a", "b"]` is the exec form when it parses as a JSON array of strings; anything else
/// is shell form, as in a Dockerfile.
fn command(line: usize, rest: &str) -> Result<Command, ParseError> {
    Ok(match exec_form(line, "RUN", rest)? {
        Some(argv) => Command::Exec(argv),
        None => Command::Shell(rest.to_owned()),
    })
}

fn exec_form(line: usize, kw: &str, rest: &str) -> Result<Option<Vec<String>>, ParseError> {
    if !rest.starts_with('[') {
        return Ok(None);
    }
    match serde_json::from_str::<Vec<String>>(rest) {
        Ok(v) if v.is_empty() => err(line, format!("{kw} [] is empty: give the program and its arguments")),
        Ok(v) => Ok(Some(v)),
        Err(_) => Ok(None),
    }
}

fn key_values(line: usize, kw: &str, words: &[String]) -> Result<Vec<(String, String)>, ParseError> {
    words
        .iter()
        .map(|w| match w.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
            _ => err(
                line,
                format!("{kw}: `{}` is not `key=value`", nubo_core::file::escape_control(w)),
            ),
        })
        .collect()
}

/// An environment variable name, as POSIX shells accept it: [`nubo_core::name::NameKind::BuildArg`].
fn check_var(line: usize, kw: &str, name: &str) -> Result<(), ParseError> {
    if nubo_core::name::check(nubo_core::name::NameKind::BuildArg, name).is_err() {
        return err(
            line,
            format!(
                "{kw} name `{}` is not a variable name (letters, digits and `_`, not starting with a digit)",
                nubo_core::name::quote(name)
            ),
        );
    }
    Ok(())
}

fn check_checksum(line: usize, sum: &str) -> Result<(), ParseError> {
    let ok = sum
        .strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    if !ok {
        return err(
            line,
            format!(
                "FROM checksum `{}` is not `sha256:` and 64 hex digits",
                nubo_core::file::escape_control(sum)
            ),
        );
    }
    Ok(())
}

/// A path of the build context: relative, never `..`, so it cannot name a file outside the
/// context. (Symlinks pointing out are refused when the file is read.) A path holding `$` is
/// checked again once its variables are substituted.
pub fn check_context_path(line: usize, kw: &str, p: &str) -> Result<(), ParseError> {
    let shown = nubo_core::file::escape_control(p);
    if p.is_empty() {
        return err(line, format!("{kw}: an empty path"));
    }
    if p.starts_with('/') {
        return err(
            line,
            format!("{kw} source `{shown}` is absolute: sources are paths inside the build context, relative to it"),
        );
    }
    if p.split('/').any(|c| c == "..") {
        return err(
            line,
            format!(
                "{kw} source `{shown}` leaves the build context through `..`: copy only what is inside the context"
            ),
        );
    }
    if p.bytes().any(|b| b.is_ascii_control()) {
        return err(line, format!("{kw} source `{shown}` holds control characters"));
    }
    Ok(())
}

fn check_guest_path(line: usize, p: &str) -> Result<(), ParseError> {
    if p.bytes().any(|b| b.is_ascii_control()) || p.len() > 4096 {
        return err(
            line,
            format!(
                "COPY destination `{}` holds control characters or is longer than 4096 bytes",
                nubo_core::file::escape_control(p)
            ),
        );
    }
    Ok(())
}
