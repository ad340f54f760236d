//! The request path: probes and metrics, then for every other request limits → routing headers
//! → authorization → index → target → forward with a deadline → stream the answer back (or
//! relay an upgraded connection). The decisions are the sans-IO functions of `headers`, `auth`,
//! `index` and `route`; this module does the IO around them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_sandbox_api::wire::headers as wire;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri, Version, header};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::{self, Authorizer, Grant, OpenedWith};
use crate::body::{Finish, Outcome, RequestBody, ResponseBody};
use crate::config::{Config, CredentialFiles};
use crate::connector::Connector;
use crate::headers::{
    Routing, deadline, head_bytes, inbound_response_headers, is_upgrade, outbound_headers,
    parse_routing,
};
use crate::index::{Backend, SharedIndex, Unroutable};
use crate::metrics::Metrics;
use crate::reject::{Reason, Rejection, json_response, shown};
use crate::route;

/// What a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Proxied requests, and the operational endpoints for requests without `X-Sandbox-ID`.
    Proxy,
    /// `/healthz` and `/readyz` only (upstream's `--health-probe-bind-address`).
    Probes,
    /// `/metrics` only (upstream's `--metrics-bind-address`).
    Metrics,
}

/// How long a request to a sandbox that is not routable yet waits for the index to catch up
/// (see `Proxy::resolve`).
const INDEX_SETTLE: Duration = Duration::from_secs(2);
/// Idle pooled connections kept per pod.
const POOL_MAX_IDLE_PER_HOST: usize = 32;

/// Everything a request needs; shared by all connections.
#[derive(Debug)]
pub(crate) struct Proxy {
    index: SharedIndex,
    /// The authorizer in force; replaced when the credential files change, and watched by
    /// open tunnels, which are checked against each new one.
    authorizer: tokio::sync::watch::Sender<Arc<Authorizer>>,
    max_timeout: Duration,
    max_body_bytes: u64,
    max_header_bytes: usize,
    access_log: bool,
    client: Client<Connector, RequestBody>,
    metrics: Arc<Metrics>,
    /// Upgraded connections being relayed; waited for on shutdown.
    pub(crate) tunnels: TaskTracker,
    /// Cancelled when the shutdown grace period is over: open tunnels are closed.
    pub(crate) stop: CancellationToken,
    /// Set once shutdown began: `/readyz` answers 503 so that load balancers stop sending.
    pub(crate) draining: AtomicBool,
    /// Activity records and resumes, when the router has a client for the cluster.
    pub(crate) cluster: Option<Arc<crate::activity::Cluster>>,
}

impl Proxy {
    pub(crate) fn new(config: &Config, index: SharedIndex, cluster: Option<kube::Client>) -> Self {
        let metrics = Arc::new(Metrics::new());
        let connector = Connector::new(
            config.connect_timeout,
            config.connect_retries,
            Arc::clone(&metrics),
            config.pod_sockets.clone(),
        );
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(config.pool_idle_timeout)
            .pool_timer(TokioTimer::new())
            .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
            .set_host(true)
            .build(connector);
        Self {
            index,
            authorizer: tokio::sync::watch::Sender::new(Arc::new(Authorizer::new(config))),
            max_timeout: config.max_timeout,
            max_body_bytes: config.max_body_bytes,
            max_header_bytes: config.max_header_bytes,
            access_log: config.access_log,
            client,
            tunnels: TaskTracker::new(),
            stop: CancellationToken::new(),
            draining: AtomicBool::new(false),
            cluster: cluster.map(|cluster| {
                Arc::new(crate::activity::Cluster::new(
                    cluster,
                    config.activity_interval,
                    Arc::clone(&metrics),
                ))
            }),
            metrics,
        }
    }

