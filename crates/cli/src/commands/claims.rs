//! Commands about claims: `list`, `delete`, `extend`, `logs` (of a claim's sandbox pod) and
//! `token` (for a claim's sandbox), all through the SDK's [`Client`]. The rows `list` prints are
//! built by pure functions ([`claim_rows`], [`claims_table`]) so that its table output is
//! snapshot-tested without a cluster.

use agent_sandbox::{ClaimInfo, Client};
use futures::StreamExt as _;
use serde::Serialize;

use super::{print, render, sdk};
use crate::cli::{ClaimArg, DeleteArgs, ExtendArgs, ListArgs, LogsArgs, TokenArgs};
use crate::error::{Error, Result};
use crate::output;

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

/// Rows for `claims` (a claim's pod is its sandbox's name until the Sandbox names one).
pub fn claim_rows(claims: &[ClaimInfo]) -> Vec<ClaimRow> {
    claims
        .iter()
        .map(|claim| {
            let sandbox = claim.sandbox.clone().unwrap_or_default();
            ClaimRow {
                namespace: claim.namespace.clone(),
                name: claim.claim.clone(),
                pool: claim.warm_pool.clone(),
                pod: claim.pod.clone().unwrap_or_else(|| sandbox.clone()),
                sandbox,
                ready: claim
                    .ready_status
                    .clone()
                    .unwrap_or_else(|| "Unknown".to_owned()),
                reason: claim
                    .reason
                    .clone()
                    .filter(|_| !claim.ready)
                    .unwrap_or_default(),
                created: claim.created.map(|t| t.to_string()).unwrap_or_default(),
                expires: claim
                    .shutdown_time
                    .map(|t| t.to_string())
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

/// `sandboxctl list`.
pub async fn list(client: &Client, args: ListArgs) -> Result<i32> {
    let (listed, ns) = if args.all_namespaces {
        (client.list_all_namespaces().await, "*")
    } else {
        (client.list().await, client.namespace())
    };
    let mut claims = listed.map_err(sdk(format!("list the claims in namespace {ns}")))?;
    claims.sort_by(|a, b| (&a.namespace, &a.claim).cmp(&(&b.namespace, &b.claim)));
    let rows = claim_rows(&claims);
    if rows.is_empty() && args.output == output::Format::Table {
        eprintln!("No claims in namespace {ns}.");
        return Ok(0);
    }
    let text = render(args.output, &rows, || {
        claims_table(&rows, jiff::Timestamp::now(), args.all_namespaces)
    })?;
    print(&text)?;
    Ok(0)
}

/// The CLI's "not found" (with how to find claims) for the SDK's.
fn not_found(
    client: &Client,
    claim: &str,
    action: String,
) -> impl FnOnce(agent_sandbox::Error) -> Error {
    let namespace = client.namespace().to_owned();
    let claim = claim.to_owned();
    move |error| match error {
        agent_sandbox::Error::ClaimNotFound { .. } => Error::ClaimNotFound { namespace, claim },
        agent_sandbox::Error::ClaimNotReady { .. } => Error::ClaimNotReady { namespace, claim },
        other => sdk(action)(other),
    }
}

/// `sandboxctl delete`.
pub async fn delete(client: &Client, args: DeleteArgs) -> Result<i32> {
    let namespace = client.namespace().to_owned();
    let names = if args.all {
        client
            .list()
            .await
            .map_err(sdk(format!("list the claims in {namespace}")))?
            .into_iter()
            .map(|info| info.claim)
            .collect()
    } else {
        args.claims
    };
    let mut missing = false;
    for name in &names {
        if client.claim(name).await.is_err() {
            eprintln!(
                "{}",
                Error::ClaimNotFound {
                    namespace: namespace.clone(),
                    claim: name.clone(),
                }
            );
            missing = true;
            continue;
        }
        client
            .delete(name)
            .await
            .map_err(sdk(format!("delete SandboxClaim {namespace}/{name}")))?;
        println!("sandboxclaim {name} deleted");
    }
    if args.all && names.is_empty() {
        eprintln!("No claims in namespace {namespace}.");
    }
    Ok(i32::from(missing))
}

/// `sandboxctl extend` (the SDK retries on conflicts with the controller).
pub async fn extend(client: &Client, args: ExtendArgs) -> Result<i32> {
    let action = format!("extend SandboxClaim {}/{}", client.namespace(), args.claim);
    let at = client
        .extend(&args.claim, args.duration)
        .await
        .map_err(not_found(client, &args.claim, action))?;
    println!("sandboxclaim {} expires at {at}", args.claim);
    Ok(0)
}

/// `sandboxctl suspend` (`suspend`) and `sandboxctl resume`.
pub async fn suspend(client: &Client, args: ClaimArg, suspend: bool) -> Result<i32> {
    let verb = if suspend { "suspend" } else { "resume" };
    let action = format!(
        "{verb} the sandbox of claim {}/{}",
        client.namespace(),
        args.claim
    );
    let sandbox = if suspend {
        client.suspend(&args.claim).await
    } else {
        client.resume(&args.claim).await
    }
    .map_err(not_found(client, &args.claim, action))?;
    if suspend {
        println!(
            "sandbox {sandbox} of claim {} suspended (a request through the router wakes it)",
            args.claim
        );
    } else {
        println!("sandbox {sandbox} of claim {} resuming", args.claim);
    }
    Ok(0)
}

/// `sandboxctl logs`.
pub async fn logs(client: &Client, args: LogsArgs) -> Result<i32> {
    let action = format!("read the logs of claim {}", args.claim);
    if !args.follow {
        let text = client
            .logs(&args.claim, args.tail)
            .await
            .map_err(not_found(client, &args.claim, action))?;
        print(&text)?;
        return Ok(0);
    }
    let mut lines = client
        .follow_logs(&args.claim, args.tail)
        .await
        .map_err(not_found(client, &args.claim, action.clone()))?;
    loop {
        tokio::select! {
            line = lines.next() => match line {
                Some(Ok(line)) => print(&format!("{line}\n"))?,
                None => return Ok(0),
                Some(Err(error)) => return Err(sdk(action)(error)),
            },
            () = super::interrupted() => return Ok(130),
        }
    }
}

/// `sandboxctl token`.
pub async fn token(client: &Client, args: TokenArgs) -> Result<i32> {
    let Some(key) = &client.options().router_signing_key else {
        return Err(Error::Usage(
            "minting a scoped token needs the router's signing key\n  fix: pass --signing-key-file PATH (or set SANDBOX_ROUTER_SIGNING_KEY_FILE); on a cluster it is the key the router's --signing-key-file reads".to_owned(),
        ));
    };
    let action = format!("mint a token for the sandbox of claim {}", args.claim);
    let token = client
        .mint_claim_token(key.as_bytes(), &args.claim, args.ttl)
        .await
        .map_err(not_found(client, &args.claim, action))?;
    print(&format!("{token}\n"))?;
    Ok(0)
}
