//! Payloads (user-data, network-config, vendor-data): their bytes travel with the spec, but only
//! their digest is ever written out. User-data may carry passwords, so records and dry runs
//! hold `{sha256, len}`; two specs compare by content through the digest.

use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeStruct;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Bytes passed to the guest as they are, with their SHA-256.
///
/// Serialises as `{"sha256": "<hex>", "len": N}`. Deserialises from that (a record or a dry run:
/// the content is then unknown, see [`Payload::content`]) or from a string, which is the content
/// itself (a manifest's inline `userData: |`). Equality is by digest and length.
#[derive(Clone)]
pub struct Payload {
    content: Option<Vec<u8>>,
    sha256: String,
    len: u64,
}

impl Payload {
    pub fn new(content: Vec<u8>) -> Payload {
        let sha256 = sha256_hex(&content);
        let len = content.len() as u64;
        Payload {
            content: Some(content),
            sha256,
            len,
        }
    }

    /// The bytes, or `None` when this payload was read back from a record or dry run, which
    /// hold only the digest.
    pub fn content(&self) -> Option<&[u8]> {
        self.content.as_deref()
    }

    /// Lowercase hex SHA-256 of the content.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The content's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

fn sha256_hex(data: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    nubo_core::hex(d.as_ref())
}

pub(crate) fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl PartialEq for Payload {
    fn eq(&self, other: &Payload) -> bool {
        self.sha256 == other.sha256 && self.len == other.len
    }
}

impl Eq for Payload {}

/// Never prints the content: it may hold secrets.
impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Payload")
            .field("sha256", &self.sha256)
            .field("len", &self.len)
            .field("content_known", &self.content.is_some())
            .finish()
    }
}

/// `sha256:<hex> (N bytes)`, as differences show it.
impl fmt::Display for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{} ({} bytes)", self.sha256, self.len)
    }
}

impl Serialize for Payload {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Payload", 2)?;
        st.serialize_field("sha256", &self.sha256)?;
        st.serialize_field("len", &self.len)?;
        st.end()
    }
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Payload, D::Error> {
        d.deserialize_any(PayloadVisitor)
    }
}

struct PayloadVisitor;

impl<'de> Visitor<'de> for PayloadVisitor {
    type Value = Payload;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the payload's text, or {sha256, len}")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Payload, E> {
        Ok(Payload::new(v.as_bytes().to_vec()))
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Payload, E> {
        Ok(Payload::new(v.to_vec()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Payload, A::Error> {
        let (mut sha256, mut len): (Option<String>, Option<u64>) = (None, None);
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "sha256" if sha256.is_none() => sha256 = Some(map.next_value()?),
                "len" if len.is_none() => len = Some(map.next_value()?),
                "sha256" | "len" => return Err(de::Error::duplicate_field("sha256 or len")),
                other => return Err(de::Error::unknown_field(other, &["sha256", "len"])),
            }
        }
        let sha256 = sha256.ok_or_else(|| de::Error::missing_field("sha256"))?;
        let len = len.ok_or_else(|| de::Error::missing_field("len"))?;
        if !is_hex(&sha256, 64) {
            return Err(de::Error::custom(format!(
                "payload digest `{sha256}` is not 64 lowercase hex digits: copy it from the record unchanged"
            )));
        }
        Ok(Payload {
            content: None,
            sha256,
            len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_new_computes_sha256_and_len() {
        let p = Payload::new(b"abc".to_vec());

        let (digest, len) = (p.sha256(), p.len());

        assert_eq!(
            digest,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(len, 3);
    }

    #[test]
    fn payload_serialize_omits_content() {
        let p = Payload::new(b"password: hunter2".to_vec());

        let json = serde_json::to_string(&p).unwrap();

        assert!(!json.contains("hunter2") && json.contains("\"sha256\""), "{json}");
    }

    #[test]
    fn payload_round_trip_keeps_digest_loses_content() {
        let p = Payload::new(b"#cloud-config\n".to_vec());

        let back: Payload = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();

        assert_eq!(back, p);
        assert_eq!(back.content(), None);
    }

    #[test]
    fn payload_deserialize_string_is_content() {
        let p: Payload = serde_json::from_str("\"#cloud-config\\n\"").unwrap();

        assert_eq!(p.content(), Some(&b"#cloud-config\n"[..]));
    }

    #[test]
    fn payload_deserialize_bad_digest_is_refused() {
        let err = serde_json::from_str::<Payload>(r#"{"sha256": "xyz", "len": 1}"#).unwrap_err();

        assert!(err.to_string().contains("`xyz`"), "{err}");
    }

    #[test]
    fn payload_debug_hides_content() {
        let p = Payload::new(b"hunter2".to_vec());

        let shown = format!("{p:?}");

        assert!(!shown.contains("hunter2") && !shown.contains("104"), "{shown}");
    }
}
