//! What every blocking call of a long-running caller (a daemon, a controller) takes: a
//! [`Cancel`] token another thread can trip, and a [`Deadline`]. A daemon gives each call its
//! own token; the CLI's one is tripped by its SIGINT/SIGTERM handler.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A cancellation token: clones share one flag; [`Cancel::cancel`] on any clone is seen by all.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// A token nobody has cancelled yet.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// When a wait gives up: an instant, or never.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(Option<Instant>);

impl Deadline {
    /// A wait that only cancellation ends.
    pub const NEVER: Deadline = Deadline(None);

    /// `wait` from now (a wait too long to represent is [`Deadline::NEVER`]).
    pub fn after(wait: Duration) -> Deadline {
        Deadline(Instant::now().checked_add(wait))
    }

    pub fn at(when: Instant) -> Deadline {
        Deadline(Some(when))
    }

    pub fn instant(&self) -> Option<Instant> {
        self.0
    }

    pub fn passed(&self) -> bool {
        self.0.is_some_and(|d| Instant::now() >= d)
    }

    /// How long until it passes (zero once it has), `None` for never.
    pub fn remaining(&self) -> Option<Duration> {
        self.0.map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// `slice`, or less when the deadline comes first: how long one step of a polling wait may
    /// sleep and still notice the deadline (and, between steps, a cancellation) in time.
    pub fn slice(&self, slice: Duration) -> Duration {
        self.remaining().map_or(slice, |r| r.min(slice))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancel_clone_sees_cancellation() {
        let token = Cancel::new();
        let clone = token.clone();

        clone.cancel();

        assert!(token.is_cancelled());
    }

    #[test]
    fn cancel_new_is_not_cancelled() {
        assert!(!Cancel::new().is_cancelled());
    }

    #[test]
    fn deadline_never_does_not_pass() {
        assert!(!Deadline::NEVER.passed());
        assert_eq!(
            Deadline::NEVER.slice(Duration::from_millis(50)),
            Duration::from_millis(50)
        );
    }

    #[test]
    fn deadline_after_zero_has_passed() {
        let d = Deadline::after(Duration::ZERO);

        assert!(d.passed());
        assert_eq!(d.slice(Duration::from_secs(1)), Duration::ZERO);
    }

    #[test]
    fn deadline_after_huge_is_never() {
        assert_eq!(Deadline::after(Duration::MAX), Deadline::NEVER);
    }
}
