//! What the Kubernetes API declares about its own types beyond what k8s-openapi's schemas carry,
//! applied to the Kubernetes types our CRDs embed (`PodSpec`, `PersistentVolumeClaimSpec`,
//! NetworkPolicy rules).
//!
//! The facts are the markers of the Go types in `k8s.io/api` v0.37, the version upstream's 1.0
//! CRDs are generated from, as controller-gen renders them: how each list merges under
//! server-side apply (`+listType`, `+listMapKey`), which objects and maps are replaced whole
//! (`+structType=atomic`, `+mapType=atomic`), literal `+default`s, object-reference names that
//! are optional, and the int-or-string and quantity shapes. The fields themselves are
//! k8s-openapi's, generated for Kubernetes 1.37 (the workspace's `v1_37` feature), so a field
//! upstream's CRDs have is also one our typed `PodSpec` keeps.
//!
//! The tables are keyed by the Kubernetes type and field name, not by a path in our CRDs: a rule
//! for `Container.ports` applies to `containers`, `initContainers` and wherever else a `Container`
//! is embedded. To know which Kubernetes type a node of the (inlined) CRD schema is, the CRD's
//! root type is generated a second time without inlining, where every Kubernetes type is a named
//! definition (`io.k8s.api.core.v1.Container`), and the two trees are walked side by side.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSON, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value};

const DEFS_PREFIX: &str = "#/$defs/";

/// How the items of a list field merge under server-side apply.
#[derive(Clone, Copy, Debug)]
enum ListType {
    /// Replaced whole.
    Atomic,
    /// Merged as a set of scalars.
    Set,
    /// Merged by the values of these item fields.
    Keyed(&'static [&'static str]),
}

use ListType::{Atomic, Keyed, Set};

