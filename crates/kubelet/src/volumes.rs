//! The volumes a container mounts (sans IO apart from [`write_files`]): which ConfigMaps,
//! Secrets and ServiceAccount tokens they need, and the files of `configMap`, `secret`,
//! `downwardAPI` and `projected` volumes (the last is what the API server's ServiceAccount
//! admission adds to every pod: a bound token, the cluster's CA from `kube-root-ca.crt`, and
//! the namespace).
//!
//! As on a node: `items` choose and rename keys, `defaultMode` and per-item `mode` set the
//! files' permissions, a missing object fails the mount unless the volume or source is
//! `optional`, and these volumes are always mounted read-only.
//!
//! Who owns the files is decided here too ([`ownership`]), with a node's rules: root owns them;
//! a pod's `fsGroup` becomes their group and adds group read (and group search plus set-group-ID
//! on directories); a projected ServiceAccount token goes to the one user every container runs
//! as, mode 0600. A kubelet that is not root cannot give files away and leaves them its own.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use crate::process::Identity;

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
/// The mode of the directories of a volume (its own and those of item paths).
const DIR_MODE: u32 = 0o755;
/// What a pod's `fsGroup` adds to the mode of a read-only volume's files: group read.
const FS_GROUP_FILE_BITS: u32 = 0o440;
/// What it adds to the mode of the volume's directories: group read and search, and
/// set-group-ID (what is made in them gets the group).
const FS_GROUP_DIR_BITS: u32 = 0o2550;
/// The mode of a projected ServiceAccount token given to one user (before `fsGroup`'s bits).
const TOKEN_OWNER_MODE: u32 = 0o600;
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

/// The owner, group and permission bits of a file or directory of a volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Owner {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) mode: u32,
}

/// Who owns a projection volume: its directories (its own and those item paths make), and
/// each of its files, in the order of the files they were decided for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ownership {
    pub(crate) dirs: Owner,
    pub(crate) files: Vec<Owner>,
}

/// A uid or gid from the pod's JSON.
fn id(value: Option<&Value>) -> Option<u32> {
    value
        .and_then(Value::as_u64)
        .and_then(|id| u32::try_from(id).ok())
}

/// The user every container of `pod` runs as, when each has one (its own `runAsUser`, else
/// the pod's) and they all agree; an image's user does not count. Init and ephemeral
/// containers are containers too.
fn single_run_as_user(pod: &Value) -> Option<u32> {
    let pod_user = id(pod.pointer("/spec/securityContext/runAsUser"));
    let mut user = None;
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for container in pod
            .pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let this = id(container.pointer("/securityContext/runAsUser")).or(pod_user)?;
            if user.is_some_and(|user| user != this) {
                return None;
            }
            user = Some(this);
        }
    }
    user
}

/// Who owns the files of `volume` (one of `pod`'s, [`is_projection`]) and its directories, in
/// the pod's ids, as a node's kubelet decides it:
///
/// - Root (uid 0, group 0) owns everything, with the mode of each file (its item's `mode` or
///   the volume's `defaultMode`) and 0755 for directories.
/// - With the pod's `fsGroup`, that is the group of everything; files get group read on top of
///   their mode (a `defaultMode` of 0400 becomes 0440), directories group read and search and
///   set-group-ID.
/// - A projected `serviceAccountToken`'s file goes to the user all the pod's containers run as
///   ([`single_run_as_user`]), when there is one, and then, or with `fsGroup`, its mode is 0600
///   before `fsGroup`'s bits (0640 with it); otherwise it is like any other file.
///
/// `files` are the volume's files ([`files`]); a token's is known by its source's `path`.
pub(crate) fn ownership(pod: &Value, volume: &Value, files: &[File]) -> Ownership {
    let fs_group = id(pod.pointer("/spec/securityContext/fsGroup"));
    let group = fs_group.unwrap_or(0);
    let with_fs_group = |mode: u32, bits: u32| fs_group.map_or(mode, |_| mode | bits);
    let tokens: Vec<&str> = sources(volume)
        .filter_map(|source| source.pointer("/serviceAccountToken/path"))
        .filter_map(Value::as_str)
        .collect();
    let token_user = if tokens.is_empty() {
        None
    } else {
        single_run_as_user(pod)
    };
    let files = files
        .iter()
        .map(|file| {
            let token = tokens.contains(&file.path.as_str());
            let (uid, mode) = match token_user {
                Some(user) if token => (user, TOKEN_OWNER_MODE),
                None if token && fs_group.is_some() => (0, TOKEN_OWNER_MODE),
                _ => (0, file.mode),
            };
            Owner {
                uid,
                gid: group,
                mode: with_fs_group(mode, FS_GROUP_FILE_BITS),
            }
        })
        .collect();
    Ownership {
        dirs: Owner {
            uid: 0,
            gid: group,
            mode: with_fs_group(DIR_MODE, FS_GROUP_DIR_BITS),
        },
        files,
    }
}

