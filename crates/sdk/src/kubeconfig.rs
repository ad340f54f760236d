//! Where the Kubernetes API server and the credentials for it come from: a kubeconfig (one file,
//! or a `:`-separated list merged as `KUBECONFIG` is) and a context, or kube's usual inference
//! (`KUBECONFIG`, `~/.kube/config`, then the in-cluster configuration). [`Kubeconfig::load`]
//! gives the [`ApiConfig`] a [`Client`](crate::Client) is made from.

use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, KubeconfigError};

use crate::error::{Error, Result};

/// Which kubeconfig and context to use; the default infers both.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Kubeconfig {
    /// A kubeconfig file, or several separated by `:`; `None`: `KUBECONFIG`, then
    /// `~/.kube/config`, then the in-cluster configuration.
    pub path: Option<PathBuf>,
    /// The context; `None`: the kubeconfig's current context.
    pub context: Option<String>,
}

impl Kubeconfig {
    /// Sets the kubeconfig file (or `:`-separated files).
    #[must_use]
    pub fn path(mut self, path: impl Into<PathBuf>) -> Self {
        self.path = Some(path.into());
        self
    }

    /// Sets the context.
    #[must_use]
    pub fn context(mut self, context: impl Into<String>) -> Self {
        self.context = Some(context.into());
        self
    }

    /// Loads the configuration: the given file(s) and context, or the usual inference.
    ///
    /// Errors: [`Error::KubeconfigFile`] for a file (or context) that cannot be used,
    /// [`Error::NoKubeconfig`] when nothing was given and nothing is found.
    pub async fn load(&self) -> Result<ApiConfig> {
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..KubeConfigOptions::default()
        };
        let file_error = |path: &Path| {
            let path = path.display().to_string();
            move |source| Error::KubeconfigFile { path, source }
        };
        let config = match (&self.path, &self.context) {
            (Some(path), _) => {
                let kubeconfig = read_kubeconfig(path).map_err(file_error(path))?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(file_error(path))?
            }
            (None, Some(_)) => kube::Config::from_kubeconfig(&options)
                .await
                .map_err(file_error(Path::new("~/.kube/config")))?,
            (None, None) => kube::Config::infer().await.map_err(Error::NoKubeconfig)?,
        };
        Ok(ApiConfig { config })
    }
}

/// Reads a kubeconfig given as one path or a `:`-separated list (as `KUBECONFIG` allows),
/// merging them in order.
fn read_kubeconfig(path: &Path) -> Result<kube::config::Kubeconfig, KubeconfigError> {
    let text = path.to_string_lossy();
    let mut merged: Option<kube::config::Kubeconfig> = None;
    for part in text.split(':').filter(|p| !p.is_empty()) {
        let next = kube::config::Kubeconfig::read_from(part)?;
        merged = Some(match merged {
            Some(config) => config.merge(next)?,
            None => next,
        });
    }
    merged.ok_or_else(|| {
        KubeconfigError::ReadConfig(std::io::Error::other("empty path"), PathBuf::from(&*text))
    })
}

/// A loaded configuration of the Kubernetes API: its server, credentials and the context's
/// namespace. From [`Kubeconfig::load`], or from a `kube::Config` built elsewhere.
#[derive(Clone, Debug)]
pub struct ApiConfig {
    config: kube::Config,
}

impl ApiConfig {
    /// The context's namespace (`default` when the context names none).
    pub fn default_namespace(&self) -> &str {
        &self.config.default_namespace
    }

    /// The API server's URL.
    pub fn url(&self) -> String {
        self.config.cluster_url.to_string()
    }

    /// The kube configuration.
    pub fn kube_config(&self) -> &kube::Config {
        &self.config
    }

    /// A Kubernetes client for it.
    pub(crate) fn kube_client(&self) -> Result<kube::Client> {
        kube::Client::try_from(self.config.clone()).map_err(Error::KubeClient)
    }
}

impl From<kube::Config> for ApiConfig {
    fn from(config: kube::Config) -> Self {
        Self { config }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBECONFIG: &str = "apiVersion: v1
kind: Config
clusters:
- name: a
  cluster: {server: 'http://127.0.0.1:1'}
- name: b
  cluster: {server: 'http://127.0.0.1:2'}
users:
- name: u
  user: {token: t}
contexts:
- name: one
  context: {cluster: a, user: u, namespace: team-a}
- name: two
  context: {cluster: b, user: u}
current-context: one
";

    #[tokio::test]
    async fn files_and_contexts_are_honoured_and_a_missing_file_names_itself() {
        let dir = std::env::temp_dir().join(format!("sdk-kubeconfig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("config");
        std::fs::write(&file, KUBECONFIG).unwrap();
        let current = Kubeconfig::default().path(&file).load().await.unwrap();
        assert_eq!(current.url(), "http://127.0.0.1:1/");
        assert_eq!(current.default_namespace(), "team-a");
        let two = Kubeconfig::default()
            .path(&file)
            .context("two")
            .load()
            .await
            .unwrap();
        assert_eq!(two.url(), "http://127.0.0.1:2/");
        assert_eq!(two.default_namespace(), "default");
        let missing = dir.join("missing");
        let listed = format!("{}:{}", file.display(), missing.display());
        let error = Kubeconfig::default().path(&listed).load().await.err();
        assert!(
            matches!(&error, Some(Error::KubeconfigFile { path, .. }) if *path == listed),
            "{error:?}"
        );
        let error = Kubeconfig::default()
            .path(&file)
            .context("nope")
            .load()
            .await
            .err();
        assert!(
            matches!(error, Some(Error::KubeconfigFile { .. })),
            "{error:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
