//! The router as a real installation runs it: the pod [`ROUTER_POD`] labelled
//! `app: sandbox-router` behind `sandbox-router-svc` in `agent-sandbox-system` (where the SDK's
//! port-forward mode and the controller's default NetworkPolicy expect it), and another in the
//! sandboxes' namespace (where upstream's Go SDK looks), each with its signing key in the Secret
//! `cargo xtask cluster up` creates (or its bearer token in [`TOKEN_SECRET`]) mounted as
//! deploy/base mounts the key, and reaching the API server only as its ServiceAccount
//! `sandbox-router`, with the RBAC of `deploy/base/router/rbac.yaml` (a ClusterRole) and
//! `deploy/sandboxes/namespace-router/rbac.yaml` (a Role in its namespace): its token is
//! projected into the pod as the API server's ServiceAccount admission projects one, and read
//! by in-cluster configuration. A pod sees none of the host's files and never the kubeconfig's
//! credential. And the Gateway a Gateway implementation would program in front of a router.
//! [`image_entry`], [`create_pod`], [`wait_ready`] and [`write_gateway`] also serve other
//! clusters whose node is our kubelet (the control-plane tier of `tests/`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use agent_sandbox_api::{labels, wire};
use agent_sandbox_sim::{DefaultReadiness, ImageEntry, Program};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::Value;
use serde_json::json;

use crate::config::RouterAuth;
use crate::defaults::{DEFAULT_NAMESPACE, GATEWAY, ROUTER_POD};
use crate::error::{Error, Result};
use crate::wait::{Check, wait_for};

/// Image of the router pod (the sim runs the configured binary for `*sandbox-router*`).
const ROUTER_IMAGE: &str = "agent-sandbox/sandbox-router:local";
/// How long the router pod may take to become Ready.
const ROUTER_READY: Duration = Duration::from_secs(120);
/// The router's ServiceAccount, as deploy/base and deploy/sandboxes name it.
pub const SERVICE_ACCOUNT: &str = "sandbox-router";
/// The RBAC of the router in `agent-sandbox-system` (ServiceAccount, ClusterRole and its
/// binding) and of the router in the sandboxes' namespace (ServiceAccount, Role and its
/// binding).
const CLUSTER_RBAC: &str = include_str!("../../../deploy/base/router/rbac.yaml");
const NAMESPACE_RBAC: &str = include_str!("../../../deploy/sandboxes/namespace-router/rbac.yaml");
/// The ConfigMap with the API server's certificate authority (`ca.crt`).
const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";
/// Where in-cluster configuration reads a pod's ServiceAccount token, CA and namespace.
const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The projected token's lifetime (the ServiceAccount admission's; the kubelet renews it).
const TOKEN_SECONDS: i64 = 3607;
/// The Secret holding the router pods' bearer token for `--auth token` (key `token`).
pub const TOKEN_SECRET: &str = "sandbox-router-token";
const TOKEN_KEY: &str = "token";
const TOKEN_DIR: &str = "/etc/sandbox-router/token";
/// Where deploy/base's router mounts its signing key.
const SIGNING_KEY_DIR: &str = "/etc/sandbox-router/signing-key";

fn from_json<T: serde::de::DeserializeOwned>(
    what: &'static str,
    value: serde_json::Value,
) -> Result<T> {
    serde_json::from_value(value).map_err(|error| Error::BuiltIn {
        what,
        message: error.to_string(),
    })
}

/// The image-table row that runs `binary` as the router pod with `auth`, reading its token or
/// signing key from the volume [`create_pod`] mounts.
pub fn image_entry(binary: &Path, auth: RouterAuth) -> ImageEntry {
    let mut args = vec![
        format!("--listen={{pod_ip}}:{}", wire::ROUTER_PORT),
        format!("--auth={}", auth.flag()),
        "--access-log=false".to_owned(),
    ];
    match auth {
        RouterAuth::Token => args.push(format!("--token-file={TOKEN_DIR}/{TOKEN_KEY}")),
        RouterAuth::Scoped => args.push(format!(
            "--signing-key-file={SIGNING_KEY_DIR}/{}",
            wire::ROUTER_SIGNING_KEY_SECRET_KEY
        )),
        RouterAuth::None => {}
    }
    ImageEntry::new("*sandbox-router*", Program::Path(binary.to_path_buf()))
        .args(args)
        .port(wire::ROUTER_PORT)
        .readiness(DefaultReadiness::Http {
            port: wire::ROUTER_PORT,
            path: "/readyz".to_owned(),
        })
}

