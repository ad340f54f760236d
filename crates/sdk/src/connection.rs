//! The three ways to reach the router: a direct URL, a local port-forward listener, a Gateway's
//! address. Owns the port-forward tunnel (its accept loop, per-connection forwards and the
//! monitor that marks it dead) and Gateway address resolution.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agent_sandbox_api::{labels, wire};
use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::runtime::watcher;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::options::{ClientOptions, ConnectionMode};
use crate::transport::{RouterAuth, Transport};

/// Makes and caches the connection a client's sandboxes share.
impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Connector {
    kube: kube::Client,
    options: ClientOptions,
    current: tokio::sync::Mutex<Option<Arc<Connection>>>,
}

/// One established connection: the transport, and the tunnel behind it in port-forward mode.
#[derive(Debug)]
pub(crate) struct Connection {
    pub(crate) transport: Transport,
    tunnel: Option<Tunnel>,
}

impl Connection {
    /// `Err(reason)` when the connection is known to be dead.
    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        match &self.tunnel {
            Some(tunnel) => match tunnel.dead_reason() {
                Some(reason) => Err(reason),
                None => Ok(()),
            },
            None => Ok(()),
        }
    }

    /// The local listener address in port-forward mode.
    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        self.tunnel.as_ref().map(|t| t.addr)
    }
}

impl Connector {
    pub(crate) fn new(kube: kube::Client, options: ClientOptions) -> Self {
        Self {
            kube,
            options,
            current: tokio::sync::Mutex::new(None),
        }
    }

    /// The live connection, establishing a new one when there is none or it died.
    pub(crate) async fn connect(&self) -> Result<Arc<Connection>> {
        let mut current = self.current.lock().await;
        if let Some(connection) = current.as_ref()
            && connection.check().is_ok()
        {
            return Ok(connection.clone());
        }
        let connection = Arc::new(self.establish().await?);
        *current = Some(connection.clone());
        Ok(connection)
    }

    async fn establish(&self) -> Result<Connection> {
        let token = match (&self.options.router_signing_key, &self.options.router_token) {
            (Some(key), _) => RouterAuth::Scoped(key.clone()),
            (None, Some(token)) => RouterAuth::Bearer(token.clone()),
            (None, None) => RouterAuth::None,
        };
        match &self.options.connection {
            ConnectionMode::Direct { url } => Ok(Connection {
                transport: Transport::new(url, token.clone())?,
                tunnel: None,
            }),
            ConnectionMode::Gateway {
                name,
                namespace,
                scheme,
            } => {
                let url = gateway_url(
                    &self.kube,
                    name,
                    namespace,
                    scheme,
                    self.options.gateway_ready_timeout,
                )
                .await?;
                tracing::debug!(%url, "Gateway address resolved");
                Ok(Connection {
                    transport: Transport::new(&url, token.clone())?,
                    tunnel: None,
                })
            }
            ConnectionMode::PortForward { router_namespace } => {
                let tunnel = Tunnel::open(
                    self.kube.clone(),
                    router_namespace,
                    self.options.port_forward_ready_timeout,
                )
                .await?;
                let url = format!("http://{}", tunnel.addr);
                tracing::debug!(%url, pod = %tunnel.pod, "port-forward established");
                Ok(Connection {
                    transport: Transport::new(&url, token.clone())?,
                    tunnel: Some(tunnel),
                })
            }
        }
    }
}

