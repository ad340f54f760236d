//! `pod-sandbox pod FD`: holds a pod's sandbox, as a node's pause container does. It makes the
//! pod's user namespace (the pod's user mapped to this process's), mount, IPC and UTS
//! namespaces (hostname = the pod's), and mounts the pod's writable storage, a tmpfs of the
//! pod's ephemeral-storage size, in its mount namespace, where containers (which join these
//! namespaces) find `app` and their `emptyDir` volumes. Then it says `ready` on standard output
//! and waits for the end of standard input; when it exits, the namespaces and the storage go
//! with the last container.

use std::io::{Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::Path;
use std::process::ExitCode;

use crate::spec::Pod;
use crate::{Step, fail, join, sys};

pub(crate) fn run(spec: &Pod) -> ExitCode {
    match set_up(spec) {
        Ok(()) => {}
        Err(error) => return fail(&error),
    }
    let mut stdout = std::io::stdout();
    if writeln!(stdout, "ready")
        .and_then(|()| stdout.flush())
        .is_err()
    {
        return ExitCode::from(crate::supervise::FAILED);
    }
    crate::supervise::set_signals(sys::SIG_IGN);
    let mut buffer = [0u8; 64];
    let mut stdin = std::io::stdin().lock();
    loop {
        match stdin.read(&mut buffer) {
            Ok(0) => return ExitCode::SUCCESS,
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return ExitCode::SUCCESS,
        }
    }
}

fn set_up(spec: &Pod) -> Result<(), Step> {
    // No PDEATHSIG: it follows the thread that started this process, which may end long before
    // the kubelet; the end of standard input is what ends this process.
    // The storage is mounted on the working directory: entered now, while this process may
    // still reach it (a root kubelet's pod uid may not traverse the kubelet's directories).
    let storage = Path::new(&spec.storage);
    let Some(name) = storage.file_name() else {
        return Err(Step::message(format!(
            "{}: not a storage path",
            spec.storage
        )));
    };
    std::env::set_current_dir(storage).map_err(Step::with(format!("entering {}", spec.storage)))?;
    join(&spec.join)?;
    if let Some((uid, gid)) = spec.host_ids {
        sys::setgroups(&spec.groups).map_err(Step::new("taking the pod's groups"))?;
        sys::set_ids(uid, gid).map_err(Step::new("becoming the pod's host user"))?;
    }
    user_namespace(spec.uid, spec.gid)?;
    sys::unshare(
        crate::spec::Namespace::Mount.flag()
            | crate::spec::Namespace::Ipc.flag()
            | crate::spec::Namespace::Uts.flag(),
    )
    .map_err(Step::new("making the pod's mount, IPC and UTS namespaces"))?;
    sys::mount(
        None,
        Path::new("/"),
        None,
        sys::MS_REC | sys::MS_PRIVATE,
        None,
    )
    .map_err(Step::new("making the pod's mounts private"))?;
    sys::sethostname(&spec.hostname).map_err(Step::new("setting the pod's hostname"))?;
    // Making the mount namespace moved the working directory to its copy.
    sys::mount(
        Some(Path::new("tmpfs")),
        Path::new("."),
        Some("tmpfs"),
        sys::MS_NOSUID | sys::MS_NODEV,
        Some(&format!("size={},mode=0755", spec.storage_size.max(4096))),
    )
    .map_err(Step::with(format!(
        "mounting the pod's storage ({} bytes) on {}",
        spec.storage_size, spec.storage
    )))?;
    // Into the tmpfs: from the parent (the pod's directory, which the kubelet leaves
    // traversable), down again through the new mount.
    std::env::set_current_dir("..")
        .and_then(|()| std::env::set_current_dir(name))
        .map_err(Step::new("entering the pod's storage"))?;
    for (dir, mode) in &spec.dirs {
        let path = Path::new(dir);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(path)
            .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(*mode)))
            .map_err(Step::with(format!("making {dir} in the pod's storage")))?;
    }
    // The kubelet opens this process's namespaces (/proc/PID/ns); the credential changes above
    // made it undumpable, which would refuse a kubelet that is not root. Nothing of the pod can
    // reach this process: it is in no container's PID namespace.
    sys::prctl(sys::PR_SET_DUMPABLE, 1).map_err(Step::new("making the namespaces openable"))?;
    std::env::set_current_dir("/").map_err(Step::new("leaving the pod's storage"))
}

/// Makes a user namespace in which this process is `uid`:`gid` (its own ids outside), without
/// `setgroups` (so that nobody in it can drop a group to get around a file's group permissions).
fn user_namespace(uid: u32, gid: u32) -> Result<(), Step> {
    let (outer_uid, outer_gid) = sys::effective_ids();
    sys::unshare(crate::spec::Namespace::User.flag()).map_err(|error| {
        let hint = match error.raw_os_error() {
            // ENOSPC: user.max_user_namespaces is 0; EPERM: unprivileged user namespaces are
            // switched off (Debian's sysctl, an AppArmor restriction, a seccomp profile);
            // EINVAL: a kernel without them.
            Some(28 | 1 | 22) => format!(" ({})", crate::spec::USERNS_DISABLED_HINT),
            _ => String::new(),
        };
        Step::message(format!(
            "making the pod's user namespace failed: {error}{hint}"
        ))
    })?;
    // A credential change leaves a process undumpable, and then its /proc files belong to root:
    // it could not write its own maps.
    sys::prctl(sys::PR_SET_DUMPABLE, 1).map_err(Step::new("making /proc/self writable"))?;
    let write = |file: &str, data: String| {
        std::fs::write(format!("/proc/self/{file}"), data)
            .map_err(Step::with(format!("writing /proc/self/{file}")))
    };
    write("setgroups", "deny".to_owned())?;
    write("gid_map", format!("{gid} {outer_gid} 1\n"))?;
    write("uid_map", format!("{uid} {outer_uid} 1\n"))?;
    Ok(())
}
