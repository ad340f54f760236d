//! Path confinement: every client path (legacy and `/v1`, files and `cwd`) becomes a path
//! relative to the base directory here, and is then only ever opened through [`Root`], a
//! `cap_std::fs::Dir` on the base directory. cap-std resolves each component beneath that
//! directory (with `openat2(RESOLVE_BENEATH)` where the kernel has it), so `..`, symlinks that
//! point out (absolute or relative) and symlink loops cannot reach anything outside it, whatever
//! the path looks like. Before that, [`relative`] normalises the path lexically, so every
//! endpoint sees one form (no `.`, `..` or empty components) and clearer errors come earlier,
//! and [`Beneath`] keeps every mutating operation off the base directory itself.

use std::io;
use std::path::{Path, PathBuf};

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
    #[error("contains a NUL byte")]
    Nul,
    /// The path leads outside the base directory.
    #[error("leads outside the base directory")]
    Escapes,
    /// A name is longer than the kernel takes (`NAME_MAX`), or the whole path (`PATH_MAX`).
    #[error("is too long (at most {MAX_NAME_BYTES} bytes per name and {MAX_PATH_BYTES} in all)")]
    TooLong,
    /// A mutating operation named the base directory itself.
    #[error("names the base directory itself; give a path beneath it")]
    Base,
}

/// A client path after [`relative`]: relative to the base directory and lexically normalised,
/// so it has only normal components (no `.`, `..`, empty or root components), or is exactly
/// `.` for the base directory itself. Every file operation takes one of these (or a
/// [`Beneath`]), so every endpoint sees the normalised form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Relative(PathBuf);

impl Relative {
    /// The path to hand to cap-std.
    pub(crate) fn as_path(&self) -> &Path {
        &self.0
    }

    /// Whether this names the base directory itself.
    pub(crate) fn is_base(&self) -> bool {
        self.0.as_os_str() == "."
    }
}

/// A [`Relative`] path that names something strictly beneath the base directory, never the
/// base directory itself: what every mutating operation (write, mkdir, delete) takes, so none
/// can empty or replace the sandbox's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Beneath(Relative);

impl Beneath {
    /// Refuses the base directory itself.
    pub(crate) fn new(rel: Relative) -> Result<Self, PathError> {
        if rel.is_base() {
            Err(PathError::Base)
        } else {
            Ok(Self(rel))
        }
    }

    /// The path to hand to cap-std.
    pub(crate) fn as_path(&self) -> &Path {
        self.0.as_path()
    }

    /// The last component: the name of the entry in its parent.
    pub(crate) fn file_name(&self) -> &std::ffi::OsStr {
        // A normalised path beneath the base always ends with a normal component.
        self.0.0.file_name().unwrap_or(self.0.0.as_os_str())
    }

    /// The parent directory (`.` for an entry directly in the base directory).
    pub(crate) fn parent(&self) -> &Path {
        self.0
            .0
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
    }
}

/// Longest name in a path (Linux's `NAME_MAX`).
pub(crate) const MAX_NAME_BYTES: usize = 255;
/// Longest normalised path (Linux's `PATH_MAX` without the terminating NUL).
pub(crate) const MAX_PATH_BYTES: usize = 4095;

/// Turns a client path into a normalised path relative to the base directory.
///
/// `bases` are the normalised absolute spellings of the base directory without their leading
/// `/` (see [`base_spelling`]): an absolute path whose lexical normalisation is equal to or
/// under one of them is taken relative to it, as upstream does. Other absolute paths follow
/// `absolute`. A path whose `..` components climb above the base directory (or above `/`, for an
/// absolute path) is refused. The empty path names the base directory itself (`.`).
///
/// The normalisation is lexical (`a/../b` is `b`, also when `a` is a symlink): what a client
/// path names does not depend on what the sandbox's files are, and cap-std still resolves
/// every symlink that remains beneath the base directory.
pub(crate) fn relative(
    input: &str,
    bases: &[PathBuf],
    absolute: Absolute,
) -> Result<Relative, PathError> {
    if input.contains('\0') {
        return Err(PathError::Nul);
    }
    let Some(rest) = input.strip_prefix('/') else {
        return normalise(input).map(Relative);
    };
    let path = normalise(rest)?;
    if let Some(inside) = bases.iter().find_map(|base| path.strip_prefix(base).ok()) {
        return Ok(Relative(dot_if_empty(inside.to_path_buf())));
    }
    match absolute {
        Absolute::Refuse => Err(PathError::Escapes),
        Absolute::StripLeadingSlash => Ok(Relative(path)),
    }
}

