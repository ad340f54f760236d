//! What the kubelet asks the pod-sandbox helper to do, and its text form: the one format both
//! sides read and write (the kubelet includes this file as a module of its own, the helper
//! compiles it with `std` alone).
//!
//! A spec is a list of records, one per line; a record is tab-separated fields, the first of
//! which names it. Fields escape `\`, tab and newline as `\\`, `\t` and `\n`, so any UTF-8 text
//! (a path, a file's contents) survives; binary data (the seccomp program) is hexadecimal.

use std::fmt::Write as _;

/// What to do where user namespaces cannot be made (the kubelet and the helper both say it).
pub(crate) const USERNS_DISABLED_HINT: &str = "user namespaces are disabled here: \
    `sysctl -w user.max_user_namespaces=15000`; on Debian kernels also \
    `sysctl -w kernel.unprivileged_userns_clone=1`, on Ubuntu 24.04 and later \
    `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`";

/// A namespace the helper joins (`setns`) from a descriptor it inherits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Namespace {
    User,
    Net,
    Mount,
    Ipc,
    Uts,
    Pid,
}

impl Namespace {
    fn name(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Net => "net",
            Self::Mount => "mnt",
            Self::Ipc => "ipc",
            Self::Uts => "uts",
            Self::Pid => "pid",
        }
    }

    fn parse(text: &str) -> Result<Self, String> {
        Ok(match text {
            "user" => Self::User,
            "net" => Self::Net,
            "mnt" => Self::Mount,
            "ipc" => Self::Ipc,
            "uts" => Self::Uts,
            "pid" => Self::Pid,
            other => return Err(format!("unknown namespace {other:?}")),
        })
    }

    /// Its `CLONE_NEW*` flag.
    pub(crate) fn flag(self) -> i32 {
        match self {
            Self::User => 0x1000_0000,
            Self::Net => 0x4000_0000,
            Self::Mount => 0x0002_0000,
            Self::Ipc => 0x0800_0000,
            Self::Uts => 0x0400_0000,
            Self::Pid => 0x2000_0000,
        }
    }
}

/// One step of building a container's root, whose paths (`dest`) are inside the new root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// An empty directory (and its parents, mode 0755).
    Dir { dest: String, mode: u32 },
    /// A tmpfs of at most `size` bytes.
    Tmpfs { dest: String, size: u64, mode: u32 },
    /// `src` (a path outside, opened before anything is mounted; `follow`: symlinks in its last
    /// component are followed) bound at `dest`, read-only (with every mount below it) or not.
    Bind {
        src: String,
        dest: String,
        read_only: bool,
        follow: bool,
    },
    /// A symbolic link at `dest` to `target`.
    Symlink { target: String, dest: String },
    /// A file with these contents.
    File {
        dest: String,
        mode: u32,
        data: String,
    },
    /// A procfs of the container's PID namespace.
    Proc { dest: String },
    /// A minimal `/dev`: a tmpfs with the host's null, zero, full, random, urandom and tty, a
    /// devpts of its own, a `shm` tmpfs and the standard links.
    Dev { dest: String },
    /// Makes the mount at `dest` read-only (the root's own tmpfs, say).
    RemountRo { dest: String },
}

/// A pod's sandbox: the user, mount, IPC and UTS namespaces its containers share, and its
/// writable storage (`storage`: a tmpfs of at most `storage_size` bytes mounted there in the
/// pod's mount namespace, with `dirs` made in it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Pod {
    /// Namespaces to join before anything else (a node's user and network namespaces).
    pub(crate) join: Vec<(Namespace, i32)>,
    /// Host ids to become first (a root kubelet's per-pod uid and gid) and supplementary groups.
    pub(crate) host_ids: Option<(u32, u32)>,
    pub(crate) groups: Vec<u32>,
    /// The user and group the pod's processes are inside its user namespace.
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) hostname: String,
    pub(crate) storage: String,
    pub(crate) storage_size: u64,
    /// Directories of the storage (relative), made with mode 0755 (`app`) or 0777 (volumes).
    pub(crate) dirs: Vec<(String, u32)>,
}

/// One container of a pod: the namespaces it joins (the pod's), who it runs as, the root it
/// builds in mount and PID namespaces of its own, and what it runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Container {
    /// Joined in this order (a node's user namespace, the pod's network, the pod's user
    /// namespace, then its mount, IPC and UTS namespaces).
    pub(crate) join: Vec<(Namespace, i32)>,
    /// Supplementary groups to take before joining (a root kubelet's shared volume group).
    pub(crate) groups: Vec<u32>,
    /// uid and gid inside the pod's user namespace.
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) ops: Vec<Op>,
    /// The working directory, inside the root.
    pub(crate) workdir: String,
    /// The seccomp program (`struct sock_filter` array), when one is applied.
    pub(crate) seccomp: Option<Vec<u8>>,
    /// Stop after building the root instead of running `argv` (the kubelet's start-up check).
    pub(crate) check_only: bool,
    pub(crate) argv: Vec<String>,
}

