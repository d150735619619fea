//! VM states and their legal transitions, checked before any I/O.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VmState {
    /// Record exists, resources being made; a crash here leaves something `create` converges.
    Creating,
    Running,
    Paused,
    Stopped,
}

/// What a user asks of a VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Start,
    Stop,
    Pause,
    Resume,
    Remove,
}

impl VmState {
    /// Whether `verb` can be applied in this state. `Remove` of a running VM is legal only when
    /// forced, which the caller decides; here it counts as legal from every state.
    pub fn can(self, verb: Verb) -> bool {
        use VmState::*;
        match verb {
            Verb::Start => matches!(self, Stopped),
            Verb::Stop => matches!(self, Running | Paused),
            Verb::Pause => matches!(self, Running),
            Verb::Resume => matches!(self, Paused),
            Verb::Remove => true,
        }
    }

    pub fn is_active(self) -> bool {
        matches!(self, VmState::Running | VmState::Paused)
    }
}

impl fmt::Display for VmState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            VmState::Creating => "creating",
            VmState::Running => "running",
            VmState::Paused => "paused",
            VmState::Stopped => "stopped",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn can_start_only_stopped() {
        assert!(VmState::Stopped.can(Verb::Start));
        assert!(!VmState::Running.can(Verb::Start));
        assert!(!VmState::Creating.can(Verb::Start));
    }

    #[test]
    fn can_stop_running_or_paused() {
        assert!(VmState::Running.can(Verb::Stop));
        assert!(VmState::Paused.can(Verb::Stop));
        assert!(!VmState::Stopped.can(Verb::Stop));
    }

    #[test]
    fn can_resume_only_paused() {
        assert!(VmState::Paused.can(Verb::Resume));
        assert!(!VmState::Running.can(Verb::Resume));
    }
}
