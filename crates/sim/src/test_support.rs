//! Helpers for tests of this and other crates: building workspace binaries that pods run.

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

/// A temporary directory whose files pods can read: bubblewrapped pods get a private `/tmp`,
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
