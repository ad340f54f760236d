//! The image table: which program a container image runs as, with which arguments and
//! environment (sans IO apart from locating programs).
//!
//! Patterns are globs over the whole image reference (`*` matches any run of characters), tried
//! in order; the first match wins. Arguments and environment values may use the templates
//! `{pod_ip}`, `{pod_name}`, `{namespace}`, `{pod_uid}` and `{pod_dir}` (the pod's own directory
//! as the process sees it: `/app` when confined, the host path otherwise).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use agent_sandbox_api::wire::RUNTIME_PORT;

/// The program an image runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Program {
    /// A binary found next to the sim's own executable (or one directory up from a `deps`
    /// directory, where test binaries live), then on `PATH`.
    Named(String),
    /// A binary at this path.
    Path(PathBuf),
    /// The executable of the process running the sim (e.g. a CLI that serves the runtime as a
    /// hidden subcommand of itself).
    CurrentExe,
    /// The container's own `command` (and `args`), resolved on `PATH`: for general-purpose base
    /// images such as `busybox` or `python`.
    ContainerCommand,
}

/// A default readiness check for containers of an image that declare no readiness probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DefaultReadiness {
    /// Ready once the port accepts TCP connections on the pod IP.
    Tcp(u16),
    /// Ready once `GET path` on the port answers 2xx/3xx.
    Http {
        /// Port on the pod IP.
        port: u16,
        /// Request path.
        path: String,
    },
}

/// One row of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageEntry {
    /// Glob over the image reference.
    pub pattern: String,
    /// What to run.
    pub program: Program,
    /// Arguments when the container gives no `args` (templated).
    pub args: Vec<String>,
    /// Environment set before the container's own `env` (values templated).
    pub env: Vec<(String, String)>,
    /// Ports the program listens on (checked free on a candidate pod IP before it is chosen).
    pub ports: Vec<u16>,
    /// Readiness for containers without a readiness probe.
    pub readiness: Option<DefaultReadiness>,
}

impl ImageEntry {
    /// An entry running `program` for images matching `pattern`.
    pub fn new(pattern: impl Into<String>, program: Program) -> Self {
        Self {
            pattern: pattern.into(),
            program,
            args: Vec::new(),
            env: Vec::new(),
            ports: Vec::new(),
            readiness: None,
        }
    }

    /// Sets the default arguments.
    #[must_use]
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args = args.into_iter().map(Into::into).collect();
        self
    }

    /// Adds an environment variable.
    #[must_use]
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Declares a port the program listens on.
    #[must_use]
    pub fn port(mut self, port: u16) -> Self {
        self.ports.push(port);
        self
    }

    /// Sets the default readiness check.
    #[must_use]
    pub fn readiness(mut self, readiness: DefaultReadiness) -> Self {
        self.readiness = Some(readiness);
        self
    }
}

/// The table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageTable {
    entries: Vec<ImageEntry>,
}

/// Base images whose containers run their own command on the host's tools.
const BASE_IMAGES: [&str; 8] = [
    "busybox", "alpine", "debian", "ubuntu", "python", "bash", "node", "golang",
];

impl ImageTable {
    /// A table with no entries: every image is unknown.
    pub fn empty() -> Self {
        Self::default()
    }

    /// The default table: images whose name contains `runtime` run `sandbox-runtime` on the pod
    /// IP at port 8888 with the pod's directory as its base directory; common base images
    /// (`busybox`, `alpine`, `debian`, `ubuntu`, `python`, `bash`, `node`, `golang`) run the
    /// container's command.
    pub fn with_defaults() -> Self {
        let mut table = Self::empty();
        table.push(runtime_entry(
            "*runtime*",
            Program::Named("sandbox-runtime".into()),
        ));
        for base in BASE_IMAGES {
            table.push(ImageEntry::new(
                format!("{base}*"),
                Program::ContainerCommand,
            ));
            table.push(ImageEntry::new(
                format!("*/{base}*"),
                Program::ContainerCommand,
            ));
        }
        table
    }

    /// Adds an entry after the existing ones.
    pub fn push(&mut self, entry: ImageEntry) {
        self.entries.push(entry);
    }

    /// Adds an entry before the existing ones (it takes precedence).
    pub fn prepend(&mut self, entry: ImageEntry) {
        self.entries.insert(0, entry);
    }

