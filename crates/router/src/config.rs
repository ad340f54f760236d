//! Configuration: the [`Config`] the router runs with, the [`Auth`] it enforces, and the
//! command-line [`Args`] that produce them.
//!
//! [`Args`] holds three dialects, so that the manifests of either upstream router start ours
//! unchanged:
//! - our flags, each with a `SANDBOX_ROUTER_*` environment fallback;
//! - upstream's Go router flags ([`GoFlags`]), in Go's spellings (the binary rewrites `-flag` to
//!   `--flag`, booleans may be bare); those we have no behaviour for are accepted and reported
//!   as having no effect ([`IgnoredGoFlags`]);
//! - the environment variables of upstream's routers (`ROUTER_AUTH_TOKEN`,
//!   `ALLOW_UNAUTHENTICATED_ROUTER`, `PROXY_TIMEOUT_SECONDS`, `CLUSTER_DOMAIN`, ...), read by
//!   [`Args::resolve`] through a lookup function, below every flag in precedence.
//!
//! `Args` is a `clap::Args` so that another binary can embed the router with the same flags;
//! in-process users build a [`Config`] directly.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_sandbox_api::go_flag::{self, parse_bool};
use agent_sandbox_api::names::is_dns_label;
use agent_sandbox_api::token::{self, v2::VerificationKeys};
use agent_sandbox_api::units::{parse_positive_duration, parse_size, parse_size_usize};
use agent_sandbox_api::wire::{ROUTER_PORT, router_env};

use crate::error::{Error, Result};

/// Shortest accepted static bearer token from `--token-file`, in bytes after trimming
/// whitespace. A token from `ROUTER_AUTH_TOKEN` keeps upstream's contract (any non-empty
/// token) and is only warned about when shorter.
pub const MIN_STATIC_TOKEN_BYTES: usize = 32;

/// Everything the router needs to know.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address of the proxy listener (also `/healthz`, `/readyz`, `/metrics`).
    pub listen: SocketAddr,
    /// A separate listener serving only `/healthz` and `/readyz` (upstream's
    /// `--health-probe-bind-address`).
    pub probe_listen: Option<SocketAddr>,
    /// A separate listener serving only `/metrics` (upstream's `--metrics-bind-address`).
    pub metrics_listen: Option<SocketAddr>,
    /// Who may send requests.
    pub auth: Auth,
    /// Public keys of scoped tokens v2 (`--auth scoped` only; empty: v2 tokens are refused).
    pub scoped_v2_keys: VerificationKeys,
    /// With `--auth scoped`, v1 tokens are refused from this instant on (Unix seconds).
    pub scoped_v1_accept_until: Option<i64>,
    /// Deadline of a request without `X-Sandbox-Timeout`, and the cap on that header.
    pub max_timeout: Duration,
    /// Time one TCP connect attempt to a pod may take.
    pub connect_timeout: Duration,
    /// Further connect attempts after a failed one (nothing was sent, so retrying is safe).
    pub connect_retries: u32,
    /// Largest request body; larger ones get 413.
    pub max_body_bytes: u64,
    /// Largest request head (request line and headers); larger ones get 431.
    pub max_header_bytes: usize,
    /// After a shutdown signal, how long in-flight requests and tunnels get to finish.
    pub shutdown_grace: Duration,
    /// Watch Sandboxes and Pods in this namespace only (all namespaces when `None`).
    pub namespace: Option<String>,
    /// Log one line per proxied request.
    pub access_log: bool,
    /// How long an idle pooled connection to a pod is kept.
    pub pool_idle_timeout: Duration,
    /// Where sockets for connections to pods come from, when pods live in network namespaces
    /// this process is not in (an embedded router of a local cluster: pods with loopback only,
    /// or a kubelet that is not root); `None`: ordinary sockets.
    pub pod_sockets: Option<PodSockets>,
    /// Writes of a sandbox's `status.lastActivityTime` are at least this far apart (a quarter
    /// of its `activeTTLSeconds` when that is shorter).
    pub activity_interval: Duration,
    /// Files `auth`'s token or keys (and `scoped_v2_keys`) were read from: re-read every
    /// `credential_reload_interval` while the router runs, so that a rotation takes effect
    /// without a restart (empty: nothing is re-read).
    pub credential_files: CredentialFiles,
    /// How often `credential_files` are looked at.
    pub credential_reload_interval: Duration,
}

/// The files the router's credentials come from ([`Config::credential_files`]). A key or token
/// no longer in them is refused from the next reload on, and the upgraded connections opened
/// with a token it verified are closed then.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CredentialFiles {
    /// The static token's file (`--token-file`).
    pub token: Option<PathBuf>,
    /// The scoped-token v1 signing key files.
    pub signing_keys: Vec<PathBuf>,
    /// The scoped-token v2 verification key file.
    pub verification_keys: Option<PathBuf>,
}

impl CredentialFiles {
    /// Whether there is no file to re-read.
    pub fn is_empty(&self) -> bool {
        self.token.is_none() && self.signing_keys.is_empty() && self.verification_keys.is_none()
    }

    /// Every file, in a fixed order.
    pub(crate) fn paths(&self) -> impl Iterator<Item = &Path> {
        self.token
            .iter()
            .chain(&self.signing_keys)
            .chain(&self.verification_keys)
            .map(PathBuf::as_path)
    }
}

/// A maker of sockets for connections to pods ([`Config::pod_sockets`]): given the pod IP to
/// connect to, a socket made where that IP is reachable.
#[derive(Clone)]
pub struct PodSockets(
    pub  std::sync::Arc<
        dyn Fn(std::net::IpAddr) -> std::io::Result<tokio::net::TcpSocket> + Send + Sync,
    >,
);

impl std::fmt::Debug for PodSockets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PodSockets(..)")
    }
}

/// Defaults, shared by [`Config::new`] and [`Args`].
pub mod defaults {
    /// `--max-timeout-seconds`: an hour, so commands that run for many minutes are not cut off.
    pub const MAX_TIMEOUT_SECONDS: &str = "3600";
    /// `--connect-timeout-seconds`.
    pub const CONNECT_TIMEOUT_SECONDS: &str = "5";
    /// `--connect-retries`.
    pub const CONNECT_RETRIES: u32 = 3;
    /// `--max-body-bytes`: as large as the runtime's own upload limit.
    pub const MAX_BODY_BYTES: &str = "16GiB";
    /// `--max-header-bytes`.
    pub const MAX_HEADER_BYTES: &str = "32KiB";
    /// `--shutdown-grace-seconds`.
    pub const SHUTDOWN_GRACE_SECONDS: &str = "30";
    /// `--pool-idle-seconds`.
    pub const POOL_IDLE_SECONDS: &str = "60";
    /// `--activity-interval`.
    pub const ACTIVITY_INTERVAL_SECONDS: &str = "30";
    /// How often token and key files are re-read: a mounted Secret's update reaches the pod
    /// within the kubelet's sync period (about a minute), so a few seconds more do not matter.
    pub const CREDENTIAL_RELOAD_SECONDS: &str = "10";
}

impl Config {
    /// The defaults, listening on `listen`, with no authentication (for embedding and tests).
    pub fn new(listen: SocketAddr) -> Self {
        let secs = |s: &str| parse_positive_duration(s).unwrap_or(Duration::from_secs(1));
        let size = |s: &str| parse_size(s).unwrap_or(1 << 20);
        Self {
            listen,
            probe_listen: None,
            metrics_listen: None,
            auth: Auth::None,
            scoped_v2_keys: VerificationKeys::default(),
            scoped_v1_accept_until: None,
            max_timeout: secs(defaults::MAX_TIMEOUT_SECONDS),
            connect_timeout: secs(defaults::CONNECT_TIMEOUT_SECONDS),
            connect_retries: defaults::CONNECT_RETRIES,
            max_body_bytes: size(defaults::MAX_BODY_BYTES),
            max_header_bytes: parse_size_usize(defaults::MAX_HEADER_BYTES).unwrap_or(32 << 10),
            shutdown_grace: secs(defaults::SHUTDOWN_GRACE_SECONDS),
            namespace: None,
            access_log: true,
            pool_idle_timeout: secs(defaults::POOL_IDLE_SECONDS),
            pod_sockets: None,
            activity_interval: secs(defaults::ACTIVITY_INTERVAL_SECONDS),
            credential_files: CredentialFiles::default(),
            credential_reload_interval: secs(defaults::CREDENTIAL_RELOAD_SECONDS),
        }
    }
}

