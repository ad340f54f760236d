//! What the API server does to an object before storing it (sans IO): fill `apiVersion`/`kind`,
//! decode built-in kinds through their typed schema (dropping or rejecting unknown fields per
//! `fieldValidation`), apply CRD schemas (pruning, defaults, validation) and built-in defaults,
//! and validate names, labels and the fields our components rely on.

use agent_sandbox_api::names::{is_dns_label, is_dns_subdomain, is_label_value};
use agent_sandbox_api::schema::{self, FieldErrorKind};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use crate::api_error::{ApiError, ApiResult, Cause};
use crate::meta;
use crate::resources::{Builtin, ResourceInfo};

/// `fieldValidation` of a write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum FieldValidation {
    /// Drop unknown fields silently.
    Ignore,
    /// Drop unknown fields with a `Warning` header each (the API server's default).
    #[default]
    Warn,
    /// Reject unknown fields with 400.
    Strict,
}

impl FieldValidation {
    /// Parses the query parameter (absent or unknown → `Warn`).
    pub(crate) fn parse(text: Option<&str>) -> Self {
        match text {
            Some("Ignore") => Self::Ignore,
            Some("Strict") => Self::Strict,
            _ => Self::Warn,
        }
    }
}

/// Drops the object fields set to `null` whose schema is not `nullable`, as the API server does
/// for custom resources before defaulting (`image: null` in a pod template is left out, not
/// refused). Nulls inside lists are kept (and fail validation), as there.
fn drop_null_fields(schema: &JSONSchemaProps, value: &mut Value) {
    match value {
        Value::Object(map) => {
            let properties = schema.properties.as_ref();
            let values = match &schema.additional_properties {
                Some(JSONSchemaPropsOrBool::Schema(values)) => Some(values.as_ref()),
                _ => None,
            };
            map.retain(|key, child| {
                let child_schema = properties.and_then(|p| p.get(key)).or(values);
                !child.is_null() || child_schema.is_some_and(|s| s.nullable == Some(true))
            });
            for (key, child) in map.iter_mut() {
                if let Some(child_schema) = properties.and_then(|p| p.get(key)).or(values) {
                    drop_null_fields(child_schema, child);
                }
            }
        }
        Value::Array(items) => {
            if let Some(JSONSchemaPropsOrArray::Schema(item_schema)) = &schema.items {
                for item in items {
                    drop_null_fields(item_schema, item);
                }
            }
        }
        _ => {}
    }
}

fn typed<T: DeserializeOwned + Serialize>(value: &Value) -> Result<Value, serde_json::Error> {
    let decoded: T = serde_json::from_value(value.clone())?;
    serde_json::to_value(decoded)
}

/// Decodes and re-encodes a built-in object through its k8s-openapi type.
fn round_trip(builtin: Builtin, value: &Value) -> Option<Result<Value, serde_json::Error>> {
    use k8s_openapi::api::{apps, coordination, core, discovery, events, networking};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions;
    Some(match builtin {
        Builtin::Namespace => typed::<core::v1::Namespace>(value),
        Builtin::Pod => typed::<core::v1::Pod>(value),
        Builtin::Service => typed::<core::v1::Service>(value),
        Builtin::PersistentVolumeClaim => typed::<core::v1::PersistentVolumeClaim>(value),
        Builtin::Event => typed::<core::v1::Event>(value),
        Builtin::EventV1 => typed::<events::v1::Event>(value),
        Builtin::ConfigMap => typed::<core::v1::ConfigMap>(value),
        Builtin::Secret => typed::<core::v1::Secret>(value),
        Builtin::ServiceAccount => typed::<core::v1::ServiceAccount>(value),
        Builtin::Node => typed::<core::v1::Node>(value),
        Builtin::NetworkPolicy => typed::<networking::v1::NetworkPolicy>(value),
        Builtin::EndpointSlice => typed::<discovery::v1::EndpointSlice>(value),
        Builtin::Lease => typed::<coordination::v1::Lease>(value),
        Builtin::Deployment => typed::<apps::v1::Deployment>(value),
        Builtin::ReplicaSet => typed::<apps::v1::ReplicaSet>(value),
        Builtin::CustomResourceDefinition => {
            typed::<apiextensions::v1::CustomResourceDefinition>(value)
        }
        Builtin::Unstructured | Builtin::Custom => return None,
    })
}

