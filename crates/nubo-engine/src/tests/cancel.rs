//! Per-call cancellation ([`Engine::with_cancel`]): a token cancelled from another thread ends
//! that call's wait promptly with [`EngineError::Cancelled`], leaves other handles' calls alone,
//! and a create cancelled before it starts leaves nothing behind.

use std::time::{Duration, Instant};

use nubo_core::Cancel;

use super::{entries, fake, quiet, spec};
use crate::{EngineError, WaitFor};

/// Cancels `token` from another thread after `after`.
fn cancel_after(token: &Cancel, after: Duration) -> std::thread::JoinHandle<()> {
    let token = token.clone();
    std::thread::spawn(move || {
        std::thread::sleep(after);
        token.cancel();
    })
}

#[test]
fn with_cancel_lock_wait_cancelled_from_another_thread_ends_promptly() {
    let mut t = fake();
    t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();
    t.engine.lock_wait = Duration::from_secs(60);
    let _held = t.engine.lock("web", "snapshot").unwrap();
    let token = Cancel::new();
    let call = t.engine.with_cancel(token.clone());
    let canceller = cancel_after(&token, Duration::from_millis(200));
    let t0 = Instant::now();

    let err = call.start("web", &mut quiet()).unwrap_err();

    canceller.join().unwrap();
    assert!(matches!(err, EngineError::Cancelled { .. }), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(!t.engine.cancel.is_cancelled(), "the engine's own token is untouched");
}

#[test]
fn with_cancel_readiness_wait_cancelled_from_another_thread_ends_promptly() {
    let t = fake();
    t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();
    let token = Cancel::new();
    let call = t.engine.with_cancel(token.clone());
    let canceller = cancel_after(&token, Duration::from_millis(300));
    let t0 = Instant::now();

    // No console ever appears: only the 60 s timeout or the token ends this wait.
    let err = call
        .wait("web", WaitFor::CloudInit, Duration::from_secs(60), t0, &mut quiet())
        .unwrap_err();

    canceller.join().unwrap();
    assert!(matches!(err, EngineError::Cancelled { .. }), "{err}");
    assert!(err.to_string().contains("vm `web`"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}

#[test]
fn with_cancel_other_handles_calls_are_unaffected() {
    let t = fake();
    let cancelled = Cancel::new();
    cancelled.cancel();
    let gone = t.engine.with_cancel(cancelled);
    let live = t.engine.with_cancel(Cancel::new());

    let err = gone.create(&spec(&t, "a"), &mut quiet()).err().unwrap();
    live.create(&spec(&t, "b"), &mut quiet()).unwrap();

    assert!(matches!(err, EngineError::Cancelled { .. }), "{err}");
    assert_eq!(entries(&t.engine.roots.vms()), vec!["b"]);
}

#[test]
fn create_cancelled_leaves_nothing() {
    let t = fake();
    let token = Cancel::new();
    token.cancel();

    let err = t
        .engine
        .with_cancel(token)
        .create(&spec(&t, "web"), &mut quiet())
        .err()
        .unwrap();

    assert!(matches!(err, EngineError::Cancelled { .. }), "{err}");
    assert!(!t.engine.roots.vm_dir("web").exists());
    assert!(t.fake.calls().is_empty(), "{:?}", t.fake.calls());
    assert!(entries(&t.engine.roots.run_dir.join("locks")).is_empty());
}

#[test]
fn engine_sleep_cancelled_is_cancelled_naming_what() {
    let t = fake();
    let token = Cancel::new();
    let call = t.engine.with_cancel(token.clone());
    let canceller = cancel_after(&token, Duration::from_millis(100));
    let t0 = Instant::now();

    let err = call
        .sleep(Duration::from_secs(60), "waiting for the guest")
        .unwrap_err();

    canceller.join().unwrap();
    assert!(err.to_string().contains("waiting for the guest"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(5));
}
