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

/// The path of a storage volume's backing store, from the volume's XML (`None`: it has none).
pub fn volume_backing(xml: &str) -> Result<Option<String>, String> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| format!("libvirt returned unreadable volume XML: {e}"))?;
    Ok(doc
        .root_element()
        .children()
        .find(|n| n.has_tag_name("backingStore"))
        .and_then(|b| b.children().find(|n| n.has_tag_name("path")))
        .and_then(|n| n.text())
        .map(|t| t.trim().to_owned()))
}

/// What identifies a file-backed volume's bytes without reading them: its key, capacity and
/// modification time (libvirt refreshes them from the file when it returns the XML; any write
/// moves the mtime, to the nanosecond). `None` when the pool reports no mtime (not a file).
pub fn volume_fingerprint(xml: &str) -> Option<String> {
    let doc = roxmltree::Document::parse(xml).ok()?;
    let root = doc.root_element();
    let text = |n: roxmltree::Node| n.text().map(|t| t.trim().to_owned());
    let key = root.children().find(|n| n.has_tag_name("key")).and_then(text)?;
    let cap = root.children().find(|n| n.has_tag_name("capacity")).and_then(text)?;
    let mtime = root
        .children()
        .find(|n| n.has_tag_name("target"))?
        .children()
        .find(|n| n.has_tag_name("timestamps"))?
        .children()
        .find(|n| n.has_tag_name("mtime"))
        .and_then(text)
        .filter(|t| !t.is_empty())?;
    Some(format!("{key}\n{cap}\n{mtime}"))
}

/// What nubo needs from a snapshot's XML.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub name: String,
    /// The domain's state when it was taken: `running`/`paused` snapshots hold memory.
    pub state: String,
    /// Seconds since the epoch.
    pub created: Option<u64>,
    pub parent: Option<String>,
}

impl SnapshotInfo {
    pub fn has_memory(&self) -> bool {
        matches!(self.state.as_str(), "running" | "paused" | "blocked")
    }
}

pub fn parse_snapshot(xml: &str) -> Result<SnapshotInfo, String> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| format!("libvirt returned unreadable snapshot XML: {e}"))?;
    let root = doc.root_element();
    let text = |n: roxmltree::Node<'_, '_>, name: &str| {
        n.children()
            .find(|c| c.has_tag_name(name))
            .and_then(|c| c.text())
            .map(|t| t.trim().to_owned())
    };
    Ok(SnapshotInfo {
        name: text(root, "name").ok_or("snapshot XML without <name>")?,
        state: text(root, "state").unwrap_or_default(),
        created: text(root, "creationTime").and_then(|t| t.parse().ok()),
        parent: root
            .children()
            .find(|c| c.has_tag_name("parent"))
            .and_then(|p| text(p, "name")),
    })
}

/// `xml` (a saved snapshot) with its domain's `<uuid>` replaced by `uuid`, so it can be
/// redefined onto the domain as it is now. Everything else is kept byte for byte.
pub fn rewrite_snapshot_uuid(xml: &str, uuid: &str) -> Result<String, String> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| format!("unreadable snapshot XML: {e}"))?;
    let domain = doc
        .root_element()
        .children()
        .find(|c| c.has_tag_name("domain"))
        .ok_or("snapshot XML without its <domain>")?;
    let text = domain
        .children()
        .find(|c| c.has_tag_name("uuid"))
        .and_then(|u| u.first_child())
        .filter(|t| t.is_text())
        .ok_or("snapshot XML's domain has no <uuid>")?;
    let r = text.range();
    Ok(format!(
        "{}{}{}",
        &xml[..r.start],
        super::render::escape(uuid),
        &xml[r.end..]
    ))
}
