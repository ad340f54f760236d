//! How the agent reaches a cluster without `--local`: the kubeconfig (file, context, namespace)
//! and the router (a direct URL or a port-forward into its namespace, with a bearer token or
//! the signing key of a scoped router), from the flags and environment variables `sandboxctl`
//! uses too.

use std::path::PathBuf;

use agent_sandbox::{ClientOptions, ConnectionMode};
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::error::{Error, Result};

/// The connection flags.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Cluster and router")]
pub struct ConnectArgs {
    /// Kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context (default: the current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// Namespace of claims and pools (default: the context's namespace, else `default`).
    #[arg(short = 'n', long, value_name = "NS")]
    pub namespace: Option<String>,
    /// Namespace holding the router Service `sandbox-router-svc` (reached by port-forward).
    #[arg(long, value_name = "NS", default_value = agent_sandbox_api::wire::SYSTEM_NAMESPACE)]
    pub router_namespace: String,
    /// Router URL to use directly instead of a port-forward (e.g. `http://127.0.0.1:8080`).
    #[arg(
        long,
        env = "SANDBOX_ROUTER_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    pub router_url: Option<String>,
    /// Bearer token for the router (a static token, or a scoped token for one sandbox).
    #[arg(
        long,
        env = "SANDBOX_ROUTER_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub router_token: Option<String>,
    /// Router signing key: mint a scoped token for the session's sandbox automatically.
    #[arg(
        long,
        env = "SANDBOX_ROUTER_SIGNING_KEY_FILE",
        value_name = "PATH",
        hide_env_values = true
    )]
    pub signing_key_file: Option<PathBuf>,
}

fn connect_error<E: std::error::Error + Send + Sync + 'static>(
    action: impl Into<String>,
) -> impl FnOnce(E) -> Error {
    let action = action.into();
    move |source| Error::Connect {
        action,
        source: Box::new(source),
    }
}

/// `Some` unless empty: `SANDBOX_ROUTER_URL=` in the environment means unset, as shells and CI
/// systems mean it.
fn given(value: Option<&String>) -> Option<&str> {
    value.map(String::as_str).filter(|v| !v.trim().is_empty())
}

impl ConnectArgs {
    /// An SDK client as the flags say. `KUBECONFIG` (a list of files, merged) is read by kube's
    /// own inference when `--kubeconfig` is not given.
    pub async fn client(&self) -> Result<agent_sandbox::Client> {
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..KubeConfigOptions::default()
        };
        let config = match (&self.kubeconfig, &self.context) {
            (Some(path), _) => {
                let what = format!("load the kubeconfig {}", path.display());
                let kubeconfig = Kubeconfig::read_from(path).map_err(connect_error(&*what))?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(connect_error(what))?
            }
            (None, Some(_)) => kube::Config::from_kubeconfig(&options)
                .await
                .map_err(connect_error("load the kubeconfig"))?,
            (None, None) => kube::Config::infer().await.map_err(connect_error(
                "find a kubeconfig (pass --kubeconfig or use --local)",
            ))?,
        };
        let namespace = self
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| config.default_namespace.clone());
        let kube =
            kube::Client::try_from(config).map_err(connect_error("build a Kubernetes client"))?;
        let connection = match given(self.router_url.as_ref()) {
            Some(url) => ConnectionMode::direct(url),
            None => ConnectionMode::port_forward_in(self.router_namespace.clone()),
        };
        let mut options = ClientOptions::default()
            .namespace(namespace)
            .connection(connection);
        if let Some(token) = given(self.router_token.as_ref()) {
            options = options.router_token(token);
        }
        // Scoped routers: a token per request for the session's own sandbox.
        if let Some(path) = self
            .signing_key_file
            .as_ref()
            .filter(|p| !p.as_os_str().is_empty())
        {
            let key = std::fs::read(path).map_err(connect_error(format!(
                "read the router signing key {}",
                path.display()
            )))?;
            options = options.router_signing_key(key.trim_ascii().to_vec());
        }
        Ok(agent_sandbox::Client::from_kube(kube, options))
    }
}