/// Paths present (and not null) in `original` but absent from `decoded`.
fn dropped_fields(original: &Value, decoded: &Value, path: &str, out: &mut Vec<String>) {
    match (original, decoded) {
        (Value::Object(left), Value::Object(right)) => {
            for (key, value) in left {
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match right.get(key) {
                    Some(other) => dropped_fields(value, other, &child, out),
                    None if !value.is_null() => out.push(child),
                    None => {}
                }
            }
        }
        (Value::Array(left), Value::Array(right)) => {
            for (index, (l, r)) in left.iter().zip(right).enumerate() {
                dropped_fields(l, r, &format!("{path}[{index}]"), out);
            }
        }
        _ => {}
    }
}

/// Outcome of admission: the object to store and the warnings to send.
#[derive(Debug)]
pub(crate) struct Admitted {
    pub(crate) object: Value,
    pub(crate) warnings: Vec<String>,
}

fn unknown_fields_error(info: &ResourceInfo, unknown: &[String]) -> ApiError {
    let list: Vec<String> = unknown
        .iter()
        .map(|path| format!("unknown field \"{path}\""))
        .collect();
    ApiError::bad_request(format!(
        "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
        info.kind,
        info.version,
        info.kind,
        list.join(", ")
    ))
}

/// Decodes, prunes, defaults and validates `object` for `info`.
pub(crate) fn admit(
    info: &ResourceInfo,
    mut object: Value,
    validation: FieldValidation,
) -> ApiResult<Admitted> {
    let Value::Object(map) = &mut object else {
        return Err(ApiError::bad_request(format!(
            "the body of a {} must be a JSON object",
            info.kind
        )));
    };
    map.insert("apiVersion".into(), json!(info.api_version()));
    map.insert("kind".into(), json!(info.kind));
    if !map.get("metadata").is_some_and(Value::is_object) {
        map.insert("metadata".into(), Value::Object(Map::new()));
    }
    let mut warnings = Vec::new();
    let mut unknown = Vec::new();
    if let Some(decoded) = round_trip(info.builtin, &object) {
        let decoded = decoded.map_err(|error| {
            ApiError::bad_request(format!(
                "{} in version \"{}\" cannot be handled as a {}: {error}",
                info.kind, info.version, info.kind
            ))
        })?;
        dropped_fields(&object, &decoded, "", &mut unknown);
        object = decoded;
    }
    if let Some(schema_props) = &info.schema {
        drop_null_fields(schema_props, &mut object);
        let errors = schema::validate(schema_props, &object);
        unknown.extend(
            errors
                .iter()
                .filter(|e| e.kind == FieldErrorKind::Unknown)
                .map(|e| e.path.clone()),
        );
        schema::prune(schema_props, &mut object);
        schema::apply_defaults(schema_props, &mut object);
    }
    if !unknown.is_empty() {
        match validation {
            FieldValidation::Strict => return Err(unknown_fields_error(info, &unknown)),
            FieldValidation::Warn => {
                warnings.extend(
                    unknown
                        .iter()
                        .map(|path| format!("unknown field \"{path}\"")),
                );
            }
            FieldValidation::Ignore => {}
        }
    }
    apply_builtin_defaults(info.builtin, &mut object);
    let mut causes = validate_metadata(info, &object);
    if let Some(schema_props) = &info.schema {
        causes.extend(
            schema::validate(schema_props, &object)
                .into_iter()
                .filter(|e| e.kind != FieldErrorKind::Unknown)
                .map(|e| Cause {
                    reason: match e.kind {
                        FieldErrorKind::Required => "FieldValueRequired",
                        FieldErrorKind::NotSupported { .. } => "FieldValueNotSupported",
                        FieldErrorKind::Type { .. } => "FieldValueTypeInvalid",
                        _ => "FieldValueInvalid",
                    },
                    message: e.to_string(),
                    field: e.path.clone(),
                }),
        );
    }
    causes.extend(validate_builtin(info.builtin, &object));
    if !causes.is_empty() {
        return Err(ApiError::invalid(
            &info.group,
            &info.kind,
            &info.plural,
            meta::name(&object),
            causes,
        ));
    }
    Ok(Admitted { object, warnings })
}

/// Checks the CRD schema's CEL rules (`x-kubernetes-validations`) of an admitted custom resource,
/// with the stored object as `oldSelf` on updates.
pub(crate) fn check_rules(
    info: &ResourceInfo,
    object: &Value,
    old: Option<&Value>,
) -> ApiResult<()> {
    let Some(schema_props) = &info.schema else {
        return Ok(());
    };
    let causes = crate::validation_rules::check(schema_props, object, old);
    if causes.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid(
        &info.group,
        &info.kind,
        &info.plural,
        meta::name(object),
        causes,
    ))
}