/// Who may send requests through the router.
#[derive(Clone)]
pub enum Auth {
    /// Anyone who can reach the router (development only; logged as a warning at startup).
    None,
    /// Requests must carry `Authorization: Bearer <token>` with this one token.
    Token(Secret),
    /// Requests must carry a scoped token for the sandbox they address: v1
    /// ([`agent_sandbox_api::token`]) signed with one of these keys (several during a key
    /// rotation; none when only v2 is accepted), or v2 verified with
    /// [`Config::scoped_v2_keys`].
    Scoped(Vec<Secret>),
}

impl Auth {
    /// The mode's name as `--auth` spells it.
    pub fn mode(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Token(_) => "token",
            Self::Scoped(_) => "scoped",
        }
    }
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::Token(_) => f.write_str("Token(<redacted>)"),
            Self::Scoped(keys) => write!(f, "Scoped({} v1 key(s), <redacted>)", keys.len()),
        }
    }
}

/// Secret bytes (a token or a signing key), trimmed of surrounding whitespace; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// Wraps `bytes`, trimming surrounding ASCII whitespace.
    pub fn new(bytes: impl AsRef<[u8]>) -> Self {
        Self(bytes.as_ref().trim_ascii().to_vec())
    }

    /// The bytes.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// `--auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthMode {
    /// No authentication (development only).
    None,
    /// One static bearer token (`--token-file` or `ROUTER_AUTH_TOKEN`).
    Token,
    /// Per-sandbox signed tokens (`--signing-key-file` for v1, a v2 key file for v2).
    Scoped,
}

/// Upstream's `--authz-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GoAuthzMode {
    /// `--auth none`.
    AllowAll,
    /// Kubernetes TokenReview per request: not supported (refused at startup).
    Tokenreview,
    /// `--auth scoped`.
    ScopedToken,
}

/// Upstream's Go router flags that map to our behaviour.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(next_help_heading = "Upstream Go router flags")]
pub struct GoFlags {
    /// Proxy listener (`:8080` means every IPv4 address; empty is refused: plain HTTP is the only
    /// listener). Same as --listen.
    #[arg(long, conflicts_with = "listen")]
    pub http_bind_address: Option<String>,
    /// Separate listener for /metrics (empty or 0: none).
    #[arg(long)]
    pub metrics_bind_address: Option<String>,
    /// Separate listener for /healthz and /readyz (empty or 0: none).
    #[arg(long)]
    pub health_probe_bind_address: Option<String>,
    /// Request deadline as a Go duration (180s). Same as --max-timeout-seconds.
    #[arg(long, value_parser = parse_positive_duration, conflicts_with = "max_timeout")]
    pub proxy_timeout: Option<Duration>,
    /// Retries of failed connects. Same as --connect-retries.
    #[arg(long, conflicts_with = "connect_retries")]
    pub upstream_max_retries: Option<u32>,
    /// Watch one namespace only. Same as --namespace.
    #[arg(long, conflicts_with = "namespace")]
    pub cache_namespace: Option<String>,
    /// Shutdown grace as a Go duration. Same as --shutdown-grace-seconds.
    #[arg(long, value_parser = parse_positive_duration, conflicts_with = "shutdown_grace")]
    pub shutdown_timeout: Option<Duration>,
    /// Largest request body in bytes; 0 = unlimited. Same as --max-body-bytes.
    #[arg(long, conflicts_with = "max_body_bytes", allow_negative_numbers = true)]
    pub max_request_body_bytes: Option<i64>,
    /// The cluster's DNS domain (accepted; routing uses no DNS).
    #[arg(long)]
    pub cluster_domain: Option<String>,
    /// allow-all (= --auth none), scoped-token (= --auth scoped); tokenreview is not supported.
    #[arg(long, value_enum, conflicts_with = "auth")]
    pub authz_mode: Option<GoAuthzMode>,
    /// Scoped tokens v1: HMAC key file (as --signing-key-file).
    #[arg(long)]
    pub authz_scoped_token_secret_file: Option<PathBuf>,
    /// Scoped tokens v2: JSON file of Ed25519 public keys, {"keys":[{"kid","publicKey"}]}.
    #[arg(long)]
    pub authz_scoped_token_verification_keys_file: Option<PathBuf>,
    /// With v1 and v2 both on, v1 tokens are refused from this RFC 3339 instant on.
    #[arg(long)]
    pub authz_scoped_token_v1_accept_until: Option<String>,
    /// Pod cache (accepted; this router always watches).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = parse_bool)]
    pub cache_enabled: Option<bool>,
    /// Kubeconfig file (default: KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Log level: debug, info, error, panic, or an integer verbosity (2 and above: trace).
    #[arg(long)]
    pub zap_log_level: Option<String>,
    /// Log encoding: json or console.
    #[arg(long, value_parser = ["json", "console"])]
    pub zap_encoder: Option<String>,
    /// Development logging (console encoding, debug level).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = parse_bool)]
    pub zap_devel: Option<bool>,
}

/// Upstream's Go router flags this router has no behaviour for: accepted (so upstream's
/// argument lists start it) and reported once as having no effect.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(next_help_heading = "Upstream Go router flags without effect here")]
pub struct IgnoredGoFlags {
    #[arg(long, hide = true)]
    https_bind_address: Option<String>,
    #[arg(long, hide = true)]
    tls_cert_file: Option<String>,
    #[arg(long, hide = true)]
    tls_key_file: Option<String>,
    #[arg(long, hide = true)]
    tls_client_ca_file: Option<String>,
    #[arg(long, hide = true)]
    mtls_mode: Option<String>,
    #[arg(long, hide = true)]
    tls_min_version: Option<String>,
    #[arg(long, hide = true)]
    tls_cipher_suites: Option<String>,
    #[arg(long, hide = true)]
    response_header_timeout: Option<String>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    allow_loopback_pod_ip: Option<bool>,
    #[arg(long, hide = true)]
    path_routing_prefix: Option<String>,
    #[arg(long, hide = true)]
    upstream_retry_initial_delay: Option<String>,
    #[arg(long, hide = true)]
    upstream_retry_max_delay: Option<String>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    enable_tracing: Option<bool>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    enable_otel_metrics: Option<bool>,
    #[arg(long, hide = true)]
    authz_tokenreview_ttl: Option<String>,
    #[arg(long, hide = true)]
    authz_tokenreview_cache_size: Option<String>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    authz_tokenreview_require_token: Option<bool>,
    #[arg(long, hide = true)]
    authz_tokenreview_audiences: Option<String>,
    #[arg(long, hide = true)]
    authz_cookie_name: Option<String>,
    #[arg(long, hide = true)]
    authz_cookie_query_param: Option<String>,
    #[arg(long, hide = true)]
    authz_cookie_samesite: Option<String>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    authz_cookie_insecure: Option<bool>,
    #[arg(long, hide = true)]
    authz_cookie_allowed_origins: Option<String>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    authz_trust_forwarded_proto: Option<bool>,
    #[arg(long, hide = true)]
    zap_stacktrace_level: Option<String>,
    #[arg(long, hide = true)]
    zap_time_encoding: Option<String>,
    /// Upstream's YAML file of flag values: refused, so that settings in it are never silently
    /// dropped.
    #[arg(long, hide = true)]
    config: Option<PathBuf>,
}

