//! `pod-sandbox container FD`: starts one container of a pod. It joins the pod's namespaces
//! (network, user, mount, IPC, UTS: what the kubelet hands it), becomes the container's user,
//! opens every source of the container's root while the pod's view of the machine is still
//! there, and makes mount, PID and cgroup namespaces of the container's own. Its child is PID 1
//! there: it builds the root on a tmpfs (read-only binds of the host's system directories, the
//! pod's files, `/proc`, `/dev`, `/tmp`, the volumes), pivots into it, drops every capability
//! (bounding and ambient sets too), sets `no_new_privs`, applies the seccomp filter, closes
//! every descriptor but standard input, output and error, and runs the container's program.
//! The helper stays outside the container's PID namespace to supervise it ([`supervise`]).
//!
//! [`supervise`]: crate::supervise

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;

use crate::spec::{Container, Namespace, Op};
use crate::{Step, fail, join, sys};

/// Where the container's root is built (in the container's own mount namespace, over the
/// pod's view of the host's `/tmp`; every source is opened before it is mounted).
const STAGING: &str = "/tmp";

const O_PATH: i32 = 0o1000_0000;
const O_NOFOLLOW: i32 = 0o400_000;

pub(crate) fn run(spec: &Container) -> ExitCode {
    if let Err(error) = prepare(spec) {
        return fail(&error);
    }
    // After the namespaces are joined (which a process with threads cannot do) and before the
    // PID namespace is made (after which this process can start no thread).
    let watcher = (!spec.check_only).then(crate::supervise::Watcher::start);
    // Held by this process alone: its end tells the child that this process is gone.
    let (lifeline, lifeline_end) = match std::io::pipe() {
        Ok(pipe) => pipe,
        Err(error) => return fail(&Step::message(format!("a pipe: {error}"))),
    };
    if let Err(error) = sys::unshare(Namespace::Pid.flag() | CLONE_NEWCGROUP) {
        return fail(&Step::message(format!(
            "making the container's PID and cgroup namespaces failed: {error}"
        )));
    }
    let child = match sys::fork() {
        Ok(pid) => pid,
        Err(error) => {
            return fail(&Step::message(format!(
                "forking the container's init: {error}"
            )));
        }
    };
    if child == 0 {
        drop(lifeline_end);
        let error = match init(spec, &lifeline) {
            Ok(never) => match never {},
            Err(error) => error,
        };
        eprintln!("pod-sandbox: {error}");
        std::process::exit(error.code.into());
    }
    drop(lifeline);
    // This process stays outside the container's PID namespace, as the pod's user too.
    if let Err(error) = sys::set_ids(spec.uid, spec.gid) {
        sys::kill(child, sys::SIGKILL);
        return fail(&Step::message(format!("becoming the pod's user: {error}")));
    }
    match watcher {
        Some(watcher) => watcher.supervise(child),
        None => match sys::waitpid(child, 0) {
            Ok((_, 0)) => ExitCode::SUCCESS,
            Ok((_, _)) => ExitCode::from(crate::supervise::FAILED),
            Err(error) => fail(&Step::message(format!("waiting for the check: {error}"))),
        },
    }
}

/// Takes the pod's groups and joins its namespaces (in the helper, before the fork).
fn prepare(spec: &Container) -> Result<(), Step> {
    if !spec.groups.is_empty() {
        sys::setgroups(&spec.groups).map_err(Step::new("taking the pod's groups"))?;
    }
    join(&spec.join)
}

const CLONE_NEWCGROUP: i32 = 0x0200_0000;

/// Opens every source of the root, in the container's mount namespace (a mount can be bound
/// only from the namespace it is in) and before anything is mounted over the pod's view.
fn open_sources(spec: &Container) -> Result<HashMap<String, File>, Step> {
    let mut sources = HashMap::new();
    for op in &spec.ops {
        if let Op::Bind { src, follow, .. } = op
            && !sources.contains_key(src)
        {
            let flags = if *follow { 0 } else { O_NOFOLLOW };
            let file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(O_PATH | flags)
                .open(src)
                .map_err(Step::with(format!("opening {src}")))?;
            sources.insert(src.clone(), file);
        }
    }
    Ok(sources)
}

