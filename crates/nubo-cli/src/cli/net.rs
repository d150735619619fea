//! The network limits every command that talks to a registry or a mirror shares.

use std::time::Duration;

/// `--timeout`, `--speed-limit`, `--speed-time` (curl's `--max-time`, `--speed-limit`,
/// `--speed-time`).
#[derive(Debug, Clone, clap::Args)]
pub struct NetLimitArgs {
    /// Most one request may take (a manifest, a token, a checksum file, a blob's response
    /// headers), e.g. `30s`, `5m`
    #[arg(long, value_name = "DURATION", default_value = "120s", value_parser = duration)]
    pub timeout: Duration,
    /// Slowest a download or upload may average over each --speed-time window, in bytes/s
    #[arg(long, value_name = "BYTES_PER_S", default_value_t = 1024)]
    pub speed_limit: u64,
    /// The window --speed-limit is measured over (also the longest wait for one byte)
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = duration)]
    pub speed_time: Duration,
}

impl NetLimitArgs {
    pub fn limits(&self) -> nubo_image::http::Limits {
        nubo_image::http::Limits {
            timeout: self.timeout,
            speed_limit: self.speed_limit,
            speed_time: self.speed_time,
        }
    }
}

/// `30s`, `5m`, `1h`, or bare seconds; 1 s to 24 h, like every duration nubo takes.
fn duration(s: &str) -> Result<Duration, String> {
    let d = match s.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => humantime::parse_duration(s)
            .map_err(|e| format!("`{}` is not a duration like 30s or 5m ({e})", s.escape_debug()))?,
    };
    if d < Duration::from_secs(1) || d > Duration::from_secs(24 * 3600) {
        return Err("must be between 1s and 24h".into());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duration_bare_number_is_seconds() {
        assert_eq!(duration("90"), Ok(Duration::from_secs(90)));
    }

    #[test]
    fn duration_humantime_parses() {
        assert_eq!(duration("2m"), Ok(Duration::from_secs(120)));
    }

    #[test]
    fn duration_zero_refused() {
        assert!(duration("0s").is_err());
    }
}