/// Drops (or under `Strict` rejects) the unknown fields of a server-side apply configuration,
/// which is partial and so is not validated or defaulted here.
pub(crate) fn prune_config(
    info: &ResourceInfo,
    mut config: Value,
    validation: FieldValidation,
) -> ApiResult<(Value, Vec<String>)> {
    let mut unknown = Vec::new();
    // A partial configuration may lack fields the typed decoder requires; then it is kept as is.
    if let Some(Ok(decoded)) = round_trip(info.builtin, &config) {
        dropped_fields(&config, &decoded, "", &mut unknown);
        config = decoded;
    }
    if let Some(schema_props) = &info.schema {
        drop_null_fields(schema_props, &mut config);
        unknown.extend(
            schema::validate(schema_props, &config)
                .into_iter()
                .filter(|e| e.kind == FieldErrorKind::Unknown)
                .map(|e| e.path),
        );
        schema::prune(schema_props, &mut config);
    }
    let mut warnings = Vec::new();
    if !unknown.is_empty() {
        match validation {
            FieldValidation::Strict => return Err(unknown_fields_error(info, &unknown)),
            FieldValidation::Warn => {
                warnings.extend(
                    unknown
                        .iter()
                        .map(|path| format!("unknown field \"{path}\"")),
                );
            }
            FieldValidation::Ignore => {}
        }
    }
    Ok((config, warnings))
}

fn set_default(map: &mut Map<String, Value>, key: &str, value: Value) {
    map.entry(key.to_owned()).or_insert(value);
}

fn object_at<'a>(value: &'a mut Value, key: &str) -> Option<&'a mut Map<String, Value>> {
    value.get_mut(key).and_then(Value::as_object_mut)
}

fn default_container(container: &mut Value) {
    let Some(map) = container.as_object_mut() else {
        return;
    };
    let image = map.get("image").and_then(Value::as_str).unwrap_or_default();
    let tag = image.rsplit('/').next().unwrap_or_default();
    let latest = !tag.contains(':') || tag.ends_with(":latest");
    let pull = if latest && !image.contains('@') {
        "Always"
    } else {
        "IfNotPresent"
    };
    set_default(map, "imagePullPolicy", json!(pull));
    set_default(map, "terminationMessagePath", json!("/dev/termination-log"));
    set_default(map, "terminationMessagePolicy", json!("File"));
    set_default(map, "resources", json!({}));
    if let Some(Value::Array(ports)) = map.get_mut("ports") {
        for port in ports.iter_mut().filter_map(Value::as_object_mut) {
            set_default(port, "protocol", json!("TCP"));
        }
    }
    for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
        if let Some(probe) = map.get_mut(probe).and_then(Value::as_object_mut) {
            set_default(probe, "timeoutSeconds", json!(1));
            set_default(probe, "periodSeconds", json!(10));
            set_default(probe, "successThreshold", json!(1));
            set_default(probe, "failureThreshold", json!(3));
            if let Some(http) = probe.get_mut("httpGet").and_then(Value::as_object_mut) {
                set_default(http, "scheme", json!("HTTP"));
                set_default(http, "path", json!("/"));
            }
        }
    }
}

/// The defaults the API server's built-in defaulters set (the subset our components see).
/// The pod spec defaults (of a Pod, or of a workload's pod template).
fn default_pod_spec(spec: &mut Map<String, Value>) {
    set_default(spec, "restartPolicy", json!("Always"));
    set_default(spec, "terminationGracePeriodSeconds", json!(30));
    set_default(spec, "dnsPolicy", json!("ClusterFirst"));
    set_default(spec, "schedulerName", json!("default-scheduler"));
    set_default(spec, "securityContext", json!({}));
    for list in ["containers", "initContainers"] {
        if let Some(Value::Array(containers)) = spec.get_mut(list) {
            containers.iter_mut().for_each(default_container);
        }
    }
}

/// The defaults of `apps/v1` Deployments and ReplicaSets.
fn default_workload(builtin: Builtin, object: &mut Value) {
    let Some(spec) = object_at(object, "spec") else {
        return;
    };
    set_default(spec, "replicas", json!(1));
    if builtin == Builtin::Deployment {
        set_default(spec, "revisionHistoryLimit", json!(10));
        set_default(spec, "progressDeadlineSeconds", json!(600));
        let strategy = spec
            .entry("strategy")
            .or_insert_with(|| json!({"type": "RollingUpdate"}));
        if let Some(strategy) = strategy.as_object_mut() {
            set_default(strategy, "type", json!("RollingUpdate"));
            if strategy.get("type") == Some(&json!("RollingUpdate")) {
                let rolling = strategy.entry("rollingUpdate").or_insert_with(|| json!({}));
                if let Some(rolling) = rolling.as_object_mut() {
                    set_default(rolling, "maxUnavailable", json!("25%"));
                    set_default(rolling, "maxSurge", json!("25%"));
                }
            }
        }
    }
    if let Some(template) = spec.get_mut("template").and_then(Value::as_object_mut)
        && let Some(pod) = template.get_mut("spec").and_then(Value::as_object_mut)
    {
        default_pod_spec(pod);
    }
}

