//! Flags (with environment fallbacks) and the configuration they produce.
//!
//! The flags are ours and upstream's (kubernetes-sigs/agent-sandbox 1.0's controller, its zap
//! logging flags, `--kubeconfig` and the webhook flags 0.5 manifests pass), read in Go's
//! spellings too (`-flag=value`, `--flag value`, a bare boolean, Go's boolean literals and
//! durations; see [`agent_sandbox_api::go_flag`]), so that upstream's manifests and Helm chart
//! start this binary unchanged. Those of upstream's that have no counterpart here are
//! [`NoEffect`]: parsed (a malformed value still fails) and named once at startup.
//!
//! Every flag is listed in `docs/controller.md`; a test keeps the two in step.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use agent_sandbox_api::go_flag::{self, parse_bool};
use agent_sandbox_api::units::parse_duration;
use agent_sandbox_api::wire::controller_flags;
use agent_sandbox_api::{labels, wire};
use clap::parser::ValueSource;
use clap::{ArgMatches, Args as ClapArgs, CommandFactory, FromArgMatches, Parser};

use crate::decide::claim::DEFAULT_ALLOWED_LABEL_DOMAINS;
use crate::decide::network_policy::PolicySettings;
use crate::decide::secure_defaults::DnsMode;
use crate::rate::ApiRateLimit;