impl IgnoredGoFlags {
    /// The flags given, as `--name=value`.
    fn given(&self) -> Vec<String> {
        let text =
            |name: &str, value: &Option<String>| value.as_ref().map(|v| format!("--{name}={v}"));
        let flag = |name: &str, value: &Option<bool>| value.map(|v| format!("--{name}={v}"));
        [
            text("https-bind-address", &self.https_bind_address),
            text("tls-cert-file", &self.tls_cert_file),
            text("tls-key-file", &self.tls_key_file),
            text("tls-client-ca-file", &self.tls_client_ca_file),
            text("mtls-mode", &self.mtls_mode),
            text("tls-min-version", &self.tls_min_version),
            text("tls-cipher-suites", &self.tls_cipher_suites),
            text("response-header-timeout", &self.response_header_timeout),
            flag("allow-loopback-pod-ip", &self.allow_loopback_pod_ip),
            text("path-routing-prefix", &self.path_routing_prefix),
            text(
                "upstream-retry-initial-delay",
                &self.upstream_retry_initial_delay,
            ),
            text("upstream-retry-max-delay", &self.upstream_retry_max_delay),
            flag("enable-tracing", &self.enable_tracing),
            flag("enable-otel-metrics", &self.enable_otel_metrics),
            text("authz-tokenreview-ttl", &self.authz_tokenreview_ttl),
            text(
                "authz-tokenreview-cache-size",
                &self.authz_tokenreview_cache_size,
            ),
            flag(
                "authz-tokenreview-require-token",
                &self.authz_tokenreview_require_token,
            ),
            text(
                "authz-tokenreview-audiences",
                &self.authz_tokenreview_audiences,
            ),
            text("authz-cookie-name", &self.authz_cookie_name),
            text("authz-cookie-query-param", &self.authz_cookie_query_param),
            text("authz-cookie-samesite", &self.authz_cookie_samesite),
            flag("authz-cookie-insecure", &self.authz_cookie_insecure),
            text(
                "authz-cookie-allowed-origins",
                &self.authz_cookie_allowed_origins,
            ),
            flag(
                "authz-trust-forwarded-proto",
                &self.authz_trust_forwarded_proto,
            ),
            text("zap-stacktrace-level", &self.zap_stacktrace_level),
            text("zap-time-encoding", &self.zap_time_encoding),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

impl GoFlags {
    /// The flags given that only upstream's Go router has (as `--name`): they mark a command
    /// line written for it. `--kubeconfig` (ours too), `--metrics-bind-address` and
    /// `--health-probe-bind-address` (our docs recommend them beside our own flags) mark
    /// nothing.
    fn go_only(&self) -> Vec<&'static str> {
        let Self {
            http_bind_address,
            metrics_bind_address: _,
            health_probe_bind_address: _,
            proxy_timeout,
            upstream_max_retries,
            cache_namespace,
            shutdown_timeout,
            max_request_body_bytes,
            cluster_domain,
            authz_mode,
            authz_scoped_token_secret_file,
            authz_scoped_token_verification_keys_file,
            authz_scoped_token_v1_accept_until,
            cache_enabled,
            kubeconfig: _,
            zap_log_level,
            zap_encoder,
            zap_devel,
        } = self;
        [
            (http_bind_address.is_some(), "--http-bind-address"),
            (proxy_timeout.is_some(), "--proxy-timeout"),
            (upstream_max_retries.is_some(), "--upstream-max-retries"),
            (cache_namespace.is_some(), "--cache-namespace"),
            (shutdown_timeout.is_some(), "--shutdown-timeout"),
            (max_request_body_bytes.is_some(), "--max-request-body-bytes"),
            (cluster_domain.is_some(), "--cluster-domain"),
            (authz_mode.is_some(), "--authz-mode"),
            (
                authz_scoped_token_secret_file.is_some(),
                "--authz-scoped-token-secret-file",
            ),
            (
                authz_scoped_token_verification_keys_file.is_some(),
                "--authz-scoped-token-verification-keys-file",
            ),
            (
                authz_scoped_token_v1_accept_until.is_some(),
                "--authz-scoped-token-v1-accept-until",
            ),
            (cache_enabled.is_some(), "--cache-enabled"),
            (zap_log_level.is_some(), "--zap-log-level"),
            (zap_encoder.is_some(), "--zap-encoder"),
            (zap_devel.is_some(), "--zap-devel"),
        ]
        .into_iter()
        .filter_map(|(given, flag)| given.then_some(flag))
        .collect()
    }

    /// The `tracing` filter the zap flags ask for, if any: `--zap-log-level` (debug, info,
    /// error, panic, or an integer verbosity: 1 is debug, 2 and above trace), else debug for
    /// `--zap-devel`.
    pub fn log_filter(&self) -> std::result::Result<Option<&'static str>, String> {
        if let Some(level) = &self.zap_log_level {
            return parse_zap_level(level).map(Some);
        }
        Ok((self.zap_devel == Some(true)).then_some("debug"))
    }

    /// Whether the zap flags ask for JSON logs (`Some(false)`: console, i.e. text).
    pub fn log_json(&self) -> Option<bool> {
        match self.zap_encoder.as_deref() {
            Some("json") => Some(true),
            Some(_) => Some(false),
            None => (self.zap_devel == Some(true)).then_some(false),
        }
    }
}

/// Reads a `--zap-log-level` as a `tracing` level.
fn parse_zap_level(text: &str) -> std::result::Result<&'static str, String> {
    match text.trim() {
        "debug" => Ok("debug"),
        "info" => Ok("info"),
        "error" | "panic" | "dpanic" | "fatal" => Ok("error"),
        "warn" => Ok("warn"),
        other => match other.parse::<u32>() {
            Ok(1) => Ok("debug"),
            Ok(n) if n >= 2 => Ok("trace"),
            _ => Err(format!(
                "invalid --zap-log-level {text:?}: use debug, info, error, panic or an integer above 0"
            )),
        },
    }
}

/// Command-line flags of `sandbox-router`. Invalid values are errors that name the flag, never
/// silently replaced by defaults (upstream's `PROXY_TIMEOUT_SECONDS` excepted, which keeps
/// upstream's fall-back).
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Address of the proxy listener (also serves /healthz, /readyz and /metrics).
    #[arg(long, env = "SANDBOX_ROUTER_LISTEN",
          default_value_t = SocketAddr::from(([0, 0, 0, 0], ROUTER_PORT)))]
    pub listen: SocketAddr,
    /// Authentication of clients: none (development only), token (one static bearer token) or
    /// scoped (signed tokens bound to one sandbox and an expiry). Without it, see
    /// docs/router.md ("Choosing the mode").
    #[arg(long, env = "SANDBOX_ROUTER_AUTH", value_enum)]
    pub auth: Option<AuthMode>,
    /// File holding the static bearer token (`--auth token`; at least 32 bytes).
    #[arg(long, env = "SANDBOX_ROUTER_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// File holding a scoped-token v1 signing key (`--auth scoped`; at least 32 bytes). Repeat
    /// the flag, or separate paths with commas, to accept tokens signed by any of several keys
    /// while rotating.
    #[arg(long, env = "SANDBOX_ROUTER_SIGNING_KEY_FILE", value_delimiter = ',')]
    pub signing_key_file: Vec<PathBuf>,
    /// Deadline of a request without X-Sandbox-Timeout, and the cap on that header (seconds;
    /// default 3600).
    #[arg(long = "max-timeout-seconds", env = "SANDBOX_ROUTER_MAX_TIMEOUT_SECONDS",
          value_parser = parse_positive_duration)]
    pub max_timeout: Option<Duration>,
    /// Time one TCP connect attempt to a sandbox pod may take (seconds).
    #[arg(long = "connect-timeout-seconds", env = "SANDBOX_ROUTER_CONNECT_TIMEOUT_SECONDS",
          default_value = defaults::CONNECT_TIMEOUT_SECONDS, value_parser = parse_positive_duration)]
    pub connect_timeout: Duration,
    /// Further connect attempts after a failed one, with backoff (nothing was sent yet; default
    /// 3).
    #[arg(long, env = "SANDBOX_ROUTER_CONNECT_RETRIES")]
    pub connect_retries: Option<u32>,
    /// Largest request body (`64MiB`, `16GiB`, bytes; default 16GiB); larger ones get 413.
    #[arg(long, env = "SANDBOX_ROUTER_MAX_BODY_BYTES", value_parser = parse_size)]
    pub max_body_bytes: Option<u64>,
    /// Largest request line plus headers; larger ones get 431.
    #[arg(long, env = "SANDBOX_ROUTER_MAX_HEADER_BYTES", default_value = defaults::MAX_HEADER_BYTES,
          value_parser = parse_header_size)]
    pub max_header_bytes: usize,
    /// Seconds in-flight requests and WebSocket tunnels get after SIGTERM.
    #[arg(long = "shutdown-grace-seconds", env = "SANDBOX_ROUTER_SHUTDOWN_GRACE_SECONDS",
          default_value = defaults::SHUTDOWN_GRACE_SECONDS, value_parser = parse_positive_duration)]
    pub shutdown_grace: Duration,
    /// Watch Sandboxes and Pods in this namespace only (default: all namespaces).
    #[arg(long, env = "SANDBOX_ROUTER_NAMESPACE")]
    pub namespace: Option<String>,
    /// Log one line per proxied request (`--access-log`, `--access-log=false`).
    #[arg(long, env = "SANDBOX_ROUTER_ACCESS_LOG", default_value = "true", num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_parser = parse_bool)]
    pub access_log: bool,
    /// Seconds an idle pooled connection to a sandbox pod is kept.
    #[arg(long = "pool-idle-seconds", env = "SANDBOX_ROUTER_POOL_IDLE_SECONDS",
          default_value = defaults::POOL_IDLE_SECONDS, value_parser = parse_positive_duration)]
    pub pool_idle_timeout: Duration,
    /// Seconds between two writes of a sandbox's `status.lastActivityTime` (its idle
    /// lifecycle's clock), at least; a quarter of its `activeTTLSeconds` when that is shorter.
    #[arg(long = "activity-interval", env = "SANDBOX_ROUTER_ACTIVITY_INTERVAL",
          default_value = defaults::ACTIVITY_INTERVAL_SECONDS, value_parser = parse_positive_duration)]
    pub activity_interval: Duration,
    /// Upstream's Go router flags.
    #[command(flatten)]
    pub go: GoFlags,
    /// Upstream's Go router flags without effect here.
    #[command(flatten)]
    pub ignored: IgnoredGoFlags,
    /// Our own settings (as `--flag`) that the command line or a `SANDBOX_ROUTER_*` variable
    /// gave, recorded by [`Args::record_sources`]; `None` until then.
    #[arg(skip)]
    own_settings: Option<Vec<String>>,
}

