//! Names, ports and headers that components use to find and address each other.
//!
//! One place for every address-shaped constant, so that the controller's default NetworkPolicy,
//! the router, the SDK's port-forward discovery and the `deploy/` manifests cannot disagree (the
//! seed article's gotchas 2 and 3 were exactly such disagreements).

/// Port of the runtime server inside every sandbox pod (upstream's python runtime).
pub const RUNTIME_PORT: u16 = 8888;

/// Namespace of the controller and, in our manifests, of the router.
///
/// Read by the controller's default NetworkPolicy (router peer namespace) and by the SDK's
/// port-forward mode (where to look for the router). Both are configurable; these defaults match
/// `deploy/`.
pub const SYSTEM_NAMESPACE: &str = "agent-sandbox-system";

/// Name of the controller Deployment (upstream's name).
pub const CONTROLLER_NAME: &str = "agent-sandbox-controller";
/// Port of the controller's Prometheus metrics.
pub const CONTROLLER_METRICS_PORT: u16 = 8080;
/// Port of the controller's `/healthz` and `/readyz`.
pub const CONTROLLER_HEALTH_PORT: u16 = 8081;
/// Name of the Lease the controller replicas elect a leader with (upstream's id).
pub const LEADER_ELECTION_ID: &str = "a3317529.agent-sandbox.x-k8s.io";
/// Field manager the controller uses for every write (server-side apply and patches).
pub const CONTROLLER_FIELD_MANAGER: &str = "sandbox-controller";

/// Flags (and their environment fallbacks) of `agent-sandbox-controller` that other text names:
/// the pool's `Capped` condition message, docs and operators' runbooks.
pub mod controller_flags {
    /// Most members the controller keeps in one pool, whatever `spec.replicas` asks.
    pub const WARM_POOL_MAX_REPLICAS: &str = "sandbox-warm-pool-max-replicas";
    /// Environment fallback of [`WARM_POOL_MAX_REPLICAS`].
    pub const WARM_POOL_MAX_REPLICAS_ENV: &str = "SANDBOX_CONTROLLER_WARM_POOL_MAX_REPLICAS";
    /// Most pool members the controller creates per second, over all pools.
    pub const WARM_POOL_MAX_CREATE_RATE: &str = "sandbox-warm-pool-max-create-rate";
    /// Environment fallback of [`WARM_POOL_MAX_CREATE_RATE`].
    pub const WARM_POOL_MAX_CREATE_RATE_ENV: &str = "SANDBOX_CONTROLLER_WARM_POOL_MAX_CREATE_RATE";
    /// Most pool members the controller creates per second in one pool (upstream's flag; 0:
    /// unpaced).
    pub const WARM_POOL_MAX_REFILL_RATE: &str = "sandbox-warm-pool-max-refill-rate";
    /// Environment fallback of [`WARM_POOL_MAX_REFILL_RATE`].
    pub const WARM_POOL_MAX_REFILL_RATE_ENV: &str = "SANDBOX_CONTROLLER_WARM_POOL_MAX_REFILL_RATE";
    /// Client-side API requests per second (upstream's flag; negative: no limit).
    pub const KUBE_API_QPS: &str = "kube-api-qps";
    /// Environment fallback of [`KUBE_API_QPS`].
    pub const KUBE_API_QPS_ENV: &str = "SANDBOX_CONTROLLER_KUBE_API_QPS";
    /// Client-side API request burst (upstream's flag; at least 1).
    pub const KUBE_API_BURST: &str = "kube-api-burst";
    /// Environment fallback of [`KUBE_API_BURST`].
    pub const KUBE_API_BURST_ENV: &str = "SANDBOX_CONTROLLER_KUBE_API_BURST";
    /// Upstream's switch of its claim, pool and template controllers (ours always run them).
    pub const EXTENSIONS: &str = "extensions";
    /// Upstream's switch that keeps the claim observability annotations off the API server.
    pub const DISABLE_CLAIM_OBSERVABILITY_ANNOTATIONS: &str =
        "disable-claim-observability-annotations";
    /// Environment fallback of [`DISABLE_CLAIM_OBSERVABILITY_ANNOTATIONS`].
    pub const DISABLE_CLAIM_OBSERVABILITY_ANNOTATIONS_ENV: &str =
        "SANDBOX_CONTROLLER_DISABLE_CLAIM_OBSERVABILITY_ANNOTATIONS";
}

