//! Commands that read and write cluster objects: `list`, `delete`, `extend`, `pools`, `logs`,
//! `token`. The rows they print are built by pure functions ([`claim_rows`], [`pool_rows`]) so
//! that table output is snapshot-tested without a cluster.

use std::collections::BTreeMap;
use std::time::Duration;

use agent_sandbox_api::{Sandbox, SandboxClaim, SandboxWarmPool, annotations};
use futures::{AsyncBufReadExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, LogParams};
use kube::{Api, ResourceExt};
use serde::Serialize;

use super::print;
use crate::cli::{DeleteArgs, ExtendArgs, ListArgs, LogsArgs, PoolsArgs, TokenArgs};
use crate::context::Cluster;
use crate::error::{Error, Result};
use crate::output::{self, Format};

/// One line of `sandboxctl list`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRow {
    /// Claim namespace.
    pub namespace: String,
    /// Claim name.
    pub name: String,
    /// Warm pool it claims from.
    pub pool: String,
    /// Its sandbox (empty until assigned).
    pub sandbox: String,
    /// The sandbox's pod (empty until assigned).
    pub pod: String,
    /// `Ready` condition: `True`, `False` or `Unknown`.
    pub ready: String,
    /// Why not ready (condition reason), empty when ready.
    pub reason: String,
    /// Creation time (RFC 3339).
    pub created: String,
    /// Expiry (RFC 3339), empty for none.
    pub expires: String,
}

/// Rows for `claims`, given their namespace's sandboxes (for pod names).
pub fn claim_rows(claims: &[SandboxClaim], sandboxes: &[Sandbox]) -> Vec<ClaimRow> {
    let pods: BTreeMap<(String, String), String> = sandboxes
        .iter()
        .map(|s| {
            let pod = s
                .annotations()
                .get(annotations::POD_NAME)
                .cloned()
                .unwrap_or_else(|| s.name_any());
            ((s.namespace().unwrap_or_default(), s.name_any()), pod)
        })
        .collect();
    claims
        .iter()
        .map(|claim| {
            let namespace = claim.namespace().unwrap_or_default();
            let status = claim.status.clone().unwrap_or_default();
            let sandbox = status.sandbox.name.clone();
            let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
            ClaimRow {
                pod: if sandbox.is_empty() {
                    String::new()
                } else {
                    pods.get(&(namespace.clone(), sandbox.clone()))
                        .cloned()
                        .unwrap_or_else(|| sandbox.clone())
                },
                namespace,
                name: claim.name_any(),
                pool: claim.spec.warm_pool_ref.name.clone(),
                sandbox,
                ready: ready.map_or("Unknown".to_owned(), |c| c.status.clone()),
                reason: ready
                    .filter(|c| c.status != "True")
                    .map(|c| c.reason.clone())
                    .unwrap_or_default(),
                created: claim
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.to_string())
                    .unwrap_or_default(),
                expires: claim
                    .spec
                    .lifecycle
                    .as_ref()
                    .and_then(|l| l.shutdown_time.as_ref())
                    .map(|t| t.0.to_string())
                    .unwrap_or_default(),
            }
        })
        .collect()
}

fn relative(now: jiff::Timestamp, at: &str, future: bool) -> String {
    let Ok(at) = at.parse::<jiff::Timestamp>() else {
        return "-".to_owned();
    };
    let seconds = if future {
        at.as_second() - now.as_second()
    } else {
        now.as_second() - at.as_second()
    };
    if future && seconds < 0 {
        return "expired".to_owned();
    }
    let text = output::age(seconds);
    if future { format!("in {text}") } else { text }
}

