//! The seed policy: what goes into the NoCloud seed nubo builds. Pure: the bytes are made in
//! memory while planning, so a seed that cannot be built fails before anything is written.

use nubo_spec::VmSpec;

use crate::EngineError;

pub struct SeedBytes {
    pub bytes: Vec<u8>,
    /// Whether nubo's own key reaches the guest for sure (user-data of the user's own may
    /// override the vendor-data that carries it).
    pub nubo_key: bool,
    pub notes: Vec<String>,
}

/// The NoCloud seed for `spec`: instance-id = the VM's UUID, local-hostname = `hostname`.
/// User-data is passed through byte for byte; without any, nubo generates `#cloud-config`
/// with the hostname and keys. nubo's key rides in vendor-data when the user brings user-data.
/// `net` is the backend's static guest address (no DHCP on its network): it becomes the
/// network-config unless the user gave one.
pub fn build(
    spec: &VmSpec,
    uuid: &str,
    hostname: &str,
    nubo_key: &str,
    net: Option<&nubo_backend::GuestNetwork>,
    shared: &[nubo_backend::SharedDir],
) -> Result<SeedBytes, EngineError> {
    let ci = &spec.cloud_init;
    let mounts = crate::mounts::cloud_config(shared);
    let mut keys = ci.ssh_keys.clone();
    keys.push(nubo_key.to_owned());
    let mut notes = Vec::new();
    let (user_data, vendor_data) = match &ci.user_data {
        Some(ud) => {
            let vd = match &ci.vendor_data {
                Some(v) => v.content().unwrap_or_default().to_vec(),
                None => crate::mounts::append(
                    nubo_seed::render_cloud_config(&nubo_seed::CloudConfig {
                        hostname: None,
                        ssh_authorized_keys: keys,
                    }),
                    &mounts,
                ),
            };
            if !mounts.is_empty() {
                notes.push("the shared folders' `mounts:` go in vendor-data too: a `mounts:` key in your user-data replaces them".into());
            }
            notes.push(
                "your user-data is passed through as is; nubo's SSH key goes in vendor-data, so `nubo vm ssh` works unless your user-data sets ssh_authorized_keys (then add nubo's key, `nubo vm ssh-key`, to it)".into(),
            );
            (ud.content().unwrap_or_default().to_vec(), Some(vd))
        }
        None => (
            crate::mounts::append(
                nubo_seed::render_cloud_config(&nubo_seed::CloudConfig {
                    hostname: Some(hostname.to_owned()),
                    ssh_authorized_keys: keys,
                }),
                &mounts,
            ),
            ci.vendor_data
                .as_ref()
                .map(|v| v.content().unwrap_or_default().to_vec()),
        ),
    };
    let seed = nubo_seed::SeedSpec {
        instance_id: uuid.to_owned(),
        local_hostname: hostname.to_owned(),
        user_data: Some(user_data),
        network_config: match (&ci.network_config, net) {
            (Some(n), net) => {
                if let Some(g) = net {
                    notes.push(format!(
                        "your network-config is used as is: the backend's address {} for MAC {} (no DHCP on its network) is not applied",
                        g.address, g.mac
                    ));
                }
                Some(n.content().unwrap_or_default().to_vec())
            }
            (None, Some(g)) => Some(nubo_seed::render_network_config_static(&g.mac, &g.address, &g.gateway)?),
            (None, None) => None,
        },
        vendor_data,
    };
    Ok(SeedBytes {
        bytes: nubo_seed::build(&seed, nubo_seed::SeedFormat::Iso)?,
        nubo_key: ci.user_data.is_none(),
        notes,
    })
}
