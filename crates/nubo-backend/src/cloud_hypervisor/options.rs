//! The cloud-hypervisor backend's own options (a spec's `overrides.cloud-hypervisor`). It has
//! none yet: its one machine is a microVM, and the neutral spec says all the rest.

use std::collections::BTreeMap;

use crate::BackendError;

pub const KEYS: &[&str] = &[];

/// Refuses every option, naming it. Pure.
pub fn parse(options: &BTreeMap<String, String>) -> Result<(), BackendError> {
    match options.keys().next() {
        Some(k) => Err(BackendError::InvalidSpec(format!(
            "cloud-hypervisor option `{k}` is unknown: the cloud-hypervisor backend takes no options"
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_any_key_is_refused_by_name() {
        let o: BTreeMap<String, String> = [("machine".to_string(), "q35".to_string())].into();

        let err = parse(&o).unwrap_err().to_string();

        assert!(err.contains("`machine`"), "{err}");
    }

    #[test]
    fn parse_empty_is_ok() {
        assert!(parse(&BTreeMap::new()).is_ok());
    }
}
