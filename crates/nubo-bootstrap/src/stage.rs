//! The build's stages and the progress callback told about them. Its own module so the build
//! (which runs stages) and the runner (which reports a stage's output) both depend on it and
//! not on each other.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Packages,
    Partition,
    RootFs,
    BiosBoot,
    Esp,
    Convert,
    Digest,
    /// `--format iso` only: the hybrid ISO around the disk's root filesystem.
    Iso,
}

impl Stage {
    pub const ALL: [Stage; 8] = [
        Stage::Packages,
        Stage::Partition,
        Stage::RootFs,
        Stage::BiosBoot,
        Stage::Esp,
        Stage::Convert,
        Stage::Digest,
        Stage::Iso,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Stage::Packages => "installing packages (mmdebstrap)",
            Stage::Partition => "partitioning (GPT: BIOS boot, ESP, root)",
            Stage::RootFs => "writing the root filesystem (ext4)",
            Stage::BiosBoot => "installing GRUB for BIOS",
            Stage::Esp => "writing the EFI system partition",
            Stage::Convert => "converting to qcow2",
            Stage::Digest => "computing sha256",
            Stage::Iso => "making the hybrid ISO (grub-mkrescue, root image shrunk)",
        }
    }

    /// 1-based position, for `[n/8]`.
    pub fn number(self) -> usize {
        Stage::ALL.iter().position(|s| *s == self).map_or(0, |i| i + 1)
    }
}

/// Told about each stage as it happens.
pub trait Progress {
    fn started(&mut self, stage: Stage);
    /// A line the stage's tool printed (mmdebstrap's `I: ...` progress, warnings), control
    /// characters escaped.
    fn detail(&mut self, _stage: Stage, _line: &str) {}
    fn finished(&mut self, stage: Stage, elapsed: Duration);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_counts_from_one() {
        assert_eq!((Stage::Packages.number(), Stage::Digest.number()), (1, 7));
    }
}
