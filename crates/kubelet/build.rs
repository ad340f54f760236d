//! Compiles `src/bin/kube-sim-supervisor.rs` on its own, for the kubelet to embed (see
//! `src/process.rs`): pods without bubblewrap run under that supervisor wherever the kubelet
//! library is linked, so it cannot be a binary found at run time. The file uses only `std`, so
//! plain `rustc` builds it; Cargo also builds and lints it as the `kube-sim-supervisor` target.

use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "src/bin/kube-sim-supervisor.rs";

fn main() -> Result<(), String> {
    println!("cargo::rerun-if-changed={SOURCE}");
    let var = |name: &str| std::env::var_os(name).ok_or(format!("cargo did not set {name}"));
    let out = PathBuf::from(var("OUT_DIR")?).join("kube-sim-supervisor");
    let target = var("TARGET")?;
    let mut rustc = Command::new(var("RUSTC")?);
    rustc
        .args([
            "--edition=2024",
            "--crate-type=bin",
            "--crate-name=kube_sim_supervisor",
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