    /// The `--auth` mode, for the startup log.
    pub(crate) fn auth_mode(&self) -> &'static str {
        self.authorizer.borrow().mode()
    }

    /// Looks at `files` every `interval` until `stop`; when their contents change, the
    /// authorizer is rebuilt from them, requests are checked against it from then on and so is
    /// every open tunnel (closed when its request no longer passes). Files that cannot be used
    /// leave the previous credentials in force, with an error logged once per change.
    pub(crate) async fn reload_credentials(
        self: Arc<Self>,
        files: CredentialFiles,
        interval: Duration,
        stop: CancellationToken,
    ) {
        let contents = || -> Vec<Option<Vec<u8>>> {
            files.paths().map(|path| std::fs::read(path).ok()).collect()
        };
        let mut last = contents();
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let now = contents();
            if now == last {
                continue;
            }
            last = now;
            let current = Arc::clone(&self.authorizer.borrow());
            match current.reread(&files) {
                Ok(next) => {
                    self.metrics.credentials_reloaded(true);
                    tracing::info!(
                        files = ?files.paths().collect::<Vec<_>>(),
                        "credential files changed: requests and open tunnels are checked \
                         against them from now on"
                    );
                    self.authorizer.send_replace(Arc::new(next));
                }
                Err(error) => {
                    self.metrics.credentials_reloaded(false);
                    tracing::error!(
                        error = %chain(&error),
                        "credential files changed but cannot be used; the previous credentials \
                         stay in force until they are fixed"
                    );
                }
            }
        }
    }

    /// Answers a request on a probe or metrics listener: its endpoints, 404 for anything else.
    pub(crate) fn handle_operations(
        &self,
        request: &Request<Incoming>,
        role: Role,
    ) -> Response<ResponseBody> {
        let path = request.uri().path();
        let allowed = match role {
            Role::Proxy => true,
            Role::Probes => path == "/healthz" || path == "/readyz",
            Role::Metrics => path == "/metrics",
        };
        if allowed && let Some(response) = self.operations(request) {
            return response;
        }
        json_response(
            StatusCode::NOT_FOUND,
            &serde_json::json!({"detail": format!(
                "This listener serves {} only.",
                match role {
                    Role::Proxy | Role::Probes => "GET /healthz and GET /readyz",
                    Role::Metrics => "GET /metrics",
                }
            )}),
            false,
        )
    }

    /// Answers one request; never fails (refusals are JSON answers).
    pub(crate) async fn handle(
        self: Arc<Self>,
        mut request: Request<Incoming>,
        peer: SocketAddr,
    ) -> Response<ResponseBody> {
        if !request.headers().contains_key(wire::SANDBOX_ID)
            && let Some(response) = self.operations(&request)
        {
            return response;
        }
        let client_upgrade =
            is_upgrade(request.headers()).then(|| hyper::upgrade::on(&mut request));
        let (parts, body) = request.into_parts();
        let mut finish = Finish::new(Arc::clone(&self.metrics), &parts, peer, self.access_log);
        let mut response = match self
            .forward(parts, body, peer, client_upgrade, &mut finish)
            .await
        {
            Ok(response) => response,
            Err(rejection) => {
                finish.reason = Some(rejection.reason);
                if rejection.reason.is_upstream_failure() {
                    self.metrics.upstream_error(rejection.reason);
                }
                if rejection.status.is_server_error() {
                    tracing::warn!(sandbox = finish.sandbox.as_deref().unwrap_or("-"),
                        status = rejection.status.as_u16(), detail = %rejection.detail,
                        "request failed");
                }
                rejection.into_response()
            }
        };
        finish.status = response.status().as_u16();
        response.body_mut().finish_with(finish);
        response
    }

    /// `/healthz`, `/readyz` and `/metrics` for requests that name no sandbox.
    fn operations(&self, request: &Request<Incoming>) -> Option<Response<ResponseBody>> {
        if !matches!(*request.method(), Method::GET | Method::HEAD) {
            return None;
        }
        let ok = || serde_json::json!({"status": "ok"});
        match request.uri().path() {
            "/healthz" => Some(json_response(StatusCode::OK, &ok(), false)),
            "/readyz" => {
                let (sandboxes, pods) = self.index.read().sync_state();
                if self.draining.load(Ordering::Relaxed) {
                    Some(json_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        &serde_json::json!({"detail": "The router is shutting down."}),
                        false,
                    ))
                } else if sandboxes && pods {
                    Some(json_response(StatusCode::OK, &ok(), false))
                } else {
                    Some(json_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        &serde_json::json!({"detail": format!(
                            "The router's index has not synced yet (sandboxes listed: {sandboxes}, \
                             pods listed: {pods})."
                        )}),
                        false,
                    ))
                }
            }
            "/metrics" => {
                let mut response =
                    Response::new(ResponseBody::full(Bytes::from(self.metrics.encode())));
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    ),
                );
                Some(response)
            }
            _ => None,
        }
    }

    async fn forward(
        &self,
        parts: http::request::Parts,
        body: Incoming,
        peer: SocketAddr,
        client_upgrade: Option<OnUpgrade>,
        finish: &mut Finish,
    ) -> Result<Response<ResponseBody>, Rejection> {
        let head = head_bytes(&parts.method, &parts.uri, &parts.headers);
        if head > self.max_header_bytes {
            return Err(Rejection::new(
                Reason::HeadersTooLarge,
                format!(
                    "Request line and headers are {head} bytes; the router accepts at most {}{}.",
                    self.max_header_bytes,
                    parts
                        .headers
                        .get(wire::SANDBOX_ID)
                        .and_then(|v| v.to_str().ok())
                        .map(|id| format!(" (sandbox {})", crate::reject::shown(id)))
                        .unwrap_or_default()
                ),
            ));
        }
        let routing = parse_routing(&parts.headers)?;
        let sandbox = routing.sandbox();
        finish.sandbox = Some(sandbox.clone());
        if parts.method == Method::CONNECT {
            return Err(Rejection::new(
                Reason::Method,
                format!("CONNECT is not proxied (sandbox {sandbox})."),
            ));
        }
        let path = parts
            .uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str);
        // `OPTIONS *` (the asterisk form) asks about the server itself: no sandbox resource
        // answers it, and `http://<pod>:<port>*` is no URI to send it to. (An absolute-form
        // target's scheme and authority are ignored, so only a path is ever forwarded.)
        if !path.starts_with('/') {
            return Err(Rejection::bad_request(format!(
                "Request target {:?} for sandbox {sandbox} is not a path: the router forwards \
                 only origin-form targets (/path?query), so {} {} is not proxied.",
                shown(path),
                parts.method,
                shown(path)
            )));
        }
        if let Some(length) = content_length(&parts.headers)
            && length > self.max_body_bytes
        {
            return Err(self.too_large(&sandbox));
        }
        // Subscribed before authorizing, so that a tunnel this request opens is checked against
        // any credentials read after this check.
        let mut authorizers = self.authorizer.subscribe();
        let authorizer = Arc::clone(&authorizers.borrow_and_update());
        let auth_request = auth::Request {
            routing: &routing,
            method: &parts.method,
            path: parts.uri.path(),
        };
        let grant = authorizer.authorize(&parts.headers, auth_request, unix_now())?;
        let upgrade = client_upgrade.map(|on| {
            let credential = Credential {
                opened_with: OpenedWith::new(&parts.headers, auth_request),
                grant,
                authorizers,
            };
            (on, credential)
        });
        let timeout = deadline(routing.timeout, self.max_timeout);
        let deadline_at = tokio::time::Instant::now() + timeout;
        let backend = self.resolve(&routing, timeout, deadline_at).await?;
        let addr = route::target(&routing, &backend)?;
        let activity = |cluster: &Arc<crate::activity::Cluster>| {
            cluster.recorder.begin(
                &routing.namespace,
                &routing.id,
                backend.idle_ttl,
                k8s_openapi::jiff::Timestamp::now(),
            )
        };
        finish.active = self.cluster.as_ref().map(activity);

        let uri: Uri = format!("http://{addr}{path}").parse().map_err(|_| {
            Rejection::bad_request(format!("Invalid request target for sandbox {sandbox}."))
        })?;
        let (body, flags) = RequestBody::new(body, self.max_body_bytes);
        let mut outbound = Request::new(body);
        *outbound.method_mut() = parts.method.clone();
        *outbound.uri_mut() = uri;
        *outbound.version_mut() = Version::HTTP_11;
        *outbound.headers_mut() = outbound_headers(&parts.headers, upgrade.is_some(), peer.ip());

        let sent = tokio::time::timeout_at(deadline_at, self.client.request(outbound)).await;
        let mut response = match sent {
            Err(_) => {
                return Err(Rejection::new(
                    Reason::Timeout,
                    format!(
                        "Timed out waiting for the backend sandbox {sandbox}: no answer within \
                         {}.",
                        seconds(timeout)
                    ),
                ));
            }
            Ok(Err(error)) => {
                return Err(if flags.too_large() {
                    self.too_large(&sandbox)
                } else if flags.client_failed() {
                    Rejection::new(
                        Reason::Client,
                        format!("Reading the request body for sandbox {sandbox} failed."),
                    )
                } else if error.is_connect() {
                    Rejection::new(
                        Reason::Connect,
                        format!(
                            "Could not connect to the backend sandbox {sandbox}: {}",
                            chain(&error)
                        ),
                    )
                } else {
                    // The request (or part of it) may have reached the sandbox: never replayed.
                    Rejection::new(
                        Reason::Upstream,
                        format!(
                            "The backend sandbox {sandbox} failed to answer{}: {}",
                            if flags.started() {
                                " after receiving the request"
                            } else {
                                ""
                            },
                            chain(&error)
                        ),
                    )
                });
            }
            Ok(Ok(response)) => response,
        };

        let switching = response.status() == StatusCode::SWITCHING_PROTOCOLS;
        if switching {
            let Some((client_upgrade, credential)) = upgrade else {
                return Err(Rejection::new(
                    Reason::Upstream,
                    format!(
                        "The backend sandbox {sandbox} switched protocols without being asked to."
                    ),
                ));
            };
            let upstream_upgrade = hyper::upgrade::on(&mut response);
            let active = self.cluster.as_ref().map(activity);
            self.relay(
                client_upgrade,
                upstream_upgrade,
                sandbox,
                active,
                credential,
            );
            finish.outcome = Outcome::Upgraded;
        }
        let (mut parts, body) = response.into_parts();
        inbound_response_headers(&mut parts.headers, switching);
        // An upgraded exchange outlives the request deadline: the tunnel is long-lived by design.
        let body = ResponseBody::upstream(body, (!switching).then_some(deadline_at));
        Ok(Response::from_parts(parts, body))
    }

    /// The sandbox's backend. A sandbox that is not routable yet for a reason the index may
    /// catch up on (its watch a moment behind the claim that adopted it or the pod that became
    /// ready) is looked up again at each index change for up to [`INDEX_SETTLE`] (within the
    /// request's deadline, `timeout` after it arrived, at `deadline_at`) before the request is
    /// refused; a suspended one is woken and waited for until the deadline, its old pod's
    /// termination included.
    async fn resolve(
        &self,
        routing: &Routing,
        timeout: Duration,
        deadline_at: tokio::time::Instant,
    ) -> Result<Backend, Rejection> {
        let mut settle_at = deadline_at.min(tokio::time::Instant::now() + INDEX_SETTLE);
        let mut waking = false;
        // While the request waits for the sandbox it woke, it is the sandbox's activity (as a
        // running command is): otherwise a wake that takes longer than `activeTTLSeconds`
        // (a real node starting a pod) would let the controller suspend the sandbox again
        // before this very request reached it.
        let mut _waiting: Option<crate::activity::Active> = None;
        loop {
            let changed = self.index.changed();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let why = match self.index.read().resolve(&routing.namespace, &routing.id) {
                Ok(backend) => {
                    if let Some(cluster) = &self.cluster {
                        cluster.awake(&routing.namespace, &routing.id);
                    }
                    return Ok(backend);
                }
                Err(why) => why,
            };
            if why == Unroutable::Suspended
                && let Some(cluster) = &self.cluster
            {
                // Resume on traffic: the request's activity wakes it (the controller resumes a
                // suspended sandbox with newer activity); wait within the request's deadline.
                cluster
                    .resume(&routing.namespace, &routing.id)
                    .await
                    .map_err(|why| {
                        Rejection::new(
                            Reason::NotReady,
                            format!("Sandbox {} is suspended and {why}.", routing.sandbox()),
                        )
                    })?;
                if !waking {
                    let idle_ttl = self.index.read().idle_ttl(&routing.namespace, &routing.id);
                    _waiting = Some(cluster.recorder.begin(
                        &routing.namespace,
                        &routing.id,
                        idle_ttl,
                        k8s_openapi::jiff::Timestamp::now(),
                    ));
                }
                waking = true;
                settle_at = deadline_at;
            }
            // While waking, the pod of before the suspension may still be terminating (a real
            // kubelet gives it its grace period): the controller makes the new one once it is
            // gone, so that too is waited for until the deadline.
            let settles = why.may_settle() || waking;
            if !settles || tokio::time::timeout_at(settle_at, changed).await.is_err() {
                if waking {
                    return Err(route::did_not_wake(routing, timeout, &why));
                }
                return Err(route::unroutable(routing, &why));
            }
        }
    }

    fn too_large(&self, sandbox: &str) -> Rejection {
        Rejection::new(
            Reason::TooLarge,
            format!(
                "Request body for sandbox {sandbox} exceeds the router's limit of {} bytes.",
                self.max_body_bytes
            ),
        )
    }

    /// Relays an upgraded connection both ways until either side closes, the router stops, or
    /// the credential it was opened with is no longer good: its grant runs out (a scoped
    /// token's expiry), or the credentials are read again and its request no longer passes (the
    /// key that signed its token, or the static token, was rotated out).
    fn relay(
        &self,
        client: OnUpgrade,
        upstream: OnUpgrade,
        sandbox: String,
        active: Option<crate::activity::Active>,
        credential: Credential,
    ) {
        let metrics = Arc::clone(&self.metrics);
        let stop = self.stop.clone();
        self.tunnels.spawn(async move {
            metrics.tunnel_opened();
            let relayed = async {
                let (client, upstream) = tokio::try_join!(client, upstream)
                    .map_err(|error| std::io::Error::other(chain(&error)))?;
                let mut client = TokioIo::new(client);
                let mut upstream = TokioIo::new(upstream);
                tokio::io::copy_bidirectional(&mut client, &mut upstream).await
            };
            tokio::pin!(relayed);
            let Credential {
                opened_with,
                mut grant,
                mut authorizers,
            } = credential;
            let mut watching = true;
            loop {
                tokio::select! {
                    result = &mut relayed => {
                        match result {
                            Ok((to_sandbox, to_client)) => tracing::debug!(%sandbox, to_sandbox,
                                to_client, "tunnel closed"),
                            Err(error) => tracing::debug!(%sandbox, %error,
                                "tunnel ended with an error"),
                        }
                        break;
                    }
                    () = stop.cancelled() => {
                        tracing::info!(%sandbox, "tunnel closed by shutdown");
                        break;
                    }
                    () = until(grant.expires_at) => {
                        metrics.tunnel_revoked("expired");
                        tracing::info!(%sandbox, expires_at = grant.expires_at,
                            "tunnel closed: the token it was opened with expired");
                        break;
                    }
                    changed = authorizers.changed(), if watching => {
                        if changed.is_err() {
                            watching = false;
                            continue;
                        }
                        let authorizer = Arc::clone(&authorizers.borrow_and_update());
                        match opened_with.authorize(&authorizer, unix_now()) {
                            Ok(next) => grant = next,
                            Err(refusal) => {
                                metrics.tunnel_revoked("rejected");
                                tracing::info!(%sandbox, detail = %refusal.detail,
                                    "tunnel closed: the credentials were read again and the \
                                     one it was opened with is no longer accepted");
                                break;
                            }
                        }
                    }
                }
            }
            metrics.tunnel_closed();
            drop(active);
        });
    }
}