/// Our flags upstream's Go router has too: they tell neither dialect from the other.
const SHARED_WITH_UPSTREAM: [&str; 1] = ["access-log"];

/// Whose command line the router was given, for the auth mode's default.
#[derive(Debug)]
struct Dialect {
    /// Flags only upstream's Go router has, as `--name`.
    go_only: Vec<String>,
    /// Our own settings given (see [`Args::record_sources`]); `None`: not recorded.
    own: Option<Vec<String>>,
}

impl Dialect {
    /// Unmistakably upstream's Go router's: one of its own flags, and none of ours.
    fn is_upstream_go(&self) -> bool {
        !self.go_only.is_empty() && self.own.as_ref().is_some_and(Vec::is_empty)
    }

    /// Why a command line with Go router flags did not get that router's default.
    fn why_not_upstream_go(&self) -> Option<String> {
        if self.go_only.is_empty() {
            return None;
        }
        let go = self.go_only.join(", ");
        match &self.own {
            None => Some(format!(
                "; upstream's Go router flags ({go}) are given, but where the other settings came                  from was not recorded, so its default (--authz-mode=allow-all) does not apply"
            )),
            Some(own) if !own.is_empty() => Some(format!(
                "; upstream's Go router default (--authz-mode=allow-all) applies only to a                  command line of its flags alone, and this one has sandbox-router's own {}                  beside {go}",
                own.join(", ")
            )),
            Some(_) => None,
        }
    }
}

/// What [`Args::resolve`] produced: the configuration, the kubeconfig to use (`--kubeconfig`),
/// and warnings to log once at startup (settings without effect, fall-backs, weak tokens).
#[derive(Debug)]
pub struct Resolved {
    /// The configuration.
    pub config: Config,
    /// `--kubeconfig`, when given.
    pub kubeconfig: Option<PathBuf>,
    /// One sentence each.
    pub warnings: Vec<String>,
}

impl Args {
    /// Records which of our own settings got their value from `matches` (the command line, or a
    /// `SANDBOX_ROUTER_*` variable) rather than from a default. `command` is the command
    /// `matches` came from, so settings of a binary that embeds `Args` (`--log-format`) count
    /// too. Upstream's Go router default (`--authz-mode=allow-all`) applies only to a command
    /// line with none of them; without this call it never applies.
    pub fn record_sources(&mut self, command: &clap::Command, matches: &clap::ArgMatches) {
        use clap::Args as _;
        use clap::parser::ValueSource;
        let go = GoFlags::augment_args(clap::Command::new("go"));
        let ignored = IgnoredGoFlags::augment_args(clap::Command::new("ignored"));
        let upstream: Vec<&clap::Id> = go
            .get_arguments()
            .chain(ignored.get_arguments())
            .map(clap::Arg::get_id)
            .collect();
        let mut own: Vec<String> = command
            .get_arguments()
            .filter(|arg| !upstream.contains(&arg.get_id()))
            .filter(|arg| {
                matches!(
                    matches.value_source(arg.get_id().as_str()),
                    Some(ValueSource::CommandLine | ValueSource::EnvVariable)
                )
            })
            .filter_map(clap::Arg::get_long)
            .filter(|long| !SHARED_WITH_UPSTREAM.contains(long))
            .map(|long| format!("--{long}"))
            .collect();
        own.sort();
        self.own_settings = Some(own);
    }

    /// The configuration these flags and the process environment describe, with token and key
    /// files read; warnings are logged.
    pub fn into_config(self) -> Result<Config> {
        let resolved = self.resolve(&|name| std::env::var(name).ok())?;
        for warning in &resolved.warnings {
            tracing::warn!("{warning}");
        }
        Ok(resolved.config)
    }

    /// The configuration these flags describe, with upstream's environment variables read
    /// through `env` (below every flag in precedence) and token and key files read.
    pub fn resolve(self, env: &dyn Fn(&str) -> Option<String>) -> Result<Resolved> {
        let mut warnings = Vec::new();
        let dialect =
            Dialect {
                go_only: self
                    .go
                    .go_only()
                    .into_iter()
                    .map(str::to_owned)
                    .chain(self.ignored.given().into_iter().map(
                        |flag| match flag.split_once('=') {
                            Some((name, _)) => name.to_owned(),
                            None => flag,
                        },
                    ))
                    .collect(),
                own: self.own_settings.clone(),
            };
        if self.ignored.config.is_some() || env(router_env::SANDBOX_ROUTER_CONFIG).is_some() {
            return Err(Error::ConfigFile);
        }
        for flag in self.ignored.given() {
            warnings.push(format!(
                "{flag} has no effect: sandbox-router has no such behaviour (upstream Go router \
                 flag, accepted so that its argument lists start this router)"
            ));
        }
        for name in router_env::WITHOUT_EFFECT {
            if env(name).is_some() {
                warnings.push(format!(
                    "{name} has no effect: sandbox-router has no such setting (read by upstream's \
                     routers; see docs/router.md)"
                ));
            }
        }
        if let Some(domain) = self
            .go
            .cluster_domain
            .clone()
            .map(|d| ("--cluster-domain", d))
            .or_else(|| env(router_env::CLUSTER_DOMAIN).map(|d| (router_env::CLUSTER_DOMAIN, d)))
        {
            warnings.push(format!(
                "{}={:?} has no effect: routing uses the router's watch of Sandboxes and Pods \
                 and never resolves cluster DNS names",
                domain.0, domain.1
            ));
        }
        if self.go.cache_enabled == Some(false) {
            warnings.push(
                "--cache-enabled=false has no effect: this router always routes from its watch \
                 of Pods (and Sandboxes), never through DNS"
                    .to_owned(),
            );
        }

        let listen = match &self.go.http_bind_address {
            None => self.listen,
            Some(text) => go_flag::parse_bind_address(text)
                .map_err(|reason| invalid("--http-bind-address", text, reason))?
                .ok_or_else(|| {
                    invalid(
                        "--http-bind-address",
                        text,
                        "this router serves plain HTTP only, so it needs this listener (TLS \
                         belongs to a Gateway or mesh in front of it)"
                            .to_owned(),
                    )
                })?,
        };
        let probe_listen = optional_bind(
            "--health-probe-bind-address",
            self.go.health_probe_bind_address.as_deref(),
        )?;
        let metrics_listen = optional_bind(
            "--metrics-bind-address",
            self.go.metrics_bind_address.as_deref(),
        )?;

        let max_timeout = match self.max_timeout.or(self.go.proxy_timeout) {
            Some(timeout) => timeout,
            None => match env(router_env::PROXY_TIMEOUT_SECONDS) {
                None => default_max_timeout(),
                Some(text) => match parse_float_seconds(&text) {
                    Some(timeout) => timeout,
                    None => {
                        let fallback = default_max_timeout();
                        warnings.push(format!(
                            "{}={text:?} is not a positive number of seconds; using {}s",
                            router_env::PROXY_TIMEOUT_SECONDS,
                            fallback.as_secs()
                        ));
                        fallback
                    }
                },
            },
        };
        let max_body_bytes = match (self.max_body_bytes, self.go.max_request_body_bytes) {
            (Some(bytes), _) => bytes,
            (None, Some(0)) => u64::MAX,
            (None, Some(bytes)) => u64::try_from(bytes).map_err(|_| {
                invalid(
                    "--max-request-body-bytes",
                    &bytes.to_string(),
                    "must be 0 (unlimited) or a positive number of bytes".to_owned(),
                )
            })?,
            (None, None) => parse_size(defaults::MAX_BODY_BYTES).unwrap_or(16 << 30),
        };
        let namespace = self.namespace.clone().or(self.go.cache_namespace.clone());
        if let Some(namespace) = &namespace
            && !is_dns_label(namespace)
        {
            return Err(Error::InvalidNamespace {
                namespace: namespace.clone(),
            });
        }

        let (auth, scoped_v2_keys, scoped_v1_accept_until) =
            self.resolve_auth(env, &dialect, &mut warnings)?;
        let credential_files = match &auth {
            Auth::None => CredentialFiles::default(),
            Auth::Token(_) => CredentialFiles {
                token: self.token_file.clone(),
                ..CredentialFiles::default()
            },
            Auth::Scoped(_) => CredentialFiles {
                token: None,
                signing_keys: self
                    .signing_key_file
                    .iter()
                    .chain(&self.go.authz_scoped_token_secret_file)
                    .cloned()
                    .collect(),
                verification_keys: self.go.authz_scoped_token_verification_keys_file.clone(),
            },
        };
        Ok(Resolved {
            config: Config {
                listen,
                probe_listen,
                metrics_listen,
                auth,
                scoped_v2_keys,
                scoped_v1_accept_until,
                max_timeout,
                connect_timeout: self.connect_timeout,
                connect_retries: self
                    .connect_retries
                    .or(self.go.upstream_max_retries)
                    .unwrap_or(defaults::CONNECT_RETRIES),
                max_body_bytes,
                max_header_bytes: self.max_header_bytes,
                shutdown_grace: self.go.shutdown_timeout.unwrap_or(self.shutdown_grace),
                namespace,
                access_log: self.access_log,
                pool_idle_timeout: self.pool_idle_timeout,
                pod_sockets: None,
                activity_interval: self.activity_interval,
                credential_files,
                credential_reload_interval: parse_positive_duration(
                    defaults::CREDENTIAL_RELOAD_SECONDS,
                )
                .unwrap_or(Duration::from_secs(10)),
            },
            kubeconfig: self.go.kubeconfig,
            warnings,
        })
    }

