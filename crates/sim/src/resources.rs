//! The resource registry: which kinds the sim serves, under which group, version and plural, with
//! which scope, short names, subresources, schema and printer columns (sans IO).
//!
//! Built-in kinds are listed here; custom resources are added from a
//! `CustomResourceDefinition` the moment it is written, and removed when it is deleted.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use serde_json::Value;

/// What the server knows about a kind beyond its names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Builtin {
    Namespace,
    Pod,
    Service,
    PersistentVolumeClaim,
    Event,
    EventV1,
    ConfigMap,
    Secret,
    ServiceAccount,
    Node,
    NetworkPolicy,
    EndpointSlice,
    Lease,
    Deployment,
    ReplicaSet,
    CustomResourceDefinition,
    /// Stored as given, without a schema (Gateway API kinds).
    Unstructured,
    /// A custom resource with a CRD schema.
    Custom,
}

/// Where the scale subresource reads and writes, from the CRD.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ScalePaths {
    pub(crate) spec_replicas: String,
    pub(crate) status_replicas: String,
    pub(crate) label_selector: Option<String>,
}

/// A CRD `additionalPrinterColumns` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PrinterColumn {
    pub(crate) name: String,
    pub(crate) type_: String,
    pub(crate) format: String,
    pub(crate) description: String,
    pub(crate) json_path: String,
    pub(crate) priority: i32,
}

/// One served group/version/resource.
#[derive(Clone, Debug)]
pub(crate) struct ResourceInfo {
    pub(crate) group: String,
    pub(crate) version: String,
    pub(crate) plural: String,
    pub(crate) singular: String,
    pub(crate) kind: String,
    pub(crate) namespaced: bool,
    pub(crate) short_names: Vec<String>,
    pub(crate) categories: Vec<String>,
    pub(crate) status: bool,
    pub(crate) scale: Option<ScalePaths>,
    pub(crate) schema: Option<Arc<JSONSchemaProps>>,
    pub(crate) columns: Vec<PrinterColumn>,
    pub(crate) builtin: Builtin,
}

/// Identity of the stored collection a resource reads and writes (versions of one resource, and
/// the two Event APIs, share a collection).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct StorageKey {
    pub(crate) group: String,
    pub(crate) plural: String,
}

impl StorageKey {
    pub(crate) fn new(group: &str, plural: &str) -> Self {
        Self {
            group: group.to_owned(),
            plural: plural.to_owned(),
        }
    }
}

impl ResourceInfo {
    /// `apiVersion` of objects of this resource.
    pub(crate) fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The stored collection.
    pub(crate) fn storage(&self) -> StorageKey {
        if self.builtin == Builtin::EventV1 {
            StorageKey::new("", "events")
        } else {
            StorageKey::new(&self.group, &self.plural)
        }
    }

    /// Whether this is a custom resource.
    pub(crate) fn is_custom(&self) -> bool {
        self.builtin == Builtin::Custom
    }

    /// Subresources served besides `status` and `scale`.
    pub(crate) fn extra_subresources(&self) -> &'static [&'static str] {
        match self.builtin {
            Builtin::Pod => &["log", "portforward"],
            Builtin::Namespace => &["finalize"],
            Builtin::ServiceAccount => &["token"],
            _ => &[],
        }
    }

    /// The list type of the list at `path` (field names from the root, no indices): what server-side
    /// apply and strategic merge use to merge lists.
    pub(crate) fn list_type(&self, path: &[String]) -> ListType {
        if path.first().map(String::as_str) == Some("metadata") {
            return builtin_list_type(path);
        }
        match &self.schema {
            Some(schema) => schema_list_type(schema, path).unwrap_or(ListType::Atomic),
            None if self.builtin == Builtin::Unstructured => ListType::Atomic,
            None => builtin_list_type(path),
        }
    }
}

/// How a list is merged by server-side apply and strategic merge patch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ListType {
    /// Replaced as a whole.
    Atomic,
    /// A set of scalars, merged by value.
    Set,
    /// A list of objects merged by the values of these keys.
    Map(Vec<String>),
}