/// Every list field of the embedded Kubernetes types that declares how it merges.
const LISTS: &[(&str, &str, ListType)] = &[
    ("io.k8s.api.core.v1.Capabilities", "add", Atomic),
    ("io.k8s.api.core.v1.Capabilities", "drop", Atomic),
    ("io.k8s.api.core.v1.CephFSVolumeSource", "monitors", Atomic),
    ("io.k8s.api.core.v1.ConfigMapProjection", "items", Atomic),
    ("io.k8s.api.core.v1.ConfigMapVolumeSource", "items", Atomic),
    ("io.k8s.api.core.v1.Container", "args", Atomic),
    ("io.k8s.api.core.v1.Container", "command", Atomic),
    ("io.k8s.api.core.v1.Container", "env", Keyed(&["name"])),
    ("io.k8s.api.core.v1.Container", "envFrom", Atomic),
    (
        "io.k8s.api.core.v1.Container",
        "ports",
        Keyed(&["containerPort", "protocol"]),
    ),
    ("io.k8s.api.core.v1.Container", "resizePolicy", Atomic),
    ("io.k8s.api.core.v1.Container", "restartPolicyRules", Atomic),
    (
        "io.k8s.api.core.v1.Container",
        "volumeDevices",
        Keyed(&["devicePath"]),
    ),
    (
        "io.k8s.api.core.v1.Container",
        "volumeMounts",
        Keyed(&["mountPath"]),
    ),
    (
        "io.k8s.api.core.v1.ContainerRestartRuleOnExitCodes",
        "values",
        Set,
    ),
    ("io.k8s.api.core.v1.DownwardAPIProjection", "items", Atomic),
    (
        "io.k8s.api.core.v1.DownwardAPIVolumeSource",
        "items",
        Atomic,
    ),
    // An ephemeral container has a Container's fields, markers included.
    ("io.k8s.api.core.v1.EphemeralContainer", "args", Atomic),
    ("io.k8s.api.core.v1.EphemeralContainer", "command", Atomic),
    (
        "io.k8s.api.core.v1.EphemeralContainer",
        "env",
        Keyed(&["name"]),
    ),
    ("io.k8s.api.core.v1.EphemeralContainer", "envFrom", Atomic),
    (
        "io.k8s.api.core.v1.EphemeralContainer",
        "ports",
        Keyed(&["containerPort", "protocol"]),
    ),
    (
        "io.k8s.api.core.v1.EphemeralContainer",
        "resizePolicy",
        Atomic,
    ),
    (
        "io.k8s.api.core.v1.EphemeralContainer",
        "restartPolicyRules",
        Atomic,
    ),
    (
        "io.k8s.api.core.v1.EphemeralContainer",
        "volumeDevices",
        Keyed(&["devicePath"]),
    ),
    (
        "io.k8s.api.core.v1.EphemeralContainer",
        "volumeMounts",
        Keyed(&["mountPath"]),
    ),
    ("io.k8s.api.core.v1.ExecAction", "command", Atomic),
    ("io.k8s.api.core.v1.FCVolumeSource", "targetWWNs", Atomic),
    ("io.k8s.api.core.v1.FCVolumeSource", "wwids", Atomic),
    ("io.k8s.api.core.v1.HTTPGetAction", "httpHeaders", Atomic),
    ("io.k8s.api.core.v1.HostAlias", "hostnames", Atomic),
    ("io.k8s.api.core.v1.ISCSIVolumeSource", "portals", Atomic),
    (
        "io.k8s.api.core.v1.NodeAffinity",
        "preferredDuringSchedulingIgnoredDuringExecution",
        Atomic,
    ),
    (
        "io.k8s.api.core.v1.NodeSelector",
        "nodeSelectorTerms",
        Atomic,
    ),
    (
        "io.k8s.api.core.v1.NodeSelectorRequirement",
        "values",
        Atomic,
    ),
    (
        "io.k8s.api.core.v1.NodeSelectorTerm",
        "matchExpressions",
        Atomic,
    ),
    ("io.k8s.api.core.v1.NodeSelectorTerm", "matchFields", Atomic),
    (
        "io.k8s.api.core.v1.PersistentVolumeClaimSpec",
        "accessModes",
        Atomic,
    ),
    (
        "io.k8s.api.core.v1.PodAffinity",
        "preferredDuringSchedulingIgnoredDuringExecution",
        Atomic,
    ),
    (
        "io.k8s.api.core.v1.PodAffinity",
        "requiredDuringSchedulingIgnoredDuringExecution",
        Atomic,
    ),
    (
        "io.k8s.api.core.v1.PodAffinityTerm",
        "matchLabelKeys",
        Atomic,
    ),
    (
        "io.k8s.api.core.v1.PodAffinityTerm",
        "mismatchLabelKeys",
        Atomic,
    ),
    ("io.k8s.api.core.v1.PodAffinityTerm", "namespaces", Atomic),
    (
        "io.k8s.api.core.v1.PodAntiAffinity",
        "preferredDuringSchedulingIgnoredDuringExecution",
        Atomic,
    ),
    (
        "io.k8s.api.core.v1.PodAntiAffinity",
        "requiredDuringSchedulingIgnoredDuringExecution",
        Atomic,
    ),
    ("io.k8s.api.core.v1.PodDNSConfig", "nameservers", Atomic),
    ("io.k8s.api.core.v1.PodDNSConfig", "options", Atomic),
    ("io.k8s.api.core.v1.PodDNSConfig", "searches", Atomic),
    (
        "io.k8s.api.core.v1.PodSecurityContext",
        "supplementalGroups",
        Atomic,
    ),
    ("io.k8s.api.core.v1.PodSecurityContext", "sysctls", Atomic),
    ("io.k8s.api.core.v1.PodSpec", "containers", Keyed(&["name"])),
    (
        "io.k8s.api.core.v1.PodSpec",
        "ephemeralContainers",
        Keyed(&["name"]),
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "evictionResponders",
        Keyed(&["name"]),
    ),
    ("io.k8s.api.core.v1.PodSpec", "hostAliases", Keyed(&["ip"])),
    (
        "io.k8s.api.core.v1.PodSpec",
        "imagePullSecrets",
        Keyed(&["name"]),
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "initContainers",
        Keyed(&["name"]),
    ),
    ("io.k8s.api.core.v1.PodSpec", "readinessGates", Atomic),
    (
        "io.k8s.api.core.v1.PodSpec",
        "resourceClaims",
        Keyed(&["name"]),
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "schedulingGates",
        Keyed(&["name"]),
    ),
    ("io.k8s.api.core.v1.PodSpec", "tolerations", Atomic),
    (
        "io.k8s.api.core.v1.PodSpec",
        "topologySpreadConstraints",
        Keyed(&["topologyKey", "whenUnsatisfiable"]),
    ),
    ("io.k8s.api.core.v1.PodSpec", "volumes", Keyed(&["name"])),
    (
        "io.k8s.api.core.v1.ProjectedVolumeSource",
        "sources",
        Atomic,
    ),
    ("io.k8s.api.core.v1.RBDVolumeSource", "monitors", Atomic),
    (
        "io.k8s.api.core.v1.ResourceRequirements",
        "claims",
        Keyed(&["name"]),
    ),
    ("io.k8s.api.core.v1.SecretProjection", "items", Atomic),
    ("io.k8s.api.core.v1.SecretVolumeSource", "items", Atomic),
    (
        "io.k8s.api.core.v1.TopologySpreadConstraint",
        "matchLabelKeys",
        Atomic,
    ),
    ("io.k8s.api.core.v1.VolumeMount", "bindMountOptions", Set),
    ("io.k8s.api.networking.v1.IPBlock", "except", Atomic),
    (
        "io.k8s.api.networking.v1.NetworkPolicyEgressRule",
        "ports",
        Atomic,
    ),
    (
        "io.k8s.api.networking.v1.NetworkPolicyEgressRule",
        "to",
        Atomic,
    ),
    (
        "io.k8s.api.networking.v1.NetworkPolicyIngressRule",
        "from",
        Atomic,
    ),
    (
        "io.k8s.api.networking.v1.NetworkPolicyIngressRule",
        "ports",
        Atomic,
    ),
    (
        "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector",
        "matchExpressions",
        Atomic,
    ),
    (
        "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelectorRequirement",
        "values",
        Atomic,
    ),
    (
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        "finalizers",
        Set,
    ),
    (
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        "managedFields",
        Atomic,
    ),
    (
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        "ownerReferences",
        Keyed(&["uid"]),
    ),
];