    /// The auth mode, in this order: `--auth` / `--authz-mode`; else what the secrets given
    /// imply (key files: scoped, `--token-file` or `ROUTER_AUTH_TOKEN`: token); else a truthy
    /// `ALLOW_UNAUTHENTICATED_ROUTER`; else, for a command line that is unmistakably upstream's
    /// Go router's (one of its own flags and none of ours), that router's default (allow-all);
    /// else an error saying how to choose.
    fn resolve_auth(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
        dialect: &Dialect,
        warnings: &mut Vec<String>,
    ) -> Result<(Auth, VerificationKeys, Option<i64>)> {
        let env_token = env(router_env::ROUTER_AUTH_TOKEN)
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty());
        let allow = env(router_env::ALLOW_UNAUTHENTICATED_ROUTER);
        let allow_truthy = allow.as_deref().map(is_truthy);
        let mut v1_files = self.signing_key_file.clone();
        v1_files.extend(self.go.authz_scoped_token_secret_file.clone());
        let v2_file = self.go.authz_scoped_token_verification_keys_file.clone();
        let scoped_files = !v1_files.is_empty() || v2_file.is_some();

        let explicit = match (self.auth, self.go.authz_mode) {
            (Some(mode), _) => Some(mode),
            (None, Some(GoAuthzMode::AllowAll)) => Some(AuthMode::None),
            (None, Some(GoAuthzMode::ScopedToken)) => Some(AuthMode::Scoped),
            (None, Some(GoAuthzMode::Tokenreview)) => return Err(Error::TokenReviewUnsupported),
            (None, None) => None,
        };
        let mode = match explicit {
            Some(mode) => {
                if env_token.is_some() && mode != AuthMode::Token {
                    warnings.push(format!(
                        "{} is set but ignored: the auth mode chosen by flag ({}) wins",
                        router_env::ROUTER_AUTH_TOKEN,
                        auth_mode_name(mode)
                    ));
                }
                mode
            }
            None if scoped_files => AuthMode::Scoped,
            None if self.token_file.is_some() || env_token.is_some() => {
                if env_token.is_some() && allow_truthy == Some(true) {
                    warnings.push(format!(
                        "{} is ignored: {} is set, and a token wins",
                        router_env::ALLOW_UNAUTHENTICATED_ROUTER,
                        router_env::ROUTER_AUTH_TOKEN
                    ));
                }
                AuthMode::Token
            }
            None if allow_truthy == Some(true) => AuthMode::None,
            None if dialect.is_upstream_go() && allow.is_none() => {
                warnings.push(format!(
                    "no authentication mode given, and this is upstream's Go router's command \
                     line ({}, none of sandbox-router's own flags), so that router's default \
                     applies (--authz-mode=allow-all): anyone who can reach the router can run \
                     commands in every sandbox; pass --authz-mode=scoped-token or --auth to \
                     require tokens",
                    dialect.go_only.join(", ")
                ));
                AuthMode::None
            }
            None => {
                return Err(Error::NoAuthMode {
                    allow,
                    why_not_upstream_go: dialect.why_not_upstream_go(),
                });
            }
        };
        if mode != AuthMode::Scoped {
            for (present, flag) in [
                (
                    self.go.authz_scoped_token_secret_file.is_some(),
                    "--authz-scoped-token-secret-file",
                ),
                (
                    v2_file.is_some(),
                    "--authz-scoped-token-verification-keys-file",
                ),
                (
                    self.go.authz_scoped_token_v1_accept_until.is_some(),
                    "--authz-scoped-token-v1-accept-until",
                ),
            ] {
                if present {
                    return Err(Error::ScopedFlagWithoutScopedMode {
                        flag,
                        mode: auth_mode_name(mode),
                    });
                }
            }
        }
        match mode {
            AuthMode::None => Ok((Auth::None, VerificationKeys::default(), None)),
            AuthMode::Token => {
                let secret = match (&self.token_file, env_token) {
                    (Some(path), _) => read_static_token(path)?,
                    (None, Some(token)) => {
                        if token.len() < MIN_STATIC_TOKEN_BYTES {
                            warnings.push(format!(
                                "{} is {} bytes: tokens shorter than {MIN_STATIC_TOKEN_BYTES} \
                                 bytes can be guessed; generate one with `openssl rand -hex 32`",
                                router_env::ROUTER_AUTH_TOKEN,
                                token.len()
                            ));
                        }
                        Secret::new(token)
                    }
                    (None, None) => {
                        return Err(Error::MissingSecret {
                            mode: "token",
                            flag: "--token-file (or ROUTER_AUTH_TOKEN)",
                        });
                    }
                };
                Ok((Auth::Token(secret), VerificationKeys::default(), None))
            }
            AuthMode::Scoped => {
                if !scoped_files {
                    return Err(Error::MissingSecret {
                        mode: "scoped",
                        flag: "--signing-key-file (v1 tokens) or \
                               --authz-scoped-token-verification-keys-file (v2 tokens)",
                    });
                }
                let keys = v1_files
                    .iter()
                    .map(|path| read_signing_key(path))
                    .collect::<Result<Vec<_>>>()?;
                let v2 = match &v2_file {
                    Some(path) => read_verification_keys(path)?,
                    None => VerificationKeys::default(),
                };
                let accept_until = match &self.go.authz_scoped_token_v1_accept_until {
                    None => None,
                    Some(text) => {
                        let flag = "--authz-scoped-token-v1-accept-until";
                        if keys.is_empty() {
                            return Err(invalid(
                                flag,
                                text,
                                "needs v1 keys (--signing-key-file or \
                                 --authz-scoped-token-secret-file)"
                                    .to_owned(),
                            ));
                        }
                        let at = agent_sandbox_api::time::parse(text).ok_or_else(|| {
                            invalid(
                                flag,
                                text,
                                "expected an RFC 3339 instant such as 2027-01-01T00:00:00Z"
                                    .to_owned(),
                            )
                        })?;
                        Some(at.as_second())
                    }
                };
                if !keys.is_empty() && !v2.is_empty() && accept_until.is_none() {
                    return Err(Error::MissingV1AcceptUntil);
                }
                Ok((Auth::Scoped(keys), v2, accept_until))
            }
        }
    }
}

fn auth_mode_name(mode: AuthMode) -> &'static str {
    match mode {
        AuthMode::None => "none",
        AuthMode::Token => "token",
        AuthMode::Scoped => "scoped",
    }
}

fn invalid(flag: &'static str, value: &str, reason: String) -> Error {
    Error::InvalidFlag {
        flag,
        value: value.to_owned(),
        reason,
    }
}

fn default_max_timeout() -> Duration {
    parse_positive_duration(defaults::MAX_TIMEOUT_SECONDS).unwrap_or(Duration::from_secs(3600))
}

/// Whether `ALLOW_UNAUTHENTICATED_ROUTER`'s value means yes, as upstream's Python router reads
/// it.
pub fn is_truthy(value: &str) -> bool {
    let value = value.trim();
    router_env::TRUTHY
        .iter()
        .any(|truthy| truthy.eq_ignore_ascii_case(value))
}

/// `PROXY_TIMEOUT_SECONDS` as upstream reads it: a finite float above 0 (decimal or with an
/// exponent); `None` otherwise.
fn parse_float_seconds(text: &str) -> Option<Duration> {
    let value: f64 = text.trim().parse().ok()?;
    if !value.is_finite() || value <= 0.0 {
        return None;
    }
    let max = agent_sandbox_api::units::MAX_DURATION;
    Some(Duration::try_from_secs_f64(value).map_or(max, |d| d.min(max)))
}