fn apply_builtin_defaults(builtin: Builtin, object: &mut Value) {
    match builtin {
        Builtin::Deployment | Builtin::ReplicaSet => default_workload(builtin, object),
        Builtin::Pod => {
            if let Some(spec) = object_at(object, "spec") {
                set_default(spec, "restartPolicy", json!("Always"));
                set_default(spec, "terminationGracePeriodSeconds", json!(30));
                set_default(spec, "dnsPolicy", json!("ClusterFirst"));
                set_default(spec, "schedulerName", json!("default-scheduler"));
                set_default(spec, "securityContext", json!({}));
                set_default(spec, "enableServiceLinks", json!(true));
                set_default(spec, "priority", json!(0));
                let account = spec
                    .get("serviceAccountName")
                    .cloned()
                    .unwrap_or_else(|| json!("default"));
                set_default(spec, "serviceAccountName", account.clone());
                set_default(spec, "serviceAccount", account);
                for list in ["containers", "initContainers"] {
                    if let Some(Value::Array(containers)) = spec.get_mut(list) {
                        containers.iter_mut().for_each(default_container);
                    }
                }
            }
            let map = object.as_object_mut();
            if let Some(map) = map {
                let status = map.entry("status").or_insert_with(|| json!({}));
                if let Some(status) = status.as_object_mut() {
                    set_default(status, "phase", json!("Pending"));
                    set_default(status, "qosClass", json!("BestEffort"));
                }
            }
        }
        Builtin::Service => {
            if let Some(spec) = object_at(object, "spec") {
                set_default(spec, "type", json!("ClusterIP"));
                set_default(spec, "sessionAffinity", json!("None"));
                set_default(spec, "internalTrafficPolicy", json!("Cluster"));
                set_default(spec, "ipFamilies", json!(["IPv4"]));
                set_default(spec, "ipFamilyPolicy", json!("SingleStack"));
                if let Some(Value::Array(ports)) = spec.get_mut("ports") {
                    for port in ports.iter_mut().filter_map(Value::as_object_mut) {
                        set_default(port, "protocol", json!("TCP"));
                        if let Some(number) = port.get("port").cloned() {
                            set_default(port, "targetPort", number);
                        }
                    }
                }
            }
            if let Some(map) = object.as_object_mut() {
                map.entry("status")
                    .or_insert_with(|| json!({"loadBalancer": {}}));
            }
        }
        Builtin::Namespace => {
            let name = meta::name(object).to_owned();
            let labels = meta::meta_mut(object)
                .entry("labels")
                .or_insert_with(|| json!({}));
            if let Some(labels) = labels.as_object_mut() {
                labels.insert(
                    agent_sandbox_api::labels::NAMESPACE_NAME.to_owned(),
                    json!(name),
                );
            }
            if let Some(map) = object.as_object_mut() {
                map.entry("spec")
                    .or_insert_with(|| json!({"finalizers": ["kubernetes"]}));
                let status = map.entry("status").or_insert_with(|| json!({}));
                if let Some(status) = status.as_object_mut() {
                    set_default(status, "phase", json!("Active"));
                }
            }
        }
        Builtin::Secret => {
            if let Some(map) = object.as_object_mut() {
                set_default(map, "type", json!("Opaque"));
                if let Some(Value::Object(string_data)) = map.remove("stringData") {
                    use base64::Engine as _;
                    let data = map.entry("data").or_insert_with(|| json!({}));
                    if let Some(data) = data.as_object_mut() {
                        for (key, value) in string_data {
                            let text = value.as_str().unwrap_or_default();
                            data.insert(
                                key,
                                json!(base64::engine::general_purpose::STANDARD.encode(text)),
                            );
                        }
                    }
                }
            }
        }
        Builtin::PersistentVolumeClaim => {
            if let Some(spec) = object_at(object, "spec") {
                set_default(spec, "volumeMode", json!("Filesystem"));
            }
            if let Some(map) = object.as_object_mut() {
                map.entry("status")
                    .or_insert_with(|| json!({"phase": "Pending"}));
            }
        }
        _ => {}
    }
}