/// List types of the built-in kinds we serve, keyed by the field's name and its parent's.
fn builtin_list_type(path: &[String]) -> ListType {
    let last = path.last().map(String::as_str).unwrap_or_default();
    let parent = path
        .len()
        .checked_sub(2)
        .and_then(|i| path.get(i))
        .map(String::as_str)
        .unwrap_or_default();
    let keys = |keys: &[&str]| ListType::Map(keys.iter().map(|k| (*k).to_owned()).collect());
    match (parent, last) {
        ("metadata", "ownerReferences") => keys(&["uid"]),
        ("metadata", "finalizers") => ListType::Set,
        ("metadata", _) => ListType::Atomic,
        (_, "containers" | "initContainers" | "ephemeralContainers") => keys(&["name"]),
        ("containers" | "initContainers" | "ephemeralContainers", "ports") => {
            keys(&["containerPort", "protocol"])
        }
        ("spec", "ports") => keys(&["port", "protocol"]),
        (_, "env") => keys(&["name"]),
        (_, "volumeMounts") => keys(&["mountPath"]),
        (_, "volumes" | "imagePullSecrets") => keys(&["name"]),
        (_, "conditions") => keys(&["type"]),
        (_, "hostAliases") => keys(&["ip"]),
        _ => ListType::Atomic,
    }
}

/// Walks `schema` along `path` and reads `x-kubernetes-list-type` at the end.
fn schema_list_type(schema: &JSONSchemaProps, path: &[String]) -> Option<ListType> {
    let mut node = schema;
    for segment in path {
        if let Some(JSONSchemaPropsOrArray::Schema(items)) = &node.items {
            node = items;
        }
        node = match node.properties.as_ref().and_then(|p| p.get(segment)) {
            Some(child) => child,
            None => match &node.additional_properties {
                Some(JSONSchemaPropsOrBool::Schema(values)) => values,
                _ => return None,
            },
        };
    }
    Some(match node.x_kubernetes_list_type.as_deref() {
        Some("set") => ListType::Set,
        Some("map") => ListType::Map(node.x_kubernetes_list_map_keys.clone().unwrap_or_default()),
        _ => ListType::Atomic,
    })
}

#[allow(clippy::too_many_arguments)]
fn builtin(
    group: &str,
    version: &str,
    plural: &str,
    kind: &str,
    namespaced: bool,
    short_names: &[&str],
    status: bool,
    builtin: Builtin,
) -> ResourceInfo {
    ResourceInfo {
        group: group.to_owned(),
        version: version.to_owned(),
        plural: plural.to_owned(),
        singular: kind.to_lowercase(),
        kind: kind.to_owned(),
        namespaced,
        short_names: short_names.iter().map(|s| (*s).to_owned()).collect(),
        categories: Vec::new(),
        status,
        scale: None,
        schema: None,
        columns: Vec::new(),
        builtin,
    }
}