impl Ownership {
    /// The same ownership in a root kubelet's host ids, for a pod whose processes are `user`
    /// in their user namespace and the host uid and gid `host` outside it. An id the pod's
    /// processes have (their uid; their gid, `fsGroup` or a `supplementalGroups` entry) becomes
    /// `host`; any other stays root's (0), which the pod is not. Permissions then work as on a
    /// node; only the names differ inside the pod: the namespace maps the pod's own ids alone,
    /// so root's files show as the overflow user and group (`nobody`), and a file of group
    /// `fsGroup` shows the pod's own group.
    pub(crate) fn on_host(&self, pod: &Value, user: Identity, host: u32) -> Self {
        let mut groups = vec![user.gid];
        groups.extend(id(pod.pointer("/spec/securityContext/fsGroup")));
        groups.extend(
            pod.pointer("/spec/securityContext/supplementalGroups")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|group| id(Some(group))),
        );
        let map = |owner: &Owner| Owner {
            uid: if owner.uid == user.uid { host } else { 0 },
            gid: if groups.contains(&owner.gid) { host } else { 0 },
            mode: owner.mode,
        };
        Self {
            dirs: map(&self.dirs),
            files: self.files.iter().map(map).collect(),
        }
    }
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

/// Gives the file or directory `fd` to `owner` (its owner and group first, then its mode, as
/// changing the owner may clear set-group-ID).
fn apply(fd: &OwnedFd, owner: &Owner) -> std::io::Result<()> {
    rustix::fs::fchown(
        fd,
        Some(rustix::fs::Uid::from_raw(owner.uid)),
        Some(rustix::fs::Gid::from_raw(owner.gid)),
    )?;
    rustix::fs::fchmod(fd, rustix::fs::Mode::from_raw_mode(owner.mode))?;
    Ok(())
}