/// The form of an absolute base directory spelling that [`relative`] compares with: normalised,
/// without the leading `/`. `None` for a relative or unnormalisable spelling.
pub(crate) fn base_spelling(base: &Path) -> Option<PathBuf> {
    let text = base.to_str()?;
    let rest = text.strip_prefix('/')?;
    let normal = normalise(rest).ok()?;
    Some(if normal.as_os_str() == "." {
        PathBuf::new()
    } else {
        normal
    })
}

/// Lexically normalises a relative path: empty and `.` components are dropped, `..` removes
/// the previous component; a `..` with nothing left to remove climbs above the start and is
/// refused. The result has only normal components, or is `.`; names and the whole are within
/// the kernel's limits, so an over-long path is refused here, before the filesystem.
fn normalise(path: &str) -> Result<PathBuf, PathError> {
    let mut kept: Vec<&str> = Vec::new();
    for component in path.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                kept.pop().ok_or(PathError::Escapes)?;
            }
            name if name.len() > MAX_NAME_BYTES => return Err(PathError::TooLong),
            name => kept.push(name),
        }
    }
    let len = kept.iter().map(|name| name.len() + 1).sum::<usize>();
    if len > MAX_PATH_BYTES + 1 {
        return Err(PathError::TooLong);
    }
    Ok(dot_if_empty(kept.iter().collect()))
}

fn dot_if_empty(path: PathBuf) -> PathBuf {
    if path.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        path
    }
}

/// What a filesystem error means to a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FsErrorKind {
    /// cap-std refused a path that leads outside the base directory (via `..` or a symlink).
    Escapes,
    /// Too many levels of symbolic links.
    Loop,
    /// A name or the path is too long for the kernel.
    NameTooLong,
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
    if errno == Some(libc::ENAMETOOLONG) {
        return FsErrorKind::NameTooLong;
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
    /// Spellings of the base directory accepted as absolute-path prefixes ([`base_spelling`]).
    spellings: Vec<PathBuf>,
}

