//! Object semantics of the API (sans IO apart from the in-memory store): create with
//! `generateName`, update with optimistic concurrency, the patch flavours and server-side apply,
//! status and scale subresources, generation, graceful and finalizer-held deletion with
//! propagation policies, namespace checks, CRD registration and Service cluster IPs.
//!
//! The HTTP layer (`api`) and the sim's controllers (kubelet, GC, endpoints, namespaces) both
//! call these functions; the controllers' own writes go through [`ApiObjects::mutate`], which skips
//! admission like a component writing through the real API with a trusted shape.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::admission::{self, FieldValidation};
use crate::api_error::{ApiError, ApiResult, Cause};
use crate::apply;
use crate::events;
use crate::meta;
use crate::patch;
use crate::resources::{Builtin, ResourceInfo, StorageKey, parse_crd};
use crate::selector::Selectors;
use crate::store::{Committed, Decision, Store};

/// Which part of an object an endpoint writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Subresource {
    Main,
    Status,
    Scale,
    /// A Namespace's `finalize`: only `spec.finalizers` changes.
    Finalize,
}

impl Subresource {
    fn managed_name(self) -> &'static str {
        match self {
            Self::Main => "",
            Self::Status => "status",
            Self::Scale => "scale",
            Self::Finalize => "finalize",
        }
    }
}

/// The patch flavours, by content type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PatchType {
    Merge,
    Json,
    Strategic,
    Apply,
}

/// Options of a write request.
#[derive(Clone, Debug, Default)]
pub(crate) struct WriteOptions {
    /// `fieldManager`, or the manager derived from the user agent.
    pub(crate) manager: String,
    pub(crate) validation: FieldValidation,
    pub(crate) dry_run: bool,
    /// `force` of server-side apply.
    pub(crate) force: bool,
}

/// `propagationPolicy` of a delete.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Propagation {
    Orphan,
    #[default]
    Background,
    Foreground,
}

/// Options of a delete request.
#[derive(Clone, Debug, Default)]
pub(crate) struct DeleteOptions {
    pub(crate) propagation: Propagation,
    pub(crate) grace_period: Option<i64>,
    pub(crate) uid: Option<String>,
    pub(crate) resource_version: Option<String>,
    pub(crate) dry_run: bool,
}

/// A successful write.
#[derive(Debug)]
pub(crate) struct Written {
    /// The object as the endpoint serves it.
    pub(crate) object: Value,
    pub(crate) warnings: Vec<String>,
    pub(crate) created: bool,
}

/// Finalizer the API server adds for foreground deletion.
pub(crate) const FOREGROUND: &str = "foregroundDeletion";
/// Finalizer the API server adds for orphaning deletion.
pub(crate) const ORPHAN: &str = "orphan";
/// The namespace controller's entry in a Namespace's `spec.finalizers`.
pub(crate) const NAMESPACE_FINALIZER: &str = "kubernetes";

/// The API's objects: the store plus the semantics above it (what every endpoint and every
/// sim controller reads and writes through).
#[derive(Debug)]
pub(crate) struct ApiObjects {
    pub(crate) store: Store,
}

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| char::from(ALPHABET[fastrand::usize(..ALPHABET.len())]))
        .collect()
}

/// A random RFC 4122 version-4 UID.
pub(crate) fn new_uid() -> String {
    let bits = fastrand::u128(..);
    let bits = (bits & !(0xf << 76)) | (0x4 << 76);
    let bits = (bits & !(0x3 << 62)) | (0x2 << 62);
    let hex = format!("{bits:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Whether a stored object has finished deletion and must leave the store.
pub(crate) fn should_remove(builtin: Builtin, object: &Value) -> bool {
    if !meta::is_deleting(object) || !meta::finalizers(object).is_empty() {
        return false;
    }
    match builtin {
        // The kubelet confirms a graceful pod deletion by setting the grace period to zero.
        Builtin::Pod => {
            object
                .pointer("/metadata/deletionGracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(0)
                == 0
        }
        Builtin::Namespace => object
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty),
        _ => true,
    }
}

fn strip_volatile(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(meta) = copy.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
        if let Some(Value::Array(entries)) = meta.get_mut("managedFields") {
            for entry in entries.iter_mut().filter_map(Value::as_object_mut) {
                entry.remove("time");
            }
        }
    }
    copy
}

fn without(object: &Value, fields: &[&str]) -> Value {
    let mut copy = object.clone();
    if let Some(map) = copy.as_object_mut() {
        for field in fields {
            map.remove(*field);
        }
    }
    copy
}

/// Whether the change from `old` to `new` bumps `metadata.generation`: anything but metadata
/// (and status, when status is a subresource).
fn spec_changed(info: &ResourceInfo, old: &Value, new: &Value) -> bool {
    let ignored: &[&str] = if info.status {
        &["metadata", "status", "apiVersion", "kind"]
    } else {
        &["metadata", "apiVersion", "kind"]
    };
    without(old, ignored) != without(new, ignored)
}

/// Reads a dotted path such as `.spec.replicas`.
fn get_path<'a>(object: &'a Value, path: &str) -> Option<&'a Value> {
    meta::dotted(object, path.trim_start_matches('.'))
}

/// Writes a dotted path, creating maps on the way.
fn set_path(object: &mut Value, path: &str, value: Value) {
    let segments: Vec<&str> = path
        .trim_start_matches('.')
        .split('.')
        .filter(|s| !s.is_empty())
        .collect();
    let mut current = object;
    for (index, segment) in segments.iter().enumerate() {
        if !current.is_object() {
            *current = json!({});
        }
        let Some(map) = current.as_object_mut() else {
            return;
        };
        if index + 1 == segments.len() {
            map.insert((*segment).to_owned(), value);
            return;
        }
        current = map
            .entry((*segment).to_owned())
            .or_insert_with(|| json!({}));
    }
}

impl ApiObjects {
    /// Objects in an empty store keeping `history_limit` watch events.
    pub(crate) fn new(history_limit: usize) -> Self {
        Self {
            store: Store::new(history_limit),
        }
    }