fn optional_bind(flag: &'static str, text: Option<&str>) -> Result<Option<SocketAddr>> {
    match text {
        None => Ok(None),
        Some(text) => {
            go_flag::parse_bind_address(text).map_err(|reason| invalid(flag, text, reason))
        }
    }
}

fn read_secret(what: &'static str, path: &Path) -> Result<Secret> {
    let bytes = std::fs::read(path).map_err(|source| Error::ReadSecret {
        what,
        path: path.to_owned(),
        source,
    })?;
    Ok(Secret::new(bytes))
}

/// Reads a static bearer token (trimmed, at least [`MIN_STATIC_TOKEN_BYTES`]).
pub fn read_static_token(path: &Path) -> Result<Secret> {
    let secret = read_secret("static token", path)?;
    if secret.expose().len() < MIN_STATIC_TOKEN_BYTES {
        return Err(Error::TokenTooShort {
            path: path.to_owned(),
            len: secret.expose().len(),
            min: MIN_STATIC_TOKEN_BYTES,
        });
    }
    Ok(secret)
}

/// Reads a scoped-token v1 signing key (trimmed, at least [`token::MIN_KEY_BYTES`]).
pub fn read_signing_key(path: &Path) -> Result<Secret> {
    let secret = read_secret("signing key", path)?;
    token::signing_key(secret.expose()).map_err(|source| Error::SigningKey {
        path: path.to_owned(),
        source,
    })?;
    Ok(secret)
}

/// Reads a scoped-token v2 key file (`{"keys":[{"kid","publicKey"}]}`).
pub fn read_verification_keys(path: &Path) -> Result<VerificationKeys> {
    let bytes = std::fs::read(path).map_err(|source| Error::ReadSecret {
        what: "scoped-token v2 verification keys",
        path: path.to_owned(),
        source,
    })?;
    VerificationKeys::parse(&bytes).map_err(|source| Error::VerificationKeys {
        path: path.to_owned(),
        source,
    })
}

