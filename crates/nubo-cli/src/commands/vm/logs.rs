use std::io::{self, Read, Seek, SeekFrom, Write};
use std::time::Duration;

use anyhow::Context;
use nubo_core::VmState;
use nubo_engine::Engine;

use crate::cli::vm::LogsArgs;

pub fn run(a: &LogsArgs, engine: &Engine) -> anyhow::Result<()> {
    let rec = engine.load(&a.name)?;
    let log = engine.console_log(&rec)?;
    let path = if a.previous {
        log.previous
            .ok_or_else(|| anyhow::anyhow!("vm `{}`'s backend keeps no previous boot's log", a.name))?
    } else {
        log.current
    };
    let mut f = match std::fs::File::open(&path) {
        Ok(f) => f,
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
    io::copy(&mut f, &mut out)?;
    out.flush()?;
    if !a.follow {
        return Ok(());
    }
    let mut offset = f.stream_position()?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f.read(&mut buf)?;
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
        if std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) < offset {
            f = std::fs::File::open(&path)?;
            offset = 0;
        } else {
            f.seek(SeekFrom::Start(offset))?;
        }
    }
}