/// The built-in resources, in discovery order.
pub(crate) fn builtins() -> Vec<ResourceInfo> {
    use Builtin as B;
    let mut list = vec![
        builtin(
            "",
            "v1",
            "namespaces",
            "Namespace",
            false,
            &["ns"],
            true,
            B::Namespace,
        ),
        builtin("", "v1", "pods", "Pod", true, &["po"], true, B::Pod),
        builtin(
            "",
            "v1",
            "services",
            "Service",
            true,
            &["svc"],
            true,
            B::Service,
        ),
        builtin(
            "",
            "v1",
            "persistentvolumeclaims",
            "PersistentVolumeClaim",
            true,
            &["pvc"],
            true,
            B::PersistentVolumeClaim,
        ),
        builtin("", "v1", "events", "Event", true, &["ev"], false, B::Event),
        builtin(
            "",
            "v1",
            "configmaps",
            "ConfigMap",
            true,
            &["cm"],
            false,
            B::ConfigMap,
        ),
        builtin("", "v1", "secrets", "Secret", true, &[], false, B::Secret),
        builtin(
            "",
            "v1",
            "serviceaccounts",
            "ServiceAccount",
            true,
            &["sa"],
            false,
            B::ServiceAccount,
        ),
        builtin("", "v1", "nodes", "Node", false, &["no"], true, B::Node),
        builtin(
            "events.k8s.io",
            "v1",
            "events",
            "Event",
            true,
            &["ev"],
            false,
            B::EventV1,
        ),
        builtin(
            "networking.k8s.io",
            "v1",
            "networkpolicies",
            "NetworkPolicy",
            true,
            &["netpol"],
            false,
            B::NetworkPolicy,
        ),
        builtin(
            "discovery.k8s.io",
            "v1",
            "endpointslices",
            "EndpointSlice",
            true,
            &[],
            false,
            B::EndpointSlice,
        ),
        builtin(
            "coordination.k8s.io",
            "v1",
            "leases",
            "Lease",
            true,
            &[],
            false,
            B::Lease,
        ),
        builtin(
            "apps",
            "v1",
            "deployments",
            "Deployment",
            true,
            &["deploy"],
            true,
            B::Deployment,
        ),
        builtin(
            "apps",
            "v1",
            "replicasets",
            "ReplicaSet",
            true,
            &["rs"],
            true,
            B::ReplicaSet,
        ),
        builtin(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            &["crd", "crds"],
            true,
            B::CustomResourceDefinition,
        ),
        builtin(
            "gateway.networking.k8s.io",
            "v1",
            "gateways",
            "Gateway",
            true,
            &["gtw"],
            true,
            B::Unstructured,
        ),
        builtin(
            "gateway.networking.k8s.io",
            "v1",
            "httproutes",
            "HTTPRoute",
            true,
            &[],
            true,
            B::Unstructured,
        ),
        builtin(
            "gateway.networking.k8s.io",
            "v1",
            "gatewayclasses",
            "GatewayClass",
            false,
            &["gc"],
            true,
            B::Unstructured,
        ),
        // Stored as given and evaluated by the authorizer (`crate::rbac`).
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterroles",
            "ClusterRole",
            false,
            &[],
            false,
            B::Unstructured,
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterrolebindings",
            "ClusterRoleBinding",
            false,
            &[],
            false,
            B::Unstructured,
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "roles",
            "Role",
            true,
            &[],
            false,
            B::Unstructured,
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "rolebindings",
            "RoleBinding",
            true,
            &[],
            false,
            B::Unstructured,
        ),
        // HTTPRoutes of upstream's manifests are v1beta1; both versions share one collection.
        builtin(
            "gateway.networking.k8s.io",
            "v1beta1",
            "gateways",
            "Gateway",
            true,
            &["gtw"],
            true,
            B::Unstructured,
        ),
        builtin(
            "gateway.networking.k8s.io",
            "v1beta1",
            "httproutes",
            "HTTPRoute",
            true,
            &[],
            true,
            B::Unstructured,
        ),
        builtin(
            "gateway.networking.k8s.io",
            "v1beta1",
            "gatewayclasses",
            "GatewayClass",
            false,
            &["gc"],
            true,
            B::Unstructured,
        ),
    ];
    // `kubectl get all` lists the kinds in the `all` category.
    for info in &mut list {
        if matches!(
            info.builtin,
            B::Pod | B::Service | B::Deployment | B::ReplicaSet
        ) {
            info.categories = vec!["all".to_owned()];
        }
        if matches!(info.builtin, B::Deployment | B::ReplicaSet) {
            // The Scale's selector is derived from `spec.selector` (`ops`), not read at a path.
            info.scale = Some(ScalePaths {
                spec_replicas: ".spec.replicas".to_owned(),
                status_replicas: ".status.replicas".to_owned(),
                label_selector: None,
            });
        }
    }
    list
}

