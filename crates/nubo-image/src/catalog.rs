//! The built-in distro catalog: where each release's amd64 cloud image and its checksum file live,
//! in which format, and which account cloud-init creates. Pure: URLs are built from a base URL the
//! caller chooses (the distro's own, `--mirror`, or `NUBO_MIRROR_<DISTRO>`).
//!
//! Published directories are mutable (`release/`, `latest/`, `.latest.`): a checksum file fetched
//! a minute before the image may describe another build. Where the layout allows, the alias is
//! resolved first to a concrete build, whose serial is recorded, and both files are taken from it.

use crate::checksum::{Algorithm, ChecksumError, ChecksumList};
use crate::reference::ImageRef;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Distro {
    Ubuntu,
    Debian,
    Rocky,
}

impl Distro {
    pub const ALL: [Distro; 3] = [Distro::Ubuntu, Distro::Debian, Distro::Rocky];

    pub fn name(self) -> &'static str {
        match self {
            Distro::Ubuntu => "ubuntu",
            Distro::Debian => "debian",
            Distro::Rocky => "rocky",
        }
    }

    /// The distro's own publishing location, used unless a mirror is given.
    pub fn default_base(self) -> &'static str {
        match self {
            Distro::Ubuntu => "https://cloud-images.ubuntu.com",
            Distro::Debian => "https://cloud.debian.org/images/cloud",
            Distro::Rocky => "https://dl.rockylinux.org/pub/rocky",
        }
    }

    /// The environment variable the CLI reads for this distro's mirror base URL.
    pub fn mirror_env(self) -> String {
        format!("NUBO_MIRROR_{}", self.name().to_ascii_uppercase())
    }

    /// The account the distro's cloud-init config creates for the seed's SSH keys.
    pub fn default_user(self) -> &'static str {
        self.name()
    }
}

/// How a checksum file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SumsFormat {
    /// `<hex>  name` lines of one algorithm (Ubuntu SHA256SUMS, Debian SHA512SUMS).
    Gnu(Algorithm),
    /// `SHA256 (name) = <hex>` (Rocky `.CHECKSUM`).
    Bsd,
}

impl SumsFormat {
    pub fn parse(self, text: &str) -> Result<ChecksumList, ChecksumError> {
        match self {
            SumsFormat::Gnu(a) => crate::checksum::parse_gnu(text, a),
            SumsFormat::Bsd => crate::checksum::parse_bsd(text),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatalogEntry {
    pub distro: Distro,
    /// Canonical tag: `24.04`, `12`, `9`.
    pub release: &'static str,
    pub codename: Option<&'static str>,
}

const CATALOG: &[CatalogEntry] = &[
    CatalogEntry {
        distro: Distro::Ubuntu,
        release: "24.04",
        codename: Some("noble"),
    },
    CatalogEntry {
        distro: Distro::Ubuntu,
        release: "22.04",
        codename: Some("jammy"),
    },
    CatalogEntry {
        distro: Distro::Debian,
        release: "12",
        codename: Some("bookworm"),
    },
    CatalogEntry {
        distro: Distro::Debian,
        release: "13",
        codename: Some("trixie"),
    },
    CatalogEntry {
        distro: Distro::Rocky,
        release: "9",
        codename: None,
    },
    CatalogEntry {
        distro: Distro::Rocky,
        release: "10",
        codename: None,
    },
];

/// The entry for a canonical reference (`ImageRef::parse` has already mapped code names).
pub fn lookup(r: &ImageRef) -> Option<&'static CatalogEntry> {
    CATALOG.iter().find(|e| e.distro.name() == r.name && e.release == r.tag)
}

/// Whether `name` is a catalog distro (so `debian:99` is "unknown release", not "not local").
pub fn is_distro(name: &str) -> bool {
    Distro::ALL.iter().any(|d| d.name() == name)
}

/// Every reference the catalog knows, for error messages and docs.
pub fn references() -> Vec<String> {
    CATALOG.iter().map(|e| e.reference().to_string()).collect()
}

/// A concrete place to download from: the image and its checksum file in one directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// Directory URL, ending in `/`.
    pub dir: String,
    pub file: String,
    pub sums_file: String,
    pub sums_format: SumsFormat,
}

impl Location {
    pub fn image_url(&self) -> String {
        format!("{}{}", self.dir, self.file)
    }

