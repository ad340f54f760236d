//! The router's secrets: a random bearer token or signing key per cluster, written for the owner
//! only.

use std::io::{Read as _, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use crate::error::{Error, Result};

/// File name of the router's bearer token in the data directory ([`RouterAuth::Token`](crate::RouterAuth::Token)).
pub const TOKEN_FILE: &str = "router-token";
/// File name of the router's signing key in the data directory ([`RouterAuth::Scoped`](crate::RouterAuth::Scoped)).
pub const SIGNING_KEY_FILE: &str = "router-signing-key";

/// 32 random bytes from the kernel, hex-encoded: the format of the router's token and signing
/// key files (and of the key `cargo xtask cluster up` writes).
pub fn new_secret() -> Result<String> {
    let mut raw = [0_u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut raw))
        .map_err(Error::io("read random bytes from", "/dev/urandom"))?;
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
}

/// Writes a fresh [`new_secret`] to `path`, readable by the owner only, and returns it.
pub(crate) fn write_new_secret(path: &Path) -> Result<String> {
    let secret = new_secret()?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(Error::io("create the router secret", path))?;
    file.write_all(secret.as_bytes())
        .map_err(Error::io("write the router secret to", path))?;
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn secrets_are_fresh_hex_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(TOKEN_FILE);
        let first = write_new_secret(&path).unwrap();
        assert_eq!(first.len(), 64);
        assert!(first.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), first);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_ne!(write_new_secret(&path).unwrap(), first);
    }
}