/// Name of the router Service. Read by the SDK's port-forward discovery through the
/// EndpointSlices labelled `kubernetes.io/service-name` with this value.
pub const ROUTER_SERVICE: &str = "sandbox-router-svc";
/// Port of the router Service and of the router's proxy listener.
pub const ROUTER_PORT: u16 = 8080;
/// Secret (in [`SYSTEM_NAMESPACE`]) holding the router's signing key for `--auth scoped`, created
/// per installation (`cargo xtask cluster up`, docs/install.md), never committed.
pub const ROUTER_SIGNING_KEY_SECRET: &str = "sandbox-router-signing-key";
/// Key of that Secret's data holding the signing key (mounted as the file of that name).
pub const ROUTER_SIGNING_KEY_SECRET_KEY: &str = "key";

/// Default Kubernetes cluster domain for `status.serviceFQDN`.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

/// REST port of upstream's `sandboxd` runtime daemon (not served by our runtime).
pub const SANDBOXD_REST_PORT: u16 = 8080;
/// gRPC port of upstream's `sandboxd` runtime daemon (not served by our runtime).
pub const SANDBOXD_GRPC_PORT: u16 = 9090;

/// Headers by which clients tell the router which sandbox a request is for.
///
/// Written by the SDK (and any HTTP client) on every call through the router. Read by the router,
/// which strips them before forwarding.
pub mod headers {
    use std::time::Duration;

    /// Required: the Sandbox name (a DNS-1123 label).
    pub const SANDBOX_ID: &str = "X-Sandbox-ID";
    /// The Sandbox namespace; [`super::DEFAULT_SANDBOX_NAMESPACE`] when absent.
    pub const SANDBOX_NAMESPACE: &str = "X-Sandbox-Namespace";
    /// The port in the sandbox pod; [`super::RUNTIME_PORT`] when absent.
    pub const SANDBOX_PORT: &str = "X-Sandbox-Port";
    /// A hint at the pod IP; our router accepts it only when it is an address of the named
    /// sandbox's pod.
    pub const SANDBOX_POD_IP: &str = "X-Sandbox-Pod-IP";
    /// The Sandbox UID (upstream's Go router); when present our router checks it against the
    /// named sandbox.
    pub const SANDBOX_UID: &str = "X-Sandbox-UID";
    /// Seconds (a decimal number) the client will wait; the router's deadline for the request,
    /// capped by its configured maximum.
    pub const SANDBOX_TIMEOUT: &str = "X-Sandbox-Timeout";
    /// Request id sent by the SDKs and echoed in the router's access log.
    pub const REQUEST_ID: &str = "X-Request-ID";

    /// Seconds as a decimal number (`30`, `2.5`, `.5`, `5.`): digits with at most one `.`, above 0.
    /// Read exactly rather than through `f64` (which also takes signs, exponents and `inf`, and
    /// rounds `8388608.13` to `8388608.130000001`): digits beyond nanoseconds are dropped, and
    /// anything beyond what a `Duration` holds is `Duration::MAX` (the router's cap applies anyway).
    pub fn parse_timeout(raw: &str) -> Option<Duration> {
        let (whole, fraction) = raw.split_once('.').unwrap_or((raw, ""));
        let digits = |text: &str| text.bytes().all(|b| b.is_ascii_digit());
        if (whole.is_empty() && fraction.is_empty()) || !digits(whole) || !digits(fraction) {
            return None;
        }
        let nanos = fraction
            .bytes()
            .chain(std::iter::repeat(b'0'))
            .take(9)
            .fold(0u32, |n, b| n * 10 + u32::from(b - b'0'));
        let seconds = whole.bytes().try_fold(0u64, |n, b| {
            n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        });
        let duration = seconds.map_or(Duration::MAX, |seconds| Duration::new(seconds, nanos));
        (!duration.is_zero()).then_some(duration)
    }

