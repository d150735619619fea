//! Recording a console that no VMM writes on this host (a remote libvirt domain's serial
//! console, read through libvirt's console stream) into the VM's console log here, so
//! readiness, `nubo vm logs` and [`Engine::observe`] read one file for every backend.
//!
//! The stream is live: what the guest prints while nobody records is not kept (libvirt's
//! `<log file>` would be written on the remote host, out of this host's reach). A recorder
//! opens the console without taking it over, so `nubo vm console` (which does) wins; the
//! recorder opens it again once the console is free, the domain restarted or libvirtd came
//! back. The log is bounded: past [`MAX_LOG`] bytes it is rotated to `<log>.1`.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nubo_backend::{Backend, ConsoleStream, VmRef};

use crate::{Engine, EngineError};

/// The largest console log a recorder writes before rotating it to `<log>.1`.
pub const MAX_LOG: u64 = 16 << 20;
/// How long a recorder waits before opening the console again after it could not.
const RETRY: Duration = Duration::from_secs(1);
/// How long dropping a recorder waits for its reading thread to end.
const STOP_WAIT: Duration = Duration::from_millis(500);

/// Records a VM's console stream into its console log while it lives: the pump runs on its
/// own thread; [`ConsoleRecorder::keep`] (cheap, non-blocking apart from opening a stream once
/// a second at most) opens the stream again when it ended. Dropping it stops recording.
pub struct ConsoleRecorder {
    name: String,
    log: PathBuf,
    cap: u64,
    pump: Option<Pump>,
    next_try: Instant,
    last_error: Option<String>,
    opened: u32,
}

struct Pump {
    stream: Option<Box<dyn ConsoleStream>>,
    stop: Arc<AtomicBool>,
    ended: Receiver<Option<String>>,
}

impl Drop for Pump {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Aborting a stream another thread is blocked reading may wait for that read (a
        // client library lock): done on its own thread, so dropping never hangs the caller.
        if let Some(stream) = self.stream.take() {
            let _ = std::thread::Builder::new()
                .name("console shutdown".into())
                .spawn(move || stream.shutdown());
        }
        // The thread writes nothing after `stop`; waiting bounds how long it may still read.
        let _ = self.ended.recv_timeout(STOP_WAIT);
    }
}

impl ConsoleRecorder {
    /// A recorder of `name`'s console into `log`, rotated past `cap` bytes; nothing is opened
    /// before the first [`keep_with`](Self::keep_with).
    pub fn new(name: &str, log: &Path, cap: u64) -> ConsoleRecorder {
        ConsoleRecorder {
            name: name.to_owned(),
            log: log.to_path_buf(),
            cap: cap.max(1),
            pump: None,
            next_try: Instant::now(),
            last_error: None,
            opened: 0,
        }
    }

    /// The console log it writes.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Whether a stream is being recorded now.
    pub fn recording(&mut self) -> bool {
        self.reap();
        self.pump.is_some()
    }

    /// Why the last stream ended or could not be opened, if it did.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// How many times a stream was opened (1 for an uninterrupted recording).
    pub fn streams_opened(&self) -> u32 {
        self.opened
    }

    /// Opens the console again through the VM's engine when the stream ended.
    pub fn keep(&mut self, engine: &Engine) -> Result<(), EngineError> {
        let rec = engine.load(&self.name)?;
        let dir = engine.roots.vm_dir(&self.name);
        self.keep_with(engine.backend_of(&rec)?, &rec.vm_ref(&dir));
        Ok(())
    }

    /// [`keep`](Self::keep) with the VM's backend and reference at hand.
    pub fn keep_with(&mut self, backend: &dyn Backend, vm: &VmRef) {
        self.reap();
        if self.pump.is_some() || Instant::now() < self.next_try {
            return;
        }
        self.next_try = Instant::now() + RETRY;
        match backend.console_feed(vm) {
            None => self.last_error = Some("the backend writes this VM's console log itself".into()),
            Some(Err(e)) => self.last_error = Some(e.to_string()),
            Some(Ok(stream)) => match self.start(stream) {
                Ok(p) => {
                    self.opened += 1;
                    self.pump = Some(p);
                }
                Err(e) => self.last_error = Some(e),
            },
        }
    }

