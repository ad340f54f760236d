//! Optional in-sandbox hardening of commands, off by default: `no_new_privs` and a Landlock
//! ruleset that allows writes only beneath the base directory, `/tmp` and a few device files.
//! Reads and execution stay unrestricted. What the kernel offers is probed at startup and
//! logged either way.
//!
//! The ruleset is built once here and applied in each child between `clone` and `exec` (see
//! `exec::launch`), so it covers every command whichever thread spawns it, and the server itself
//! stays unrestricted.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;

use landlock::{ABI, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, path_beneath_rules};

/// The newest Landlock ABI whose write rights we ask for; older kernels get what they support.
const LANDLOCK_ABI: ABI = ABI::V5;

/// Paths besides the base directory where commands may write.
const WRITABLE: &[&str] = &[
    "/tmp",
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/pts",
    "/dev/shm",
];

/// What the kernel offers, for the startup log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// A Landlock ruleset could be created.
    pub landlock: bool,
    /// The runtime itself already runs with `no_new_privs` (set by its parent).
    pub no_new_privs: bool,
}

/// Probes Landlock and `no_new_privs` without restricting anything.
pub fn probe() -> Probe {
    let landlock = Ruleset::default()
        .handle_access(AccessFs::from_write(LANDLOCK_ABI))
        .and_then(|ruleset| ruleset.create())
        .map(|created| Option::<OwnedFd>::from(created).is_some())
        .unwrap_or(false);
    let no_new_privs = rustix::thread::no_new_privs().unwrap_or(false);
    Probe {
        landlock,
        no_new_privs,
    }
}

/// Hardening applied to every child.
#[derive(Debug)]
pub(crate) struct Hardening {
    /// The Landlock ruleset, when the kernel supports it.
    ruleset: Option<OwnedFd>,
}

impl Hardening {
    /// Builds the ruleset for `base_dir`. Without Landlock support only `no_new_privs` is
    /// applied.
    pub(crate) fn prepare(base_dir: &Path) -> Result<Self, landlock::RulesetError> {
        let write = AccessFs::from_write(LANDLOCK_ABI);
        let mut paths: Vec<&Path> = vec![base_dir];
        paths.extend(WRITABLE.iter().map(Path::new));
        let created = Ruleset::default()
            .handle_access(write)?
            .create()?
            .add_rules(path_beneath_rules(paths, write))?;
        Ok(Self {
            ruleset: created.into(),
        })
    }

    /// Whether Landlock is part of it.
    pub(crate) fn has_landlock(&self) -> bool {
        self.ruleset.is_some()
    }

    /// The ruleset descriptor for the child (valid until exec, where it is closed on exec).
    pub(crate) fn ruleset_fd(&self) -> Option<RawFd> {
        self.ruleset.as_ref().map(AsRawFd::as_raw_fd)
    }
}