/// Command-line flags of `agent-sandbox-controller`.
///
/// Booleans are Go's: `--flag` alone means true and never takes the next argument as its value
/// (write `--flag=false`), and `1 0 t f T F TRUE FALSE True False` are read as Go reads them. A
/// flag given twice takes the last value, as Go's do.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "agent-sandbox-controller",
    about = "Reconciles Sandboxes, SandboxTemplates, SandboxWarmPools and SandboxClaims",
    after_help = "Examples:\n  agent-sandbox-controller                              # in-cluster, leader election on\n  agent-sandbox-controller --leader-elect=false --metrics-bind-address 127.0.0.1:9080\n  KUBECONFIG=~/.kube/sim agent-sandbox-controller --namespace default\n  agent-sandbox-controller -leader-elect=true -extensions   # upstream's spelling",
    args_override_self = true
)]
pub struct Args {
    /// Print the version and exit.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = parse_bool, action = clap::ArgAction::Set)]
    pub version: bool,
    /// Kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then the pod's service
    /// account).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Watch only this namespace (all namespaces when unset).
    #[arg(long, env = "SANDBOX_CONTROLLER_NAMESPACE")]
    pub namespace: Option<String>,
    /// Address of the Prometheus metrics endpoint (`/metrics`): host:port, or :port for every
    /// interface; "0" disables it.
    #[arg(
        long,
        env = "SANDBOX_CONTROLLER_METRICS_ADDR",
        default_value = "0.0.0.0:8080"
    )]
    pub metrics_bind_address: String,
    /// Address of `/healthz` and `/readyz`: host:port, or :port for every interface; "0"
    /// disables it.
    #[arg(
        long,
        env = "SANDBOX_CONTROLLER_HEALTH_ADDR",
        default_value = "0.0.0.0:8081"
    )]
    pub health_probe_bind_address: String,
    /// Elect a leader among replicas through a Lease before reconciling.
    #[arg(long, env = "SANDBOX_CONTROLLER_LEADER_ELECT", default_value_t = true, num_args = 0..=1,
        require_equals = true, default_missing_value = "true", value_parser = parse_bool,
        action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Namespace of the leader-election Lease (default, or empty: $POD_NAMESPACE, else
    /// agent-sandbox-system).
    #[arg(long, env = "SANDBOX_CONTROLLER_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// How long a leader's Lease lasts without renewal.
    #[arg(long, env = "SANDBOX_CONTROLLER_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// Cluster domain used in `status.serviceFQDN`.
    #[arg(long, env = "SANDBOX_CONTROLLER_CLUSTER_DOMAIN", default_value = wire::DEFAULT_CLUSTER_DOMAIN)]
    pub cluster_domain: String,
    /// Run the SandboxClaim, SandboxWarmPool and SandboxTemplate controllers besides the Sandbox
    /// one (default: true here, unlike upstream; `--extensions=false` runs the Sandbox controller
    /// alone, as upstream does without the flag).
    #[arg(long = controller_flags::EXTENSIONS, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = parse_bool)]
    pub extensions: Option<bool>,
    /// Client-side limit of API requests per second; negative: no limit; 0: client-go's
    /// default, 5.
    #[arg(long = controller_flags::KUBE_API_QPS, env = controller_flags::KUBE_API_QPS_ENV,
        default_value_t = -1.0, allow_negative_numbers = true)]
    pub kube_api_qps: f64,
    /// Client-side burst of API requests (with a QPS limit); at least 1.
    #[arg(long = controller_flags::KUBE_API_BURST, env = controller_flags::KUBE_API_BURST_ENV,
        default_value_t = 10, allow_negative_numbers = true)]
    pub kube_api_burst: i64,
    /// Namespace of the router pods, admitted by the default template NetworkPolicy.
    #[arg(long, env = "SANDBOX_CONTROLLER_ROUTER_NAMESPACE", default_value = wire::SYSTEM_NAMESPACE)]
    pub router_namespace: String,
    /// Labels of the router pods (`key=value,...`), admitted by the default NetworkPolicy.
    #[arg(long, env = "SANDBOX_CONTROLLER_ROUTER_POD_LABELS", default_value = "app=sandbox-router", value_parser = parse_labels)]
    pub router_pod_labels: BTreeMap<String, String>,
    /// Let sandboxes under the default NetworkPolicy query cluster DNS (kube-dns); otherwise they
    /// resolve through --sandbox-nameservers.
    #[arg(long, env = "SANDBOX_CONTROLLER_ALLOW_CLUSTER_DNS", default_value_t = false,
        num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = clap::ArgAction::Set)]
    pub allow_cluster_dns: bool,
    /// Public resolvers for sandboxes under the default NetworkPolicy when cluster DNS is not allowed.
    #[arg(
        long,
        env = "SANDBOX_CONTROLLER_SANDBOX_NAMESERVERS",
        default_value = "8.8.8.8,1.1.1.1",
        value_delimiter = ','
    )]
    pub sandbox_nameservers: Vec<String>,
    /// Mark idle warm-pool members as evictable by the cluster autoscaler (costs two extra API
    /// writes per claim: the annotation comes off the pod template and the pod on adoption).
    #[arg(long, env = "SANDBOX_CONTROLLER_ENABLE_WARM_POOL_EVICTION", default_value_t = false,
        num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = clap::ArgAction::Set)]
    pub enable_warm_pool_eviction: bool,
    /// Pool members not Ready after this long are replaced (unschedulable ones are held).
    #[arg(long, env = "SANDBOX_CONTROLLER_WARM_POOL_READINESS_GRACE_PERIOD", default_value = "5m", value_parser = parse_duration)]
    pub sandbox_warm_pool_readiness_grace_period: Duration,
    /// How often a pool holding unschedulable members past the grace period is looked at again.
    #[arg(long, env = "SANDBOX_CONTROLLER_WARM_POOL_UNSCHEDULABLE_RECHECK_INTERVAL", default_value = "1m", value_parser = parse_duration)]
    pub sandbox_warm_pool_unschedulable_recheck_interval: Duration,
    /// How long a pool waits before replacing members that left it (adopted, deleted); every
    /// further departure restarts the wait. 0: replace at once.
    #[arg(long, env = "SANDBOX_CONTROLLER_WARM_POOL_REPLENISH_DELAY", default_value = "0", value_parser = parse_duration)]
    pub sandbox_warm_pool_replenish_delay: Duration,
    /// At most this many pool members are created per pass.
    #[arg(
        long,
        env = "SANDBOX_CONTROLLER_WARM_POOL_MAX_BATCH_SIZE",
        default_value_t = 300
    )]
    pub sandbox_warm_pool_max_batch_size: usize,
    /// At most this many members are kept in one pool, whatever its spec.replicas says (the pool
    /// then carries a Capped condition).
    #[arg(
        long = controller_flags::WARM_POOL_MAX_REPLICAS,
        env = controller_flags::WARM_POOL_MAX_REPLICAS_ENV,
        default_value_t = DEFAULT_WARM_POOL_MAX_REPLICAS
    )]
    pub sandbox_warm_pool_max_replicas: usize,
    /// At most this many pool members are created per second, over all pools (a token bucket
    /// holding as many).
    #[arg(
        long = controller_flags::WARM_POOL_MAX_CREATE_RATE,
        env = controller_flags::WARM_POOL_MAX_CREATE_RATE_ENV,
        default_value_t = DEFAULT_WARM_POOL_MAX_CREATE_RATE
    )]
    pub sandbox_warm_pool_max_create_rate: u32,
    /// At most this many members are created per second in one pool (fractions allowed); 0:
    /// unpaced.
    #[arg(long = controller_flags::WARM_POOL_MAX_REFILL_RATE,
        env = controller_flags::WARM_POOL_MAX_REFILL_RATE_ENV, default_value_t = 0.0,
        allow_negative_numbers = true)]
    pub sandbox_warm_pool_max_refill_rate: f64,
    /// How long a claim waits for a starting pool member to become Ready before adopting it anyway.
    #[arg(long, env = "SANDBOX_CONTROLLER_CLAIM_WARM_WAIT", default_value = "2s", value_parser = parse_duration)]
    pub claim_warm_wait: Duration,
    /// Label domains a claim's additionalPodMetadata may use (comma-separated; subdomains included).
    #[arg(
        long,
        env = "SANDBOX_CONTROLLER_ALLOWED_LABEL_DOMAINS",
        default_value = "sandbox.users.io",
        value_delimiter = ','
    )]
    pub allowed_label_domains: Vec<String>,
    /// Do not emit Events for claims (adoption, provisioning, expiry).
    #[arg(long, env = "SANDBOX_CONTROLLER_DISABLE_CLAIM_EVENTS", default_value_t = false,
        num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = clap::ArgAction::Set)]
    pub disable_claim_events: bool,
    /// Do not write upstream's observability annotations on claims.
    #[arg(long = controller_flags::DISABLE_CLAIM_OBSERVABILITY_ANNOTATIONS,
        env = controller_flags::DISABLE_CLAIM_OBSERVABILITY_ANNOTATIONS_ENV,
        default_value_t = false, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = parse_bool, action = clap::ArgAction::Set)]
    pub disable_claim_observability_annotations: bool,
    /// Concurrent Sandbox reconciles.
    #[arg(
        long,
        env = "SANDBOX_CONTROLLER_SANDBOX_CONCURRENCY",
        default_value_t = 32
    )]
    pub sandbox_concurrent_workers: u16,
    /// Concurrent SandboxClaim reconciles.
    #[arg(
        long,
        env = "SANDBOX_CONTROLLER_CLAIM_CONCURRENCY",
        default_value_t = 16
    )]
    pub sandbox_claim_concurrent_workers: u16,
    /// Concurrent SandboxWarmPool reconciles.
    #[arg(
        long,
        env = "SANDBOX_CONTROLLER_WARM_POOL_CONCURRENCY",
        default_value_t = 4
    )]
    pub sandbox_warm_pool_concurrent_workers: u16,
    /// Concurrent SandboxTemplate reconciles.
    #[arg(
        long,
        env = "SANDBOX_CONTROLLER_TEMPLATE_CONCURRENCY",
        default_value_t = 2
    )]
    pub sandbox_template_concurrent_workers: u16,
    /// Log format: text or json (default text; --zap-encoder is the same switch).
    #[arg(long, env = "SANDBOX_CONTROLLER_LOG_FORMAT", value_parser = ["text", "json"])]
    pub log_format: Option<String>,
    /// Log at debug level, as text (zap's development mode), unless other flags say otherwise.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = parse_bool, action = clap::ArgAction::Set)]
    pub zap_devel: bool,
    /// Log format, zap's names: json or console (text).
    #[arg(long, value_parser = ["json", "console"])]
    pub zap_encoder: Option<String>,
    /// Log level: debug, info, warn, error, panic (as error), or a verbosity of 1 (debug) or
    /// more (trace); wins over RUST_LOG.
    #[arg(long, value_parser = parse_zap_level)]
    pub zap_log_level: Option<LogLevel>,
    /// Upstream's flags that have no counterpart here.
    #[command(flatten)]
    pub no_effect: NoEffect,
}

