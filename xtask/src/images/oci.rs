//! `cargo xtask images --oci DIR`: the controller, router and runtime images as OCI image
//! archives, with no Docker engine and no registry: the release binaries built by cargo, on
//! layers unpacked from the Debian 12 packages pinned in the lock file
//! ([`debian`]), written as [`layout`] archives that
//! `ctr -n k8s.io images import` loads under the names a pod references.
//!
//! Layers, lowest first: `base` (distroless's `cc` equivalent, shared by all three images),
//! `runtime` (Python and the shell tools, runtime image only), then each image's own (accounts,
//! directories, binary). `cargo xtask images --lock` regenerates the lock.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};

use super::debian::{self, Locked};
use super::layout::{self, Image, Layer, RunConfig};
use super::rootfs::Tree;
use super::spec::{self, CARGO_PACKAGES, OCI_IMAGES, OciImage, PackageSet};
use super::{IMAGES, Options, reference, run};

/// One archive written.
#[derive(Debug)]
pub(crate) struct Written {
    pub(crate) path: PathBuf,
    /// The names its index gives its images.
    pub(crate) names: Vec<String>,
    /// The archive file's SHA-256.
    pub(crate) sha256: String,
    pub(crate) bytes: u64,
    /// Each image's manifest digest.
    pub(crate) manifests: Vec<String>,
    /// Each image's compressed size (config and layers).
    pub(crate) sizes: Vec<u64>,
}

/// The full name containerd and the kubelet use for a reference: `agent-sandbox/controller:dev`
/// is `docker.io/agent-sandbox/controller:dev`, `python:3` is `docker.io/library/python:3`; a
/// reference whose first component is a host (has `.` or `:`, or is `localhost`) is unchanged.
pub(crate) fn normalized(reference: &str) -> String {
    match reference.split_once('/') {
        None => format!("docker.io/library/{reference}"),
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => {
            reference.to_owned()
        }
        Some(_) => format!("docker.io/{reference}"),
    }
}

/// The layers' time: `SOURCE_DATE_EPOCH` when set, else 0.
fn epoch() -> Result<u64> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(value) if !value.is_empty() => value
            .trim()
            .parse()
            .with_context(|| format!("SOURCE_DATE_EPOCH={value} is not a Unix time")),
        _ => Ok(0),
    }
}

/// The layer of a package set: its locked packages unpacked (the base set finished with what the
/// installer and maintainer scripts would add) and its links.
pub(crate) fn set_layer(
    set: &PackageSet,
    locked: &[Locked],
    debs: &BTreeMap<String, Vec<u8>>,
    base: bool,
    epoch: u64,
) -> Result<Layer> {
    let mut tree = Tree::default();
    let members: Vec<&Locked> = locked.iter().filter(|p| p.set == set.name).collect();
    for package in &members {
        let bytes = debs
            .get(&package.name)
            .with_context(|| format!("{} was not fetched", package.name))?;
        let deb = super::deb::read(bytes)
            .with_context(|| format!("failed to read the package {}", package.name))?;
        tree.install(&package.name, &deb)?;
    }
    if base {
        tree.finish_base()?;
    }
    for (link, target) in set.links {
        tree.symlink(link, target)?;
    }
    let names: Vec<String> = members
        .iter()
        .map(|p| format!("{}={}", p.name, p.version))
        .collect();
    layout::layer(
        &tree,
        epoch,
        &format!(
            "debian bookworm packages ({}): {}",
            set.name,
            names.join(" ")
        ),
    )
}