/// Writes `files` into `dir` (the kubelet's own), which is emptied first (a volume shows its
/// current data only): each file made afresh through directory handles, never following a
/// symbolic link.
///
/// With `ownership` (a root kubelet's: [`ownership`] in host ids, [`Ownership::on_host`]),
/// `dir` and the directories below it get `ownership.dirs`, and each file its entry of
/// `ownership.files` before its data is written. Without it (a kubelet that is not root, which
/// cannot give files away) files and directories stay the kubelet's, which is the pod's user
/// too, and files have their own mode.
pub(crate) fn write_files(
    dir: &Path,
    files: &[File],
    ownership: Option<&Ownership>,
) -> std::io::Result<()> {
    use rustix::fs::{Mode, OFlags};
    use std::io::Write as _;
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    std::fs::create_dir_all(dir)?;
    let top = open_dir(dir)?;
    if let Some(ownership) = ownership {
        apply(&top, &ownership.dirs)?;
    }
    for (index, file) in files.iter().enumerate() {
        let mut parts: Vec<&str> = file.path.split('/').filter(|p| !p.is_empty()).collect();
        let Some(name) = parts.pop() else {
            continue;
        };
        let mut parent = rustix::io::dup(&top)?;
        for part in parts {
            let (fd, made) = open_or_make_dir(&parent, part)?;
            if let Some(ownership) = ownership.filter(|_| made) {
                apply(&fd, &ownership.dirs)?;
            }
            parent = fd;
        }
        let fd = rustix::fs::openat(
            &parent,
            name,
            OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        match ownership {
            Some(ownership) => {
                let owner = ownership.files.get(index).ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!("no owner decided for {:?}", file.path),
                    )
                })?;
                apply(&fd, owner)?;
            }
            None => rustix::fs::fchmod(&fd, Mode::from_raw_mode(file.mode))?,
        }
        std::fs::File::from(fd).write_all(&file.data)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
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

    /// A pod of `containers` with the pod-level `security` context.
    fn pod_with(security: Value, containers: Value) -> Value {
        json!({"metadata": {"namespace": "default", "name": "p"},
               "spec": {"securityContext": security, "containers": containers}})
    }

    fn file(path: &str, mode: u32) -> File {
        File {
            path: path.to_owned(),
            data: Vec::new(),
            mode,
        }
    }

    fn owner(uid: u32, gid: u32, mode: u32) -> Owner {
        Owner { uid, gid, mode }
    }

    /// The router's case: its signing key's Secret with `defaultMode` 0400, the pod running as
    /// 65532. Without `fsGroup` root owns the key and nobody else may read it (the router
    /// crash-looped on a node); with `fsGroup: 65532` the key is the group's, 0440.
    #[test]
    fn secret_files_belong_to_root_and_to_the_fs_group_with_group_read() {
        let volume = json!({"name": "signing-key",
            "secret": {"secretName": "sandbox-router-signing-key", "defaultMode": 0o400}});
        let files = [file("key", 0o400), file("sub/other", 0o600)];
        let containers = json!([{"name": "router"}]);
        let without = pod_with(
            json!({"runAsUser": 65532, "runAsGroup": 65532}),
            containers.clone(),
        );
        assert_eq!(
            ownership(&without, &volume, &files),
            Ownership {
                dirs: owner(0, 0, 0o755),
                files: vec![owner(0, 0, 0o400), owner(0, 0, 0o600)],
            }
        );
        let with = pod_with(
            json!({"runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532}),
            containers,
        );
        assert_eq!(
            ownership(&with, &volume, &files),
            Ownership {
                dirs: owner(0, 65532, 0o2755),
                files: vec![owner(0, 65532, 0o440), owner(0, 65532, 0o640)],
            }
        );
    }

    #[test]
    fn config_map_and_downward_api_files_follow_the_same_rules() {
        let files = [file("renamed", 0o644), file("x", 0o755)];
        let pod = pod_with(json!({"fsGroup": 3000}), json!([{"name": "main"}]));
        for volume in [
            json!({"name": "c", "configMap": {"name": "settings"}}),
            json!({"name": "d", "downwardAPI": {"items": []}}),
        ] {
            assert_eq!(
                ownership(&pod, &volume, &files).files,
                [owner(0, 3000, 0o644), owner(0, 3000, 0o755)]
            );
        }
        let none = pod_with(json!({}), json!([{"name": "main"}]));
        assert_eq!(
            ownership(
                &none,
                &json!({"name": "c", "configMap": {"name": "s"}}),
                &files
            ),
            Ownership {
                dirs: owner(0, 0, 0o755),
                files: vec![owner(0, 0, 0o644), owner(0, 0, 0o755)],
            }
        );
    }

    /// The files of [`kube_api_access`]: token, ca.crt, namespace.
    fn access_files() -> [File; 3] {
        [
            file("token", 0o644),
            file("ca.crt", 0o644),
            file("namespace", 0o644),
        ]
    }

    #[test]
    fn a_projected_token_goes_to_the_one_user_every_container_runs_as() {
        let volume = kube_api_access();
        // Set on the pod, inherited by both containers, an init container saying the same.
        let pod = json!({"spec": {"securityContext": {"runAsUser": 1000},
            "initContainers": [{"name": "init", "securityContext": {"runAsUser": 1000}}],
            "containers": [{"name": "a"}, {"name": "b"}]}});
        assert_eq!(
            ownership(&pod, &volume, &access_files()).files,
            [
                owner(1000, 0, 0o600),
                owner(0, 0, 0o644),
                owner(0, 0, 0o644)
            ]
        );
        // Set on each container only.
        let pod = pod_with(
            json!({}),
            json!([{"name": "a", "securityContext": {"runAsUser": 7}},
                   {"name": "b", "securityContext": {"runAsUser": 7}}]),
        );
        assert_eq!(
            ownership(&pod, &volume, &access_files()).files[0],
            owner(7, 0, 0o600)
        );
        // With fsGroup too: the user's, the group's, 0640.
        let pod = pod_with(
            json!({"runAsUser": 1000, "fsGroup": 2000}),
            json!([{"name": "a"}]),
        );
        assert_eq!(
            ownership(&pod, &volume, &access_files()),
            Ownership {
                dirs: owner(0, 2000, 0o2755),
                files: vec![
                    owner(1000, 2000, 0o640),
                    owner(0, 2000, 0o644),
                    owner(0, 2000, 0o644)
                ],
            }
        );
    }

    #[test]
    fn without_one_user_for_every_container_the_token_is_roots() {
        let volume = kube_api_access();
        let root_owned = [owner(0, 0, 0o644), owner(0, 0, 0o644), owner(0, 0, 0o644)];
        for pod in [
            // A container overrides the pod's user.
            pod_with(
                json!({"runAsUser": 1000}),
                json!([{"name": "a"}, {"name": "b", "securityContext": {"runAsUser": 2000}}]),
            ),
            // An init container runs as another user.
            json!({"spec": {"securityContext": {"runAsUser": 1000},
                "initContainers": [{"name": "i", "securityContext": {"runAsUser": 0}}],
                "containers": [{"name": "a"}]}}),
            // One container has no user (its image's would be used: unknown).
            pod_with(
                json!({}),
                json!([{"name": "a", "securityContext": {"runAsUser": 1000}}, {"name": "b"}]),
            ),
            // Nobody sets one.
            pod_with(json!({}), json!([{"name": "a"}])),
        ] {
            assert_eq!(
                ownership(&pod, &volume, &access_files()).files,
                root_owned,
                "{pod}"
            );
        }
        // With fsGroup, root's token is still 0600 before the group's read: 0640.
        let pod = pod_with(
            json!({"fsGroup": 2000}),
            json!([{"name": "a", "securityContext": {"runAsUser": 1}},
                   {"name": "b", "securityContext": {"runAsUser": 2}}]),
        );
        assert_eq!(
            ownership(&pod, &volume, &access_files()).files,
            [
                owner(0, 2000, 0o640),
                owner(0, 2000, 0o644),
                owner(0, 2000, 0o644)
            ]
        );
    }

    #[test]
    fn only_a_token_source_gives_a_file_to_the_user() {
        let pod = pod_with(json!({"runAsUser": 1000}), json!([{"name": "a"}]));
        let secret = json!({"name": "s", "secret": {"secretName": "s", "defaultMode": 0o400}});
        assert_eq!(
            ownership(&pod, &secret, &[file("token", 0o400)]).files,
            [owner(0, 0, 0o400)]
        );
        let projected = json!({"name": "p", "projected": {"sources": [
            {"secret": {"name": "s"}},
            {"serviceAccountToken": {"path": "sa/token"}}]}});
        assert_eq!(
            ownership(
                &pod,
                &projected,
                &[file("key", 0o400), file("sa/token", 0o644)]
            )
            .files,
            [owner(0, 0, 0o400), owner(1000, 0, 0o600)]
        );
    }

    #[test]
    fn on_the_host_the_pods_own_ids_become_its_host_id_and_others_stay_roots() {
        const HOST: u32 = 0x7000_0042;
        let router = Identity {
            uid: 65532,
            gid: 65532,
        };
        let decided = Ownership {
            dirs: owner(0, 65532, 0o2755),
            files: vec![owner(0, 65532, 0o440), owner(65532, 0, 0o600)],
        };
        let pod = pod_with(json!({"runAsUser": 65532, "fsGroup": 65532}), json!([]));
        assert_eq!(
            decided.on_host(&pod, router, HOST),
            Ownership {
                dirs: owner(0, HOST, 0o2755),
                files: vec![owner(0, HOST, 0o440), owner(HOST, 0, 0o600)],
            }
        );
        // An fsGroup other than the pod's own group is the pod's too (a supplementary group
        // on a node); root's group is not, unless the pod has it.
        let decided = Ownership {
            dirs: owner(0, 0, 0o755),
            files: vec![owner(0, 4000, 0o440), owner(0, 0, 0o440)],
        };
        let pod = pod_with(json!({"fsGroup": 4000}), json!([]));
        assert_eq!(
            decided.on_host(&pod, router, HOST).files,
            [owner(0, HOST, 0o440), owner(0, 0, 0o440)]
        );
        let pod = pod_with(json!({"supplementalGroups": [0]}), json!([]));
        assert_eq!(
            decided.on_host(&pod, router, HOST).files,
            [owner(0, 0, 0o440), owner(0, HOST, 0o440)]
        );
        // A pod that runs as root (without capabilities here) owns root's files.
        let root = Identity { uid: 0, gid: 0 };
        assert_eq!(
            decided.on_host(&pod_with(json!({}), json!([])), root, HOST),
            Ownership {
                dirs: owner(HOST, HOST, 0o755),
                files: vec![owner(HOST, 0, 0o440), owner(HOST, HOST, 0o440)],
            }
        );
    }

    #[test]
    fn a_root_kubelet_writes_the_owners_and_modes_it_is_given() {
        use std::os::unix::fs::MetadataExt as _;
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipping: giving files to other users needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let volume = dir.path().join("v");
        let files = [
            File {
                path: "key".into(),
                data: b"s3cret".to_vec(),
                mode: 0o400,
            },
            File {
                path: "sa/token".into(),
                data: b"jwt".to_vec(),
                mode: 0o644,
            },
        ];
        let ownership = Ownership {
            dirs: owner(0, 4242, 0o2755),
            files: vec![owner(0, 4242, 0o440), owner(4343, 0, 0o600)],
        };
        write_files(&volume, &files, Some(&ownership)).unwrap();
        let got = |path: &str| {
            let metadata = std::fs::symlink_metadata(volume.join(path)).unwrap();
            owner(metadata.uid(), metadata.gid(), metadata.mode() & 0o7777)
        };
        assert_eq!(
            ["", "sa", "key", "sa/token"].map(got),
            [
                owner(0, 4242, 0o2755),
                owner(0, 4242, 0o2755),
                owner(0, 4242, 0o440),
                owner(4343, 0, 0o600)
            ]
        );
        assert_eq!(std::fs::read(volume.join("sa/token")).unwrap(), b"jwt");
        // Fewer owners than files is a mistake, refused rather than guessed.
        let short = Ownership {
            dirs: ownership.dirs,
            files: Vec::new(),
        };
        assert!(write_files(&volume, &files, Some(&short)).is_err());
    }
}
