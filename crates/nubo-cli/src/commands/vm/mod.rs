use crate::cli::vm::VmCmd;
use crate::settings::Settings;

pub fn run(cmd: VmCmd, _settings: &Settings) -> anyhow::Result<()> {
    match cmd {
        VmCmd::Create(_) => super::not_implemented("vm create"),
    }
}