/// Upstream's flags that have nothing to act on in this controller: accepted with upstream's
/// types (so a malformed value fails as it would there) and named once at startup when given.
#[derive(Clone, Debug, ClapArgs)]
#[command(next_help_heading = "Accepted for upstream's manifests; no effect here")]
pub struct NoEffect {
    /// OpenTelemetry tracing (not implemented).
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = parse_bool, action = clap::ArgAction::Set)]
    pub enable_tracing: bool,
    /// Go's CPU profile endpoint.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = parse_bool, action = clap::ArgAction::Set)]
    pub enable_pprof: bool,
    /// Go's other profile endpoints.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = parse_bool, action = clap::ArgAction::Set)]
    pub enable_pprof_debug: bool,
    /// Go's block profile rate.
    #[arg(long, default_value_t = 1_000_000, allow_negative_numbers = true)]
    pub pprof_block_profile_rate: i64,
    /// Go's mutex profile fraction.
    #[arg(long, default_value_t = 10, allow_negative_numbers = true)]
    pub pprof_mutex_profile_fraction: i64,
    /// HTTP/2 connections to the API server (this client pools HTTP/1.1 connections); at least 1.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    pub api_connections: i64,
    /// A separate connection for watches.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = parse_bool, action = clap::ArgAction::Set)]
    pub separate_watch_connection: bool,
    /// Label-scoped Pod and Service caches (this controller's are label-scoped always).
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = parse_bool, action = clap::ArgAction::Set)]
    pub cache_label_selectors: bool,
    /// Coalescing window of the Sandbox controller's metadata writes.
    #[arg(long, default_value = "0", value_parser = parse_duration)]
    pub sandbox_write_behind_window: Duration,
    /// HTTPS metrics (these are served over HTTP).
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = parse_bool, action = clap::ArgAction::Set)]
    pub metrics_secure_serving: bool,
    /// Certificate directory of HTTPS metrics.
    #[arg(long)]
    pub metrics_cert_dir: Option<String>,
    /// Minimum TLS version of HTTPS metrics.
    #[arg(long)]
    pub tls_min_version: Option<String>,
    /// TLS cipher suites of HTTPS metrics.
    #[arg(long)]
    pub tls_cipher_suites: Option<String>,
    /// zap's level for stack traces.
    #[arg(long, value_parser = ["info", "error", "panic"])]
    pub zap_stacktrace_level: Option<String>,
    /// zap's time format.
    #[arg(long, value_parser = ["epoch", "millis", "nano", "iso8601", "rfc3339", "rfc3339nano"])]
    pub zap_time_encoding: Option<String>,
    /// 0.5's conversion webhook port (1.0 has no webhook).
    #[arg(long, default_value_t = 9443, allow_negative_numbers = true)]
    pub webhook_port: i64,
    /// 0.5's webhook certificate directory.
    #[arg(long, default_value = "/tmp/k8s-webhook-server/serving-certs")]
    pub webhook_cert_dir: String,
    /// 0.5's webhook certificate file name.
    #[arg(long, default_value = "tls.crt")]
    pub webhook_cert_name: String,
    /// 0.5's webhook key file name.
    #[arg(long, default_value = "tls.key")]
    pub webhook_key_name: String,
    /// 0.5's webhook Service name.
    #[arg(long, default_value = "agent-sandbox-webhook-service")]
    pub webhook_service_name: String,
    /// 0.5's webhook namespace.
    #[arg(long, default_value = wire::SYSTEM_NAMESPACE)]
    pub webhook_namespace: String,
    /// 0.5's webhook certificate management.
    #[arg(long, default_value_t = true, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = parse_bool, action = clap::ArgAction::Set)]
    pub manage_webhook_certs: bool,
    /// 0.5's conversion webhook.
    #[arg(long, default_value_t = true, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = parse_bool, action = clap::ArgAction::Set)]
    pub enable_webhook: bool,
}

/// A log level, from `--zap-log-level`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLevel {
    /// Trace (a zap verbosity of 2 or more).
    Trace,
    /// Debug (zap's `debug`, or verbosity 1).
    Debug,
    /// Info.
    Info,
    /// Warn.
    Warn,
    /// Error (zap's `error` and `panic`).
    Error,
}

/// Reads zap's level names (`debug`, `info`, `error`, `panic`; `warn` too) or a verbosity
/// (an integer of at least 1).
pub fn parse_zap_level(text: &str) -> Result<LogLevel, String> {
    match text {
        "debug" => Ok(LogLevel::Debug),
        "info" => Ok(LogLevel::Info),
        "warn" => Ok(LogLevel::Warn),
        "error" | "panic" => Ok(LogLevel::Error),
        _ => match text.parse::<u64>() {
            Ok(1) => Ok(LogLevel::Debug),
            Ok(n) if n > 1 => Ok(LogLevel::Trace),
            _ => Err(format!(
                "invalid log level {text:?}: expected debug, info, warn, error, panic or an integer of at least 1"
            )),
        },
    }
}

