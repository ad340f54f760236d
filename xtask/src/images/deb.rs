//! Reads a Debian binary package (`.deb`) in memory: its `control` file and the files of its
//! data archive, without `dpkg`.
//!
//! A `.deb` is an `ar` archive of `debian-binary`, `control.tar.*` and `data.tar.*`; the crates
//! `ar` and `tar` read those, `lzma-rust2` (pure Rust) the `xz` compression that Debian 12's
//! archive uses, `flate2` gzip. Doing it in Rust keeps the build free of `dpkg-deb` (it runs on
//! any Linux with `curl`) and gives every file's bytes and mode directly, with no extraction to
//! disk and no ownership or permission surprises from unpacking as a non-root user. zstd (used by
//! Ubuntu, not by Debian 12) is refused by name.

use std::io::{Cursor, Read};

use anyhow::{Context as _, Result, bail};

/// One entry of a package's data archive; paths are relative (`usr/bin/python3.11`), without
/// `./` or a trailing slash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Entry {
    Dir {
        path: String,
        mode: u32,
    },
    File {
        path: String,
        mode: u32,
        data: Vec<u8>,
    },
    Symlink {
        path: String,
        target: String,
    },
}

impl Entry {
    pub(crate) fn path(&self) -> &str {
        match self {
            Entry::Dir { path, .. } | Entry::File { path, .. } | Entry::Symlink { path, .. } => {
                path
            }
        }
    }
}

/// A package's control file and files.
#[derive(Clone, Debug)]
pub(crate) struct Package {
    pub(crate) control: String,
    pub(crate) entries: Vec<Entry>,
}

/// Reads a `.deb`. Hard links become copies of the file they link (the archive lists that file
/// first), so a layer needs no link entries.
pub(crate) fn read(deb: &[u8]) -> Result<Package> {
    let mut archive = ar::Archive::new(Cursor::new(deb));
    let mut control = None;
    let mut entries = None;
    while let Some(member) = archive.next_entry() {
        let mut member = member.context("failed to read the .deb's ar archive")?;
        let name = String::from_utf8_lossy(member.header().identifier()).into_owned();
        let name = name.trim_end_matches('/').to_owned();
        let mut bytes = Vec::new();
        member
            .read_to_end(&mut bytes)
            .with_context(|| format!("failed to read the .deb member {name}"))?;
        if let Some(compression) = name.strip_prefix("control.tar") {
            let files = tar_entries(&decompress(compression, bytes)?)
                .context("failed to read control.tar")?;
            control = files.into_iter().find_map(|entry| match entry {
                Entry::File { path, data, .. } if path == "control" => {
                    Some(String::from_utf8_lossy(&data).into_owned())
                }
                _ => None,
            });
        } else if let Some(compression) = name.strip_prefix("data.tar") {
            entries = Some(
                tar_entries(&decompress(compression, bytes)?).context("failed to read data.tar")?,
            );
        }
    }
    Ok(Package {
        control: control.context("the .deb has no control file")?,
        entries: entries.context("the .deb has no data.tar")?,
    })
}

fn decompress(suffix: &str, bytes: Vec<u8>) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    match suffix {
        "" => return Ok(bytes),
        ".xz" => lzma_rust2::XzReader::new(Cursor::new(bytes), true)
            .read_to_end(&mut out)
            .context("failed to decompress xz")?,
        ".gz" => flate2::read::GzDecoder::new(Cursor::new(bytes))
            .read_to_end(&mut out)
            .context("failed to decompress gzip")?,
        other => bail!("unsupported compression of a .deb member: tar{other}"),
    };
    Ok(out)
}

