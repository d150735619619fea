//! `nubo vm console`: the serial console, interactively. Ctrl-] detaches (as telnet and
//! `virsh console` do); the VM keeps running.

use std::io::{self, Read, Write};

use anyhow::Context;
use nix::sys::termios::{self, SetArg};
use nubo_engine::Engine;

use crate::settings::Settings;

/// Ctrl-]
const ESCAPE: u8 = 0x1d;

pub fn run(name: &str, engine: &Engine, settings: &Settings) -> anyhow::Result<()> {
    // The backend attaches its own console (a socket for qemu; libvirt's and Cloud
    // Hypervisor's streams later).
    let stream = engine.attach_console(name)?;
    eprintln!("connected to vm `{name}`'s serial console; detach with Ctrl-]");
    let _raw = if settings.stdin_tty {
        Some(RawMode::enter()?)
    } else {
        None
    };
    let mut from_vm = stream.try_clone_reader()?;
    let printer = std::thread::spawn(move || {
        let mut out = io::stdout();
        let mut buf = [0u8; 4096];
        while let Ok(n) = from_vm.read(&mut buf) {
            if n == 0 || out.write_all(&buf[..n]).and_then(|_| out.flush()).is_err() {
                break;
            }
        }
    });
    let mut to_vm = stream;
    let mut stdin = io::stdin().lock();
    let mut buf = [0u8; 1024];
    loop {
        let n = stdin.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if let Some(i) = buf[..n].iter().position(|b| *b == ESCAPE) {
            to_vm.write_all(&buf[..i])?;
            break;
        }
        to_vm.write_all(&buf[..n])?;
    }
    to_vm.shutdown();
    let _ = printer.join();
    eprintln!("\r\ndetached from vm `{name}`");
    Ok(())
}

/// The terminal in raw mode for as long as this lives, restored on every exit path.
struct RawMode {
    saved: termios::Termios,
}

impl RawMode {
    fn enter() -> anyhow::Result<RawMode> {
        let stdin = io::stdin();
        let saved = termios::tcgetattr(&stdin).context("reading the terminal's mode")?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(&stdin, SetArg::TCSANOW, &raw).context("setting the terminal to raw mode")?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(io::stdin(), SetArg::TCSANOW, &self.saved);
    }
}