/// How the binary logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logging {
    /// An `EnvFilter` directive; `None`: `RUST_LOG`, else `info`.
    pub filter: Option<String>,
    /// JSON lines rather than text.
    pub json: bool,
}

/// What the binary sets up around [`crate::run`]: logging, the API client, and the flags to
/// name as having no effect.
#[derive(Clone, Debug)]
pub struct Startup {
    /// The library's configuration.
    pub config: Config,
    /// Logging.
    pub logging: Logging,
    /// The kubeconfig to read instead of the usual search.
    pub kubeconfig: Option<PathBuf>,
    /// The client-side API rate limit; `None`: unlimited.
    pub api_rate_limit: Option<ApiRateLimit>,
    /// Upstream's flags that were given and have no effect here, as `--name` (sorted).
    pub no_effect: Vec<String>,
}

/// client-go's QPS when `QPS` is 0.
const CLIENT_GO_DEFAULT_QPS: f64 = 5.0;

impl Args {
    /// Parses `args` (the program's name first) in our spellings and Go's; the matches say which
    /// flags were given.
    pub fn try_parse_go_from<I, T>(args: I) -> Result<(Self, ArgMatches), clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString>,
    {
        let command = Self::command();
        let mut names: Vec<String> = command
            .get_arguments()
            .filter_map(|arg| arg.get_long().map(str::to_owned))
            .collect();
        names.push("help".to_owned());
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let args = go_flag::normalize_args(args, &names);
        let matches = command.try_get_matches_from(args)?;
        let parsed = Self::from_arg_matches(&matches)?;
        Ok((parsed, matches))
    }

    /// Checks the flags and builds everything the binary needs; errors name the flag.
    pub fn into_startup(self, matches: &ArgMatches) -> Result<Startup, String> {
        let given = |id: &str| {
            matches!(
                matches.value_source(id),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        };
        let mut no_effect: Vec<String> = NoEffect::augment_args(clap::Command::new("no-effect"))
            .get_arguments()
            .filter(|arg| given(arg.get_id().as_str()))
            .filter_map(|arg| arg.get_long().map(|long| format!("--{long}")))
            .collect();
        no_effect.sort();
        if self.no_effect.api_connections < 1 {
            return Err("invalid --api-connections: must be at least 1".to_owned());
        }
        let logging = self.logging()?;
        let api_rate_limit = self.api_rate_limit()?;
        Ok(Startup {
            logging,
            kubeconfig: self
                .kubeconfig
                .clone()
                .filter(|path| !path.as_os_str().is_empty()),
            api_rate_limit,
            no_effect,
            config: self.into_config()?,
        })
    }

    /// The logging the flags ask for: `--zap-log-level`, else `--zap-devel`'s debug, else
    /// `RUST_LOG`; `--zap-encoder` or `--log-format` (which must agree), else text.
    pub fn logging(&self) -> Result<Logging, String> {
        let encoder_json = self.zap_encoder.as_deref().map(|e| e == "json");
        let format_json = self.log_format.as_deref().map(|f| f == "json");
        if let (Some(a), Some(b)) = (encoder_json, format_json)
            && a != b
        {
            return Err(format!(
                "--zap-encoder={} and --log-format={} disagree: give one of them",
                self.zap_encoder.as_deref().unwrap_or_default(),
                self.log_format.as_deref().unwrap_or_default()
            ));
        }
        let level = self
            .zap_log_level
            .or(self.zap_devel.then_some(LogLevel::Debug));
        // Our crates at the level; the libraries' chatter (kube, hyper) stays at info for the
        // verbose levels, as upstream's level is its own logger's, not client-go's.
        let filter = level.map(|level| {
            match level {
                LogLevel::Trace => "info,agent_sandbox_controller=trace,agent_sandbox_api=trace",
                LogLevel::Debug => "info,agent_sandbox_controller=debug,agent_sandbox_api=debug",
                LogLevel::Info => "info",
                LogLevel::Warn => "warn",
                LogLevel::Error => "error",
            }
            .to_owned()
        });
        Ok(Logging {
            filter,
            json: encoder_json.or(format_json).unwrap_or(false),
        })
    }

    /// The client-side API rate limit `--kube-api-qps` and `--kube-api-burst` ask for, as
    /// client-go reads them: a negative QPS is no limit, 0 is its default of 5.
    pub fn api_rate_limit(&self) -> Result<Option<ApiRateLimit>, String> {
        let qps_flag = controller_flags::KUBE_API_QPS;
        let burst_flag = controller_flags::KUBE_API_BURST;
        if !self.kube_api_qps.is_finite() {
            return Err(format!(
                "invalid --{qps_flag} {}: must be a finite number (negative: no limit)",
                self.kube_api_qps
            ));
        }
        let burst = u32::try_from(self.kube_api_burst)
            .ok()
            .filter(|burst| *burst >= 1)
            .ok_or_else(|| {
                format!(
                    "invalid --{burst_flag} {}: must be at least 1",
                    self.kube_api_burst
                )
            })?;
        let qps = self.kube_api_qps;
        Ok(if qps < 0.0 {
            None
        } else if qps == 0.0 {
            Some(ApiRateLimit {
                qps: CLIENT_GO_DEFAULT_QPS,
                burst,
            })
        } else {
            Some(ApiRateLimit { qps, burst })
        })
    }
}

/// Default of `--sandbox-warm-pool-unschedulable-recheck-interval` (upstream's).
pub const DEFAULT_UNSCHEDULABLE_RECHECK: Duration = Duration::from_secs(60);
/// Default of `--sandbox-warm-pool-max-replicas`.
pub const DEFAULT_WARM_POOL_MAX_REPLICAS: usize = 1000;
/// Default of `--sandbox-warm-pool-max-create-rate`: a 1000-member pool fills in ten seconds,
/// at half the pace that was seen to crowd out other API writers.
pub const DEFAULT_WARM_POOL_MAX_CREATE_RATE: u32 = 100;

/// Parses `key=value,key2=value2`.
pub fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    text.split(',')
        .filter(|pair| !pair.trim().is_empty())
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .filter(|(k, _)| !k.is_empty())
                .ok_or_else(|| format!("invalid label {pair:?}: expected key=value"))
        })
        .collect()
}