    /// The registered resource for a group, version and plural.
    pub(crate) fn resource(
        &self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Option<Arc<ResourceInfo>> {
        self.store.registry().get(group, version, plural)
    }

    /// A built-in resource by group and plural (always registered).
    pub(crate) fn builtin(&self, group: &str, plural: &str) -> ApiResult<Arc<ResourceInfo>> {
        self.store
            .registry()
            .get(group, "v1", plural)
            .ok_or_else(|| ApiError::internal(format!("built-in resource {plural} missing")))
    }

    /// The resource info for the first served version of a stored collection.
    pub(crate) fn info_for_storage(&self, key: &StorageKey) -> Option<Arc<ResourceInfo>> {
        let registry = self.store.registry();
        registry
            .all()
            .find(|info| info.storage() == *key && info.builtin != Builtin::EventV1)
            .cloned()
    }

    /// A stored object as the endpoint of `info` serves it.
    pub(crate) fn present(&self, info: &ResourceInfo, stored: &Value) -> Value {
        if info.builtin == Builtin::EventV1 {
            return events::to_v1(stored);
        }
        let mut object = stored.clone();
        if let Some(map) = object.as_object_mut() {
            map.insert("apiVersion".into(), json!(info.api_version()));
            map.insert("kind".into(), json!(info.kind));
        }
        object
    }

    fn to_storage(info: &ResourceInfo, object: Value) -> Value {
        if info.builtin == Builtin::EventV1 {
            events::to_core(&object)
        } else {
            object
        }
    }

    /// GET of one object.
    pub(crate) fn get(&self, info: &ResourceInfo, namespace: &str, name: &str) -> ApiResult<Value> {
        self.store
            .get(&info.storage(), namespace, name)
            .map(|stored| self.present(info, &stored))
            .ok_or_else(|| ApiError::not_found(&info.group, &info.plural, name))
    }

    /// LIST: the selected objects and the list's resource version.
    pub(crate) fn list(
        &self,
        info: &ResourceInfo,
        namespace: Option<&str>,
        selectors: &Selectors,
    ) -> (Vec<Value>, u64) {
        let (items, rv) = self.store.list(&info.storage(), namespace);
        let items = items
            .iter()
            .map(|stored| self.present(info, stored))
            .filter(|object| selectors.matches(object))
            .collect();
        (items, rv)
    }

    fn check_namespace(&self, info: &ResourceInfo, namespace: &str) -> ApiResult<()> {
        if !info.namespaced {
            return Ok(());
        }
        match self
            .store
            .get(&StorageKey::new("", "namespaces"), "", namespace)
        {
            None => Err(ApiError::not_found("", "namespaces", namespace)),
            Some(ns) if meta::is_deleting(&ns) => Err(ApiError::forbidden(format!(
                "{} \"{}\" is forbidden: unable to create new content in namespace {namespace} because it is being terminated",
                crate::api_error::qualified(&info.group, &info.plural),
                "",
            ))),
            Some(_) => Ok(()),
        }
    }

    fn allocate_cluster_ip(&self) -> String {
        let (services, _) = self.store.list(&StorageKey::new("", "services"), None);
        let used: Vec<&str> = services
            .iter()
            .filter_map(|svc| svc.pointer("/spec/clusterIP").and_then(Value::as_str))
            .collect();
        loop {
            let candidate = format!("10.96.{}.{}", fastrand::u8(..), fastrand::u8(1..255));
            if !used.contains(&candidate.as_str()) {
                return candidate;
            }
        }
    }

    /// CREATE.
    pub(crate) fn create(
        &self,
        info: &ResourceInfo,
        namespace: &str,
        body: Value,
        options: &WriteOptions,
    ) -> ApiResult<Written> {
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object",
            ));
        }
        if info.namespaced {
            let body_ns = meta::namespace(&body);
            if !body_ns.is_empty() && body_ns != namespace {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        }
        if !meta::resource_version(&body).is_empty() {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        self.check_namespace(info, namespace)?;
        let generate = meta::meta_str(&body, "generateName")
            .filter(|_| meta::name(&body).is_empty())
            .map(str::to_owned);
        for _ in 0..8 {
            let mut object = body.clone();
            {
                let m = meta::meta_mut(&mut object);
                if let Some(prefix) = &generate {
                    m.insert("name".into(), json!(format!("{prefix}{}", random_suffix())));
                }
                if info.namespaced {
                    m.insert("namespace".into(), json!(namespace));
                } else {
                    m.remove("namespace");
                }
                for field in [
                    "uid",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "managedFields",
                    "selfLink",
                ] {
                    m.remove(field);
                }
            }
            if info.status
                && info.builtin != Builtin::CustomResourceDefinition
                && let Some(map) = object.as_object_mut()
            {
                map.remove("status");
            }
            match self.create_once(info, namespace, object, options) {
                Err(error) if error.reason == "AlreadyExists" && generate.is_some() => continue,
                other => return other,
            }
        }
        Err(ApiError::internal("could not generate a unique name"))
    }

    fn create_once(
        &self,
        info: &ResourceInfo,
        namespace: &str,
        object: Value,
        options: &WriteOptions,
    ) -> ApiResult<Written> {
        let admitted = admission::admit(info, object, options.validation)?;
        admission::check_rules(info, &admitted.object, None)?;
        let mut object = admitted.object;
        let name = meta::name(&object).to_owned();
        let lists = |path: &[String]| info.list_type(path);
        let now = meta::now();
        let managed = apply::track_update(
            &json!({}),
            &object,
            &options.manager,
            &[],
            "",
            &info.api_version(),
            &now,
            &lists,
        );
        {
            let m = meta::meta_mut(&mut object);
            m.insert("uid".into(), json!(new_uid()));
            m.insert("creationTimestamp".into(), json!(now));
            m.insert("generation".into(), json!(1));
        }
        apply::write_managed(&mut object, &managed);
        self.on_create(info, &mut object)?;
        self.finish_create(info, namespace, &name, object, admitted.warnings, options)
    }

    fn finish_create(
        &self,
        info: &ResourceInfo,
        namespace: &str,
        name: &str,
        object: Value,
        warnings: Vec<String>,
        options: &WriteOptions,
    ) -> ApiResult<Written> {
        let stored = Self::to_storage(info, object);
        if options.dry_run {
            return Ok(Written {
                object: self.present(info, &stored),
                warnings,
                created: true,
            });
        }
        let committed = self
            .store
            .commit(&info.storage(), namespace, name, |current| {
                if current.is_some() {
                    return Err(ApiError::already_exists(&info.group, &info.plural, name));
                }
                Ok(Decision::Put(stored))
            })?;
        self.after_write(info, &committed);
        Ok(Written {
            object: self.present(info, &committed.object),
            warnings,
            created: true,
        })
    }

    /// Kind-specific work at creation: cluster IPs, CRD status.
    fn on_create(&self, info: &ResourceInfo, object: &mut Value) -> ApiResult<()> {
        match info.builtin {
            Builtin::Service => {
                let ip = object
                    .pointer("/spec/clusterIP")
                    .and_then(Value::as_str)
                    .filter(|ip| !ip.is_empty())
                    .map(str::to_owned)
                    .unwrap_or_else(|| self.allocate_cluster_ip());
                if let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.insert("clusterIP".into(), json!(ip));
                    spec.insert("clusterIPs".into(), json!([ip]));
                }
            }
            Builtin::CustomResourceDefinition => self.prepare_crd(object)?,
            Builtin::Namespace => {
                // As the API server on create: the namespace controller's finalizer, whatever
                // the request said, and a fresh status.
                let finalizers = object
                    .pointer("/spec/finalizers")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let mut finalizers: Vec<Value> = finalizers;
                if !finalizers.iter().any(|f| f == NAMESPACE_FINALIZER) {
                    finalizers.push(json!(NAMESPACE_FINALIZER));
                }
                if let Some(map) = object.as_object_mut() {
                    let spec = map.entry("spec").or_insert_with(|| json!({}));
                    spec["finalizers"] = json!(finalizers);
                    map.insert("status".into(), json!({"phase": "Active"}));
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn prepare_crd(&self, object: &mut Value) -> ApiResult<()> {
        let crd = parse_crd(object).map_err(ApiError::bad_request)?;
        let name = crd.metadata.name.clone().unwrap_or_default();
        let expected = format!("{}.{}", crd.spec.names.plural, crd.spec.group);
        if name != expected {
            return Err(ApiError::invalid(
                "apiextensions.k8s.io",
                "CustomResourceDefinition",
                "customresourcedefinitions",
                &name,
                vec![Cause {
                    reason: "FieldValueInvalid",
                    message: format!(
                        "Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"
                    ),
                    field: "metadata.name".into(),
                }],
            ));
        }
        // Check registration before storing, so a clash fails the write.
        self.store
            .registry()
            .clone()
            .register_crd(&crd)
            .map_err(|why| {
                ApiError::conflict(
                    "apiextensions.k8s.io",
                    "customresourcedefinitions",
                    &name,
                    &why,
                )
            })?;
        let now = meta::now();
        let storage = crd
            .spec
            .versions
            .iter()
            .find(|v| v.storage)
            .map(|v| v.name.clone())
            .unwrap_or_default();
        let condition = |type_: &str, reason: &str, message: &str| {
            json!({"type": type_, "status": "True", "reason": reason, "message": message,
                   "lastTransitionTime": now})
        };
        if let Some(map) = object.as_object_mut() {
            map.insert(
                "status".into(),
                json!({
                    "acceptedNames": object_names(&crd),
                    "conditions": [
                        condition("NamesAccepted", "NoConflicts", "no conflicts found"),
                        condition("Established", "InitialNamesAccepted", "the initial names have been accepted"),
                    ],
                    "storedVersions": [storage],
                }),
            );
        }
        Ok(())
    }

    /// Kind-specific work after a committed write.
    fn after_write(&self, info: &ResourceInfo, committed: &Committed) {
        if info.builtin != Builtin::CustomResourceDefinition {
            return;
        }
        let Ok(crd) = parse_crd(&committed.object) else {
            return;
        };
        let name = crd.metadata.name.clone().unwrap_or_default();
        if committed.kind == Some(crate::store::EventType::Deleted) {
            self.store.registry_mut().unregister_crd(&name);
        } else if let Err(why) = self.store.registry_mut().register_crd(&crd) {
            tracing::warn!(crd = %name, %why, "CRD names clash; not served");
        }
    }

    /// UPDATE (PUT) of the main resource or a subresource.
    pub(crate) fn update(
        &self,
        info: &ResourceInfo,
        namespace: &str,
        name: &str,
        body: Value,
        subresource: Subresource,
        options: &WriteOptions,
    ) -> ApiResult<Written> {
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object",
            ));
        }
        let body_name = meta::name(&body);
        if subresource != Subresource::Scale && !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let body_rv = meta::resource_version(&body).to_owned();
        if body_rv.is_empty() && info.is_custom() && subresource != Subresource::Scale {
            return Err(ApiError::invalid(
                &info.group,
                &info.kind,
                &info.plural,
                name,
                vec![Cause {
                    reason: "FieldValueInvalid",
                    message: "Invalid value: 0x0: must be specified for an update".into(),
                    field: "metadata.resourceVersion".into(),
                }],
            ));
        }
        self.write_existing(info, namespace, name, subresource, options, |current| {
            if subresource == Subresource::Scale {
                return self.scale_into(info, current, &body);
            }
            Ok(body.clone())
        })
    }

    /// PATCH of the main resource or a subresource (server-side apply goes to [`Self::apply`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn patch(
        &self,
        info: &ResourceInfo,
        namespace: &str,
        name: &str,
        patch_type: PatchType,
        body: &Value,
        subresource: Subresource,
        options: &WriteOptions,
    ) -> ApiResult<Written> {
        if patch_type == PatchType::Apply {
            return self.apply(info, namespace, name, body, subresource, options);
        }
        if patch_type == PatchType::Strategic && info.is_custom() {
            return Err(ApiError::unsupported_media_type(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            ));
        }
        self.write_existing(info, namespace, name, subresource, options, |current| {
            let mut target = if subresource == Subresource::Scale {
                self.scale_of(info, current)
            } else {
                current.clone()
            };
            match patch_type {
                PatchType::Merge => patch::merge_patch(&mut target, body),
                PatchType::Json => patch::json_patch(&mut target, body).map_err(|why| {
                    ApiError::invalid(
                        &info.group,
                        &info.kind,
                        &info.plural,
                        name,
                        vec![Cause {
                            reason: "FieldValueInvalid",
                            message: why,
                            field: String::new(),
                        }],
                    )
                })?,
                PatchType::Strategic => {
                    patch::strategic_merge(&mut target, body, &|path: &[String]| {
                        info.list_type(path)
                    });
                }
                PatchType::Apply => {}
            }
            if subresource == Subresource::Scale {
                return self.scale_into(info, current, &target);
            }
            Ok(target)
        })
    }

    /// The Scale object of `current` (endpoint form).
    fn scale_of(&self, info: &ResourceInfo, current: &Value) -> Value {
        let Some(paths) = &info.scale else {
            return json!({});
        };
        let spec = get_path(current, &paths.spec_replicas)
            .cloned()
            .unwrap_or(json!(0));
        let status = get_path(current, &paths.status_replicas)
            .cloned()
            .unwrap_or(json!(0));
        let mut scale = json!({
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                "name": meta::name(current),
                "namespace": meta::namespace(current),
                "uid": meta::uid(current),
                "resourceVersion": meta::resource_version(current),
                "creationTimestamp": meta::meta_str(current, "creationTimestamp"),
            },
            "spec": {"replicas": spec},
            "status": {"replicas": status},
        });
        if let Some(selector) = paths
            .label_selector
            .as_deref()
            .and_then(|path| get_path(current, path))
        {
            scale["status"]["selector"] = selector.clone();
        }
        if matches!(info.builtin, Builtin::Deployment | Builtin::ReplicaSet)
            && let Some(selector) = current.pointer("/spec/selector")
        {
            scale["status"]["selector"] = json!(crate::workloads::selector_string(selector));
        }
        scale
    }

    /// The object `current` with the replicas of `scale` (keeping the scale's resourceVersion as
    /// the precondition).
    fn scale_into(&self, info: &ResourceInfo, current: &Value, scale: &Value) -> ApiResult<Value> {
        let Some(paths) = &info.scale else {
            return Err(ApiError::no_route(&format!("{}/scale", info.plural)));
        };
        let replicas = scale
            .pointer("/spec/replicas")
            .cloned()
            .ok_or_else(|| ApiError::bad_request("spec.replicas of the Scale is required"))?;
        let mut object = current.clone();
        set_path(&mut object, &paths.spec_replicas, replicas);
        let rv = meta::resource_version(scale);
        let m = meta::meta_mut(&mut object);
        if rv.is_empty() {
            m.remove("resourceVersion");
        } else {
            m.insert("resourceVersion".into(), json!(rv));
        }
        Ok(object)
    }

    /// GET of the scale subresource.
    pub(crate) fn get_scale(
        &self,
        info: &ResourceInfo,
        namespace: &str,
        name: &str,
    ) -> ApiResult<Value> {
        if info.scale.is_none() {
            return Err(ApiError::no_route(&format!("{}/scale", info.plural)));
        }
        let object = self.get(info, namespace, name)?;
        Ok(self.scale_of(info, &object))
    }

    /// Present the result of a write to an endpoint: the Scale for `scale`, else the object.
    pub(crate) fn present_for(
        &self,
        info: &ResourceInfo,
        subresource: Subresource,
        object: Value,
    ) -> Value {
        if subresource == Subresource::Scale {
            self.scale_of(info, &object)
        } else {
            object
        }
    }

    /// Reads the current object, derives the desired one with `desire` (both in endpoint form),
    /// and runs the update rules.
    fn write_existing<F>(
        &self,
        info: &ResourceInfo,
        namespace: &str,
        name: &str,
        subresource: Subresource,
        options: &WriteOptions,
        desire: F,
    ) -> ApiResult<Written>
    where
        F: FnOnce(&Value) -> ApiResult<Value>,
    {
        let mut warnings = Vec::new();
        let committed = self
            .store
            .commit(&info.storage(), namespace, name, |current| {
                let current =
                    current.ok_or_else(|| ApiError::not_found(&info.group, &info.plural, name))?;
                let current_view = self.present(info, current);
                let desired = desire(&current_view)?;
                let rv = meta::resource_version(&desired);
                if !rv.is_empty() && rv != meta::resource_version(&current_view) {
                    return Err(ApiError::stale(&info.group, &info.plural, name));
                }
                let (decision, admitted_warnings) = self.decide_update(
                    info,
                    current,
                    &current_view,
                    desired,
                    subresource,
                    options,
                    None,
                )?;
                warnings = admitted_warnings;
                if options.dry_run {
                    return Ok(Decision::Keep(Arc::new(match decision {
                        Decision::Put(v) | Decision::Remove(v) => v,
                        Decision::Keep(v) => (*v).clone(),
                    })));
                }
                Ok(decision)
            })?;
        self.after_write(info, &committed);
        Ok(Written {
            object: self.present(info, &committed.object),
            warnings,
            created: false,
        })
    }

    /// The update rules shared by PUT, PATCH and apply: subresource separation, immutable
    /// metadata, admission, immutable fields, generation, field ownership, no-op detection and
    /// finalization.
    #[allow(clippy::too_many_arguments)]
    fn decide_update(
        &self,
        info: &ResourceInfo,
        stored: &Value,
        current: &Value,
        desired: Value,
        subresource: Subresource,
        options: &WriteOptions,
        applied_managed: Option<Vec<apply::ManagedEntry>>,
    ) -> ApiResult<(Decision, Vec<String>)> {
        // As the real API server's metadata validation: a write naming another uid is for an
        // object that no longer exists (a kubelet's status patch for a pod recreated under the
        // same name, say), not for this one.
        let sent_uid = meta::uid(&desired);
        if !sent_uid.is_empty() && sent_uid != meta::uid(current) {
            return Err(field_error(
                info,
                current,
                "FieldValueInvalid",
                "metadata.uid",
                format!("Invalid value: \"{sent_uid}\": field is immutable"),
            ));
        }
        let mut desired = match subresource {
            Subresource::Status => {
                let mut object = current.clone();
                if let Some(map) = object.as_object_mut() {
                    match desired.get("status") {
                        Some(status) => map.insert("status".into(), status.clone()),
                        None => map.remove("status"),
                    };
                }
                object
            }
            Subresource::Finalize => {
                let mut object = current.clone();
                let finalizers = desired
                    .pointer("/spec/finalizers")
                    .cloned()
                    .unwrap_or(json!([]));
                if let Some(map) = object.as_object_mut() {
                    let spec = map.entry("spec").or_insert_with(|| json!({}));
                    if let Some(spec) = spec.as_object_mut() {
                        spec.insert("finalizers".into(), finalizers);
                    }
                }
                object
            }
            Subresource::Main | Subresource::Scale => {
                let mut object = desired;
                // A Namespace's finalizers change only through `finalize`.
                if info.builtin == Builtin::Namespace
                    && let Some(map) = object.as_object_mut()
                    && let Some(spec) = map
                        .entry("spec")
                        .or_insert_with(|| json!({}))
                        .as_object_mut()
                {
                    match current.pointer("/spec/finalizers") {
                        Some(finalizers) => spec.insert("finalizers".into(), finalizers.clone()),
                        None => spec.remove("finalizers"),
                    };
                }
                if info.status
                    && let Some(map) = object.as_object_mut()
                {
                    match current.get("status") {
                        Some(status) => map.insert("status".into(), status.clone()),
                        None => map.remove("status"),
                    };
                }
                object
            }
        };
        // Metadata the server owns.
        {
            let current_meta = meta::meta(current).cloned().unwrap_or_default();
            let m = meta::meta_mut(&mut desired);
            for field in [
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "managedFields",
            ] {
                match current_meta.get(field) {
                    Some(value) => m.insert(field.into(), value.clone()),
                    None => m.remove(field),
                };
            }
            m.remove("resourceVersion");
        }
        if meta::is_deleting(current) {
            let before = meta::finalizers(current);
            if meta::finalizers(&desired)
                .iter()
                .any(|f| !before.contains(f))
            {
                return Err(field_error(
                    info,
                    current,
                    "FieldValueForbidden",
                    "metadata.finalizers",
                    "Forbidden: no new finalizers can be added if the object is being deleted"
                        .into(),
                ));
            }
        }
        let admitted = admission::admit(info, desired, options.validation)?;
        admission::check_rules(info, &admitted.object, Some(current))?;
        let mut new = admitted.object;
        if !matches!(subresource, Subresource::Status | Subresource::Finalize) {
            admission::validate_update(info, current, &new)?;
        }
        if info.builtin == Builtin::CustomResourceDefinition {
            self.prepare_crd(&mut new)?;
        }
        let generation = current
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let generation = if spec_changed(info, current, &new) {
            generation + 1
        } else {
            generation
        };
        meta::meta_mut(&mut new).insert("generation".into(), json!(generation));
        let lists = |path: &[String]| info.list_type(path);
        let managed = match applied_managed {
            Some(managed) => managed,
            None => {
                let scoped = |object: &Value| match subresource {
                    Subresource::Status => json!({"status": object.get("status")}),
                    _ if info.status => without(object, &["status"]),
                    _ => object.clone(),
                };
                apply::track_update(
                    &scoped(current),
                    &scoped(&new),
                    &options.manager,
                    &apply::read_managed(current),
                    subresource.managed_name(),
                    &info.api_version(),
                    &meta::now(),
                    &lists,
                )
            }
        };
        apply::write_managed(&mut new, &managed);
        if strip_volatile(&new) == strip_volatile(current) {
            return Ok((Decision::Keep(Arc::new(stored.clone())), admitted.warnings));
        }
        let stored_new = Self::to_storage(info, new);
        let decision = if should_remove(info.builtin, &stored_new) {
            Decision::Remove(stored_new)
        } else {
            Decision::Put(stored_new)
        };
        Ok((decision, admitted.warnings))
    }

    /// Server-side apply.
    pub(crate) fn apply(
        &self,
        info: &ResourceInfo,
        namespace: &str,
        name: &str,
        config: &Value,
        subresource: Subresource,
        options: &WriteOptions,
    ) -> ApiResult<Written> {
        if options.manager.is_empty() {
            return Err(ApiError::bad_request(
                "PATCH, application/apply-patch+yaml requests must have a fieldManager",
            ));
        }
        let api_version = config
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let kind = config
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if api_version.is_empty() || kind.is_empty() {
            return Err(ApiError::bad_request(
                "apiVersion and kind must be set in an apply configuration",
            ));
        }
        if kind != info.kind || api_version != info.api_version() {
            return Err(ApiError::bad_request(format!(
                "the apply configuration is a {api_version}, Kind={kind}, not a {}, Kind={}",
                info.api_version(),
                info.kind
            )));
        }
        let config_name = meta::name(config);
        if !config_name.is_empty() && config_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({config_name}) does not match the name on the URL ({name})"
            )));
        }
        let (config, mut warnings) =
            admission::prune_config(info, config.clone(), options.validation)?;
        let lists = |path: &[String]| info.list_type(path);
        let scoped_config = match subresource {
            Subresource::Status => {
                json!({"status": config.get("status").cloned().unwrap_or(json!({}))})
            }
            _ if info.status => without(&config, &["status"]),
            _ => config.clone(),
        };
        let existing = self.store.get(&info.storage(), namespace, name);
        if existing.is_none() {
            if subresource != Subresource::Main {
                return Err(ApiError::not_found(&info.group, &info.plural, name));
            }
            self.check_namespace(info, namespace)?;
            let applied = apply::apply(
                &json!({}),
                &scoped_config,
                &options.manager,
                options.force,
                &[],
                "",
                &info.api_version(),
                &meta::now(),
                &lists,
            )
            .map_err(|conflicts| {
                ApiError::apply_conflict(&info.group, &info.plural, name, &conflicts)
            })?;
            let mut object = applied.object;
            {
                let m = meta::meta_mut(&mut object);
                m.insert("name".into(), json!(name));
                if info.namespaced {
                    m.insert("namespace".into(), json!(namespace));
                }
            }
            let admitted = admission::admit(info, object, options.validation)?;
            admission::check_rules(info, &admitted.object, None)?;
            warnings.extend(admitted.warnings);
            let mut object = admitted.object;
            {
                let m = meta::meta_mut(&mut object);
                m.insert("uid".into(), json!(new_uid()));
                m.insert("creationTimestamp".into(), json!(meta::now()));
                m.insert("generation".into(), json!(1));
            }
            apply::write_managed(&mut object, &applied.managed);
            self.on_create(info, &mut object)?;
            match self.finish_create(info, namespace, name, object, warnings.clone(), options) {
                Err(error) if error.reason == "AlreadyExists" => {}
                other => return other,
            }
        }
        let mut update_warnings = Vec::new();
        let committed = self
            .store
            .commit(&info.storage(), namespace, name, |stored| {
                let stored =
                    stored.ok_or_else(|| ApiError::not_found(&info.group, &info.plural, name))?;
                let current = self.present(info, stored);
                let rv = meta::resource_version(&config);
                if !rv.is_empty() && rv != meta::resource_version(&current) {
                    return Err(ApiError::stale(&info.group, &info.plural, name));
                }
                let applied = apply::apply(
                    &current,
                    &scoped_config,
                    &options.manager,
                    options.force,
                    &apply::read_managed(&current),
                    subresource.managed_name(),
                    &info.api_version(),
                    &meta::now(),
                    &lists,
                )
                .map_err(|conflicts| {
                    ApiError::apply_conflict(&info.group, &info.plural, name, &conflicts)
                })?;
                let (decision, admitted_warnings) = self.decide_update(
                    info,
                    stored,
                    &current,
                    applied.object,
                    subresource,
                    options,
                    Some(applied.managed),
                )?;
                update_warnings = admitted_warnings;
                if options.dry_run {
                    return Ok(Decision::Keep(Arc::new(match decision {
                        Decision::Put(v) | Decision::Remove(v) => v,
                        Decision::Keep(v) => (*v).clone(),
                    })));
                }
                Ok(decision)
            })?;
        self.after_write(info, &committed);
        warnings.extend(update_warnings);
        Ok(Written {
            object: self.present(info, &committed.object),
            warnings,
            created: false,
        })
    }

    /// DELETE. Returns the object as the endpoint serves it and whether it left the store.
    pub(crate) fn delete(
        &self,
        info: &ResourceInfo,
        namespace: &str,
        name: &str,
        options: &DeleteOptions,
    ) -> ApiResult<(Value, bool)> {
        let committed = self
            .store
            .commit(&info.storage(), namespace, name, |current| {
                let current =
                    current.ok_or_else(|| ApiError::not_found(&info.group, &info.plural, name))?;
                if let Some(uid) = &options.uid
                    && uid != meta::uid(current)
                {
                    return Err(ApiError::conflict(&info.group, &info.plural, name, &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                        meta::uid(current)
                    )));
                }
                if let Some(rv) = &options.resource_version
                    && rv != meta::resource_version(current)
                {
                    return Err(ApiError::conflict(&info.group, &info.plural, name, &format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                        meta::resource_version(current)
                    )));
                }
                let decision = delete_decision(info.builtin, current, options);
                if options.dry_run {
                    return Ok(Decision::Keep(current.clone()));
                }
                Ok(decision)
            })?;
        let removed = committed.kind == Some(crate::store::EventType::Deleted);
        if removed && info.builtin == Builtin::CustomResourceDefinition {
            self.remove_instances(&committed.object);
        }
        self.after_write(info, &committed);
        Ok((self.present(info, &committed.object), removed))
    }

    /// Removes every instance of a deleted CRD.
    fn remove_instances(&self, crd: &Value) {
        let group = crd
            .pointer("/spec/group")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let plural = crd
            .pointer("/spec/names/plural")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let key = StorageKey::new(group, plural);
        let (items, _) = self.store.list(&key, None);
        for item in items {
            let _ = self
                .store
                .commit(&key, meta::namespace(&item), meta::name(&item), |current| {
                    Ok(match current {
                        Some(current) => Decision::Remove((**current).clone()),
                        None => Decision::Keep(item.clone()),
                    })
                });
        }
    }

    /// A write by one of the sim's own controllers: `change` edits a copy of the stored object
    /// and says whether it changed anything. No admission or field tracking; deletion completes
    /// when the edit empties the finalizers of a deleting object.
    pub(crate) fn mutate<F>(
        &self,
        key: &StorageKey,
        namespace: &str,
        name: &str,
        change: F,
    ) -> Option<Arc<Value>>
    where
        F: FnOnce(&mut Value) -> bool,
    {
        let builtin = self
            .info_for_storage(key)
            .map_or(Builtin::Unstructured, |info| info.builtin);
        self.store
            .commit(key, namespace, name, |current| {
                let Some(current) = current else {
                    return Err(ApiError::not_found(&key.group, &key.plural, name));
                };
                let mut object = (**current).clone();
                if !change(&mut object) {
                    return Ok(Decision::Keep(current.clone()));
                }
                Ok(if should_remove(builtin, &object) {
                    Decision::Remove(object)
                } else {
                    Decision::Put(object)
                })
            })
            .ok()
            .map(|committed| committed.object)
    }

    /// Stores an object prepared (admitted) elsewhere, with a fresh uid and timestamps, and runs
    /// the kind's after-write work (CRD registration).
    pub(crate) fn create_prepared(
        &self,
        info: &ResourceInfo,
        mut object: Value,
    ) -> ApiResult<Arc<Value>> {
        let now = meta::now();
        if let Some(Value::Array(entries)) = object.pointer_mut("/metadata/managedFields") {
            for entry in entries.iter_mut().filter_map(Value::as_object_mut) {
                entry.insert("time".into(), json!(now));
            }
        }
        let namespace = meta::namespace(&object).to_owned();
        let name = meta::name(&object).to_owned();
        {
            let m = meta::meta_mut(&mut object);
            m.insert("uid".into(), json!(new_uid()));
            m.insert("creationTimestamp".into(), json!(now));
            m.remove("resourceVersion");
        }
        let committed = self
            .store
            .commit(&info.storage(), &namespace, &name, |current| {
                if current.is_some() {
                    return Err(ApiError::already_exists(&info.group, &info.plural, &name));
                }
                Ok(Decision::Put(object))
            })?;
        self.after_write(info, &committed);
        Ok(committed.object)
    }

    /// A create by one of the sim's own controllers (no admission; uid and timestamps set).
    pub(crate) fn create_internal(
        &self,
        info: &ResourceInfo,
        mut object: Value,
    ) -> ApiResult<Arc<Value>> {
        let namespace = meta::namespace(&object).to_owned();
        let name = meta::name(&object).to_owned();
        {
            let m = meta::meta_mut(&mut object);
            m.insert("uid".into(), json!(new_uid()));
            m.insert("creationTimestamp".into(), json!(meta::now()));
            m.insert("generation".into(), json!(1));
        }
        if let Some(map) = object.as_object_mut() {
            map.insert("apiVersion".into(), json!(info.api_version()));
            map.insert("kind".into(), json!(info.kind));
        }
        let stored = Self::to_storage(info, object);
        self.store
            .commit(&info.storage(), &namespace, &name, |current| {
                if current.is_some() {
                    return Err(ApiError::already_exists(&info.group, &info.plural, &name));
                }
                Ok(Decision::Put(stored))
            })
            .map(|committed| committed.object)
    }
}

