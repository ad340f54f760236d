//! OCI images as bytes: layers (gzip-compressed tar of a [`Tree`]), the image config, the
//! manifest, and the archive of an OCI image layout (`oci-layout`, `index.json`,
//! `blobs/sha256/...` in one tar), the format `ctr images import` and `skopeo`'s
//! `oci-archive:` read. [`inspect`] reads such an archive back and checks every digest and size.
//!
//! Everything is reproducible: entries sorted, every time the one `epoch` (`SOURCE_DATE_EPOCH`,
//! else 0), owners numeric with no names, gzip headers without time or name, JSON from structs
//! (fixed key order) and sorted maps.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::Arc;

use anyhow::{Context as _, Result, bail, ensure};
use serde::{Deserialize, Serialize};

use super::debian::sha256_hex;
use super::rootfs::{Node, Tree};

pub(crate) const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub(crate) const MEDIA_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// containerd's annotation of an image's full name (what `ctr images import` names it).
pub(crate) const ANNOTATION_IMAGE_NAME: &str = "io.containerd.image.name";
/// The OCI annotation of a manifest's tag in a layout.
pub(crate) const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Content addressed by its SHA-256.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Blob {
    pub(crate) media_type: &'static str,
    pub(crate) digest: String,
    pub(crate) bytes: Vec<u8>,
}

impl Blob {
    pub(crate) fn new(media_type: &'static str, bytes: Vec<u8>) -> Self {
        Self {
            media_type,
            digest: format!("sha256:{}", sha256_hex(&bytes)),
            bytes,
        }
    }

    fn descriptor(&self) -> Descriptor {
        Descriptor {
            media_type: self.media_type.to_owned(),
            digest: self.digest.clone(),
            size: self.bytes.len() as u64,
            platform: None,
            annotations: BTreeMap::new(),
        }
    }
}

/// A compressed layer, the digest of its uncompressed tar (the config's `diff_ids`) and what
/// made it (the config's history).
#[derive(Clone, Debug)]
pub(crate) struct Layer {
    pub(crate) blob: Blob,
    pub(crate) diff_id: String,
    pub(crate) created_by: String,
}

/// The tar of a tree, gzip-compressed.
pub(crate) fn layer(tree: &Tree, epoch: u64, created_by: &str) -> Result<Layer> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, inode) in tree.entries() {
        let mut header = tar::Header::new_gnu();
        header.set_mode(inode.mode);
        header.set_uid(inode.uid.into());
        header.set_gid(inode.gid.into());
        header.set_mtime(epoch);
        match &inode.node {
            Node::Dir => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                builder.append_data(&mut header, format!("{path}/"), &[][..])?;
            }
            Node::File(data) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(data.len() as u64);
                builder.append_data(&mut header, path, &data[..])?;
            }
            Node::Symlink(target) => {
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_size(0);
                builder.append_link(&mut header, path, target)?;
            }
        }
    }
    let tar = builder.into_inner()?;
    let diff_id = format!("sha256:{}", sha256_hex(&tar));
    Ok(Layer {
        blob: Blob::new(MEDIA_LAYER, gzip(&tar)?),
        diff_id,
        created_by: created_by.to_owned(),
    })
}

/// gzip with no name and time 0 in its header.
fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    let mut encoder = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes)?;
    Ok(encoder.finish()?)
}

/// How a container of the image runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RunConfig {
    /// Debian's name of the architecture (`amd64`, `arm64`), OCI's too.
    pub(crate) arch: String,
    pub(crate) user: String,
    pub(crate) ports: Vec<u16>,
    pub(crate) env: Vec<String>,
    pub(crate) entrypoint: Vec<String>,
    pub(crate) working_dir: String,
}

/// An image: its manifest, config and layers (shared between images that have them in common).
#[derive(Clone, Debug)]
pub(crate) struct Image {
    pub(crate) manifest: Blob,
    pub(crate) config: Blob,
    pub(crate) layers: Vec<Arc<Layer>>,
    pub(crate) arch: String,
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Eq, Default)]
pub(crate) struct Empty {}

