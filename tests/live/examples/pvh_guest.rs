//! Writes the PVH test guest (see `nubo_live::pvh`) to the path given, for scripts/bench/ch.sh.

fn main() -> std::process::ExitCode {
    let Some(out) = std::env::args_os().nth(1) else {
        eprintln!("usage: pvh_guest OUTPUT.elf");
        return std::process::ExitCode::from(2);
    };
    match std::fs::write(&out, nubo_live::pvh::guest_elf()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cannot write {}: {e}", std::path::Path::new(&out).display());
            std::process::ExitCode::FAILURE
        }
    }
}