    /// The [`SANDBOX_TIMEOUT`] value for `timeout`: seconds with millisecond precision, rounded
    /// up so that the value is never below the client's real deadline and never `0.000` (which
    /// [`parse_timeout`] refuses), e.g. `30.000`, `0.001` for 1 ns.
    pub fn format_timeout(timeout: Duration) -> String {
        let millis = timeout.as_nanos().div_ceil(1_000_000).max(1);
        format!("{}.{:03}", millis / 1000, millis % 1000)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn timeouts_round_trip_without_reaching_zero() {
            for (timeout, text) in [
                (Duration::from_nanos(1), "0.001"),
                (Duration::from_micros(400), "0.001"),
                (Duration::from_millis(1500), "1.500"),
                (Duration::from_nanos(1_500_000_001), "1.501"),
                (Duration::from_secs(30), "30.000"),
            ] {
                assert_eq!(format_timeout(timeout), text);
                let parsed = parse_timeout(text).unwrap_or_default();
                assert!(parsed >= timeout, "{text} is below {timeout:?}");
            }
            assert_eq!(parse_timeout("0.000"), None);
        }
    }
}

/// Namespace the router assumes when `X-Sandbox-Namespace` is absent.
pub const DEFAULT_SANDBOX_NAMESPACE: &str = "default";

/// Port of the router's separate metrics listener in upstream's Go router manifests
/// (`--metrics-bind-address=:9090`).
pub const ROUTER_METRICS_PORT: u16 = 9090;
/// Port of the router's separate probe listener (`/healthz`, `/readyz`) in upstream's Go router
/// manifests (`--health-probe-bind-address=:8081`).
pub const ROUTER_HEALTH_PORT: u16 = 8081;

/// Environment variables upstream's routers read (the Python router's, and the Go router's
/// aliases of its flags), which `sandbox-router` honours so that upstream's manifests start it.
pub mod router_env {
    /// A static bearer token (surrounding whitespace removed; empty means unset).
    pub const ROUTER_AUTH_TOKEN: &str = "ROUTER_AUTH_TOKEN";
    /// Truthy (`1`, `true`, `t`, `yes`, `y`, `on`, any case): run without authentication.
    pub const ALLOW_UNAUTHENTICATED_ROUTER: &str = "ALLOW_UNAUTHENTICATED_ROUTER";
    /// Request deadline, positive float seconds.
    pub const PROXY_TIMEOUT_SECONDS: &str = "PROXY_TIMEOUT_SECONDS";
    /// The cluster's DNS domain.
    pub const CLUSTER_DOMAIN: &str = "CLUSTER_DOMAIN";
    /// The Go router's YAML file of flag values.
    pub const SANDBOX_ROUTER_CONFIG: &str = "SANDBOX_ROUTER_CONFIG";
    /// Read by upstream's routers for behaviour `sandbox-router` does not have (connection pool
    /// sizes, WebSocket limits, TLS, OpenTelemetry): accepted and reported as having no effect.
    pub const WITHOUT_EFFECT: [&str; 11] = [
        "MAX_KEEPALIVE_CONNECTIONS",
        "WEBSOCKET_IDLE_TIMEOUT_SECONDS",
        "WEBSOCKET_MAX_LIFETIME_SECONDS",
        "WEBSOCKET_MAX_CONNECTIONS_PER_CLIENT",
        "WEBSOCKET_MAX_MESSAGE_BYTES",
        "TRUSTED_PROXY_CIDRS",
        "TLS_MIN_VERSION",
        "TLS_CIPHER_SUITES",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    ];
    /// The values of [`ALLOW_UNAUTHENTICATED_ROUTER`] that mean yes, compared ignoring case and
    /// surrounding whitespace.
    pub const TRUTHY: [&str; 6] = ["1", "true", "t", "yes", "y", "on"];
}