/// Reads a listen address: `host:port` with an IP (or `localhost`), Go's `:port` for every
/// (IPv4) interface, or `0` (or nothing) for none.
fn parse_addr(flag: &str, text: &str) -> Result<Option<SocketAddr>, String> {
    agent_sandbox_api::go_flag::parse_bind_address(text)
        .map_err(|reason| format!("invalid --{flag} {text:?}: {reason} (or 0 to disable)"))
}

/// Concurrent reconciles per controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workers {
    /// Sandbox.
    pub sandbox: u16,
    /// SandboxClaim.
    pub claim: u16,
    /// SandboxWarmPool.
    pub warm_pool: u16,
    /// SandboxTemplate.
    pub template: u16,
}

impl Default for Workers {
    fn default() -> Self {
        Self {
            sandbox: 32,
            claim: 16,
            warm_pool: 4,
            template: 2,
        }
    }
}

/// Leader-election settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderElection {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// Identity written as holder.
    pub identity: String,
    /// How long a Lease lasts without renewal.
    pub lease_duration: Duration,
}

/// Everything the controller needs to run, independent of how it was configured.
#[derive(Clone, Debug)]
pub struct Config {
    /// Watch only this namespace.
    pub namespace: Option<String>,
    /// Metrics listener.
    pub metrics_addr: Option<SocketAddr>,
    /// Health listener.
    pub health_addr: Option<SocketAddr>,
    /// Leader election, when on.
    pub leader_election: Option<LeaderElection>,
    /// Cluster domain for service FQDNs.
    pub cluster_domain: String,
    /// The default NetworkPolicy's peers.
    pub policy: PolicySettings,
    /// DNS of sandboxes under the default policy.
    pub dns: DnsMode,
    /// Whether warm members are evictable.
    pub warm_pool_safe_to_evict: bool,
    /// Readiness grace of pool members.
    pub readiness_grace: Duration,
    /// Creation batch cap.
    pub max_batch: usize,
    /// Most members kept per pool.
    pub max_pool_replicas: usize,
    /// Most pool members created per second, over all pools.
    pub create_rate: u32,
    /// Most members created per second in one pool; 0: unpaced.
    pub refill_rate: f64,
    /// How long a pool waits before replacing members that left it; zero: no wait.
    pub replenish_delay: Duration,
    /// How often a pool holding unschedulable members is looked at again.
    pub unschedulable_recheck: Duration,
    /// How long claims wait for starting members.
    pub claim_warm_wait: Duration,
    /// Allowed label domains for claims.
    pub allowed_label_domains: Vec<String>,
    /// Whether claim Events are off.
    pub disable_claim_events: bool,
    /// Whether claims get upstream's observability annotations (`controller-first-observed-at`);
    /// off with `--disable-claim-observability-annotations`.
    pub claim_observability_annotations: bool,
    /// Concurrent reconciles per controller.
    pub workers: Workers,
    /// Whether the claim, pool and template controllers run (upstream's `--extensions`); the
    /// Sandbox controller always does.
    pub extensions: bool,
    /// Whether `--extensions` was given. When it was not and only the Sandbox CRD is installed
    /// (upstream's core-only `k8s/controller.yaml`), the Sandbox controller runs alone, as
    /// upstream's does without the flag, instead of refusing to start.
    pub extensions_given: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            namespace: None,
            metrics_addr: None,
            health_addr: None,
            leader_election: None,
            cluster_domain: wire::DEFAULT_CLUSTER_DOMAIN.to_owned(),
            policy: PolicySettings::default(),
            dns: DnsMode::Public(vec!["8.8.8.8".to_owned(), "1.1.1.1".to_owned()]),
            warm_pool_safe_to_evict: false,
            readiness_grace: Duration::from_secs(300),
            max_batch: 300,
            max_pool_replicas: DEFAULT_WARM_POOL_MAX_REPLICAS,
            create_rate: DEFAULT_WARM_POOL_MAX_CREATE_RATE,
            refill_rate: 0.0,
            replenish_delay: Duration::ZERO,
            unschedulable_recheck: DEFAULT_UNSCHEDULABLE_RECHECK,
            claim_warm_wait: Duration::from_secs(2),
            allowed_label_domains: DEFAULT_ALLOWED_LABEL_DOMAINS
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            disable_claim_events: false,
            claim_observability_annotations: true,
            workers: Workers::default(),
            extensions: true,
            extensions_given: false,
        }
    }
}

