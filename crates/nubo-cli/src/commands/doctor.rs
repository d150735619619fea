use crate::cli::DoctorArgs;
use crate::settings::Settings;

pub fn run(_args: &DoctorArgs, _settings: &Settings) -> anyhow::Result<()> {
    super::not_implemented("doctor")
}
