//! The filesystem of one image layer as data, and the rules that make it from Debian packages
//! the way distroless does: files unpacked without running maintainer scripts, what those
//! scripts would have made generated here instead (the CA bundle, `nsswitch.conf`, the links of
//! `update-alternatives`),
//! documentation dropped except licences, and the accounts, directories and binary of an image.
//!
//! Debian 12 is merged-`/usr`: `/bin`, `/sbin` and `/lib*` are links into `/usr`, made by the
//! installer rather than by packages, whose files may still name the old paths. Package paths are
//! moved under `usr/` and the links are part of the base layer, so that no layer above can shadow
//! a link with a directory.

use std::collections::BTreeMap;

use anyhow::{Result, bail};

use super::deb::{self, Entry};
use super::spec::{Account, CA_BUNDLE, OciImage};

/// What a path holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Node {
    Dir,
    File(Vec<u8>),
    Symlink(String),
}

/// A path's node with its permission bits and owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Inode {
    pub(crate) node: Node,
    pub(crate) mode: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

/// The entries of a layer by relative path (`usr/bin/python3`); byte order puts every directory
/// before what it holds, which is the order the layer's tar lists them in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tree {
    entries: BTreeMap<String, Inode>,
}

/// glibc's name-service configuration (libc-bin's postinst writes one; libc-bin is not in the
/// images): local files only, and `/etc/hosts` before DNS (without the file glibc would ask DNS
/// first, and the hosts file Kubernetes mounts would come second).
const NSSWITCH: &str = "\
passwd: files
group: files
shadow: files
gshadow: files
hosts: files dns
networks: files
protocols: files
services: files
ethers: files
rpc: files
";