/// The resources a CRD serves, one per served version.
pub(crate) fn from_crd(crd: &CustomResourceDefinition) -> Vec<ResourceInfo> {
    let spec = &crd.spec;
    let names = &spec.names;
    spec.versions
        .iter()
        .filter(|version| version.served)
        .map(|version| {
            let subresources = version.subresources.as_ref();
            ResourceInfo {
                group: spec.group.clone(),
                version: version.name.clone(),
                plural: names.plural.clone(),
                singular: names
                    .singular
                    .clone()
                    .unwrap_or_else(|| names.kind.to_lowercase()),
                kind: names.kind.clone(),
                namespaced: spec.scope == "Namespaced",
                short_names: names.short_names.clone().unwrap_or_default(),
                categories: names.categories.clone().unwrap_or_default(),
                status: subresources.is_some_and(|s| s.status.is_some()),
                scale: subresources
                    .and_then(|s| s.scale.as_ref())
                    .map(|scale| ScalePaths {
                        spec_replicas: scale.spec_replicas_path.clone(),
                        status_replicas: scale.status_replicas_path.clone(),
                        label_selector: scale.label_selector_path.clone(),
                    }),
                schema: version
                    .schema
                    .as_ref()
                    .and_then(|s| s.open_api_v3_schema.clone())
                    .map(Arc::new),
                columns: version
                    .additional_printer_columns
                    .iter()
                    .flatten()
                    .map(|column| PrinterColumn {
                        name: column.name.clone(),
                        type_: column.type_.clone(),
                        format: column.format.clone().unwrap_or_default(),
                        description: column.description.clone().unwrap_or_default(),
                        json_path: column.json_path.clone(),
                        priority: column.priority.unwrap_or(0),
                    })
                    .collect(),
                builtin: Builtin::Custom,
            }
        })
        .collect()
}

/// Every served resource, by group, version and plural.
#[derive(Clone, Debug, Default)]
pub(crate) struct Registry {
    resources: BTreeMap<(String, String, String), Arc<ResourceInfo>>,
    /// Group order for discovery (built-ins first, then CRD groups as registered).
    groups: Vec<String>,
    /// For each CRD name, the keys it registered.
    crds: BTreeMap<String, Vec<(String, String, String)>>,
}

impl Registry {
    /// A registry with the built-in resources.
    pub(crate) fn with_builtins() -> Self {
        let mut registry = Self::default();
        for info in builtins() {
            registry.insert(info);
        }
        registry
    }

    fn insert(&mut self, info: ResourceInfo) -> (String, String, String) {
        if !self.groups.contains(&info.group) {
            self.groups.push(info.group.clone());
        }
        let key = (
            info.group.clone(),
            info.version.clone(),
            info.plural.clone(),
        );
        self.resources.insert(key.clone(), Arc::new(info));
        key
    }

    /// Registers (or re-registers) the resources of a CRD. Returns an error when the CRD's names
    /// clash with a resource registered by another definition.
    pub(crate) fn register_crd(&mut self, crd: &CustomResourceDefinition) -> Result<(), String> {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let infos = from_crd(crd);
        for info in &infos {
            let key = (
                info.group.clone(),
                info.version.clone(),
                info.plural.clone(),
            );
            let owned = self.crds.get(&name).is_some_and(|keys| keys.contains(&key));
            if !owned && self.resources.contains_key(&key) {
                return Err(format!(
                    "{}/{} {} is already served",
                    info.group, info.version, info.plural
                ));
            }
        }
        self.unregister_crd(&name);
        let keys = infos.into_iter().map(|info| self.insert(info)).collect();
        self.crds.insert(name, keys);
        Ok(())
    }

    /// Removes what a CRD registered.
    pub(crate) fn unregister_crd(&mut self, name: &str) {
        for key in self.crds.remove(name).unwrap_or_default() {
            self.resources.remove(&key);
        }
        let resources = &self.resources;
        self.groups
            .retain(|group| resources.keys().any(|(g, _, _)| g == group));
    }

