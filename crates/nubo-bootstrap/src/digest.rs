//! sha256, as the image store names blobs.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use ring::digest::{Context, SHA256};

pub fn hex(bytes: &[u8]) -> String {
    to_hex(ring::digest::digest(&SHA256, bytes).as_ref())
}

/// `sha256:<hex>` of a file, streamed.
pub fn file_digest(path: &Path) -> io::Result<String> {
    let mut f = File::open(path)?;
    let mut ctx = Context::new(&SHA256);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        ctx.update(&buf[..n]);
    }
    Ok(format!("sha256:{}", to_hex(ctx.finish().as_ref())))
}

use nubo_core::hex as to_hex;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_empty_is_known_sha256() {
        assert_eq!(
            hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn file_digest_matches_hex() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"abc").unwrap();

        assert_eq!(file_digest(&p).unwrap(), format!("sha256:{}", hex(b"abc")));
    }
}