/// What the router pods are given: how they authenticate their clients and the token or
/// signing key that goes with it.
#[derive(Clone, Copy, Debug)]
pub struct RouterFiles<'a> {
    pub auth: RouterAuth,
    pub secret: Option<&'a str>,
    /// The API server's certificate authority, PEM, for `kube-root-ca.crt`.
    pub ca_pem: &'a str,
}

/// Publishes the API server's certificate authority in `ns` as `kube-root-ca.crt`, where
/// in-cluster configuration finds it (kube-controller-manager publishes it on a real cluster;
/// the simulated one has no such controller).
async fn publish_root_ca(client: &kube::Client, ns: &str, ca_pem: &str) -> Result<()> {
    let configmap: ConfigMap = from_json(
        "the kube-root-ca.crt ConfigMap",
        json!({"metadata": {"name": ROOT_CA_CONFIGMAP, "namespace": ns},
               "data": {"ca.crt": ca_pem}}),
    )?;
    match Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &configmap)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(error) => Err(Error::kube(
            "create",
            format!("ConfigMap {ns}/{ROOT_CA_CONFIGMAP}"),
        )(error)),
    }
}

/// Creates the objects of an RBAC manifest (`---`-separated) in `ns`: namespaced ones there,
/// and ClusterRoleBindings' ServiceAccount subjects without a namespace too.
async fn apply_rbac(client: &kube::Client, manifest: &'static str, ns: &str) -> Result<()> {
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(manifest).map_err(|error| Error::BuiltIn {
            what: "the router's RBAC manifest",
            message: error.to_string(),
        })?;
    for mut object in documents.into_iter().filter(|d| d.is_object()) {
        let text = |object: &Value, pointer: &str| {
            object
                .pointer(pointer)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let (api_version, kind) = (text(&object, "/apiVersion"), text(&object, "/kind"));
        let name = text(&object, "/metadata/name");
        let (group, version) = api_version
            .rsplit_once('/')
            .unwrap_or(("", api_version.as_str()));
        let (plural, namespaced) = match kind.as_str() {
            "ServiceAccount" => ("serviceaccounts", true),
            "Role" => ("roles", true),
            "RoleBinding" => ("rolebindings", true),
            "ClusterRole" => ("clusterroles", false),
            "ClusterRoleBinding" => ("clusterrolebindings", false),
            _ => {
                return Err(Error::BuiltIn {
                    what: "the router's RBAC manifest",
                    message: format!("unexpected kind {kind}"),
                });
            }
        };
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, &kind),
            plural,
        );
        let api: Api<DynamicObject> = if namespaced {
            object["metadata"]["namespace"] = json!(ns);
            Api::namespaced_with(client.clone(), ns, &resource)
        } else {
            Api::all_with(client.clone(), &resource)
        };
        let dynamic: DynamicObject = from_json("the router's RBAC manifest", object)?;
        match api.create(&PostParams::default(), &dynamic).await {
            Ok(_) => {}
            // Cluster-scoped objects are shared by every local cluster's installation.
            Err(kube::Error::Api(status)) if status.code == 409 && !namespaced => {}
            Err(error) => return Err(Error::kube("create", format!("{kind} {ns}/{name}"))(error)),
        }
    }
    Ok(())
}

/// Installs the router as `deploy/overlays/kind` does: in `agent-sandbox-system`, and in the
/// sandboxes' namespace for upstream's Go SDK (`deploy/sandboxes/namespace-router`), each with
/// its Secrets (kubeconfig; signing key or token), `sandbox-router-svc` and a pod; waits until
/// the pods are Ready and returns the IP of the one in `agent-sandbox-system`.
pub(crate) async fn install(client: &kube::Client, files: RouterFiles<'_>) -> Result<String> {
    for ns in [wire::SYSTEM_NAMESPACE, DEFAULT_NAMESPACE] {
        install_in(client, files, ns).await?;
    }
    same_namespace_policy(client, DEFAULT_NAMESPACE).await?;
    wait_ready_in(client, DEFAULT_NAMESPACE, ROUTER_POD).await?;
    wait_ready(client, ROUTER_POD).await
}