    /// The entry for an image.
    pub fn lookup(&self, image: &str) -> Option<&ImageEntry> {
        self.entries
            .iter()
            .find(|entry| glob_match(&entry.pattern, image))
    }

    /// The entries, in order.
    pub fn entries(&self) -> &[ImageEntry] {
        &self.entries
    }
}

/// The entry that runs our runtime server for images matching `pattern`: it listens on
/// `{pod_ip}:8888` and keeps its files in the pod's directory.
pub fn runtime_entry(pattern: &str, program: Program) -> ImageEntry {
    ImageEntry::new(pattern, program)
        .env("SANDBOX_LISTEN", format!("{{pod_ip}}:{RUNTIME_PORT}"))
        .env("SANDBOX_BASE_DIR", "{pod_dir}")
        .port(RUNTIME_PORT)
        .readiness(DefaultReadiness::Tcp(RUNTIME_PORT))
}

/// `*`-glob matching over the whole text.
pub(crate) fn glob_match(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let mut rest = text;
    for (index, part) in parts.iter().enumerate() {
        if index == 0 {
            match rest.strip_prefix(part) {
                Some(after) => rest = after,
                None => return false,
            }
        } else if index == parts.len() - 1 {
            return rest.ends_with(part);
        } else {
            match rest.find(part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
    }
    true
}

/// Values of the templates for one pod.
#[derive(Clone, Debug, Default)]
pub(crate) struct Templates {
    pub(crate) pod_ip: String,
    pub(crate) pod_name: String,
    pub(crate) namespace: String,
    pub(crate) pod_uid: String,
    pub(crate) pod_dir: String,
}

impl Templates {
    /// Expands the templates in `text`.
    pub(crate) fn expand(&self, text: &str) -> String {
        text.replace("{pod_ip}", &self.pod_ip)
            .replace("{pod_name}", &self.pod_name)
            .replace("{namespace}", &self.namespace)
            .replace("{pod_uid}", &self.pod_uid)
            .replace("{pod_dir}", &self.pod_dir)
    }
}

/// Narrows a wildcard listen address to the pod IP: pods share the node's network namespace
/// here, so two pods that each bind `0.0.0.0:8080` (as they may, each in a network namespace
/// of its own, on a node) would collide. Rewrites `0.0.0.0:`, `[::]:` and `:::` followed by a
/// port, and a whole value (or `flag=value`) of `0.0.0.0` or `::`; nothing else.
pub(crate) fn narrow_wildcards(text: &str, pod_ip: &str) -> String {
    if pod_ip.is_empty() {
        return text.to_owned();
    }
    let (prefix, value) = match text.split_once('=') {
        Some((flag, value)) if flag.starts_with('-') => (format!("{flag}="), value),
        _ => (String::new(), text),
    };
    let narrowed = if value == "0.0.0.0" || value == "::" || value == "[::]" {
        pod_ip.to_owned()
    } else if let Some(port) = value
        .strip_prefix("0.0.0.0:")
        .or_else(|| value.strip_prefix("[::]:"))
        .or_else(|| value.strip_prefix(":::"))
        .filter(|port| !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()))
    {
        format!("{pod_ip}:{port}")
    } else {
        return text.to_owned();
    };
    format!("{prefix}{narrowed}")
}

/// Expands Kubernetes `$(VAR)` references from `env`; `$$(VAR)` escapes; unknown references
/// stay as written.
pub(crate) fn expand_vars(text: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(escaped) = after.strip_prefix("$(") {
            out.push_str("$(");
            rest = escaped;
        } else if let Some(body) = after.strip_prefix('(')
            && let Some(end) = body.find(')')
        {
            let name = &body[..end];
            match env.get(name) {
                Some(value) => out.push_str(value),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Finds a named program: next to `exe` (and next to its parent when `exe` sits in a `deps`
/// directory, as test binaries do), then on `path`.
pub(crate) fn find_program(
    name: &str,
    exe: Option<&Path>,
    path: Option<&std::ffi::OsStr>,
) -> Option<PathBuf> {
    if name.contains('/') {
        let candidate = PathBuf::from(name);
        return candidate.is_file().then_some(candidate);
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(dir) = exe.and_then(Path::parent) {
        dirs.push(dir.to_path_buf());
        if dir.file_name().is_some_and(|n| n == "deps")
            && let Some(parent) = dir.parent()
        {
            dirs.push(parent.to_path_buf());
        }
    }
    if let Some(path) = path {
        dirs.extend(std::env::split_paths(path));
    }
    dirs.into_iter()
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_listen_addresses_narrow_to_the_pod_ip() {
        let ip = "10.244.0.7";
        for (given, want) in [
            ("--listen=0.0.0.0:8080", "--listen=10.244.0.7:8080"),
            (
                "--metrics-bind-address=[::]:8080",
                "--metrics-bind-address=10.244.0.7:8080",
            ),
            ("0.0.0.0:9090", "10.244.0.7:9090"),
            ("--bind-address=0.0.0.0", "--bind-address=10.244.0.7"),
            ("0.0.0.0", "10.244.0.7"),
            (":::8443", "10.244.0.7:8443"),
        ] {
            assert_eq!(narrow_wildcards(given, ip), want, "{given}");
        }
        for untouched in [
            "--listen=127.0.0.1:8080",
            "--cidr=0.0.0.0/0",
            "echo 0.0.0.0:80 is everywhere",
            "10.0.0.0:80",
            "0.0.0.0:http",
        ] {
            assert_eq!(narrow_wildcards(untouched, ip), untouched);
        }
        assert_eq!(narrow_wildcards("0.0.0.0:80", ""), "0.0.0.0:80");
    }

    #[test]
    fn globs_match_whole_references() {
        assert!(glob_match(
            "*runtime*",
            "registry.k8s.io/agent-sandbox/python-runtime-sandbox:v1"
        ));
        assert!(glob_match("busybox*", "busybox:1.36"));
        assert!(!glob_match("busybox*", "docker.io/busybox"));
        assert!(glob_match("*/busybox*", "docker.io/busybox"));
        assert!(glob_match("exact", "exact"));
        assert!(!glob_match("exact", "exactly"));
        assert!(glob_match("a*b*c", "aXbYc"));
        assert!(!glob_match("a*b*c", "aXcYb"));
    }

    #[test]
    fn default_table_maps_runtime_and_base_images() {
        let table = ImageTable::with_defaults();
        let runtime = table.lookup("example.com/sandbox-runtime:latest").unwrap();
        assert_eq!(runtime.program, Program::Named("sandbox-runtime".into()));
        assert_eq!(runtime.ports, vec![RUNTIME_PORT]);
        assert_eq!(
            table.lookup("python:3.13-slim").unwrap().program,
            Program::ContainerCommand
        );
        assert!(table.lookup("nginx:1.27").is_none());
        let mut table = table;
        table.prepend(ImageEntry::new("nginx*", Program::CurrentExe).args(["serve"]));
        assert_eq!(table.lookup("nginx:1.27").unwrap().args, vec!["serve"]);
    }

    #[test]
    fn templates_and_variable_references_expand() {
        let templates = Templates {
            pod_ip: "127.1.2.3".into(),
            pod_name: "p".into(),
            namespace: "ns".into(),
            pod_uid: "u".into(),
            pod_dir: "/app".into(),
        };
        assert_eq!(
            templates.expand("{pod_ip}:8888 {pod_dir}"),
            "127.1.2.3:8888 /app"
        );
        let env: BTreeMap<String, String> =
            [("A".to_owned(), "x".to_owned())].into_iter().collect();
        assert_eq!(expand_vars("$(A)-$(B)-$$(A)-$", &env), "x-$(B)-$(A)-$");
    }

    #[test]
    fn programs_are_found_next_to_the_executable_or_on_path() {
        let dir = tempfile::tempdir().unwrap();
        let deps = dir.path().join("deps");
        std::fs::create_dir(&deps).unwrap();
        std::fs::write(dir.path().join("tool"), "").unwrap();
        let exe = deps.join("test-binary");
        assert_eq!(
            find_program("tool", Some(&exe), None),
            Some(dir.path().join("tool"))
        );
        let path = std::env::join_paths([dir.path()]).unwrap();
        assert_eq!(
            find_program("tool", None, Some(&path)),
            Some(dir.path().join("tool"))
        );
        assert_eq!(find_program("missing", Some(&exe), Some(&path)), None);
    }
}
