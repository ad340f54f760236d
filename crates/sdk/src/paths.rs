//! Paths and names at the client's edge of a sandbox, which the SDK treats as untrusted.
//!
//! Outgoing: every path the SDK puts in a URL is first normalised lexically here
//! ([`normalize`]), so no `.` or `..` segment ever reaches the wire, where a proxy's URL
//! normalisation could resolve it differently (`/v1/files/..` is `/v1/` to a normaliser); a path
//! that climbs out of the base directory is refused, and so is a mutating operation on the base
//! directory itself ([`mutable`]). The runtime refuses both too; clients do not depend on it.
//!
//! Incoming: every name a sandbox sends back (directory listings) must be one normal path
//! component ([`entry_name`]) before the SDK uses it, or joins it to a local path.

use crate::error::{Error, Result};

/// The lexical normal form the SDK sends for the sandbox path `path` (see the module docs):
/// `.` and empty segments dropped, `..` applied, relative paths relative to the base
/// directory (`""` is the base directory itself), absolute paths kept absolute.
/// [`Error::InvalidPath`] naming `operation` for a path that climbs out of the base directory
/// or holds a NUL byte.
pub fn normalize_path(operation: &'static str, path: &str) -> Result<String> {
    normalize(path).map_err(|reason| invalid(operation, path, reason))
}

/// [`normalize_path`] for the target of a mutating operation (write, upload, mkdir, remove):
/// also refuses a path that resolves to the base directory itself, or to `/`.
pub fn normalize_mutable_path(operation: &'static str, path: &str) -> Result<String> {
    mutable(path).map_err(|reason| invalid(operation, path, reason))
}

fn invalid(operation: &'static str, path: &str, reason: &'static str) -> Error {
    Error::InvalidPath {
        operation,
        path: path.to_owned(),
        reason,
    }
}

/// Why a path was refused.
const ESCAPES: &str = "it leads outside the sandbox's base directory";
const NUL: &str = "it contains a NUL byte";
const BASE: &str = "it resolves to the sandbox's base directory; name a path inside it";
const ROOT: &str =
    "it resolves to / (the base directory, or outside it); name a path inside the base directory";

/// The lexical normal form of a sandbox path: `.` segments, empty segments and trailing `/`
/// dropped, each `..` applied to the segment before it. Relative paths stay relative (`""` is
/// the base directory); absolute paths keep their leading `/` (the runtime maps those under its
/// base directory and refuses the rest). Refused: NUL bytes, and `..` above the start.
pub(crate) fn normalize(path: &str) -> Result<String, &'static str> {
    if path.contains('\0') {
        return Err(NUL);
    }
    let absolute = path.starts_with('/');
    let mut segments: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop().ok_or(ESCAPES)?;
            }
            name => segments.push(name),
        }
    }
    let joined = segments.join("/");
    Ok(if absolute {
        format!("/{joined}")
    } else {
        joined
    })
}

/// [`normalize`], also refusing the base directory itself (and `/`): the target of a mutating
/// operation (write, upload, mkdir, remove).
pub(crate) fn mutable(path: &str) -> Result<String, &'static str> {
    let normal = normalize(path)?;
    match normal.as_str() {
        "" => Err(BASE),
        "/" => Err(ROOT),
        _ => Ok(normal),
    }
}

/// Checks a name that came from a sandbox: one normal path component (not empty, not `.` or
/// `..`, no `/`, no NUL), so that joining it to a local directory stays in that directory.
pub(crate) fn entry_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        Err("it is empty")
    } else if name == "." || name == ".." {
        Err("it names a directory itself, not an entry in it")
    } else if name.contains('/') {
        Err("it contains '/'")
    } else if name.contains('\0') {
        Err(NUL)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    #[test]
    fn dot_segments_are_resolved_lexically() {
        for (given, normal) in [
            ("", ""),
            (".", ""),
            ("./", ""),
            ("a/b.txt", "a/b.txt"),
            ("./a//b/", "a/b"),
            ("work/..", ""),
            ("work/../data/./x", "data/x"),
            ("a/b/../../c", "c"),
            ("...", "..."),
            ("a/.../b", "a/.../b"),
            ("/", "/"),
            ("/app/x/../y", "/app/y"),
            ("//app//", "/app"),
        ] {
            assert_eq!(normalize(given), Ok(normal.to_owned()), "{given:?}");
        }
        for escaping in ["..", "../x", "a/../..", "a/../../b", "/..", "/a/../.."] {
            assert_eq!(normalize(escaping), Err(ESCAPES), "{escaping:?}");
        }
        assert_eq!(normalize("a\0b"), Err(NUL));
    }

    #[test]
    fn the_base_directory_is_not_a_mutable_path() {
        for base in ["", ".", "./", "work/..", "a/./b/../../", "//"] {
            assert!(mutable(base).is_err(), "{base:?}");
        }
        assert_eq!(mutable("work/../data"), Ok("data".to_owned()));
        assert_eq!(mutable("/app/x"), Ok("/app/x".to_owned()));
    }

    #[test]
    fn entry_names_are_one_normal_component() {
        for good in ["a", "a.txt", "...", ".hidden", "with space", "ü", "a\\b"] {
            assert_eq!(entry_name(good), Ok(()), "{good:?}");
        }
        for bad in ["", ".", "..", "../evil", "/abs", "a/b", "a/", "nul\0"] {
            assert!(entry_name(bad).is_err(), "{bad:?}");
        }
    }

    /// Segments that exercise normalisation: dots, empties, names.
    fn segment() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(String::new()),
            Just(".".to_owned()),
            Just("..".to_owned()),
            Just("...".to_owned()),
            "[a-z%.]{1,4}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// A normalised path has no dot or empty segment (nothing a URL normaliser could
        /// resolve), normalising it again changes nothing, and it is refused exactly when the
        /// `..` segments climb above the start.
        #[test]
        fn normal_forms_have_no_dot_segments(absolute: bool, segments in prop::collection::vec(segment(), 0..8)) {
            let path = format!("{}{}", if absolute { "/" } else { "" }, segments.join("/"));
            let mut depth: i64 = 0;
            let mut climbs = false;
            for s in &segments {
                match s.as_str() {
                    "" | "." => {}
                    ".." => { depth -= 1; climbs |= depth < 0; }
                    _ => depth += 1,
                }
            }
            match normalize(&path) {
                Err(reason) => prop_assert!(climbs && reason == ESCAPES, "{path:?}"),
                Ok(normal) => {
                    prop_assert!(!climbs, "{path:?}");
                    let body = normal.strip_prefix('/').unwrap_or(&normal);
                    // An empty first segment makes a relative spelling absolute too.
                    prop_assert_eq!(normal.starts_with('/'), path.starts_with('/'));
                    if !body.is_empty() {
                        for part in body.split('/') {
                            prop_assert!(part != "." && part != ".." && !part.is_empty(), "{normal:?}");
                        }
                    }
                    prop_assert_eq!(normalize(&normal), Ok(normal.clone()));
                    prop_assert_eq!(mutable(&path).is_err(), body.is_empty());
                }
            }
        }
    }
}