/// The container's init, PID 1 of its namespace: builds the root and runs the program.
fn init(
    spec: &Container,
    lifeline: &std::io::PipeReader,
) -> Result<std::convert::Infallible, Step> {
    crate::supervise::set_signals(sys::SIG_DFL);
    sys::unshare(Namespace::Mount.flag())
        .map_err(Step::new("making the container's mount namespace"))?;
    sys::mount(
        None,
        Path::new("/"),
        None,
        sys::MS_REC | sys::MS_PRIVATE,
        None,
    )
    .map_err(Step::new("making the container's mounts private"))?;
    let sources = open_sources(spec)?;
    // The pod's user from here: files of the root are made as it (an id the pod's user
    // namespace does not map cannot own a file there). The capabilities in that namespace stay
    // until `restrict`.
    sys::set_ids(spec.uid, spec.gid).map_err(Step::with(format!(
        "becoming user {}:{} in the pod",
        spec.uid, spec.gid
    )))?;
    // After the last change of credentials, which would clear it: the container dies with
    // its helper, whatever kills the helper.
    if !sys::die_with_parent(lifeline).map_err(Step::new("setting PDEATHSIG"))? {
        std::process::exit(crate::supervise::FAILED.into());
    }
    let root = Root {
        base: PathBuf::from(STAGING),
    };
    for op in &spec.ops {
        root.apply(op, &sources)?;
    }
    drop(sources);
    std::env::set_current_dir(&root.base).map_err(Step::new("entering the new root"))?;
    sys::pivot_root(Path::new("."), Path::new("."))
        .map_err(Step::new("pivoting into the new root"))?;
    sys::umount_detach(Path::new(".")).map_err(Step::new("detaching the host's root"))?;
    std::env::set_current_dir("/").map_err(Step::new("entering /"))?;
    if spec.check_only {
        restrict(spec.seccomp.as_deref())?;
        std::process::exit(0);
    }
    std::env::set_current_dir(&spec.workdir).map_err(Step::with(format!(
        "entering the working directory {}",
        spec.workdir
    )))?;
    restrict(spec.seccomp.as_deref())?;
    exec(&spec.argv)
}

/// Drops every capability, sets `no_new_privs`, applies `seccomp`, and marks every descriptor
/// but 0, 1 and 2 close-on-exec: what a container's program (or a process entering it) runs
/// with.
pub(crate) fn restrict(seccomp: Option<&[u8]>) -> Result<(), Step> {
    let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(40);
    sys::drop_bounding_and_ambient(last).map_err(Step::new("dropping the bounding set"))?;
    sys::prctl(sys::PR_SET_NO_NEW_PRIVS, 1).map_err(Step::new("setting no_new_privs"))?;
    if let Some(program) = seccomp {
        sys::install_seccomp(program).map_err(Step::new("applying the seccomp filter"))?;
    }
    sys::clear_capabilities().map_err(Step::new("dropping every capability"))?;
    close_on_exec()
}

fn close_on_exec() -> Result<(), Step> {
    let entries = std::fs::read_dir("/proc/self/fd").map_err(Step::new("listing descriptors"))?;
    let fds: Vec<i32> = entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        sys::set_cloexec(fd);
    }
    Ok(())
}

/// Runs `argv` in place of this process; returns only with why it could not.
pub(crate) fn exec(argv: &[String]) -> Result<std::convert::Infallible, Step> {
    let Some((program, args)) = argv.split_first() else {
        return Err(Step::message("no command to run".to_owned()));
    };
    let error = std::process::Command::new(program).args(args).exec();
    // As a shell reports it: 127 not found, 126 found but not executable.
    let code = if error.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    };
    Err(Step {
        what: format!("cannot run {program}: {error}"),
        code,
    })
}

/// The root being built.
struct Root {
    base: PathBuf,
}

impl Root {
    /// `dest` (absolute, inside the root) as a path here, refusing `..` and any symbolic link
    /// on the way (a link could lead the set-up out of the root).
    fn path(&self, dest: &str) -> Result<PathBuf, Step> {
        let mut path = self.base.clone();
        for component in Path::new(dest).components() {
            match component {
                Component::RootDir | Component::CurDir => {}
                Component::Normal(name) => {
                    if let Ok(metadata) = std::fs::symlink_metadata(&path)
                        && metadata.file_type().is_symlink()
                    {
                        return Err(Step::message(format!(
                            "{dest}: a symbolic link on the way in the container's root"
                        )));
                    }
                    path.push(name);
                }
                Component::ParentDir | Component::Prefix(_) => {
                    return Err(Step::message(format!("{dest}: not a plain absolute path")));
                }
            }
        }
        if let Ok(metadata) = std::fs::symlink_metadata(&path)
            && metadata.file_type().is_symlink()
        {
            return Err(Step::message(format!(
                "{dest}: a symbolic link in the container's root"
            )));
        }
        Ok(path)
    }