/// The `list` table at time `now`.
pub fn claims_table(rows: &[ClaimRow], now: jiff::Timestamp, with_namespace: bool) -> String {
    let mut header = vec!["NAME", "POOL", "SANDBOX", "POD", "READY", "AGE", "EXPIRES"];
    if with_namespace {
        header.insert(0, "NAMESPACE");
    }
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let dash = |s: &str| {
                if s.is_empty() {
                    "-".to_owned()
                } else {
                    s.to_owned()
                }
            };
            let ready = if r.reason.is_empty() {
                r.ready.clone()
            } else {
                format!("{} ({})", r.ready, r.reason)
            };
            let mut row = vec![
                r.name.clone(),
                r.pool.clone(),
                dash(&r.sandbox),
                dash(&r.pod),
                ready,
                relative(now, &r.created, false),
                if r.expires.is_empty() {
                    "-".to_owned()
                } else {
                    relative(now, &r.expires, true)
                },
            ];
            if with_namespace {
                row.insert(0, r.namespace.clone());
            }
            row
        })
        .collect();
    output::table(&header, &body)
}

fn render<T: Serialize>(
    format: Format,
    items: &T,
    table: impl FnOnce() -> String,
) -> Result<String> {
    match format {
        Format::Table => Ok(table()),
        Format::Json | Format::Yaml => {
            output::serialized(format, items).map_err(|message| Error::Render {
                format: if format == Format::Json {
                    "json"
                } else {
                    "yaml"
                },
                message,
            })
        }
    }
}

fn kube_err(
    action: &'static str,
    kind: &'static str,
    namespace: &str,
    name: &str,
) -> impl FnOnce(kube::Error) -> Error {
    let (namespace, name) = (namespace.to_owned(), name.to_owned());
    move |source| Error::Kube {
        action,
        kind,
        namespace,
        name,
        source: Box::new(source),
    }
}

/// `sandboxctl list`.
pub async fn list(cluster: &Cluster, args: ListArgs) -> Result<i32> {
    let (claims, sandboxes): (Api<SandboxClaim>, Api<Sandbox>) = if args.all_namespaces {
        (
            Api::all(cluster.client.clone()),
            Api::all(cluster.client.clone()),
        )
    } else {
        (
            Api::namespaced(cluster.client.clone(), &cluster.namespace),
            Api::namespaced(cluster.client.clone(), &cluster.namespace),
        )
    };
    let ns = if args.all_namespaces {
        "*"
    } else {
        &cluster.namespace
    };
    let mut claims = claims
        .list(&ListParams::default())
        .await
        .map_err(kube_err("list", "SandboxClaims", ns, ""))?
        .items;
    claims.sort_by_key(|c| (c.namespace(), c.name_any()));
    let sandboxes = sandboxes
        .list(&ListParams::default())
        .await
        .map_err(kube_err("list", "Sandboxes", ns, ""))?
        .items;
    let rows = claim_rows(&claims, &sandboxes);
    if rows.is_empty() && args.output == Format::Table {
        eprintln!("No claims in namespace {ns}.");
        return Ok(0);
    }
    let text = render(args.output, &rows, || {
        claims_table(&rows, jiff::Timestamp::now(), args.all_namespaces)
    })?;
    print(&text)?;
    Ok(0)
}

/// `sandboxctl delete` (through the SDK).
pub async fn delete(cluster: &Cluster, args: DeleteArgs) -> Result<i32> {
    let client = sdk_client(cluster);
    let names = if args.all {
        client
            .list()
            .await
            .map_err(sdk_err(format!("list the claims in {}", cluster.namespace)))?
            .into_iter()
            .map(|info| info.claim)
            .collect()
    } else {
        args.claims
    };
    let mut missing = false;
    for name in &names {
        if get_claim(cluster, name).await.is_err() {
            eprintln!(
                "{}",
                Error::ClaimNotFound {
                    namespace: cluster.namespace.clone(),
                    claim: name.clone(),
                }
            );
            missing = true;
            continue;
        }
        client.delete(name).await.map_err(sdk_err(format!(
            "delete SandboxClaim {}/{name}",
            cluster.namespace
        )))?;
        println!("sandboxclaim {name} deleted");
    }
    if args.all && names.is_empty() {
        eprintln!("No claims in namespace {}.", cluster.namespace);
    }
    Ok(i32::from(missing))
}

