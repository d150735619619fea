//! User-data placeholders: `${vm.name}`, `${vm.namespace}`, `${vm.hostname}` and `${vm.uuid}`
//! are substituted; any other `${vm.*}` is an error (a condition on the VirtualMachine), never a
//! guess. Text outside `${vm.` is passed through byte for byte, so a shell script's own
//! `${HOME}` stays as it is.
//!
//! `${vm.uuid}` is the domain's UUID (the instance-id), which libvirt assigns at define: the
//! controller renders the other three and leaves `${vm.uuid}` to the engine, which substitutes
//! it when it builds the seed (`Engine::user_data_uuid`).

/// The values the placeholders stand for.
pub struct Vars<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub hostname: &'a str,
    /// `None` before the domain exists: `${vm.uuid}` is then left for the engine.
    pub uuid: Option<&'a str>,
}

/// Why user-data could not be rendered. Carries the placeholder's name only (never the
/// surrounding text: user-data comes from a Secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("user-data names the unknown placeholder `${{vm.{0}}}`: use ${{vm.name}}, ${{vm.namespace}}, ${{vm.hostname}} or ${{vm.uuid}}")]
    Unknown(String),
    #[error("user-data has a `${{vm.` placeholder without its closing `}}`: close it")]
    Unclosed,
}

/// The placeholders `data` uses, checked: an unknown one is an error.
pub fn check(data: &[u8]) -> Result<Vec<String>, RenderError> {
    let mut used = Vec::new();
    scan(data, |name| {
        if !used.iter().any(|u| u == name) {
            used.push(name.to_owned());
        }
        Ok(Vec::new())
    })?;
    Ok(used)
}

/// `data` with every placeholder replaced.
pub fn render(data: &[u8], vars: &Vars<'_>) -> Result<Vec<u8>, RenderError> {
    scan(data, |name| match name {
        "name" => Ok(vars.name.as_bytes().to_vec()),
        "namespace" => Ok(vars.namespace.as_bytes().to_vec()),
        "hostname" => Ok(vars.hostname.as_bytes().to_vec()),
        "uuid" => Ok(vars.uuid.unwrap_or("${vm.uuid}").as_bytes().to_vec()),
        other => Err(RenderError::Unknown(other.to_owned())),
    })
}

const OPEN: &[u8] = b"${vm.";
/// A placeholder's name is short; a longer run is not one of ours.
const MAX_NAME: usize = 64;

fn scan(data: &[u8], mut value: impl FnMut(&str) -> Result<Vec<u8>, RenderError>) -> Result<Vec<u8>, RenderError> {
    let mut out = Vec::with_capacity(data.len());
    let mut i = 0;
    while i < data.len() {
        if data[i..].starts_with(OPEN) {
            let start = i + OPEN.len();
            let end = data[start..]
                .iter()
                .take(MAX_NAME + 1)
                .position(|&b| b == b'}')
                .ok_or(RenderError::Unclosed)?;
            let name = &data[start..start + end];
            let name = match std::str::from_utf8(name) {
                Ok(n) if n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') => n,
                _ => {
                    return Err(RenderError::Unknown(
                        String::from_utf8_lossy(name).chars().take(MAX_NAME).collect(),
                    ))
                }
            };
            out.extend(value(name)?);
            i = start + end + 1;
        } else {
            out.push(data[i]);
            i += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> Vars<'static> {
        Vars {
            name: "web",
            namespace: "team",
            hostname: "web-01",
            uuid: Some("0f0e"),
        }
    }

    #[test]
    fn render_known_placeholders_substituted() {
        let out = render(
            b"#cloud-config\nfqdn: ${vm.hostname}.${vm.namespace} ${vm.name} ${vm.uuid} $HOME ${X}",
            &vars(),
        )
        .unwrap();
        assert_eq!(out, b"#cloud-config\nfqdn: web-01.team web 0f0e $HOME ${X}");
    }

    #[test]
    fn render_unknown_placeholder_refused() {
        let e = render(b"x ${vm.secret} y", &vars()).unwrap_err();
        assert_eq!(e, RenderError::Unknown("secret".into()));
        assert!(e.to_string().contains("${vm.secret}"), "{e}");
    }

    #[test]
    fn render_unclosed_placeholder_refused() {
        assert_eq!(render(b"${vm.name", &vars()).unwrap_err(), RenderError::Unclosed);
        let long = format!("${{vm.{}}}", "a".repeat(100));
        assert_eq!(render(long.as_bytes(), &vars()).unwrap_err(), RenderError::Unclosed);
    }

    #[test]
    fn render_uuid_unknown_left_for_engine() {
        let v = Vars { uuid: None, ..vars() };
        assert_eq!(render(b"id ${vm.uuid}", &v).unwrap(), b"id ${vm.uuid}");
    }

    #[test]
    fn check_lists_used_placeholders_once() {
        assert_eq!(check(b"${vm.name}${vm.name}${vm.uuid}").unwrap(), ["name", "uuid"]);
    }

    #[test]
    fn render_binary_input_passed_through() {
        let data: Vec<u8> = (0..=255u8).collect();
        assert_eq!(render(&data, &vars()).unwrap(), data);
    }
}
