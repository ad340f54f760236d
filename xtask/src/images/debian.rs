//! The Debian 12 packages of the Docker-less images: the lock file that pins each by version and
//! SHA-256, its regeneration (the dependency closure of [`spec`](super::spec)'s package sets,
//! resolved from the machine's APT index with `apt-cache` and `apt-get download --print-uris`),
//! and the download of the locked `.deb` files into a cache verified against the lock.
//!
//! The lock is a plain text file, one package a line:
//! `<set> <package> <version> <size> <sha256> <url>`. Dependency resolution follows `Depends`
//! and `Pre-Depends` (the first alternative unless one is already there), takes APT's candidate
//! version of each package and ignores version constraints: every candidate comes from the one
//! Debian release, which is consistent by construction.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};
use sha2::{Digest as _, Sha256};

use super::spec::{EXCLUDED, PackageSet};

/// The lock file of an architecture (Debian's name: `amd64`, `arm64`), relative to the
/// workspace root.
pub(crate) fn lock_path(arch: &str) -> String {
    format!("xtask/images/debian-bookworm-{arch}.lock")
}

/// Debian's name of the architecture this xtask runs on.
pub(crate) fn host_arch() -> Result<&'static str> {
    match std::env::consts::ARCH {
        "x86_64" => Ok("amd64"),
        "aarch64" => Ok("arm64"),
        other => bail!("no Debian architecture known for {other}"),
    }
}

/// One locked package.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Locked {
    /// The [`PackageSet`] whose layer holds it.
    pub(crate) set: String,
    pub(crate) name: String,
    pub(crate) version: String,
    pub(crate) size: u64,
    /// Lower-case hex.
    pub(crate) sha256: String,
    pub(crate) url: String,
}

const LOCK_HEADER: &str = "\
# Debian 12 (bookworm) packages of the images of `cargo xtask images --oci`, pinned by version and
# SHA-256. Written by `cargo xtask images --lock` (from the machine's APT index); do not edit.
# <set> <package> <version> <size> <sha256> <url>
";

/// The text of a lock file.
pub(crate) fn render_lock(packages: &[Locked]) -> String {
    let mut text = LOCK_HEADER.to_owned();
    for p in packages {
        text.push_str(&format!(
            "{} {} {} {} {} {}\n",
            p.set, p.name, p.version, p.size, p.sha256, p.url
        ));
    }
    text
}

/// Parses a lock file (blank lines and `#` comments skipped).
pub(crate) fn parse_lock(text: &str) -> Result<Vec<Locked>> {
    let mut packages = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [set, name, version, size, sha256, url] = fields[..] else {
            bail!(
                "line {}: expected `<set> <package> <version> <size> <sha256> <url>`, got {line:?}",
                number + 1
            );
        };
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            bail!("line {}: {sha256:?} is not a SHA-256", number + 1);
        }
        packages.push(Locked {
            set: set.to_owned(),
            name: name.to_owned(),
            version: version.to_owned(),
            size: size
                .parse()
                .with_context(|| format!("line {}: size {size:?}", number + 1))?,
            sha256: sha256.to_ascii_lowercase(),
            url: url.to_owned(),
        });
    }
    Ok(packages)
}

/// Reads the committed lock of `arch` and checks it pins every wanted package of every set.
pub(crate) fn read_lock(root: &Path, arch: &str, sets: &[PackageSet]) -> Result<Vec<Locked>> {
    let path = lock_path(arch);
    let text = std::fs::read_to_string(root.join(&path)).with_context(|| {
        format!("failed to read {path}: `cargo xtask images --lock` writes it on a Debian 12 {arch} machine")
    })?;
    let locked = parse_lock(&text).with_context(|| format!("failed to parse {path}"))?;
    for set in sets {
        for wanted in set.wanted {
            if !locked
                .iter()
                .any(|p| p.set == set.name && p.name == *wanted)
            {
                bail!(
                    "{path} does not pin {wanted} in set {}: run `cargo xtask images --lock`",
                    set.name
                );
            }
        }
    }
    Ok(locked)
}

/// What the resolver needs to know of a package: its name, the alternatives of each of its
/// dependencies and the virtual packages it provides.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Available {
    pub(crate) name: String,
    pub(crate) version: String,
    pub(crate) depends: Vec<Vec<String>>,
    pub(crate) provides: Vec<String>,
}

