//! The router as a real installation runs it: the pod [`ROUTER_POD`] labelled
//! `app: sandbox-router` behind `sandbox-router-svc` in `agent-sandbox-system` (where the SDK's
//! port-forward mode and the controller's default NetworkPolicy expect it), and another in the
//! sandboxes' namespace (where upstream's Go SDK looks), each with its signing key in the Secret
//! `cargo xtask cluster up` creates; and the Gateway a Gateway implementation
//! would program in front of a router. [`image_entry`], [`create_pod`], [`wait_ready`] and
//! [`write_gateway`] also serve other clusters whose node is our kubelet (the control-plane
//! tier of `tests/`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use agent_sandbox_api::{labels, wire};
use agent_sandbox_sim::{DefaultReadiness, ImageEntry, Program};
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::config::RouterAuth;
use crate::defaults::{DEFAULT_NAMESPACE, GATEWAY, ROUTER_POD};
use crate::error::{Error, Result};
use crate::wait::{Check, wait_for};

/// Image of the router pod (the sim runs the configured binary for `*sandbox-router*`).
const ROUTER_IMAGE: &str = "agent-sandbox/sandbox-router:local";
/// How long the router pod may take to become Ready.
const ROUTER_READY: Duration = Duration::from_secs(120);

fn from_json<T: serde::de::DeserializeOwned>(
    what: &'static str,
    value: serde_json::Value,
) -> Result<T> {
    serde_json::from_value(value).map_err(|error| Error::BuiltIn {
        what,
        message: error.to_string(),
    })
}

/// The image-table row that runs `binary` as the router pod, with `auth` and its secret file.
pub fn image_entry(binary: &Path, auth: RouterAuth, secret: Option<&Path>) -> ImageEntry {
    let mut args = vec![
        format!("--listen={{pod_ip}}:{}", wire::ROUTER_PORT),
        format!("--auth={}", auth.flag()),
        "--access-log=false".to_owned(),
    ];
    match (auth, secret) {
        (RouterAuth::Token, Some(file)) => args.push(format!("--token-file={}", file.display())),
        (RouterAuth::Scoped, Some(file)) => {
            args.push(format!("--signing-key-file={}", file.display()));
        }
        _ => {}
    }
    ImageEntry::new("*sandbox-router*", Program::Path(binary.to_path_buf()))
        .args(args)
        .port(wire::ROUTER_PORT)
        .readiness(DefaultReadiness::Http {
            port: wire::ROUTER_PORT,
            path: "/readyz".to_owned(),
        })
}

/// Installs the router as `deploy/overlays/kind` does: in `agent-sandbox-system`, and in the
/// sandboxes' namespace for upstream's Go SDK (`deploy/sandboxes/namespace-router`), each with
/// its signing-key Secret (for `Some(key)`), `sandbox-router-svc` and a pod (which reads
/// `kubeconfig`); waits until the pods are Ready and returns the IP of the one in
/// `agent-sandbox-system`.
pub(crate) async fn install(
    client: &kube::Client,
    kubeconfig: &Path,
    signing_key: Option<&str>,
) -> Result<String> {
    for ns in [wire::SYSTEM_NAMESPACE, DEFAULT_NAMESPACE] {
        install_in(client, kubeconfig, signing_key, ns).await?;
    }
    wait_ready_in(client, DEFAULT_NAMESPACE, ROUTER_POD).await?;
    wait_ready(client, ROUTER_POD).await
}

async fn install_in(
    client: &kube::Client,
    kubeconfig: &Path,
    signing_key: Option<&str>,
    ns: &str,
) -> Result<()> {
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
    if let Some(key) = signing_key {
        let mut secret: Secret = from_json(
            "the signing-key Secret",
            json!({"metadata": {"name": wire::ROUTER_SIGNING_KEY_SECRET, "namespace": ns}}),
        )?;
        secret.data = Some(BTreeMap::from([(
            wire::ROUTER_SIGNING_KEY_SECRET_KEY.to_owned(),
            k8s_openapi::ByteString(key.as_bytes().to_vec()),
        )]));
        Api::<Secret>::namespaced(client.clone(), ns)
            .create(&post, &secret)
            .await
            .map_err(Error::kube(
                "create",
                format!("Secret {ns}/{}", wire::ROUTER_SIGNING_KEY_SECRET),
            ))?;
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
    create_pod_in(client, kubeconfig, ns, ROUTER_POD).await
}

/// Creates (another) router pod named `name` behind `sandbox-router-svc` in
/// `agent-sandbox-system`.
pub async fn create_pod(client: &kube::Client, kubeconfig: &Path, name: &str) -> Result<()> {
    create_pod_in(client, kubeconfig, wire::SYSTEM_NAMESPACE, name).await
}

async fn create_pod_in(
    client: &kube::Client,
    kubeconfig: &Path,
    ns: &str,
    name: &str,
) -> Result<()> {
    let pod: Pod = from_json(
        "the router Pod",
        json!({
            "metadata": {"name": name, "namespace": ns,
                         "labels": {labels::ROUTER_APP: labels::ROUTER_APP_VALUE}},
            // The security context of deploy/base's router, which Pod Security admission
            // ("restricted", the label of its namespace there) requires.
            "spec": {
                // deploy/base's ServiceAccount; the pod reads its credentials from `kubeconfig`.
                "serviceAccountName": "sandbox-router",
                "automountServiceAccountToken": false,
                "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "router", "image": ROUTER_IMAGE,
                    "env": [{"name": "KUBECONFIG", "value": kubeconfig.display().to_string()}],
                    "ports": [{"name": "http", "containerPort": wire::ROUTER_PORT}],
                    "securityContext": {"allowPrivilegeEscalation": false,
                                        "readOnlyRootFilesystem": true,
                                        "capabilities": {"drop": ["ALL"]}}
                }]
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
