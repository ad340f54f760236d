//! The simulated cluster, set up the way `deploy/` sets up a real one, so that scenarios reach
//! both the same way: the controller (in this process), a router pod with `--auth scoped`
//! behind `sandbox-router-svc` in `agent-sandbox-system` and its signing key in the Secret a
//! real installation has, the SandboxTemplate and SandboxWarmPool read from `deploy/sandboxes`,
//! and a Gateway whose status points at the router pod (as a Gateway implementation would
//! program it).

use std::path::Path;

use agent_sandbox_api::{SandboxTemplate, SandboxWarmPool, labels, wire};
use agent_sandbox_sim::{DefaultReadiness, ImageEntry, Program, Sim, SimConfig, runtime_entry};
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::error::{Error, Result};
use crate::support::{
    LocalController, WAIT, binary, random_key, wait_for, wait_pool_ready, workspace_root,
};

/// The SandboxTemplate of `deploy/sandboxes` (the default of every target).
pub(crate) const TEMPLATE: &str = "python-runtime";
/// The SandboxWarmPool of `deploy/sandboxes`.
pub(crate) const POOL: &str = "python-sandbox-pool";
/// The Gateway the simulated cluster puts in front of the router.
pub(crate) const GATEWAY: &str = "sandbox-gateway";
/// The router pod's name.
const ROUTER_POD: &str = "sandbox-router-0";

/// The running simulated cluster. Dropping it stops the controller and kills every pod.
pub(crate) struct SimCluster {
    sim: Option<Sim>,
    kube: kube::Client,
    router_url: String,
    controller: Option<LocalController>,
    _dir: tempfile::TempDir,
}

impl SimCluster {
    /// Starts everything and waits until the router pod and the pool are Ready.
    pub(crate) async fn start() -> Result<Self> {
        let runtime = binary("agent-sandbox-runtime", "sandbox-runtime")?;
        let router = binary("agent-sandbox-router", "sandbox-router")?;
        // Outside /tmp: the router pod (bubblewrap gives pods a private /tmp) reads its
        // kubeconfig and key from here.
        let dir = crate::cluster::scratch_dir()?;
        let key = random_key()?;
        let key_file = crate::cluster::write_private(dir.path(), "signing-key", key.as_bytes())?;
        let config = SimConfig::default()
            .kubeconfig(dir.path().join("kubeconfig"))
            .image(runtime_entry("*runtime*", Program::Path(runtime)))
            .image(
                ImageEntry::new("*sandbox-router*", Program::Path(router))
                    .args([
                        format!("--listen={{pod_ip}}:{}", wire::ROUTER_PORT),
                        "--auth=scoped".to_owned(),
                        format!("--signing-key-file={}", key_file.display()),
                        "--access-log=false".to_owned(),
                    ])
                    .port(wire::ROUTER_PORT)
                    .readiness(DefaultReadiness::Http {
                        port: wire::ROUTER_PORT,
                        path: "/readyz".to_owned(),
                    }),
            );
        let sim = Sim::start(config)
            .await
            .map_err(Error::sim("start the API server and kubelet"))?;
        sim.apply_crds().map_err(Error::sim("apply the CRDs"))?;
        let kube = sim.client().map_err(Error::sim("build a client"))?;

        let controller = LocalController::start(kube.clone());
        let mut cluster = Self {
            sim: Some(sim),
            kube,
            router_url: String::new(),
            controller: Some(controller),
            _dir: dir,
        };
        cluster.install_router(&key).await?;
        cluster.install_sandboxes().await?;
        Ok(cluster)
    }

    /// The router's namespace, Secret, Service and pod; waits for the pod and writes the
    /// Gateway.
    async fn install_router(&mut self, key: &str) -> Result<()> {
        let post = PostParams::default();
        let ns = wire::SYSTEM_NAMESPACE;
        let namespace: Namespace = from_json(json!({"metadata": {"name": ns}}))?;
        Api::<Namespace>::all(self.kube.clone())
            .create(&post, &namespace)
            .await
            .map_err(Error::kube(format!("create namespace {ns}")))?;
        let mut secret: Secret = from_json(json!({
            "metadata": {"name": wire::ROUTER_SIGNING_KEY_SECRET, "namespace": ns}
        }))?;
        secret.data = Some(std::collections::BTreeMap::from([(
            wire::ROUTER_SIGNING_KEY_SECRET_KEY.to_owned(),
            k8s_openapi::ByteString(key.as_bytes().to_vec()),
        )]));
        Api::<Secret>::namespaced(self.kube.clone(), ns)
            .create(&post, &secret)
            .await
            .map_err(Error::kube("create the signing-key Secret"))?;
        let service: Service = from_json(json!({
            "metadata": {"name": wire::ROUTER_SERVICE, "namespace": ns},
            "spec": {"selector": {labels::ROUTER_APP: labels::ROUTER_APP_VALUE},
                     "ports": [{"name": "http", "port": wire::ROUTER_PORT,
                                "targetPort": wire::ROUTER_PORT}]}
        }))?;
        Api::<Service>::namespaced(self.kube.clone(), ns)
            .create(&post, &service)
            .await
            .map_err(Error::kube("create the router Service"))?;
        let kubeconfig = self.kubeconfig().display().to_string();
        let pod: Pod = from_json(json!({
            "metadata": {"name": ROUTER_POD, "namespace": ns,
                         "labels": {labels::ROUTER_APP: labels::ROUTER_APP_VALUE}},
            "spec": {"containers": [{
                "name": "router", "image": "agent-sandbox/sandbox-router:e2e",
                "env": [{"name": "KUBECONFIG", "value": kubeconfig}],
                "ports": [{"name": "http", "containerPort": wire::ROUTER_PORT}]
            }]}
        }))?;
        let pods: Api<Pod> = Api::namespaced(self.kube.clone(), ns);
        pods.create(&post, &pod)
            .await
            .map_err(Error::kube("create the router pod"))?;
        let ip = wait_for("the router pod to be Ready", WAIT, || async {
            let pod = pods
                .get(ROUTER_POD)
                .await
                .map_err(Error::kube("get the router pod"))?;
            let status = pod.status.unwrap_or_default();
            let ready = status
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            Ok(match (ready, status.pod_ip) {
                (true, Some(ip)) => (Some(ip), String::new()),
                _ => (None, format!("phase {}", status.phase.unwrap_or_default())),
            })
        })
        .await?;
        self.router_url = format!("http://{ip}:{}", wire::ROUTER_PORT);
        self.write_gateway(&ip).await
    }

