//! The crate's error type: every variant names the operation that failed and its object, and
//! carries its source; where the user can fix it, the message says how.

use std::path::PathBuf;

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The local cluster (`run --local`, `dev`) failed.
    #[error("{source}")]
    Local {
        /// Cause.
        source: agent_sandbox_local::Error,
    },
    /// A local file (data directory, key, kubeconfig) could not be read or written.
    #[error("failed to {action} {}: {source}", path.display())]
    File {
        /// What was being done (`write the router signing key to`).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// An object could not be written or read through the Kubernetes API.
    #[error("failed to {action} {kind} {namespace}/{name}: {source}")]
    Kube {
        /// `apply`, `get`, `delete`, ...
        action: &'static str,
        /// `SandboxTemplate`, `SandboxClaim`, ...
        kind: &'static str,
        /// Namespace ("" for cluster-scoped).
        namespace: String,
        /// Name ("" for lists).
        name: String,
        /// Cause (boxed: kube's error is large, and errors travel through every call).
        source: Box<kube::Error>,
    },
    /// No cluster configuration was found.
    #[error(
        "no cluster to talk to: {source}\n  fix: pass --kubeconfig PATH (or set KUBECONFIG), or use a local cluster: `sandboxctl run --local -- CMD` or `sandboxctl dev`"
    )]
    NoCluster {
        /// Cause.
        source: kube::config::InferConfigError,
    },
    /// The kubeconfig could not be read or used.
    #[error("failed to load the kubeconfig {}: {source}\n  fix: check --kubeconfig / KUBECONFIG and --context", path.display())]
    Kubeconfig {
        /// The file(s).
        path: PathBuf,
        /// Cause.
        source: kube::config::KubeconfigError,
    },
    /// No client could be built from a kubeconfig.
    #[error("failed to build a Kubernetes client: {source}")]
    Client {
        /// Cause.
        source: Box<kube::Error>,
    },
    /// The named pool does not exist.
    #[error(
        "SandboxWarmPool {namespace}/{pool} not found; {}",
        existing_pools(existing)
    )]
    PoolNotFound {
        /// Namespace searched.
        namespace: String,
        /// Pool asked for.
        pool: String,
        /// Pools that exist there.
        existing: Vec<String>,
    },
    /// The named claim does not exist.
    #[error(
        "SandboxClaim {namespace}/{claim} not found\n  fix: `sandboxctl list -n {namespace}` shows the claims there (or pass -n NAMESPACE)"
    )]
    ClaimNotFound {
        /// Namespace.
        namespace: String,
        /// Claim.
        claim: String,
    },
    /// The claim has no sandbox yet.
    #[error(
        "SandboxClaim {namespace}/{claim} has no sandbox yet (not Ready)\n  fix: wait and retry, or look at `kubectl describe sandboxclaim {claim} -n {namespace}`"
    )]
    ClaimNotReady {
        /// Namespace.
        namespace: String,
        /// Claim.
        claim: String,
    },
    /// An SDK operation failed.
    #[error("failed to {action}: {source}")]
    Sdk {
        /// What was being done (`claim a sandbox from pool python`).
        action: String,
        /// Cause.
        source: Box<agent_sandbox::Error>,
    },
    /// The arguments do not make sense together.
    #[error("{0}")]
    Usage(String),
    /// Local input or output failed.
    #[error("failed to {action}: {source}")]
    Io {
        /// What was being done.
        action: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The Kubernetes API server could not be reached.
    #[error(
        "cannot reach the Kubernetes API server at {url}: {cause}; is the cluster running? check --kubeconfig / KUBECONFIG and --context"
    )]
    ApiUnreachable {
        /// The API server URL.
        url: String,
        /// Why, in a few words.
        cause: String,
    },
    /// The TLS handshake with the Kubernetes API server failed.
    #[error(
        "TLS handshake with the Kubernetes API server at {url} failed ({cause}); check the server URL and its certificate authority in the kubeconfig (--kubeconfig / KUBECONFIG, --context)"
    )]
    ApiTls {
        /// The API server URL.
        url: String,
        /// The TLS error.
        cause: String,
    },
    /// The router could not be reached.
    #[error("cannot reach the router at {url}: {cause}; is the router running? {hint}")]
    RouterUnreachable {
        /// The router URL.
        url: String,
        /// Why, in a few words.
        cause: String,
        /// Which flag decides where the router is.
        hint: String,
    },
    /// The TLS handshake with an `https://` router failed.
    #[error(
        "TLS handshake with the router at {url} failed ({cause}); if it serves plain HTTP, use http://; {hint}"
    )]
    RouterTls {
        /// The router URL.
        url: String,
        /// The TLS error.
        cause: String,
        /// Which flag decides where the router is.
        hint: String,
    },
    /// Something that is not a router answered at the router URL.
    #[error(
        "the server at {url} is not an agent-sandbox router (it answered HTTP {status} with {content_type}); {hint}"
    )]
    NotARouter {
        /// The URL.
        url: String,
        /// Its status.
        status: u16,
        /// Its content type.
        content_type: String,
        /// Which flag decides where the router is.
        hint: String,
    },
    /// Output could not be rendered.
    #[error("failed to render the output as {format}: {message}")]
    Render {
        /// `json` or `yaml`.
        format: &'static str,
        /// Why.
        message: String,
    },
}

