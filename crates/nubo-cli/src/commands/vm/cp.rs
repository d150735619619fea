//! `nubo vm cp [-r] [VM:]SRC [VM:]DST`: the system `scp` over the VM's SSH, as `multipass
//! transfer` and `limactl copy` do.

use std::path::Path;

use anyhow::bail;
use nubo_engine::ssh::CopyDirection;
use nubo_engine::Engine;

use crate::cli::vm::CpArgs;

/// One operand: a host path, or a path in VM `name`.
#[derive(Debug, PartialEq, Eq)]
enum Operand<'a> {
    Host(&'a str),
    Guest { vm: &'a str, path: &'a str },
}

/// `NAME:PATH` is a guest path when `NAME` is a VM name (a DNS label: no `/` or `.`, so
/// `./a:b` and `/x:y` stay host paths).
fn operand(text: &str) -> Operand<'_> {
    match text.split_once(':') {
        Some((vm, path)) if nubo_core::name::validate_label(vm).is_ok() => Operand::Guest { vm, path },
        _ => Operand::Host(text),
    }
}

/// The VM, the direction, the host path and the guest path of a copy.
fn plan<'a>(src: &'a str, dst: &'a str) -> anyhow::Result<(&'a str, CopyDirection, &'a str, &'a str)> {
    match (operand(src), operand(dst)) {
        (Operand::Host(l), Operand::Guest { vm, path }) => Ok((vm, CopyDirection::ToGuest, l, path)),
        (Operand::Guest { vm, path }, Operand::Host(l)) => Ok((vm, CopyDirection::FromGuest, l, path)),
        (Operand::Host(_), Operand::Host(_)) => bail!(
            "neither `{}` nor `{}` names a VM: write one side as VM:PATH (e.g. `web:/tmp/file`)",
            nubo_core::file::escape_control(src),
            nubo_core::file::escape_control(dst)
        ),
        (Operand::Guest { .. }, Operand::Guest { .. }) => bail!(
            "both `{}` and `{}` name a VM: copy between VMs through the host, one side at a time (write `./{}` for a host path that holds a colon)",
            nubo_core::file::escape_control(src),
            nubo_core::file::escape_control(dst),
            nubo_core::file::escape_control(dst)
        ),
    }
}

pub fn run(a: &CpArgs, engine: &Engine) -> anyhow::Result<()> {
    let (vm, direction, local, guest) = plan(&a.source, &a.destination)?;
    if local.is_empty() {
        bail!("the host path is empty: give a file or directory (`.` for the current directory)");
    }
    let argv = engine.scp_argv(vm, a.recursive, direction, Path::new(local), guest)?;
    let status = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .status()
        .map_err(|e| anyhow::anyhow!("cannot run scp ({e}): install the openssh-client package"))?;
    if !status.success() {
        bail!(
            "copying {} vm `{vm}` failed (scp exited with {}): its message is above",
            match direction {
                CopyDirection::ToGuest => "to",
                CopyDirection::FromGuest => "from",
            },
            status.code().map_or_else(|| "a signal".to_owned(), |c| c.to_string())
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_host_to_guest() {
        let (vm, dir, local, guest) = plan("big.bin", "web:/tmp/big.bin").unwrap();

        assert_eq!(
            (vm, dir, local, guest),
            ("web", CopyDirection::ToGuest, "big.bin", "/tmp/big.bin")
        );
    }

    #[test]
    fn plan_guest_to_host_home_relative() {
        let (vm, dir, local, guest) = plan("web:", "./out").unwrap();

        assert_eq!((vm, dir, local, guest), ("web", CopyDirection::FromGuest, "./out", ""));
    }

    #[test]
    fn operand_dotted_or_absolute_colon_path_is_host() {
        assert_eq!(operand("./a:b"), Operand::Host("./a:b"));
        assert_eq!(operand("/x:y"), Operand::Host("/x:y"));
        assert_eq!(operand("Web:x"), Operand::Host("Web:x"));
    }

    #[test]
    fn plan_two_host_paths_refused() {
        let err = plan("a", "b").unwrap_err().to_string();

        assert!(err.contains("VM:PATH"), "{err}");
    }

    #[test]
    fn plan_two_guests_refused() {
        assert!(plan("a:x", "b:y").is_err());
    }
}