fn validate_metadata(info: &ResourceInfo, object: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let name = meta::name(object);
    let label_only = matches!(info.builtin, Builtin::Namespace | Builtin::Service);
    let valid = if label_only {
        is_dns_label(name)
    } else {
        is_dns_subdomain(name)
    };
    if name.is_empty() {
        causes.push(Cause {
            reason: "FieldValueRequired",
            message: "name or generateName is required".into(),
            field: "metadata.name".into(),
        });
    } else if !valid {
        causes.push(Cause {
            reason: "FieldValueInvalid",
            message: format!(
                "Invalid value: \"{name}\": a lowercase RFC 1123 {} must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
                if label_only { "label" } else { "subdomain" }
            ),
            field: "metadata.name".into(),
        });
    }
    for (key, value) in meta::labels(object) {
        if !is_label_value(&value) {
            causes.push(Cause {
                reason: "FieldValueInvalid",
                message: format!("Invalid value: \"{value}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"),
                field: format!("metadata.labels.{key}"),
            });
        }
    }
    causes
}

fn validate_builtin(builtin: Builtin, object: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    if builtin == Builtin::NetworkPolicy {
        validate_ip_blocks(object, &mut causes);
    }
    if matches!(builtin, Builtin::Deployment | Builtin::ReplicaSet) {
        validate_workload(object, &mut causes);
    }
    if builtin == Builtin::Pod {
        let containers = object.pointer("/spec/containers").and_then(Value::as_array);
        match containers {
            None => causes.push(Cause {
                reason: "FieldValueRequired",
                message: "Required value".into(),
                field: "spec.containers".into(),
            }),
            Some(list) if list.is_empty() => causes.push(Cause {
                reason: "FieldValueRequired",
                message: "Required value".into(),
                field: "spec.containers".into(),
            }),
            Some(_) => {}
        }
        for list in ["containers", "initContainers"] {
            let items = object
                .pointer(&format!("/spec/{list}"))
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let mut seen = Vec::new();
            for (index, container) in items.iter().enumerate() {
                let name = container
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if !is_dns_label(name) {
                    causes.push(Cause {
                        reason: "FieldValueRequired",
                        message: "Required value".into(),
                        field: format!("spec.{list}[{index}].name"),
                    });
                } else if seen.contains(&name) {
                    causes.push(Cause {
                        reason: "FieldValueDuplicate",
                        message: format!("Duplicate value: \"{name}\""),
                        field: format!("spec.{list}[{index}].name"),
                    });
                }
                seen.push(name);
                if container
                    .get("image")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    causes.push(Cause {
                        reason: "FieldValueRequired",
                        message: "Required value".into(),
                        field: format!("spec.{list}[{index}].image"),
                    });
                }
            }
        }
        let policy = object
            .pointer("/spec/restartPolicy")
            .and_then(Value::as_str)
            .unwrap_or("Always");
        if !matches!(policy, "Always" | "OnFailure" | "Never") {
            causes.push(Cause {
                reason: "FieldValueNotSupported",
                message: format!("Unsupported value: \"{policy}\": supported values: \"Always\", \"OnFailure\", \"Never\""),
                field: "spec.restartPolicy".into(),
            });
        }
    }
    causes
}

