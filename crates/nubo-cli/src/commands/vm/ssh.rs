use std::os::unix::process::CommandExt;

use nubo_engine::Engine;
use serde::Serialize;

use crate::cli::vm::{IpArgs, SshArgs};
use crate::output::{print_json, Format};

pub fn ssh(a: &SshArgs, engine: &Engine) -> anyhow::Result<()> {
    let jump = a
        .jump
        .as_deref()
        .map(nubo_engine::ssh_jump::JumpHost::parse)
        .transpose()?;
    let argv = engine.ssh_argv_via(&a.name, &a.command, jump.as_ref())?;
    let err = std::process::Command::new(&argv[0]).args(&argv[1..]).exec();
    anyhow::bail!("cannot run ssh ({err}): install the openssh-client package")
}

#[derive(Serialize)]
struct Reach {
    name: String,
    ssh: Option<String>,
    ssh_user: String,
    guest_addresses: Vec<String>,
    /// The addresses were computed from the MAC, not observed (`vm wait --for ssh` checks them).
    predicted: bool,
    network: String,
}

pub fn ip(a: &IpArgs, engine: &Engine) -> anyhow::Result<()> {
    let rec = engine.load(&a.name)?;
    // The backend knows how its network is realised and where SSH reaches the guest.
    let reach = engine.reach(&rec)?;
    let r = Reach {
        name: rec.name.clone(),
        ssh: reach.ssh.map(|s| s.to_string()),
        ssh_user: rec.ssh.user.clone(),
        guest_addresses: reach.guest_addresses.clone(),
        predicted: reach.predicted,
        network: reach.network.clone(),
    };
    if a.output == Format::Json {
        return print_json(&r);
    }
    let ssh = reach
        .ssh
        .ok_or_else(|| anyhow::anyhow!("vm `{}` has no SSH endpoint ({})", a.name, reach.network))?;
    println!("{ssh}");
    eprintln!(
        "  guest address {}{}; {}",
        if r.guest_addresses.is_empty() {
            "unknown".to_owned()
        } else {
            r.guest_addresses.join(", ")
        },
        if r.predicted { " (predicted)" } else { "" },
        r.network
    );
    Ok(())
}

pub fn key(engine: &Engine) -> anyhow::Result<()> {
    let (_, public) = nubo_engine::ssh::ensure_key(&engine.roots.ssh_dir())?;
    println!("{public}");
    Ok(())
}
