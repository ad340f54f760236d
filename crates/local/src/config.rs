//! [`LocalConfig`]: what a [`LocalCluster`](crate::LocalCluster) starts, and how.

use std::path::PathBuf;

use agent_sandbox_sim::Isolation;

use crate::runtime::RUNTIME_SUBCOMMAND;

/// How the routers of a local cluster authenticate requests.
///
/// The in-process router listens on 127.0.0.1 only, and confined pods have networks of their
/// own, but pods that share the host's network ([`PodNetworks::Host`], or `--isolation none`)
/// can reach it; with `none` they could drive every other sandbox through it. The default,
/// [`RouterAuth::Token`], is a random 32-byte bearer token per cluster, written with mode 0600
/// to the data directory (which confined pods cannot see). [`RouterAuth::Scoped`] is the
/// production model (a token per sandbox, minted with the cluster's signing key); `none`
/// remains for experiments and for tests that play an unauthenticated client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RouterAuth {
    /// One random bearer token for every sandbox ([`LocalCluster::router_token`](crate::LocalCluster::router_token)).
    #[default]
    Token,
    /// A random signing key; clients need a token per sandbox ([`LocalCluster::token_for`](crate::LocalCluster::token_for)).
    Scoped,
    /// No authentication (anyone on this machine, pods included, reaches every sandbox).
    None,
}

impl std::str::FromStr for RouterAuth {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "token" => Ok(Self::Token),
            "scoped" => Ok(Self::Scoped),
            "none" => Ok(Self::None),
            other => Err(format!(
                "unknown router auth {other:?} (token, scoped or none)"
            )),
        }
    }
}

impl RouterAuth {
    /// The router's `--auth` value.
    pub fn flag(self) -> &'static str {
        match self {
            Self::Token => "token",
            Self::Scoped => "scoped",
            Self::None => "none",
        }
    }
}

/// Which networks a local cluster's pods get. Confined pods always have a network namespace of
/// their own unless [`PodNetworks::Host`] is asked for; plain processes (`--isolation none`)
/// share the host's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PodNetworks {
    /// [`PodNetworks::Own`] where this machine allows it (`ip`, `nft`, root or user
    /// namespaces), else [`PodNetworks::Isolated`] (said at start-up): never more access than
    /// the machine can confine.
    Auto,
    /// On a bridge of the node: pods reach each other, the API server and (with root or
    /// `slirp4netns`) the internet, as their NetworkPolicies allow; or refuse to start.
    Own,
    /// Loopback only (the library's default: it needs nothing but user namespaces and changes
    /// nothing of the machine's network): pods reach nothing, only the node reaches them.
    #[default]
    Isolated,
    /// The host's network, shared, with loopback pod IPs (for tests whose pods must reach
    /// this process, such as a router pod, without a bridge).
    Host,
}

impl std::str::FromStr for PodNetworks {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "auto" => Ok(Self::Auto),
            "own" => Ok(Self::Own),
            "isolated" => Ok(Self::Isolated),
            "host" => Ok(Self::Host),
            other => Err(format!(
                "unknown pod network {other:?} (auto, own, isolated or host)"
            )),
        }
    }
}

impl PodNetworks {
    /// `Auto` decided for this machine: `Own` where pods can have networks of their own on a
    /// bridge, else `Isolated`; the others as they are.
    pub fn resolve(self) -> Self {
        match self {
            Self::Auto if agent_sandbox_sim::PodNetwork::bridge_available().is_ok() => Self::Own,
            Self::Auto => Self::Isolated,
            other => other,
        }
    }

    /// The networks a user of a command may ask for (`--network`): `auto`, `own` or
    /// `isolated`. Sharing this machine's network (`host`) is not one: pods get that only as
    /// plain processes, `--isolation none`.
    pub fn for_users(text: &str) -> Result<Self, String> {
        match text {
            "host" => Err(
                "host is not offered: confined pods always have a network of their own; only \
                 --isolation none (pods as plain processes, NOT isolated) shares this machine's \
                 network (choose auto, own or isolated)"
                    .to_owned(),
            ),
            other => other.parse(),
        }
    }
}

