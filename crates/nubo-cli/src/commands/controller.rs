//! `nubo controller ARGS`: executes the `nubo-controller` binary installed beside this one, so
//! the CLI does not link the Kubernetes client (kube-rs, its TLS and async runtime: about as
//! much code again as the CLI, for a command most hosts never run).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::cli::ControllerArgs;

pub fn run(a: &ControllerArgs) -> anyhow::Result<()> {
    let me = std::env::current_exe().context("cannot find the running nubo binary")?;
    let bin = sibling(&me);
    if !bin.is_file() {
        bail!(
            "`nubo controller` needs the nubo-controller binary beside nubo, and {} does not exist: install it there (`cargo install --path crates/nubo-controller --root <nubo's prefix>`, or `cargo build -p nubo-controller`)",
            bin.display()
        );
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let err = std::process::Command::new(&bin).args(&a.args).exec();
        Err(err).with_context(|| format!("cannot run {}", bin.display()))
    }
}

fn sibling(me: &Path) -> PathBuf {
    me.with_file_name("nubo-controller")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sibling_same_directory() {
        assert_eq!(
            sibling(Path::new("/usr/local/bin/nubo")),
            Path::new("/usr/local/bin/nubo-controller")
        );
    }
}