/// Types whose objects server-side apply replaces whole (`x-kubernetes-map-type: atomic`).
///
/// The last seven embed `LocalObjectReference` inline; controller-gen carries its
/// `+structType=atomic` into the embedding type, so upstream's CRDs mark them too.
const ATOMIC_TYPES: &[&str] = &[
    "io.k8s.api.core.v1.EvictionResponder",
    "io.k8s.api.core.v1.FileKeySelector",
    "io.k8s.api.core.v1.LocalObjectReference",
    "io.k8s.api.core.v1.NodeSelector",
    "io.k8s.api.core.v1.NodeSelectorTerm",
    "io.k8s.api.core.v1.ObjectFieldSelector",
    "io.k8s.api.core.v1.ResourceFieldSelector",
    "io.k8s.api.core.v1.TypedLocalObjectReference",
    "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector",
    "io.k8s.apimachinery.pkg.apis.meta.v1.OwnerReference",
    "io.k8s.api.core.v1.ConfigMapEnvSource",
    "io.k8s.api.core.v1.ConfigMapKeySelector",
    "io.k8s.api.core.v1.ConfigMapProjection",
    "io.k8s.api.core.v1.ConfigMapVolumeSource",
    "io.k8s.api.core.v1.SecretEnvSource",
    "io.k8s.api.core.v1.SecretKeySelector",
    "io.k8s.api.core.v1.SecretProjection",
];

/// Map fields server-side apply replaces whole.
const ATOMIC_MAPS: &[(&str, &str)] = &[("io.k8s.api.core.v1.PodSpec", "nodeSelector")];