/// A Deployment's or ReplicaSet's selector: required, not empty, and selecting its template.
fn validate_workload(object: &Value, causes: &mut Vec<Cause>) {
    let selector = object.pointer("/spec/selector");
    let empty = selector.is_none_or(|s| crate::workloads::selector_string(s).is_empty());
    if empty {
        causes.push(Cause {
            reason: "FieldValueRequired",
            message: "Required value".into(),
            field: "spec.selector".into(),
        });
    } else if !crate::workloads::selector_matches_template(object) {
        let labels = object
            .pointer("/spec/template/metadata/labels")
            .and_then(Value::as_object)
            .map(|map| {
                map.iter()
                    .map(|(k, v)| format!("{k:?}:{:?}", v.as_str().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        causes.push(Cause {
            reason: "FieldValueInvalid",
            message: format!(
                "Invalid value: map[string]string{{{labels}}}: `selector` does not match template `labels`"
            ),
            field: "spec.template.metadata.labels".into(),
        });
    }
    let containers = object
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array);
    if containers.is_none_or(Vec::is_empty) {
        causes.push(Cause {
            reason: "FieldValueRequired",
            message: "Required value".into(),
            field: "spec.template.spec.containers".into(),
        });
    }
}

/// A CIDR as the API server parses one: an address and a prefix length within its family.
fn parse_cidr(text: &str) -> Option<(std::net::IpAddr, u8)> {
    let (address, prefix) = text.split_once('/')?;
    let address: std::net::IpAddr = address.parse().ok()?;
    let prefix: u8 = prefix.parse().ok()?;
    let bits = if address.is_ipv4() { 32 } else { 128 };
    (prefix <= bits).then_some((address, prefix))
}

/// The address as 128 bits (IPv4 in the low 32) and its family's width.
fn bits_of(address: std::net::IpAddr) -> (u128, u32) {
    match address {
        std::net::IpAddr::V4(v4) => (u128::from(u32::from(v4)), 32),
        std::net::IpAddr::V6(v6) => (u128::from(v6), 128),
    }
}

/// Whether `inner` lies inside `outer` and is smaller: same family, a longer prefix, and the
/// same leading bits.
fn strict_subset(outer: (std::net::IpAddr, u8), inner: (std::net::IpAddr, u8)) -> bool {
    let ((outer_bits, width), (inner_bits, inner_width)) = (bits_of(outer.0), bits_of(inner.0));
    if width != inner_width || inner.1 <= outer.1 {
        return false;
    }
    let shift = width - u32::from(outer.1);
    outer_bits.checked_shr(shift).unwrap_or(0) == inner_bits.checked_shr(shift).unwrap_or(0)
}

fn ipv4_mapped(address: std::net::IpAddr) -> bool {
    matches!(address, std::net::IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some())
}

/// `text` parsed as an `ipBlock` CIDR, or a cause saying why it is not one.
fn checked_cidr(
    field: String,
    text: &str,
    causes: &mut Vec<Cause>,
) -> Option<(std::net::IpAddr, u8)> {
    let parsed = parse_cidr(text);
    let message = match parsed {
        None => "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
        Some((address, _)) if ipv4_mapped(address) => "must not have an IPv4-mapped IPv6 address",
        Some(_) => return parsed,
    };
    causes.push(Cause {
        reason: "FieldValueInvalid",
        message: format!("Invalid value: \"{text}\": {message}"),
        field,
    });
    None
}

/// `ipBlock` peers of a NetworkPolicy, checked as the API server checks them: `cidr` and every
/// `except` entry a valid CIDR without an IPv4-mapped IPv6 address, and every `except` entry a
/// strict subset of `cidr`.
fn validate_ip_blocks(object: &Value, causes: &mut Vec<Cause>) {
    for (direction, peers) in [("ingress", "from"), ("egress", "to")] {
        let rules = object
            .pointer(&format!("/spec/{direction}"))
            .and_then(Value::as_array);
        for (r, rule) in rules.into_iter().flatten().enumerate() {
            let list = rule.get(peers).and_then(Value::as_array);
            for (p, peer) in list.into_iter().flatten().enumerate() {
                let Some(block) = peer.get("ipBlock") else {
                    continue;
                };
                let at = format!("spec.{direction}[{r}].{peers}[{p}].ipBlock");
                let cidr_text = block
                    .get("cidr")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let cidr = checked_cidr(format!("{at}.cidr"), cidr_text, causes);
                let excepts = block.get("except").and_then(Value::as_array);
                for (e, except) in excepts.into_iter().flatten().enumerate() {
                    let text = except.as_str().unwrap_or_default();
                    let field = format!("{at}.except[{e}]");
                    let parsed = checked_cidr(field.clone(), text, causes);
                    if let (Some(cidr), Some(parsed)) = (cidr, parsed)
                        && !strict_subset(cidr, parsed)
                    {
                        causes.push(Cause {
                            reason: "FieldValueInvalid",
                            message: format!(
                                "Invalid value: \"{text}\": must be a strict subset of `cidr`"
                            ),
                            field,
                        });
                    }
                }
            }
        }
    }
}

/// Pod spec fields an update may change (the API server forbids everything else).
fn mutable_pod_spec(spec: &Value) -> Value {
    let mut spec = spec.clone();
    if let Some(map) = spec.as_object_mut() {
        map.remove("activeDeadlineSeconds");
        map.remove("tolerations");
        map.remove("terminationGracePeriodSeconds");
        for list in ["containers", "initContainers"] {
            if let Some(Value::Array(items)) = map.get_mut(list) {
                for item in items.iter_mut().filter_map(Value::as_object_mut) {
                    item.remove("image");
                }
            }
        }
    }
    spec
}

/// Checks an update of the main resource against the fields the API server makes immutable.
pub(crate) fn validate_update(info: &ResourceInfo, old: &Value, new: &Value) -> ApiResult<()> {
    let name = meta::name(new);
    let forbid = |field: &str, message: &str| {
        Err(ApiError::invalid(
            &info.group,
            &info.kind,
            &info.plural,
            name,
            vec![Cause {
                reason: "FieldValueForbidden",
                message: message.to_owned(),
                field: field.to_owned(),
            }],
        ))
    };
    match info.builtin {
        Builtin::Pod => {
            let empty = Value::Null;
            let old_spec = old.get("spec").unwrap_or(&empty);
            let new_spec = new.get("spec").unwrap_or(&empty);
            let mut old_cmp = mutable_pod_spec(old_spec);
            let new_cmp = mutable_pod_spec(new_spec);
            // The scheduler's binding sets nodeName once; a client echoing it back is fine.
            if old_cmp.get("nodeName").is_none()
                && let (Some(map), Some(node)) = (old_cmp.as_object_mut(), new_cmp.get("nodeName"))
            {
                map.insert("nodeName".into(), node.clone());
            }
            if old_cmp != new_cmp {
                return forbid(
                    "spec",
                    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
                );
            }
        }
        Builtin::Service => {
            let old_ip = old.pointer("/spec/clusterIP");
            let new_ip = new.pointer("/spec/clusterIP");
            if old_ip.is_some() && new_ip.is_some() && old_ip != new_ip {
                return forbid("spec.clusterIP", "Invalid value: field is immutable");
            }
        }
        Builtin::Deployment | Builtin::ReplicaSet
            if old.pointer("/spec/selector") != new.pointer("/spec/selector") =>
        {
            let selector = new
                .pointer("/spec/selector")
                .map(crate::workloads::selector_string)
                .unwrap_or_default();
            return forbid(
                "spec.selector",
                &format!("Invalid value: \"{selector}\": field is immutable"),
            );
        }
        Builtin::CustomResourceDefinition
            if old.pointer("/spec/group") != new.pointer("/spec/group")
                || old.pointer("/spec/names/plural") != new.pointer("/spec/names/plural") =>
        {
            return forbid("spec.group", "Invalid value: field is immutable");
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;
    use pretty_assertions::assert_eq;

    fn info(group: &str, plural: &str) -> std::sync::Arc<ResourceInfo> {
        let mut registry = Registry::with_builtins();
        for crd in agent_sandbox_api::crds::all() {
            registry.register_crd(&crd).unwrap();
        }
        let version = if group.contains("agents") {
            "v1beta1"
        } else {
            "v1"
        };
        registry.get(group, version, plural).unwrap()
    }

    #[test]
    fn pods_get_defaults_and_unknown_fields_follow_field_validation() {
        let pods = info("", "pods");
        let pod = json!({"metadata": {"name": "p"},
                         "spec": {"containers": [{"name": "c", "image": "img:1", "bogus": 1}]}});
        let admitted = admit(&pods, pod.clone(), FieldValidation::Warn).unwrap();
        assert_eq!(
            admitted.warnings,
            vec!["unknown field \"spec.containers[0].bogus\""]
        );
        assert_eq!(admitted.object["spec"]["restartPolicy"], json!("Always"));
        assert_eq!(
            admitted.object["spec"]["containers"][0]["imagePullPolicy"],
            json!("IfNotPresent")
        );
        assert_eq!(admitted.object["kind"], json!("Pod"));
        assert!(
            admitted.object["spec"]["containers"][0]
                .get("bogus")
                .is_none()
        );
        let strict = admit(&pods, pod, FieldValidation::Strict).unwrap_err();
        assert_eq!(strict.code, 400);
        assert!(
            strict
                .message
                .contains("strict decoding error: unknown field \"spec.containers[0].bogus\"")
        );
    }

    #[test]
    fn pods_without_containers_are_invalid() {
        let error = admit(
            &info("", "pods"),
            json!({"metadata": {"name": "p"}, "spec": {}}),
            FieldValidation::Warn,
        )
        .unwrap_err();
        assert_eq!(error.code, 422);
        assert_eq!(
            error.message,
            "Pod \"p\" is invalid: spec.containers: Required value"
        );
    }

    #[test]
    fn custom_resources_get_schema_defaults_pruning_and_validation() {
        let sandboxes = info("agents.x-k8s.io", "sandboxes");
        let sandbox = json!({"metadata": {"name": "s"},
            "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "i"}]}},
                     "typo": true}});
        let admitted = admit(&sandboxes, sandbox.clone(), FieldValidation::Ignore).unwrap();
        assert!(admitted.warnings.is_empty());
        assert_eq!(admitted.object["spec"]["operatingMode"], json!("Running"));
        assert!(admitted.object["spec"].get("typo").is_none());
        let strict = admit(&sandboxes, sandbox, FieldValidation::Strict).unwrap_err();
        assert!(
            strict.message.contains("unknown field \"spec.typo\""),
            "{}",
            strict.message
        );
        let invalid = admit(
            &sandboxes,
            json!({"metadata": {"name": "s"}, "spec": {"operatingMode": "Sideways",
                  "podTemplate": {"spec": {"containers": []}}}}),
            FieldValidation::Strict,
        )
        .unwrap_err();
        assert_eq!(invalid.code, 422);
        assert!(
            invalid.message.contains("spec.operatingMode"),
            "{}",
            invalid.message
        );
    }

    #[test]
    fn null_fields_are_dropped_unless_nullable() {
        let sandboxes = info("agents.x-k8s.io", "sandboxes");
        let sandbox = json!({"metadata": {"name": "s", "labels": null},
            "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": null}]}}}});
        let admitted = admit(&sandboxes, sandbox.clone(), FieldValidation::Strict).unwrap();
        assert_eq!(
            admitted.object["spec"]["podTemplate"]["spec"]["containers"],
            json!([{"name": "c"}])
        );
        let (config, warnings) =
            prune_config(&sandboxes, sandbox, FieldValidation::Strict).unwrap();
        assert!(warnings.is_empty());
        assert_eq!(
            config["spec"]["podTemplate"]["spec"]["containers"],
            json!([{"name": "c"}])
        );
        let schema: JSONSchemaProps = serde_json::from_value(json!({
            "type": "object",
            "properties": {"a": {"type": "string", "nullable": true}, "b": {"type": "string"},
                           "list": {"type": "array", "items": {"type": "object",
                                    "properties": {"c": {"type": "string"}}}}}
        }))
        .unwrap();
        let mut value = json!({"a": null, "b": null, "list": [{"c": null}, null]});
        drop_null_fields(&schema, &mut value);
        assert_eq!(value, json!({"a": null, "list": [{}, null]}));
    }

    #[test]
    fn pod_spec_is_immutable_except_images() {
        let pods = info("", "pods");
        let old = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "a"}]}});
        let image = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "b"}]}});
        let command = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "a", "command": ["x"]}]}});
        assert!(validate_update(&pods, &old, &image).is_ok());
        assert_eq!(
            validate_update(&pods, &old, &command).unwrap_err().code,
            422
        );
    }

    #[test]
    fn network_policy_ip_blocks_are_checked_as_the_api_server_does() {
        let policies = info("networking.k8s.io", "networkpolicies");
        let policy = |cidr: &str, except: &[&str]| {
            json!({"metadata": {"name": "p", "namespace": "default"},
                   "spec": {"podSelector": {}, "policyTypes": ["Egress"],
                            "egress": [{"to": [{"ipBlock": {"cidr": cidr, "except": except}}]}]}})
        };
        let fields = |object: Value| -> String {
            match admit(&policies, object, FieldValidation::Strict) {
                Ok(_) => String::new(),
                Err(error) => error.message,
            }
        };
        assert_eq!(
            fields(policy("0.0.0.0/0", &["10.0.0.0/8", "169.254.0.0/16"])),
            ""
        );
        assert_eq!(
            fields(policy("::/0", &["::1/128", "fc00::/7", "fe80::/10"])),
            ""
        );
        let mapped = fields(policy("::/0", &["::ffff:0:0/96"]));
        assert!(
            mapped.contains("spec.egress[0].to[0].ipBlock.except[0]: Invalid value: \"::ffff:0:0/96\": must not have an IPv4-mapped IPv6 address"),
            "{mapped}"
        );
        for (cidr, except) in [
            ("10.0.0.0/8", "192.168.0.0/16"),
            ("10.0.0.0/8", "10.0.0.0/8"),
            ("::/0", "10.0.0.0/8"),
        ] {
            let error = fields(policy(cidr, &[except]));
            assert!(
                error.contains("must be a strict subset of `cidr`"),
                "{cidr} {except}: {error}"
            );
        }
        let bad = fields(policy("10.0.0.0/33", &[]));
        assert!(bad.contains("spec.egress[0].to[0].ipBlock.cidr"), "{bad}");
    }

    #[test]
    fn names_are_checked() {
        assert!(is_dns_subdomain("a-b.c"));
        assert!(!is_dns_subdomain("A"));
        assert!(!is_dns_label("a.b"));
        let error = admit(
            &info("", "configmaps"),
            json!({"metadata": {"name": "Bad_Name"}}),
            FieldValidation::Warn,
        )
        .unwrap_err();
        assert_eq!(error.code, 422);
    }
}
