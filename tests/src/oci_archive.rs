//! The smallest OCI image archive a container runtime imports: one uncompressed layer holding
//! a few host files (static binaries such as Debian's `catatonit` and `busybox-static`), a
//! config with an entrypoint, a manifest, and an index naming the image, in an OCI image
//! layout tar (`ctr images import` reads it). The node tier makes its pause image and its test
//! image with it; our product images come from `cargo xtask images`, not from here.

use std::path::{Path, PathBuf};

use serde_json::json;
use sha2::{Digest as _, Sha256};

use crate::error::{Error, Result};

/// One file of the layer: where it goes in the image and where it comes from on the host.
#[derive(Clone, Debug)]
pub struct LayerFile {
    /// Its absolute path in the image (`/bin/busybox`).
    pub image_path: String,
    /// The host file whose contents and mode it gets.
    pub source: PathBuf,
}

/// An image of one layer.
#[derive(Clone, Debug)]
pub struct OneLayerImage {
    /// Its reference (`registry.k8s.io/pause:3.10`), which the runtime stores it under.
    pub name: String,
    /// The config's `Entrypoint`.
    pub entrypoint: Vec<String>,
    /// The layer's files (their parent directories are added).
    pub files: Vec<LayerFile>,
}

fn digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let hex: String = hash.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("sha256:{hex}")
}

