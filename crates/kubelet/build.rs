//! Compiles `src/bin/pod-sandbox/` on its own, for the kubelet to embed (see `src/sandbox.rs`):
//! every pod runs under that helper wherever the kubelet library is linked, so it cannot be a
//! binary found at run time. It uses only `std`, so plain `rustc` builds it; Cargo also builds,
//! lints and tests it as the `pod-sandbox` target.

use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "src/bin/pod-sandbox/main.rs";
const DIR: &str = "src/bin/pod-sandbox";

fn main() -> Result<(), String> {
    println!("cargo::rerun-if-changed={DIR}");
    let var = |name: &str| std::env::var_os(name).ok_or(format!("cargo did not set {name}"));
    let out = PathBuf::from(var("OUT_DIR")?).join("pod-sandbox");
    let target = var("TARGET")?;
    let mut rustc = Command::new(var("RUSTC")?);
    rustc
        .args([
            "--edition=2024",
            "--crate-type=bin",
            "--crate-name=pod_sandbox",
        ])
        .args([
            "-C",
            "opt-level=2",
            "-C",
            "panic=abort",
            "-C",
            "strip=symbols",
        ])
        .arg("--target")
        .arg(&target)
        .arg("-o")
        .arg(&out)
        .arg(SOURCE);
    if let Some(linker) = std::env::var_os("RUSTC_LINKER") {
        rustc.arg("-C").arg({
            let mut flag = std::ffi::OsString::from("linker=");
            flag.push(linker);
            flag
        });
    }
    let status = rustc
        .status()
        .map_err(|error| format!("failed to run rustc for {SOURCE}: {error}"))?;
    if !status.success() {
        return Err(format!("rustc failed to build {SOURCE} ({status})"));
    }
    Ok(())
}
