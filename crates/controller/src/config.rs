//! Flags (with environment fallbacks) and the configuration they produce.
//!
//! Every flag is listed in `docs/controller.md`; a test keeps the two in step.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use agent_sandbox_api::units::parse_duration;
use agent_sandbox_api::wire::controller_flags;
use agent_sandbox_api::{labels, wire};
use clap::Parser;

use crate::decide::claim::DEFAULT_ALLOWED_LABEL_DOMAINS;
use crate::decide::network_policy::PolicySettings;
use crate::decide::secure_defaults::DnsMode;

/// Command-line flags of `agent-sandbox-controller`.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "agent-sandbox-controller",
    about = "Reconciles Sandboxes, SandboxTemplates, SandboxWarmPools and SandboxClaims",
    after_help = "Examples:\n  agent-sandbox-controller                              # in-cluster, leader election on\n  agent-sandbox-controller --leader-elect=false --metrics-bind-address 127.0.0.1:9080\n  KUBECONFIG=~/.kube/sim agent-sandbox-controller --namespace default"
)]
pub struct Args {
    /// Watch only this namespace (all namespaces when unset).
    #[arg(long, env = "SANDBOX_CONTROLLER_NAMESPACE")]
    pub namespace: Option<String>,
    /// Address of the Prometheus metrics endpoint (`/metrics`); "0" disables it.
    #[arg(
        long,
        env = "SANDBOX_CONTROLLER_METRICS_ADDR",
        default_value = "0.0.0.0:8080"
    )]
    pub metrics_bind_address: String,
    /// Address of `/healthz` and `/readyz`; "0" disables it.
    #[arg(
        long,
        env = "SANDBOX_CONTROLLER_HEALTH_ADDR",
        default_value = "0.0.0.0:8081"
    )]
    pub health_probe_bind_address: String,
    /// Elect a leader among replicas through a Lease before reconciling.
    #[arg(long, env = "SANDBOX_CONTROLLER_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Namespace of the leader-election Lease (default: $POD_NAMESPACE, else agent-sandbox-system).
    #[arg(long, env = "SANDBOX_CONTROLLER_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// How long a leader's Lease lasts without renewal.
    #[arg(long, env = "SANDBOX_CONTROLLER_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// Cluster domain used in `status.serviceFQDN`.
    #[arg(long, env = "SANDBOX_CONTROLLER_CLUSTER_DOMAIN", default_value = wire::DEFAULT_CLUSTER_DOMAIN)]
    pub cluster_domain: String,
    /// Namespace of the router pods, admitted by the default template NetworkPolicy.
    #[arg(long, env = "SANDBOX_CONTROLLER_ROUTER_NAMESPACE", default_value = wire::SYSTEM_NAMESPACE)]
    pub router_namespace: String,
    /// Labels of the router pods (`key=value,...`), admitted by the default NetworkPolicy.
    #[arg(long, env = "SANDBOX_CONTROLLER_ROUTER_POD_LABELS", default_value = "app=sandbox-router", value_parser = parse_labels)]
    pub router_pod_labels: BTreeMap<String, String>,
    /// Let sandboxes under the default NetworkPolicy query cluster DNS (kube-dns); otherwise they
    /// resolve through --sandbox-nameservers.
    #[arg(long, env = "SANDBOX_CONTROLLER_ALLOW_CLUSTER_DNS", default_value_t = false, action = clap::ArgAction::Set)]
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
    #[arg(long, env = "SANDBOX_CONTROLLER_ENABLE_WARM_POOL_EVICTION", default_value_t = false, action = clap::ArgAction::Set)]
    pub enable_warm_pool_eviction: bool,
    /// Pool members not Ready after this long are replaced (unschedulable ones are held).
    #[arg(long, env = "SANDBOX_CONTROLLER_WARM_POOL_READINESS_GRACE_PERIOD", default_value = "5m", value_parser = parse_duration)]
    pub sandbox_warm_pool_readiness_grace_period: Duration,
    /// At most this many pool members are created per reconcile pass.
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
    #[arg(long, env = "SANDBOX_CONTROLLER_DISABLE_CLAIM_EVENTS", default_value_t = false, action = clap::ArgAction::Set)]
    pub disable_claim_events: bool,
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
    /// Log format: text or json.
    #[arg(long, env = "SANDBOX_CONTROLLER_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
}

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

fn parse_addr(flag: &str, text: &str) -> Result<Option<SocketAddr>, String> {
    if text == "0" || text.is_empty() {
        return Ok(None);
    }
    text.parse()
        .map(Some)
        .map_err(|_| format!("invalid --{flag} {text:?}: expected host:port (or 0 to disable)"))
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
    /// How long claims wait for starting members.
    pub claim_warm_wait: Duration,
    /// Allowed label domains for claims.
    pub allowed_label_domains: Vec<String>,
    /// Whether claim Events are off.
    pub disable_claim_events: bool,
    /// Concurrency per controller: sandbox, claim, pool.
    pub concurrency: (u16, u16, u16),
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
            claim_warm_wait: Duration::from_secs(2),
            allowed_label_domains: DEFAULT_ALLOWED_LABEL_DOMAINS
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            disable_claim_events: false,
            concurrency: (32, 16, 4),
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
            claim_warm_wait: self.claim_warm_wait,
            allowed_label_domains: self.allowed_label_domains,
            disable_claim_events: self.disable_claim_events,
            concurrency: (
                self.sandbox_concurrent_workers.max(1),
                self.sandbox_claim_concurrent_workers.max(1),
                self.sandbox_warm_pool_concurrent_workers.max(1),
            ),
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
