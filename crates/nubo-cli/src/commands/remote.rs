//! `--connect URI --tls-dir DIR`: the libvirt URI a verb talks to a remote host with.

use std::path::Path;

use anyhow::Context;
use nubo_spec::uri::Origin;
use nubo_spec::ConnectUri;

/// `connect` parsed as `--connect` is (the allowlist), with libvirt's `pkipath` set to
/// `tls_dir` once the directory holds readable `cacert.pem`, `clientcert.pem` and
/// `clientkey.pem`: the only way a URI gets `pkipath` (a manifest cannot name one).
pub fn connect_uri(connect: &str, tls_dir: Option<&Path>) -> anyhow::Result<ConnectUri> {
    let uri = ConnectUri::parse(connect, Origin::Spec).context("--connect")?;
    let Some(dir) = tls_dir else {
        return Ok(uri);
    };
    let abs = std::path::absolute(dir).with_context(|| format!("--tls-dir {}", dir.display()))?;
    nubo_backend::libvirt::tls::check_dir(&abs)
        .map_err(anyhow::Error::msg)
        .context("--tls-dir: it must hold libvirt's cacert.pem, clientcert.pem and clientkey.pem")?;
    uri.with_pkipath(&abs).context("--tls-dir")
}
