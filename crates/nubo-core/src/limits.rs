//! Limits shared by crates that do not depend on each other: the seed codec (`nubo-seed`)
//! enforces them when it writes, the spec (`nubo-spec`) checks them before anything is made.

/// The largest file a NoCloud seed holds (user-data, meta-data, network-config, vendor-data):
/// 16 MiB is far above any real cloud-config and keeps a seed small enough to build in memory.
pub const MAX_SEED_FILE_SIZE: u64 = 16 * 1024 * 1024;