/// The image of `oci` on the set layers built so far and its own layer around `binary`.
pub(crate) fn assemble(
    oci: &OciImage,
    arch: &str,
    set_layers: &BTreeMap<&str, Arc<Layer>>,
    binary: Vec<u8>,
    epoch: u64,
) -> Result<Image> {
    let mut layers = Vec::new();
    for set in oci.sets {
        layers.push(
            set_layers
                .get(set.name)
                .cloned()
                .with_context(|| format!("no layer of set {}", set.name))?,
        );
    }
    let own = Tree::image_layer(oci, binary)?;
    layers.push(Arc::new(layout::layer(
        &own,
        epoch,
        &format!(
            "{} as {}, accounts, directories",
            oci.entrypoint(),
            oci.account.name
        ),
    )?));
    let id = oci.account.id;
    let run_config = RunConfig {
        arch: arch.to_owned(),
        user: format!("{id}:{id}"),
        ports: oci.ports.to_vec(),
        env: oci
            .base_env
            .iter()
            .chain(oci.env)
            .map(|(key, value)| format!("{key}={value}"))
            .collect(),
        entrypoint: vec![oci.entrypoint()],
        working_dir: oci.working_dir().to_owned(),
    };
    layout::image(&run_config, layers, epoch)
}

/// `cargo xtask images --lock`.
pub(crate) fn lock(root: &Path) -> Result<Vec<String>> {
    let sets = spec::package_sets();
    let (path, locked) = debian::write_lock(root, &sets)?;
    let mut lines = Vec::new();
    for set in &sets {
        let count = locked.iter().filter(|p| p.set == set.name).count();
        let bytes: u64 = locked
            .iter()
            .filter(|p| p.set == set.name)
            .map(|p| p.size)
            .sum();
        lines.push(format!(
            "{}: {count} packages, {:.1} MiB of .deb files",
            set.name,
            bytes as f64 / 1048576.0
        ));
    }
    lines.push(format!("wrote {}", path.display()));
    Ok(lines)
}

/// The flags of the binaries' build: the caller's (`CARGO_ENCODED_RUSTFLAGS`, else
/// `RUSTFLAGS`), then path remappings, so that the checkout's and cargo's home directories,
/// which panic messages and debug info name, do not differ between two clones: builds of the
/// same commit in different directories give the same binaries, and the same digests.
fn remapped_rustflags(root: &Path) -> String {
    let mut flags: Vec<String> = match std::env::var("CARGO_ENCODED_RUSTFLAGS") {
        Ok(encoded) if !encoded.is_empty() => encoded.split('\x1f').map(str::to_owned).collect(),
        _ => std::env::var("RUSTFLAGS")
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect(),
    };
    flags.push(format!("--remap-path-prefix={}=/build", root.display()));
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")));
    if let Some(cargo_home) = cargo_home {
        flags.push(format!(
            "--remap-path-prefix={}=/cargo",
            cargo_home.display()
        ));
    }
    flags.join("\x1f")
}

/// `cargo xtask images --oci DIR`: builds the binaries, fetches the packages, writes
/// `DIR/<target>.tar` per image and `DIR/images.tar` with all three, and checks each archive by
/// reading it back.
pub(crate) fn build(root: &Path, options: &Options, dir: &Path) -> Result<Vec<Written>> {
    let started = Instant::now();
    let arch = debian::host_arch()?;
    let epoch = epoch()?;
    let sets = spec::package_sets();
    let locked = debian::read_lock(root, arch, &sets)?;
    let debs = debian::fetch(&locked)?;
    eprintln!(
        "{} Debian packages ready ({:.0?})",
        debs.len(),
        started.elapsed()
    );

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = Command::new(&cargo);
    command
        .current_dir(root)
        .args(["build", "--release", "--locked"])
        .env("CARGO_ENCODED_RUSTFLAGS", remapped_rustflags(root));
    for package in CARGO_PACKAGES {
        command.args(["-p", package]);
    }
    run(&mut command)?;
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    eprintln!("binaries built ({:.0?})", started.elapsed());

    let mut set_layers: BTreeMap<&str, Arc<Layer>> = BTreeMap::new();
    for (index, set) in sets.iter().enumerate() {
        let layer = set_layer(set, &locked, &debs, index == 0, epoch)?;
        eprintln!(
            "layer {}: {:.1} MiB compressed ({:.0?})",
            set.name,
            layer.blob.bytes.len() as f64 / 1048576.0,
            started.elapsed()
        );
        set_layers.insert(set.name, Arc::new(layer));
    }

    let mut images = Vec::new();
    for oci in &OCI_IMAGES {
        let path = target.join("release").join(oci.binary);
        let binary =
            std::fs::read(&path).with_context(|| format!("failed to read {}", path.display()))?;
        let image = assemble(oci, arch, &set_layers, binary, epoch)?;
        let known = IMAGES
            .iter()
            .find(|image| image.target == oci.target)
            .with_context(|| format!("no image of target {}", oci.target))?;
        images.push((oci.target, image, normalized(&reference(known, options))));
    }

    std::fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
    let mut written = Vec::new();
    for (target, image, name) in &images {
        written.push(write(
            &dir.join(format!("{target}.tar")),
            &[(image, name.clone())],
            epoch,
        )?);
    }
    let all: Vec<(&Image, String)> = images
        .iter()
        .map(|(_, image, name)| (image, name.clone()))
        .collect();
    written.push(write(&dir.join("images.tar"), &all, epoch)?);
    eprintln!("archives written and checked ({:.0?})", started.elapsed());
    Ok(written)
}