/// A literal default of a field.
#[derive(Clone, Copy, Debug)]
enum Literal {
    Str(&'static str),
    Bool(bool),
}

/// The `name` of a reference to a ConfigMap or Secret: optional, defaulting to "" (the embedding
/// types inherit it from `LocalObjectReference`).
const NAMED_REFERENCES: &[&str] = &[
    "io.k8s.api.core.v1.ConfigMapEnvSource",
    "io.k8s.api.core.v1.ConfigMapKeySelector",
    "io.k8s.api.core.v1.ConfigMapProjection",
    "io.k8s.api.core.v1.ConfigMapVolumeSource",
    "io.k8s.api.core.v1.LocalObjectReference",
    "io.k8s.api.core.v1.SecretEnvSource",
    "io.k8s.api.core.v1.SecretKeySelector",
    "io.k8s.api.core.v1.SecretProjection",
];

/// Literal `+default`s (controller-gen does not render `+default=ref(...)`).
const DEFAULTS: &[(&str, &str, Literal)] = &[
    (
        "io.k8s.api.core.v1.AzureDiskVolumeSource",
        "fsType",
        Literal::Str("ext4"),
    ),
    (
        "io.k8s.api.core.v1.AzureDiskVolumeSource",
        "readOnly",
        Literal::Bool(false),
    ),
    (
        "io.k8s.api.core.v1.ContainerPort",
        "protocol",
        Literal::Str("TCP"),
    ),
    (
        "io.k8s.api.core.v1.FileKeySelector",
        "optional",
        Literal::Bool(false),
    ),
    ("io.k8s.api.core.v1.GRPCAction", "service", Literal::Str("")),
    (
        "io.k8s.api.core.v1.ISCSIVolumeSource",
        "iscsiInterface",
        Literal::Str("default"),
    ),
    (
        "io.k8s.api.core.v1.RBDVolumeSource",
        "keyring",
        Literal::Str("/etc/ceph/keyring"),
    ),
    (
        "io.k8s.api.core.v1.RBDVolumeSource",
        "pool",
        Literal::Str("rbd"),
    ),
    (
        "io.k8s.api.core.v1.RBDVolumeSource",
        "user",
        Literal::Str("admin"),
    ),
    (
        "io.k8s.api.core.v1.ScaleIOVolumeSource",
        "fsType",
        Literal::Str("xfs"),
    ),
    (
        "io.k8s.api.core.v1.ScaleIOVolumeSource",
        "storageMode",
        Literal::Str("ThinProvisioned"),
    ),
];

/// Types that are an integer or a string (`x-kubernetes-int-or-string`), given the `anyOf`
/// controller-gen writes for them.
const INT_OR_STRING_TYPES: &[&str] = &[
    "io.k8s.apimachinery.pkg.api.resource.Quantity",
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString",
];

const QUANTITY: &str = "io.k8s.apimachinery.pkg.api.resource.Quantity";

/// The grammar of a quantity's string form (`resource.Quantity`), as a pattern.
const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// The schema of `K` with every type a named definition under `$defs`, to tell which Kubernetes
/// type each node of the inlined schema is.
pub(super) fn shape_of<K: JsonSchema>() -> Value {
    SchemaSettings::draft2020_12()
        .with(|settings| settings.meta_schema = None)
        .into_generator()
        .into_root_schema_for::<K>()
        .to_value()
}

/// Applies the tables to `schema`, the inlined CRD schema whose un-inlined form is `shape`.
pub(super) fn annotate(schema: &mut JSONSchemaProps, shape: &Value) {
    let empty = Map::new();
    let defs = shape
        .get("$defs")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    walk(schema, shape, defs);
}

/// The named definition `node` refers to, directly or as the one schema of an `allOf`/`anyOf`
/// (how schemars writes a reference with a description, or an `Option`).
fn referenced<'a>(node: &'a Value, defs: &'a Map<String, Value>) -> Option<(&'a str, &'a Value)> {
    if let Some(name) = node
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|reference| reference.strip_prefix(DEFS_PREFIX))
    {
        return defs.get(name).map(|body| (name, body));
    }
    ["allOf", "anyOf", "oneOf"]
        .iter()
        .filter_map(|key| node.get(*key).and_then(Value::as_array))
        .flatten()
        .find_map(|member| referenced(member, defs))
}

fn walk(node: &mut JSONSchemaProps, shape: &Value, defs: &Map<String, Value>) {
    let (type_name, body) = match referenced(shape, defs) {
        Some((name, body)) => (Some(name), body),
        None => (None, shape),
    };
    if let Some(name) = type_name {
        type_rules(name, node);
    }
    for (field, child) in node.properties.iter_mut().flatten() {
        if let Some(name) = type_name {
            field_rules(name, field, child);
        }
        if let Some(child_shape) = body.get("properties").and_then(|p| p.get(field)) {
            walk(child, child_shape, defs);
        }
    }
    if let (Some(JSONSchemaPropsOrArray::Schema(item)), Some(item_shape)) =
        (&mut node.items, body.get("items"))
    {
        walk(item, item_shape, defs);
    }
    if let (Some(JSONSchemaPropsOrBool::Schema(values)), Some(values_shape)) = (
        &mut node.additional_properties,
        body.get("additionalProperties"),
    ) {
        walk(values, values_shape, defs);
    }
}

fn type_rules(name: &str, node: &mut JSONSchemaProps) {
    if ATOMIC_TYPES.contains(&name) {
        node.x_kubernetes_map_type = Some("atomic".to_owned());
    }
    if INT_OR_STRING_TYPES.contains(&name) {
        node.x_kubernetes_int_or_string = Some(true);
        node.any_of = Some(
            ["integer", "string"]
                .map(|type_| JSONSchemaProps {
                    type_: Some(type_.to_owned()),
                    ..JSONSchemaProps::default()
                })
                .to_vec(),
        );
    }
    if name == QUANTITY {
        node.pattern = Some(QUANTITY_PATTERN.to_owned());
    }
    let mut not_required: Vec<&str> = Vec::new();
    if NAMED_REFERENCES.contains(&name) {
        not_required.push("name");
    }
    if let Some(required) = &mut node.required {
        required.retain(|field| !not_required.contains(&field.as_str()));
        if required.is_empty() {
            node.required = None;
        }
    }
}

