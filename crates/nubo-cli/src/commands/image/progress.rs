//! Pull progress: a bar with bytes, rate and ETA on a TTY; plain lines otherwise (logs, CI).

use std::io::Write;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use nubo_image::{DownloadEvent, PullEvent};

/// Plain mode prints at most one progress line per this interval, so logs stay readable.
const PLAIN_EVERY: Duration = Duration::from_secs(5);

pub struct Reporter {
    tty: bool,
    bar: Option<ProgressBar>,
    last_line: Instant,
    started: Instant,
}

impl Reporter {
    pub fn new(tty: bool) -> Self {
        Reporter {
            tty,
            bar: None,
            last_line: Instant::now(),
            started: Instant::now(),
        }
    }

    fn say(&self, msg: &str) {
        match &self.bar {
            Some(b) => b.println(msg),
            None => {
                let _ = writeln!(std::io::stderr(), "{msg}");
            }
        }
    }

    pub fn event(&mut self, e: PullEvent) {
        match e {
            PullEvent::Resolved { url, serial } => match serial {
                Some(s) => self.say(&format!("source {url} (build {s})")),
                None => self.say(&format!("source {url}")),
            },
            PullEvent::Checksum { checksum, from } => {
                let short: String = checksum.chars().take(23).collect();
                self.say(&format!("expecting {short}… from {from}"));
            }
            PullEvent::Unverified { url } => self.say(&format!(
                "warning: {url} has no checksum; only TLS vouches for it (--insecure-no-checksum)"
            )),
            PullEvent::Waiting { lock } => self.say(&format!(
                "another pull of this image is running; waiting for {}",
                lock.display()
            )),
            PullEvent::AlreadyPresent { digest } => self.say(&format!("already in the store as {digest}")),
            PullEvent::Transfer(DownloadEvent::Start { offset, total }) => self.start(offset, total),
            PullEvent::Note(line) => self.say(&line),
            PullEvent::Transfer(DownloadEvent::Progress { done, total }) => self.progress(done, total),
            PullEvent::Transfer(DownloadEvent::Retry { attempt, offset, error }) => self.say(&format!(
                "transfer failed ({error}); retrying from byte {offset} (attempt {attempt})"
            )),
            PullEvent::Transfer(DownloadEvent::Restart { reason }) => {
                self.say(&format!("{reason}; downloading from the start"))
            }
            PullEvent::Verified { checksum } => {
                if let Some(b) = self.bar.take() {
                    b.finish_and_clear();
                }
                let alg = checksum.split(':').next().unwrap_or("checksum");
                self.say(&format!(
                    "{alg} verified in {:.1}s",
                    self.started.elapsed().as_secs_f64()
                ));
            }
        }
    }

    fn start(&mut self, offset: u64, total: Option<u64>) {
        if offset > 0 {
            self.say(&format!("resuming at byte {offset}"));
        }
        if !self.tty {
            return;
        }
        if self.bar.is_none() {
            let bar = match total {
                Some(t) => ProgressBar::new(t),
                None => ProgressBar::new_spinner(),
            };
            let style = ProgressStyle::with_template(
                "{spinner} [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
            )
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            self.bar = Some(bar);
        }
        if let Some(b) = &self.bar {
            // A registry transfer has several blobs: each gets the bar from its own start.
            if let Some(t) = total {
                b.set_length(t);
            }
            b.set_position(offset);
        }
    }

    fn progress(&mut self, done: u64, total: Option<u64>) {
        if let Some(b) = &self.bar {
            b.set_position(done);
            return;
        }
        if self.tty || self.last_line.elapsed() < PLAIN_EVERY {
            return;
        }
        self.last_line = Instant::now();
        let rate = done as f64 / self.started.elapsed().as_secs_f64().max(0.001) / f64::from(1 << 20);
        match total {
            Some(t) if t > 0 => self.say(&format!(
                "transferred {}% ({done}/{t} bytes, {rate:.1} MiB/s)",
                done * 100 / t
            )),
            _ => self.say(&format!("transferred {done} bytes ({rate:.1} MiB/s)")),
        }
    }

    pub fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}
