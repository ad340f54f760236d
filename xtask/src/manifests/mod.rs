//! Offline checks of the delivery manifests (`deploy/`, `flux/`, `kind/`), run by
//! `cargo xtask check-manifests` and by this module's tests (so by `cargo test --workspace`):
//!
//! 1. `kubectl kustomize` renders every folder in [`KUSTOMIZATIONS`] and [`FLUX`], and the path
//!    of every Flux Kustomization with its `images:` applied (what kustomize-controller does);
//! 2. every rendered object deserializes into its k8s-openapi, CRD ([`agent_sandbox_api`]) or
//!    Flux ([`flux`]) type, and serializing it back loses no field: a typo such as
//!    `imagePullPolicyy` is an error naming the field's path (k8s-openapi's own deserializers
//!    ignore unknown fields, hence the round trip). Our own kinds are also validated against the
//!    generated CRD schemas, as an API server would;
//! 3. no placeholder image survives a deployable render; kind renders use local `:dev` tags
//!    with `IfNotPresent`, release renders pin every image by digest;
//! 4. the router runs where the controller's default NetworkPolicy and the SDK look for it
//!    (`agent_sandbox_api::wire`, `labels::ROUTER_APP`), behind `sandbox-router-svc:8080`;
//! 5. Flux Kustomizations form the chain infrastructure → controller → sandboxes with `prune`,
//!    `wait` and `timeout`, against a source defined next to them;
//! 6. the pods of every Deployment and SandboxTemplate meet the restricted Pod Security Standard
//!    ([`restricted_problems`]), so a namespace that enforces it admits them.

pub(crate) mod flux;
pub(crate) mod helm;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use agent_sandbox_api::{
    API_VERSION, EXTENSIONS_API_VERSION, SandboxClaim, SandboxTemplate, SandboxWarmPool, kinds,
    labels, wire,
};
use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Kustomize folders rendered on their own.
pub(crate) const KUSTOMIZATIONS: [&str; 7] = [
    "deploy/crds",
    "deploy/base",
    "deploy/sandboxes",
    "deploy/sandboxes-gvisor",
    "deploy/sandboxes/namespace-router",
    "deploy/overlays/kind",
    "deploy/overlays/release",
];

/// Folders of Flux objects.
pub(crate) const FLUX: [&str; 2] = ["flux/kind", "flux/release"];

/// Image names in `deploy/base` and `deploy/sandboxes` that only an `images:` transformer makes
/// real (our equivalent of upstream's `ko://` references).
pub(crate) const PLACEHOLDER_IMAGES: [&str; 3] = [
    "agent-sandbox-controller",
    "sandbox-router",
    "sandbox-runtime-python",
];

/// How images must look in a deployable render.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ImagePolicy {
    /// Not deployable on its own (base, sandboxes, crds): no image rule.
    None,
    /// kind: images loaded into the nodes, `agent-sandbox/<name>:dev`, `IfNotPresent`.
    Kind,
    /// release: `<registry>/<path>@sha256:<64 hex>`.
    Release,
}

/// The policy of a folder, by name.
pub(crate) fn image_policy(folder: &str) -> ImagePolicy {
    if folder.contains("kind") {
        ImagePolicy::Kind
    } else if folder.contains("release") {
        ImagePolicy::Release
    } else {
        ImagePolicy::None
    }
}

/// `kubectl kustomize <dir>` (relative to `root`), as text.
pub(crate) fn kustomize(root: &Path, dir: &str) -> Result<String> {
    let output = Command::new("kubectl")
        .args(["kustomize", dir])
        .current_dir(root)
        .output()
        .context("failed to run `kubectl kustomize` (is kubectl installed? .ci/run installs it)")?;
    if !output.status.success() {
        bail!(
            "`kubectl kustomize {dir}` failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    String::from_utf8(output.stdout)
        .with_context(|| format!("`kubectl kustomize {dir}`: not UTF-8"))
}

/// Parses a multi-document YAML stream into JSON values (empty documents dropped).
pub(crate) fn parse(yaml: &str) -> Result<Vec<Value>> {
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(yaml).context("failed to parse rendered YAML")?;
    Ok(documents.into_iter().filter(|d| !d.is_null()).collect())
}

/// Renders a folder and parses the result.
pub(crate) fn render(root: &Path, dir: &str) -> Result<Vec<Value>> {
    parse(&kustomize(root, dir)?)
}

/// Renders `path` (relative to `root`) with a Flux Kustomization's `images:` applied, as
/// kustomize-controller does: a generated kustomization that includes the path and carries the
/// transformer. (kustomize refuses absolute resource paths, so the generated one lives under
/// `target/`.)
pub(crate) fn render_with_images(
    root: &Path,
    path: &str,
    images: &[flux::Image],
) -> Result<Vec<Value>> {
    let parent = root.join("target").join("xtask-manifests");
    std::fs::create_dir_all(&parent)
        .with_context(|| format!("failed to create {}", parent.display()))?;
    let dir = tempfile::Builder::new()
        .prefix("flux-")
        .tempdir_in(&parent)
        .with_context(|| format!("failed to create a directory in {}", parent.display()))?;
    let relative = format!("../../../{}", path.trim_start_matches("./"));
    let kustomization = serde_json::json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [relative],
        "images": images,
    });
    // JSON is YAML.
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        serde_json::to_string_pretty(&kustomization)?,
    )?;
    let rel_dir = dir
        .path()
        .strip_prefix(root)
        .context("temporary directory is outside the workspace")?
        .to_string_lossy()
        .into_owned();
    render(root, &rel_dir).with_context(|| format!("rendering Flux path {path}"))
}

/// `apiVersion/kind` of an object, for messages.
pub(crate) fn type_of(object: &Value) -> String {
    format!(
        "{}/{}",
        object["apiVersion"].as_str().unwrap_or("?"),
        object["kind"].as_str().unwrap_or("?")
    )
}