/// A process started in a running container's namespaces (an exec probe): it joins them all,
/// its PID namespace too, and runs `argv` with the container's restrictions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Enter {
    pub(crate) join: Vec<(Namespace, i32)>,
    pub(crate) groups: Vec<u32>,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) workdir: String,
    pub(crate) seccomp: Option<Vec<u8>>,
    pub(crate) argv: Vec<String>,
}

fn escape(field: &str, out: &mut String) {
    for c in field.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn unescape(field: &str) -> Result<String, String> {
    let mut out = String::with_capacity(field.len());
    let mut chars = field.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('\\') => out.push('\\'),
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            other => return Err(format!("bad escape \\{other:?} in {field:?}")),
        }
    }
    Ok(out)
}

fn hex(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len() * 2);
    for byte in data {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

fn unhex(text: &str) -> Result<Vec<u8>, String> {
    if !text.len().is_multiple_of(2) {
        return Err("odd-length hexadecimal".to_owned());
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            text.get(i..i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or_else(|| format!("bad hexadecimal at {i}"))
        })
        .collect()
}

/// Records being written.
#[derive(Default)]
struct Writer(String);

impl Writer {
    fn record(&mut self, fields: &[&str]) {
        for (index, field) in fields.iter().enumerate() {
            if index > 0 {
                self.0.push('\t');
            }
            escape(field, &mut self.0);
        }
        self.0.push('\n');
    }

    fn join(&mut self, join: &[(Namespace, i32)]) {
        for (namespace, fd) in join {
            self.record(&["join", namespace.name(), &fd.to_string()]);
        }
    }

    fn ids(&mut self, groups: &[u32], uid: u32, gid: u32) {
        for group in groups {
            self.record(&["group", &group.to_string()]);
        }
        self.record(&["user", &uid.to_string(), &gid.to_string()]);
    }

    fn tail(&mut self, workdir: &str, seccomp: Option<&[u8]>, argv: &[String]) {
        self.record(&["workdir", workdir]);
        if let Some(program) = seccomp {
            self.record(&["seccomp", &hex(program)]);
        }
        let mut fields = vec!["argv"];
        fields.extend(argv.iter().map(String::as_str));
        self.record(&fields);
    }
}

/// Parsed records.
struct Records(Vec<Vec<String>>);

impl Records {
    fn parse(text: &str) -> Result<Self, String> {
        text.lines()
            .filter(|line| !line.is_empty())
            .map(|line| line.split('\t').map(unescape).collect())
            .collect::<Result<Vec<Vec<String>>, String>>()
            .map(Self)
    }
}

fn number<T: std::str::FromStr>(field: Option<&String>, what: &str) -> Result<T, String> {
    field
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| format!("{what}: expected a number, got {field:?}"))
}

fn field(field: Option<&String>, what: &str) -> Result<String, String> {
    field.cloned().ok_or_else(|| format!("{what}: missing"))
}

fn octal(field: Option<&String>, what: &str) -> Result<u32, String> {
    field
        .and_then(|text| u32::from_str_radix(text, 8).ok())
        .ok_or_else(|| format!("{what}: expected an octal mode, got {field:?}"))
}

/// The fields every kind of spec shares, read from one record.
#[derive(Default)]
struct Common {
    join: Vec<(Namespace, i32)>,
    groups: Vec<u32>,
    ids: Option<(u32, u32)>,
    workdir: String,
    seccomp: Option<Vec<u8>>,
    argv: Vec<String>,
}

impl Common {
    /// Takes `record` if it is a common one (`Ok(true)`).
    fn take(&mut self, record: &[String]) -> Result<bool, String> {
        let kind = record.first().map(String::as_str).unwrap_or_default();
        match kind {
            "join" => {
                let namespace = Namespace::parse(&field(record.get(1), "join")?)?;
                self.join
                    .push((namespace, number(record.get(2), "join fd")?));
            }
            "group" => self.groups.push(number(record.get(1), "group")?),
            "user" => {
                self.ids = Some((
                    number(record.get(1), "user uid")?,
                    number(record.get(2), "user gid")?,
                ));
            }
            "workdir" => self.workdir = field(record.get(1), "workdir")?,
            "seccomp" => self.seccomp = Some(unhex(&field(record.get(1), "seccomp")?)?),
            "argv" => self.argv = record[1..].to_vec(),
            _ => return Ok(false),
        }
        Ok(true)
    }
}