    /// The directory `dest`, made with `mode` (and its parents with 0755) when missing; an
    /// existing one is left as it is.
    fn dir(&self, dest: &str, mode: u32) -> Result<PathBuf, Step> {
        let path = self.path(dest)?;
        if path.is_dir() {
            return Ok(path);
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&path)
            .map_err(Step::with(format!("making {dest}")))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .map_err(Step::with(format!("setting the mode of {dest}")))?;
        Ok(path)
    }

    /// An empty file at `dest` (a mount point for a file), its parents made.
    fn file(&self, dest: &str) -> Result<PathBuf, Step> {
        let path = self.path(dest)?;
        if let Some(parent) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)
                .map_err(Step::with(format!("making the parents of {dest}")))?;
        }
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(&path)
            .map_err(Step::with(format!("making {dest}")))?;
        Ok(path)
    }

    fn apply(&self, op: &Op, sources: &HashMap<String, File>) -> Result<(), Step> {
        match op {
            Op::Dir { dest, mode } => {
                self.dir(dest, *mode)?;
            }
            Op::Tmpfs { dest, size, mode } => {
                let path = if dest == "/" {
                    self.base.clone()
                } else {
                    self.dir(dest, 0o755)?
                };
                tmpfs(&path, *size, *mode)
                    .map_err(Step::with(format!("mounting a tmpfs on {dest}")))?;
            }
            Op::Bind {
                src,
                dest,
                read_only,
                ..
            } => {
                let source = sources
                    .get(src)
                    .ok_or_else(|| Step::message(format!("{src} was not opened")))?;
                let is_dir = source.metadata().is_ok_and(|m| m.is_dir());
                let path = if is_dir {
                    self.dir(dest, 0o755)?
                } else {
                    self.file(dest)?
                };
                let from = PathBuf::from(format!("/proc/self/fd/{}", source.as_raw_fd()));
                sys::mount(Some(&from), &path, None, sys::MS_BIND | sys::MS_REC, None)
                    .map_err(Step::with(format!("binding {src} at {dest}")))?;
                if *read_only {
                    remount_read_only(&path, true)
                        .map_err(Step::with(format!("making {dest} read-only")))?;
                }
            }
            Op::Symlink { target, dest } => {
                let path = self.path(dest)?;
                std::os::unix::fs::symlink(target, &path)
                    .map_err(Step::with(format!("linking {dest} to {target}")))?;
            }
            Op::File { dest, mode, data } => {
                let path = self.path(dest)?;
                std::fs::write(&path, data)
                    .and_then(|()| {
                        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(*mode))
                    })
                    .map_err(Step::with(format!("writing {dest}")))?;
            }
            Op::Proc { dest } => self.proc(dest)?,
            Op::Dev { dest } => self.dev(dest)?,
            Op::RemountRo { dest } => {
                let path = self.path(dest)?;
                remount_read_only(&path, false)
                    .map_err(Step::with(format!("making {dest} read-only")))?;
            }
        }
        Ok(())
    }

    /// A procfs of the container's PID namespace, with the parts that configure the machine
    /// read-only (as container runtimes leave them).
    fn proc(&self, dest: &str) -> Result<(), Step> {
        let path = self.dir(dest, 0o555)?;
        sys::mount(
            Some(Path::new("proc")),
            &path,
            Some("proc"),
            sys::MS_NOSUID | sys::MS_NODEV | sys::MS_NOEXEC,
            None,
        )
        .map_err(Step::with(format!("mounting /proc on {dest}")))?;
        for part in ["sys", "sysrq-trigger", "irq", "bus"] {
            let inner = path.join(part);
            if inner.exists() {
                sys::mount(Some(&inner), &inner, None, sys::MS_BIND | sys::MS_REC, None)
                    .and_then(|()| remount_read_only(&inner, true))
                    .map_err(Step::with(format!("making /proc/{part} read-only")))?;
            }
        }
        Ok(())
    }

    /// A `/dev` of the host's harmless devices, a devpts of the container's own and a `shm`.
    fn dev(&self, dest: &str) -> Result<(), Step> {
        let path = self.dir(dest, 0o755)?;
        tmpfs(&path, 64 << 10, 0o755).map_err(Step::with(format!("mounting a tmpfs on {dest}")))?;
        for device in ["null", "zero", "full", "random", "urandom", "tty"] {
            let host = Path::new("/dev").join(device);
            let inside = path.join(device);
            File::create(&inside)
                .and_then(|_| sys::mount(Some(&host), &inside, None, sys::MS_BIND, None))
                .map_err(Step::with(format!("binding /dev/{device}")))?;
        }
        for (name, target) in [
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
            ("ptmx", "pts/ptmx"),
        ] {
            std::os::unix::fs::symlink(target, path.join(name))
                .map_err(Step::with(format!("linking /dev/{name}")))?;
        }
        let pts = path.join("pts");
        std::fs::create_dir(&pts)
            .and_then(|()| {
                sys::mount(
                    Some(Path::new("devpts")),
                    &pts,
                    Some("devpts"),
                    sys::MS_NOSUID | sys::MS_NOEXEC,
                    Some("newinstance,ptmxmode=0666,mode=620"),
                )
            })
            .map_err(Step::new("mounting /dev/pts"))?;
        let shm = path.join("shm");
        std::fs::create_dir(&shm)
            .and_then(|()| tmpfs(&shm, 64 << 20, 0o1777))
            .map_err(Step::new("mounting /dev/shm"))?;
        Ok(())
    }
}

