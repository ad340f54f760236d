//! Helpers for tests of this and other crates: building workspace binaries that pods run, and
//! speaking HTTPS to the API server byte by byte (for what a kube client would not send).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::{Error, Result};

/// The target directory and profile of the running executable (a test binary lives in
/// `<target>/<profile>/deps/`).
fn target_and_profile(exe: &Path) -> Option<(PathBuf, String)> {
    let mut dir = exe.parent()?;
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir = dir.parent()?;
    }
    let profile = dir.file_name()?.to_string_lossy().into_owned();
    Some((dir.parent()?.to_path_buf(), profile))
}

fn built() -> &'static Mutex<HashMap<(String, String), PathBuf>> {
    static BUILT: OnceLock<Mutex<HashMap<(String, String), PathBuf>>> = OnceLock::new();
    BUILT.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Builds `bin` of workspace package `package` with `cargo build --workspace` (once per
/// process, into the running executable's target directory and profile) and returns its path.
///
/// `--workspace` makes every such build resolve features over the whole workspace, as
/// `cargo test --workspace` does: the binaries reuse that run's dependency artifacts instead of
/// rebuilding the graph with a per-package feature set (minutes on a cold CI machine).
///
/// Meant for integration tests that need another crate's binary, e.g.
/// `workspace_binary("agent-sandbox-runtime", "sandbox-runtime")`. The lock is held during the
/// build, so parallel tests wait for one build instead of starting several.
pub fn workspace_binary(package: &str, bin: &str) -> Result<PathBuf> {
    let mut cache = built().lock().unwrap_or_else(PoisonError::into_inner);
    let key = (package.to_owned(), bin.to_owned());
    if let Some(path) = cache.get(&key) {
        return Ok(path.clone());
    }
    let exe = std::env::current_exe().map_err(|source| Error::CurrentExe { source })?;
    let (target, profile) = target_and_profile(&exe).ok_or_else(|| Error::CurrentExe {
        source: std::io::Error::other(format!(
            "{} is not inside a cargo target directory",
            exe.display()
        )),
    })?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = std::process::Command::new(cargo);
    command
        .args([
            "build",
            "--quiet",
            "--workspace",
            "--bin",
            bin,
            "--target-dir",
        ])
        .arg(&target);
    match profile.as_str() {
        "debug" => {}
        "release" => {
            command.arg("--release");
        }
        other => {
            command.args(["--profile", other]);
        }
    }
    if let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR") {
        command.current_dir(dir);
    }
    let status = command.status().map_err(|source| Error::CargoRun {
        package: package.to_owned(),
        bin: bin.to_owned(),
        source,
    })?;
    if !status.success() {
        return Err(Error::CargoFailed {
            package: package.to_owned(),
            bin: bin.to_owned(),
            status: status.to_string(),
        });
    }
    let path = target.join(&profile).join(bin);
    cache.insert(key, path.clone());
    Ok(path)
}

/// A temporary directory whose files pods can read: confined pods get a private `/tmp`,
/// so files a pod is pointed at (a kubeconfig, a key) must live elsewhere. Under the running
/// executable's target directory when there is one outside `/tmp`, else under `/var/tmp`
/// (a checkout in `/tmp` has its target directory there too).
pub fn pod_visible_dir(prefix: &str) -> std::io::Result<tempfile::TempDir> {
    let target = std::env::current_exe().ok().and_then(|exe| {
        exe.ancestors()
            .find(|dir| dir.file_name().is_some_and(|n| n == "target"))
            .map(Path::to_path_buf)
    });
    let base = match target {
        Some(dir) if !dir.starts_with("/tmp") => dir,
        _ => PathBuf::from("/var/tmp"),
    };
    tempfile::Builder::new().prefix(prefix).tempdir_in(base)
}

/// A TLS connection to the API server at `addr` that trusts only `ca_pem` (a sim's
/// [`Sim::ca_pem`](crate::Sim::ca_pem)) and verifies the server as 127.0.0.1.
pub async fn tls_connect(
    ca_pem: &str,
    addr: std::net::SocketAddr,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(cert.map_err(std::io::Error::other)?)
            .map_err(std::io::Error::other)?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::from(addr.ip());
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
}

/// Sends `request` (a whole HTTP/1.1 request; say `Connection: close`) over a
/// [`tls_connect`]ion and returns the status code and the body of the answer.
pub async fn https_exchange(
    ca_pem: &str,
    addr: std::net::SocketAddr,
    request: &[u8],
) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tls_connect(ca_pem, addr).await?;
    stream.write_all(request).await?;
    let mut response = Vec::new();
    // The server may close without a TLS close_notify; what arrived is the answer.
    if let Err(error) = stream.read_to_end(&mut response).await
        && response.is_empty()
    {
        return Err(error);
    }
    let text = String::from_utf8_lossy(&response).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_target_and_profile_of_test_binaries() {
        assert_eq!(
            target_and_profile(Path::new("/w/target/debug/deps/sim-123")),
            Some((PathBuf::from("/w/target"), "debug".to_owned()))
        );
        assert_eq!(
            target_and_profile(Path::new("/w/target/release/kube-sim")),
            Some((PathBuf::from("/w/target"), "release".to_owned()))
        );
    }
}