/// Ready router pods behind `sandbox-router-svc` in `namespace`: those of its EndpointSlices'
/// ready endpoints; where the slices name none (no EndpointSlice controller, or one that cannot
/// publish the pods' addresses, such as loopback ones), the Ready pods its selector picks, as
/// `kubectl port-forward service/...` resolves a Service. `Ok(None)` when there is no such
/// Service (nor any slice of it).
async fn router_pods(kube: &kube::Client, namespace: &str) -> Result<Option<Vec<String>>> {
    let slices: Api<EndpointSlice> = Api::namespaced(kube.clone(), namespace);
    let selector = format!(
        "{}={}",
        labels::ENDPOINTSLICE_SERVICE_NAME,
        wire::ROUTER_SERVICE
    );
    let list = slices
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|source| Error::Kube {
            operation: "list EndpointSlices of",
            object: format!("{namespace}/{}", wire::ROUTER_SERVICE),
            source,
        })?;
    let from_slices = ready_pods(&list.items);
    if !from_slices.is_empty() {
        return Ok(Some(from_slices));
    }
    let services: Api<Service> = Api::namespaced(kube.clone(), namespace);
    let object = || format!("{namespace}/{}", wire::ROUTER_SERVICE);
    let Some(service) = services
        .get_opt(wire::ROUTER_SERVICE)
        .await
        .map_err(|source| Error::Kube {
            operation: "get Service",
            object: object(),
            source,
        })?
    else {
        return Ok((!list.items.is_empty()).then(Vec::new));
    };
    let Some(selector) = service_selector(&service) else {
        return Ok(Some(Vec::new()));
    };
    let pods: Api<Pod> = Api::namespaced(kube.clone(), namespace);
    let found = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|source| Error::Kube {
            operation: "list the pods selected by Service",
            object: object(),
            source,
        })?;
    Ok(Some(
        found
            .items
            .iter()
            .filter(|pod| is_ready_pod(pod))
            .filter_map(|pod| pod.metadata.name.clone())
            .collect(),
    ))
}

/// A Service's selector as a label selector, `None` for a Service without one (sans IO).
pub(crate) fn service_selector(service: &Service) -> Option<String> {
    let selector = service.spec.as_ref()?.selector.as_ref()?;
    (!selector.is_empty()).then(|| {
        selector
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect::<Vec<_>>()
            .join(",")
    })
}

/// Ready and not being deleted (sans IO).
pub(crate) fn is_ready_pod(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|status| status.conditions.as_ref())
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
}

/// The pods of ready endpoints, in order (sans IO).
pub(crate) fn ready_pods(slices: &[EndpointSlice]) -> Vec<String> {
    slices
        .iter()
        .flat_map(|slice| slice.endpoints.iter().flatten())
        .filter(|endpoint| {
            let conditions = endpoint.conditions.as_ref();
            conditions.and_then(|c| c.ready).unwrap_or(true)
                && !conditions.and_then(|c| c.terminating).unwrap_or(false)
        })
        .filter_map(|endpoint| endpoint.target_ref.as_ref())
        .filter(|target| target.kind.as_deref() == Some("Pod"))
        .filter_map(|target| target.name.clone())
        .collect()
}

/// A local listener whose connections are port-forwarded to one router pod.
#[derive(Debug)]
struct Tunnel {
    addr: SocketAddr,
    pod: String,
    dead: Arc<Mutex<Option<String>>>,
    /// The accept loop and the monitor; dropping the tunnel aborts them.
    _tasks: JoinSet<()>,
}