/// Writes one archive, reads it back with [`layout::inspect`] and describes it.
fn write(path: &Path, images: &[(&Image, String)], epoch: u64) -> Result<Written> {
    let partial = path.with_extension("tar.part");
    let file = std::fs::File::create(&partial)
        .with_context(|| format!("failed to create {}", partial.display()))?;
    layout::write_archive(std::io::BufWriter::new(file), images, epoch)
        .with_context(|| format!("failed to write {}", partial.display()))?;
    std::fs::rename(&partial, path)
        .with_context(|| format!("failed to write {}", path.display()))?;
    let bytes =
        std::fs::read(path).with_context(|| format!("failed to read {}", path.display()))?;
    let inspected =
        layout::inspect(&bytes[..]).with_context(|| format!("{} is not valid", path.display()))?;
    let names: Vec<String> = inspected.iter().map(|i| i.name.clone()).collect();
    let expected: Vec<String> = images.iter().map(|(_, name)| name.clone()).collect();
    if names != expected {
        bail!("{} names {names:?}, not {expected:?}", path.display());
    }
    for (image, (built, _)) in inspected.iter().zip(images) {
        check_contents(image, &built.arch)
            .with_context(|| format!("{} in {}", image.name, path.display()))?;
    }
    Ok(Written {
        path: path.to_owned(),
        names,
        sha256: debian::sha256_hex(&bytes),
        bytes: bytes.len() as u64,
        manifests: inspected
            .iter()
            .map(|i| i.manifest_digest.clone())
            .collect(),
        sizes: inspected.iter().map(|i| i.size).collect(),
    })
}

