//! Watches a host file a hostile input points at, to prove nothing opened or read it.

use std::path::{Path, PathBuf};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use crate::TestResult;

/// Watches one file for being opened or read.
pub struct Watch {
    inotify: Inotify,
    path: PathBuf,
}

impl Watch {
    pub fn new(path: &Path) -> Result<Watch, String> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).map_err(|e| e.to_string())?;
        inotify
            .add_watch(path, AddWatchFlags::IN_OPEN | AddWatchFlags::IN_ACCESS)
            .map_err(|e| format!("cannot watch {}: {e}", path.display()))?;
        Ok(Watch {
            inotify,
            path: path.to_path_buf(),
        })
    }

    /// An error when the file was opened or read since [`Watch::new`]; `when` says during what.
    pub fn untouched(self, when: &str) -> TestResult {
        match self.inotify.read_events() {
            Err(nix::errno::Errno::EAGAIN) => Ok(()),
            Ok(events) => Err(format!("{} was opened or read {when}: {events:?}", self.path.display())),
            Err(e) => Err(format!("reading inotify events: {e}")),
        }
    }
}