/// Top-level directories that Debian 12 links into `/usr`.
const MERGED: [&str; 6] = ["bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Trees dropped whole: manuals and documentation indexes.
const DROPPED: [&str; 4] = [
    "usr/share/man",
    "usr/share/info",
    "usr/share/lintian",
    "usr/share/doc-base",
];

impl Tree {
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&String, &Inode)> {
        self.entries.iter()
    }

    #[cfg(test)]
    pub(crate) fn get(&self, path: &str) -> Option<&Inode> {
        self.entries.get(path)
    }

    /// Adds a directory owned by `id` (and, owned by root, its missing parents).
    pub(crate) fn dir(&mut self, path: &str, mode: u32, id: u32) -> Result<()> {
        self.insert(path, Node::Dir, mode, id)
    }

    /// Adds a root-owned file.
    pub(crate) fn file(&mut self, path: &str, mode: u32, data: Vec<u8>) -> Result<()> {
        self.insert(path, Node::File(data), mode, 0)
    }

    /// Adds a symbolic link.
    pub(crate) fn symlink(&mut self, path: &str, target: &str) -> Result<()> {
        self.insert(path, Node::Symlink(target.to_owned()), 0o777, 0)
    }

    /// Inserts an entry and root-owned `0755` parents where missing. The same directory twice
    /// keeps the first; any other second entry at a path must be identical, else it is a conflict
    /// between packages.
    fn insert(&mut self, path: &str, node: Node, mode: u32, id: u32) -> Result<()> {
        let path = path.trim_matches('/');
        if path.is_empty()
            || path
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
        {
            bail!("invalid path {path:?}");
        }
        let mut parent = String::new();
        for component in path
            .split('/')
            .collect::<Vec<_>>()
            .split_last()
            .map_or(&[][..], |(_, p)| p)
        {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(component);
            match self.entries.get(&parent) {
                None => {
                    self.entries.insert(
                        parent.clone(),
                        Inode {
                            node: Node::Dir,
                            mode: 0o755,
                            uid: 0,
                            gid: 0,
                        },
                    );
                }
                Some(Inode {
                    node: Node::Dir, ..
                }) => {}
                Some(_) => bail!("{path}: its parent {parent} is not a directory"),
            }
        }
        let inode = Inode {
            node,
            mode,
            uid: id,
            gid: id,
        };
        match self.entries.get(path) {
            None => {
                self.entries.insert(path.to_owned(), inode);
            }
            Some(existing) if existing.node == Node::Dir && inode.node == Node::Dir => {}
            Some(existing) if *existing == inode => {}
            Some(_) => bail!("{path} is shipped twice, with different contents"),
        }
        Ok(())
    }

    /// Unpacks a package: its files (under `usr/` where merged-`/usr` puts them) owned by root,
    /// without documentation but with its copyright file, and its control file as
    /// `/var/lib/dpkg/status.d/<name>`, where scanners (Trivy, Grype, Syft) look for the packages
    /// of a distroless image.
    pub(crate) fn install(&mut self, name: &str, package: &deb::Package) -> Result<()> {
        for entry in &package.entries {
            let path = merged_usr(entry.path());
            if !kept(&path) {
                continue;
            }
            let result = match entry {
                Entry::Dir { mode, .. } => self.dir(&path, *mode, 0),
                Entry::File { mode, data, .. } => self.file(&path, *mode, data.clone()),
                Entry::Symlink { target, .. } => self.symlink(&path, target),
            };
            if let Err(error) = result {
                bail!("installing {name}: {error}");
            }
        }
        let mut control = package.control.trim_end().to_owned();
        control.push('\n');
        self.file(
            &format!("var/lib/dpkg/status.d/{name}"),
            0o644,
            control.into_bytes(),
        )
    }

    /// What the installer and the packages' maintainer scripts would add to a base layer: the
    /// merged-`/usr` links, `/tmp`, `/root`, the CA bundle with OpenSSL's default paths to it,
    /// and `/etc/nsswitch.conf`.
    pub(crate) fn finish_base(&mut self) -> Result<()> {
        for top in MERGED {
            if self.entries.contains_key(&format!("usr/{top}")) {
                self.symlink(top, &format!("usr/{top}"))?;
            }
        }
        self.dir("tmp", 0o1777, 0)?;
        self.dir("var/tmp", 0o1777, 0)?;
        self.dir("root", 0o700, 0)?;
        self.dir("home", 0o755, 0)?;
        if let Some(bundle) = self.ca_bundle() {
            self.file(CA_BUNDLE, 0o644, bundle)?;
            self.symlink("usr/lib/ssl/cert.pem", CA_BUNDLE)?;
            self.symlink("usr/lib/ssl/certs", "/etc/ssl/certs")?;
        }
        self.file("etc/nsswitch.conf", 0o644, NSSWITCH.as_bytes().to_vec())?;
        Ok(())
    }

    /// `/etc/ssl/certs/ca-certificates.crt` as `update-ca-certificates` writes it with
    /// ca-certificates' default configuration (every certificate it ships enabled): the
    /// certificates under `/usr/share/ca-certificates` concatenated in path order, each ending
    /// with a newline. `None` without certificates.
    fn ca_bundle(&self) -> Option<Vec<u8>> {
        let mut bundle = Vec::new();
        for (path, inode) in &self.entries {
            if let (true, Node::File(data)) = (
                path.starts_with("usr/share/ca-certificates/") && path.ends_with(".crt"),
                &inode.node,
            ) {
                bundle.extend_from_slice(data);
                if !data.ends_with(b"\n") {
                    bundle.push(b'\n');
                }
            }
        }
        (!bundle.is_empty()).then_some(bundle)
    }

    /// The layer of an image's own files: `/etc/passwd` and `/etc/group` with root, nobody and
    /// the image's account, its home and working directory owned by it, and the binary.
    pub(crate) fn image_layer(image: &OciImage, binary: Vec<u8>) -> Result<Tree> {
        let mut tree = Tree::default();
        let Account {
            id,
            name,
            home,
            shell,
        } = image.account;
        let passwd = format!(
            "root:x:0:0:root:/root:/sbin/nologin\n\
             nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n\
             {name}:x:{id}:{id}:{name}:{home}:{shell}\n"
        );
        let group = format!("root:x:0:\nnobody:x:65534:\n{name}:x:{id}:\n");
        tree.file("etc/passwd", 0o644, passwd.into_bytes())?;
        tree.file("etc/group", 0o644, group.into_bytes())?;
        tree.dir(home, 0o700, id)?;
        if let Some(workdir) = image.workdir {
            tree.dir(workdir, 0o755, id)?;
        }
        tree.file(&image.entrypoint(), 0o755, binary)?;
        Ok(tree)
    }
}

/// `lib/x86_64-linux-gnu/libc.so.6` → `usr/lib/x86_64-linux-gnu/libc.so.6`.
fn merged_usr(path: &str) -> String {
    let top = path.split('/').next().unwrap_or_default();
    if MERGED.contains(&top) {
        format!("usr/{path}")
    } else {
        path.to_owned()
    }
}

