//! `nubo vm mount` / `nubo vm umount`: shared folders on a running VM, where the backend can
//! hot-plug them (qemu, local libvirt; see `Engine::mount`); the others refuse by name, with
//! the alternative.

use nubo_engine::Engine;

use crate::cli::vm::{MountArgs, UmountArgs};

pub fn mount(a: &MountArgs, engine: &Engine) -> anyhow::Result<()> {
    let m = super::create::mounts(std::slice::from_ref(&a.mount))?
        .pop()
        .expect("one argument gives one mount");
    engine.mount(&a.name, &m)?;
    eprintln!(
        "vm `{}`: {} shared at {}",
        a.name,
        m.host_path.display(),
        m.guest().display()
    );
    Ok(())
}

pub fn umount(a: &UmountArgs, engine: &Engine) -> anyhow::Result<()> {
    engine.umount(&a.name, &a.guest_dir)?;
    eprintln!("vm `{}`: {} no longer shared", a.name, a.guest_dir.display());
    Ok(())
}