    pub fn sums_url(&self) -> String {
        format!("{}{}", self.dir, self.sums_file)
    }
}

impl CatalogEntry {
    pub fn reference(&self) -> ImageRef {
        ImageRef {
            name: self.distro.name().to_owned(),
            tag: self.release.to_owned(),
        }
    }

    fn codename(&self) -> &'static str {
        self.codename.unwrap_or(self.release)
    }

    /// Where to list concrete builds so a mutable alias can be pinned, if the layout allows it.
    /// Ubuntu: `releases/<ver>/` lists `release-<serial>/` next to the `release/` alias.
    pub fn listing_url(&self, base: &str) -> Option<String> {
        match self.distro {
            Distro::Ubuntu => Some(format!("{}/releases/{}/", trim(base), self.release)),
            Distro::Debian | Distro::Rocky => None,
        }
    }

    /// The image and checksum file under `base`; `serial` pins Ubuntu's `release-<serial>/`.
    pub fn location(&self, base: &str, serial: Option<&str>) -> Location {
        let base = trim(base);
        match self.distro {
            Distro::Ubuntu => {
                let dir = match serial {
                    Some(s) => format!("release-{s}"),
                    None => "release".to_owned(),
                };
                Location {
                    dir: format!("{base}/releases/{}/{dir}/", self.release),
                    file: format!("ubuntu-{}-server-cloudimg-amd64.img", self.release),
                    sums_file: "SHA256SUMS".into(),
                    sums_format: SumsFormat::Gnu(Algorithm::Sha256),
                }
            }
            Distro::Debian => Location {
                dir: format!("{base}/{}/latest/", self.codename()),
                file: format!("debian-{}-genericcloud-amd64.qcow2", self.release),
                sums_file: "SHA512SUMS".into(),
                sums_format: SumsFormat::Gnu(Algorithm::Sha512),
            },
            Distro::Rocky => {
                let file = format!("Rocky-{}-GenericCloud-Base.latest.x86_64.qcow2", self.release);
                Location {
                    dir: format!("{base}/{}/images/x86_64/", self.release),
                    sums_file: format!("{file}.CHECKSUM"),
                    file,
                    sums_format: SumsFormat::Bsd,
                }
            }
        }
    }

    /// The file to download given the parsed checksum file: `loc.file` when listed, else (Rocky,
    /// whose `.latest.` CHECKSUM lists the build it points at) the single concrete build, whose
    /// version-date becomes the recorded serial.
    pub fn pick(&self, loc: &Location, list: &ChecksumList) -> Result<(String, Option<String>), ChecksumError> {
        if list.get(&loc.file).is_ok() || self.distro != Distro::Rocky {
            return list.get(&loc.file).map(|_| (loc.file.clone(), None));
        }
        let prefix = format!("Rocky-{}-GenericCloud-Base-", self.release);
        let builds: Vec<(&str, &str)> = list
            .names()
            .filter_map(|n| Some((n, n.strip_prefix(&prefix)?.strip_suffix(".x86_64.qcow2")?)))
            .filter(|(_, serial)| !serial.is_empty())
            .collect();
        match builds.as_slice() {
            [(name, serial)] => Ok(((*name).to_owned(), Some((*serial).to_owned()))),
            _ => Err(ChecksumError::Missing(loc.file.clone())),
        }
    }
}

fn trim(base: &str) -> &str {
    base.trim_end_matches('/')
}

