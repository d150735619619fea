use crate::cli::seed::SeedCmd;
use crate::settings::Settings;

pub fn run(cmd: SeedCmd, _settings: &Settings) -> anyhow::Result<()> {
    match cmd {
        SeedCmd::Build(_) => super::not_implemented("seed build"),
        SeedCmd::Inspect(_) => super::not_implemented("seed inspect"),
    }
}