#[derive(Serialize, Deserialize, Debug)]
struct ConfigJson {
    created: String,
    architecture: String,
    os: String,
    config: ContainerJson,
    rootfs: RootfsJson,
    history: Vec<HistoryJson>,
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct ContainerJson {
    pub(crate) user: String,
    pub(crate) exposed_ports: BTreeMap<String, Empty>,
    pub(crate) env: Vec<String>,
    pub(crate) entrypoint: Vec<String>,
    pub(crate) working_dir: String,
}

#[derive(Serialize, Deserialize, Debug)]
struct RootfsJson {
    #[serde(rename = "type")]
    kind: String,
    diff_ids: Vec<String>,
}

#[derive(Serialize, Deserialize, Debug)]
struct HistoryJson {
    created: String,
    created_by: String,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    media_type: String,
    digest: String,
    size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    platform: Option<Platform>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
struct Platform {
    architecture: String,
    os: String,
}

#[derive(Serialize, Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
struct ManifestJson {
    schema_version: u32,
    media_type: String,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Serialize, Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
struct IndexJson {
    schema_version: u32,
    media_type: String,
    manifests: Vec<Descriptor>,
}

/// RFC 3339 of a Unix time.
fn rfc3339(epoch: u64) -> Result<String> {
    let seconds = i64::try_from(epoch).context("SOURCE_DATE_EPOCH out of range")?;
    Ok(jiff::Timestamp::from_second(seconds)
        .context("SOURCE_DATE_EPOCH out of range")?
        .to_string())
}

/// The config and manifest of an image of `layers`, lowest first.
pub(crate) fn image(run: &RunConfig, layers: Vec<Arc<Layer>>, epoch: u64) -> Result<Image> {
    let created = rfc3339(epoch)?;
    let config = ConfigJson {
        created: created.clone(),
        architecture: run.arch.clone(),
        os: "linux".to_owned(),
        config: ContainerJson {
            user: run.user.clone(),
            exposed_ports: run
                .ports
                .iter()
                .map(|port| (format!("{port}/tcp"), Empty {}))
                .collect(),
            env: run.env.clone(),
            entrypoint: run.entrypoint.clone(),
            working_dir: run.working_dir.clone(),
        },
        rootfs: RootfsJson {
            kind: "layers".to_owned(),
            diff_ids: layers.iter().map(|l| l.diff_id.clone()).collect(),
        },
        history: layers
            .iter()
            .map(|l| HistoryJson {
                created: created.clone(),
                created_by: l.created_by.clone(),
            })
            .collect(),
    };
    let config = Blob::new(MEDIA_CONFIG, serde_json::to_vec(&config)?);
    let manifest = ManifestJson {
        schema_version: 2,
        media_type: MEDIA_MANIFEST.to_owned(),
        config: config.descriptor(),
        layers: layers.iter().map(|l| l.blob.descriptor()).collect(),
    };
    Ok(Image {
        manifest: Blob::new(MEDIA_MANIFEST, serde_json::to_vec(&manifest)?),
        config,
        layers,
        arch: run.arch.clone(),
    })
}

/// Writes the OCI image layout of `images` (each with its full name, `registry/repo:tag`) as a
/// tar: every blob once, `index.json` naming each manifest for containerd
/// ([`ANNOTATION_IMAGE_NAME`]) and by tag for OCI tools ([`ANNOTATION_REF_NAME`]).
pub(crate) fn write_archive(
    out: impl Write,
    images: &[(&Image, String)],
    epoch: u64,
) -> Result<()> {
    let mut blobs: BTreeMap<&str, &[u8]> = BTreeMap::new();
    let mut manifests = Vec::new();
    for (image, name) in images {
        blobs.insert(&image.manifest.digest, &image.manifest.bytes);
        blobs.insert(&image.config.digest, &image.config.bytes);
        for layer in &image.layers {
            blobs.insert(&layer.blob.digest, &layer.blob.bytes);
        }
        let mut descriptor = image.manifest.descriptor();
        descriptor.platform = Some(Platform {
            architecture: image.arch.clone(),
            os: "linux".to_owned(),
        });
        descriptor
            .annotations
            .insert(ANNOTATION_IMAGE_NAME.to_owned(), name.clone());
        descriptor
            .annotations
            .insert(ANNOTATION_REF_NAME.to_owned(), tag(name).to_owned());
        manifests.push(descriptor);
    }
    let index = serde_json::to_vec(&IndexJson {
        schema_version: 2,
        media_type: MEDIA_INDEX.to_owned(),
        manifests,
    })?;
    let mut builder = tar::Builder::new(out);
    let mut append = |path: &str, data: Option<&[u8]>| -> Result<()> {
        let mut header = tar::Header::new_gnu();
        header.set_mtime(epoch);
        header.set_uid(0);
        header.set_gid(0);
        match data {
            None => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(0o755);
                header.set_size(0);
                builder.append_data(&mut header, path, &[][..])?;
            }
            Some(data) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(0o644);
                header.set_size(data.len() as u64);
                builder.append_data(&mut header, path, data)?;
            }
        }
        Ok(())
    };
    append("blobs/", None)?;
    append("blobs/sha256/", None)?;
    for (digest, bytes) in &blobs {
        let hex = digest
            .strip_prefix("sha256:")
            .context("a digest without sha256:")?;
        append(&format!("blobs/sha256/{hex}"), Some(bytes))?;
    }
    append("index.json", Some(&index))?;
    append("oci-layout", Some(br#"{"imageLayoutVersion":"1.0.0"}"#))?;
    builder.into_inner()?.flush()?;
    Ok(())
}

/// The tag of `registry/repo:tag` (`latest` without one).
fn tag(name: &str) -> &str {
    let last = name.rsplit('/').next().unwrap_or(name);
    last.rsplit_once(':').map_or("latest", |(_, tag)| tag)
}

/// An entry of a layer's tar, as read back by [`inspect`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LayerEntry {
    /// Directories with a trailing `/`.
    pub(crate) path: String,
    pub(crate) mode: u32,
    pub(crate) uid: u64,
    pub(crate) gid: u64,
    /// The target of a symbolic link.
    pub(crate) link: Option<String>,
}

/// One image of an archive, as read back by [`inspect`].
#[derive(Debug)]
pub(crate) struct Inspected {
    pub(crate) name: String,
    pub(crate) tag: String,
    pub(crate) manifest_digest: String,
    pub(crate) architecture: String,
    pub(crate) config: ContainerJson,
    /// Each layer's entries.
    pub(crate) layers: Vec<Vec<LayerEntry>>,
    /// Compressed size of the image (config and layers).
    pub(crate) size: u64,
}

/// Reads an archive written by [`write_archive`] (or any OCI layout tar of single-platform
/// manifests): checks the layout version, that every blob's digest and size are what its
/// descriptor says and that each layer's uncompressed digest is the config's `diff_id`, and
/// returns what each image is.
pub(crate) fn inspect(archive: impl Read) -> Result<Vec<Inspected>> {
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for entry in tar::Archive::new(archive).entries()? {
        let mut entry = entry?;
        if entry.header().entry_type().is_file() {
            let path = entry.path()?.to_string_lossy().into_owned();
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes)?;
            files.insert(path, bytes);
        }
    }
    let layout = files.get("oci-layout").context("no oci-layout")?;
    let layout: serde_json::Value = serde_json::from_slice(layout)?;
    ensure!(
        layout["imageLayoutVersion"] == "1.0.0",
        "oci-layout is {layout}"
    );
    let blob = |descriptor: &Descriptor| -> Result<&Vec<u8>> {
        let hex = descriptor
            .digest
            .strip_prefix("sha256:")
            .with_context(|| format!("digest {}", descriptor.digest))?;
        let bytes = files
            .get(&format!("blobs/sha256/{hex}"))
            .with_context(|| format!("blob {} missing", descriptor.digest))?;
        ensure!(
            sha256_hex(bytes) == hex,
            "blob {} has another digest",
            descriptor.digest
        );
        ensure!(
            bytes.len() as u64 == descriptor.size,
            "blob {} has {} bytes, its descriptor says {}",
            descriptor.digest,
            bytes.len(),
            descriptor.size
        );
        Ok(bytes)
    };
    let index: IndexJson =
        serde_json::from_slice(files.get("index.json").context("no index.json")?)
            .context("index.json")?;
    ensure!(
        index.media_type == MEDIA_INDEX,
        "index media type {}",
        index.media_type
    );
    let mut images = Vec::new();
    for descriptor in &index.manifests {
        ensure!(descriptor.media_type == MEDIA_MANIFEST, "{descriptor:?}");
        let manifest: ManifestJson = serde_json::from_slice(blob(descriptor)?)?;
        ensure!(
            manifest.config.media_type == MEDIA_CONFIG,
            "{:?}",
            manifest.config
        );
        let config: ConfigJson = serde_json::from_slice(blob(&manifest.config)?)?;
        ensure!(
            config.rootfs.diff_ids.len() == manifest.layers.len(),
            "{} diff_ids for {} layers",
            config.rootfs.diff_ids.len(),
            manifest.layers.len()
        );
        let mut layers = Vec::new();
        let mut size = manifest.config.size;
        for (layer, diff_id) in manifest.layers.iter().zip(&config.rootfs.diff_ids) {
            ensure!(layer.media_type == MEDIA_LAYER, "{layer:?}");
            size += layer.size;
            let mut tar = Vec::new();
            flate2::read::GzDecoder::new(&blob(layer)?[..]).read_to_end(&mut tar)?;
            if format!("sha256:{}", sha256_hex(&tar)) != *diff_id {
                bail!("layer {} does not match diff_id {diff_id}", layer.digest);
            }
            let mut entries = Vec::new();
            for entry in tar::Archive::new(&tar[..]).entries()? {
                let entry = entry?;
                let header = entry.header();
                let link = match entry.link_name()? {
                    Some(target) if header.entry_type().is_symlink() => {
                        Some(target.to_string_lossy().into_owned())
                    }
                    _ => None,
                };
                let mut path = entry.path()?.to_string_lossy().into_owned();
                if header.entry_type().is_dir() && !path.ends_with('/') {
                    path.push('/');
                }
                entries.push(LayerEntry {
                    path,
                    mode: header.mode()?,
                    uid: header.uid()?,
                    gid: header.gid()?,
                    link,
                });
            }
            layers.push(entries);
        }
        let name = descriptor
            .annotations
            .get(ANNOTATION_IMAGE_NAME)
            .cloned()
            .unwrap_or_default();
        images.push(Inspected {
            tag: descriptor
                .annotations
                .get(ANNOTATION_REF_NAME)
                .cloned()
                .unwrap_or_default(),
            name,
            manifest_digest: descriptor.digest.clone(),
            architecture: config.architecture,
            config: config.config,
            layers,
            size,
        });
    }
    Ok(images)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(binary: &[u8]) -> Tree {
        let mut tree = Tree::default();
        tree.dir("tmp", 0o1777, 0).unwrap();
        tree.dir("app", 0o755, 1000).unwrap();
        tree.file("usr/local/bin/tool", 0o755, binary.to_vec())
            .unwrap();
        tree.symlink("bin", "usr/bin").unwrap();
        tree
    }

