//! The live-test harness. A live test names the prerequisites it needs; each is probed once per
//! process. A missing prerequisite makes the test *skipped, with the reason* — or a failure when
//! `NUBO_LIVE_REQUIRE` (comma-separated, or `all`) names it.
//!
//! ```no_run
//! fn main() -> std::process::ExitCode {
//!     nubo_live::run(vec![nubo_live::LiveTest::new("boots", &["qemu"], || Ok(()))])
//! }
//! ```

pub mod cli;
pub mod controller;
pub mod faults;
pub mod fixture;
pub mod kube;
pub mod libvirt_tls;
pub mod libvirtd;
pub mod net;
pub mod prereq;
pub mod process;
pub mod pvh;
pub mod registry;
pub mod token;
pub mod watch;

pub use fixture::{nubo_bin, DebianImage, TestRoot};
pub use process::{run_with_timeout, wait_for_line, Guard};

use std::process::ExitCode;

use libtest_mimic::{Arguments, Failed, Trial};

pub type TestResult = Result<(), String>;

pub struct LiveTest {
    pub name: &'static str,
    pub needs: &'static [&'static str],
    pub body: Box<dyn FnOnce() -> TestResult + Send>,
}

impl LiveTest {
    pub fn new(
        name: &'static str,
        needs: &'static [&'static str],
        body: impl FnOnce() -> TestResult + Send + 'static,
    ) -> Self {
        LiveTest {
            name,
            needs,
            body: Box::new(body),
        }
    }
}

/// Runs `body`, printing `timing WHAT: S s (ok|failed)` after it.
pub fn timed(what: &str, body: impl FnOnce() -> TestResult) -> TestResult {
    let t = std::time::Instant::now();
    let r = body();
    println!(
        "timing {what}: {:.2}s ({})",
        t.elapsed().as_secs_f64(),
        if r.is_ok() { "ok" } else { "failed" }
    );
    r
}

/// Whether `NUBO_LIVE_REQUIRE` makes `prereq` mandatory.
pub fn required(prereq: &str) -> bool {
    let v = std::env::var("NUBO_LIVE_REQUIRE").unwrap_or_default();
    v.split(',').map(str::trim).any(|p| p == prereq || p == "all")
}

/// Runs the tests with libtest's command line (filters, `--list`, `--test-threads`).
/// Live tests boot VMs: they run one at a time unless the caller asks otherwise.
pub fn run(tests: Vec<LiveTest>) -> ExitCode {
    let mut args = Arguments::from_args();
    if args.test_threads.is_none() {
        args.test_threads = Some(1);
    }
    let trials = tests
        .into_iter()
        .map(|t| {
            let missing: Vec<(String, String)> = t
                .needs
                .iter()
                .filter_map(|p| prereq::check(p).err().map(|why| (p.to_string(), why)))
                .collect();
            let name = t.name;
            if missing.is_empty() {
                let body = t.body;
                return Trial::test(name, move || body().map_err(Failed::from));
            }
            let hard: Vec<_> = missing.iter().filter(|(p, _)| required(p)).cloned().collect();
            let reasons = missing
                .iter()
                .map(|(p, why)| format!("needs {p}: {why}"))
                .collect::<Vec<_>>()
                .join("; ");
            if hard.is_empty() {
                println!("skipped {name}: {reasons}");
                Trial::test(name, || Ok(())).with_ignored_flag(true)
            } else {
                Trial::test(name, move || {
                    Err(Failed::from(format!(
                        "required by NUBO_LIVE_REQUIRE but missing: {reasons}"
                    )))
                })
            }
        })
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}