/// The dependency closure of `wanted`, less the packages `present` (lower sets) and
/// [`EXCLUDED`], sorted. `lookup` gives APT's candidate of a name, `None` when it has none
/// (a virtual package or an unknown name).
pub(crate) fn closure(
    wanted: &[&str],
    present: &BTreeSet<String>,
    lookup: &mut dyn FnMut(&str) -> Result<Option<Available>>,
) -> Result<Vec<String>> {
    let excluded = |name: &str| EXCLUDED.iter().any(|(e, _)| *e == name);
    let mut chosen: BTreeMap<String, Available> = BTreeMap::new();
    let mut queue: VecDeque<(String, String)> = wanted
        .iter()
        .map(|name| ((*name).to_owned(), "wanted".to_owned()))
        .collect();
    while let Some((name, why)) = queue.pop_front() {
        if present.contains(&name) || chosen.contains_key(&name) {
            continue;
        }
        if excluded(&name) {
            bail!("{name} is wanted but excluded");
        }
        let Some(package) = lookup(&name)? else {
            bail!("{name} ({why}) has no installation candidate in the APT index");
        };
        for group in &package.depends {
            let provided = |alternative: &String| {
                present.contains(alternative)
                    || excluded(alternative)
                    || chosen.contains_key(alternative)
                    || chosen.values().any(|p| p.provides.contains(alternative))
                    || queue.iter().any(|(queued, _)| queued == alternative)
            };
            if group.iter().any(provided) {
                continue;
            }
            let mut picked = None;
            for alternative in group {
                if lookup(alternative)?.is_some() {
                    picked = Some(alternative.clone());
                    break;
                }
            }
            let Some(picked) = picked else {
                bail!(
                    "no alternative of `{}` (a dependency of {name}) has a candidate: add a provider to a package set or exclude it",
                    group.join(" | ")
                );
            };
            queue.push_back((picked, format!("needed by {name}")));
        }
        chosen.insert(name, package);
    }
    Ok(chosen.into_keys().collect())
}

/// The first stanza of `apt-cache show` output as an [`Available`]; `None` when empty.
pub(crate) fn parse_stanza(text: &str) -> Option<Available> {
    let stanza = text.split("\n\n").next().unwrap_or_default();
    let mut fields: BTreeMap<&str, String> = BTreeMap::new();
    let mut last = None;
    for line in stanza.lines() {
        if line.starts_with([' ', '\t']) {
            if let Some(key) = last
                && let Some(value) = fields.get_mut(key)
            {
                value.push(' ');
                value.push_str(line.trim());
            }
            continue;
        }
        if let Some((key, value)) = line.split_once(':') {
            fields.insert(key, value.trim().to_owned());
            last = Some(key);
        }
    }
    let name = fields.get("Package")?.clone();
    let names = |field: &str| -> Vec<Vec<String>> {
        fields
            .get(field)
            .map(|value| {
                value
                    .split(',')
                    .map(|group| {
                        group
                            .split('|')
                            .map(|alternative| {
                                let alternative = alternative.trim();
                                let end = alternative
                                    .find([' ', '(', ':'])
                                    .unwrap_or(alternative.len());
                                alternative[..end].to_owned()
                            })
                            .filter(|alternative| !alternative.is_empty())
                            .collect::<Vec<_>>()
                    })
                    .filter(|group| !group.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut depends = names("Pre-Depends");
    depends.extend(names("Depends"));
    let provides = names("Provides").into_iter().flatten().collect();
    Some(Available {
        name,
        version: fields.get("Version").cloned().unwrap_or_default(),
        depends,
        provides,
    })
}

/// `apt-cache show` of APT's candidate of `name`.
fn apt_show(name: &str) -> Result<Option<Available>> {
    let output = Command::new("apt-cache")
        .args(["show", "--no-all-versions", name])
        .output()
        .context("failed to run apt-cache (regenerating the lock needs Debian's APT)")?;
    if !output.status.success() {
        return Ok(None);
    }
    Ok(parse_stanza(&String::from_utf8_lossy(&output.stdout)))
}

/// One line of `apt-get download --print-uris`: `'<url>' <file> <size> SHA256:<hex>`.
pub(crate) fn parse_uri_line(line: &str) -> Option<(String, u64, String)> {
    let mut fields = line.split_whitespace();
    let url = fields.next()?.trim_matches('\'').to_owned();
    let _file = fields.next()?;
    let size = fields.next()?.parse().ok()?;
    let sha256 = fields.next()?.strip_prefix("SHA256:")?.to_ascii_lowercase();
    Some((url, size, sha256))
}

/// `cargo xtask images --lock`: resolves every set's closure from the APT index and writes the
/// lock of the host's architecture. Run `apt-get update` first for the newest versions.
pub(crate) fn write_lock(root: &Path, sets: &[PackageSet]) -> Result<(PathBuf, Vec<Locked>)> {
    let arch = host_arch()?;
    let mut cache: BTreeMap<String, Option<Available>> = BTreeMap::new();
    let mut lookup = |name: &str| -> Result<Option<Available>> {
        if let Some(known) = cache.get(name) {
            return Ok(known.clone());
        }
        let found = apt_show(name)?;
        cache.insert(name.to_owned(), found.clone());
        Ok(found)
    };
    let mut present = BTreeSet::new();
    let mut locked = Vec::new();
    for set in sets {
        let names = closure(set.wanted, &present, &mut lookup)?;
        let mut pins = Vec::new();
        for name in &names {
            let package = lookup(name)?.with_context(|| format!("{name} vanished"))?;
            pins.push(format!("{name}={}", package.version));
        }
        let output = Command::new("apt-get")
            .args(["download", "--print-uris"])
            .args(&pins)
            .output()
            .context("failed to run apt-get download --print-uris")?;
        if !output.status.success() {
            bail!(
                "apt-get download --print-uris failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        let uris: Vec<_> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(parse_uri_line)
            .collect();
        if uris.len() != names.len() {
            bail!(
                "apt-get download --print-uris gave {} URIs for {} packages",
                uris.len(),
                names.len()
            );
        }
        // apt-get prints in its own order: match by the package's file name.
        for (name, pin) in names.iter().zip(&pins) {
            let version = pin.split_once('=').map_or("", |(_, v)| v);
            let (url, size, sha256) = uris
                .iter()
                .find(|(url, _, _)| {
                    let file = url.rsplit('/').next().unwrap_or_default();
                    file.starts_with(&format!("{name}_"))
                })
                .cloned()
                .with_context(|| format!("no URI for {pin}"))?;
            locked.push(Locked {
                set: set.name.to_owned(),
                name: name.clone(),
                version: version.to_owned(),
                size,
                sha256,
                url,
            });
        }
        present.extend(names);
    }
    let path = root.join(lock_path(arch));
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("failed to create {}", parent.display()))?;
    }
    std::fs::write(&path, render_lock(&locked))
        .with_context(|| format!("failed to write {}", path.display()))?;
    Ok((path, locked))
}

/// Lower-case hex SHA-256 of `bytes`.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Where downloaded packages are kept: `$XDG_CACHE_HOME/agent-sandbox/debian`, else
/// `~/.cache/agent-sandbox/debian`.
pub(crate) fn cache_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(dir).join("agent-sandbox/debian"));
    }
    match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".cache/agent-sandbox/debian")),
        None => bail!("no cache directory for Debian packages: set XDG_CACHE_HOME (or HOME)"),
    }
}