impl Error {
    /// The error of connecting to the cluster as the flags say: a kubeconfig that cannot be
    /// used, none at all, or no client from it, each with its fix.
    pub fn connect(source: agent_sandbox::Error) -> Self {
        match source {
            agent_sandbox::Error::KubeconfigFile { path, source } => Self::Kubeconfig {
                path: PathBuf::from(path),
                source,
            },
            agent_sandbox::Error::NoKubeconfig(source) => Self::NoCluster { source },
            agent_sandbox::Error::KubeClient(source) => Self::Client {
                source: Box::new(source),
            },
            // The signing key file of `--signing-key-file`.
            agent_sandbox::Error::LocalIo {
                operation,
                path,
                source,
            } => Self::File {
                action: operation,
                path: PathBuf::from(path),
                source,
            },
            other => Self::Sdk {
                action: "connect to the cluster".to_owned(),
                source: Box::new(other),
            },
        }
    }

    /// Turns a failure to reach the API server or the router, wherever it happened (a kube
    /// call, an SDK operation after its retries), into the one-line error that names the
    /// endpoint and the flag that decides it. Other errors are returned as they are.
    pub fn explained(self, api_url: Option<&str>, router: &RouterHint) -> Self {
        let explained = match &self {
            Self::Kube { source, .. } => api_failure(source, api_url),
            Self::Client { source } => api_failure(source, api_url),
            Self::Sdk { source, .. } => sdk_failure(source, api_url, router),
            _ => None,
        };
        explained.unwrap_or(self)
    }
}

/// Where the router is reached, for the hint in router errors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouterHint {
    /// `--router-url` / `SANDBOX_ROUTER_URL`.
    Url,
    /// A port-forward to the router Service in this namespace.
    PortForward(String),
}

impl RouterHint {
    /// The hint for a client that reaches the router through `connection`.
    pub fn of(connection: &agent_sandbox::ConnectionMode) -> Self {
        match connection {
            agent_sandbox::ConnectionMode::PortForward { router_namespace } => {
                Self::PortForward(router_namespace.clone())
            }
            _ => Self::Url,
        }
    }

    fn text(&self) -> String {
        match self {
            Self::Url => "check --router-url / SANDBOX_ROUTER_URL".to_owned(),
            Self::PortForward(namespace) => format!(
                "check --router-namespace (the router is reached by port-forward in namespace {namespace}) or pass --router-url"
            ),
        }
    }
}

fn api_failure(source: &kube::Error, api_url: Option<&str>) -> Option<Error> {
    let url = api_url.unwrap_or("(kubeconfig server)").to_owned();
    match agent_sandbox::connect_failure(source)? {
        agent_sandbox::ConnectFailure::Tls(cause) => Some(Error::ApiTls { url, cause }),
        agent_sandbox::ConnectFailure::Unreachable(cause) => {
            Some(Error::ApiUnreachable { url, cause })
        }
        _ => None,
    }
}

fn sdk_failure(
    source: &agent_sandbox::Error,
    api_url: Option<&str>,
    router: &RouterHint,
) -> Option<Error> {
    use agent_sandbox::Error as Sdk;
    let hint = router.text();
    match source.last_attempt() {
        Sdk::OrphanedClaim { source, .. } => sdk_failure(source, api_url, router),
        Sdk::Kube { source, .. } | Sdk::KubeConfig(source) => api_failure(source, api_url),
        Sdk::RouterUnreachable { url, cause, .. } => Some(Error::RouterUnreachable {
            url: url.clone(),
            cause: cause.clone(),
            hint,
        }),
        Sdk::RouterTls { url, cause, .. } => Some(Error::RouterTls {
            url: url.clone(),
            cause: cause.clone(),
            hint,
        }),
        Sdk::NotARouter {
            url,
            status,
            content_type,
            ..
        } => Some(Error::NotARouter {
            url: url.clone(),
            status: *status,
            content_type: content_type.clone(),
            hint,
        }),
        _ => None,
    }
}

fn existing_pools(existing: &[String]) -> String {
    if existing.is_empty() {
        format!(
            "there are no pools in that namespace\n  fix: create one (see docs/cli.md), pass -n NAMESPACE, or use `sandboxctl dev` for a local cluster with the pool `{}`",
            agent_sandbox_local::DEFAULT_POOL
        )
    } else {
        format!(
            "pools there: {}\n  fix: pass --pool with one of them (or -n for another namespace)",
            existing.join(", ")
        )
    }
}