/// The program `*runtime*` images run in a local cluster's pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuntimeProgram {
    /// The current executable with its hidden [`RUNTIME_SUBCOMMAND`]: a binary that embeds a
    /// local cluster (`sandboxctl`, `sandbox-agent`) serves its own pods, with no other binary
    /// installed. It must dispatch that subcommand first thing (see [`crate::runtime`]).
    CurrentExe,
    /// Another binary that serves [`RUNTIME_SUBCOMMAND`] (a test binary starting the cluster for
    /// `sandboxctl`).
    Subcommand(PathBuf),
    /// A `sandbox-runtime` binary.
    Binary(PathBuf),
}

impl RuntimeProgram {
    /// The sim's program and arguments for this choice.
    pub(crate) fn to_sim(&self) -> (agent_sandbox_sim::Program, Vec<String>) {
        use agent_sandbox_sim::Program;
        let subcommand = vec![RUNTIME_SUBCOMMAND.to_owned()];
        match self {
            Self::CurrentExe => (Program::CurrentExe, subcommand),
            Self::Subcommand(path) => (Program::Path(path.clone()), subcommand),
            Self::Binary(path) => (Program::Path(path.clone()), Vec::new()),
        }
    }
}

/// How to start a [`LocalCluster`](crate::LocalCluster): set the fields that differ from the
/// default (`LocalConfig { pool_replicas: 1, ..LocalConfig::default() }`). The default is what
/// `sandboxctl dev` starts: an in-process router with a bearer token, no router pod, the
/// controller, the default template and a pool of two, pods running this executable's runtime
/// subcommand.
#[derive(Clone, Debug)]
pub struct LocalConfig {
    /// Where pods' directories, logs, the kubeconfig and the router's secret live (default: a
    /// temporary directory removed when the cluster stops).
    pub data_dir: Option<PathBuf>,
    /// Where to write the kubeconfig (default: `credentials/kubeconfig` in the data directory).
    /// It holds
    /// the API server's administrator token: it is written with mode 0600, and directories
    /// created for it with mode 0700.
    pub kubeconfig: Option<PathBuf>,
    /// Pod isolation (default: confined, or refuse to start where pods cannot be confined).
    pub isolation: Isolation,
    /// Pod networks (default: isolated; the CLI's `--network` defaults to `auto`).
    pub networks: PodNetworks,
    /// Port of the API server on 127.0.0.1 (0: chosen by the OS).
    pub api_port: u16,
    /// Run a router in this process (default true).
    pub in_process_router: bool,
    /// Port of the in-process router on 127.0.0.1 (0: chosen by the OS).
    pub router_port: u16,
    /// Also run the router as the pod [`ROUTER_POD`](crate::ROUTER_POD) behind
    /// `sandbox-router-svc` in `agent-sandbox-system`, and another in `default` (where upstream's
    /// Go SDK looks: `deploy/sandboxes/namespace-router`), from this `sandbox-router` binary, as
    /// the kind overlay installs them (for port-forward mode and for the e2e suite). With
    /// [`RouterAuth::Scoped`] its signing key is also stored in the Secrets a real installation
    /// has.
    pub router_pod: Option<PathBuf>,
    /// Authentication of both routers.
    pub router_auth: RouterAuth,
    /// What `*runtime*` images run.
    pub runtime: RuntimeProgram,
    /// Apply the default template and pool (default true).
    pub defaults: bool,
    /// Sandboxes kept warm in the default pool (0: no pool is created).
    pub pool_replicas: i32,
    /// Write the Gateway [`GATEWAY`](crate::GATEWAY) in front of a router (the in-process one
    /// when there is one, else the router pod), with the address a Gateway implementation would
    /// program in its status (default false).
    pub gateway: bool,
    /// The controller's configuration; `None` starts no controller.
    pub controller: Option<agent_sandbox_controller::Config>,
}

impl Default for LocalConfig {
    fn default() -> Self {
        Self {
            data_dir: None,
            kubeconfig: None,
            isolation: Isolation::Confined,
            networks: PodNetworks::Isolated,
            api_port: 0,
            in_process_router: true,
            router_port: 0,
            router_pod: None,
            router_auth: RouterAuth::default(),
            runtime: RuntimeProgram::CurrentExe,
            defaults: true,
            pool_replicas: crate::defaults::DEFAULT_POOL_REPLICAS,
            gateway: false,
            controller: Some(agent_sandbox_controller::Config::default()),
        }
    }
}

impl LocalConfig {
    /// Only the API server and kubelet with the CRDs: no router, no controller, no default
    /// objects (for tests that write the cluster's state themselves).
    pub fn api_only() -> Self {
        Self {
            in_process_router: false,
            defaults: false,
            controller: None,
            ..Self::default()
        }
    }
}
