//! File operations beneath the base directory, all through [`Root`]'s capability handle: stat,
//! listings (legacy and `/v1`), opening for download, streamed atomic writes (temp file in the
//! target's directory, then rename), mkdir and delete. The blocking parts run on tokio's
//! blocking pool; bodies move in bounded chunks both ways, so memory does not grow with file
//! size.

use std::ffi::OsString;
use std::io;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use agent_sandbox_api::runtime::v1::{FileEntry, FileType};
use agent_sandbox_api::runtime::{EntryType, ListEntry};
use bytes::{Bytes, BytesMut};
use cap_std::fs::{Dir, MetadataExt as _, OpenOptions, OpenOptionsExt as _};
use tokio::io::AsyncWriteExt;

use crate::paths::{Beneath, Relative, Root};
use crate::processes::rfc3339;

/// Runs a blocking filesystem closure on the blocking pool.
pub(crate) async fn blocking<T, F>(f: F) -> io::Result<T>
where
    F: FnOnce() -> io::Result<T> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|join| Err(io::Error::other(join)))
}

/// Seconds since the epoch as Python's `st_mtime` computes them.
fn mtime_float(meta: &cap_std::fs::Metadata) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let secs = meta.mtime() as f64;
    #[allow(clippy::cast_precision_loss)]
    let nanos = meta.mtime_nsec() as f64;
    secs + nanos * 1e-9
}

fn mtime_system(meta: &cap_std::fs::Metadata) -> SystemTime {
    let secs = u64::try_from(meta.mtime()).unwrap_or(0);
    SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs)
}