impl Pod {
    pub(crate) fn encode(&self) -> String {
        let mut writer = Writer::default();
        writer.join(&self.join);
        if let Some((uid, gid)) = self.host_ids {
            writer.record(&["host-ids", &uid.to_string(), &gid.to_string()]);
        }
        writer.ids(&self.groups, self.uid, self.gid);
        writer.record(&["hostname", &self.hostname]);
        writer.record(&["storage", &self.storage, &self.storage_size.to_string()]);
        for (dir, mode) in &self.dirs {
            writer.record(&["dir", dir, &format!("{mode:o}")]);
        }
        writer.0
    }

    pub(crate) fn decode(text: &str) -> Result<Self, String> {
        let mut common = Common::default();
        let mut pod = Self::default();
        for record in Records::parse(text)?.0 {
            if common.take(&record)? {
                continue;
            }
            match record[0].as_str() {
                "host-ids" => {
                    pod.host_ids = Some((
                        number(record.get(1), "host-ids uid")?,
                        number(record.get(2), "host-ids gid")?,
                    ));
                }
                "hostname" => pod.hostname = field(record.get(1), "hostname")?,
                "storage" => {
                    pod.storage = field(record.get(1), "storage")?;
                    pod.storage_size = number(record.get(2), "storage size")?;
                }
                "dir" => pod.dirs.push((
                    field(record.get(1), "dir")?,
                    octal(record.get(2), "dir mode")?,
                )),
                other => return Err(format!("unknown pod record {other:?}")),
            }
        }
        (pod.uid, pod.gid) = common.ids.ok_or("the pod spec names no user")?;
        pod.join = common.join;
        pod.groups = common.groups;
        Ok(pod)
    }
}

impl Op {
    fn encode(&self, writer: &mut Writer) {
        match self {
            Self::Dir { dest, mode } => writer.record(&["dir", dest, &format!("{mode:o}")]),
            Self::Tmpfs { dest, size, mode } => {
                writer.record(&["tmpfs", dest, &size.to_string(), &format!("{mode:o}")]);
            }
            Self::Bind {
                src,
                dest,
                read_only,
                follow,
            } => writer.record(&[
                "bind",
                src,
                dest,
                if *read_only { "ro" } else { "rw" },
                if *follow { "follow" } else { "nofollow" },
            ]),
            Self::Symlink { target, dest } => writer.record(&["symlink", target, dest]),
            Self::File { dest, mode, data } => {
                writer.record(&["file", dest, &format!("{mode:o}"), data]);
            }
            Self::Proc { dest } => writer.record(&["proc", dest]),
            Self::Dev { dest } => writer.record(&["dev", dest]),
            Self::RemountRo { dest } => writer.record(&["remount-ro", dest]),
        }
    }

    fn decode(record: &[String]) -> Result<Option<Self>, String> {
        let dest = || field(record.get(1), "destination");
        Ok(Some(match record[0].as_str() {
            "dir" => Self::Dir {
                dest: dest()?,
                mode: octal(record.get(2), "dir mode")?,
            },
            "tmpfs" => Self::Tmpfs {
                dest: dest()?,
                size: number(record.get(2), "tmpfs size")?,
                mode: octal(record.get(3), "tmpfs mode")?,
            },
            "bind" => Self::Bind {
                src: field(record.get(1), "bind source")?,
                dest: field(record.get(2), "bind destination")?,
                read_only: record.get(3).map(String::as_str) == Some("ro"),
                follow: record.get(4).map(String::as_str) == Some("follow"),
            },
            "symlink" => Self::Symlink {
                target: field(record.get(1), "symlink target")?,
                dest: field(record.get(2), "symlink destination")?,
            },
            "file" => Self::File {
                dest: dest()?,
                mode: octal(record.get(2), "file mode")?,
                data: field(record.get(3), "file data")?,
            },
            "proc" => Self::Proc { dest: dest()? },
            "dev" => Self::Dev { dest: dest()? },
            "remount-ro" => Self::RemountRo { dest: dest()? },
            _ => return Ok(None),
        }))
    }
}

impl Container {
    pub(crate) fn encode(&self) -> String {
        let mut writer = Writer::default();
        writer.join(&self.join);
        writer.ids(&self.groups, self.uid, self.gid);
        for op in &self.ops {
            op.encode(&mut writer);
        }
        if self.check_only {
            writer.record(&["check-only"]);
        }
        writer.tail(&self.workdir, self.seccomp.as_deref(), &self.argv);
        writer.0
    }