/// A ustar header block (every name here is shorter than 100 bytes).
fn tar_header(name: &str, mode: u32, size: u64, directory: bool) -> Result<[u8; 512]> {
    if name.len() >= 100 {
        return Err(Error::Config(format!(
            "{name} is too long for a tar header of the test image"
        )));
    }
    let mut block = [0u8; 512];
    let mut put = |offset: usize, bytes: &[u8]| {
        block[offset..offset + bytes.len()].copy_from_slice(bytes);
    };
    put(0, name.as_bytes());
    put(100, format!("{mode:07o}\0").as_bytes());
    put(108, b"0000000\0");
    put(116, b"0000000\0");
    put(124, format!("{size:011o}\0").as_bytes());
    put(136, b"00000000000\0");
    put(156, if directory { b"5" } else { b"0" });
    put(257, b"ustar\0");
    put(263, b"00");
    // The checksum is computed with its own field as spaces.
    block[148..156].copy_from_slice(b"        ");
    let sum: u32 = block.iter().map(|byte| u32::from(*byte)).sum();
    block[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    Ok(block)
}

/// Appends one entry (header, contents, padding) to a tar stream.
fn tar_entry(out: &mut Vec<u8>, name: &str, mode: u32, contents: Option<&[u8]>) -> Result<()> {
    let size = contents.map_or(0, <[u8]>::len);
    out.extend_from_slice(&tar_header(name, mode, size as u64, contents.is_none())?);
    if let Some(contents) = contents {
        out.extend_from_slice(contents);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    Ok(())
}

/// Ends a tar stream (two zero blocks).
fn tar_end(out: &mut Vec<u8>) {
    out.resize(out.len() + 1024, 0);
}

impl OneLayerImage {
    /// The layer: the parent directories of every file, then the files, owned by root.
    fn layer(&self) -> Result<Vec<u8>> {
        use std::os::unix::fs::PermissionsExt as _;
        let mut tar = Vec::new();
        let mut directories: Vec<String> = Vec::new();
        for file in &self.files {
            let relative = file.image_path.trim_start_matches('/');
            let mut parent = String::new();
            for part in relative
                .split('/')
                .rev()
                .skip(1)
                .collect::<Vec<_>>()
                .iter()
                .rev()
            {
                parent.push_str(part);
                parent.push('/');
                if !directories.contains(&parent) {
                    tar_entry(&mut tar, &parent, 0o755, None)?;
                    directories.push(parent.clone());
                }
            }
            let contents = std::fs::read(&file.source).map_err(Error::io("read", &file.source))?;
            let mode = std::fs::metadata(&file.source)
                .map_err(Error::io("stat", &file.source))?
                .permissions()
                .mode()
                & 0o7777;
            tar_entry(&mut tar, relative, mode, Some(&contents))?;
        }
        tar_end(&mut tar);
        Ok(tar)
    }

    /// The archive's bytes (an OCI image layout in a tar).
    pub fn archive(&self) -> Result<Vec<u8>> {
        let layer = self.layer()?;
        let config = serde_json::to_vec(&json!({
            "architecture": std::env::consts::ARCH.replace("x86_64", "amd64").replace("aarch64", "arm64"),
            "os": "linux",
            "config": { "Entrypoint": self.entrypoint, "WorkingDir": "/" },
            "rootfs": { "type": "layers", "diff_ids": [digest(&layer)] },
        }))
        .map_err(|e| Error::Config(format!("cannot write an image config: {e}")))?;
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": digest(&config),
                "size": config.len(),
            },
            "layers": [{
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": digest(&layer),
                "size": layer.len(),
            }],
        }))
        .map_err(|e| Error::Config(format!("cannot write an image manifest: {e}")))?;
        let tag = self.name.rsplit_once(':').map_or("latest", |(_, tag)| tag);
        let index = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": digest(&manifest),
                "size": manifest.len(),
                "annotations": {
                    "io.containerd.image.name": self.name,
                    "org.opencontainers.image.ref.name": tag,
                },
            }],
        }))
        .map_err(|e| Error::Config(format!("cannot write an image index: {e}")))?;
        let mut tar = Vec::new();
        tar_entry(
            &mut tar,
            "oci-layout",
            0o644,
            Some(br#"{"imageLayoutVersion":"1.0.0"}"#),
        )?;
        tar_entry(&mut tar, "index.json", 0o644, Some(&index))?;
        tar_entry(&mut tar, "blobs/", 0o755, None)?;
        tar_entry(&mut tar, "blobs/sha256/", 0o755, None)?;
        for blob in [&layer, &config, &manifest] {
            let name = format!("blobs/sha256/{}", &digest(blob)["sha256:".len()..]);
            tar_entry(&mut tar, &name, 0o644, Some(blob))?;
        }
        tar_end(&mut tar);
        Ok(tar)
    }

    /// Writes the archive to `path`.
    pub fn write_to(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.archive()?).map_err(Error::io("write", path))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn headers_carry_a_valid_checksum_and_octal_fields() {
        let block = tar_header("bin/busybox", 0o755, 1234, false).unwrap();
        let stored = std::str::from_utf8(&block[148..154]).unwrap();
        let mut copy = block;
        copy[148..156].copy_from_slice(b"        ");
        let sum: u32 = copy.iter().map(|byte| u32::from(*byte)).sum();
        assert_eq!(u32::from_str_radix(stored, 8).unwrap(), sum);
        assert_eq!(&block[124..136], b"00000002322\0");
        assert_eq!(block[156], b'0');
        assert!(tar_header(&"x".repeat(100), 0o644, 0, false).is_err());
    }

    #[test]
    fn the_archive_names_the_image_and_holds_every_blob_it_refers_to() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("tool");
        std::fs::write(&source, b"#!/bin/sh\n").unwrap();
        let image = OneLayerImage {
            name: "e2e.local/tool:1".to_owned(),
            entrypoint: vec!["/bin/tool".to_owned()],
            files: vec![LayerFile {
                image_path: "/bin/tool".to_owned(),
                source,
            }],
        };
        let archive = image.archive().unwrap();
        let text = String::from_utf8_lossy(&archive);
        assert!(text.contains("\"io.containerd.image.name\":\"e2e.local/tool:1\""));
        assert!(text.contains("bin/tool"));
        let layer = image.layer().unwrap();
        assert!(text.contains(&format!("blobs/sha256/{}", &digest(&layer)[7..])));
        assert_eq!(archive.len() % 512, 0);
    }
}
