//! `nubo image default [--set REF | --clear]`: the image `vm create NAME` boots when none is named.

use anyhow::Context;

use crate::cli::image::DefaultImageArgs;
use crate::settings::Settings;

pub fn run(a: &DefaultImageArgs, settings: &Settings) -> anyhow::Result<()> {
    let engine = crate::commands::vm::engine(settings);
    if a.clear {
        engine.set_default_image(None)?;
        eprintln!(
            "default image cleared: new VMs without --image use {}",
            nubo_engine::default_image::DEFAULT_IMAGE
        );
    } else if let Some(r) = &a.set {
        engine.set_default_image(Some(r)).context("--set")?;
        eprintln!("default image for new VMs: {r}");
    } else {
        println!("{}", engine.default_image()?);
    }
    Ok(())
}