    /// Records `stream` (already open) on a new thread.
    pub fn start_with(&mut self, stream: Box<dyn ConsoleStream>) -> Result<(), String> {
        self.pump = None;
        let p = self.start(stream)?;
        self.opened += 1;
        self.pump = Some(p);
        Ok(())
    }

    fn start(&self, stream: Box<dyn ConsoleStream>) -> Result<Pump, String> {
        let reader = stream
            .try_clone_reader()
            .map_err(|e| format!("reading the console of vm `{}`: {e}", self.name))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, ended) = mpsc::channel();
        let (log, cap, st) = (self.log.clone(), self.cap, stop.clone());
        std::thread::Builder::new()
            .name(format!("console {}", self.name))
            .spawn(move || {
                let _ = tx.send(pump(reader, &log, cap, &st));
            })
            .map_err(|e| format!("starting the console recorder of vm `{}`: {e}", self.name))?;
        Ok(Pump {
            stream: Some(stream),
            stop,
            ended,
        })
    }

    /// Forgets a pump whose stream ended, keeping why.
    fn reap(&mut self) {
        let ended = match self.pump.as_ref().map(|p| p.ended.try_recv()) {
            None | Some(Err(TryRecvError::Empty)) => return,
            Some(Ok(why)) => why,
            Some(Err(TryRecvError::Disconnected)) => Some("the console recorder stopped".into()),
        };
        self.last_error = Some(ended.unwrap_or_else(|| "the console stream ended".into()));
        self.pump = None;
    }
}

/// Copies `reader` into `log` until the stream ends or `stop`; why it ended, if not cleanly.
fn pump(mut reader: Box<dyn Read + Send>, log: &Path, cap: u64, stop: &AtomicBool) -> Option<String> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return None,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return (!stop.load(Ordering::SeqCst)).then(|| format!("reading the console stream: {e}")),
        };
        if stop.load(Ordering::SeqCst) {
            return None;
        }
        if let Err(e) = append(log, &buf[..n], cap) {
            return Some(e);
        }
    }
}

/// Appends `bytes` to `log` (opened anew each time, so a boot's rotation of the log is
/// followed), rotating it to `<log>.1` first when it would pass `cap`. Never follows a symlink.
pub fn append(log: &Path, bytes: &[u8], cap: u64) -> Result<(), String> {
    let len = std::fs::symlink_metadata(log).map(|m| m.len()).unwrap_or(0);
    if len > 0 && len + bytes.len() as u64 > cap {
        let mut prev = log.to_path_buf().into_os_string();
        prev.push(".1");
        std::fs::rename(log, &prev).map_err(|e| format!("rotating console log {}: {e}", log.display()))?;
    }
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(log)
        .map_err(|e| format!("writing console log {}: {e}", log.display()))?;
    f.write_all(bytes)
        .map_err(|e| format!("writing console log {}: {e}", log.display()))
}

impl Engine {
    /// A recorder of the VM's console into its console log, for a VM whose backend does not
    /// write that log on this host (a remote libvirt domain), recording already (or, when the
    /// console could not be opened, trying again on [`ConsoleRecorder::keep`]); `None` when
    /// the backend writes the log itself. A daemon keeps one per VM it follows and calls
    /// `keep` before each [`Engine::observe`]; [`Engine::readiness`] keeps its own.
    pub fn record_console(&self, name: &str) -> Result<Option<ConsoleRecorder>, EngineError> {
        let rec = self.created(name)?;
        let backend = self.backend_of(&rec)?;
        let dir = self.roots.vm_dir(name);
        Ok(recorder_for(backend, &rec.vm_ref(&dir)))
    }
}

impl Engine {
    /// Whether the VM runs on another host (a remote libvirt host), whose console this host
    /// sees only while a [`ConsoleRecorder`] records it. Asks nothing of the host.
    pub fn console_is_remote(&self, rec: &crate::VmRecord) -> bool {
        self.backend_of(rec).is_ok_and(|b| b.disk_is_remote(&rec.backend_state))
    }
}