/// Parses a header size limit: a size between 1 KiB and 16 MiB.
fn parse_header_size(value: &str) -> std::result::Result<usize, String> {
    let bytes = parse_size_usize(value)?;
    if !(1 << 10..=16 << 20).contains(&bytes) {
        return Err(format!("`{value}` must be between 1KiB and 16MiB"));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use agent_sandbox_api::token::v2::PrivateKey;
    use clap::Parser;
    use pretty_assertions::assert_eq;
    use std::collections::HashMap;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    /// Parses `args` as the binary does, recording where each value came from.
    fn parse(args: &[&str]) -> std::result::Result<Args, clap::Error> {
        use clap::{CommandFactory as _, FromArgMatches as _};
        let matches = Cli::command()
            .try_get_matches_from(std::iter::once("sandbox-router").chain(args.iter().copied()))?;
        let mut args = Cli::from_arg_matches(&matches)?.args;
        args.record_sources(&Cli::command(), &matches);
        Ok(args)
    }

    /// Resolves `args` with exactly the environment `env` (no process environment).
    fn resolve(args: &[&str], env: &[(&str, &str)]) -> Result<Resolved> {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        parse(args).unwrap().resolve(&|name| env.get(name).cloned())
    }

    fn config(args: &[&str]) -> Config {
        resolve(args, &[]).unwrap().config
    }

    #[test]
    fn defaults_match_config_new() {
        let config = config(&["--auth", "none"]);
        let built = Config::new(config.listen);
        assert_eq!(config.listen.port(), ROUTER_PORT);
        assert_eq!(config.max_timeout, Duration::from_secs(3600));
        assert_eq!(config.max_timeout, built.max_timeout);
        assert_eq!(config.connect_timeout, built.connect_timeout);
        assert_eq!(config.connect_retries, built.connect_retries);
        assert_eq!(config.max_body_bytes, 16 << 30);
        assert_eq!(config.max_body_bytes, built.max_body_bytes);
        assert_eq!(config.max_header_bytes, 32 << 10);
        assert_eq!(config.max_header_bytes, built.max_header_bytes);
        assert_eq!(config.shutdown_grace, built.shutdown_grace);
        assert_eq!(config.pool_idle_timeout, built.pool_idle_timeout);
        assert_eq!((config.probe_listen, config.metrics_listen), (None, None));
        assert!(config.access_log);
        assert!(matches!(config.auth, Auth::None));
    }

    #[test]
    fn without_any_choice_the_router_refuses_to_start_and_says_how_to_choose() {
        let error = resolve(&[], &[]).unwrap_err();
        assert!(
            matches!(
                error,
                Error::NoAuthMode {
                    allow: None,
                    why_not_upstream_go: None
                }
            ),
            "{error}"
        );
        let text = error.to_string();
        for needle in [
            "--auth",
            "ROUTER_AUTH_TOKEN",
            "ALLOW_UNAUTHENTICATED_ROUTER=true",
        ] {
            assert!(text.contains(needle), "{text}");
        }
        // Upstream's Python manifest as shipped: ALLOW_UNAUTHENTICATED_ROUTER="false", no token.
        let error = resolve(&[], &[("ALLOW_UNAUTHENTICATED_ROUTER", "false")]).unwrap_err();
        assert!(error.to_string().contains("is \"false\""), "{error}");
    }

    #[test]
    fn upstream_environment_chooses_the_mode_and_flags_win() {
        // ALLOW_UNAUTHENTICATED_ROUTER, truthy as upstream's Python router reads it.
        for truthy in ["1", "true", "TRUE", "t", "Yes", "y", "on", " On "] {
            let resolved = resolve(&[], &[("ALLOW_UNAUTHENTICATED_ROUTER", truthy)]).unwrap();
            assert!(matches!(resolved.config.auth, Auth::None), "{truthy}");
        }
        for falsy in ["0", "false", "no", "off", "", "enabled"] {
            assert!(
                resolve(&[], &[("ALLOW_UNAUTHENTICATED_ROUTER", falsy)]).is_err(),
                "{falsy}"
            );
        }
        // ROUTER_AUTH_TOKEN: trimmed, wins over ALLOW_..., no minimum (but a warning).
        let resolved = resolve(
            &[],
            &[
                ("ROUTER_AUTH_TOKEN", " short-token\n"),
                ("ALLOW_UNAUTHENTICATED_ROUTER", "true"),
            ],
        )
        .unwrap();
        let Auth::Token(secret) = &resolved.config.auth else {
            panic!("{:?}", resolved.config.auth)
        };
        assert_eq!(secret.expose(), b"short-token");
        assert!(
            resolved
                .warnings
                .iter()
                .any(|w| w.contains("openssl rand -hex 32")),
            "{:?}",
            resolved.warnings
        );
        assert!(
            resolved
                .warnings
                .iter()
                .any(|w| w.contains("ALLOW_UNAUTHENTICATED_ROUTER is ignored")),
            "{:?}",
            resolved.warnings
        );
        // An empty token counts as unset.
        assert!(resolve(&[], &[("ROUTER_AUTH_TOKEN", "  ")]).is_err());
        // Flags win over the environment.
        let resolved = resolve(&["--auth", "none"], &[("ROUTER_AUTH_TOKEN", "x")]).unwrap();
        assert!(matches!(resolved.config.auth, Auth::None));
        assert!(
            resolved
                .warnings
                .iter()
                .any(|w| w.contains("ROUTER_AUTH_TOKEN is set but ignored")),
            "{:?}",
            resolved.warnings
        );
        let resolved = resolve(&["--authz-mode=allow-all"], &[("ROUTER_AUTH_TOKEN", "x")]).unwrap();
        assert!(matches!(resolved.config.auth, Auth::None));
        // `--auth token` takes its token from ROUTER_AUTH_TOKEN when no file is given.
        let resolved = resolve(&["--auth", "token"], &[("ROUTER_AUTH_TOKEN", "abc")]).unwrap();
        assert!(matches!(&resolved.config.auth, Auth::Token(s) if s.expose() == b"abc"));
        let error = resolve(&["--auth", "token"], &[]).unwrap_err();
        assert!(error.to_string().contains("ROUTER_AUTH_TOKEN"), "{error}");
    }

    #[test]
    fn proxy_timeout_seconds_falls_back_with_a_warning() {
        let timeout = |env: &[(&str, &str)], args: &[&str]| {
            let resolved = resolve(&[&["--auth", "none"], args].concat(), env).unwrap();
            (resolved.config.max_timeout, resolved.warnings)
        };
        assert_eq!(
            timeout(&[("PROXY_TIMEOUT_SECONDS", "180")], &[]).0,
            Duration::from_secs(180)
        );
        assert_eq!(
            timeout(&[("PROXY_TIMEOUT_SECONDS", " 2.5 ")], &[]).0,
            Duration::from_millis(2500)
        );
        assert_eq!(
            timeout(&[("PROXY_TIMEOUT_SECONDS", "1e2")], &[]).0,
            Duration::from_secs(100)
        );
        for bad in ["0", "-3", "soon", "inf", "nan", ""] {
            let (value, warnings) = timeout(&[("PROXY_TIMEOUT_SECONDS", bad)], &[]);
            assert_eq!(value, Duration::from_secs(3600), "{bad}");
            assert!(
                warnings.iter().any(|w| w.contains("PROXY_TIMEOUT_SECONDS")),
                "{bad}: {warnings:?}"
            );
        }
        // Flags win: ours and upstream's Go spelling.
        assert_eq!(
            timeout(
                &[("PROXY_TIMEOUT_SECONDS", "180")],
                &["--max-timeout-seconds", "30"]
            )
            .0,
            Duration::from_secs(30)
        );
        assert_eq!(
            timeout(
                &[("PROXY_TIMEOUT_SECONDS", "180")],
                &["--proxy-timeout=1m30s"]
            )
            .0,
            Duration::from_secs(90)
        );
    }

    #[test]
    fn settings_without_effect_are_reported_once_each() {
        let resolved = resolve(
            &[
                "--auth",
                "none",
                "--cluster-domain=example.org",
                "--enable-tracing",
                "--path-routing-prefix=/s",
            ],
            &[
                ("MAX_KEEPALIVE_CONNECTIONS", "20"),
                ("WEBSOCKET_IDLE_TIMEOUT_SECONDS", "3600"),
                ("TRUSTED_PROXY_CIDRS", "10.0.0.0/8"),
                ("CLUSTER_DOMAIN", "ignored.because.the.flag.wins"),
            ],
        )
        .unwrap();
        let warnings = resolved.warnings.join("\n");
        for needle in [
            "--enable-tracing=true has no effect",
            "--path-routing-prefix=/s has no effect",
            "MAX_KEEPALIVE_CONNECTIONS has no effect",
            "WEBSOCKET_IDLE_TIMEOUT_SECONDS has no effect",
            "TRUSTED_PROXY_CIDRS has no effect",
            "--cluster-domain=\"example.org\" has no effect",
        ] {
            assert_eq!(warnings.matches(needle).count(), 1, "{needle}: {warnings}");
        }
        assert!(!warnings.contains("ignored.because"), "{warnings}");
        let resolved = resolve(&["--auth", "none"], &[("CLUSTER_DOMAIN", "corp.local")]).unwrap();
        assert!(resolved.warnings[0].contains("CLUSTER_DOMAIN=\"corp.local\""));
        // Upstream's YAML file of flags would be dropped silently: refused.
        assert!(matches!(
            resolve(&["--auth", "none", "--config=/etc/router.yaml"], &[]),
            Err(Error::ConfigFile)
        ));
        assert!(matches!(
            resolve(&["--auth", "none"], &[("SANDBOX_ROUTER_CONFIG", "/x")]),
            Err(Error::ConfigFile)
        ));
    }

    /// `U/sandbox-router/deploy/deployment.yaml`'s argument list, verbatim.
    const UPSTREAM_GO_ARGS: [&str; 7] = [
        "--http-bind-address=:8080",
        "--metrics-bind-address=:9090",
        "--health-probe-bind-address=:8081",
        "--cluster-domain=cluster.local",
        "--proxy-timeout=180s",
        "--upstream-max-retries=3",
        "--cache-enabled=true",
    ];

    #[test]
    fn upstream_go_arguments_start_an_allow_all_router_with_three_listeners() {
        let resolved = resolve(&UPSTREAM_GO_ARGS, &[]).unwrap();
        let config = resolved.config;
        let any = |port| SocketAddr::from(([0, 0, 0, 0], port));
        assert_eq!(config.listen, any(8080));
        assert_eq!(config.metrics_listen, Some(any(9090)));
        assert_eq!(config.probe_listen, Some(any(8081)));
        assert_eq!(config.max_timeout, Duration::from_secs(180));
        assert_eq!(config.connect_retries, 3);
        assert!(matches!(config.auth, Auth::None));
        assert!(
            resolved
                .warnings
                .iter()
                .any(|w| w.contains("--authz-mode=allow-all")),
            "{:?}",
            resolved.warnings
        );
        // The Go router's default is not taken when the environment says no.
        assert!(
            resolve(
                &UPSTREAM_GO_ARGS,
                &[("ALLOW_UNAUTHENTICATED_ROUTER", "false")]
            )
            .is_err()
        );
        // ... and a token in the environment is used.
        let resolved = resolve(&UPSTREAM_GO_ARGS, &[("ROUTER_AUTH_TOKEN", "tok")]).unwrap();
        assert!(matches!(resolved.config.auth, Auth::Token(_)));
    }

    #[test]
    fn only_an_unmistakably_upstream_command_line_gets_upstreams_allow_all() {
        // Flags both dialects share, or that our docs recommend beside ours, say nothing about
        // whose command line this is: no mode chosen, so the router refuses to start.
        for args in [
            &["--kubeconfig=/etc/router/kubeconfig"][..],
            &["--metrics-bind-address=:9090"],
            &["--health-probe-bind-address=:8081"],
            &["--access-log=false"],
            &[
                "--kubeconfig",
                "/etc/router/kubeconfig",
                "--metrics-bind-address=:9090",
                "--health-probe-bind-address=:8081",
                "--access-log",
            ],
            // One of our own flags beside upstream's: not upstream's command line either.
            &["--listen=127.0.0.1:8080", "--cluster-domain=cluster.local"],
            &["--namespace=team-a", "--proxy-timeout=180s"],
            &["--max-header-bytes=64KiB", "--zap-devel"],
            &["--pool-idle-seconds=5", "--tls-min-version=1.3"],
        ] {
            let error = resolve(args, &[]).unwrap_err();
            assert!(
                matches!(error, Error::NoAuthMode { .. }),
                "{args:?}: {error}"
            );
        }
        // The refusal says why the Go router's default did not apply.
        let error = resolve(
            &["--listen=127.0.0.1:8080", "--cluster-domain=cluster.local"],
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("--listen") && error.contains("--cluster-domain"),
            "{error}"
        );
        // A Go-only flag and none of ours: upstream's command line, and its default.
        for args in [
            &["--cluster-domain=cluster.local"][..],
            &[
                "--proxy-timeout=180s",
                "--kubeconfig=/etc/router/kubeconfig",
                "--metrics-bind-address=:9090",
                "--access-log=true",
            ],
            &["--tls-min-version=1.3"],
        ] {
            let resolved = resolve(args, &[]).unwrap();
            assert!(matches!(resolved.config.auth, Auth::None), "{args:?}");
        }
        // Args parsed without recording where their values came from (an embedder that skips
        // `record_sources`) never get the Go router's default.
        let unrecorded = Cli::try_parse_from(["sandbox-router", "--cluster-domain=cluster.local"])
            .unwrap()
            .args
            .resolve(&|_| None)
            .unwrap_err();
        assert!(
            matches!(unrecorded, Error::NoAuthMode { .. }),
            "{unrecorded}"
        );
    }

    #[test]
    fn go_flags_map_to_ours() {
        let config = config(&[
            "--authz-mode=allow-all",
            "--http-bind-address=127.0.0.1:0",
            "--shutdown-timeout=45s",
            "--max-request-body-bytes=0",
            "--cache-namespace=team-a",
            "--access-log=false",
            "--health-probe-bind-address=",
            "--metrics-bind-address=0",
        ]);
        assert_eq!(config.listen, SocketAddr::from(([127, 0, 0, 1], 0)));
        assert_eq!(config.shutdown_grace, Duration::from_secs(45));
        assert_eq!(config.max_body_bytes, u64::MAX);
        assert_eq!(config.namespace.as_deref(), Some("team-a"));
        assert!(!config.access_log);
        assert_eq!((config.probe_listen, config.metrics_listen), (None, None));
        let config = resolve(
            &[
                "--authz-mode=allow-all",
                "--max-request-body-bytes=1024",
                "--access-log",
            ],
            &[],
        )
        .unwrap()
        .config;
        assert_eq!(config.max_body_bytes, 1024);
        assert!(config.access_log);
        // A bare boolean never takes the next argument.
        assert!(parse(&["--cache-enabled", "false"]).is_err());
        assert_eq!(
            parse(&["--cache-enabled"]).unwrap().go.cache_enabled,
            Some(true)
        );
        assert_eq!(
            parse(&["--cache-enabled=F"]).unwrap().go.cache_enabled,
            Some(false)
        );
        // Ours and upstream's spelling of one setting conflict rather than one silently winning.
        for pair in [
            ["--listen=127.0.0.1:1", "--http-bind-address=:2"],
            ["--max-timeout-seconds=1", "--proxy-timeout=2s"],
            ["--connect-retries=1", "--upstream-max-retries=2"],
            ["--namespace=a", "--cache-namespace=b"],
            ["--shutdown-grace-seconds=1", "--shutdown-timeout=2s"],
            ["--max-body-bytes=1MiB", "--max-request-body-bytes=2"],
            ["--auth=none", "--authz-mode=allow-all"],
        ] {
            assert!(parse(&pair).is_err(), "{pair:?}");
        }
        for (args, flag) in [
            (
                &["--authz-mode=allow-all", "--http-bind-address=nowhere"][..],
                "--http-bind-address",
            ),
            (
                &["--authz-mode=allow-all", "--http-bind-address="][..],
                "--http-bind-address",
            ),
            (
                &["--authz-mode=allow-all", "--metrics-bind-address=:99999"][..],
                "--metrics-bind-address",
            ),
            (
                &["--authz-mode=allow-all", "--max-request-body-bytes=-1"][..],
                "--max-request-body-bytes",
            ),
        ] {
            let error = resolve(args, &[]).unwrap_err();
            assert!(error.to_string().contains(flag), "{args:?}: {error}");
        }
        let error = resolve(&["--authz-mode=tokenreview"], &[]).unwrap_err();
        assert!(matches!(error, Error::TokenReviewUnsupported));
        assert!(
            error.to_string().contains("--authz-mode=scoped-token"),
            "{error}"
        );
    }

    #[test]
    fn scoped_modes_and_key_files() {
        let dir = tempfile::tempdir().unwrap();
        let v1 = dir.path().join("v1");
        std::fs::write(&v1, "0123456789abcdef0123456789abcdef\n").unwrap();
        let v2 = dir.path().join("keys.json");
        std::fs::write(&v2, PrivateKey::from_seed([1; 32]).key_file("k1").unwrap()).unwrap();
        let bad_v2 = dir.path().join("bad.json");
        std::fs::write(&bad_v2, r#"{"keys":[]}"#).unwrap();
        let (v1, v2, bad_v2) = (
            v1.to_str().unwrap(),
            v2.to_str().unwrap(),
            bad_v2.to_str().unwrap(),
        );
        let v1_flag = format!("--authz-scoped-token-secret-file={v1}");
        let v2_flag = format!("--authz-scoped-token-verification-keys-file={v2}");

        let config = config(&["--authz-mode=scoped-token", &v2_flag]);
        assert!(matches!(&config.auth, Auth::Scoped(keys) if keys.is_empty()));
        assert_eq!(config.scoped_v2_keys.key_ids().collect::<Vec<_>>(), ["k1"]);
        assert_eq!(
            config.credential_files,
            CredentialFiles {
                verification_keys: Some(v2.into()),
                ..CredentialFiles::default()
            },
            "read again while the router runs"
        );
        let config = self::config(&["--authz-mode=scoped-token", &v1_flag]);
        assert!(matches!(&config.auth, Auth::Scoped(keys) if keys.len() == 1));
        assert_eq!(config.credential_files.signing_keys, [PathBuf::from(v1)]);
        // Key files without a mode choose scoped (never the Go router's allow-all).
        let config = self::config(&[&v2_flag]);
        assert!(matches!(&config.auth, Auth::Scoped(_)));
        // v1 and v2 together need the end of v1, as upstream requires.
        let error = resolve(&["--authz-mode=scoped-token", &v1_flag, &v2_flag], &[]).unwrap_err();
        assert!(matches!(error, Error::MissingV1AcceptUntil), "{error}");
        let config = self::config(&[
            "--auth=scoped",
            &format!("--signing-key-file={v1}"),
            &v2_flag,
            "--authz-scoped-token-v1-accept-until=2027-01-01T00:00:00Z",
        ]);
        assert_eq!(config.scoped_v1_accept_until, Some(1_798_761_600));
        for (args, says) in [
            (
                vec!["--authz-mode=scoped-token".to_owned()],
                "--signing-key-file",
            ),
            (
                vec![
                    "--authz-mode=scoped-token".to_owned(),
                    v1_flag.clone(),
                    "--authz-scoped-token-v1-accept-until=tomorrow".to_owned(),
                ],
                "RFC 3339",
            ),
            (
                vec![
                    "--authz-mode=scoped-token".to_owned(),
                    v2_flag.clone(),
                    "--authz-scoped-token-v1-accept-until=2027-01-01T00:00:00Z".to_owned(),
                ],
                "needs v1 keys",
            ),
            (
                vec!["--auth=none".to_owned(), v2_flag.clone()],
                "needs --auth scoped",
            ),
            (
                vec![format!(
                    "--authz-scoped-token-verification-keys-file={bad_v2}"
                )],
                "bad.json",
            ),
        ] {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let error = resolve(&args, &[]).unwrap_err();
            assert!(error.to_string().contains(says), "{args:?}: {error}");
        }
    }

    #[test]
    fn secrets_are_read_trimmed_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "0123456789abcdef0123456789abcdef\n").unwrap();
        let short = dir.path().join("short");
        std::fs::write(&short, "tiny\n").unwrap();
        let key2 = dir.path().join("key2");
        std::fs::write(&key2, "fedcba9876543210fedcba9876543210").unwrap();

        let config = config(&["--auth", "token", "--token-file", token.to_str().unwrap()]);
        let Auth::Token(secret) = &config.auth else {
            panic!("{:?}", config.auth)
        };
        assert_eq!(secret.expose(), b"0123456789abcdef0123456789abcdef");
        assert_eq!(
            config.credential_files.token.as_deref(),
            Some(token.as_path())
        );
        // Never printed.
        assert!(!format!("{config:?}").contains("0123456789"));

        let keys = format!("{},{}", token.display(), key2.display());
        let config = self::config(&["--auth", "scoped", "--signing-key-file", &keys]);
        assert!(matches!(&config.auth, Auth::Scoped(keys) if keys.len() == 2));

        let error = resolve(
            &["--auth", "token", "--token-file", short.to_str().unwrap()],
            &[],
        )
        .unwrap_err();
        assert!(
            matches!(error, Error::TokenTooShort { len: 4, .. }),
            "{error}"
        );
        let error = resolve(
            &[
                "--auth",
                "scoped",
                "--signing-key-file",
                short.to_str().unwrap(),
            ],
            &[],
        )
        .unwrap_err();
        assert!(matches!(error, Error::SigningKey { .. }), "{error}");
        let missing = dir.path().join("missing");
        let error = resolve(
            &["--auth", "token", "--token-file", missing.to_str().unwrap()],
            &[],
        )
        .unwrap_err();
        assert!(error.to_string().contains("missing"), "{error}");
    }

    #[test]
    fn invalid_values_name_the_flag() {
        for (flag, value) in [
            ("--max-timeout-seconds", "0"),
            ("--max-timeout-seconds", "forever"),
            ("--connect-timeout-seconds", "0"),
            ("--max-body-bytes", "lots"),
            ("--max-header-bytes", "100"),
            ("--listen", "nowhere"),
            ("--auth", "maybe"),
            ("--access-log", "sometimes"),
            ("--proxy-timeout", "soon"),
            ("--authz-mode", "maybe"),
            ("--zap-encoder", "xml"),
        ] {
            let error = parse(&["--auth", "none", &format!("{flag}={value}")]).unwrap_err();
            assert!(error.to_string().contains(flag), "{flag}: {error}");
        }
        let error = resolve(&["--auth", "none", "--namespace", "Not_A_Label"], &[]).unwrap_err();
        assert!(matches!(error, Error::InvalidNamespace { .. }), "{error}");
    }

    #[test]
    fn zap_flags_choose_the_log_level_and_format() {
        let go = |args: &[&str]| parse(args).unwrap().go;
        assert_eq!(
            go(&["--zap-log-level=debug"]).log_filter(),
            Ok(Some("debug"))
        );
        assert_eq!(go(&["--zap-log-level=2"]).log_filter(), Ok(Some("trace")));
        assert_eq!(
            go(&["--zap-log-level=panic"]).log_filter(),
            Ok(Some("error"))
        );
        assert_eq!(go(&["--zap-devel"]).log_filter(), Ok(Some("debug")));
        assert_eq!(go(&[]).log_filter(), Ok(None));
        assert!(go(&["--zap-log-level=loud"]).log_filter().is_err());
        assert_eq!(go(&["--zap-encoder=json"]).log_json(), Some(true));
        assert_eq!(go(&["--zap-encoder=console"]).log_json(), Some(false));
        assert_eq!(go(&[]).log_json(), None);
    }
}