impl Tunnel {
    async fn open(kube: kube::Client, namespace: &str, ready_timeout: Duration) -> Result<Self> {
        let deadline = Instant::now() + ready_timeout;
        let pod = loop {
            match router_pods(&kube, namespace).await? {
                None => {
                    return Err(Error::RouterNotFound {
                        service: wire::ROUTER_SERVICE.to_owned(),
                        searched: vec![namespace.to_owned()],
                    });
                }
                Some(pods) if !pods.is_empty() => {
                    break pods[fastrand::usize(..pods.len())].clone();
                }
                Some(_) if Instant::now() >= deadline => {
                    return Err(Error::RouterNotFound {
                        service: wire::ROUTER_SERVICE.to_owned(),
                        searched: vec![namespace.to_owned()],
                    });
                }
                Some(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|source| Error::LocalIo {
                operation: "listen on",
                path: "127.0.0.1:0".to_owned(),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::LocalIo {
            operation: "read the address of",
            path: "the port-forward listener".to_owned(),
            source,
        })?;
        let dead = Arc::new(Mutex::new(None));
        let pods: Api<Pod> = Api::namespaced(kube, namespace);
        let mut tasks = JoinSet::new();
        tasks.spawn(accept_loop(
            listener,
            pods.clone(),
            pod.clone(),
            dead.clone(),
        ));
        tasks.spawn(monitor(pods, pod.clone(), dead.clone()));
        Ok(Self {
            addr,
            pod,
            dead,
            _tasks: tasks,
        })
    }

    fn dead_reason(&self) -> Option<String> {
        self.dead
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

fn mark_dead(dead: &Mutex<Option<String>>, reason: String) {
    let mut dead = dead.lock().unwrap_or_else(PoisonError::into_inner);
    if dead.is_none() {
        tracing::warn!(%reason, "port-forward tunnel died");
        *dead = Some(reason);
    }
}

async fn accept_loop(
    listener: TcpListener,
    pods: Api<Pod>,
    pod: String,
    dead: Arc<Mutex<Option<String>>>,
) {
    let mut forwards = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = forwards.join_next(), if !forwards.is_empty() => continue,
        };
        let Ok((mut local, _)) = accepted else {
            continue;
        };
        let _ = local.set_nodelay(true);
        let pods = pods.clone();
        let pod = pod.clone();
        let dead = dead.clone();
        forwards.spawn(async move {
            let mut forwarder = match pods.portforward(&pod, &[wire::ROUTER_PORT]).await {
                Ok(forwarder) => forwarder,
                Err(error) => {
                    mark_dead(
                        &dead,
                        format!("port-forward to router pod {pod} failed: {error}"),
                    );
                    return;
                }
            };
            let Some(mut remote) = forwarder.take_stream(wire::ROUTER_PORT) else {
                mark_dead(
                    &dead,
                    format!("port-forward to router pod {pod} gave no stream"),
                );
                return;
            };
            let errors = forwarder.take_error(wire::ROUTER_PORT);
            let copied = tokio::io::copy_bidirectional(&mut local, &mut remote).await;
            drop(remote);
            if let Some(errors) = errors
                && let Ok(Some(error)) =
                    tokio::time::timeout(Duration::from_millis(100), errors).await
            {
                mark_dead(&dead, format!("port-forward to router pod {pod}: {error}"));
            }
            if let Err(error) = copied {
                tracing::debug!(%error, "forwarded connection ended with an error");
            }
            forwarder.abort();
        });
    }
}

/// Marks the tunnel dead as soon as its router pod is deleted, terminating or not Ready.
async fn monitor(pods: Api<Pod>, pod: String, dead: Arc<Mutex<Option<String>>>) {
    let config = watcher::Config::default().fields(&format!("metadata.name={pod}"));
    let mut events = std::pin::pin!(watcher(pods, config));
    while let Some(event) = events.next().await {
        let problem = match event {
            Ok(watcher::Event::Delete(_)) => Some(format!("router pod {pod} was deleted")),
            Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => pod_problem(&p),
            Ok(_) => None,
            Err(error) => {
                tracing::debug!(%error, "watching the router pod failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                None
            }
        };
        if let Some(problem) = problem {
            mark_dead(&dead, problem);
            return;
        }
    }
}

fn pod_problem(pod: &Pod) -> Option<String> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    if pod.metadata.deletion_timestamp.is_some() {
        return Some(format!("router pod {name} is terminating"));
    }
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status == "True");
    (ready == Some(false)).then(|| format!("router pod {name} is not Ready"))
}

/// The `gateway.networking.k8s.io/v1` Gateway resource.
fn gateway_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "Gateway"),
        "gateways",
    )
}

