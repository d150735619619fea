//! A private PKI for a test's libvirtd listening for TLS: a CA, a server certificate for the
//! address it listens on, and a client certificate, made with `openssl` in libvirt's layouts
//! (`server/`: `cacert.pem`, `servercert.pem`, `serverkey.pem`; `client/`: `cacert.pem`,
//! `clientcert.pem`, `clientkey.pem`, the `--tls-dir` nubo is given).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::cli::run;

const QUICK: Duration = Duration::from_secs(60);

pub struct Pki {
    pub server: PathBuf,
    pub client: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) -> Result<(), String> {
    run(Command::new("openssl").current_dir(dir).args(args), QUICK)?.require()?;
    Ok(())
}

fn write(p: &Path, text: &str) -> Result<(), String> {
    fs::write(p, text).map_err(|e| format!("cannot write {}: {e}", p.display()))
}

/// Makes the PKI under `dir` for a server at the IPv4 address `addr`.
pub fn make(dir: &Path, addr: &str) -> Result<Pki, String> {
    let server = dir.join("server");
    let client = dir.join("client");
    for d in [dir, &server, &client] {
        fs::create_dir_all(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
    }
    let days = "2";
    openssl(dir, &["genrsa", "-out", "ca.key", "2048"])?;
    write(
        &dir.join("ca.ext"),
        "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n",
    )?;
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-days",
            days,
            "-subj",
            "/CN=nubo test CA",
            "-out",
            "ca.pem",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    )?;
    for (name, ext, subj) in [
        (
            "server",
            format!(
                "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:{addr}\n"
            ),
            format!("/CN={addr}"),
        ),
        (
            "client",
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n"
                .to_owned(),
            "/CN=nubo-test-client".to_owned(),
        ),
    ] {
        write(&dir.join(format!("{name}.ext")), &ext)?;
        openssl(dir, &["genrsa", "-out", &format!("{name}.key"), "2048"])?;
        openssl(
            dir,
            &["req", "-new", "-key", &format!("{name}.key"), "-subj", &subj, "-out", &format!("{name}.csr")],
        )?;
        openssl(
            dir,
            &[
                "x509", "-req", "-in", &format!("{name}.csr"), "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-days", days, "-extfile", &format!("{name}.ext"), "-out", &format!("{name}.pem"),
            ],
        )?;
    }
    let cp = |from: &str, to: PathBuf, mode: u32| -> Result<(), String> {
        use std::os::unix::fs::PermissionsExt;
        fs::copy(dir.join(from), &to).map_err(|e| format!("cannot copy {from}: {e}"))?;
        fs::set_permissions(&to, fs::Permissions::from_mode(mode)).map_err(|e| format!("chmod {}: {e}", to.display()))
    };
    cp("ca.pem", server.join("cacert.pem"), 0o644)?;
    cp("server.pem", server.join("servercert.pem"), 0o644)?;
    cp("server.key", server.join("serverkey.pem"), 0o600)?;
    cp("ca.pem", client.join("cacert.pem"), 0o644)?;
    cp("client.pem", client.join("clientcert.pem"), 0o644)?;
    cp("client.key", client.join("clientkey.pem"), 0o600)?;
    Ok(Pki { server, client })
}
