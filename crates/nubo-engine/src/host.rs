//! Facts about the host that admission checks use: total memory and CPUs.

use nubo_spec::HostFacts;

/// Reads `/proc/meminfo`'s MemTotal and the CPUs this process may use. A host whose facts
/// cannot be read admits everything (the VMM will say what it cannot do).
pub fn facts() -> HostFacts {
    let memory_bytes = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| mem_total(&t))
        .unwrap_or(u64::MAX);
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(u32::MAX);
    HostFacts { memory_bytes, cpus }
}

/// `MemTotal:       24590000 kB` -> bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total_parses_kib() {
        assert_eq!(mem_total("MemFree: 1 kB\nMemTotal:  2048 kB\n"), Some(2 << 20));
    }

    #[test]
    fn mem_total_missing_is_none() {
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
    }
}