/// What an image read back must hold to start: its architecture, a tag, the entrypoint, the
/// accounts, and the C library with its dynamic loader.
fn check_contents(image: &layout::Inspected, arch: &str) -> Result<()> {
    if image.architecture != arch || image.tag.is_empty() {
        bail!(
            "architecture {:?} (not {arch}) or no tag {:?}",
            image.architecture,
            image.tag
        );
    }
    let entrypoint = image
        .config
        .entrypoint
        .first()
        .context("no entrypoint")?
        .trim_start_matches('/');
    let (loader, links) = match arch {
        "arm64" => ("usr/lib/ld-linux-aarch64.so.1", &["lib"][..]),
        _ => ("usr/lib64/ld-linux-x86-64.so.2", &["lib", "lib64"][..]),
    };
    let files = [entrypoint, "etc/passwd", "etc/group", loader];
    for needed in files.iter().chain(links) {
        if !image
            .layers
            .iter()
            .flatten()
            .any(|entry| entry.path == *needed)
        {
            bail!("no {needed} in its layers");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::deb::{Entry, tests::fake_deb};
    use super::*;

    #[test]
    fn references_are_normalized_as_containerd_names_them() {
        assert_eq!(
            normalized("agent-sandbox/controller:dev"),
            "docker.io/agent-sandbox/controller:dev"
        );
        assert_eq!(normalized("python:3"), "docker.io/library/python:3");
        assert_eq!(
            normalized("ghcr.io/agent-sandbox-rs/sandbox-router:v1"),
            "ghcr.io/agent-sandbox-rs/sandbox-router:v1"
        );
        assert_eq!(normalized("localhost/x:1"), "localhost/x:1");
        assert_eq!(normalized("127.0.0.1:5001/x:1"), "127.0.0.1:5001/x:1");
    }

    fn locked(set: &str, name: &str) -> Locked {
        Locked {
            set: set.into(),
            name: name.into(),
            version: "1".into(),
            size: 0,
            sha256: String::new(),
            url: String::new(),
        }
    }

    /// The whole pipeline on tiny fake packages and binaries: the runtime image built twice is
    /// the same archive, and holds the table's configuration, both set layers and its own.
    #[test]
    fn an_image_from_fake_packages_is_reproducible_and_complete() {
        let build = |binary: &[u8]| {
            let debs: BTreeMap<String, Vec<u8>> = [
                (
                    "libc6".to_owned(),
                    fake_deb(
                        "Package: libc6\n",
                        &[Entry::File {
                            path: "lib/x86_64-linux-gnu/libc.so.6".into(),
                            mode: 0o644,
                            data: b"libc".to_vec(),
                        }],
                    ),
                ),
                (
                    "mawk".to_owned(),
                    fake_deb(
                        "Package: mawk\n",
                        &[Entry::File {
                            path: "usr/bin/mawk".into(),
                            mode: 0o755,
                            data: b"mawk".to_vec(),
                        }],
                    ),
                ),
            ]
            .into_iter()
            .collect();
            let lock = [locked("base", "libc6"), locked("runtime", "mawk")];
            let mut set_layers = BTreeMap::new();
            for (index, set) in spec::package_sets().iter().enumerate() {
                let layer = set_layer(set, &lock, &debs, index == 0, 0).unwrap();
                set_layers.insert(set.name, Arc::new(layer));
            }
            let runtime = &OCI_IMAGES[2];
            let image = assemble(runtime, "amd64", &set_layers, binary.to_vec(), 0).unwrap();
            let mut archive = Vec::new();
            layout::write_archive(
                &mut archive,
                &[(&image, "docker.io/agent-sandbox/runtime-python:dev".into())],
                0,
            )
            .unwrap();
            archive
        };
        let first = build(b"runtime");
        assert_eq!(
            debian::sha256_hex(&first),
            debian::sha256_hex(&build(b"runtime"))
        );
        assert_ne!(
            debian::sha256_hex(&first),
            debian::sha256_hex(&build(b"other"))
        );

        let images = layout::inspect(&first[..]).unwrap();
        let image = &images[0];
        assert_eq!(image.config.user, "1000:1000");
        assert_eq!(image.config.working_dir, "/app");
        assert_eq!(image.config.entrypoint, ["/usr/local/bin/sandbox-runtime"]);
        assert!(
            image
                .config
                .env
                .contains(&"SANDBOX_BASE_DIR=/app".to_owned())
        );
        assert!(image.config.env[0].starts_with("PATH=/usr/local/sbin:"));
        let has = |layer: usize, path: &str| image.layers[layer].iter().any(|e| e.path == path);
        assert!(has(0, "usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(has(0, "lib"));
        assert!(has(0, "var/lib/dpkg/status.d/libc6"));
        assert!(has(1, "usr/bin/mawk"));
        assert!(has(1, "usr/bin/awk"));
        assert!(has(2, "etc/passwd"));
        assert!(has(2, "usr/local/bin/sandbox-runtime"));
        let app = image.layers[2].iter().find(|e| e.path == "app/").unwrap();
        assert_eq!((app.uid, app.gid), (1000, 1000));
    }
}
