//! The volumes a container mounts (sans IO apart from [`write_files`]): which ConfigMaps,
//! Secrets and ServiceAccount tokens they need, and the files of `configMap`, `secret`,
//! `downwardAPI` and `projected` volumes (the last is what the API server's ServiceAccount
//! admission adds to every pod: a bound token, the cluster's CA from `kube-root-ca.crt`, and
//! the namespace).
//!
//! As on a node: `items` choose and rename keys, `defaultMode` and per-item `mode` set the
//! files' permissions, a missing object fails the mount unless the volume or source is
//! `optional`, and these volumes are always mounted read-only.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use serde_json::Value;

/// The data of the ConfigMaps and Secrets a container references, by `(resource, name)`
/// (`configmaps` or `secrets`); a missing object is absent. Secret values are decoded; those
/// that are not UTF-8 are left out, as no environment variable or file can carry them here.
pub(crate) type Refs = HashMap<(&'static str, String), BTreeMap<String, String>>;

/// A ServiceAccount token a projected volume needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TokenNeed {
    /// `volume/path`, the key of [`Tokens`].
    pub(crate) key: String,
    pub(crate) audience: Option<String>,
    pub(crate) expiration_seconds: i64,
}

/// Tokens by [`TokenNeed::key`].
pub(crate) type Tokens = HashMap<String, String>;

/// One file of a volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct File {
    /// Relative path inside the volume (checked: no `..`, not absolute).
    pub(crate) path: String,
    pub(crate) data: Vec<u8>,
    pub(crate) mode: u32,
}

/// The default of `defaultMode` (0644), as the API server defaults it.
const DEFAULT_MODE: u32 = 0o644;
/// A projected token's lifetime when the source gives none (the API's default).
const DEFAULT_TOKEN_SECONDS: i64 = 3600;

/// The volumes of `pod` that `container` mounts.
pub(crate) fn mounted<'a>(pod: &'a Value, container: &Value) -> Vec<&'a Value> {
    let names: Vec<&str> = container
        .get("volumeMounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| m.get("name").and_then(Value::as_str))
        .collect();
    pod.pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| {
            v.get("name")
                .and_then(Value::as_str)
                .is_some_and(|n| names.contains(&n))
        })
        .collect()
}

/// The ConfigMaps and Secrets (`(resource, name)`) and the tokens that `volumes` need.
pub(crate) fn needs(volumes: &[&Value]) -> (Vec<(&'static str, String)>, Vec<TokenNeed>) {
    let mut objects = Vec::new();
    let mut tokens = Vec::new();
    let mut object = |resource: &'static str, name: Option<&str>| {
        if let Some(name) = name.filter(|n| !n.is_empty())
            && !objects.iter().any(|(r, n)| *r == resource && n == name)
        {
            objects.push((resource, name.to_owned()));
        }
    };
    for volume in volumes {
        let volume_name = volume
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        object(
            "configmaps",
            volume.pointer("/configMap/name").and_then(Value::as_str),
        );
        object(
            "secrets",
            volume.pointer("/secret/secretName").and_then(Value::as_str),
        );
        for source in sources(volume) {
            object(
                "configmaps",
                source.pointer("/configMap/name").and_then(Value::as_str),
            );
            object(
                "secrets",
                source.pointer("/secret/name").and_then(Value::as_str),
            );
            if let Some(token) = source.get("serviceAccountToken") {
                let path = token
                    .get("path")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                tokens.push(TokenNeed {
                    key: format!("{volume_name}/{path}"),
                    audience: token
                        .get("audience")
                        .and_then(Value::as_str)
                        .filter(|a| !a.is_empty())
                        .map(str::to_owned),
                    expiration_seconds: token
                        .get("expirationSeconds")
                        .and_then(Value::as_i64)
                        .unwrap_or(DEFAULT_TOKEN_SECONDS),
                });
            }
        }
    }
    (objects, tokens)
}