/// What an upgraded connection was let through with: checked again whenever `authorizers`
/// changes, and good until `grant` runs out.
struct Credential {
    opened_with: OpenedWith,
    grant: Grant,
    authorizers: tokio::sync::watch::Receiver<Arc<Authorizer>>,
}

/// Completes at `expires_at` (Unix seconds; a credential is good strictly before it), never
/// for `None`.
async fn until(expires_at: Option<i64>) {
    let Some(expires_at) = expires_at else {
        return std::future::pending().await;
    };
    // Before 1970: long past.
    let Ok(seconds) = u64::try_from(expires_at) else {
        return;
    };
    match UNIX_EPOCH.checked_add(Duration::from_secs(seconds)) {
        Some(at) => {
            let left = at.duration_since(SystemTime::now()).unwrap_or_default();
            tokio::time::sleep(left).await;
        }
        // Beyond what the clock can tell.
        None => std::future::pending().await,
    }
}

fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// `5s`, `1.500s`: a duration in messages.
pub(crate) fn seconds(duration: Duration) -> String {
    let value = duration.as_secs_f64();
    if value.fract() == 0.0 {
        format!("{value:.0}s")
    } else {
        format!("{value:.3}s")
    }
}

/// An error and its sources, `a: b: c`, for details and logs.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_short() {
        assert_eq!(seconds(Duration::from_secs(5)), "5s");
        assert_eq!(seconds(Duration::from_millis(1500)), "1.500s");
    }

    #[test]
    fn error_chains_skip_repeats() {
        let inner = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let outer = std::io::Error::other(inner);
        assert_eq!(chain(&outer), "refused");
    }
}