impl Root {
    /// Opens `base` (which must exist and be a directory).
    pub(crate) fn open(base: &Path) -> io::Result<Self> {
        let canonical = std::fs::canonicalize(base)?;
        let dir = cap_std::fs::Dir::open_ambient_dir(&canonical, cap_std::ambient_authority())?;
        let mut spellings: Vec<PathBuf> = base_spelling(&canonical).into_iter().collect();
        if let Some(configured) = base_spelling(base)
            && !spellings.contains(&configured)
        {
            spellings.push(configured);
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
    pub(crate) fn relative(&self, input: &str, absolute: Absolute) -> Result<Relative, PathError> {
        relative(input, &self.spellings, absolute)
    }

    /// [`relative`], refusing the base directory itself: the target of a mutating operation.
    pub(crate) fn beneath(&self, input: &str, absolute: Absolute) -> Result<Beneath, PathError> {
        Beneath::new(self.relative(input, absolute)?)
    }

    /// Absolute path of the directory `rel` names, after checking beneath the base directory
    /// that it is one (symlinks resolved by cap-std). Used for commands' working directories;
    /// a command can `cd` anywhere afterwards, so this is about not being misled by a path,
    /// not a security boundary.
    pub(crate) fn directory(&self, rel: &Relative) -> io::Result<PathBuf> {
        let resolved = self.dir.canonicalize(rel.as_path())?;
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
    use proptest::prelude::*;

    fn bases() -> Vec<PathBuf> {
        ["/srv/app", "/app"]
            .iter()
            .filter_map(|b| base_spelling(Path::new(b)))
            .collect()
    }

    fn rel(input: &str, absolute: Absolute) -> Result<PathBuf, PathError> {
        relative(input, &bases(), absolute).map(|r| r.0)
    }

    #[test]
    fn relative_paths_are_normalised() {
        for absolute in [Absolute::StripLeadingSlash, Absolute::Refuse] {
            assert_eq!(rel("a/b.txt", absolute), Ok(PathBuf::from("a/b.txt")));
            assert_eq!(rel("", absolute), Ok(PathBuf::from(".")));
            assert_eq!(rel("a/../b", absolute), Ok(PathBuf::from("b")));
            assert_eq!(rel("./a", absolute), Ok(PathBuf::from("a")));
            assert_eq!(rel("a//b/./c/", absolute), Ok(PathBuf::from("a/b/c")));
            assert_eq!(rel("dir/..", absolute), Ok(PathBuf::from(".")));
            assert_eq!(rel("./dir/../.", absolute), Ok(PathBuf::from(".")));
            assert_eq!(rel("...", absolute), Ok(PathBuf::from("...")));
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
            assert_eq!(rel("/app/dir/..", absolute), Ok(PathBuf::from(".")));
            assert_eq!(rel("//app/./x/../y", absolute), Ok(PathBuf::from("y")));
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
        // Normalised first: `/app/../etc` is `/etc`, outside the base directory.
        assert_eq!(
            rel("/app/../etc", Absolute::StripLeadingSlash),
            Ok(PathBuf::from("etc"))
        );
        assert_eq!(
            rel("/etc/passwd", Absolute::Refuse),
            Err(PathError::Escapes)
        );
        assert_eq!(
            rel("/app/../etc", Absolute::Refuse),
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
            assert_eq!(rel("/../app/x", absolute), Err(PathError::Escapes));
            assert_eq!(rel("a\0b", absolute), Err(PathError::Nul));
        }
    }

    #[test]
    fn over_long_paths_are_refused() {
        let name = "n".repeat(MAX_NAME_BYTES);
        assert!(rel(&name, Absolute::Refuse).is_ok());
        assert_eq!(
            rel(&format!("{name}n"), Absolute::Refuse),
            Err(PathError::TooLong)
        );
        // 2048 names of one byte: 4095 bytes with the slashes.
        let longest = vec!["d"; 2048].join("/");
        assert_eq!(longest.len(), MAX_PATH_BYTES);
        assert!(rel(&longest, Absolute::Refuse).is_ok());
        assert_eq!(
            rel(&format!("{longest}/d"), Absolute::Refuse),
            Err(PathError::TooLong)
        );
        // What counts is the normalised path.
        assert!(rel(&format!("{longest}/d/.."), Absolute::Refuse).is_ok());
    }

    #[test]
    fn the_base_is_not_beneath_itself() {
        let base = relative("dir/..", &bases(), Absolute::Refuse).unwrap();
        assert!(base.is_base());
        assert_eq!(Beneath::new(base), Err(PathError::Base));
        let file =
            Beneath::new(relative("a/b/c.txt", &bases(), Absolute::Refuse).unwrap()).unwrap();
        assert_eq!(file.file_name(), "c.txt");
        assert_eq!(file.parent(), Path::new("a/b"));
        let top = Beneath::new(relative("c.txt", &bases(), Absolute::Refuse).unwrap()).unwrap();
        assert_eq!(top.parent(), Path::new("."));
    }

    #[test]
    fn base_spellings() {
        assert_eq!(base_spelling(Path::new("/")), Some(PathBuf::new()));
        assert_eq!(
            base_spelling(Path::new("/srv//x/./y/..")),
            Some(PathBuf::from("srv/x"))
        );
        assert_eq!(base_spelling(Path::new("rel")), None);
        // With `/` as the base directory every absolute path is inside it.
        let root = vec![PathBuf::new()];
        assert_eq!(
            relative("/etc/passwd", &root, Absolute::Refuse).map(|r| r.0),
            Ok(PathBuf::from("etc/passwd"))
        );
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
        assert_eq!(
            classify(&io::Error::from_raw_os_error(libc::ENAMETOOLONG)),
            FsErrorKind::NameTooLong
        );
    }

    /// Components client paths are made of: names, the dot forms, empty components (from `//`)
    /// and names that look like the base directory's spellings.
    fn component() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "a", "b", "..", ".", "", "...", "app", "srv", "link", "a b", "é",
        ])
    }

    /// A client path: up to 8 components joined with `/`, optionally absolute, optionally
    /// ending with `/`.
    fn client_path() -> impl Strategy<Value = String> {
        (
            any::<bool>(),
            prop::collection::vec(component(), 0..8),
            any::<bool>(),
        )
            .prop_map(|(leading, parts, trailing)| {
                let mut path = String::new();
                if leading {
                    path.push('/');
                }
                path.push_str(&parts.join("/"));
                if trailing {
                    path.push('/');
                }
                path
            })
    }

    /// The depth a path reaches below its start after each component; `None` once a `..`
    /// climbs above the start. An oracle written differently from [`normalise`].
    fn climbs_above_start(path: &str) -> bool {
        let mut depth: i64 = 0;
        for part in path.split('/') {
            match part {
                "" | "." => {}
                ".." => depth -= 1,
                _ => depth += 1,
            }
            if depth < 0 {
                return true;
            }
        }
        false
    }

    /// Where `path` leads from `start` when every component is taken literally (the logical
    /// meaning the normalised form must keep).
    fn logical(start: &[String], path: &str) -> Vec<String> {
        let mut at = start.to_vec();
        for part in path.split('/') {
            match part {
                "" | "." => {}
                ".." => {
                    at.pop();
                }
                name => at.push(name.to_owned()),
            }
        }
        at
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

        /// `relative` yields only normal components (or `.`), refuses exactly the paths that
        /// climb above the base directory (above `/`, or outside every base spelling for `/v1`),
        /// keeps the logical meaning of the path, and is idempotent.
        #[test]
        fn relative_normalises_and_confines(input in client_path()) {
            let bases = bases();
            let base_parts = |b: &PathBuf| -> Vec<String> {
                b.iter().map(|c| c.to_string_lossy().into_owned()).collect()
            };
            for absolute in [Absolute::StripLeadingSlash, Absolute::Refuse] {
                let result = relative(&input, &bases, absolute);
                let is_absolute = input.starts_with('/');
                let body = input.trim_start_matches('/');
                if climbs_above_start(body) {
                    prop_assert_eq!(&result, &Err(PathError::Escapes), "{}", input);
                    continue;
                }
                // The absolute path's logical target, and whether it is in a base spelling.
                let target = logical(&[], body);
                let in_base = bases.iter().map(base_parts).find(|b| target.starts_with(b));
                let expected: Result<Vec<String>, PathError> = match (is_absolute, in_base, absolute) {
                    (false, _, _) => Ok(target.clone()),
                    (true, Some(b), _) => Ok(target[b.len()..].to_vec()),
                    (true, None, Absolute::StripLeadingSlash) => Ok(target.clone()),
                    (true, None, Absolute::Refuse) => Err(PathError::Escapes),
                };
                match (&result, &expected) {
                    (Ok(rel), Ok(parts)) => {
                        let got: Vec<String> = rel
                            .as_path()
                            .components()
                            .map(|c| match c {
                                std::path::Component::Normal(name) => {
                                    name.to_string_lossy().into_owned()
                                }
                                other => format!("<{other:?}>"),
                            })
                            .filter(|c| c != "<CurDir>" || !rel.is_base())
                            .collect();
                        prop_assert_eq!(&got, parts, "{}", input);
                        prop_assert_eq!(rel.is_base(), parts.is_empty(), "{}", input);
                        for name in &got {
                            prop_assert!(name != ".." && name != "." && !name.is_empty() && !name.starts_with('<'));
                        }
                        // Idempotent: the normalised form is its own normal form.
                        let again = relative(&rel.as_path().to_string_lossy(), &bases, absolute);
                        prop_assert_eq!(again.as_ref(), Ok(rel), "{}", input);
                        // Only a path beneath the base can be the target of a change.
                        prop_assert_eq!(Beneath::new(rel.clone()).is_ok(), !parts.is_empty());
                    }
                    (Err(got), Err(want)) => prop_assert_eq!(got, want, "{}", input),
                    _ => prop_assert!(false, "{input}: got {result:?}, expected {expected:?}"),
                }
            }
        }
    }
}