/// The names a CRD's instances answer to (its `status.acceptedNames`).
fn object_names(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Value {
    serde_json::to_value(&crd.spec.names).unwrap_or_else(|_| json!({}))
}

/// A 422 `Invalid` about one field of `object`.
fn field_error(
    info: &ResourceInfo,
    object: &Value,
    reason: &'static str,
    field: &str,
    message: String,
) -> ApiError {
    ApiError::invalid(
        &info.group,
        &info.kind,
        &info.plural,
        meta::name(object),
        vec![Cause {
            reason,
            message,
            field: field.to_owned(),
        }],
    )
}

/// What a DELETE does to a stored object: remove it now, or mark it deleting (graceful pod
/// termination by the kubelet, finalizers, foreground and orphan propagation).
pub(crate) fn delete_decision(
    builtin: Builtin,
    current: &Value,
    options: &DeleteOptions,
) -> Decision {
    let mut object = current.clone();
    let mut finalizers = meta::finalizers(&object);
    let add = |finalizers: &mut Vec<String>, name: &str| {
        if !finalizers.iter().any(|f| f == name) {
            finalizers.push(name.to_owned());
        }
    };
    match options.propagation {
        Propagation::Foreground => add(&mut finalizers, FOREGROUND),
        Propagation::Orphan => add(&mut finalizers, ORPHAN),
        Propagation::Background => {}
    }
    let already = meta::is_deleting(current);
    let now = meta::now();
    if builtin == Builtin::Namespace {
        meta::set_finalizers(&mut object, &finalizers);
        let m = meta::meta_mut(&mut object);
        if !already {
            m.insert("deletionTimestamp".into(), json!(now));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
        }
        if let Some(status) = object.get_mut("status").and_then(Value::as_object_mut) {
            status.insert("phase".into(), json!("Terminating"));
        }
        return Decision::Put(object);
    }
    if builtin == Builtin::Pod {
        let bound = current
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty());
        let phase = current
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let terminal = matches!(phase, "Succeeded" | "Failed");
        let default_grace = current
            .pointer("/spec/terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(30);
        let grace = options.grace_period.unwrap_or(default_grace).max(0);
        let previous = current
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64);
        // A later delete may shorten the grace period, never lengthen it.
        let grace = previous.map_or(grace, |p| p.min(grace));
        if bound && !terminal && grace > 0 {
            meta::set_finalizers(&mut object, &finalizers);
            let deadline = k8s_openapi::jiff::Timestamp::now()
                + k8s_openapi::jiff::SignedDuration::from_secs(grace);
            let m = meta::meta_mut(&mut object);
            if !already || previous != Some(grace) {
                m.insert(
                    "deletionTimestamp".into(),
                    json!(meta::format_time(deadline)),
                );
            }
            m.insert("deletionGracePeriodSeconds".into(), json!(grace));
            return Decision::Put(object);
        }
        // Unbound, finished or forced: no kubelet confirmation to wait for.
        meta::meta_mut(&mut object).insert("deletionGracePeriodSeconds".into(), json!(0));
    }
    meta::set_finalizers(&mut object, &finalizers);
    if finalizers.is_empty() {
        if !already {
            let m = meta::meta_mut(&mut object);
            m.insert("deletionTimestamp".into(), json!(now));
            m.entry("deletionGracePeriodSeconds").or_insert(json!(0));
        }
        return Decision::Remove(object);
    }
    if already && *current == object {
        return Decision::Keep(Arc::new(object));
    }
    let m = meta::meta_mut(&mut object);
    if !already {
        m.insert("deletionTimestamp".into(), json!(now));
    }
    m.entry("deletionGracePeriodSeconds").or_insert(json!(0));
    Decision::Put(object)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn fresh_objects() -> ApiObjects {
        let objects = ApiObjects::new(1000);
        let namespaces = objects.builtin("", "namespaces").unwrap();
        objects
            .create(
                &namespaces,
                "",
                json!({"metadata": {"name": "default"}}),
                &opts("test"),
            )
            .unwrap();
        let crds = objects
            .builtin("apiextensions.k8s.io", "customresourcedefinitions")
            .unwrap();
        for crd in agent_sandbox_api::crds::all() {
            objects
                .create(&crds, "", serde_json::to_value(crd).unwrap(), &opts("test"))
                .unwrap();
        }
        objects
    }

    fn opts(manager: &str) -> WriteOptions {
        WriteOptions {
            manager: manager.into(),
            ..WriteOptions::default()
        }
    }

    fn sandbox(name: &str) -> Value {
        json!({"apiVersion": agent_sandbox_api::API_VERSION, "kind": agent_sandbox_api::kinds::SANDBOX,
               "metadata": {"name": name},
               "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}})
    }

    fn sandboxes(objects: &ApiObjects) -> Arc<ResourceInfo> {
        objects
            .resource("agents.x-k8s.io", "v1beta1", "sandboxes")
            .unwrap()
    }

    #[test]
    fn create_fills_metadata_and_generate_name() {
        let objects = fresh_objects();
        let info = sandboxes(&objects);
        let mut body = sandbox("");
        body["metadata"] = json!({"generateName": "sb-"});
        let written = objects.create(&info, "default", body, &opts("t")).unwrap();
        let name = meta::name(&written.object);
        assert!(name.starts_with("sb-") && name.len() == 8, "{name}");
        assert_eq!(written.object["metadata"]["generation"], json!(1));
        assert!(!meta::uid(&written.object).is_empty());
        assert!(!meta::resource_version(&written.object).is_empty());
        assert_eq!(written.object["spec"]["operatingMode"], json!("Running"));
        let again = objects
            .create(&info, "default", sandbox(name), &opts("t"))
            .unwrap_err();
        assert_eq!(again.code, 409);
        let missing_ns = objects
            .create(&info, "nope", sandbox("x"), &opts("t"))
            .unwrap_err();
        assert_eq!(missing_ns.code, 404);
    }

    #[test]
    fn a_status_patch_naming_another_uid_is_refused() {
        let objects = fresh_objects();
        let info = sandboxes(&objects);
        let created = objects
            .create(&info, "default", sandbox("s"), &opts("t"))
            .unwrap()
            .object;
        let patch = |uid: &str| {
            objects.patch(
                &info,
                "default",
                "s",
                PatchType::Merge,
                &json!({"metadata": {"uid": uid}, "status": {"serviceFQDN": "s.default.svc"}}),
                Subresource::Status,
                &opts("t"),
            )
        };
        let refused = patch("another-uid").unwrap_err();
        assert_eq!((refused.code, refused.reason), (422, "Invalid"));
        assert!(
            refused.message.contains("metadata.uid"),
            "{}",
            refused.message
        );
        let written = patch(meta::uid(&created)).unwrap().object;
        assert_eq!(written["status"]["serviceFQDN"], json!("s.default.svc"));
    }

    #[test]
    fn stale_resource_versions_conflict_in_updates_and_merge_patches() {
        let objects = fresh_objects();
        let info = sandboxes(&objects);
        let created = objects
            .create(&info, "default", sandbox("s"), &opts("t"))
            .unwrap()
            .object;
        let rv = meta::resource_version(&created).to_owned();
        let mut changed = created.clone();
        changed["spec"]["operatingMode"] = json!("Suspended");
        let updated = objects
            .update(
                &info,
                "default",
                "s",
                changed.clone(),
                Subresource::Main,
                &opts("t"),
            )
            .unwrap()
            .object;
        assert_eq!(updated["metadata"]["generation"], json!(2));
        let stale = objects
            .update(
                &info,
                "default",
                "s",
                changed,
                Subresource::Main,
                &opts("t"),
            )
            .unwrap_err();
        assert_eq!((stale.code, stale.reason), (409, "Conflict"));
        let patch =
            json!({"metadata": {"resourceVersion": rv}, "spec": {"operatingMode": "Running"}});
        let stale_patch = objects
            .patch(
                &info,
                "default",
                "s",
                PatchType::Merge,
                &patch,
                Subresource::Main,
                &opts("t"),
            )
            .unwrap_err();
        assert_eq!(stale_patch.code, 409);
    }

    #[test]
    fn status_is_a_separate_subresource_and_does_not_bump_generation() {
        let objects = fresh_objects();
        let info = sandboxes(&objects);
        objects
            .create(&info, "default", sandbox("s"), &opts("t"))
            .unwrap();
        let main = objects
            .patch(
                &info,
                "default",
                "s",
                PatchType::Merge,
                &json!({"status": {"serviceFQDN": "s.default.svc"}}),
                Subresource::Main,
                &opts("t"),
            )
            .unwrap()
            .object;
        assert!(main.get("status").is_none());
        let status = objects
            .patch(
                &info,
                "default",
                "s",
                PatchType::Merge,
                &json!({"status": {"serviceFQDN": "x"}, "spec": {"operatingMode": "Suspended"}}),
                Subresource::Status,
                &opts("t"),
            )
            .unwrap()
            .object;
        assert_eq!(status["status"]["serviceFQDN"], json!("x"));
        assert_eq!(status["spec"]["operatingMode"], json!("Running"));
        assert_eq!(status["metadata"]["generation"], json!(1));
    }

    #[test]
    fn no_op_writes_keep_the_resource_version() {
        let objects = fresh_objects();
        let info = sandboxes(&objects);
        let created = objects
            .create(&info, "default", sandbox("s"), &opts("t"))
            .unwrap()
            .object;
        let same = objects
            .patch(
                &info,
                "default",
                "s",
                PatchType::Merge,
                &json!({"spec": {"operatingMode": "Running"}}),
                Subresource::Main,
                &opts("t"),
            )
            .unwrap()
            .object;
        assert_eq!(
            meta::resource_version(&same),
            meta::resource_version(&created)
        );
    }

    #[test]
    fn finalizers_hold_deletion_until_removed() {
        let objects = fresh_objects();
        let info = sandboxes(&objects);
        let mut body = sandbox("s");
        body["metadata"]["finalizers"] = json!(["example.com/hold"]);
        objects.create(&info, "default", body, &opts("t")).unwrap();
        let (object, removed) = objects
            .delete(&info, "default", "s", &DeleteOptions::default())
            .unwrap();
        assert!(!removed);
        assert!(meta::is_deleting(&object));
        let adding = objects
            .patch(
                &info,
                "default",
                "s",
                PatchType::Merge,
                &json!({"metadata": {"finalizers": ["example.com/hold", "new"]}}),
                Subresource::Main,
                &opts("t"),
            )
            .unwrap_err();
        assert_eq!(adding.code, 422);
        objects
            .patch(
                &info,
                "default",
                "s",
                PatchType::Json,
                &json!([{"op": "remove", "path": "/metadata/finalizers/0"}]),
                Subresource::Main,
                &opts("t"),
            )
            .unwrap();
        assert_eq!(objects.get(&info, "default", "s").unwrap_err().code, 404);
    }

    #[test]
    fn server_side_apply_creates_updates_and_conflicts() {
        let objects = fresh_objects();
        let info = sandboxes(&objects);
        let mut config = sandbox("s");
        config["metadata"]["labels"] = json!({"a": "1"});
        config["spec"]["operatingMode"] = json!("Running");
        let mut force = opts("ctrl");
        force.force = true;
        let created = objects
            .apply(&info, "default", "s", &config, Subresource::Main, &force)
            .unwrap();
        assert_eq!(created.object["metadata"]["labels"], json!({"a": "1"}));
        config["metadata"]["labels"] = json!({});
        let removed = objects
            .apply(&info, "default", "s", &config, Subresource::Main, &force)
            .unwrap();
        assert!(
            removed.object["metadata"]
                .get("labels")
                .is_none_or(|l| l == &json!({}))
        );
        let mut other = sandbox("s");
        other["spec"]["operatingMode"] = json!("Suspended");
        let conflict = objects
            .apply(
                &info,
                "default",
                "s",
                &other,
                Subresource::Main,
                &opts("someone-else"),
            )
            .unwrap_err();
        assert_eq!(conflict.code, 409);
        assert!(
            conflict.message.contains("conflict with \"ctrl\""),
            "{}",
            conflict.message
        );
        let status = json!({"apiVersion": agent_sandbox_api::API_VERSION, "kind": agent_sandbox_api::kinds::SANDBOX,
                            "status": {"serviceFQDN": "s.default.svc"}});
        let applied = objects
            .apply(&info, "default", "s", &status, Subresource::Status, &force)
            .unwrap();
        assert_eq!(
            applied.object["status"]["serviceFQDN"],
            json!("s.default.svc")
        );
    }

    #[test]
    fn scale_subresource_reads_and_writes_the_crd_paths() {
        let objects = fresh_objects();
        let pools = objects
            .resource("extensions.agents.x-k8s.io", "v1beta1", "sandboxwarmpools")
            .unwrap();
        let pool = json!({"metadata": {"name": "p"}, "spec": {"replicas": 1, "sandboxTemplateRef": {"name": "t"}}});
        objects.create(&pools, "default", pool, &opts("t")).unwrap();
        let scale = objects.get_scale(&pools, "default", "p").unwrap();
        assert_eq!(scale["spec"]["replicas"], json!(1));
        let written = objects
            .patch(
                &pools,
                "default",
                "p",
                PatchType::Merge,
                &json!({"spec": {"replicas": 3}}),
                Subresource::Scale,
                &opts("kubectl"),
            )
            .unwrap();
        assert_eq!(written.object["spec"]["replicas"], json!(3));
        assert_eq!(written.object["metadata"]["generation"], json!(2));
    }

    #[test]
    fn strategic_merge_is_refused_for_custom_resources() {
        let objects = fresh_objects();
        let info = sandboxes(&objects);
        objects
            .create(&info, "default", sandbox("s"), &opts("t"))
            .unwrap();
        let error = objects
            .patch(
                &info,
                "default",
                "s",
                PatchType::Strategic,
                &json!({}),
                Subresource::Main,
                &opts("t"),
            )
            .unwrap_err();
        assert_eq!(error.code, 415);
    }

    #[test]
    fn events_are_shared_between_the_two_apis() {
        let objects = fresh_objects();
        let v1 = objects.resource("events.k8s.io", "v1", "events").unwrap();
        let core = objects.resource("", "v1", "events").unwrap();
        let event = json!({"metadata": {"name": "e"}, "regarding": {"kind": "Pod", "name": "p"},
                           "note": "hello", "reason": "R", "type": "Normal",
                           "eventTime": "2024-01-01T00:00:00.000000Z",
                           "reportingController": "c", "reportingInstance": "i", "action": "A"});
        objects.create(&v1, "default", event, &opts("t")).unwrap();
        let stored = objects.get(&core, "default", "e").unwrap();
        assert_eq!(stored["message"], json!("hello"));
        assert_eq!(stored["involvedObject"]["name"], json!("p"));
        assert_eq!(
            objects.get(&v1, "default", "e").unwrap()["note"],
            json!("hello")
        );
    }

    #[test]
    fn uids_are_version_4() {
        let uid = new_uid();
        assert_eq!(uid.len(), 36);
        assert_eq!(&uid[14..15], "4");
        assert!(matches!(&uid[19..20], "8" | "9" | "a" | "b"));
    }
}