fn sdk_client(cluster: &Cluster) -> agent_sandbox::Client {
    let options = agent_sandbox::ClientOptions::default().namespace(cluster.namespace.clone());
    agent_sandbox::Client::from_kube(cluster.client.clone(), options)
}

fn sdk_err(action: String) -> impl FnOnce(agent_sandbox::Error) -> Error {
    move |source| Error::Sdk {
        action,
        source: Box::new(source),
    }
}

/// The claim, or [`Error::ClaimNotFound`].
pub async fn get_claim(cluster: &Cluster, name: &str) -> Result<SandboxClaim> {
    let api: Api<SandboxClaim> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    api.get_opt(name)
        .await
        .map_err(kube_err(
            "get",
            agent_sandbox_api::kinds::SANDBOX_CLAIM,
            &cluster.namespace,
            name,
        ))?
        .ok_or_else(|| Error::ClaimNotFound {
            namespace: cluster.namespace.clone(),
            claim: name.to_owned(),
        })
}

/// The claim's sandbox name, or [`Error::ClaimNotReady`].
pub async fn claimed_sandbox(cluster: &Cluster, claim: &str) -> Result<String> {
    let object = get_claim(cluster, claim).await?;
    let sandbox = object.status.map(|s| s.sandbox.name).unwrap_or_default();
    if sandbox.is_empty() {
        return Err(Error::ClaimNotReady {
            namespace: cluster.namespace.clone(),
            claim: claim.to_owned(),
        });
    }
    Ok(sandbox)
}

/// `sandboxctl extend` (through the SDK, which retries on conflicts with the controller).
pub async fn extend(cluster: &Cluster, args: ExtendArgs) -> Result<i32> {
    get_claim(cluster, &args.claim).await?;
    let at = sdk_client(cluster)
        .extend(&args.claim, args.duration)
        .await
        .map_err(sdk_err(format!(
            "extend SandboxClaim {}/{}",
            cluster.namespace, args.claim
        )))?;
    println!("sandboxclaim {} expires at {at}", args.claim);
    Ok(0)
}

/// One line of `sandboxctl pools`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolRow {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Template it stamps.
    pub template: String,
    /// Desired warm sandboxes.
    pub desired: i32,
    /// Warm sandboxes that exist.
    pub current: i32,
    /// Warm sandboxes that are Ready.
    pub ready: i32,
}

/// Rows for `pools`.
pub fn pool_rows(pools: &[SandboxWarmPool]) -> Vec<PoolRow> {
    pools
        .iter()
        .map(|p| {
            let status = p.status.clone().unwrap_or_default();
            PoolRow {
                namespace: p.namespace().unwrap_or_default(),
                name: p.name_any(),
                template: p.spec.sandbox_template_ref.name.clone(),
                desired: p.spec.replicas,
                current: status.replicas,
                ready: status.ready_replicas,
            }
        })
        .collect()
}

/// The `pools` table.
pub fn pools_table(rows: &[PoolRow], with_namespace: bool) -> String {
    let mut header = vec!["NAME", "TEMPLATE", "DESIRED", "CURRENT", "READY"];
    if with_namespace {
        header.insert(0, "NAMESPACE");
    }
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut row = vec![
                r.name.clone(),
                r.template.clone(),
                r.desired.to_string(),
                r.current.to_string(),
                r.ready.to_string(),
            ];
            if with_namespace {
                row.insert(0, r.namespace.clone());
            }
            row
        })
        .collect();
    output::table(&header, &body)
}

/// Names of the pools in `namespace` (for "pool not found" errors).
pub async fn pool_names(cluster: &Cluster) -> Result<Vec<String>> {
    let api: Api<SandboxWarmPool> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    Ok(api
        .list(&ListParams::default())
        .await
        .map_err(kube_err("list", "SandboxWarmPools", &cluster.namespace, ""))?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect())
}