/// An interactive console (`vm console`) of a remote VM: what it reads is also appended to
/// the VM's console log here, as the VMM's own log holds a local VM's session, so nothing is
/// missing from `vm logs` while a recorder yields the console to it.
pub(crate) struct Tee {
    inner: Box<dyn ConsoleStream>,
    log: PathBuf,
}

impl Tee {
    pub(crate) fn new(inner: Box<dyn ConsoleStream>, log: &Path) -> Tee {
        Tee {
            inner,
            log: log.to_path_buf(),
        }
    }
}

struct TeeReader {
    inner: Box<dyn Read + Send>,
    log: PathBuf,
}

impl Read for TeeReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        // The session goes on when the log cannot be written (disk full): it is a copy.
        let _ = append(&self.log, &buf[..n], MAX_LOG);
        Ok(n)
    }
}

impl Read for Tee {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let _ = append(&self.log, &buf[..n], MAX_LOG);
        Ok(n)
    }
}

impl Write for Tee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl ConsoleStream for Tee {
    fn try_clone_reader(&self) -> std::io::Result<Box<dyn Read + Send>> {
        Ok(Box::new(TeeReader {
            inner: self.inner.try_clone_reader()?,
            log: self.log.clone(),
        }))
    }
    fn shutdown(&self) {
        self.inner.shutdown();
    }
}