/// Legacy `/list`: the entries of directory `rel`, with symlinks followed as Python's
/// `os.scandir` + `stat()` does (but a dangling or escaping link is described by itself
/// instead of failing the whole listing). Sorted by name.
pub(crate) fn list_legacy(root: &Root, rel: &Relative) -> io::Result<Vec<ListEntry>> {
    let dir = root.dir().open_dir(rel.as_path())?;
    let mut entries = Vec::new();
    for entry in dir.entries()? {
        let entry = entry?;
        let name = entry.file_name();
        let meta = match dir.metadata(&name) {
            Ok(meta) => meta,
            Err(_) => entry.metadata()?,
        };
        entries.push(ListEntry {
            name: name.to_string_lossy().into_owned(),
            size: meta.len(),
            entry_type: if meta.is_dir() {
                EntryType::Directory
            } else {
                EntryType::File
            },
            mod_time: mtime_float(&meta),
        });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

fn file_entry(name: String, meta: &cap_std::fs::Metadata) -> FileEntry {
    let file_type = meta.file_type();
    FileEntry {
        name,
        size: meta.len(),
        file_type: if file_type.is_symlink() {
            FileType::Symlink
        } else if file_type.is_dir() {
            FileType::Directory
        } else if file_type.is_file() {
            FileType::File
        } else {
            FileType::Other
        },
        modified_at: rfc3339(mtime_system(meta)),
        mode: format!("{:04o}", meta.mode() & 0o7777),
    }
}

/// `/v1` listing of directory `rel`: entries described without following symlinks, sorted by
/// name.
pub(crate) fn list_v1(root: &Root, rel: &Relative) -> io::Result<Vec<FileEntry>> {
    let dir = root.dir().open_dir(rel.as_path())?;
    let mut entries = Vec::new();
    for entry in dir.entries()? {
        let entry = entry?;
        let meta = entry.metadata()?;
        entries.push(file_entry(
            entry.file_name().to_string_lossy().into_owned(),
            &meta,
        ));
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

/// What a path is, following symlinks (beneath the base directory only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    File { size: u64 },
    Directory,
    Other,
}

pub(crate) fn kind(root: &Root, rel: &Relative) -> io::Result<Kind> {
    let meta = root.dir().metadata(rel.as_path())?;
    Ok(if meta.is_file() {
        Kind::File { size: meta.len() }
    } else if meta.is_dir() {
        Kind::Directory
    } else {
        Kind::Other
    })
}

/// Opens regular file `rel` for reading. Opening does not block on a FIFO (non-blocking open,
/// then the type is checked on the open descriptor); anything but a regular file is an
/// `EISDIR`/`EINVAL` error.
pub(crate) fn open_read(root: &Root, rel: &Relative) -> io::Result<(std::fs::File, u64)> {
    let mut options = OpenOptions::new();
    options.read(true).custom_flags(libc::O_NONBLOCK);
    let file = root.dir().open_with(rel.as_path(), &options)?.into_std();
    let meta = file.metadata()?;
    if meta.is_dir() {
        return Err(io::Error::from_raw_os_error(libc::EISDIR));
    }
    if !meta.is_file() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    Ok((file, meta.len()))
}

/// Creates directory `rel` with its missing parents. `Ok(true)` when it was created, `Ok(false)`
/// when it already was a directory.
pub(crate) fn mkdir(root: &Root, rel: &Beneath, mode: Option<u32>) -> io::Result<bool> {
    let rel = rel.as_path();
    match root.dir().metadata(rel) {
        Ok(meta) if meta.is_dir() => return Ok(false),
        Ok(_) => return Err(io::Error::from_raw_os_error(libc::EEXIST)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    root.dir().create_dir_all(rel)?;
    if let Some(mode) = mode {
        root.dir().set_permissions(
            rel,
            cap_std::fs::Permissions::from_std(std::fs::Permissions::from_mode(mode)),
        )?;
    }
    Ok(true)
}

/// Removes `rel` (never the base directory, which a [`Beneath`] cannot name): a file or symlink
/// (not its target), an empty directory, or with `recursive` a directory and its contents.
pub(crate) fn delete(root: &Root, rel: &Beneath, recursive: bool) -> io::Result<()> {
    let rel = rel.as_path();
    let meta = root.dir().symlink_metadata(rel)?;
    if meta.is_dir() {
        if recursive {
            root.dir().remove_dir_all(rel)
        } else {
            root.dir().remove_dir(rel)
        }
    } else {
        root.dir().remove_file(rel)
    }
}

/// Where a write failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WriteError {
    /// Preparing the target (parents, temp file, rename) failed.
    #[error("{0}")]
    Fs(#[source] io::Error),
    /// The body was larger than allowed.
    #[error("the body is larger than {limit} bytes")]
    TooLarge { limit: u64 },
    /// Reading the request body failed (client gone, malformed multipart).
    #[error("reading the request body failed: {0}")]
    Body(String),
}

/// A source of body chunks (a raw body or one multipart field).
pub(crate) trait Chunks: Send {
    fn next_chunk(&mut self) -> impl Future<Output = Result<Option<Bytes>, String>> + Send;
}

/// Removes the temp file unless the write completed (also when the request future is dropped).
struct TempGuard {
    dir: Arc<Dir>,
    name: OsString,
    armed: bool,
}

impl Drop for TempGuard {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.dir.remove_file(&self.name);
        }
    }
}

struct Prepared {
    dir: Arc<Dir>,
    name: OsString,
    temp: OsString,
    file: std::fs::File,
    mode: u32,
}

fn prepare(root: &Root, rel: &Beneath, mode: Option<u32>) -> Result<Prepared, WriteError> {
    let name = rel.file_name().to_os_string();
    let parent = rel.parent();
    if parent != Path::new(".") {
        match root.dir().create_dir_all(parent) {
            // Something that is not a directory (or a symlink that leads out or loops) is in
            // the way: opening it below reports the precise error.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            other => other.map_err(WriteError::Fs)?,
        }
    }
    let dir = root.dir().open_dir(parent).map_err(WriteError::Fs)?;
    let existing_mode = match dir.symlink_metadata(&name) {
        Ok(meta) if meta.is_dir() => {
            return Err(WriteError::Fs(io::Error::from_raw_os_error(libc::EISDIR)));
        }
        Ok(meta) if meta.is_file() => Some(meta.mode() & 0o7777),
        _ => None,
    };
    let mode = mode.or(existing_mode).unwrap_or(0o644);
    let mut attempt: u32 = 0;
    loop {
        let temp = OsString::from(format!(
            ".{}.upload-{}-{}",
            name.to_string_lossy().chars().take(64).collect::<String>(),
            std::process::id(),
            unique()
        ));
        let mut options = OpenOptions::new();
        options.write(true).create_new(true).mode(0o600);
        match dir.open_with(&temp, &options) {
            Ok(file) => {
                return Ok(Prepared {
                    dir: Arc::new(dir),
                    name,
                    temp,
                    file: file.into_std(),
                    mode,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 8 => attempt += 1,
            Err(e) => return Err(WriteError::Fs(e)),
        }
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::from(d.subsec_nanos()))
        .unwrap_or(0);
    (NEXT.fetch_add(1, Ordering::Relaxed) << 32) ^ nanos
}

/// Buffer for coalescing small body chunks into larger file writes.
const WRITE_BUFFER: usize = 256 << 10;

/// Writes `chunks` to `rel` atomically: parents created, a temp file beside the target filled
/// (at most `limit` bytes), permissions set (`mode`, else the replaced file's, else 0644), then
/// renamed over the target. A symlink at the target is replaced, not written through. Returns
/// the size.
pub(crate) async fn write_atomic<C: Chunks>(
    root: Arc<Root>,
    rel: Beneath,
    mode: Option<u32>,
    limit: u64,
    chunks: &mut C,
) -> Result<u64, WriteError> {
    let prepared = tokio::task::spawn_blocking(move || prepare(&root, &rel, mode))
        .await
        .map_err(|e| WriteError::Fs(io::Error::other(e)))??;
    let mut guard = TempGuard {
        dir: Arc::clone(&prepared.dir),
        name: prepared.temp.clone(),
        armed: true,
    };
    let mut file = tokio::fs::File::from_std(prepared.file);
    let mut buffer = BytesMut::new();
    let mut total: u64 = 0;
    while let Some(chunk) = chunks.next_chunk().await.map_err(WriteError::Body)? {
        total += chunk.len() as u64;
        if total > limit {
            return Err(WriteError::TooLarge { limit });
        }
        buffer.extend_from_slice(&chunk);
        if buffer.len() >= WRITE_BUFFER {
            file.write_all(&buffer).await.map_err(WriteError::Fs)?;
            buffer.clear();
        }
    }
    file.write_all(&buffer).await.map_err(WriteError::Fs)?;
    drop(buffer);
    file.flush().await.map_err(WriteError::Fs)?;
    file.set_permissions(std::fs::Permissions::from_mode(prepared.mode))
        .await
        .map_err(WriteError::Fs)?;
    drop(file);
    let dir = Arc::clone(&prepared.dir);
    let (temp, name) = (prepared.temp.clone(), prepared.name.clone());
    blocking(move || dir.rename(&temp, &dir, &name))
        .await
        .map_err(WriteError::Fs)?;
    guard.armed = false;
    Ok(total)
}

/// Parses an octal mode (`0644`, `755`, `01777`).
pub(crate) fn parse_mode(text: &str) -> Option<u32> {
    let digits = text.trim();
    if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b))
    {
        return None;
    }
    u32::from_str_radix(digits, 8).ok().filter(|m| *m <= 0o7777)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert_eq!(parse_mode("0644"), Some(0o644));
        assert_eq!(parse_mode("755"), Some(0o755));
        assert_eq!(parse_mode("01777"), Some(0o1777));
        assert_eq!(parse_mode("0888"), None);
        assert_eq!(parse_mode(""), None);
        assert_eq!(parse_mode("rwx"), None);
        assert_eq!(parse_mode("077777"), None);
    }

    mod confinement {
        //! End-to-end property: whatever path a client gives, and whichever operation it runs
        //! through [`Root`], nothing outside the base directory is read... written, created or
        //! removed, and the base directory itself survives.

        use std::collections::BTreeMap;
        use std::path::Path;

        use proptest::prelude::*;

        use super::super::*;
        use crate::paths::{Absolute, Beneath, PathError};

        /// A byte source for [`write_atomic`].
        struct Once(Option<Bytes>);

        impl Chunks for Once {
            async fn next_chunk(&mut self) -> Result<Option<Bytes>, String> {
                Ok(self.0.take())
            }
        }

        #[derive(Debug, Clone)]
        enum Op {
            Kind,
            ListLegacy,
            ListV1,
            Read,
            Mkdir,
            Write,
            Delete { recursive: bool },
            Cwd,
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                Just(Op::Kind),
                Just(Op::ListLegacy),
                Just(Op::ListV1),
                Just(Op::Read),
                Just(Op::Mkdir),
                Just(Op::Write),
                any::<bool>().prop_map(|recursive| Op::Delete { recursive }),
                Just(Op::Cwd),
            ]
        }

        /// Paths made of names that exist in the fixture (directories, files, symlinks in and
        /// out, loops), the dot forms and empty components; relative or absolute.
        fn client_path() -> impl Strategy<Value = String> {
            let component = prop::sample::select(vec![
                "a",
                "f.txt",
                "b",
                "..",
                ".",
                "",
                "in",
                "out",
                "abs",
                "file-out",
                "loop1",
                "dangling",
                "new",
                "outside",
                "secret.txt",
            ]);
            (any::<bool>(), prop::collection::vec(component, 0..6)).prop_map(|(leading, parts)| {
                let joined = parts.join("/");
                if leading {
                    format!("/{joined}")
                } else {
                    joined
                }
            })
        }

        /// Everything under `dir`, without following symlinks: kind, content or link target.
        fn snapshot(dir: &Path) -> BTreeMap<String, String> {
            let mut out = BTreeMap::new();
            let mut stack = vec![dir.to_path_buf()];
            while let Some(at) = stack.pop() {
                for entry in std::fs::read_dir(&at).unwrap() {
                    let path = entry.unwrap().path();
                    let key = path.strip_prefix(dir).unwrap().display().to_string();
                    let meta = std::fs::symlink_metadata(&path).unwrap();
                    let value = if meta.file_type().is_symlink() {
                        format!("link {}", std::fs::read_link(&path).unwrap().display())
                    } else if meta.is_dir() {
                        stack.push(path.clone());
                        format!("dir {:o}", meta.permissions().mode() & 0o7777)
                    } else {
                        format!(
                            "file {}",
                            String::from_utf8_lossy(&std::fs::read(&path).unwrap())
                        )
                    };
                    out.insert(key, value);
                }
            }
            out
        }

        /// `top/outside` (must stay as it is) and `top/base` with links in, out and looping.
        fn fixture(top: &Path) -> Root {
            let outside = top.join("outside");
            std::fs::create_dir_all(outside.join("sub")).unwrap();
            std::fs::write(outside.join("secret.txt"), "secret").unwrap();
            let base = top.join("base");
            std::fs::create_dir_all(base.join("a/b")).unwrap();
            std::fs::write(base.join("a/f.txt"), "f").unwrap();
            std::os::unix::fs::symlink("a", base.join("in")).unwrap();
            std::os::unix::fs::symlink("../outside", base.join("out")).unwrap();
            std::os::unix::fs::symlink(&outside, base.join("abs")).unwrap();
            std::os::unix::fs::symlink("../outside/secret.txt", base.join("file-out")).unwrap();
            std::os::unix::fs::symlink("loop2", base.join("loop1")).unwrap();
            std::os::unix::fs::symlink("loop1", base.join("loop2")).unwrap();
            std::os::unix::fs::symlink("nowhere", base.join("dangling")).unwrap();
            std::os::unix::fs::symlink("../../outside", base.join("a/up")).unwrap();
            Root::open(&base).unwrap()
        }

        fn run(
            runtime: &tokio::runtime::Runtime,
            root: &Arc<Root>,
            op: &Op,
            input: &str,
            absolute: Absolute,
        ) {
            let Ok(rel) = root.relative(input, absolute) else {
                return;
            };
            let mutating = matches!(op, Op::Mkdir | Op::Write | Op::Delete { .. });
            let beneath = Beneath::new(rel.clone());
            if mutating {
                assert_eq!(beneath.is_err(), rel.is_base(), "{input}");
                if let Err(error) = &beneath {
                    assert_eq!(*error, PathError::Base);
                }
            }
            match (op, beneath) {
                (Op::Kind, _) => drop(kind(root, &rel)),
                (Op::ListLegacy, _) => drop(list_legacy(root, &rel)),
                (Op::ListV1, _) => drop(list_v1(root, &rel)),
                (Op::Read, _) => {
                    if let Ok((mut file, _)) = open_read(root, &rel) {
                        let mut text = String::new();
                        let _ = std::io::Read::read_to_string(&mut file, &mut text);
                        assert_ne!(text, "secret", "{input} read a file outside");
                    }
                }
                (Op::Cwd, _) => {
                    if let Ok(dir) = root.directory(&rel) {
                        assert!(
                            dir.starts_with(root.canonical()),
                            "{input}: {}",
                            dir.display()
                        );
                    }
                }
                (_, Err(_)) => {}
                (Op::Mkdir, Ok(rel)) => drop(mkdir(root, &rel, Some(0o700))),
                (Op::Delete { recursive }, Ok(rel)) => {
                    // What the delete may remove: the entry its parent resolves to (the last
                    // component is not followed), and everything under it.
                    let target = root.dir().canonicalize(rel.parent()).ok().map(|parent| {
                        let parent = if parent == Path::new(".") {
                            Path::new("")
                        } else {
                            &parent
                        };
                        parent.join(rel.file_name()).display().to_string()
                    });
                    let before = snapshot(root.canonical());
                    let _ = delete(root, &rel, *recursive);
                    let after = snapshot(root.canonical());
                    for (key, value) in &before {
                        if after.get(key) == Some(value) {
                            continue;
                        }
                        let inside = target
                            .as_ref()
                            .is_some_and(|t| key == t || key.starts_with(&format!("{t}/")));
                        assert!(inside, "deleting {input} removed {key} (target {target:?})");
                    }
                }
                (Op::Write, Ok(rel)) => {
                    let mut body = Once(Some(Bytes::from_static(b"pwned")));
                    let _ =
                        runtime.block_on(write_atomic(Arc::clone(root), rel, None, 100, &mut body));
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

            #[test]
            fn no_operation_reaches_outside_the_base(
                ops in prop::collection::vec((op(), client_path(), any::<bool>()), 1..6)
            ) {
                static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
                let runtime = RUNTIME.get_or_init(|| tokio::runtime::Builder::new_current_thread().build().unwrap());
                let top = tempfile::tempdir().unwrap();
                let root = Arc::new(fixture(top.path()));
                let outside = snapshot(&top.path().join("outside"));
                for (op, input, strip) in &ops {
                    let absolute = if *strip { Absolute::StripLeadingSlash } else { Absolute::Refuse };
                    // Absolute paths through the base directory's own spelling too.
                    let spelled = format!("{}/{input}", root.canonical().display());
                    for path in [input.as_str(), spelled.as_str()] {
                        run(runtime, &root, op, path, absolute);
                        prop_assert_eq!(&snapshot(&top.path().join("outside")), &outside, "{:?} {}", op, path);
                        prop_assert!(root.canonical().is_dir(), "{:?} {} removed the base", op, path);
                        let beside: Vec<String> = std::fs::read_dir(top.path())
                            .unwrap()
                            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                            .collect();
                        prop_assert_eq!(beside.len(), 2, "{:?} {} wrote beside the base: {:?}", op, path, beside);
                    }
                }
            }
        }
    }
}
