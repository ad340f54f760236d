//! Path confinement: every client path (legacy and `/v1`, files and `cwd`) becomes a path
//! relative to the base directory here, and is then only ever opened through [`Root`], a
//! `cap_std::fs::Dir` on the base directory. cap-std resolves each component beneath that
//! directory (with `openat2(RESOLVE_BENEATH)` where the kernel has it), so `..`, symlinks that
//! point out (absolute or relative) and symlink loops cannot reach anything outside it, whatever
//! the path looks like. The lexical checks below only give clearer errors earlier.

use std::io;
use std::path::{Component, Path, PathBuf};

/// How an absolute client path that is not inside the base directory is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Absolute {
    /// Upstream's python runtime: leading `/` are stripped and the rest is taken relative to the
    /// base directory (`/etc/passwd` names `<base>/etc/passwd`). The legacy endpoints keep this.
    StripLeadingSlash,
    /// Refused with 403 (`/v1`).
    Refuse,
}

/// Why a client path was refused before touching the filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PathError {
    /// The path contains a NUL byte.
    #[error("the path contains a NUL byte")]
    Nul,
    /// The path leads outside the base directory.
    #[error("the path leads outside the base directory")]
    Escapes,
}

/// Turns a client path into a path relative to the base directory.
///
/// `bases` are the absolute spellings of the base directory (as configured and canonical): an
/// absolute path equal to or under one of them is taken relative to it, as upstream does. Other
/// absolute paths follow `absolute`. A path whose `..` components climb above the base
/// directory is refused. The empty path names the base directory itself (`.`).
pub(crate) fn relative(
    input: &str,
    bases: &[PathBuf],
    absolute: Absolute,
) -> Result<PathBuf, PathError> {
    if input.contains('\0') {
        return Err(PathError::Nul);
    }
    let mut rest = input;
    if input.starts_with('/') {
        let path = Path::new(input);
        let inside = bases.iter().find_map(|base| path.strip_prefix(base).ok());
        match (inside, absolute) {
            (Some(inside), _) => return checked(inside),
            (None, Absolute::Refuse) => return Err(PathError::Escapes),
            (None, Absolute::StripLeadingSlash) => rest = input.trim_start_matches('/'),
        }
    }
    checked(Path::new(rest))
}

/// Refuses a relative path whose `..` climb above its start; keeps it otherwise (symlinks are
/// resolved by cap-std, so `..` after a symlink keeps its physical meaning).
fn checked(path: &Path) -> Result<PathBuf, PathError> {
    let mut depth: usize = 0;
    for component in path.components() {
        match component {
            Component::ParentDir => {
                depth = depth.checked_sub(1).ok_or(PathError::Escapes)?;
            }
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return Err(PathError::Escapes),
        }
    }
    if path.as_os_str().is_empty() {
        Ok(PathBuf::from("."))
    } else {
        Ok(path.to_path_buf())
    }
}

/// What a filesystem error means to a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FsErrorKind {
    /// cap-std refused a path that leads outside the base directory (via `..` or a symlink).
    Escapes,
    /// Too many levels of symbolic links.
    Loop,
    /// No such file or directory.
    NotFound,
    /// A component that should be a directory is not one.
    NotADirectory,
    /// A directory is where a file was expected.
    IsADirectory,
    /// The directory to remove is not empty.
    NotEmpty,
    /// Something exists where a new entry was to be created.
    AlreadyExists,
    /// The OS refused access.
    PermissionDenied,
    /// Anything else.
    Other,
}

/// Classifies an error from a cap-std operation.
pub(crate) fn classify(error: &io::Error) -> FsErrorKind {
    let errno = error.raw_os_error();
    if errno == Some(libc::ELOOP) {
        return FsErrorKind::Loop;
    }
    if errno == Some(libc::ENOTDIR) {
        return FsErrorKind::NotADirectory;
    }
    if errno == Some(libc::EISDIR) {
        return FsErrorKind::IsADirectory;
    }
    if errno == Some(libc::ENOTEMPTY) {
        return FsErrorKind::NotEmpty;
    }
    if errno == Some(libc::EXDEV) {
        return FsErrorKind::Escapes;
    }
    match error.kind() {
        // cap-std's own escape error is a PermissionDenied without an errno.
        io::ErrorKind::PermissionDenied if errno.is_none() => FsErrorKind::Escapes,
        io::ErrorKind::PermissionDenied => FsErrorKind::PermissionDenied,
        io::ErrorKind::NotFound => FsErrorKind::NotFound,
        io::ErrorKind::AlreadyExists => FsErrorKind::AlreadyExists,
        _ => FsErrorKind::Other,
    }
}

/// The base directory, opened once; every file operation goes through it.
#[derive(Debug)]
pub(crate) struct Root {
    dir: cap_std::fs::Dir,
    /// Canonical absolute path of the base directory (commands' working directories).
    canonical: PathBuf,
    /// Spellings of the base directory accepted as absolute-path prefixes.
    spellings: Vec<PathBuf>,
}