/// Whether a package path goes into the image: not manuals or info pages, and of
/// `/usr/share/doc` only each package's directory (or link) and its `copyright`.
fn kept(path: &str) -> bool {
    if DROPPED
        .iter()
        .any(|dropped| path == *dropped || path.starts_with(&format!("{dropped}/")))
    {
        return false;
    }
    match path.strip_prefix("usr/share/doc/") {
        None => true,
        Some(rest) => match rest.split_once('/') {
            None => true,
            Some((_, file)) => file == "copyright",
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, data: &str) -> Entry {
        Entry::File {
            path: path.into(),
            mode: 0o644,
            data: data.as_bytes().to_vec(),
        }
    }

    fn paths(tree: &Tree) -> Vec<&str> {
        tree.entries().map(|(path, _)| path.as_str()).collect()
    }

    #[test]
    fn packages_are_unpacked_under_usr_without_documentation() {
        let package = deb::Package {
            control: "Package: libc6\nVersion: 1".into(),
            entries: vec![
                Entry::Dir {
                    path: "lib".into(),
                    mode: 0o755,
                },
                file("lib/x86_64-linux-gnu/libc.so.6", "elf"),
                Entry::Symlink {
                    path: "lib64/ld-linux-x86-64.so.2".into(),
                    target: "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2".into(),
                },
                file("usr/share/doc/libc6/copyright", "LGPL"),
                file("usr/share/doc/libc6/changelog.Debian.gz", "log"),
                file("usr/share/man/man1/ldd.1.gz", "man"),
                file("usr/share/lintian/overrides/libc6", "x"),
            ],
        };
        let mut tree = Tree::default();
        tree.install("libc6", &package).unwrap();
        assert_eq!(
            paths(&tree),
            [
                "usr",
                "usr/lib",
                "usr/lib/x86_64-linux-gnu",
                "usr/lib/x86_64-linux-gnu/libc.so.6",
                "usr/lib64",
                "usr/lib64/ld-linux-x86-64.so.2",
                "usr/share",
                "usr/share/doc",
                "usr/share/doc/libc6",
                "usr/share/doc/libc6/copyright",
                "var",
                "var/lib",
                "var/lib/dpkg",
                "var/lib/dpkg/status.d",
                "var/lib/dpkg/status.d/libc6",
            ]
        );
        assert_eq!(
            tree.get("var/lib/dpkg/status.d/libc6").unwrap().node,
            Node::File(b"Package: libc6\nVersion: 1\n".to_vec())
        );
        tree.finish_base().unwrap();
        assert_eq!(
            tree.get("lib64").unwrap().node,
            Node::Symlink("usr/lib64".into())
        );
        assert_eq!(tree.get("tmp").unwrap().mode, 0o1777);
        // No certificates, no bundle; no lib32, no link to it.
        assert!(tree.get("etc/ssl/certs/ca-certificates.crt").is_none());
        assert!(tree.get("lib32").is_none());
    }

    #[test]
    fn the_ca_bundle_concatenates_the_certificates_in_path_order() {
        let package = deb::Package {
            control: "Package: ca-certificates".into(),
            entries: vec![
                file("usr/share/ca-certificates/mozilla/B.crt", "b\n"),
                file("usr/share/ca-certificates/mozilla/A.crt", "a"),
                file("usr/share/ca-certificates/mozilla/README", "no"),
            ],
        };
        let mut tree = Tree::default();
        tree.install("ca-certificates", &package).unwrap();
        tree.finish_base().unwrap();
        let bundle = tree.get("etc/ssl/certs/ca-certificates.crt").unwrap();
        assert_eq!(bundle.node, Node::File(b"a\nb\n".to_vec()));
        assert_eq!(
            tree.get("usr/lib/ssl/cert.pem").unwrap().node,
            Node::Symlink(CA_BUNDLE.into())
        );
        assert_eq!(
            tree.get("etc/nsswitch.conf").unwrap().node,
            Node::File(NSSWITCH.as_bytes().to_vec())
        );
    }

    #[test]
    fn conflicting_packages_fail_naming_the_path() {
        let mut tree = Tree::default();
        let a = deb::Package {
            control: String::new(),
            entries: vec![file("bin/sh", "dash")],
        };
        let b = deb::Package {
            control: String::new(),
            entries: vec![file("usr/bin/sh", "bash")],
        };
        tree.install("a", &a).unwrap();
        let error = tree.install("b", &b).unwrap_err().to_string();
        assert_eq!(
            error,
            "installing b: usr/bin/sh is shipped twice, with different contents"
        );
        assert!(tree.file("usr/bin/sh/x", 0o644, vec![]).is_err());
        assert!(tree.file("usr/../etc/x", 0o644, vec![]).is_err());
    }

    #[test]
    fn the_image_layer_holds_the_account_its_directories_and_the_binary() {
        let runtime = &super::super::spec::OCI_IMAGES[2];
        let tree = Tree::image_layer(runtime, b"elf".to_vec()).unwrap();
        let passwd = tree.get("etc/passwd").unwrap();
        assert_eq!(
            passwd.node,
            Node::File(
                b"root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nsandbox:x:1000:1000:sandbox:/home/sandbox:/bin/sh\n".to_vec()
            )
        );
        let app = tree.get("app").unwrap();
        assert_eq!((app.uid, app.gid, app.mode), (1000, 1000, 0o755));
        assert_eq!(tree.get("home").unwrap().uid, 0);
        assert_eq!(tree.get("home/sandbox").unwrap().uid, 1000);
        let binary = tree.get("usr/local/bin/sandbox-runtime").unwrap();
        assert_eq!((binary.mode, binary.uid), (0o755, 0));
    }
}