impl Args {
    /// Checks the flags and builds the [`Config`]; errors name the flag.
    pub fn into_config(self) -> Result<Config, String> {
        let leader_election = self.leader_elect.then(|| LeaderElection {
            namespace: self
                .leader_election_namespace
                .clone()
                // Upstream's Helm chart passes `--leader-election-namespace=` for "detect it".
                .filter(|ns| !ns.is_empty())
                .or_else(|| {
                    std::env::var("POD_NAMESPACE")
                        .ok()
                        .filter(|ns| !ns.is_empty())
                })
                .unwrap_or_else(|| wire::SYSTEM_NAMESPACE.to_owned()),
            name: wire::LEADER_ELECTION_ID.to_owned(),
            identity: identity(),
            lease_duration: self.lease_duration,
        });
        if self.lease_duration < Duration::from_secs(2) {
            return Err("invalid --lease-duration: must be at least 2s".to_owned());
        }
        if self.router_pod_labels.is_empty() {
            return Err("invalid --router-pod-labels: at least one key=value is needed".to_owned());
        }
        if self.sandbox_warm_pool_max_batch_size == 0 {
            return Err(
                "invalid --sandbox-warm-pool-max-batch-size: must be at least 1".to_owned(),
            );
        }
        for (flag, value) in [
            (
                "sandbox-warm-pool-readiness-grace-period",
                self.sandbox_warm_pool_readiness_grace_period,
            ),
            (
                "sandbox-warm-pool-unschedulable-recheck-interval",
                self.sandbox_warm_pool_unschedulable_recheck_interval,
            ),
        ] {
            if value.is_zero() {
                return Err(format!("invalid --{flag}: must be a positive duration"));
            }
        }
        let refill_rate = self.sandbox_warm_pool_max_refill_rate;
        if !refill_rate.is_finite() || refill_rate < 0.0 {
            return Err(format!(
                "invalid --{} {refill_rate}: must be a finite number of members per second, at least 0 (0: unpaced)",
                controller_flags::WARM_POOL_MAX_REFILL_RATE
            ));
        }
        let workers = Workers {
            sandbox: self.sandbox_concurrent_workers,
            claim: self.sandbox_claim_concurrent_workers,
            warm_pool: self.sandbox_warm_pool_concurrent_workers,
            template: self.sandbox_template_concurrent_workers,
        };
        for (flag, value) in [
            ("sandbox-concurrent-workers", workers.sandbox),
            ("sandbox-claim-concurrent-workers", workers.claim),
            ("sandbox-warm-pool-concurrent-workers", workers.warm_pool),
            ("sandbox-template-concurrent-workers", workers.template),
        ] {
            if value == 0 {
                return Err(format!("invalid --{flag}: must be at least 1"));
            }
        }
        if self.sandbox_warm_pool_max_create_rate == 0 {
            return Err(format!(
                "invalid --{}: must be at least 1 (members created per second)",
                controller_flags::WARM_POOL_MAX_CREATE_RATE
            ));
        }
        let nameservers: Vec<String> = self
            .sandbox_nameservers
            .iter()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect();
        if !self.allow_cluster_dns && nameservers.is_empty() {
            return Err("--sandbox-nameservers is empty and --allow-cluster-dns is false: sandboxes would have no DNS".to_owned());
        }
        Ok(Config {
            namespace: self.namespace,
            metrics_addr: parse_addr("metrics-bind-address", &self.metrics_bind_address)?,
            health_addr: parse_addr("health-probe-bind-address", &self.health_probe_bind_address)?,
            leader_election,
            cluster_domain: self.cluster_domain,
            policy: PolicySettings {
                router_namespace: self.router_namespace,
                router_pod_labels: self.router_pod_labels,
                allow_cluster_dns: self.allow_cluster_dns,
                ..PolicySettings::default()
            },
            dns: if self.allow_cluster_dns {
                DnsMode::Cluster
            } else {
                DnsMode::Public(nameservers)
            },
            warm_pool_safe_to_evict: self.enable_warm_pool_eviction,
            readiness_grace: self.sandbox_warm_pool_readiness_grace_period,
            max_batch: self.sandbox_warm_pool_max_batch_size,
            max_pool_replicas: self.sandbox_warm_pool_max_replicas,
            create_rate: self.sandbox_warm_pool_max_create_rate,
            refill_rate,
            replenish_delay: self.sandbox_warm_pool_replenish_delay,
            unschedulable_recheck: self.sandbox_warm_pool_unschedulable_recheck_interval,
            claim_warm_wait: self.claim_warm_wait,
            allowed_label_domains: self.allowed_label_domains,
            disable_claim_events: self.disable_claim_events,
            claim_observability_annotations: !self.disable_claim_observability_annotations,
            workers,
            extensions: self.extensions.unwrap_or(true),
            extensions_given: self.extensions.is_some(),
        })
    }
}

/// This replica's leader-election identity: `$POD_NAME` or the hostname, plus the process id.
fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .ok()
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "agent-sandbox-controller".to_owned());
    format!("{host}_{}", std::process::id())
}