/// The policy of `deploy/sandboxes/namespace-router/networkpolicy.yaml` in `ns`: policies are
/// additive, so besides the template's (which admits the router of `agent-sandbox-system`) this
/// one admits the router of the sandboxes' own namespace to their runtime port. Without it that
/// router's requests are dropped where policies are enforced (the seed article's gotcha 3).
async fn same_namespace_policy(client: &kube::Client, ns: &str) -> Result<()> {
    let name = "sandbox-router-same-namespace";
    let policy: NetworkPolicy = from_json(
        "the namespace router's NetworkPolicy",
        json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "podSelector": {"matchExpressions": [
                    {"key": labels::SANDBOX_NAME_HASH, "operator": "Exists"}]},
                "policyTypes": ["Ingress"],
                "ingress": [{
                    "from": [{"podSelector": {"matchLabels": {
                        labels::ROUTER_APP: labels::ROUTER_APP_VALUE}}}],
                    "ports": [{"protocol": "TCP", "port": wire::RUNTIME_PORT}]
                }]
            }
        }),
    )?;
    Api::<NetworkPolicy>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &policy)
        .await
        .map_err(Error::kube("create", format!("NetworkPolicy {ns}/{name}")))?;
    Ok(())
}

async fn create_secret(
    client: &kube::Client,
    ns: &str,
    name: &str,
    key: &str,
    value: &str,
) -> Result<()> {
    let mut secret: Secret = from_json(
        "a router Secret",
        json!({"metadata": {"name": name, "namespace": ns}}),
    )?;
    secret.data = Some(BTreeMap::from([(
        key.to_owned(),
        k8s_openapi::ByteString(value.as_bytes().to_vec()),
    )]));
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .map_err(Error::kube("create", format!("Secret {ns}/{name}")))?;
    Ok(())
}

async fn install_in(client: &kube::Client, files: RouterFiles<'_>, ns: &str) -> Result<()> {
    let post = PostParams::default();
    let namespace: Namespace =
        from_json("the router Namespace", json!({"metadata": {"name": ns}}))?;
    match Api::<Namespace>::all(client.clone())
        .create(&post, &namespace)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(error) => return Err(Error::kube("create", format!("Namespace {ns}"))(error)),
    }
    let rbac = if ns == wire::SYSTEM_NAMESPACE {
        CLUSTER_RBAC
    } else {
        NAMESPACE_RBAC
    };
    apply_rbac(client, rbac, ns).await?;
    publish_root_ca(client, ns, files.ca_pem).await?;
    match (files.auth, files.secret) {
        (RouterAuth::Scoped, Some(key)) => {
            create_secret(
                client,
                ns,
                wire::ROUTER_SIGNING_KEY_SECRET,
                wire::ROUTER_SIGNING_KEY_SECRET_KEY,
                key,
            )
            .await?;
        }
        (RouterAuth::Token, Some(token)) => {
            create_secret(client, ns, TOKEN_SECRET, TOKEN_KEY, token).await?;
        }
        _ => {}
    }
    let service: Service = from_json(
        "the router Service",
        json!({
            "metadata": {"name": wire::ROUTER_SERVICE, "namespace": ns},
            "spec": {"selector": {labels::ROUTER_APP: labels::ROUTER_APP_VALUE},
                     "ports": [{"name": "http", "port": wire::ROUTER_PORT,
                                "targetPort": wire::ROUTER_PORT}]}
        }),
    )?;
    Api::<Service>::namespaced(client.clone(), ns)
        .create(&post, &service)
        .await
        .map_err(Error::kube(
            "create",
            format!("Service {ns}/{}", wire::ROUTER_SERVICE),
        ))?;
    create_pod_in(client, files.auth, ns, ROUTER_POD).await
}

/// Creates (another) router pod named `name` behind `sandbox-router-svc` in
/// `agent-sandbox-system`, authenticating with `auth` (its Secrets are there already).
pub async fn create_pod(client: &kube::Client, auth: RouterAuth, name: &str) -> Result<()> {
    create_pod_in(client, auth, wire::SYSTEM_NAMESPACE, name).await
}

