//! The connection a command works with: a kube client and namespace from the kubeconfig flags,
//! and how the router is reached (a direct URL or a port-forward to the router's namespace).

use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::cli::GlobalArgs;
use crate::error::{Error, Result};

/// A cluster to talk to.
#[derive(Clone)]
pub struct Cluster {
    /// Client of its API server.
    pub client: Client,
    /// Namespace of claims and pools for this invocation.
    pub namespace: String,
    /// Router URL to use directly, if any (else a port-forward to `router_namespace`).
    pub router_url: Option<String>,
    /// Namespace of the router Service.
    pub router_namespace: String,
    /// A bearer token for every request to the router.
    pub router_token: Option<String>,
    /// A signing key to mint a scoped token per sandbox.
    pub signing_key: Option<Vec<u8>>,
    /// The API server's URL, for errors (`None` for clients built elsewhere).
    pub api_url: Option<String>,
}

impl Cluster {
    /// Where the router is reached, for the hints in router errors.
    pub fn router_hint(&self) -> crate::error::RouterHint {
        match &self.router_url {
            Some(_) => crate::error::RouterHint::Url,
            None => crate::error::RouterHint::PortForward(self.router_namespace.clone()),
        }
    }
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("namespace", &self.namespace)
            .field("router_url", &self.router_url)
            .field("router_namespace", &self.router_namespace)
            .field("api_url", &self.api_url)
            .field(
                "router_token",
                &self.router_token.as_ref().map(|_| "<redacted>"),
            )
            .field(
                "signing_key",
                &self.signing_key.as_ref().map(|_| "<redacted>"),
            )
            .finish_non_exhaustive()
    }
}

/// Loads a kubeconfig given as one path or a `:`-separated list (as `KUBECONFIG` allows).
fn read_kubeconfig(path: &Path) -> Result<Kubeconfig> {
    let err = |source| Error::Kubeconfig {
        path: path.to_path_buf(),
        source,
    };
    let text = path.to_string_lossy();
    let mut merged: Option<Kubeconfig> = None;
    for part in text.split(':').filter(|p| !p.is_empty()) {
        let next = Kubeconfig::read_from(part).map_err(err)?;
        merged = Some(match merged {
            Some(config) => config.merge(next).map_err(err)?,
            None => next,
        });
    }
    merged.ok_or_else(|| {
        err(kube::config::KubeconfigError::ReadConfig(
            std::io::Error::other("empty path"),
            PathBuf::from(&*text),
        ))
    })
}

impl Cluster {
    /// Connects as the flags say: `--kubeconfig`/`KUBECONFIG` and `--context`, else the usual
    /// inference (`~/.kube/config`, then in-cluster).
    pub async fn connect(global: &GlobalArgs) -> Result<Self> {
        let options = KubeConfigOptions {
            context: global.context.clone(),
            ..KubeConfigOptions::default()
        };
        let config = match (&global.kubeconfig, &global.context) {
            (Some(path), _) => {
                let kubeconfig = read_kubeconfig(path)?;
                Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(|source| Error::Kubeconfig {
                        path: path.clone(),
                        source,
                    })?
            }
            (None, Some(_)) => {
                Config::from_kubeconfig(&options)
                    .await
                    .map_err(|source| Error::Kubeconfig {
                        path: PathBuf::from("~/.kube/config"),
                        source,
                    })?
            }
            (None, None) => Config::infer()
                .await
                .map_err(|source| Error::NoCluster { source })?,
        };
        let namespace = global
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let api_url = config.cluster_url.to_string();
        let client = Client::try_from(config).map_err(|source| Error::Client {
            source: Box::new(source),
        })?;
        let mut cluster = Self::from_client(client, namespace, global)?;
        cluster.api_url = Some(api_url);
        Ok(cluster)
    }

    /// A cluster from an existing client (the local cluster's).
    pub fn from_client(client: Client, namespace: String, global: &GlobalArgs) -> Result<Self> {
        let signing_key = match &global.signing_key_file {
            Some(path) => Some(
                std::fs::read(path)
                    .map_err(|source| Error::File {
                        action: "read the router signing key",
                        path: path.clone(),
                        source,
                    })?
                    .trim_ascii()
                    .to_vec(),
            ),
            None => None,
        };
        Ok(Self {
            client,
            namespace,
            router_url: global.router_url.clone(),
            router_namespace: global.router_namespace.clone(),
            router_token: global.router_token.clone(),
            signing_key,
            api_url: None,
        })
    }
}
