//! The log of a claim's sandbox pod (what its runtime wrote): read once, or followed line by
//! line until the pod ends.

use std::pin::Pin;

use futures_util::{AsyncBufReadExt as _, Stream, TryStreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::LogParams;

use crate::claims::claim_info_of;
use crate::error::{Error, Result};

/// The lines of a followed pod log, as [`Client::follow_logs`](crate::Client::follow_logs)
/// returns them; ends when the pod's log ends.
pub type LogLines = Pin<Box<dyn Stream<Item = Result<String>> + Send>>;

/// The pod behind `namespace/claim`: [`Error::ClaimNotFound`], or [`Error::ClaimNotReady`]
/// while it has no sandbox.
async fn claim_pod(kube: &kube::Client, namespace: &str, claim: &str) -> Result<String> {
    let info = claim_info_of(kube, namespace, claim).await?;
    let sandbox = info.assigned_sandbox()?.to_owned();
    Ok(info.pod.unwrap_or(sandbox))
}

/// What to ask the API server for.
fn params(follow: bool, tail_lines: Option<i64>) -> LogParams {
    LogParams {
        follow,
        tail_lines,
        ..LogParams::default()
    }
}

/// The log of the claim's pod, the last `tail_lines` lines only when given.
pub(crate) async fn read(
    kube: &kube::Client,
    namespace: &str,
    claim: &str,
    tail_lines: Option<i64>,
) -> Result<String> {
    let pod = claim_pod(kube, namespace, claim).await?;
    let pods: Api<Pod> = Api::namespaced(kube.clone(), namespace);
    pods.logs(&pod, &params(false, tail_lines))
        .await
        .map_err(|source| Error::Kube {
            operation: "read the log of Pod",
            object: format!("{namespace}/{pod}"),
            source,
        })
}

/// The log of the claim's pod as it grows, line by line.
pub(crate) async fn follow(
    kube: &kube::Client,
    namespace: &str,
    claim: &str,
    tail_lines: Option<i64>,
) -> Result<LogLines> {
    let pod = claim_pod(kube, namespace, claim).await?;
    let pods: Api<Pod> = Api::namespaced(kube.clone(), namespace);
    let stream = pods
        .log_stream(&pod, &params(true, tail_lines))
        .await
        .map_err(|source| Error::Kube {
            operation: "follow the log of Pod",
            object: format!("{namespace}/{pod}"),
            source,
        })?;
    let namespace = namespace.to_owned();
    let lines = stream.lines().map_err(move |source| Error::Logs {
        namespace: namespace.clone(),
        pod: pod.clone(),
        source,
    });
    Ok(Box::pin(lines))
}