/// The entries of a tar archive, paths normalised; hard links copied from their target.
fn tar_entries(tar: &[u8]) -> Result<Vec<Entry>> {
    let mut archive = tar::Archive::new(Cursor::new(tar));
    let mut entries: Vec<Entry> = Vec::new();
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = normalise(&entry.path()?.to_string_lossy());
        let header = entry.header();
        let mode = header.mode()? & 0o7777;
        let kind = header.entry_type();
        if path.is_empty() {
            continue;
        }
        let parsed = if kind.is_dir() {
            Entry::Dir { path, mode }
        } else if kind.is_symlink() {
            let target = entry
                .link_name()?
                .context("a symlink without a target")?
                .to_string_lossy()
                .into_owned();
            Entry::Symlink { path, target }
        } else if kind.is_hard_link() {
            let target = normalise(
                &entry
                    .link_name()?
                    .context("a hard link without a target")?
                    .to_string_lossy(),
            );
            let data = entries
                .iter()
                .find_map(|e| match e {
                    Entry::File { path, data, .. } if *path == target => Some(data.clone()),
                    _ => None,
                })
                .with_context(|| format!("hard link {path} to {target}, not a file before it"))?;
            Entry::File { path, mode, data }
        } else if kind.is_file() {
            let mut data = Vec::new();
            entry.read_to_end(&mut data)?;
            Entry::File { path, mode, data }
        } else {
            bail!("{path}: unsupported tar entry type {kind:?}");
        };
        entries.push(parsed);
    }
    Ok(entries)
}

/// `./usr/bin/` → `usr/bin`.
fn normalise(path: &str) -> String {
    path.trim_start_matches("./")
        .trim_start_matches('/')
        .trim_end_matches('/')
        .to_owned()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A `.deb` of the given control text (`control.tar.gz`) and entries (`data.tar.xz`), for
    /// tests.
    pub(crate) fn fake_deb(control: &str, entries: &[Entry]) -> Vec<u8> {
        let tar = |entries: &[Entry]| {
            let mut builder = tar::Builder::new(Vec::new());
            for entry in entries {
                let mut header = tar::Header::new_gnu();
                match entry {
                    Entry::Dir { path, mode } => {
                        header.set_entry_type(tar::EntryType::Directory);
                        header.set_mode(*mode);
                        header.set_size(0);
                        builder
                            .append_data(&mut header, format!("./{path}/"), &[][..])
                            .unwrap();
                    }
                    Entry::File { path, mode, data } => {
                        header.set_mode(*mode);
                        header.set_size(data.len() as u64);
                        builder
                            .append_data(&mut header, format!("./{path}"), &data[..])
                            .unwrap();
                    }
                    Entry::Symlink { path, target } => {
                        header.set_entry_type(tar::EntryType::Symlink);
                        header.set_mode(0o777);
                        header.set_size(0);
                        builder
                            .append_link(&mut header, format!("./{path}"), target)
                            .unwrap();
                    }
                }
            }
            builder.into_inner().unwrap()
        };
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(
            &mut gz,
            &tar(&[Entry::File {
                path: "control".into(),
                mode: 0o644,
                data: control.as_bytes().to_vec(),
            }]),
        )
        .unwrap();
        let control_tar = gz.finish().unwrap();
        let mut xz =
            lzma_rust2::XzWriter::new(Vec::new(), lzma_rust2::XzOptions::with_preset(1)).unwrap();
        std::io::Write::write_all(&mut xz, &tar(entries)).unwrap();
        let data_tar = xz.finish().unwrap();
        let mut builder = ar::Builder::new(Vec::new());
        for (name, bytes) in [
            ("debian-binary", &b"2.0\n"[..]),
            ("control.tar.gz", &control_tar[..]),
            ("data.tar.xz", &data_tar[..]),
        ] {
            let header = ar::Header::new(name.as_bytes().to_vec(), bytes.len() as u64);
            builder.append(&header, bytes).unwrap();
        }
        builder.into_inner().unwrap()
    }

    #[test]
    fn a_deb_is_read_back() {
        let entries = vec![
            Entry::Dir {
                path: "usr/bin".into(),
                mode: 0o755,
            },
            Entry::File {
                path: "usr/bin/tool".into(),
                mode: 0o755,
                data: b"#!/bin/sh\n".to_vec(),
            },
            Entry::Symlink {
                path: "usr/bin/alias".into(),
                target: "tool".into(),
            },
        ];
        let package = read(&fake_deb("Package: tool\n", &entries)).unwrap();
        assert_eq!(package.control, "Package: tool\n");
        assert_eq!(package.entries, entries);
    }
}
