//! Ctrl-C and SIGTERM for the commands that drive the engine: the first signal cancels the
//! engine's token (its waits — a VM's lock, a create's steps, readiness — end at once with a
//! "cancelled while ..." error, and a create's own cleanup removes what it had made); a second
//! one ends the process as the signal always did. The exit status is then 128 + the signal.
//! Downloads and uploads (pulls, pushes, a create's fetch) take the token too: they end at their
//! next read, a download keeping its partial file for the next pull to resume. Inside
//! [`uncancellable`] (`vm logs -f`, `vm console`: work no token stops) the first signal ends the
//! process at once, as it did before the handler existed.

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, Signal};
use nubo_core::Cancel;

static TOKEN: OnceLock<Cancel> = OnceLock::new();
/// The first signal received, 0 for none.
static RECEIVED: AtomicI32 = AtomicI32::new(0);
/// How many [`uncancellable`] sections are running.
static UNCANCELLABLE: AtomicUsize = AtomicUsize::new(0);

const MESSAGE: &[u8] = b"\nnubo: interrupted: stopping at the next safe point (press Ctrl-C again to end it now)\n";

/// The process's token, cancelled by SIGINT or SIGTERM once [`install`] ran.
pub fn install() -> Cancel {
    static INSTALLED: Once = Once::new();
    let token = TOKEN.get_or_init(Cancel::new).clone();
    INSTALLED.call_once(|| {
        let action = SigAction::new(SigHandler::Handler(on_signal), SaFlags::SA_RESTART, SigSet::empty());
        for sig in [Signal::SIGINT, Signal::SIGTERM] {
            // SAFETY: the handler only stores atomics, writes to stderr and re-raises, all
            // async-signal-safe.
            #[allow(unsafe_code)]
            let installed = unsafe { signal::sigaction(sig, &action) };
            if let Err(e) = installed {
                eprintln!("warning: cannot handle {sig}: {e}; it will end nubo without cleanup");
            }
        }
    });
    token
}

/// The signal that interrupted the command, if one did.
pub fn received() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        n => Some(n),
    }
}

/// Runs `f` with SIGINT and SIGTERM ending the process at once (their default action): for
/// work that never looks at the token, so a Ctrl-C is not left waiting for it.
pub fn uncancellable<R>(f: impl FnOnce() -> R) -> R {
    struct Section;
    impl Drop for Section {
        fn drop(&mut self) {
            UNCANCELLABLE.fetch_sub(1, Ordering::SeqCst);
        }
    }
    UNCANCELLABLE.fetch_add(1, Ordering::SeqCst);
    let _section = Section;
    f()
}

extern "C" fn on_signal(sig: nix::libc::c_int) {
    let uncancellable = UNCANCELLABLE.load(Ordering::SeqCst) > 0;
    if RECEIVED.swap(sig, Ordering::SeqCst) != 0 || uncancellable {
        // The second signal, or one no token would stop: end the process as the signal's
        // default does.
        if let Ok(s) = Signal::try_from(sig) {
            // SAFETY: signal(2) and raise(3) are async-signal-safe.
            #[allow(unsafe_code)]
            unsafe {
                let _ = signal::signal(s, SigHandler::SigDfl);
            }
            let _ = signal::raise(s);
        }
        return;
    }
    if let Some(t) = TOKEN.get() {
        t.cancel();
    }
    let _ = nix::unistd::write(std::io::stderr(), MESSAGE);
}
