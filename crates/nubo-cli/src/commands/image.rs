use crate::cli::image::ImageCmd;
use crate::settings::Settings;

pub fn run(cmd: ImageCmd, _settings: &Settings) -> anyhow::Result<()> {
    match cmd {
        ImageCmd::Pull(_) => super::not_implemented("image pull"),
        ImageCmd::Bootstrap(_) => unreachable!("dispatched to commands::bootstrap"),
        ImageCmd::Ls(_) => super::not_implemented("image ls"),
        ImageCmd::Inspect(_) => super::not_implemented("image inspect"),
        ImageCmd::Rm(_) => super::not_implemented("image rm"),
        ImageCmd::Import(_) => super::not_implemented("image import"),
        ImageCmd::Convert(_) => super::not_implemented("image convert"),
    }
}
