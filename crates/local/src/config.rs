//! [`LocalConfig`]: what a [`LocalCluster`](crate::LocalCluster) starts, and how.

use std::path::PathBuf;

use agent_sandbox_sim::Isolation;

use crate::runtime::RUNTIME_SUBCOMMAND;

/// How the routers of a local cluster authenticate requests.
///
/// The in-process router listens on 127.0.0.1 only, but pods of the simulated cluster share the
/// host's network, so code running *in* a sandbox can reach it; with `none` it could drive every
/// other sandbox through it. The default, [`RouterAuth::Token`], is a random 32-byte bearer
/// token per cluster, written with mode 0600 to the data directory (which bubblewrapped pods
/// cannot see when it is under `/tmp`: their `/tmp` is private). [`RouterAuth::Scoped`] is the
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

/// Whether a local cluster's pods get networks of their own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PodNetworks {
    /// Their own where this machine allows it (`ip`, `nft`, root or user namespaces, and
    /// bubblewrap isolation), else the host's (said at start-up).
    Auto,
    /// Their own, or refuse to start.
    Own,
    /// The host's network with loopback pod IPs (the library's default, and what tests that
    /// must not touch the machine's network use).
    #[default]
    Host,
}

impl std::str::FromStr for PodNetworks {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "auto" => Ok(Self::Auto),
            "own" => Ok(Self::Own),
            "host" => Ok(Self::Host),
            other => Err(format!("unknown pod network {other:?} (auto, own or host)")),
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
    /// Pod isolation (default: bubblewrap when it works).
    pub isolation: Isolation,
    /// Pod networks (default: the host's; the CLI's `--network` defaults to `auto`).
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
            isolation: Isolation::Auto,
            networks: PodNetworks::Host,
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