/// The router pod labels our manifests use (the default of `--router-pod-labels`).
pub fn default_router_labels() -> BTreeMap<String, String> {
    BTreeMap::from([(
        labels::ROUTER_APP.to_owned(),
        labels::ROUTER_APP_VALUE.to_owned(),
    )])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("2 days").is_err());
        // The flags take the one syntax of every binary, Go's compound form included.
        let args = Args::parse_from([
            "agent-sandbox-controller",
            "--lease-duration",
            "1m30s",
            "--claim-warm-wait",
            "1.5",
        ]);
        assert_eq!(args.lease_duration, Duration::from_secs(90));
        assert_eq!(args.claim_warm_wait, Duration::from_millis(1500));
    }

    #[test]
    fn defaults_match_our_manifests() {
        let config = Args::parse_from(["agent-sandbox-controller"])
            .into_config()
            .unwrap();
        assert_eq!(config.policy.router_namespace, wire::SYSTEM_NAMESPACE);
        assert_eq!(config.policy.router_pod_labels, default_router_labels());
        assert_eq!(
            config.leader_election.as_ref().map(|l| l.name.as_str()),
            Some(wire::LEADER_ELECTION_ID)
        );
        assert_eq!(config.metrics_addr, Some("0.0.0.0:8080".parse().unwrap()));
        assert_eq!(config.health_addr, Some("0.0.0.0:8081".parse().unwrap()));
        assert_eq!(
            config.dns,
            DnsMode::Public(vec!["8.8.8.8".into(), "1.1.1.1".into()])
        );
    }

    #[test]
    fn every_flag_is_documented() {
        use clap::CommandFactory;
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/controller.md"
        ))
        .unwrap();
        for arg in Args::command().get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if long == "help" {
                continue;
            }
            assert!(
                doc.contains(&format!("`--{long}`")),
                "docs/controller.md does not document --{long}"
            );
            if let Some(env) = arg.get_env() {
                let env = env.to_string_lossy();
                assert!(
                    doc.contains(&format!("`{env}`")),
                    "docs/controller.md does not name {env}"
                );
            }
        }
    }

    /// Parses in Go's spellings and builds the startup settings.
    fn go(args: &[&str]) -> Result<Startup, String> {
        let (parsed, matches) = Args::try_parse_go_from(
            std::iter::once("agent-sandbox-controller").chain(args.iter().copied()),
        )
        .map_err(|error| error.to_string())?;
        parsed.into_startup(&matches)
    }

    #[test]
    fn go_spellings_of_values() {
        for args in [
            &["--sandbox-concurrent-workers=7"][..],
            &["--sandbox-concurrent-workers", "7"][..],
            &["-sandbox-concurrent-workers=7"][..],
            &["-sandbox-concurrent-workers", "7"][..],
            // The last occurrence wins, as in Go.
            &[
                "--sandbox-concurrent-workers=3",
                "-sandbox-concurrent-workers=7",
            ][..],
        ] {
            let startup = go(args).unwrap();
            assert_eq!(startup.config.workers.sandbox, 7, "{args:?}");
        }
    }

    #[test]
    fn go_booleans_are_bare_or_literal_and_never_take_the_next_argument() {
        for (args, want) in [
            (&["--leader-elect"][..], true),
            (&["-leader-elect"][..], true),
            (&["--leader-elect=false"][..], false),
            (&["-leader-elect=0"][..], false),
            (&["--leader-elect=F"][..], false),
            (&["--leader-elect=FALSE"][..], false),
            (&["--leader-elect=False"][..], false),
            (&["--leader-elect=t"][..], true),
            (&["--leader-elect=1"][..], true),
            (&["--leader-elect=TRUE"][..], true),
        ] {
            let startup = go(args).unwrap();
            assert_eq!(startup.config.leader_election.is_some(), want, "{args:?}");
        }
        // A bare boolean followed by another flag, as upstream's extensions manifest has them.
        let startup = go(&[
            "--leader-elect=false",
            "--extensions",
            "--enable-warm-pool-eviction",
        ])
        .unwrap();
        assert!(startup.config.warm_pool_safe_to_evict);
        assert!(startup.config.extensions);
        // The next argument is never its value: `false` is left over, and refused.
        let error = go(&["--leader-elect", "false"]).unwrap_err();
        assert!(error.contains("false"), "{error}");
        let error = go(&["--leader-elect=yes"]).unwrap_err();
        assert!(
            error.contains("--leader-elect") && error.contains("yes"),
            "{error}"
        );
    }

    #[test]
    fn go_durations_floats_and_addresses() {
        let startup = go(&[
            "--sandbox-warm-pool-readiness-grace-period=1m0s",
            "--sandbox-warm-pool-unschedulable-recheck-interval",
            "90s",
            "--sandbox-warm-pool-replenish-delay=1.5s",
            "--sandbox-warm-pool-max-refill-rate=0.5",
            "--kube-api-qps",
            "-1.0",
            "--metrics-bind-address=:9090",
            "-health-probe-bind-address",
            "localhost:9091",
        ])
        .unwrap();
        assert_eq!(startup.config.readiness_grace, Duration::from_secs(60));
        assert_eq!(
            startup.config.unschedulable_recheck,
            Duration::from_secs(90)
        );
        assert_eq!(startup.config.replenish_delay, Duration::from_millis(1500));
        assert!((startup.config.refill_rate - 0.5).abs() < f64::EPSILON);
        assert_eq!(startup.api_rate_limit, None);
        assert_eq!(
            startup.config.metrics_addr,
            Some("0.0.0.0:9090".parse().unwrap())
        );
        assert_eq!(
            startup.config.health_addr,
            Some("127.0.0.1:9091".parse().unwrap())
        );
    }

    #[test]
    fn api_rate_limit_reads_as_client_go_does() {
        let limit = |args: &[&str]| go(args).map(|startup| startup.api_rate_limit);
        assert_eq!(limit(&[]), Ok(None));
        assert_eq!(
            limit(&["--kube-api-qps=-1.0", "--kube-api-burst=10"]),
            Ok(None)
        );
        assert_eq!(
            limit(&["--kube-api-qps=50", "--kube-api-burst=100"]),
            Ok(Some(ApiRateLimit {
                qps: 50.0,
                burst: 100
            }))
        );
        assert_eq!(
            limit(&["--kube-api-qps=0"]),
            Ok(Some(ApiRateLimit {
                qps: 5.0,
                burst: 10
            }))
        );
        for bad in ["--kube-api-burst=0", "--kube-api-burst=-1"] {
            let error = limit(&["--kube-api-qps=20", bad]).unwrap_err();
            assert!(error.contains("--kube-api-burst"), "{error}");
        }
        let error = limit(&["--kube-api-qps=NaN"]).unwrap_err();
        assert!(error.contains("--kube-api-qps"), "{error}");
    }

    #[test]
    fn refill_rates_upstream_refuses_are_refused() {
        assert_eq!(go(&[]).unwrap().config.refill_rate, 0.0);
        for rate in ["-1", "-0.5", "NaN", "inf", "+Inf"] {
            let error = go(&[&format!("--sandbox-warm-pool-max-refill-rate={rate}")]).unwrap_err();
            assert!(
                error.contains("--sandbox-warm-pool-max-refill-rate"),
                "{rate}: {error}"
            );
        }
    }

    #[test]
    fn workers_are_each_controllers_and_at_least_one() {
        let startup = go(&[
            "--sandbox-concurrent-workers=100",
            "--sandbox-claim-concurrent-workers=50",
            "--sandbox-warm-pool-concurrent-workers=1",
            "--sandbox-template-concurrent-workers=3",
        ])
        .unwrap();
        assert_eq!(
            startup.config.workers,
            Workers {
                sandbox: 100,
                claim: 50,
                warm_pool: 1,
                template: 3
            }
        );
        assert_eq!(go(&[]).unwrap().config.workers, Workers::default());
        for flag in [
            "sandbox-concurrent-workers",
            "sandbox-claim-concurrent-workers",
            "sandbox-warm-pool-concurrent-workers",
            "sandbox-template-concurrent-workers",
        ] {
            let error = go(&[&format!("--{flag}=0")]).unwrap_err();
            assert!(error.contains(&format!("--{flag}")), "{error}");
        }
    }

    #[test]
    fn observability_annotations_and_extensions() {
        assert!(go(&[]).unwrap().config.claim_observability_annotations);
        for args in [
            &["--disable-claim-observability-annotations"][..],
            &["--disable-claim-observability-annotations=true"][..],
        ] {
            assert!(
                !go(args).unwrap().config.claim_observability_annotations,
                "{args:?}"
            );
        }
        // Upstream's meaning when given; ours (all four controllers) when not.
        for (args, want) in [
            (&["--extensions=false"][..], false),
            (&["-extensions=0"][..], false),
            (&["--extensions"][..], true),
            (&["--extensions=true"][..], true),
            (&[][..], true),
        ] {
            assert_eq!(go(args).unwrap().config.extensions, want, "{args:?}");
        }
    }

    #[test]
    fn upstream_flags_without_effect_are_named_only_when_given() {
        assert_eq!(go(&[]).unwrap().no_effect, Vec::<String>::new());
        let startup = go(&[
            "--enable-tracing=false",
            "-webhook-port",
            "9443",
            "--zap-time-encoding=iso8601",
            "--sandbox-write-behind-window=0",
            "--metrics-secure-serving",
            "--kube-api-qps=-1.0",
            "--extensions=false",
        ])
        .unwrap();
        assert_eq!(
            startup.no_effect,
            [
                "--enable-tracing",
                "--metrics-secure-serving",
                "--sandbox-write-behind-window",
                "--webhook-port",
                "--zap-time-encoding",
            ]
        );
        // Upstream's types still apply.
        let error = go(&["--webhook-port=https"]).unwrap_err();
        assert!(error.contains("--webhook-port"), "{error}");
        let error = go(&["--api-connections=0"]).unwrap_err();
        assert!(error.contains("--api-connections"), "{error}");
    }

    #[test]
    fn zap_flags_set_the_level_and_format() {
        let logging = |args: &[&str]| go(args).map(|startup| startup.logging);
        assert_eq!(
            logging(&[]),
            Ok(Logging {
                filter: None,
                json: false
            })
        );
        let debug = Some("info,agent_sandbox_controller=debug,agent_sandbox_api=debug".to_owned());
        assert_eq!(
            logging(&["--zap-devel"]),
            Ok(Logging {
                filter: debug.clone(),
                json: false
            })
        );
        assert_eq!(
            logging(&["--zap-log-level=1"]),
            Ok(Logging {
                filter: debug,
                json: false
            })
        );
        assert_eq!(
            logging(&["--zap-devel", "--zap-log-level=error", "--zap-encoder=json"]),
            Ok(Logging {
                filter: Some("error".to_owned()),
                json: true
            })
        );
        assert_eq!(
            logging(&["--zap-log-level", "5", "--log-format=json"]),
            Ok(Logging {
                filter: Some(
                    "info,agent_sandbox_controller=trace,agent_sandbox_api=trace".to_owned()
                ),
                json: true,
            })
        );
        assert_eq!(
            logging(&["--zap-log-level=panic"])
                .unwrap()
                .filter
                .as_deref(),
            Some("error")
        );
        for bad in [
            "--zap-log-level=0",
            "--zap-log-level=verbose",
            "--zap-encoder=xml",
        ] {
            assert!(logging(&[bad]).is_err(), "{bad}");
        }
        let error = logging(&["--zap-encoder=console", "--log-format=json"]).unwrap_err();
        assert!(
            error.contains("--zap-encoder") && error.contains("--log-format"),
            "{error}"
        );
    }

    #[test]
    fn upstream_helm_chart_defaults_give_our_behaviour_with_its_numbers() {
        let startup = go(&[
            "--leader-elect=true",
            "--cluster-domain=cluster.local",
            "--leader-election-namespace=",
            "--extensions=false",
            "--kube-api-qps=-1.0",
            "--kube-api-burst=10",
            "--sandbox-warm-pool-max-batch-size=300",
            "--sandbox-warm-pool-readiness-grace-period=5m",
            "--enable-warm-pool-eviction=true",
        ])
        .unwrap();
        let lease = startup.config.leader_election.unwrap();
        // The empty namespace is "detect it", not the namespace "".
        assert!(!lease.namespace.is_empty());
        assert!(startup.config.warm_pool_safe_to_evict);
        assert_eq!(startup.config.max_batch, 300);
    }

    #[test]
    fn bad_values_name_the_flag() {
        let error = Args::parse_from(["c", "--metrics-bind-address", "nope"])
            .into_config()
            .unwrap_err();
        assert!(error.contains("--metrics-bind-address"), "{error}");
        let error = Args::try_parse_from(["c", "--router-pod-labels", "app"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("key=value"), "{error}");
        let config = Args::parse_from(["c", "--leader-elect=false", "--metrics-bind-address", "0"])
            .into_config()
            .unwrap();
        assert!(config.leader_election.is_none() && config.metrics_addr.is_none());
    }
}
