use std::os::unix::process::CommandExt;

use nubo_engine::Engine;
use serde::Serialize;

use crate::cli::vm::{IpArgs, SshArgs};
use crate::output::{print_json, Format};

pub fn ssh(a: &SshArgs, engine: &Engine) -> anyhow::Result<()> {
    let argv = engine.ssh_argv(&a.name, &a.command)?;
    let err = std::process::Command::new(&argv[0]).args(&argv[1..]).exec();
    anyhow::bail!("cannot run ssh ({err}): install the openssh-client package")
}

/// With user-mode networking the guest's own address is QEMU's fixed 10.0.2.15, reachable
/// only through the forward on 127.0.0.1.
const USER_NET_GUEST_ADDR: &str = "10.0.2.15";

#[derive(Serialize)]
struct Reach {
    name: String,
    ssh_host: &'static str,
    ssh_port: u16,
    ssh_user: String,
    guest_address: &'static str,
    network: &'static str,
}

pub fn ip(a: &IpArgs, engine: &Engine) -> anyhow::Result<()> {
    let rec = engine.load(&a.name)?;
    let s = rec
        .ssh
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("vm `{}` has no network forward", a.name))?;
    let r = Reach {
        name: rec.name.clone(),
        ssh_host: "127.0.0.1",
        ssh_port: s.port,
        ssh_user: s.user.clone(),
        guest_address: USER_NET_GUEST_ADDR,
        network: "user-mode (QEMU): the guest is reached through 127.0.0.1 forwards",
    };
    if a.output == Format::Json {
        return print_json(&r);
    }
    println!("127.0.0.1:{}", r.ssh_port);
    eprintln!(
        "  guest address {} behind QEMU user-mode networking; ssh forwarded from 127.0.0.1:{}",
        r.guest_address, r.ssh_port
    );
    Ok(())
}

pub fn key(engine: &Engine) -> anyhow::Result<()> {
    let (_, public) = nubo_engine::ssh::ensure_key(&engine.roots.ssh_dir())?;
    println!("{public}");
    Ok(())
}