fn tmpfs(path: &Path, size: u64, mode: u32) -> std::io::Result<()> {
    sys::mount(
        Some(Path::new("tmpfs")),
        path,
        Some("tmpfs"),
        sys::MS_NOSUID | sys::MS_NODEV,
        Some(&format!("size={},mode={mode:o}", size.max(4096))),
    )
}

/// Makes the mount at `path` (and, with `below`, every mount under it) read-only, keeping the
/// flags a mount of a more privileged namespace has locked (nosuid, nodev, noexec, atime).
fn remount_read_only(path: &Path, below: bool) -> std::io::Result<()> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mut targets: Vec<(PathBuf, u64)> = Vec::new();
    for line in mounts.lines() {
        let Some((point, options)) = mount_point_and_options(line) else {
            continue;
        };
        let wanted = if below {
            point.starts_with(path)
        } else {
            point == path
        };
        if wanted {
            // The last entry for a point is the one on top.
            targets.retain(|(p, _)| *p != point);
            targets.push((point, flags_of(&options)));
        }
    }
    if targets.is_empty() {
        return Err(std::io::Error::other(format!(
            "no mount at {} in /proc/self/mountinfo",
            path.display()
        )));
    }
    for (point, flags) in targets {
        sys::mount(
            None,
            &point,
            None,
            sys::MS_REMOUNT | sys::MS_BIND | sys::MS_RDONLY | flags,
            None,
        )?;
    }
    Ok(())
}

/// The mount point (unescaped) and per-mount options of a `/proc/self/mountinfo` line.
pub(crate) fn mount_point_and_options(line: &str) -> Option<(PathBuf, String)> {
    let mut fields = line.split(' ');
    let point = fields.nth(4)?;
    let options = fields.next()?;
    Some((PathBuf::from(unescape_octal(point)), options.to_owned()))
}

/// Undoes mountinfo's `\NNN` octal escapes (space, tab, newline, backslash).
fn unescape_octal(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'\\'
            && let Some(code) = bytes
                .get(index + 1..index + 4)
                .and_then(|digits| std::str::from_utf8(digits).ok())
                .and_then(|digits| u8::from_str_radix(digits, 8).ok())
        {
            out.push(code);
            index += 4;
            continue;
        }
        out.push(bytes[index]);
        index += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount flags named in per-mount options that a read-only remount must keep.
pub(crate) fn flags_of(options: &str) -> u64 {
    options
        .split(',')
        .map(|option| match option {
            "nosuid" => sys::MS_NOSUID,
            "nodev" => sys::MS_NODEV,
            "noexec" => sys::MS_NOEXEC,
            "noatime" => sys::MS_NOATIME,
            "nodiratime" => sys::MS_NODIRATIME,
            "relatime" => sys::MS_RELATIME,
            "strictatime" => sys::MS_STRICTATIME,
            _ => 0,
        })
        .fold(0, |flags, flag| flags | flag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_give_their_point_and_flags() {
        let line =
            "36 35 98:0 /mnt1 /mnt\\040two rw,nosuid,noexec,relatime shared:1 - ext3 /dev/root rw";
        let (point, options) = mount_point_and_options(line).unwrap();
        assert_eq!(point, PathBuf::from("/mnt two"));
        assert_eq!(
            flags_of(&options),
            sys::MS_NOSUID | sys::MS_NOEXEC | sys::MS_RELATIME
        );
        assert_eq!(mount_point_and_options("short line"), None);
    }

    #[test]
    fn root_paths_refuse_parent_components() {
        let root = Root {
            base: PathBuf::from("/nonexistent-root"),
        };
        assert_eq!(
            root.path("/a/b").unwrap(),
            PathBuf::from("/nonexistent-root/a/b")
        );
        assert!(root.path("/a/../../etc").is_err());
    }
}