async fn create_pod_in(
    client: &kube::Client,
    auth: RouterAuth,
    ns: &str,
    name: &str,
) -> Result<()> {
    // What the ServiceAccount admission adds to a pod on a real API server (which adds nothing
    // more, seeing the mount), declared here because the simulated cluster adds nothing.
    let mut volumes = vec![json!({"name": "kube-api-access", "projected": {
    "defaultMode": 0o444,
    "sources": [
        {"serviceAccountToken": {"expirationSeconds": TOKEN_SECONDS, "path": "token"}},
        {"configMap": {"name": ROOT_CA_CONFIGMAP, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace",
            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
    ]}})];
    let mut mounts = vec![json!({"name": "kube-api-access",
        "mountPath": SERVICE_ACCOUNT_DIR, "readOnly": true})];
    // The router of the sandboxes' namespace watches only there (its Role allows no more).
    let mut env = Vec::new();
    if ns != wire::SYSTEM_NAMESPACE {
        env.push(json!({"name": "SANDBOX_ROUTER_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}));
    }
    let auth_volume = match auth {
        RouterAuth::Token => Some((TOKEN_SECRET, TOKEN_DIR)),
        RouterAuth::Scoped => Some((wire::ROUTER_SIGNING_KEY_SECRET, SIGNING_KEY_DIR)),
        RouterAuth::None => None,
    };
    if let Some((secret, dir)) = auth_volume {
        volumes
            .push(json!({"name": "auth", "secret": {"secretName": secret, "defaultMode": 0o400}}));
        mounts.push(json!({"name": "auth", "mountPath": dir, "readOnly": true}));
    }
    let pod: Pod = from_json(
        "the router Pod",
        json!({
            "metadata": {"name": name, "namespace": ns,
                         "labels": {labels::ROUTER_APP: labels::ROUTER_APP_VALUE}},
            // The security context of deploy/base's router, which Pod Security admission
            // ("restricted", the label of its namespace there) requires. The auth Secret's
            // files belong to root with mode 0400, as on a node: the router reads them as their
            // group (fsGroup).
            "spec": {
                // deploy/base's ServiceAccount, whose token the volume above projects.
                "serviceAccountName": SERVICE_ACCOUNT,
                "automountServiceAccountToken": false,
                "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                                    "fsGroup": 65532,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "router", "image": ROUTER_IMAGE,
                    "env": env,
                    "ports": [{"name": "http", "containerPort": wire::ROUTER_PORT}],
                    "volumeMounts": mounts,
                    "securityContext": {"allowPrivilegeEscalation": false,
                                        "readOnlyRootFilesystem": true,
                                        "capabilities": {"drop": ["ALL"]}}
                }],
                "volumes": volumes
            }
        }),
    )?;
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .map_err(Error::kube("create", format!("Pod {ns}/{name}")))?;
    Ok(())
}

/// Waits until the router pod `name` in `agent-sandbox-system` is Ready and returns its IP.
pub async fn wait_ready(client: &kube::Client, name: &str) -> Result<String> {
    wait_ready_in(client, wire::SYSTEM_NAMESPACE, name).await
}

async fn wait_ready_in(client: &kube::Client, ns: &str, name: &str) -> Result<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_for(
        &format!("the router pod {ns}/{name} to be Ready"),
        ROUTER_READY,
        || async {
            let pod = pods
                .get(name)
                .await
                .map_err(Error::kube("get", format!("Pod {ns}/{name}")))?;
            let status = pod.status.unwrap_or_default();
            let ready = status
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            Ok(match (ready, status.pod_ip) {
                (true, Some(ip)) => Check::Done(ip),
                _ => Check::NotYet(format!("phase {}", status.phase.unwrap_or_default())),
            })
        },
    )
    .await
}

/// Writes the Gateway [`GATEWAY`] in [`DEFAULT_NAMESPACE`] with an HTTP listener on `port` and
/// `address` in its status, as a Gateway implementation would once programmed.
pub async fn write_gateway(client: &kube::Client, address: &str, port: u16) -> Result<()> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "Gateway"),
        "gateways",
    );
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), DEFAULT_NAMESPACE, &resource);
    let mut gateway = DynamicObject::new(GATEWAY, &resource);
    gateway.data = json!({"spec": {
        "gatewayClassName": "sim",
        "listeners": [{"name": "http", "protocol": "HTTP", "port": port}]
    }});
    api.create(&PostParams::default(), &gateway)
        .await
        .map_err(Error::kube(
            "create",
            format!("Gateway {DEFAULT_NAMESPACE}/{GATEWAY}"),
        ))?;
    let status = json!({"status": {"addresses": [{"type": "IPAddress", "value": address}]}});
    let params = PatchParams::default();
    if api
        .patch_status(GATEWAY, &params, &Patch::Merge(&status))
        .await
        .is_err()
    {
        // Without a status subresource the status is part of the object.
        api.patch(GATEWAY, &params, &Patch::Merge(&status))
            .await
            .map_err(Error::kube(
                "write the status of",
                format!("Gateway {DEFAULT_NAMESPACE}/{GATEWAY}"),
            ))?;
    }
    Ok(())
}
