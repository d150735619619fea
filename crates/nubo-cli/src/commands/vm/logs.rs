use std::io::{self, Read, Seek, SeekFrom, Write};
use std::time::Duration;

use anyhow::Context;
use nubo_core::VmState;
use nubo_engine::Engine;

use crate::cli::vm::LogsArgs;

pub fn run(a: &LogsArgs, engine: &Engine) -> anyhow::Result<()> {
    let rec = engine.load(&a.name)?;
    let log = engine.console_log(&rec)?;
    // A remote host's console reaches this host only through libvirt's stream: `-f` records
    // it into the log it prints, which then holds what any follower here recorded.
    let remote = engine.console_is_remote(&rec);
    let mut recorder = if a.follow && !a.previous {
        engine.record_console(&a.name)?
    } else {
        None
    };
    let path = if a.previous {
        log.previous
            .ok_or_else(|| anyhow::anyhow!("vm `{}`'s backend keeps no previous boot's log", a.name))?
    } else {
        log.current
    };
    if remote {
        eprintln!(
            "vm `{}` runs on a remote libvirt host: its console as recorded on this host (by `vm create --wait`, `vm wait`, `vm logs -f`)",
            a.name
        );
    }
    let mut f = match std::fs::File::open(&path) {
        Ok(f) => Some(f),
        Err(e) if e.kind() == io::ErrorKind::NotFound && recorder.is_some() => None,
        Err(e) if e.kind() == io::ErrorKind::NotFound && remote => {
            anyhow::bail!(
                "vm `{0}` has no console log on this host: it runs on a remote libvirt host and nothing here recorded its console yet; follow it with `nubo vm logs -f {0}`",
                a.name
            )
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            anyhow::bail!(
                "vm `{}` has no console log at {} yet: it has not booted",
                a.name,
                path.display()
            )
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut out = io::stdout().lock();
    if let Some(f) = f.as_mut() {
        io::copy(f, &mut out)?;
        out.flush()?;
    }
    if !a.follow {
        return Ok(());
    }
    let mut offset = match f.as_mut() {
        Some(f) => f.stream_position()?,
        None => 0,
    };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if let Some(r) = recorder.as_mut() {
            r.keep(engine)?;
        }
        let n = match f.as_mut() {
            Some(f) => f.read(&mut buf)?,
            None => 0,
        };
        if n > 0 {
            out.write_all(&buf[..n])?;
            out.flush()?;
            offset += n as u64;
            continue;
        }
        if engine.state(&rec)? == VmState::Stopped {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
        // A new boot rotates the log: follow the new file from its start.
        let len = std::fs::metadata(&path).map(|m| m.len()).ok();
        match (f.as_mut(), len) {
            (Some(f), Some(l)) if l >= offset => {
                f.seek(SeekFrom::Start(offset))?;
            }
            (_, Some(_)) => {
                f = Some(std::fs::File::open(&path)?);
                offset = 0;
            }
            (_, None) => {}
        }
    }
}