fn field_rules(type_name: &str, field: &str, node: &mut JSONSchemaProps) {
    let matches = |&(t, f): &(&str, &str)| t == type_name && f == field;
    if let Some(&(_, _, list_type)) = LISTS.iter().find(|(t, f, _)| matches(&(t, f))) {
        let (list_type, keys) = match list_type {
            Atomic => ("atomic", None),
            Set => ("set", None),
            Keyed(keys) => ("map", Some(keys)),
        };
        node.x_kubernetes_list_type = Some(list_type.to_owned());
        node.x_kubernetes_list_map_keys =
            keys.map(|keys| keys.iter().map(|key| (*key).to_owned()).collect());
    }
    if ATOMIC_MAPS.iter().any(matches) {
        node.x_kubernetes_map_type = Some("atomic".to_owned());
    }
    let default = DEFAULTS
        .iter()
        .find(|(t, f, _)| matches(&(t, f)))
        .map(|&(_, _, default)| default)
        .or_else(|| {
            (field == "name" && NAMED_REFERENCES.contains(&type_name)).then_some(Literal::Str(""))
        });
    if let Some(default) = default {
        node.default = Some(JSON(match default {
            Literal::Str(text) => Value::String(text.to_owned()),
            Literal::Bool(flag) => Value::Bool(flag),
        }));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::{Sandbox, SandboxClaim, SandboxTemplate, SandboxWarmPool};

    /// Every `(type, field)` of the generated definitions, and the names of the definitions.
    fn known_fields() -> (BTreeSet<(String, String)>, BTreeSet<String>) {
        let (mut known, mut types) = (BTreeSet::new(), BTreeSet::new());
        for shape in [
            shape_of::<Sandbox>(),
            shape_of::<SandboxTemplate>(),
            shape_of::<SandboxWarmPool>(),
            shape_of::<SandboxClaim>(),
        ] {
            for (name, body) in shape["$defs"].as_object().unwrap() {
                types.insert(name.clone());
                for field in body["properties"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|p| p.0)
                {
                    known.insert((name.clone(), field.clone()));
                }
            }
        }
        (known, types)
    }

    /// A rule naming a type or field that our CRDs do not embed would silently do nothing.
    #[test]
    fn every_rule_names_an_embedded_type_and_field() {
        let (known, types) = known_fields();
        let fields = LISTS
            .iter()
            .map(|&(t, f, _)| (t, f))
            .chain(DEFAULTS.iter().map(|&(t, f, _)| (t, f)))
            .chain(ATOMIC_MAPS.iter().copied())
            .chain(NAMED_REFERENCES.iter().map(|&t| (t, "name")));
        for (name, field) in fields {
            assert!(
                known.contains(&(name.to_owned(), field.to_owned())),
                "{name}.{field} is not a field of an embedded type"
            );
        }
        for name in ATOMIC_TYPES.iter().chain(INT_OR_STRING_TYPES) {
            assert!(types.contains(*name), "{name} is not embedded");
        }
    }

    #[test]
    fn rules_reach_nested_and_repeated_embeddings() {
        let crd = crate::crds::schema("sandboxes.agents.x-k8s.io").unwrap();
        let value = serde_json::to_value(&crd).unwrap();
        let pod = &value["properties"]["spec"]["properties"]["podTemplate"]["properties"]["spec"];
        for containers in ["containers", "initContainers", "ephemeralContainers"] {
            let list = &pod["properties"][containers];
            assert_eq!(list["x-kubernetes-list-type"], "map", "{containers}");
            let ports = &list["items"]["properties"]["ports"];
            assert_eq!(
                ports["x-kubernetes-list-map-keys"],
                serde_json::json!(["containerPort", "protocol"])
            );
            assert_eq!(ports["items"]["properties"]["protocol"]["default"], "TCP");
        }
        let secret_ref = &pod["properties"]["volumes"]["items"]["properties"]["cephfs"]["properties"]
            ["secretRef"];
        assert_eq!(secret_ref["x-kubernetes-map-type"], "atomic");
        assert_eq!(secret_ref.get("required"), None);
        assert_eq!(secret_ref["properties"]["name"]["default"], "");
        assert!(pod["properties"].get("workloadRef").is_none());
        assert_eq!(
            pod["properties"]["schedulingGroup"]["properties"]["podGroupName"]["type"],
            "string"
        );
        let cpu = &pod["properties"]["overhead"]["additionalProperties"];
        assert_eq!(cpu["x-kubernetes-int-or-string"], true);
        assert_eq!(cpu["pattern"], QUANTITY_PATTERN);
    }
}
