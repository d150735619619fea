use std::fs;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use nubo_backend::{Accel, MachineType};
use nubo_engine::{CreateRequest, Engine, WaitFor};

use super::print_event;
use crate::cli::vm::{AccelArg, CreateArgs, MachineArg};
use crate::settings::Settings;

pub fn run(a: &CreateArgs, engine: &Engine, settings: &Settings) -> anyhow::Result<()> {
    let t0 = Instant::now();
    // The name first: nothing, not even a download, happens for a VM that cannot exist.
    nubo_core::VmName::parse(&a.name)?;
    let mut req = request(a)?;
    if let Some(url) = &a.url_img {
        let rec = super::super::image::pull_url(
            url,
            a.checksum.as_deref(),
            a.insecure_no_checksum,
            a.allow_http,
            settings,
        )?;
        eprintln!(
            "  pulled {url} as `{}` in {:.1}s",
            rec.reference,
            t0.elapsed().as_secs_f64()
        );
        req.image = Some(rec.reference);
    }
    // Everything is checked before anything is downloaded or written, except that an image
    // which is not local yet can only be checked once it is.
    if let Some(image) = &a.image {
        if super::super::image::pull_if_missing(image, settings)? {
            eprintln!("  pulled `{image}` in {:.1}s", t0.elapsed().as_secs_f64());
        }
    }
    let created = engine.create(req, &mut print_event)?;
    let rec = &created.record;
    let ssh = rec
        .ssh
        .as_ref()
        .map(|s| format!(", ssh {}@127.0.0.1:{}", s.user, s.port))
        .unwrap_or_default();
    eprintln!(
        "vm `{}` {} (uuid {}{ssh}) in {:.2}s",
        rec.name,
        if created.existed {
            "exists"
        } else {
            "created and started"
        },
        rec.uuid,
        created.started.elapsed().as_secs_f64()
    );
    if a.wait {
        // An appliance has no seed and maybe no cloud-init: ready means its SSH answers.
        let target = if rec.machine.seed.is_some() {
            WaitFor::CloudInit
        } else {
            WaitFor::Ssh
        };
        let out = engine.wait(&rec.name, target, a.boot_timeout, t0, &mut print_event)?;
        if let Some(f) = out.finished {
            eprintln!(
                "vm `{}` is ready: cloud-init {} finished, datasource {} [seed={}]",
                rec.name,
                f.version,
                f.datasource,
                f.seed.as_deref().unwrap_or("?")
            );
        } else {
            eprintln!("vm `{}` is ready", rec.name);
        }
    }
    println!("{}", rec.name);
    Ok(())
}

fn request(a: &CreateArgs) -> anyhow::Result<CreateRequest> {
    let read = |what: &str, p: &Path| fs::read(p).with_context(|| format!("reading {what} {}", p.display()));
    let mut ssh_keys = Vec::new();
    for k in &a.ssh_keys {
        ssh_keys.extend(ssh_keys_from(k)?);
    }
    Ok(CreateRequest {
        name: a.name.clone(),
        image: a.image.clone(),
        disk: a.disk.as_deref().map(absolute).transpose()?,
        backend: a.backend.clone(),
        vcpus: a.vcpus,
        memory_mib: a.memory.map(|m| m.mib()),
        disk_size: a.disk_size.map(|d| d.bytes()),
        hostname: a.hostname.clone(),
        ssh_keys,
        user_data: a.user_data.as_deref().map(|p| read("--user-data", p)).transpose()?,
        network_config: a
            .network_config
            .as_deref()
            .map(|p| read("--network-config", p))
            .transpose()?,
        seed: a.seed.as_deref().map(absolute).transpose()?,
        kernel: a.kernel.as_deref().map(absolute).transpose()?,
        initrd: a.initrd.as_deref().map(absolute).transpose()?,
        cmdline: a.cmdline.clone(),
        firmware: a.firmware.clone(),
        machine: a.machine.map(|m| match m {
            MachineArg::Pc => MachineType::Pc,
            MachineArg::Q35 => MachineType::Q35,
            MachineArg::Microvm => MachineType::Microvm,
        }),
        accel: match a.accel {
            AccelArg::Auto => Accel::Auto,
            AccelArg::Kvm => Accel::Kvm,
            AccelArg::Tcg => Accel::Tcg,
        },
        restrict_network: a.restrict_network,
        ssh_user: a.ssh_user.clone(),
        ..Default::default()
    })
}

/// Paths are recorded absolute: a later `start` may run from another directory.
fn absolute(p: &Path) -> anyhow::Result<std::path::PathBuf> {
    std::path::absolute(p).with_context(|| format!("resolving {}", p.display()))
}

/// `--ssh-key KEY` or `--ssh-key @FILE` (every key line of the file, like authorized_keys).
fn ssh_keys_from(arg: &str) -> anyhow::Result<Vec<String>> {
    let keys: Vec<String> = match arg.strip_prefix('@') {
        Some(path) => {
            let text = fs::read_to_string(path).with_context(|| format!("reading --ssh-key file {path}"))?;
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_owned)
                .collect()
        }
        None => vec![arg.trim().to_owned()],
    };
    for k in &keys {
        let kind = k.split_whitespace().next().unwrap_or("");
        let known = kind.starts_with("ssh-") || kind.starts_with("ecdsa-") || kind.starts_with("sk-");
        if !known {
            anyhow::bail!(
                "--ssh-key {arg}: `{}` is not an SSH public key (expected e.g. `ssh-ed25519 AAAA...`); pass the .pub file with @",
                k.chars().take(40).collect::<String>()
            );
        }
    }
    if keys.is_empty() {
        anyhow::bail!("--ssh-key {arg}: the file holds no keys");
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssh_keys_from_literal_key() {
        assert_eq!(
            ssh_keys_from("ssh-ed25519 AAAA me").unwrap(),
            vec!["ssh-ed25519 AAAA me"]
        );
    }

    #[test]
    fn ssh_keys_from_private_key_text_refused() {
        let err = ssh_keys_from("-----BEGIN OPENSSH PRIVATE KEY-----").unwrap_err();

        assert!(err.to_string().contains("not an SSH public key"));
    }

    #[test]
    fn ssh_keys_from_file_skips_comments() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.pub");
        fs::write(&p, "# mine\nssh-ed25519 AAAA a\n\necdsa-sha2-nistp256 BBBB b\n").unwrap();

        let keys = ssh_keys_from(&format!("@{}", p.display())).unwrap();

        assert_eq!(keys.len(), 2);
    }
}