/// The newest `release-<serial>/` in an Ubuntu directory listing (HTML from the mirror's web
/// server): serials are `YYYYMMDD` with an optional `.N` respin.
pub fn newest_ubuntu_serial(listing: &str) -> Option<String> {
    let mut best: Option<((u64, u64), &str)> = None;
    for piece in listing.split("release-").skip(1) {
        let Some(end) = piece.find('/') else { continue };
        let serial = &piece[..end];
        let (date, respin) = serial.split_once('.').unwrap_or((serial, "0"));
        if date.len() != 8 || !date.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let (Ok(d), Ok(r)) = (date.parse::<u64>(), respin.parse::<u64>()) else {
            continue;
        };
        if !matches!(best, Some((k, _)) if k >= (d, r)) {
            best = Some(((d, r), serial));
        }
    }
    best.map(|(_, s)| s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::parse_bsd;

    const H: &str = "8c2a5ea8d2c1b8bb1dbb8d0b9d4a1b3a6b8e45d54e1c8f1a5e9f76c46c7c3a21";

    fn entry(r: &str) -> &'static CatalogEntry {
        lookup(&ImageRef::parse(r).unwrap()).unwrap()
    }

    #[test]
    fn lookup_codename_alias_finds_release() {
        assert_eq!(entry("ubuntu:noble").release, "24.04");
    }

    #[test]
    fn lookup_unknown_release_is_none() {
        assert!(lookup(&ImageRef::parse("debian:99").unwrap()).is_none());
    }

    #[test]
    fn location_ubuntu_pinned_serial_uses_release_dir() {
        let loc = entry("ubuntu:24.04").location("https://m.example/ubuntu/", Some("20240423"));

        assert_eq!(
            loc.image_url(),
            "https://m.example/ubuntu/releases/24.04/release-20240423/ubuntu-24.04-server-cloudimg-amd64.img"
        );
        assert_eq!(
            loc.sums_url(),
            "https://m.example/ubuntu/releases/24.04/release-20240423/SHA256SUMS"
        );
    }

    #[test]
    fn location_debian_uses_codename_latest_and_sha512() {
        let loc = entry("debian:13").location(Distro::Debian.default_base(), None);

        assert_eq!(
            loc.image_url(),
            "https://cloud.debian.org/images/cloud/trixie/latest/debian-13-genericcloud-amd64.qcow2"
        );
        assert_eq!(loc.sums_format, SumsFormat::Gnu(Algorithm::Sha512));
    }

    #[test]
    fn location_rocky_uses_checksum_beside_image() {
        let loc = entry("rocky:10").location(Distro::Rocky.default_base(), None);

        assert_eq!(
            loc.sums_url(),
            "https://dl.rockylinux.org/pub/rocky/10/images/x86_64/Rocky-10-GenericCloud-Base.latest.x86_64.qcow2.CHECKSUM"
        );
    }

    #[test]
    fn pick_rocky_latest_resolves_to_concrete_build() {
        let e = entry("rocky:9");
        let loc = e.location("https://m", None);
        let list = parse_bsd(&format!(
            "SHA256 (Rocky-9-GenericCloud-Base-9.6-20250531.0.x86_64.qcow2) = {H}\n"
        ))
        .unwrap();

        let (file, serial) = e.pick(&loc, &list).unwrap();

        assert_eq!(file, "Rocky-9-GenericCloud-Base-9.6-20250531.0.x86_64.qcow2");
        assert_eq!(serial.as_deref(), Some("9.6-20250531.0"));
    }

    #[test]
    fn pick_rocky_other_major_is_missing() {
        let e = entry("rocky:9");
        let loc = e.location("https://m", None);
        let list = parse_bsd(&format!(
            "SHA256 (Rocky-10-GenericCloud-Base-10.0-20250609.1.x86_64.qcow2) = {H}\n"
        ))
        .unwrap();

        let err = e.pick(&loc, &list).unwrap_err();

        assert_eq!(err, ChecksumError::Missing(loc.file));
    }

    #[test]
    fn newest_ubuntu_serial_picks_latest_respin() {
        let html = r#"<a href="release-20240423/">release-20240423/</a>
            <a href="release-20240821.1/">x</a><a href="release-20240821/">x</a><a href="release/">release/</a>"#;

        assert_eq!(newest_ubuntu_serial(html).as_deref(), Some("20240821.1"));
    }

    #[test]
    fn newest_ubuntu_serial_without_builds_is_none() {
        assert_eq!(newest_ubuntu_serial("<a href=\"release/\">release/</a>"), None);
    }

    #[test]
    fn mirror_env_is_per_distro() {
        assert_eq!(Distro::Rocky.mirror_env(), "NUBO_MIRROR_ROCKY");
    }
}