/// Checks that `pool` exists, with an error listing the pools that do.
pub async fn ensure_pool(cluster: &Cluster, pool: &str) -> Result<()> {
    let api: Api<SandboxWarmPool> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let found = api.get_opt(pool).await.map_err(kube_err(
        "get",
        agent_sandbox_api::kinds::SANDBOX_WARM_POOL,
        &cluster.namespace,
        pool,
    ))?;
    if found.is_some() {
        return Ok(());
    }
    Err(Error::PoolNotFound {
        namespace: cluster.namespace.clone(),
        pool: pool.to_owned(),
        existing: pool_names(cluster).await?,
    })
}

/// `sandboxctl pools`.
pub async fn pools(cluster: &Cluster, args: PoolsArgs) -> Result<i32> {
    let api: Api<SandboxWarmPool> = if args.all_namespaces {
        Api::all(cluster.client.clone())
    } else {
        Api::namespaced(cluster.client.clone(), &cluster.namespace)
    };
    let ns = if args.all_namespaces {
        "*"
    } else {
        &cluster.namespace
    };
    let mut pools = api
        .list(&ListParams::default())
        .await
        .map_err(kube_err("list", "SandboxWarmPools", ns, ""))?
        .items;
    pools.sort_by_key(|p| (p.namespace(), p.name_any()));
    let rows = pool_rows(&pools);
    if rows.is_empty() && args.output == Format::Table {
        eprintln!("No warm pools in namespace {ns}.");
        return Ok(0);
    }
    let text = render(args.output, &rows, || {
        pools_table(&rows, args.all_namespaces)
    })?;
    print(&text)?;
    Ok(0)
}

/// The pod of a claim's sandbox.
async fn claim_pod(cluster: &Cluster, claim: &str) -> Result<String> {
    let sandbox = claimed_sandbox(cluster, claim).await?;
    let api: Api<Sandbox> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let object = api.get_opt(&sandbox).await.map_err(kube_err(
        "get",
        agent_sandbox_api::kinds::SANDBOX,
        &cluster.namespace,
        &sandbox,
    ))?;
    Ok(object
        .and_then(|s| s.annotations().get(annotations::POD_NAME).cloned())
        .unwrap_or(sandbox))
}

/// `sandboxctl logs`.
pub async fn logs(cluster: &Cluster, args: LogsArgs) -> Result<i32> {
    let pod = claim_pod(cluster, &args.claim).await?;
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let params = LogParams {
        follow: args.follow,
        tail_lines: args.tail,
        ..LogParams::default()
    };
    if !args.follow {
        let text = api.logs(&pod, &params).await.map_err(kube_err(
            "read the logs of",
            "Pod",
            &cluster.namespace,
            &pod,
        ))?;
        print(&text)?;
        return Ok(0);
    }
    let stream = api.log_stream(&pod, &params).await.map_err(kube_err(
        "follow the logs of",
        "Pod",
        &cluster.namespace,
        &pod,
    ))?;
    let mut lines = stream.lines();
    loop {
        tokio::select! {
            line = lines.try_next() => match line {
                Ok(Some(line)) => print(&format!("{line}\n"))?,
                Ok(None) => return Ok(0),
                Err(source) => return Err(super::io("read the log stream")(source)),
            },
            () = super::interrupted() => return Ok(130),
        }
    }
}

/// `sandboxctl token`.
pub async fn token(cluster: &Cluster, args: TokenArgs) -> Result<i32> {
    let Some(key) = &cluster.signing_key else {
        return Err(Error::Usage(
            "minting a scoped token needs the router's signing key\n  fix: pass --signing-key-file PATH (or set SANDBOX_ROUTER_SIGNING_KEY_FILE); on a cluster it is the key the router's --signing-key-file reads".to_owned(),
        ));
    };
    let sandbox = claimed_sandbox(cluster, &args.claim).await?;
    let token = crate::token::mint(key, &cluster.namespace, &sandbox, args.ttl)?;
    print(&format!("{token}\n"))?;
    Ok(0)
}

/// How long a token minted for one CLI invocation is valid.
pub const INVOCATION_TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);