/// [`Engine::record_console`] with the backend at hand: opens the feed once to learn whether
/// there is one.
pub(crate) fn recorder_for(backend: &dyn Backend, vm: &VmRef) -> Option<ConsoleRecorder> {
    let feed = backend.console_feed(vm)?;
    let mut r = ConsoleRecorder::new(vm.name, &backend.console(vm).current, MAX_LOG);
    r.next_try = Instant::now() + RETRY;
    match feed {
        Ok(stream) => {
            if let Err(e) = r.start_with(stream) {
                r.last_error = Some(e);
            }
        }
        Err(e) => r.last_error = Some(e.to_string()),
    }
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A console stream over fixed bytes, then its end (or an error).
    struct Bytes {
        data: std::io::Cursor<Vec<u8>>,
    }

    impl Read for Bytes {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.data.read(buf)
        }
    }

    impl Write for Bytes {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl ConsoleStream for Bytes {
        fn try_clone_reader(&self) -> std::io::Result<Box<dyn Read + Send>> {
            Ok(Box::new(Bytes {
                data: std::io::Cursor::new(self.data.get_ref().clone()),
            }))
        }
        fn shutdown(&self) {}
    }

    fn stream(text: &str) -> Box<dyn ConsoleStream> {
        Box::new(Bytes {
            data: std::io::Cursor::new(text.as_bytes().to_vec()),
        })
    }

    fn wait_ended(r: &mut ConsoleRecorder) {
        let t = Instant::now();
        while r.recording() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn recorder_stream_bytes_land_in_log_then_ends() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("console.log");
        let mut r = ConsoleRecorder::new("v", &log, MAX_LOG);
        r.start_with(stream("Linux version 6.1\nCloud-init v. 22.4.2 finished at x\n"))
            .unwrap();
        wait_ended(&mut r);
        assert!(!r.recording());
        assert_eq!(r.last_error(), Some("the console stream ended"));
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "Linux version 6.1\nCloud-init v. 22.4.2 finished at x\n"
        );
    }

    #[test]
    fn recorder_second_stream_appends_to_same_log() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("console.log");
        let mut r = ConsoleRecorder::new("v", &log, MAX_LOG);
        r.start_with(stream("one\n")).unwrap();
        wait_ended(&mut r);
        r.start_with(stream("two\n")).unwrap();
        wait_ended(&mut r);
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "one\ntwo\n");
        assert_eq!(r.streams_opened(), 2);
    }

    const KERNEL: &str = "[    0.000000] Linux version 6.1.0-27-cloud-amd64 (debian-kernel@lists.debian.org)\n";
    const FINISHED: &str = "[   45.6] cloud-init[512]: Cloud-init v. 22.4.2 finished at Tue, 01 Dec 2026 20:00:00 +0000. Datasource DataSourceNoCloud [seed=/dev/vdb][dsmode=net].  Up 45.67 seconds\r\n";

    /// A VM whose console only a stream carries (a remote libvirt domain's, faked).
    fn remote_vm() -> crate::tests::T {
        let t = crate::tests::engine_with(nubo_backend::fake::FakeBackend::new("qemu"));
        *t.fake.console_feed.lock().unwrap() = Some(format!("{KERNEL}booting\n{FINISHED}").into_bytes());
        t.engine
            .create(&crate::tests::spec(&t, "far"), &mut crate::tests::quiet())
            .unwrap();
        t
    }

    #[test]
    fn engine_readiness_remote_console_stream_recorded_steps_to_done() {
        use crate::readiness::{Phase, Step, WaitFor};
        let t = remote_vm();
        let log = t.engine.roots.vm_dir("far").join("console.log");
        assert!(!log.exists(), "nothing writes the log before a follower");

        let mut r = t
            .engine
            .readiness("far", WaitFor::CloudInit, Duration::from_secs(5), Instant::now())
            .unwrap();
        let mut phases = Vec::new();
        let end = loop {
            match r.step() {
                Step::Phase(p, _) => phases.push(p),
                Step::PollAfter(d) => std::thread::sleep(d),
                end => break end,
            }
        };

        assert!(matches!(&end, Step::Done(o) if o.finished.is_some()), "{end:?}");
        assert_eq!(
            phases,
            vec![Phase::VmmRunning, Phase::KernelBooting, Phase::CloudInitFinished]
        );
        assert!(std::fs::read_to_string(&log)
            .unwrap()
            .contains("Cloud-init v. 22.4.2 finished"));
    }

    #[test]
    fn engine_observe_remote_cloud_init_done_after_recorder_keeps() {
        use crate::observe::{ConditionStatus, ConditionType};
        let t = remote_vm();
        let before = t.engine.observe("far").unwrap();
        assert_ne!(
            before.condition(ConditionType::CloudInitDone).unwrap().status,
            ConditionStatus::True
        );

        let mut r = t
            .engine
            .record_console("far")
            .unwrap()
            .expect("a remote console is recorded");
        let t0 = Instant::now();
        while r.recording() && t0.elapsed() < Duration::from_secs(5) {
            r.keep(&t.engine).unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }

        let after = t.engine.observe("far").unwrap();
        assert_eq!(
            after.condition(ConditionType::CloudInitDone).unwrap().status,
            ConditionStatus::True
        );
    }

    #[test]
    fn engine_record_console_local_backend_is_none() {
        let t = crate::tests::fake();
        t.engine
            .create(&crate::tests::spec(&t, "near"), &mut crate::tests::quiet())
            .unwrap();

        assert!(t.engine.record_console("near").unwrap().is_none());
        assert!(!t.engine.console_is_remote(&t.engine.load("near").unwrap()));
    }

    #[test]
    fn tee_reads_reach_caller_and_log() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("console.log");
        let tee = Tee::new(stream("login: "), &log);

        let mut got = String::new();
        tee.try_clone_reader().unwrap().read_to_string(&mut got).unwrap();

        assert_eq!(got, "login: ");
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "login: ");
    }

    #[test]
    fn append_past_cap_rotates_to_dot_one() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("console.log");
        append(&log, b"0123456789", 16).unwrap();
        append(&log, b"abcdefghij", 16).unwrap();
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "abcdefghij");
        assert_eq!(
            std::fs::read_to_string(d.path().join("console.log.1")).unwrap(),
            "0123456789"
        );
    }

    #[test]
    fn append_symlinked_log_is_refused_and_target_untouched() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("victim");
        std::fs::write(&target, "keep").unwrap();
        let log = d.path().join("console.log");
        std::os::unix::fs::symlink(&target, &log).unwrap();
        assert!(append(&log, b"x", MAX_LOG).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    }
}