    fn archive(binary: &[u8], epoch: u64) -> Vec<u8> {
        let base = Arc::new(layer(&tree(b"base"), epoch, "base").unwrap());
        let top = Arc::new(layer(&tree(binary), epoch, "top").unwrap());
        let run = RunConfig {
            arch: "amd64".into(),
            user: "1000:1000".into(),
            ports: vec![8888, 80],
            env: vec!["PATH=/usr/bin".into()],
            entrypoint: vec!["/usr/local/bin/tool".into()],
            working_dir: "/app".into(),
        };
        let one = image(&run, vec![base.clone(), top], epoch).unwrap();
        let two = image(&run, vec![base], epoch).unwrap();
        let mut out = Vec::new();
        write_archive(
            &mut out,
            &[
                (&one, "docker.io/a/one:dev".into()),
                (&two, "r.io:5000/two".into()),
            ],
            epoch,
        )
        .unwrap();
        out
    }

    /// Two builds of the same inputs are the same bytes; another input, or another time, is
    /// not.
    #[test]
    fn archives_are_reproducible() {
        let first = sha256_hex(&archive(b"elf", 0));
        assert_eq!(first, sha256_hex(&archive(b"elf", 0)));
        assert_ne!(first, sha256_hex(&archive(b"elf2", 0)));
        assert_ne!(first, sha256_hex(&archive(b"elf", 1_700_000_000)));
    }