/// The router URL from a Gateway's status, waiting up to `timeout` for an address.
async fn gateway_url(
    kube: &kube::Client,
    name: &str,
    namespace: &str,
    scheme: &str,
    timeout: Duration,
) -> Result<String> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(kube.clone(), namespace, &gateway_resource());
    let deadline = Instant::now() + timeout;
    loop {
        let gateway = api.get_opt(name).await.map_err(|source| Error::Kube {
            operation: "get Gateway",
            object: format!("{namespace}/{name}"),
            source,
        })?;
        if let Some(url) = gateway
            .as_ref()
            .and_then(|g| gateway_address(&g.data, scheme))
        {
            return Ok(url);
        }
        if Instant::now() >= deadline {
            return Err(Error::GatewayNotReady {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                waited: timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `scheme://address[:port]` from a Gateway object (sans IO): the first status address, and
/// the port of the first listener whose protocol matches the scheme when it is not the
/// scheme's default.
pub(crate) fn gateway_address(gateway: &Value, scheme: &str) -> Option<String> {
    let address = gateway
        .pointer("/status/addresses/0/value")
        .and_then(Value::as_str)
        .filter(|a| !a.is_empty())?;
    let host = if address.contains(':') && !address.starts_with('[') {
        format!("[{address}]")
    } else {
        address.to_owned()
    };
    let protocol = if scheme == "https" { "HTTPS" } else { "HTTP" };
    let default_port = if scheme == "https" { 443 } else { 80 };
    let port = gateway
        .pointer("/spec/listeners")
        .and_then(Value::as_array)
        .and_then(|listeners| {
            listeners
                .iter()
                .find(|l| l.get("protocol").and_then(Value::as_str) == Some(protocol))
        })
        .and_then(|l| l.get("port").and_then(Value::as_u64))
        .filter(|p| *p != default_port);
    Some(match port {
        Some(port) => format!("{scheme}://{host}:{port}"),
        None => format!("{scheme}://{host}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn gateway_addresses() {
        let gw = json!({"spec": {"listeners": [{"name": "http", "protocol": "HTTP", "port": 8080}]},
                        "status": {"addresses": [{"type": "IPAddress", "value": "10.0.0.5"}]}});
        assert_eq!(
            gateway_address(&gw, "http").as_deref(),
            Some("http://10.0.0.5:8080")
        );
        let gw = json!({"spec": {"listeners": [{"protocol": "HTTP", "port": 80}]},
                        "status": {"addresses": [{"value": "fd00::1"}]}});
        assert_eq!(
            gateway_address(&gw, "http").as_deref(),
            Some("http://[fd00::1]")
        );
        assert_eq!(
            gateway_address(
                &json!({"status": {"addresses": [{"value": "gw.example.com"}]}}),
                "https"
            )
            .as_deref(),
            Some("https://gw.example.com")
        );
        assert_eq!(gateway_address(&json!({"status": {}}), "http"), None);
    }

    #[test]
    fn only_ready_pod_endpoints_count() {
        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": "s"}, "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.0.0.1"], "conditions": {"ready": true}, "targetRef": {"kind": "Pod", "name": "a"}},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": false}, "targetRef": {"kind": "Pod", "name": "b"}},
                {"addresses": ["10.0.0.3"], "conditions": {"ready": true, "terminating": true}, "targetRef": {"kind": "Pod", "name": "c"}},
                {"addresses": ["10.0.0.4"], "targetRef": {"kind": "Pod", "name": "d"}}
            ]
        }))
        .unwrap_or_default();
        assert_eq!(ready_pods(&[slice]), ["a", "d"]);
    }

    #[test]
    fn a_services_selector_picks_ready_pods_that_are_not_being_deleted() {
        let service: Service = serde_json::from_value(json!({
            "metadata": {"name": "sandbox-router-svc"},
            "spec": {"selector": {"app": "sandbox-router", "tier": "edge"}}
        }))
        .unwrap_or_default();
        assert_eq!(
            service_selector(&service).as_deref(),
            Some("app=sandbox-router,tier=edge")
        );
        assert_eq!(service_selector(&Service::default()), None);
        let pod = |ready: &str, deleting: bool| -> Pod {
            let mut value = json!({"metadata": {"name": "p"},
                                   "status": {"conditions": [{"type": "Ready", "status": ready}]}});
            if deleting {
                value["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            serde_json::from_value(value).unwrap_or_default()
        };
        assert!(is_ready_pod(&pod("True", false)));
        assert!(!is_ready_pod(&pod("False", false)));
        assert!(!is_ready_pod(&pod("True", true)));
        assert!(!is_ready_pod(&Pod::default()));
    }
}