    /// A Gateway with an HTTP listener on the router's port and the router pod's address in its
    /// status.
    async fn write_gateway(&self, ip: &str) -> Result<()> {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "Gateway"),
            "gateways",
        );
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.kube.clone(),
            wire::DEFAULT_SANDBOX_NAMESPACE,
            &resource,
        );
        let mut gateway = DynamicObject::new(GATEWAY, &resource);
        gateway.data = json!({"spec": {
            "gatewayClassName": "sim",
            "listeners": [{"name": "http", "protocol": "HTTP", "port": wire::ROUTER_PORT}]
        }});
        api.create(&PostParams::default(), &gateway)
            .await
            .map_err(Error::kube("create the Gateway"))?;
        let status = json!({"status": {"addresses": [{"type": "IPAddress", "value": ip}]}});
        let params = PatchParams::default();
        if api
            .patch_status(GATEWAY, &params, &Patch::Merge(&status))
            .await
            .is_err()
        {
            // Without a status subresource the status is part of the object.
            api.patch(GATEWAY, &params, &Patch::Merge(&status))
                .await
                .map_err(Error::kube("write the Gateway's status"))?;
        }
        Ok(())
    }

    /// `deploy/sandboxes` as written (its template and pool, in its namespace); waits for the
    /// pool.
    async fn install_sandboxes(&self) -> Result<()> {
        let dir = workspace_root().join("deploy/sandboxes");
        let kustomization: serde_json::Value = read_yaml(&dir.join("kustomization.yaml"))?;
        let namespace = kustomization["namespace"]
            .as_str()
            .unwrap_or(wire::DEFAULT_SANDBOX_NAMESPACE)
            .to_owned();
        let mut template: SandboxTemplate = read_yaml(&dir.join("template.yaml"))?;
        let mut pool: SandboxWarmPool = read_yaml(&dir.join("warm-pool.yaml"))?;
        template.metadata.namespace = Some(namespace.clone());
        pool.metadata.namespace = Some(namespace.clone());
        let post = PostParams::default();
        Api::<SandboxTemplate>::namespaced(self.kube.clone(), &namespace)
            .create(&post, &template)
            .await
            .map_err(Error::kube("create deploy/sandboxes/template.yaml"))?;
        let pools: Api<SandboxWarmPool> = Api::namespaced(self.kube.clone(), &namespace);
        pools
            .create(&post, &pool)
            .await
            .map_err(Error::kube("create deploy/sandboxes/warm-pool.yaml"))?;
        let name = pool.metadata.name.clone().unwrap_or_default();
        wait_pool_ready(&pools, &name, pool.spec.replicas).await?;
        Ok(())
    }

    pub(crate) fn client(&self) -> kube::Client {
        self.kube.clone()
    }

    pub(crate) fn kubeconfig(&self) -> &Path {
        self.sim
            .as_ref()
            .map_or(Path::new(""), |sim| sim.kubeconfig_path())
    }

    /// The router pod's URL (reachable from this host: pods use loopback addresses).
    pub(crate) fn router_url(&self) -> String {
        self.router_url.clone()
    }

    /// Stops the controller, then the sim (which kills every pod process).
    pub(crate) async fn stop(mut self) {
        if let Some(controller) = self.controller.take() {
            controller.stop().await;
        }
        if let Some(sim) = self.sim.take() {
            sim.stop().await;
        }
    }
}

fn from_json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T> {
    serde_json::from_value(value).map_err(|e| Error::Check(format!("bad built-in object: {e}")))
}

fn read_yaml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(Error::io("read", path))?;
    serde_saphyr::from_str(&text)
        .map_err(|e| Error::Config(format!("{} does not parse: {e}", path.display())))
}
