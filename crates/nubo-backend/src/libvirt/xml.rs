//! Reading what libvirt hands back: domain XML parsed with a real XML parser (roxmltree,
//! which refuses DTDs, so no entity expansion), never searched as text.

use super::render::METADATA_NS;

/// What nubo needs from a domain's XML.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DomainInfo {
    pub name: Option<String>,
    pub uuid: Option<String>,
    /// nubo's marker: the VM directory of the nubo that defined it.
    pub nubo_dir: Option<String>,
    /// The first interface's MAC and libvirt network.
    pub mac: Option<String>,
    pub network: Option<String>,
    /// The CD-ROM's pool and volume.
    pub seed_volume: Option<(String, String)>,
}

pub fn parse_domain(xml: &str) -> Result<DomainInfo, String> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| format!("libvirt returned unreadable domain XML: {e}"))?;
    let root = doc.root_element();
    let child_text = |name: &str| {
        root.children()
            .find(|n| n.has_tag_name(name))
            .and_then(|n| n.text())
            .map(|t| t.trim().to_owned())
    };
    let mut info = DomainInfo {
        name: child_text("name"),
        uuid: child_text("uuid"),
        ..Default::default()
    };
    info.nubo_dir = root
        .descendants()
        .find(|n| n.has_tag_name((METADATA_NS, "dir")))
        .and_then(|n| n.text())
        .map(str::to_owned);
    if let Some(devices) = root.children().find(|n| n.has_tag_name("devices")) {
        if let Some(iface) = devices.children().find(|n| n.has_tag_name("interface")) {
            info.mac = iface
                .children()
                .find(|n| n.has_tag_name("mac"))
                .and_then(|n| n.attribute("address"))
                .map(str::to_owned);
            info.network = iface
                .children()
                .find(|n| n.has_tag_name("source"))
                .and_then(|n| n.attribute("network"))
                .map(str::to_owned);
        }
        info.seed_volume = devices
            .children()
            .filter(|n| n.has_tag_name("disk") && n.attribute("device") == Some("cdrom"))
            .filter_map(|d| d.children().find(|n| n.has_tag_name("source")))
            .find_map(|s| Some((s.attribute("pool")?.to_owned(), s.attribute("volume")?.to_owned())));
    }
    Ok(info)
}
