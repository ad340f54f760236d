//! Command-line flags for reaching a cluster and its router (feature `clap`): [`ConnectArgs`],
//! to `#[command(flatten)]` into a binary's own flags, turned into a [`Kubeconfig`] and
//! [`ClientOptions`] once, in one place. `sandboxctl` and `sandbox-agent` both use it, so the
//! two take the same flags and environment variables.

use std::path::PathBuf;

use clap::Args;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::kubeconfig::Kubeconfig;
use crate::options::{ClientOptions, ConnectionMode};

/// Environment variable holding the router URL (`--router-url`).
pub const ENV_ROUTER_URL: &str = "SANDBOX_ROUTER_URL";
/// Environment variable holding a router bearer token (`--router-token`).
pub const ENV_ROUTER_TOKEN: &str = "SANDBOX_ROUTER_TOKEN";
/// Environment variable naming the router's signing key file (`--signing-key-file`).
pub const ENV_SIGNING_KEY_FILE: &str = "SANDBOX_ROUTER_SIGNING_KEY_FILE";

/// A path flag that may come from an environment variable: an empty value parses (as an empty
/// path, which [`ConnectArgs::without_empty`] turns into "unset").
fn path_or_empty(text: &str) -> Result<PathBuf, String> {
    Ok(PathBuf::from(text))
}

/// Where the cluster and the router are, and how to authenticate to the router.
#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Cluster and router (every command)")]
pub struct ConnectArgs {
    /// Kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(
        long,
        global = true,
        env = "KUBECONFIG",
        value_name = "PATH",
        hide_env_values = true,
        value_parser = path_or_empty
    )]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context (default: the current context).
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
    /// Namespace of claims and pools (default: the context's namespace, else `default`).
    #[arg(short = 'n', long, global = true, value_name = "NS")]
    pub namespace: Option<String>,
    /// Namespace holding the router Service `sandbox-router-svc` (reached by port-forward).
    #[arg(long, global = true, value_name = "NS", default_value = agent_sandbox_api::wire::SYSTEM_NAMESPACE)]
    pub router_namespace: String,
    /// Router URL to use directly instead of a port-forward (e.g. `http://127.0.0.1:8080`).
    #[arg(long, global = true, env = ENV_ROUTER_URL, value_name = "URL", hide_env_values = true)]
    pub router_url: Option<String>,
    /// Bearer token for the router (a static token, or a scoped token for one sandbox).
    #[arg(long, global = true, env = ENV_ROUTER_TOKEN, value_name = "TOKEN", hide_env_values = true)]
    pub router_token: Option<String>,
    /// Router signing key: mint a scoped token per sandbox automatically (`sandboxctl dev`
    /// prints it).
    #[arg(long, global = true, env = ENV_SIGNING_KEY_FILE, value_name = "PATH", hide_env_values = true, value_parser = path_or_empty)]
    pub signing_key_file: Option<PathBuf>,
}

impl ConnectArgs {
    /// The flags with empty values (`SANDBOX_ROUTER_URL=` in the environment, `--router-url ''`)
    /// as unset, as shells and CI systems mean them.
    #[must_use]
    pub fn without_empty(mut self) -> Self {
        self.kubeconfig = self.kubeconfig.filter(|p| !p.as_os_str().is_empty());
        self.context = self.context.filter(|c| !c.is_empty());
        self.namespace = self.namespace.filter(|n| !n.is_empty());
        self.router_url = self.router_url.filter(|u| !u.trim().is_empty());
        self.router_token = self.router_token.filter(|t| !t.is_empty());
        self.signing_key_file = self.signing_key_file.filter(|p| !p.as_os_str().is_empty());
        self
    }

    /// The kubeconfig and context the flags name.
    pub fn kubeconfig(&self) -> Kubeconfig {
        Kubeconfig {
            path: self.kubeconfig.clone(),
            context: self.context.clone(),
        }
    }

    /// The client options the flags ask for: `--namespace` (else `default_namespace`), a direct
    /// router URL or a port-forward to `--router-namespace`, the router token, and the signing
    /// key read from `--signing-key-file` (surrounding whitespace trimmed).
    pub fn client_options(&self, default_namespace: &str) -> Result<ClientOptions> {
        let connection = match &self.router_url {
            Some(url) => ConnectionMode::direct(url.clone()),
            None => ConnectionMode::port_forward_in(self.router_namespace.clone()),
        };
        let mut options = ClientOptions::default()
            .namespace(
                self.namespace
                    .clone()
                    .unwrap_or_else(|| default_namespace.to_owned()),
            )
            .connection(connection);
        if let Some(token) = &self.router_token {
            options = options.router_token(token.clone());
        }
        if let Some(path) = &self.signing_key_file {
            let key = std::fs::read(path).map_err(|source| Error::LocalIo {
                operation: "read the router signing key from",
                path: path.display().to_string(),
                source,
            })?;
            options = options.router_signing_key(key.trim_ascii().to_vec());
        }
        Ok(options)
    }

    /// A client as the flags say (empty values count as unset): the kubeconfig and context, the
    /// namespace (else the context's), and the router.
    pub async fn connect(&self) -> Result<Client> {
        let args = self.clone().without_empty();
        let config = args.kubeconfig().load().await?;
        let options = args.client_options(config.default_namespace())?;
        Client::from_config(config, options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        connect: ConnectArgs,
    }

    fn parse(args: &[&str]) -> ConnectArgs {
        let mut argv = vec!["test"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).unwrap().connect.without_empty()
    }

    #[test]
    fn flags_become_client_options_once() {
        // Every flag given (empty: unset), so the test's environment does not count.
        let options = parse(&[
            "--router-url",
            "http://127.0.0.1:9",
            "--router-token",
            "t",
            "--signing-key-file",
            "",
        ])
        .client_options("team-a")
        .unwrap();
        assert_eq!(options.namespace, "team-a");
        assert_eq!(
            options.connection,
            ConnectionMode::direct("http://127.0.0.1:9")
        );
        assert_eq!(options.router_token.as_deref(), Some("t"));
        assert_eq!(options.router_signing_key, None);

        let options = parse(&[
            "-n",
            "mine",
            "--router-namespace",
            "routers",
            "--router-url",
            " ",
        ])
        .client_options("team-a")
        .unwrap();
        assert_eq!(options.namespace, "mine");
        assert_eq!(
            options.connection,
            ConnectionMode::port_forward_in("routers")
        );
    }

    #[test]
    fn the_signing_key_file_is_read_and_trimmed() {
        let file = std::env::temp_dir().join(format!("sdk-args-key-{}", std::process::id()));
        std::fs::write(&file, format!("{}\n", "k".repeat(32))).unwrap();
        let path = file.display().to_string();
        let options = parse(&["--signing-key-file", &path])
            .client_options("default")
            .unwrap();
        assert_eq!(
            options.router_signing_key.map(|k| k.as_bytes().to_vec()),
            Some(vec![b'k'; 32])
        );
        std::fs::remove_file(&file).unwrap();
        let error = parse(&["--signing-key-file", &path])
            .client_options("default")
            .err();
        assert!(matches!(error, Some(Error::LocalIo { .. })), "{error:?}");
    }
}