/// `kind namespace/name` of an object, for messages.
pub(crate) fn describe(object: &Value) -> String {
    let meta = &object["metadata"];
    let name = meta["name"].as_str().unwrap_or("?");
    match meta["namespace"].as_str() {
        Some(ns) => format!("{} {ns}/{name}", object["kind"].as_str().unwrap_or("?")),
        None => format!("{} {name}", object["kind"].as_str().unwrap_or("?")),
    }
}

/// Deserializes `object` as `T` and checks that serializing it back keeps every field.
fn round_trip<T: DeserializeOwned + Serialize>(object: &Value) -> Result<()> {
    let typed: T = serde_path_to_error::deserialize(object.clone())
        .map_err(|error| anyhow::anyhow!("{}: {}", error.path(), error.inner()))?;
    let back = serde_json::to_value(&typed)?;
    let mut path = String::new();
    if let Some(problem) = first_loss(object, &back, &mut path) {
        bail!("{problem}");
    }
    Ok(())
}

/// The first field of `original` that `back` lost or changed, as a message with its path.
fn first_loss(original: &Value, back: &Value, path: &mut String) -> Option<String> {
    match (original, back) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                if value.is_null() {
                    continue;
                }
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
                let found = match b.get(key) {
                    None => Some(format!("unknown field \"{path}\"")),
                    Some(other) => first_loss(value, other, path),
                };
                path.truncate(len);
                if found.is_some() {
                    return found;
                }
            }
            None
        }
        (Value::Array(a), Value::Array(b)) => {
            if a.len() != b.len() {
                return Some(format!("{path}: list changed length in a round trip"));
            }
            for (index, (x, y)) in a.iter().zip(b).enumerate() {
                let len = path.len();
                path.push_str(&format!("[{index}]"));
                let found = first_loss(x, y, path);
                path.truncate(len);
                if found.is_some() {
                    return found;
                }
            }
            None
        }
        (Value::Number(a), Value::Number(b)) if a.as_f64() == b.as_f64() => None,
        (a, b) if a == b => None,
        (a, b) => Some(format!("{path}: value {a} became {b} in a round trip")),
    }
}

/// Validates one of our kinds against its generated CRD schema too (types, enums, required).
fn crd_schema<T>(object: &Value) -> Result<()>
where
    T: kube_core::CustomResourceExt,
{
    let crd = T::crd();
    let schema = crd
        .spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .context("generated CRD has no schema")?;
    let errors = agent_sandbox_api::schema::validate(schema, object);
    if let Some(first) = errors.first() {
        bail!("{first}");
    }
    Ok(())
}

/// Deserializes `object` into its type with no unknown field; errors say which type and field.
pub(crate) fn check_strict(object: &Value) -> Result<()> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let result = match (api_version, kind) {
        ("v1", "Namespace") => round_trip::<Namespace>(object),
        ("v1", "ServiceAccount") => round_trip::<ServiceAccount>(object),
        ("v1", "Service") => round_trip::<Service>(object),
        ("v1", "Secret") => round_trip::<Secret>(object),
        ("v1", "ConfigMap") => round_trip::<ConfigMap>(object),
        ("apps/v1", "Deployment") => round_trip::<Deployment>(object),
        ("policy/v1", "PodDisruptionBudget") => round_trip::<PodDisruptionBudget>(object),
        ("networking.k8s.io/v1", "NetworkPolicy") => round_trip::<NetworkPolicy>(object),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => round_trip::<ClusterRole>(object),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            round_trip::<ClusterRoleBinding>(object)
        }
        ("rbac.authorization.k8s.io/v1", "Role") => round_trip::<Role>(object),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => round_trip::<RoleBinding>(object),
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
            round_trip::<CustomResourceDefinition>(object)
        }
        (EXTENSIONS_API_VERSION, kinds::SANDBOX_TEMPLATE) => round_trip::<SandboxTemplate>(object)
            .and_then(|()| crd_schema::<SandboxTemplate>(object)),
        (EXTENSIONS_API_VERSION, kinds::SANDBOX_WARM_POOL) => round_trip::<SandboxWarmPool>(object)
            .and_then(|()| crd_schema::<SandboxWarmPool>(object)),
        (EXTENSIONS_API_VERSION, kinds::SANDBOX_CLAIM) => {
            round_trip::<SandboxClaim>(object).and_then(|()| crd_schema::<SandboxClaim>(object))
        }
        (API_VERSION, kinds::SANDBOX) => round_trip::<agent_sandbox_api::Sandbox>(object)
            .and_then(|()| crd_schema::<agent_sandbox_api::Sandbox>(object)),
        (flux::KUSTOMIZE_API, "Kustomization") => round_trip::<flux::Kustomization>(object),
        (flux::HELM_API, "HelmRelease") => round_trip::<flux::HelmRelease>(object),
        (flux::SOURCE_API, "GitRepository") => {
            round_trip::<flux::Object<flux::GitRepositorySpec>>(object)
        }
        (flux::SOURCE_API, "OCIRepository") => {
            round_trip::<flux::Object<flux::OciRepositorySpec>>(object)
        }
        _ => Err(anyhow::anyhow!(
            "no known type for {api_version}/{kind}; add it to manifests::check_strict"
        )),
    };
    result.with_context(|| format!("{} ({})", describe(object), type_of(object)))
}