/// The bytes of every locked package, from the cache or downloaded into it with `curl`, each
/// checked against the lock's SHA-256 and size.
pub(crate) fn fetch(locked: &[Locked]) -> Result<BTreeMap<String, Vec<u8>>> {
    let dir = cache_dir()?;
    std::fs::create_dir_all(&dir).with_context(|| format!("failed to create {}", dir.display()))?;
    let mut debs = BTreeMap::new();
    for package in locked {
        let path = dir.join(format!("{}_{}.deb", package.name, &package.sha256[..16]));
        let cached = std::fs::read(&path)
            .ok()
            .filter(|bytes| sha256_hex(bytes) == package.sha256);
        let bytes = match cached {
            Some(bytes) => bytes,
            None => {
                let partial = path.with_extension("part");
                eprintln!("downloading {} {} ...", package.name, package.version);
                super::run(
                    Command::new("curl")
                        .args(["--fail", "--silent", "--show-error", "--location"])
                        .args(["--retry", "3", "--output"])
                        .arg(&partial)
                        .arg(&package.url),
                )
                .with_context(|| {
                    format!(
                        "failed to download {} (if the mirror dropped this version, run `cargo xtask images --lock`)",
                        package.url
                    )
                })?;
                let bytes = std::fs::read(&partial)
                    .with_context(|| format!("failed to read {}", partial.display()))?;
                let actual = sha256_hex(&bytes);
                if actual != package.sha256 || bytes.len() as u64 != package.size {
                    let _ = std::fs::remove_file(&partial);
                    bail!(
                        "{} has SHA-256 {actual} and {} bytes; the lock says {} and {}",
                        package.url,
                        bytes.len(),
                        package.sha256,
                        package.size
                    );
                }
                std::fs::rename(&partial, &path)
                    .with_context(|| format!("failed to write {}", path.display()))?;
                bytes
            }
        };
        debs.insert(package.name.clone(), bytes);
    }
    Ok(debs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn package(name: &str, depends: &[&[&str]], provides: &[&str]) -> Available {
        Available {
            name: name.to_owned(),
            version: "1".to_owned(),
            depends: depends
                .iter()
                .map(|group| group.iter().map(|s| (*s).to_owned()).collect())
                .collect(),
            provides: provides.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    fn index() -> BTreeMap<String, Available> {
        [
            package(
                "python3",
                &[&["libc6"], &["media-types", "mime-support"]],
                &[],
            ),
            package("libc6", &[&["libgcc-s1"]], &[]),
            package("libgcc-s1", &[&["libc6"], &["gcc-12-base"]], &[]),
            package("gcc-12-base", &[], &[]),
            package("media-types", &[], &[]),
            package("mime-support", &[], &[]),
            package("tzdata", &[&["debconf", "debconf-2.0"]], &[]),
            package("mawk", &[&["libc6"]], &["awk"]),
            package("base-files", &[&["awk"]], &[]),
            package("needs-ghost", &[&["ghost"]], &[]),
        ]
        .into_iter()
        .map(|p| (p.name.clone(), p))
        .collect()
    }

    fn resolve(wanted: &[&str], present: &[&str]) -> Result<Vec<String>> {
        let index = index();
        let present = present.iter().map(|s| (*s).to_owned()).collect();
        closure(wanted, &present, &mut |name| Ok(index.get(name).cloned()))
    }

    #[test]
    fn the_closure_follows_dependencies_first_alternatives_and_exclusions() {
        assert_eq!(
            resolve(&["python3", "tzdata"], &[]).unwrap(),
            [
                "gcc-12-base",
                "libc6",
                "libgcc-s1",
                "media-types",
                "python3",
                "tzdata"
            ]
        );
        // Lower sets' packages are not repeated; an excluded virtual satisfies its dependants.
        assert_eq!(
            resolve(
                &["mawk", "base-files"],
                &["libc6", "libgcc-s1", "gcc-12-base"]
            )
            .unwrap(),
            ["base-files", "mawk"]
        );
        let error = resolve(&["needs-ghost"], &[]).unwrap_err().to_string();
        assert!(
            error.contains("`ghost` (a dependency of needs-ghost)"),
            "{error}"
        );
        assert!(resolve(&["dpkg"], &[]).is_err());
    }

    #[test]
    fn apt_output_is_parsed() {
        let show = "Package: libgcc-s1\nVersion: 12.2.0-14+deb12u1\nProvides: libgcc1 (= 1:12.2.0-14+deb12u1)\nDepends: gcc-12-base (= 12.2.0-14+deb12u1), libc6 (>= 2.35)\nPre-Depends: libx:any\nDescription: GCC support library\n more\n\nPackage: libgcc-s1\nVersion: 0\n";
        assert_eq!(
            parse_stanza(show).unwrap(),
            Available {
                name: "libgcc-s1".into(),
                version: "12.2.0-14+deb12u1".into(),
                depends: vec![
                    vec!["libx".into()],
                    vec!["gcc-12-base".into()],
                    vec!["libc6".into()]
                ],
                provides: vec!["libgcc1".into()],
            }
        );
        assert_eq!(parse_stanza(""), None);
        assert_eq!(
            parse_uri_line(
                "'http://deb.debian.org/debian/pool/main/g/glibc/libc6_2.36-9%2bdeb12u14_amd64.deb' libc6_2.36-9+deb12u14_amd64.deb 2759320 SHA256:BA4F"
            ),
            Some((
                "http://deb.debian.org/debian/pool/main/g/glibc/libc6_2.36-9%2bdeb12u14_amd64.deb"
                    .into(),
                2_759_320,
                "ba4f".into()
            ))
        );
    }

    #[test]
    fn the_lock_round_trips_and_rejects_bad_lines() {
        let locked = vec![Locked {
            set: "base".into(),
            name: "libc6".into(),
            version: "2.36-9+deb12u14".into(),
            size: 2_759_320,
            sha256: "ba4f88f73dbc3ae9055f3c20f4523bfdbaf1ad13ff95e258924f77d20b4fbedf".into(),
            url: "http://deb.debian.org/debian/pool/main/g/glibc/libc6_2.36-9%2bdeb12u14_amd64.deb"
                .into(),
        }];
        assert_eq!(parse_lock(&render_lock(&locked)).unwrap(), locked);
        assert!(parse_lock("base libc6 1 2 nothex http://x\n").is_err());
        assert!(parse_lock("base libc6 1\n").is_err());
    }

    /// The committed lock pins every wanted package, each with a mirror URL of its own name.
    #[test]
    fn the_committed_lock_pins_every_wanted_package() {
        let root = crate::workspace_root();
        let sets = super::super::spec::package_sets();
        let locked = read_lock(&root, "amd64", &sets).unwrap();
        for package in &locked {
            assert!(
                sets.iter().any(|set| set.name == package.set),
                "{package:?}"
            );
            let file = package.url.rsplit('/').next().unwrap();
            assert!(
                file.starts_with(&format!("{}_", package.name)),
                "{package:?}"
            );
            assert!(
                package.url.starts_with("http://deb.debian.org/"),
                "{package:?}"
            );
        }
        let mut names: Vec<_> = locked.iter().map(|p| &p.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), locked.len(), "a package locked twice");
    }
}