fn sources(volume: &Value) -> impl Iterator<Item = &Value> {
    volume
        .pointer("/projected/sources")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

/// Whether the kubelet writes this volume's files itself (and mounts it read-only).
pub(crate) fn is_projection(volume: &Value) -> bool {
    ["configMap", "secret", "downwardAPI", "projected"]
        .iter()
        .any(|kind| volume.get(*kind).is_some())
}

fn mode(value: Option<&Value>, default: u32) -> u32 {
    value
        .and_then(Value::as_u64)
        .and_then(|m| u32::try_from(m).ok())
        .map_or(default, |m| m & 0o777)
}

/// The files of an object's keys: all of them, or the `items` chosen (a missing key is an
/// error unless `optional`).
fn object_files(
    what: &str,
    data: Option<&BTreeMap<String, String>>,
    items: Option<&Value>,
    optional: bool,
    default_mode: u32,
    files: &mut Vec<File>,
) -> Result<(), String> {
    let Some(data) = data else {
        return if optional {
            Ok(())
        } else {
            Err(format!("{what} not found"))
        };
    };
    match items.and_then(Value::as_array) {
        Some(items) => {
            for item in items {
                let key = item.get("key").and_then(Value::as_str).unwrap_or_default();
                let path = item.get("path").and_then(Value::as_str).unwrap_or(key);
                let Some(value) = data.get(key) else {
                    if optional {
                        continue;
                    }
                    return Err(format!("{what} has no key {key:?}"));
                };
                files.push(File {
                    path: path.to_owned(),
                    data: value.clone().into_bytes(),
                    mode: mode(item.get("mode"), default_mode),
                });
            }
        }
        None => files.extend(data.iter().map(|(key, value)| File {
            path: key.clone(),
            data: value.clone().into_bytes(),
            mode: default_mode,
        })),
    }
    Ok(())
}

/// The files of `downwardAPI` items (`fieldRef` only; `resourceFieldRef` is not supported).
fn downward_files(
    items: Option<&Value>,
    default_mode: u32,
    field: &dyn Fn(&str) -> Option<String>,
    files: &mut Vec<File>,
) -> Result<(), String> {
    for item in items.and_then(Value::as_array).into_iter().flatten() {
        let path = item.get("path").and_then(Value::as_str).unwrap_or_default();
        let Some(field_path) = item.pointer("/fieldRef/fieldPath").and_then(Value::as_str) else {
            return Err(format!(
                "downwardAPI item {path:?}: only fieldRef is supported by this kubelet"
            ));
        };
        let value = field(field_path)
            .ok_or_else(|| format!("downwardAPI item {path:?}: unknown field {field_path:?}"))?;
        files.push(File {
            path: path.to_owned(),
            data: value.into_bytes(),
            mode: mode(item.get("mode"), default_mode),
        });
    }
    Ok(())
}

fn optional(value: &Value) -> bool {
    value.get("optional").and_then(Value::as_bool) == Some(true)
}

/// The files of a projection volume ([`is_projection`]); `field` answers downward-API paths.
pub(crate) fn files(
    volume: &Value,
    refs: &Refs,
    tokens: &Tokens,
    field: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<File>, String> {
    let volume_name = volume
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    // A ConfigMap or Secret, as a volume (`name_key`: `name` or `secretName`; its own
    // `defaultMode`) or as a projected source (the projection's mode).
    let object = |kind: &str, source: &Value, name_key: &str, default_mode: Option<u32>| {
        let (resource, what) = if kind == "configMap" {
            ("configmaps", "configmap")
        } else {
            ("secrets", "secret")
        };
        let name = source
            .get(name_key)
            .and_then(Value::as_str)
            .unwrap_or_default();
        let mut files = Vec::new();
        object_files(
            &format!("{what} {name:?}"),
            refs.get(&(resource, name.to_owned())),
            source.get("items"),
            optional(source),
            default_mode.unwrap_or_else(|| mode(source.get("defaultMode"), DEFAULT_MODE)),
            &mut files,
        )
        .map(|()| files)
    };
    let mut files = Vec::new();
    if let Some(map) = volume.get("configMap") {
        files = object("configMap", map, "name", None)?;
    } else if let Some(secret) = volume.get("secret") {
        files = object("secret", secret, "secretName", None)?;
    } else if let Some(downward) = volume.get("downwardAPI") {
        downward_files(
            downward.get("items"),
            mode(downward.get("defaultMode"), DEFAULT_MODE),
            field,
            &mut files,
        )?;
    } else if let Some(projected) = volume.get("projected") {
        let default_mode = mode(projected.get("defaultMode"), DEFAULT_MODE);
        for source in sources(volume) {
            if let Some(map) = source.get("configMap") {
                files.extend(object("configMap", map, "name", Some(default_mode))?);
            } else if let Some(secret) = source.get("secret") {
                files.extend(object("secret", secret, "name", Some(default_mode))?);
            } else if let Some(downward) = source.get("downwardAPI") {
                downward_files(downward.get("items"), default_mode, field, &mut files)?;
            } else if let Some(token) = source.get("serviceAccountToken") {
                let path = token
                    .get("path")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let value = tokens
                    .get(&format!("{volume_name}/{path}"))
                    .ok_or_else(|| format!("no ServiceAccount token for {path:?}"))?;
                files.push(File {
                    path: path.to_owned(),
                    data: value.clone().into_bytes(),
                    mode: default_mode,
                });
            } else {
                return Err(format!(
                    "volume {volume_name:?}: a projected source this kubelet does not support \
                     (configMap, secret, downwardAPI and serviceAccountToken are)"
                ));
            }
        }
    }
    for file in &files {
        let path = Path::new(&file.path);
        let plain =
            !file.path.is_empty() && path.components().all(|c| matches!(c, Component::Normal(_)));
        if !plain {
            return Err(format!(
                "volume {volume_name:?}: item path {:?} must be relative without '..'",
                file.path
            ));
        }
    }
    Ok(files)
}

/// Whether `name` can stand for one directory level: not empty, `.` or `..`, without `/` or
/// NUL (what a name from the API must be before it is joined to a host path).
fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

/// Refuses a pod whose names would become host paths outside the kubelet's directories: its
/// namespace and name (the pod's directory), each volume's name (its directory) and each
/// `persistentVolumeClaim.claimName` (the claim's directory). A real API server accepts a
/// claim name such as `../../root`; this kubelet turns none into a path. The error names the
/// field.
pub(crate) fn validate_names(pod: &Value) -> Result<(), String> {
    let text = |pointer: &str| {
        pod.pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    let refuse = |field: String, value: &str| {
        Err(format!(
            "{field}: {value:?} cannot name a directory (it must not be empty, \".\" or \"..\", \
             nor contain \"/\"); this node refuses the pod"
        ))
    };
    for (field, pointer) in [
        ("metadata.namespace", "/metadata/namespace"),
        ("metadata.name", "/metadata/name"),
    ] {
        if !is_plain_name(text(pointer)) {
            return refuse(field.to_owned(), text(pointer));
        }
    }
    let volumes = pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for (index, volume) in volumes.iter().enumerate() {
        let name = volume
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !is_plain_name(name) {
            return refuse(format!("spec.volumes[{index}].name"), name);
        }
        if let Some(claim) = volume.pointer("/persistentVolumeClaim/claimName") {
            let claim = claim.as_str().unwrap_or_default();
            if !is_plain_name(claim) {
                return refuse(
                    format!("spec.volumes[{index}].persistentVolumeClaim.claimName"),
                    claim,
                );
            }
        }
    }
    Ok(())
}

/// Opens (making it, mode 0755, when missing) directory `name` of the directory `parent`,
/// without following a symbolic link; whether it was made.
fn open_or_make_dir(parent: &OwnedFd, name: &str) -> std::io::Result<(OwnedFd, bool)> {
    use rustix::fs::{Mode, OFlags};
    let made = match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o755)) {
        Ok(()) => true,
        Err(rustix::io::Errno::EXIST) => false,
        Err(error) => return Err(error.into()),
    };
    let fd = rustix::fs::openat(
        parent,
        name,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok((fd, made))
}

/// Opens directory `path` (absolute, the kubelet's own) without following a symbolic link in
/// its last component.
fn open_dir(path: &Path) -> std::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    Ok(rustix::fs::open(
        path,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// The directory of claim `claim` in `namespace` below `base` (`base/namespace/claim`), made
/// level by level through directory handles, never following a symbolic link. With `group`
/// (a root kubelet's group of the namespace, which every pod of it has), the claim's
/// directory belongs to that group, mode 2770 (new files and directories inherit the group),
/// as a node applies a pod's `fsGroup`: set on the directory itself, never recursively.
pub(crate) fn claim_dir(
    base: &Path,
    namespace: &str,
    claim: &str,
    group: Option<u32>,
) -> std::io::Result<PathBuf> {
    if !is_plain_name(namespace) || !is_plain_name(claim) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{namespace:?}/{claim:?} is not a claim's directory"),
        ));
    }
    let base_fd = open_dir(base)?;
    let (namespace_fd, _) = open_or_make_dir(&base_fd, namespace)?;
    let (claim_fd, made) = open_or_make_dir(&namespace_fd, claim)?;
    if let Some(group) = group {
        use std::os::unix::fs::MetadataExt as _;
        let metadata = std::fs::File::from(rustix::io::dup(&claim_fd)?).metadata()?;
        if made || metadata.gid() != group || metadata.mode() & 0o7777 != 0o2770 {
            rustix::fs::fchown(&claim_fd, None, Some(rustix::fs::Gid::from_raw(group)))?;
            rustix::fs::fchmod(&claim_fd, rustix::fs::Mode::from_raw_mode(0o2770))?;
        }
    }
    Ok(base.join(namespace).join(claim))
}

/// Writes `files` into `dir` (the kubelet's own), which is emptied first (a volume shows its
/// current data only): each file made afresh through directory handles, never following a
/// symbolic link, and given to `owner` (a root kubelet's pod uid, so that the pod reads files
/// of mode 0400) before its data is written.
pub(crate) fn write_files(dir: &Path, files: &[File], owner: Option<u32>) -> std::io::Result<()> {
    use rustix::fs::{Mode, OFlags};
    use std::io::Write as _;
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    std::fs::create_dir_all(dir)?;
    let top = open_dir(dir)?;
    for file in files {
        let mut parts: Vec<&str> = file.path.split('/').filter(|p| !p.is_empty()).collect();
        let Some(name) = parts.pop() else {
            continue;
        };
        let mut parent = rustix::io::dup(&top)?;
        for part in parts {
            parent = open_or_make_dir(&parent, part)?.0;
        }
        let fd = rustix::fs::openat(
            &parent,
            name,
            OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        if let Some(owner) = owner {
            rustix::fs::fchown(
                &fd,
                Some(rustix::fs::Uid::from_raw(owner)),
                Some(rustix::fs::Gid::from_raw(owner)),
            )?;
        }
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(file.mode))?;
        std::fs::File::from(fd).write_all(&file.data)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The volume the API server's ServiceAccount admission adds.
    fn kube_api_access() -> Value {
        json!({"name": "kube-api-access-x1y2z", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace",
                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
        ]}})
    }

    #[test]
    fn the_service_account_volume_needs_its_ca_and_a_bound_token() {
        let volume = kube_api_access();
        let (objects, tokens) = needs(&[&volume]);
        assert_eq!(objects, [("configmaps", "kube-root-ca.crt".to_owned())]);
        assert_eq!(
            tokens,
            [TokenNeed {
                key: "kube-api-access-x1y2z/token".into(),
                audience: None,
                expiration_seconds: 3607,
            }]
        );
        let mut refs = Refs::new();
        refs.insert(
            ("configmaps", "kube-root-ca.crt".into()),
            BTreeMap::from([("ca.crt".to_owned(), "PEM".to_owned())]),
        );
        let tokens = Tokens::from([("kube-api-access-x1y2z/token".to_owned(), "jwt".to_owned())]);
        let field = |path: &str| (path == "metadata.namespace").then(|| "team-a".to_owned());
        let files = files(&volume, &refs, &tokens, &field).unwrap();
        let got: Vec<(&str, &[u8], u32)> = files
            .iter()
            .map(|f| (f.path.as_str(), f.data.as_slice(), f.mode))
            .collect();
        assert_eq!(
            got,
            [
                ("token", b"jwt".as_slice(), 0o644),
                ("ca.crt", b"PEM".as_slice(), 0o644),
                ("namespace", b"team-a".as_slice(), 0o644)
            ]
        );
        // Before kube-controller-manager publishes kube-root-ca.crt, the mount fails.
        let error = super::files(&volume, &Refs::new(), &tokens, &field).unwrap_err();
        assert!(error.contains("kube-root-ca.crt"), "{error}");
    }

    #[test]
    fn secret_volumes_honour_items_modes_and_optional() {
        let mut refs = Refs::new();
        refs.insert(
            ("secrets", "key".into()),
            BTreeMap::from([
                ("key".to_owned(), "s3cret".to_owned()),
                ("other".to_owned(), "x".to_owned()),
            ]),
        );
        let field = |_: &str| None;
        let all = json!({"name": "k", "secret": {"secretName": "key", "defaultMode": 256}});
        let files = files(&all, &refs, &Tokens::new(), &field).unwrap();
        assert_eq!(files.len(), 2);
        assert!(files.iter().all(|f| f.mode == 0o400));
        let picked = json!({"name": "k", "secret": {"secretName": "key",
            "items": [{"key": "key", "path": "dir/renamed", "mode": 384}]}});
        let files = super::files(&picked, &refs, &Tokens::new(), &field).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(
            (files[0].path.as_str(), files[0].mode),
            ("dir/renamed", 0o600)
        );
        let missing = json!({"name": "k", "secret": {"secretName": "nope"}});
        assert!(super::files(&missing, &refs, &Tokens::new(), &field).is_err());
        let optional = json!({"name": "k", "secret": {"secretName": "nope", "optional": true}});
        assert!(
            super::files(&optional, &refs, &Tokens::new(), &field)
                .unwrap()
                .is_empty()
        );
        let escape = json!({"name": "k", "secret": {"secretName": "key",
            "items": [{"key": "key", "path": "../../etc/passwd"}]}});
        assert!(super::files(&escape, &refs, &Tokens::new(), &field).is_err());
    }

    #[test]
    fn only_mounted_volumes_count() {
        let pod = json!({"spec": {"volumes": [
            {"name": "a", "emptyDir": {}}, {"name": "b", "secret": {"secretName": "s"}}]}});
        let container = json!({"volumeMounts": [{"name": "b", "mountPath": "/b"}]});
        let volumes = mounted(&pod, &container);
        assert_eq!(volumes.len(), 1);
        assert!(is_projection(volumes[0]));
        assert_eq!(needs(&volumes).0, [("secrets", "s".to_owned())]);
    }

    #[test]
    fn names_that_would_leave_the_kubelets_directories_are_refused() {
        let pod = |volumes: Value| json!({"metadata": {"namespace": "default", "name": "p"}, "spec": {"volumes": volumes}});
        assert!(
            validate_names(&pod(json!([{"name": "data", "emptyDir": {}},
            {"name": "c", "persistentVolumeClaim": {"claimName": "claim-1"}}])))
            .is_ok()
        );
        for (volumes, field) in [
            (
                json!([{"name": "c", "persistentVolumeClaim": {"claimName": "../x"}}]),
                "spec.volumes[0].persistentVolumeClaim.claimName",
            ),
            (
                json!([{"name": "ok", "emptyDir": {}},
                    {"name": "c", "persistentVolumeClaim": {"claimName": "/etc"}}]),
                "spec.volumes[1].persistentVolumeClaim.claimName",
            ),
            (
                json!([{"name": "a/b", "emptyDir": {}}]),
                "spec.volumes[0].name",
            ),
            (
                json!([{"name": "..", "emptyDir": {}}]),
                "spec.volumes[0].name",
            ),
            (
                json!([{"name": "c", "persistentVolumeClaim": {"claimName": ""}}]),
                "spec.volumes[0].persistentVolumeClaim.claimName",
            ),
        ] {
            let error = validate_names(&pod(volumes)).unwrap_err();
            assert!(error.starts_with(field), "{error}");
        }
        let traversing = json!({"metadata": {"namespace": "..", "name": "p"}});
        assert!(
            validate_names(&traversing)
                .unwrap_err()
                .starts_with("metadata.namespace")
        );
    }

    #[test]
    fn claim_directories_are_made_without_following_links() {
        let base = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let dir = claim_dir(base.path(), "team", "claim", None).unwrap();
        assert_eq!(dir, base.path().join("team/claim"));
        assert!(dir.is_dir());
        // A namespace directory swapped for a link to elsewhere is not followed.
        std::fs::remove_dir_all(base.path().join("team")).unwrap();
        std::os::unix::fs::symlink(outside.path(), base.path().join("team")).unwrap();
        assert!(claim_dir(base.path(), "team", "claim", None).is_err());
        assert!(!outside.path().join("claim").exists());
        assert!(claim_dir(base.path(), "..", "claim", None).is_err());
    }

    #[test]
    fn volume_files_are_written_afresh_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let volume = dir.path().join("v");
        let files = [File {
            path: "sub/key".into(),
            data: b"s3cret".to_vec(),
            mode: 0o400,
        }];
        write_files(&volume, &files, None).unwrap();
        assert_eq!(std::fs::read(volume.join("sub/key")).unwrap(), b"s3cret");
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(volume.join("sub/key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o400);
        // Rewritten: whatever was there (a link planted below it) is gone, nothing outside
        // is written.
        std::fs::remove_dir_all(volume.join("sub")).unwrap();
        std::os::unix::fs::symlink(outside.path(), volume.join("sub")).unwrap();
        write_files(&volume, &files, None).unwrap();
        assert!(!outside.path().join("key").exists());
        assert!(volume.join("sub").is_dir());
    }
}