    pub(crate) fn decode(text: &str) -> Result<Self, String> {
        let mut common = Common::default();
        let mut container = Self::default();
        for record in Records::parse(text)?.0 {
            if common.take(&record)? {
                continue;
            }
            if record[0] == "check-only" {
                container.check_only = true;
                continue;
            }
            match Op::decode(&record)? {
                Some(op) => container.ops.push(op),
                None => return Err(format!("unknown container record {:?}", record[0])),
            }
        }
        (container.uid, container.gid) = common.ids.ok_or("the container spec names no user")?;
        container.join = common.join;
        container.groups = common.groups;
        container.workdir = common.workdir;
        container.seccomp = common.seccomp;
        container.argv = common.argv;
        if container.argv.is_empty() && !container.check_only {
            return Err("the container spec has no command".to_owned());
        }
        Ok(container)
    }
}

impl Enter {
    pub(crate) fn encode(&self) -> String {
        let mut writer = Writer::default();
        writer.join(&self.join);
        writer.ids(&self.groups, self.uid, self.gid);
        writer.tail(&self.workdir, self.seccomp.as_deref(), &self.argv);
        writer.0
    }

    pub(crate) fn decode(text: &str) -> Result<Self, String> {
        let mut common = Common::default();
        for record in Records::parse(text)?.0 {
            if !common.take(&record)? {
                return Err(format!("unknown enter record {:?}", record[0]));
            }
        }
        let (uid, gid) = common.ids.ok_or("the enter spec names no user")?;
        if common.argv.is_empty() {
            return Err("the enter spec has no command".to_owned());
        }
        Ok(Self {
            join: common.join,
            groups: common.groups,
            uid,
            gid,
            workdir: common.workdir,
            seccomp: common.seccomp,
            argv: common.argv,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_survive_their_text_form() {
        let container = Container {
            join: vec![(Namespace::Net, 5), (Namespace::User, 6)],
            groups: vec![0x7000_0001],
            uid: 1000,
            gid: 1000,
            ops: vec![
                Op::Tmpfs {
                    dest: "/".into(),
                    size: 1 << 20,
                    mode: 0o755,
                },
                Op::Bind {
                    src: "/usr".into(),
                    dest: "/usr".into(),
                    read_only: true,
                    follow: true,
                },
                Op::File {
                    dest: "/etc/passwd".into(),
                    mode: 0o644,
                    data: "root:x:0:0\n\tweird\\line".into(),
                },
                Op::Symlink {
                    target: "usr/bin".into(),
                    dest: "/bin".into(),
                },
                Op::Proc {
                    dest: "/proc".into(),
                },
                Op::Dev {
                    dest: "/dev".into(),
                },
                Op::Dir {
                    dest: "/a b".into(),
                    mode: 0o700,
                },
                Op::RemountRo { dest: "/".into() },
            ],
            workdir: "/app".into(),
            seccomp: Some(vec![0, 1, 0xfe, 0xff]),
            check_only: false,
            argv: vec!["/bin/sh".into(), "-c".into(), "echo 'a\tb'\n".into()],
        };
        assert_eq!(Container::decode(&container.encode()), Ok(container));
        let pod = Pod {
            join: vec![(Namespace::User, 3)],
            host_ids: Some((7, 8)),
            groups: vec![9],
            uid: 1000,
            gid: 2000,
            hostname: "pod-a".into(),
            storage: "/data/pods/x/storage".into(),
            storage_size: 4096,
            dirs: vec![("app".into(), 0o755), ("volumes/cache".into(), 0o777)],
        };
        assert_eq!(Pod::decode(&pod.encode()), Ok(pod));
        let enter = Enter {
            join: vec![(Namespace::Pid, 4)],
            groups: Vec::new(),
            uid: 0,
            gid: 0,
            workdir: "/".into(),
            seccomp: None,
            argv: vec!["true".into()],
        };
        assert_eq!(Enter::decode(&enter.encode()), Ok(enter));
    }

    #[test]
    fn bad_specs_are_refused() {
        assert!(Container::decode("user\t1\t1\nbogus\tx\n").is_err());
        assert!(Container::decode("user\t1\t1\n").is_err(), "no command");
        assert!(Container::decode("argv\ttrue\n").is_err(), "no user");
        assert!(Container::decode("user\tx\t1\nargv\ttrue\n").is_err());
        assert!(Pod::decode("user\t1\t1\nstorage\t/s\tbig\n").is_err());
        assert!(Enter::decode("user\t1\t1\nseccomp\tabc\nargv\ttrue\n").is_err());
        assert!(unescape("a\\x").is_err());
    }
}
