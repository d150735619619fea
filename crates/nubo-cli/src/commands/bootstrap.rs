use crate::cli::bootstrap::BootstrapArgs;
use crate::settings::Settings;

pub fn run(_args: &BootstrapArgs, _settings: &Settings) -> anyhow::Result<()> {
    super::not_implemented("image bootstrap")
}