    /// The resource at a group, version and plural.
    pub(crate) fn get(
        &self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Option<Arc<ResourceInfo>> {
        self.resources
            .get(&(group.to_owned(), version.to_owned(), plural.to_owned()))
            .cloned()
    }

    /// Resources of one group/version, in registration order within plural order.
    pub(crate) fn group_version(&self, group: &str, version: &str) -> Vec<Arc<ResourceInfo>> {
        self.resources
            .iter()
            .filter(|((g, v, _), _)| g == group && v == version)
            .map(|(_, info)| info.clone())
            .collect()
    }

    /// Groups with their versions, in discovery order.
    pub(crate) fn groups(&self) -> Vec<(String, Vec<String>)> {
        self.groups
            .iter()
            .map(|group| {
                let mut versions: Vec<String> = self
                    .resources
                    .keys()
                    .filter(|(g, _, _)| g == group)
                    .map(|(_, v, _)| v.clone())
                    .collect();
                versions.dedup();
                (group.clone(), versions)
            })
            .collect()
    }

    /// Every resource.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Arc<ResourceInfo>> {
        self.resources.values()
    }
}

/// The CRD in `obj`, parsed.
pub(crate) fn parse_crd(obj: &Value) -> Result<CustomResourceDefinition, String> {
    serde_json::from_value(obj.clone()).map_err(|error| error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_crds_register_with_their_names_and_subresources() {
        let mut registry = Registry::with_builtins();
        for crd in agent_sandbox_api::crds::all() {
            registry.register_crd(&crd).unwrap();
        }
        let sandboxes = registry
            .get("agents.x-k8s.io", "v1beta1", "sandboxes")
            .unwrap();
        assert!(sandboxes.namespaced);
        assert!(sandboxes.status);
        assert_eq!(sandboxes.kind, agent_sandbox_api::kinds::SANDBOX);
        assert!(!sandboxes.columns.is_empty());
        let pools = registry
            .get("extensions.agents.x-k8s.io", "v1beta1", "sandboxwarmpools")
            .unwrap();
        assert_eq!(
            pools.scale.as_ref().map(|s| s.spec_replicas.as_str()),
            Some(".spec.replicas")
        );
        assert!(
            registry
                .groups()
                .iter()
                .any(|(g, _)| g == "agents.x-k8s.io")
        );
        registry.unregister_crd("sandboxes.agents.x-k8s.io");
        assert!(
            registry
                .get("agents.x-k8s.io", "v1beta1", "sandboxes")
                .is_none()
        );
        assert!(
            !registry
                .groups()
                .iter()
                .any(|(g, _)| g == "agents.x-k8s.io")
        );
    }

    #[test]
    fn list_types_come_from_the_schema_or_the_builtin_table() {
        let registry = Registry::with_builtins();
        let pods = registry.get("", "v1", "pods").unwrap();
        let path = |p: &str| p.split('.').map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(
            pods.list_type(&path("spec.containers")),
            ListType::Map(vec!["name".into()])
        );
        assert_eq!(
            pods.list_type(&path("spec.containers.ports")),
            ListType::Map(vec!["containerPort".into(), "protocol".into()])
        );
        assert_eq!(pods.list_type(&path("metadata.finalizers")), ListType::Set);
        assert_eq!(pods.list_type(&path("spec.tolerations")), ListType::Atomic);
        let mut registry = registry;
        for crd in agent_sandbox_api::crds::all() {
            registry.register_crd(&crd).unwrap();
        }
        let sandboxes = registry
            .get("agents.x-k8s.io", "v1beta1", "sandboxes")
            .unwrap();
        // Our generated schema leaves conditions unmarked, so a real API server treats the list as
        // atomic; so do we.
        assert_eq!(
            sandboxes.list_type(&path("status.conditions")),
            ListType::Atomic
        );
        assert_eq!(
            sandboxes.list_type(&path("metadata.ownerReferences")),
            ListType::Map(vec!["uid".into()])
        );
    }
}