/// Every container (and init container) anywhere in `object`, with its JSON path.
pub(crate) fn containers(object: &Value) -> Vec<(String, &Value)> {
    fn walk<'a>(value: &'a Value, path: String, out: &mut Vec<(String, &'a Value)>) {
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    let here = format!("{path}.{key}");
                    if (key == "containers" || key == "initContainers")
                        && let Value::Array(items) = child
                    {
                        for (i, item) in items.iter().enumerate() {
                            out.push((format!("{here}[{i}]"), item));
                        }
                        continue;
                    }
                    walk(child, here, out);
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(item, format!("{path}[{i}]"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(object, String::new(), &mut out);
    out
}

/// Volume types the restricted Pod Security Standard admits.
const RESTRICTED_VOLUMES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// Where the pod spec `pod` falls short of the restricted Pod Security Standard (what Pod
/// Security Admission checks on a pod in a namespace that enforces it: the baseline's host
/// namespaces, host paths and ports, privileged containers and capabilities, and the
/// restricted profile's volume types, privilege escalation, non-root users, seccomp profile and
/// dropped capabilities), one line per problem.
pub(crate) fn restricted_problems(pod: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    for host in ["hostNetwork", "hostPID", "hostIPC"] {
        if pod[host] == true {
            problems.push(format!("{host} is true"));
        }
    }
    for volume in pod["volumes"].as_array().into_iter().flatten() {
        let Some(map) = volume.as_object() else {
            continue;
        };
        for kind in map.keys().filter(|k| *k != "name") {
            if !RESTRICTED_VOLUMES.contains(&kind.as_str()) {
                problems.push(format!("volume {}: type {kind}", volume["name"]));
            }
        }
    }
    let pod_sc = &pod["securityContext"];
    let seccomp_ok = |sc: &Value| {
        matches!(
            sc["seccompProfile"]["type"].as_str(),
            Some("RuntimeDefault" | "Localhost")
        )
    };
    if pod_sc["seccompProfile"]["type"] == "Unconfined" {
        problems.push("the pod's seccomp profile is Unconfined".to_owned());
    }
    if pod_sc["runAsUser"] == 0 {
        problems.push("the pod runs as user 0".to_owned());
    }
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for container in pod[list].as_array().into_iter().flatten() {
            let name = format!("{list} {}", container["name"]);
            let sc = &container["securityContext"];
            if sc["privileged"] == true {
                problems.push(format!("{name}: privileged"));
            }
            if sc["allowPrivilegeEscalation"] != false {
                problems.push(format!("{name}: allowPrivilegeEscalation is not false"));
            }
            let non_root = sc["runAsNonRoot"] == true
                || (sc["runAsNonRoot"].is_null() && pod_sc["runAsNonRoot"] == true);
            if !non_root {
                problems.push(format!(
                    "{name}: runAsNonRoot is not true (pod or container)"
                ));
            }
            if sc["runAsUser"] == 0 {
                problems.push(format!("{name}: runs as user 0"));
            }
            let confined = seccomp_ok(sc) || (sc["seccompProfile"].is_null() && seccomp_ok(pod_sc));
            if !confined {
                problems.push(format!(
                    "{name}: no RuntimeDefault or Localhost seccomp profile (pod or container)"
                ));
            }
            let drops_all = sc["capabilities"]["drop"]
                .as_array()
                .is_some_and(|drop| drop.iter().any(|c| c == "ALL"));
            if !drops_all {
                problems.push(format!("{name}: capabilities.drop does not hold ALL"));
            }
            for added in sc["capabilities"]["add"].as_array().into_iter().flatten() {
                if added != "NET_BIND_SERVICE" {
                    problems.push(format!("{name}: adds capability {added}"));
                }
            }
            for port in container["ports"].as_array().into_iter().flatten() {
                if port["hostPort"].as_i64().is_some_and(|p| p != 0) {
                    problems.push(format!("{name}: hostPort {}", port["hostPort"]));
                }
            }
        }
    }
    problems
}

/// Pods of a render that the restricted Pod Security Standard would refuse: those of every
/// Deployment and of every SandboxTemplate (a sandbox namespace may enforce it, and
/// agent-sandbox-system does).
pub(crate) fn pod_security_problems(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .filter_map(|object| {
            let pod = match object["kind"].as_str()? {
                "Deployment" => &object["spec"]["template"]["spec"],
                kinds::SANDBOX_TEMPLATE => &object["spec"]["podTemplate"]["spec"],
                _ => return None,
            };
            Some(
                restricted_problems(pod)
                    .into_iter()
                    .map(|problem| format!("{}: not restricted: {problem}", describe(object))),
            )
        })
        .flatten()
        .collect()
}

/// Problems with the images of a render under `policy`.
pub(crate) fn image_problems(objects: &[Value], policy: ImagePolicy) -> Vec<String> {
    let mut problems = Vec::new();
    if policy == ImagePolicy::None {
        return problems;
    }
    for object in objects {
        for (path, container) in containers(object) {
            let image = container["image"].as_str().unwrap_or_default();
            let at = format!("{}{path}", describe(object));
            if image.is_empty() {
                problems.push(format!("{at}: no image"));
                continue;
            }
            let name = image.split(['@', ':']).next().unwrap_or_default();
            if PLACEHOLDER_IMAGES.contains(&name) {
                problems.push(format!(
                    "{at}: placeholder image {image:?} was not rewritten by an images: transformer"
                ));
                continue;
            }
            match policy {
                ImagePolicy::Kind => {
                    let ok = image.starts_with("agent-sandbox/") && image.ends_with(":dev");
                    if !ok {
                        problems.push(format!(
                            "{at}: kind images are the locally built agent-sandbox/<name>:dev, not {image:?}"
                        ));
                    }
                    if container["imagePullPolicy"].as_str() != Some("IfNotPresent") {
                        problems.push(format!(
                            "{at}: kind images are loaded, never pulled: imagePullPolicy must be IfNotPresent"
                        ));
                    }
                }
                ImagePolicy::Release => {
                    if !is_pinned(image) {
                        problems.push(format!(
                            "{at}: release images are pinned by digest (<registry>/<path>@sha256:<64 hex>), not {image:?}"
                        ));
                    }
                }
                ImagePolicy::None => {}
            }
        }
    }
    problems
}

/// `<registry with a dot>/<path>@sha256:<64 lowercase hex>`.
pub(crate) fn is_pinned(image: &str) -> bool {
    let Some((name, digest)) = image.split_once("@sha256:") else {
        return false;
    };
    let registry = name.split('/').next().unwrap_or_default();
    name.contains('/')
        && registry.contains('.')
        && digest.len() == 64
        && digest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

/// [`find`] among the objects of namespace `ns` (or without one).
fn find_in<'a>(objects: &'a [Value], kind: &str, ns: &str, name: &str) -> Option<&'a Value> {
    objects.iter().find(|o| {
        o["kind"] == kind
            && o["metadata"]["name"] == name
            && o["metadata"]["namespace"].as_str().is_none_or(|n| n == ns)
    })
}

/// Problems with how the controller, router and their clients find each other in a render that
/// contains `deploy/base` (none when it does not).
pub(crate) fn wiring_problems(objects: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let ns = wire::SYSTEM_NAMESPACE;
    // Only renders of the system's namespace (deploy/sandboxes/namespace-router alone is not).
    if !objects.iter().any(|o| o["metadata"]["namespace"] == ns) {
        return problems;
    }
    // The router of agent-sandbox-system (the render may also hold one of a sandboxes'
    // namespace: deploy/sandboxes/namespace-router).
    let Some(router) = find_in(objects, "Deployment", ns, "sandbox-router")
        .or_else(|| find(objects, "Deployment", "sandbox-router"))
    else {
        return problems;
    };
    if router["metadata"]["namespace"] != ns {
        problems.push(format!(
            "router Deployment is in {}, but the controller's default NetworkPolicy and the SDK expect {ns}",
            router["metadata"]["namespace"]
        ));
    }
    let pod_labels = &router["spec"]["template"]["metadata"]["labels"];
    if pod_labels[labels::ROUTER_APP] != labels::ROUTER_APP_VALUE {
        problems.push(format!(
            "router pods lack {}={}, the peer the controller's default NetworkPolicy admits",
            labels::ROUTER_APP,
            labels::ROUTER_APP_VALUE
        ));
    }
    if router["spec"]["replicas"].as_i64().unwrap_or(1) < 2 {
        problems.push("router runs fewer than 2 replicas".to_owned());
    }
    let container_ports: Vec<&Value> = containers(router)
        .into_iter()
        .flat_map(|(_, c)| c["ports"].as_array().into_iter().flatten())
        .collect();
    match find_in(objects, "Service", ns, wire::ROUTER_SERVICE)
        .or_else(|| find(objects, "Service", wire::ROUTER_SERVICE))
    {
        None => problems.push(format!("no Service {}", wire::ROUTER_SERVICE)),
        Some(service) => {
            if service["metadata"]["namespace"] != ns {
                problems.push(format!("Service {} is not in {ns}", wire::ROUTER_SERVICE));
            }
            let selector = service["spec"]["selector"].as_object();
            let selects = selector.is_some_and(|s| {
                !s.is_empty() && s.iter().all(|(k, v)| pod_labels.get(k) == Some(v))
            });
            if !selects {
                problems.push(format!(
                    "Service {} does not select the router pods",
                    wire::ROUTER_SERVICE
                ));
            }
            let port = service["spec"]["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["port"] == i64::from(wire::ROUTER_PORT));
            match port {
                None => problems.push(format!(
                    "Service {} has no port {}",
                    wire::ROUTER_SERVICE,
                    wire::ROUTER_PORT
                )),
                Some(port) => {
                    let target = &port["targetPort"];
                    let reaches = container_ports.iter().any(|cp| {
                        (cp["containerPort"] == i64::from(wire::ROUTER_PORT))
                            && (cp["name"] == *target || cp["containerPort"] == *target)
                    });
                    if !reaches {
                        problems.push(format!(
                            "Service {} port {} does not reach container port {}",
                            wire::ROUTER_SERVICE,
                            wire::ROUTER_PORT,
                            wire::ROUTER_PORT
                        ));
                    }
                }
            }
        }
    }
    if find(objects, "PodDisruptionBudget", "sandbox-router").is_none() {
        problems.push("no PodDisruptionBudget for the router".to_owned());
    }
    match find(objects, "Deployment", wire::CONTROLLER_NAME) {
        None => problems.push(format!("no Deployment {}", wire::CONTROLLER_NAME)),
        Some(controller) => {
            if controller["metadata"]["namespace"] != ns {
                problems.push(format!("controller Deployment is not in {ns}"));
            }
        }
    }
    problems
}

/// Problems with one folder of Flux objects: the chain, its settings and its source.
pub(crate) fn flux_problems(root: &Path, objects: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let sources: BTreeSet<(String, String)> = objects
        .iter()
        .filter(|o| o["apiVersion"] == flux::SOURCE_API)
        .map(|o| {
            (
                o["kind"].as_str().unwrap_or_default().to_owned(),
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    let kustomizations: BTreeMap<String, flux::Kustomization> = objects
        .iter()
        .filter(|o| o["apiVersion"] == flux::KUSTOMIZE_API)
        .filter_map(|o| serde_json::from_value::<flux::Kustomization>(o.clone()).ok())
        .map(|k| (k.metadata.name.clone().unwrap_or_default(), k))
        .collect();
    // The chain's three, and on kind the router of the sandboxes' namespace after them.
    for required in [
        "agent-sandbox-infrastructure",
        "agent-sandbox-controller",
        "agent-sandbox-sandboxes",
    ] {
        if !kustomizations.contains_key(required) {
            problems.push(format!(
                "no Flux Kustomization {required} (the chain is infrastructure, controller, \
                 sandboxes), found {:?}",
                kustomizations.keys().collect::<Vec<_>>()
            ));
        }
    }
    for (name, k) in &kustomizations {
        let spec = &k.spec;
        if !spec.prune {
            problems.push(format!("Kustomization {name}: prune is off"));
        }
        if spec.wait != Some(true) {
            problems.push(format!("Kustomization {name}: wait is not true"));
        }
        if spec.timeout.is_none() {
            problems.push(format!("Kustomization {name}: no timeout"));
        }
        if !sources.contains(&(spec.source_ref.kind.clone(), spec.source_ref.name.clone())) {
            problems.push(format!(
                "Kustomization {name}: source {} {} is not defined beside it",
                spec.source_ref.kind, spec.source_ref.name
            ));
        }
        match &spec.path {
            Some(path) if root.join(path.trim_start_matches("./")).is_dir() => {}
            other => problems.push(format!(
                "Kustomization {name}: path {other:?} is not a folder of this repository"
            )),
        }
        for dependency in &spec.depends_on {
            if !kustomizations.contains_key(&dependency.name) {
                problems.push(format!(
                    "Kustomization {name} depends on {}, which is not defined",
                    dependency.name
                ));
            }
        }
    }
    // The order: CRDs, then the workloads, then objects of our kinds.
    let depends = |name: &str| -> Vec<String> {
        kustomizations
            .get(name)
            .map(|k| k.spec.depends_on.iter().map(|d| d.name.clone()).collect())
            .unwrap_or_default()
    };
    if depends("agent-sandbox-controller") != ["agent-sandbox-infrastructure"]
        || depends("agent-sandbox-sandboxes") != ["agent-sandbox-controller"]
        || !depends("agent-sandbox-infrastructure").is_empty()
    {
        problems.push(
            "Flux chain is not infrastructure -> controller -> sandboxes (dependsOn)".to_owned(),
        );
    }
    problems
}

/// Runs every check; returns one summary line per rendered folder or path, or every problem.
pub(crate) fn check_all(root: &Path) -> Result<Vec<String>> {
    let mut summary = Vec::new();
    let mut problems = Vec::new();
    let mut check_render = |label: &str, objects: &[Value], policy: ImagePolicy| {
        let mut count = 0;
        for object in objects {
            count += 1;
            if let Err(error) = check_strict(object) {
                problems.push(format!("{label}: {error:#}"));
            }
        }
        problems.extend(
            image_problems(objects, policy)
                .into_iter()
                .map(|p| format!("{label}: {p}")),
        );
        problems.extend(
            wiring_problems(objects)
                .into_iter()
                .map(|p| format!("{label}: {p}")),
        );
        problems.extend(
            pod_security_problems(objects)
                .into_iter()
                .map(|p| format!("{label}: {p}")),
        );
        summary.push(format!("{label}: {count} objects"));
    };
    for dir in KUSTOMIZATIONS {
        let objects = render(root, dir)?;
        check_render(dir, &objects, image_policy(dir));
    }
    let mut flux_problem_lines = Vec::new();
    for dir in FLUX {
        let objects = render(root, dir)?;
        check_render(dir, &objects, ImagePolicy::None);
        flux_problem_lines.extend(
            flux_problems(root, &objects)
                .into_iter()
                .map(|p| format!("{dir}: {p}")),
        );
        for object in objects
            .iter()
            .filter(|o| o["apiVersion"] == flux::KUSTOMIZE_API)
        {
            let Ok(k) = serde_json::from_value::<flux::Kustomization>(object.clone()) else {
                continue; // reported by check_strict
            };
            let path = k.spec.path.clone().unwrap_or_default();
            let label = format!(
                "{dir} {} ({path})",
                k.metadata.name.as_deref().unwrap_or("?")
            );
            let rendered = render_with_images(root, &path, &k.spec.images)?;
            check_render(&label, &rendered, image_policy(dir));
        }
    }
    problems.extend(flux_problem_lines);
    if let Err(error) = check_kind_config(root) {
        problems.push(format!("kind/cluster.yaml: {error:#}"));
    } else {
        summary.push("kind/cluster.yaml: ok".to_owned());
    }
    if !problems.is_empty() {
        bail!(
            "{} problem(s) in the delivery manifests:\n  {}",
            problems.len(),
            problems.join("\n  ")
        );
    }
    Ok(summary)
}

/// The kind cluster config (kind.x-k8s.io/v1alpha4): strict, and with kind's own CNI off (Cilium
/// replaces it).
pub(crate) fn check_kind_config(root: &Path) -> Result<()> {
    let text = std::fs::read_to_string(root.join("kind/cluster.yaml"))
        .context("failed to read kind/cluster.yaml")?;
    let config: Value = serde_saphyr::from_str(&text).context("failed to parse")?;
    round_trip::<crate::cluster::KindConfig>(&config)?;
    if config["networking"]["disableDefaultCNI"] != true {
        bail!("networking.disableDefaultCNI must be true (Cilium is the CNI)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace_root;

    /// kubectl renders the manifests; without it the test is skipped (fails under `CI=true`).
    fn kubectl_available() -> bool {
        !agent_sandbox_local::testkit::missing(agent_sandbox_local::testkit::Tool::Kubectl)
    }

    fn rendered(dir: &str) -> Vec<Value> {
        render(&workspace_root(), dir).unwrap()
    }

    fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
        find(objects, kind, name).unwrap_or_else(|| panic!("no {kind} {name}"))
    }

    /// The acceptance check: every overlay, Flux folder and Flux path renders, every object is
    /// strict, images and wiring hold, the Flux chain is complete, the kind config is valid.
    #[test]
    fn every_overlay_and_flux_path_renders_and_checks() {
        if !kubectl_available() {
            return;
        }
        let summary = match check_all(&workspace_root()) {
            Ok(summary) => summary,
            Err(error) => panic!("{error:#}"),
        };
        // The folders, 2 Flux folders with 4 and 3 paths, and the kind config.
        assert_eq!(
            summary.len(),
            KUSTOMIZATIONS.len() + 2 + 7 + 1,
            "{summary:#?}"
        );
    }

    /// A typo in a field name fails, naming the field, whatever kind it is in.
    #[test]
    fn a_typo_is_an_error_naming_the_field() {
        if !kubectl_available() {
            return;
        }
        let objects = rendered("deploy/overlays/kind");

        let mut deployment = object(&objects, "Deployment", "sandbox-router").clone();
        check_strict(&deployment).unwrap();
        deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] =
            "Always".into();
        let error = format!("{:#}", check_strict(&deployment).unwrap_err());
        assert!(
            error.contains("spec.template.spec.containers[0].imagePullPolicyy"),
            "{error}"
        );

        let mut template = object(&objects, kinds::SANDBOX_TEMPLATE, "python-runtime").clone();
        check_strict(&template).unwrap();
        template["spec"]["podTemplate"]["spec"]["containers"][0]["imagePullPolicyy"] =
            "Always".into();
        let error = format!("{:#}", check_strict(&template).unwrap_err());
        assert!(error.contains("imagePullPolicyy"), "{error}");

        let flux = rendered("flux/kind");
        let mut kustomization = object(&flux, "Kustomization", "agent-sandbox-sandboxes").clone();
        kustomization["spec"]["dependOn"] = serde_json::json!([]);
        let error = format!("{:#}", check_strict(&kustomization).unwrap_err());
        assert!(error.contains("dependOn"), "{error}");

        let mut unknown = object(&objects, "Service", "sandbox-router-svc").clone();
        unknown["apiVersion"] = "v2".into();
        let error = format!("{:#}", check_strict(&unknown).unwrap_err());
        assert!(error.contains("no known type for v2/Service"), "{error}");
    }

    /// The same typo in a file on disk fails the whole pipeline (render, then check).
    #[test]
    fn a_typo_in_a_kustomization_fails_check_all_style_rendering() {
        if !kubectl_available() {
            return;
        }
        let root = workspace_root();
        let parent = root.join("target").join("xtask-manifests");
        std::fs::create_dir_all(&parent).unwrap();
        let dir = tempfile::Builder::new()
            .prefix("typo-")
            .tempdir_in(&parent)
            .unwrap();
        std::fs::write(
            dir.path().join("kustomization.yaml"),
            "resources: [deployment.yaml]\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("deployment.yaml"),
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  selector:\n    matchLabels: {app: x}\n  template:\n    metadata:\n      labels: {app: x}\n    spec:\n      containers:\n        - name: x\n          image: r.io/x@sha256:0000000000000000000000000000000000000000000000000000000000000000\n          imagePullPolicyy: IfNotPresent\n",
        )
        .unwrap();
        let rel = dir.path().strip_prefix(&root).unwrap().to_str().unwrap();
        let objects = render(&root, rel).unwrap();
        let error = format!("{:#}", check_strict(&objects[0]).unwrap_err());
        assert!(error.contains("unknown field"), "{error}");
        assert!(error.contains("imagePullPolicyy"), "{error}");
        assert!(error.contains("Deployment x"), "{error}");
    }

    #[test]
    fn image_rules() {
        let deployment = |image: &str, policy: &str| {
            serde_json::json!({"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": {"spec": {
                "containers": [{"name": "c", "image": image, "imagePullPolicy": policy}]}}}})
        };
        let pinned =
            "ghcr.io/a/b@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        assert!(
            image_problems(&[deployment(pinned, "IfNotPresent")], ImagePolicy::Release).is_empty()
        );
        for bad in [
            "ghcr.io/a/b:v1",
            "b@sha256:00",
            "a/b@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(
                image_problems(&[deployment(bad, "IfNotPresent")], ImagePolicy::Release).len(),
                1,
                "{bad}"
            );
        }
        assert!(
            image_problems(
                &[deployment("agent-sandbox/router:dev", "IfNotPresent")],
                ImagePolicy::Kind
            )
            .is_empty()
        );
        assert_eq!(
            image_problems(
                &[deployment("agent-sandbox/router:dev", "Always")],
                ImagePolicy::Kind
            )
            .len(),
            1
        );
        assert_eq!(
            image_problems(
                &[deployment("agent-sandbox/router:latest", "IfNotPresent")],
                ImagePolicy::Kind
            )
            .len(),
            1
        );
        let problems = image_problems(
            &[deployment("sandbox-router", "IfNotPresent")],
            ImagePolicy::Kind,
        );
        assert!(problems[0].contains("placeholder"), "{problems:?}");
    }

    /// The router runs where the controller's default NetworkPolicy admits it (gotcha 3) and
    /// where clients look for it (gotcha 2); a drift is caught.
    #[test]
    fn the_router_is_where_the_controller_policy_and_clients_expect_it() {
        if !kubectl_available() {
            return;
        }
        let mut objects = rendered("deploy/overlays/kind");
        assert_eq!(wiring_problems(&objects), Vec::<String>::new());

        let defaults = agent_sandbox_controller::Config::default().policy;
        let router = object(&objects, "Deployment", "sandbox-router");
        assert_eq!(router["metadata"]["namespace"], defaults.router_namespace);
        for (key, value) in &defaults.router_pod_labels {
            assert_eq!(
                router["spec"]["template"]["metadata"]["labels"][key],
                *value
            );
        }

        let index = objects
            .iter()
            .position(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "sandbox-router")
            .unwrap();
        objects[index]["spec"]["template"]["metadata"]["labels"]["app"] = "router".into();
        objects[index]["metadata"]["namespace"] = "default".into();
        let problems = wiring_problems(&objects);
        assert_eq!(problems.len(), 3, "{problems:#?}"); // namespace, label, Service selector
    }

    fn container_port(container: &Value, name: &str) -> i64 {
        container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()["containerPort"]
            .as_i64()
            .unwrap()
    }

    fn args(container: &Value) -> Vec<String> {
        container["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect()
    }

    /// The Deployments' arguments are valid flags of the binaries, and the probes and Service
    /// target the ports those flags open.
    #[test]
    fn deployment_arguments_parse_and_match_the_probes() {
        use clap::Parser as _;
        if !kubectl_available() {
            return;
        }
        let objects = rendered("deploy/base");

        let controller = object(&objects, "Deployment", wire::CONTROLLER_NAME);
        let container = &controller["spec"]["template"]["spec"]["containers"][0];
        // Upstream's container name (its manifests' `agent-sandbox-controller`), so patches
        // written against upstream apply to ours.
        assert_eq!(container["name"], wire::CONTROLLER_NAME);
        let argv = std::iter::once("agent-sandbox-controller".to_owned()).chain(args(container));
        let config = agent_sandbox_controller::Args::try_parse_from(argv)
            .unwrap()
            .into_config()
            .unwrap();
        let health = config.health_addr.unwrap().port();
        assert_eq!(i64::from(health), container_port(container, "health"));
        assert_eq!(health, wire::CONTROLLER_HEALTH_PORT);
        assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert_eq!(container["readinessProbe"]["httpGet"]["port"], "health");
        let metrics = config.metrics_addr.unwrap().port();
        assert_eq!(i64::from(metrics), container_port(container, "metrics"));
        assert!(config.leader_election.is_some(), "leader election is on");
        assert_eq!(controller["spec"]["strategy"]["type"], "Recreate");

        #[derive(clap::Parser)]
        struct RouterCli {
            #[command(flatten)]
            args: agent_sandbox_router::Args,
            #[arg(long)]
            log_format: String,
        }
        let router = object(&objects, "Deployment", "sandbox-router");
        let pod = &router["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        let argv = std::iter::once("sandbox-router".to_owned()).chain(args(container));
        let cli = RouterCli::try_parse_from(argv).unwrap();
        assert_eq!(cli.log_format, "json");
        assert_eq!(cli.args.auth, Some(agent_sandbox_router::AuthMode::Scoped));
        assert_eq!(
            i64::from(cli.args.listen.port()),
            container_port(container, "http")
        );
        // The signing key file is inside the mounted Secret.
        let mount = container["volumeMounts"][0]["mountPath"].as_str().unwrap();
        assert!(cli.args.signing_key_file[0].starts_with(mount));
        assert_eq!(
            pod["volumes"][0]["secret"]["secretName"],
            "sandbox-router-signing-key"
        );
        assert!(
            pod["terminationGracePeriodSeconds"].as_f64().unwrap()
                > cli.args.shutdown_grace.as_secs_f64()
        );
    }

    /// Problems of a sandbox template's pod spec (`spec.podTemplate.spec`): the restricted Pod
    /// Security Standard, a liveness probe on the runtime's health endpoint (a runtime that
    /// stops answering is restarted) and an ephemeral-storage limit with a request not above it
    /// (what a sandbox writes is capped).
    pub(crate) fn sandbox_pod_problems(pod: &Value) -> Vec<String> {
        use agent_sandbox_api::units::parse_quantity_milli;
        let mut problems = restricted_problems(pod);
        let runtime = &pod["containers"][0];
        let probe = &runtime["livenessProbe"]["httpGet"];
        if probe["path"] != agent_sandbox_api::runtime::v1::paths::HEALTH
            || probe["port"] != wire::RUNTIME_PORT
        {
            problems.push(format!(
                "no liveness probe of the runtime's health: {probe}"
            ));
        }
        let resources = &runtime["resources"];
        let quantity = |value: &Value| value.as_str().and_then(|q| parse_quantity_milli(q).ok());
        match (
            quantity(&resources["limits"]["ephemeral-storage"]),
            quantity(&resources["requests"]["ephemeral-storage"]),
        ) {
            (Some(limit), Some(request)) if request <= limit && limit > 0 => {}
            _ => problems.push(format!(
                "no ephemeral-storage limit with a request not above it: {resources}"
            )),
        }
        problems
    }

    /// The default template's pods meet the restricted Pod Security Standard without the
    /// controller's defaults, have a liveness probe, and a disk cap.
    #[test]
    fn the_default_template_is_restricted_probed_and_disk_capped() {
        if !kubectl_available() {
            return;
        }
        let objects = rendered("deploy/sandboxes");
        let template = object(&objects, kinds::SANDBOX_TEMPLATE, "python-runtime");
        let pod = &template["spec"]["podTemplate"]["spec"];
        assert_eq!(sandbox_pod_problems(pod), Vec::<String>::new());
        // The check finds what it looks for.
        let mut weakened = pod.clone();
        weakened["securityContext"]["seccompProfile"] = Value::Null;
        weakened["containers"][0]["securityContext"]["capabilities"]["add"] =
            serde_json::json!(["SYS_ADMIN"]);
        weakened["containers"][0]["livenessProbe"] = Value::Null;
        weakened["containers"][0]["resources"]["limits"]["ephemeral-storage"] = Value::Null;
        weakened["volumes"] = serde_json::json!([{"name": "host", "hostPath": {"path": "/"}}]);
        let problems = sandbox_pod_problems(&weakened);
        assert_eq!(problems.len(), 5, "{problems:#?}");
    }

    /// `deploy/sandboxes-gvisor` is `deploy/sandboxes` with `-gvisor` names, the pool pointing
    /// at the suffixed template, and `runtimeClassName: gvisor`: nothing else differs.
    #[test]
    fn the_gvisor_sandboxes_differ_only_in_names_and_runtime_class() {
        if !kubectl_available() {
            return;
        }
        let plain = rendered("deploy/sandboxes");
        let gvisor = rendered("deploy/sandboxes-gvisor");
        let mut template = object(&plain, kinds::SANDBOX_TEMPLATE, "python-runtime").clone();
        template["metadata"]["name"] = "python-runtime-gvisor".into();
        template["spec"]["podTemplate"]["spec"]["runtimeClassName"] = "gvisor".into();
        assert_eq!(
            object(&gvisor, kinds::SANDBOX_TEMPLATE, "python-runtime-gvisor"),
            &template
        );
        let mut pool = object(&plain, kinds::SANDBOX_WARM_POOL, "python-sandbox-pool").clone();
        pool["metadata"]["name"] = "python-sandbox-pool-gvisor".into();
        pool["spec"]["sandboxTemplateRef"]["name"] = "python-runtime-gvisor".into();
        assert_eq!(
            object(
                &gvisor,
                kinds::SANDBOX_WARM_POOL,
                "python-sandbox-pool-gvisor"
            ),
            &pool
        );
        assert_eq!(gvisor.len(), plain.len());
    }

    /// Read-only router, no wildcard and no Secrets for either component, restricted pods.
    #[test]
    fn rbac_and_security_contexts_are_least_privilege() {
        if !kubectl_available() {
            return;
        }
        let objects = rendered("deploy/base");
        for role in objects
            .iter()
            .filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role")
        {
            for rule in role["rules"].as_array().unwrap() {
                let text = rule.to_string();
                assert!(
                    !text.contains("\"*\""),
                    "wildcard in {}: {text}",
                    describe(role)
                );
                assert!(
                    !text.contains("secrets"),
                    "secrets in {}: {text}",
                    describe(role)
                );
                if role["metadata"]["name"] == "sandbox-router" {
                    // Reads, and one write: sandboxes' status (lastActivityTime), never a spec.
                    let status_only = rule["resources"] == serde_json::json!(["sandboxes/status"])
                        && rule["verbs"] == serde_json::json!(["patch"]);
                    for verb in rule["verbs"].as_array().unwrap() {
                        assert!(
                            status_only
                                || ["get", "list", "watch"].contains(&verb.as_str().unwrap()),
                            "router may only read, and patch sandboxes/status: {text}"
                        );
                    }
                }
            }
        }
        for name in [wire::CONTROLLER_NAME, "sandbox-router"] {
            let pod = &object(&objects, "Deployment", name)["spec"]["template"]["spec"];
            assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{name}");
            assert_eq!(
                pod["securityContext"]["seccompProfile"]["type"],
                "RuntimeDefault"
            );
            for (_, container) in containers(pod) {
                let sc = &container["securityContext"];
                assert_eq!(sc["allowPrivilegeEscalation"], false, "{name}");
                assert_eq!(sc["readOnlyRootFilesystem"], true, "{name}");
                assert_eq!(
                    sc["capabilities"]["drop"],
                    serde_json::json!(["ALL"]),
                    "{name}"
                );
                assert!(container["resources"]["requests"].is_object(), "{name}");
                assert!(
                    container["resources"]["limits"]["memory"].is_string(),
                    "{name}"
                );
            }
        }
        let namespace = object(&objects, "Namespace", wire::SYSTEM_NAMESPACE);
        assert_eq!(
            namespace["metadata"]["labels"][labels::POD_SECURITY_ENFORCE],
            labels::POD_SECURITY_RESTRICTED
        );
        for name in [wire::CONTROLLER_NAME, "sandbox-router"] {
            let pod = &object(&objects, "Deployment", name)["spec"]["template"]["spec"];
            assert_eq!(restricted_problems(pod), Vec::<String>::new(), "{name}");
        }
    }

    /// The sandboxes component as Flux delivers it on kind (flux/kind, images transformed)
    /// applies with kubectl to the simulated cluster, and the controller fills its warm pool with
    /// Ready sandboxes running the real runtime (the image maps to `sandbox-runtime`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_sandboxes_component_fills_its_warm_pool_on_the_sim() {
        use agent_sandbox_local::{LocalCluster, LocalConfig, testkit};
        if !kubectl_available() {
            return;
        }
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let root = workspace_root();

        let flux_objects = rendered("flux/kind");
        let sandboxes: flux::Kustomization = serde_json::from_value(
            object(&flux_objects, "Kustomization", "agent-sandbox-sandboxes").clone(),
        )
        .unwrap();
        let path = sandboxes.spec.path.clone().unwrap();
        let objects = render_with_images(&root, &path, &sandboxes.spec.images).unwrap();
        let pool_object = object(&objects, kinds::SANDBOX_WARM_POOL, "python-sandbox-pool");
        let namespace = pool_object["metadata"]["namespace"]
            .as_str()
            .unwrap()
            .to_owned();
        let replicas = pool_object["spec"]["replicas"].as_i64().unwrap();
        let image = object(&objects, kinds::SANDBOX_TEMPLATE, "python-runtime")["spec"]["podTemplate"]
            ["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(image, "agent-sandbox/runtime-python:dev");

        // The sim with the controller and the runtime for `*runtime*` images (the image above
        // is one); no router and no objects of its own: kubectl applies them.
        let mut sim = LocalCluster::start(LocalConfig {
            runtime: testkit::runtime_program().unwrap(),
            in_process_router: false,
            defaults: false,
            ..LocalConfig::default()
        })
        .await
        .unwrap();
        let client = sim.client();

        // Apply what Flux would, with the real kubectl.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sandboxes.json");
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
        std::fs::write(&file, serde_json::to_vec(&list).unwrap()).unwrap();
        let apply = tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(sim.kubeconfig_path())
            .arg("--cache-dir")
            .arg(dir.path().join("cache"))
            // Schema validation is done offline (check_strict); the sim serves no OpenAPI.
            .args(["apply", "--server-side", "--validate=false", "-f"])
            .arg(&file)
            .kill_on_drop(true)
            .output();
        let output = tokio::time::timeout(std::time::Duration::from_secs(120), apply)
            .await
            .expect("kubectl apply finished in time")
            .unwrap();
        assert!(
            output.status.success(),
            "kubectl apply failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );

        let pools: kube::Api<SandboxWarmPool> = kube::Api::namespaced(client.clone(), &namespace);
        testkit::wait_for(
            "the warm pool to be Ready",
            std::time::Duration::from_secs(60),
            || async {
                let pool = pools.get("python-sandbox-pool").await.unwrap();
                let ready = pool.status.as_ref().map_or(0, |s| s.ready_replicas);
                Ok::<_, testkit::Timeout>(if i64::from(ready) == replicas {
                    testkit::Check::Done(())
                } else {
                    testkit::Check::NotYet(format!("{:?}", pool.status))
                })
            },
        )
        .await
        .unwrap();

        // Its members run the runtime under the template's managed NetworkPolicy.
        let policies: kube::Api<NetworkPolicy> = kube::Api::namespaced(client.clone(), &namespace);
        let policy = policies.get("python-runtime-network-policy").await.unwrap();
        let peer = &policy.spec.unwrap().ingress.unwrap()[0]
            .from
            .clone()
            .unwrap()[0];
        assert_eq!(
            peer.namespace_selector
                .as_ref()
                .unwrap()
                .match_labels
                .as_ref()
                .unwrap()["kubernetes.io/metadata.name"],
            wire::SYSTEM_NAMESPACE
        );
        sim.stop_controller(std::time::Duration::from_secs(60))
            .await
            .unwrap();
        sim.stop().await;
    }
}