    #[test]
    fn archives_read_back_with_names_configs_and_entries() {
        let images = inspect(&archive(b"elf", 0)[..]).unwrap();
        assert_eq!(images.len(), 2);
        let one = &images[0];
        assert_eq!(
            (one.name.as_str(), one.tag.as_str()),
            ("docker.io/a/one:dev", "dev")
        );
        assert_eq!(
            (images[1].name.as_str(), images[1].tag.as_str()),
            ("r.io:5000/two", "latest")
        );
        assert_eq!(one.architecture, "amd64");
        assert_eq!(
            one.config,
            ContainerJson {
                user: "1000:1000".into(),
                exposed_ports: [
                    ("80/tcp".to_owned(), Empty {}),
                    ("8888/tcp".to_owned(), Empty {})
                ]
                .into_iter()
                .collect(),
                env: vec!["PATH=/usr/bin".into()],
                entrypoint: vec!["/usr/local/bin/tool".into()],
                working_dir: "/app".into(),
            }
        );
        let entry = |path: &str, mode: u32, id: u64, link: Option<&str>| LayerEntry {
            path: path.to_owned(),
            mode,
            uid: id,
            gid: id,
            link: link.map(str::to_owned),
        };
        assert_eq!(
            one.layers[1],
            [
                entry("app/", 0o755, 1000, None),
                entry("bin", 0o777, 0, Some("usr/bin")),
                entry("tmp/", 0o1777, 0, None),
                entry("usr/", 0o755, 0, None),
                entry("usr/local/", 0o755, 0, None),
                entry("usr/local/bin/", 0o755, 0, None),
                entry("usr/local/bin/tool", 0o755, 0, None),
            ]
        );
        // The shared layer is stored once.
        assert_eq!(images[0].layers[0], images[1].layers[0]);
    }

    #[test]
    fn a_corrupt_blob_is_found() {
        let mut bytes = archive(b"elf", 0);
        // The gzip stream of a layer ends with its length; flip a byte of the first blob's data.
        let position = 3 * 512 + 100;
        bytes[position] ^= 0xff;
        let error = inspect(&bytes[..]).unwrap_err().to_string();
        assert!(error.contains("another digest"), "{error}");
    }

    #[test]
    fn layer_gzip_headers_carry_no_time() {
        let layer = layer(&tree(b"x"), 1_700_000_000, "t").unwrap();
        // Bytes 4..8 of a gzip header are its modification time.
        assert_eq!(&layer.blob.bytes[4..8], &[0, 0, 0, 0]);
        assert_eq!(layer.blob.bytes[3] & 0x08, 0, "no file name");
    }
}