impl Root {
    /// Opens `base` (which must exist and be a directory).
    pub(crate) fn open(base: &Path) -> io::Result<Self> {
        let canonical = std::fs::canonicalize(base)?;
        let dir = cap_std::fs::Dir::open_ambient_dir(&canonical, cap_std::ambient_authority())?;
        let mut spellings = vec![canonical.clone()];
        if base.is_absolute() && base != canonical {
            spellings.push(base.to_path_buf());
        }
        Ok(Self {
            dir,
            canonical,
            spellings,
        })
    }

    /// The capability handle on the base directory.
    pub(crate) fn dir(&self) -> &cap_std::fs::Dir {
        &self.dir
    }

    /// Canonical absolute path of the base directory.
    pub(crate) fn canonical(&self) -> &Path {
        &self.canonical
    }

    /// [`relative`] against this base directory.
    pub(crate) fn relative(&self, input: &str, absolute: Absolute) -> Result<PathBuf, PathError> {
        relative(input, &self.spellings, absolute)
    }

    /// Absolute path of the directory `rel` names, after checking beneath the base directory
    /// that it is one (symlinks resolved by cap-std). Used for commands' working directories;
    /// a command can `cd` anywhere afterwards, so this is about not being misled by a path,
    /// not a security boundary.
    pub(crate) fn directory(&self, rel: &Path) -> io::Result<PathBuf> {
        let resolved = self.dir.canonicalize(rel)?;
        if !self.dir.metadata(&resolved)?.is_dir() {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        Ok(self.canonical.join(resolved))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn bases() -> Vec<PathBuf> {
        vec![PathBuf::from("/srv/app"), PathBuf::from("/app")]
    }

    fn rel(input: &str, absolute: Absolute) -> Result<PathBuf, PathError> {
        relative(input, &bases(), absolute)
    }

    #[test]
    fn relative_paths_stay_relative() {
        for absolute in [Absolute::StripLeadingSlash, Absolute::Refuse] {
            assert_eq!(rel("a/b.txt", absolute), Ok(PathBuf::from("a/b.txt")));
            assert_eq!(rel("", absolute), Ok(PathBuf::from(".")));
            assert_eq!(rel("a/../b", absolute), Ok(PathBuf::from("a/../b")));
            assert_eq!(rel("./a", absolute), Ok(PathBuf::from("./a")));
        }
    }

    #[test]
    fn absolute_paths_inside_the_base_are_accepted() {
        for absolute in [Absolute::StripLeadingSlash, Absolute::Refuse] {
            assert_eq!(
                rel("/app/docs/x.txt", absolute),
                Ok(PathBuf::from("docs/x.txt"))
            );
            assert_eq!(rel("/srv/app", absolute), Ok(PathBuf::from(".")));
            assert_eq!(rel("/app/", absolute), Ok(PathBuf::from(".")));
        }
        // A sibling with the base as a string prefix is not inside it.
        assert_eq!(
            rel("/app-evil/x", Absolute::Refuse),
            Err(PathError::Escapes)
        );
    }

    #[test]
    fn other_absolute_paths_follow_the_mode() {
        assert_eq!(
            rel("///etc/passwd", Absolute::StripLeadingSlash),
            Ok(PathBuf::from("etc/passwd"))
        );
        assert_eq!(
            rel("/", Absolute::StripLeadingSlash),
            Ok(PathBuf::from("."))
        );
        assert_eq!(
            rel("/etc/passwd", Absolute::Refuse),
            Err(PathError::Escapes)
        );
        assert_eq!(rel("/", Absolute::Refuse), Err(PathError::Escapes));
    }

    #[test]
    fn traversal_and_nul_are_refused() {
        for absolute in [Absolute::StripLeadingSlash, Absolute::Refuse] {
            assert_eq!(rel("..", absolute), Err(PathError::Escapes));
            assert_eq!(rel("../../etc/passwd", absolute), Err(PathError::Escapes));
            assert_eq!(rel("foo/../../bar", absolute), Err(PathError::Escapes));
            assert_eq!(rel("/app/../etc", absolute), Err(PathError::Escapes));
            assert_eq!(rel("a\0b", absolute), Err(PathError::Nul));
        }
    }

    #[test]
    fn errors_are_classified() {
        let escape = io::Error::new(io::ErrorKind::PermissionDenied, "a path led outside");
        assert_eq!(classify(&escape), FsErrorKind::Escapes);
        assert_eq!(
            classify(&io::Error::from_raw_os_error(libc::EACCES)),
            FsErrorKind::PermissionDenied
        );
        assert_eq!(
            classify(&io::Error::from_raw_os_error(libc::ELOOP)),
            FsErrorKind::Loop
        );
        assert_eq!(
            classify(&io::Error::from_raw_os_error(libc::ENOENT)),
            FsErrorKind::NotFound
        );
        assert_eq!(
            classify(&io::Error::from_raw_os_error(libc::ENOTEMPTY)),
            FsErrorKind::NotEmpty
        );
    }
}
