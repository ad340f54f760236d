//! The router under upstream's Go router RBAC: its ServiceAccount may get, list and watch pods
//! and nothing else, so the router routes from pods alone. An unclaimed warm-pool member is
//! refused there (it is handed to someone's claim later) as by the installed router, which
//! reads Sandboxes, and a claimed one answers.
//!
//! The router is the `sandbox-router` binary started here with upstream's Go router Deployment
//! arguments (its listener on loopback) and a kubeconfig holding a token of that ServiceAccount:
//! the API server's RBAC decides what it sees, as in a cluster that runs upstream's manifests.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use agent_sandbox_api::{Sandbox, SandboxClaim, SandboxWarmPool, labels, name_hash};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt as _};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};

use super::Verdict;
use crate::cluster::{ClusterUnderTest, write_private};
use crate::ensure;
use crate::error::{Error, Result};
use crate::support::{
    Check, WAIT, binary, claim, create, pool, run_labels, sandbox_ready, wait_claim_ready,
    wait_for, wait_pool_ready,
};

/// Upstream's Go router Deployment arguments (`sandbox-router/deploy/deployment.yaml`), but for
/// the listeners: the proxy on a loopback port the OS picks, no probe or metrics listener.
const UPSTREAM_GO_ARGS: [&str; 5] = [
    "--http-bind-address=127.0.0.1:0",
    "--cluster-domain=cluster.local",
    "--proxy-timeout=180s",
    "--upstream-max-retries=3",
    "--cache-enabled=true",
];

/// What upstream's router ClusterRole grants (`sandbox-router/deploy/rbac.yaml`).
fn pods_only_role(name: &str, run: &str) -> Result<ClusterRole> {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": run_labels(run)},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    }))
    .map_err(|e| Error::Check(format!("the ClusterRole: {e}")))
}

/// The RBAC objects and the router process of the scenario; the process dies with it, the
/// objects are deleted by [`PodsOnlyRouter::delete`].
struct PodsOnlyRouter {
    addr: SocketAddr,
    log: tokio::sync::mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
    _process: tokio::process::Child,
}

impl PodsOnlyRouter {
    /// Lines the router has logged so far.
    fn log(&mut self) -> &[String] {
        while let Ok(line) = self.log.try_recv() {
            self.seen.push(line);
        }
        &self.seen
    }
}

/// A kubeconfig for the cluster of `source` (its current context's server and CA) with
/// `token` as the credential, written into `dir` as `<name>.kubeconfig`.
fn token_kubeconfig(source: &Path, token: &str, dir: &Path, name: &str) -> Result<PathBuf> {
    use base64::Engine as _;
    let config = kube::config::Kubeconfig::read_from(source)
        .map_err(|e| Error::Config(format!("cannot read kubeconfig {}: {e}", source.display())))?;
    let context = config
        .current_context
        .as_deref()
        .and_then(|name| config.contexts.iter().find(|c| c.name == name))
        .and_then(|c| c.context.as_ref())
        .ok_or_else(|| Error::Config(format!("{} has no current context", source.display())))?;
    let mut cluster = config
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| {
            Error::Config(format!(
                "{} has no cluster {}",
                source.display(),
                context.cluster
            ))
        })?;
    // A CA file path may be relative to the source kubeconfig: carry the certificate itself.
    if let Some(file) = cluster.certificate_authority.take() {
        let path = source.parent().unwrap_or(Path::new(".")).join(file);
        let pem = std::fs::read(&path).map_err(Error::io("read the cluster's CA", &path))?;
        cluster.certificate_authority_data =
            Some(base64::engine::general_purpose::STANDARD.encode(pem));
    }
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": cluster}],
        "users": [{"name": "pods-only", "user": {"token": token}}],
        "contexts": [{"name": "pods-only", "context": {"cluster": "cluster", "user": "pods-only"}}],
        "current-context": "pods-only",
    });
    write_private(
        dir,
        &format!("{name}.kubeconfig"),
        kubeconfig.to_string().as_bytes(),
    )
}

/// Starts `sandbox-router` with upstream's Go router arguments and `kubeconfig`, and waits
/// until it listens and its index has synced.
async fn start_router(cluster: &ClusterUnderTest, kubeconfig: &Path) -> Result<PodsOnlyRouter> {
    let program = binary("agent-sandbox-router", "sandbox-router")?;
    let mut command = cluster.command(&program);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("SANDBOX_ROUTER_") {
            command.env_remove(name);
        }
    }
    command
        .args(UPSTREAM_GO_ARGS)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut process = command.spawn().map_err(Error::io("start", &program))?;
    let stderr = process
        .stderr
        .take()
        .ok_or_else(|| Error::Check("the router's stderr is not piped".to_owned()))?;
    let (lines_tx, lines_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut router = PodsOnlyRouter {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        log: lines_rx,
        seen: Vec::new(),
        _process: process,
    };
    router.addr = wait_for("the router to listen", WAIT, || {
        let found = router
            .log()
            .iter()
            .find_map(|line| line.split("sandbox-router listening on ").nth(1))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<SocketAddr>().ok());
        let last = router.seen.last().cloned().unwrap_or_default();
        async move {
            Ok(match found {
                Some(addr) => Check::Done(addr),
                None => Check::NotYet(format!("last logged: {last}")),
            })
        }
    })
    .await?;
    let addr = router.addr;
    wait_for(
        "the router's index to sync (/readyz)",
        WAIT,
        || async move {
            let (status, body) = request(addr, "GET", "/readyz", &[], "").await?;
            Ok(if status == 200 {
                Check::Done(())
            } else {
                Check::NotYet(format!("{status} {body}"))
            })
        },
    )
    .await?;
    Ok(router)
}

/// One HTTP/1.1 request to `addr` (`Connection: close`): the status and the body.
async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<(u16, String)> {
    let failed = |what: &'static str| Error::io(what, format!("the router at {addr}"));
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(failed("connect to"))?;
    stream
        .write_all(format!("{head}{body}").as_bytes())
        .await
        .map_err(failed("send to"))?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(120), stream.read_to_end(&mut answer))
        .await
        .map_err(|_| Error::Check(format!("no answer from the router at {addr} in 120 s")))?
        .map_err(failed("read from"))?;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| Error::Check(format!("not an HTTP answer: {answer:?}")))?;
    let chunked = head
        .lines()
        .any(|line| line.eq_ignore_ascii_case("transfer-encoding: chunked"));
    Ok((
        status,
        if chunked {
            unchunk(body)
        } else {
            body.to_owned()
        },
    ))
}

/// The data of a chunked body.
fn unchunk(mut body: &str) -> String {
    let mut data = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        data.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    data
}

/// `POST /execute` of `echo reached` in `namespace/sandbox` through the router at `addr`,
/// with `extra` headers.
async fn execute(
    addr: SocketAddr,
    namespace: &str,
    sandbox: &str,
    extra: &[(&str, String)],
) -> Result<(u16, String)> {
    use agent_sandbox_api::wire::headers::{SANDBOX_ID, SANDBOX_NAMESPACE, SANDBOX_TIMEOUT};
    let mut headers = vec![
        (SANDBOX_ID, sandbox),
        (SANDBOX_NAMESPACE, namespace),
        (SANDBOX_TIMEOUT, "60"),
        ("Content-Type", "application/json"),
    ];
    headers.extend(extra.iter().map(|(name, value)| (*name, value.as_str())));
    request(
        addr,
        "POST",
        "/execute",
        &headers,
        r#"{"command": "echo reached"}"#,
    )
    .await
}

/// Extra request headers, by name.
type Headers = Vec<(&'static str, String)>;

/// The installed router (full checks: its RBAC reads Sandboxes) and the headers that
/// authenticate a request for `sandbox` to it, when it is reachable from here as `ip:port`.
fn installed_router(
    cluster: &ClusterUnderTest,
    sandbox: &str,
) -> Result<Option<(SocketAddr, Headers)>> {
    let Some(addr) = cluster
        .router
        .url
        .as_deref()
        .and_then(|url| url.strip_prefix("http://"))
        .and_then(|rest| rest.trim_end_matches('/').parse::<SocketAddr>().ok())
    else {
        return Ok(None);
    };
    let authorization = match (&cluster.router.signing_key, &cluster.router.token) {
        (Some(key), _) => {
            let expires_at = jiff::Timestamp::now().as_second() + 600;
            let claims = agent_sandbox_api::token::Claims::new(
                cluster.namespace.as_str(),
                sandbox,
                expires_at,
            );
            let token = agent_sandbox_api::token::mint(key, &claims)
                .map_err(|e| Error::Check(format!("mint a token for {sandbox}: {e}")))?;
            vec![("Authorization", format!("Bearer {token}"))]
        }
        (None, Some(token)) => vec![("Authorization", format!("Bearer {token}"))],
        (None, None) => Vec::new(),
    };
    Ok(Some((addr, authorization)))
}

/// A Ready, unclaimed member of `pool` other than `except`.
async fn unclaimed_member(cluster: &ClusterUnderTest, pool: &str, except: &str) -> Result<String> {
    let sandboxes: Api<Sandbox> = cluster.api();
    let selector = ListParams::default().labels(&format!(
        "{}={}",
        labels::WARM_POOL_SANDBOX,
        name_hash(pool)
    ));
    wait_for(
        &format!("a Ready unclaimed member of pool {pool}"),
        WAIT,
        || async {
            let members = sandboxes
                .list(&selector)
                .await
                .map_err(Error::kube(format!("list the members of pool {pool}")))?;
            Ok(
                match members
                    .iter()
                    .find(|s| sandbox_ready(s) && s.name_any() != except)
                {
                    Some(member) => Check::Done(member.name_any()),
                    None => Check::NotYet(format!("{} members, none Ready", members.items.len())),
                },
            )
        },
    )
    .await
}

/// Under upstream's router RBAC (pods get/list/watch only) the router routes from pods alone;
/// a request to an unclaimed warm-pool member is refused (404, saying so) before and after a
/// claim takes another member, as by the installed router with its full checks, and the
/// claimed sandbox runs the command.
pub(super) async fn under_upstreams_pods_only_rbac_unclaimed_pool_members_are_refused(
    cluster: &ClusterUnderTest,
) -> Result<Verdict> {
    let name = cluster.name("pods-only-router");
    let accounts: Api<ServiceAccount> = cluster.api();
    let roles: Api<ClusterRole> = Api::all(cluster.kube.clone());
    let bindings: Api<ClusterRoleBinding> = Api::all(cluster.kube.clone());
    let mut account = ServiceAccount::default();
    account.metadata.name = Some(name.clone());
    account.metadata.labels = Some(run_labels(&cluster.run));
    match accounts.create(&PostParams::default(), &account).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 405 => {
            return Ok(Verdict::Skipped(format!(
                "this cluster's API server has no ServiceAccounts ({} {}), so a router cannot \
                 run with a ServiceAccount's RBAC here",
                status.code, status.message
            )));
        }
        Err(error) => return Err(Error::kube(format!("create ServiceAccount {name}"))(error)),
    }
    let outcome = async {
        let token = match accounts
            .create_token_request(
                &name,
                &PostParams::default(),
                &TokenRequest {
                    spec: Some(TokenRequestSpec {
                        expiration_seconds: Some(3600),
                        ..TokenRequestSpec::default()
                    }),
                    ..TokenRequest::default()
                },
            )
            .await
        {
            Ok(request) => request
                .status
                .and_then(|s| s.token)
                .filter(|token| !token.is_empty())
                .ok_or_else(|| Error::Check(format!("the token request of {name} has no token")))?,
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 405 => {
                return Ok(Verdict::Skipped(format!(
                    "this cluster's API server issues no ServiceAccount tokens \
                     (serviceaccounts/token: {} {}), so a router cannot run with a \
                     ServiceAccount's RBAC here",
                    status.code, status.message
                )));
            }
            Err(error) => return Err(Error::kube(format!("request a token of {name}"))(error)),
        };
        create(&roles, &pods_only_role(&name, &cluster.run)?).await?;
        let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": run_labels(&cluster.run)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": cluster.namespace}]
        }))
        .map_err(|e| Error::Check(format!("the ClusterRoleBinding: {e}")))?;
        create(&bindings, &binding).await?;

        // A pool of this scenario's own, so that no other scenario claims its members.
        let pool_name = cluster.name("pods-only-pool");
        let pools: Api<SandboxWarmPool> = cluster.api();
        create(&pools, &pool(&pool_name, &cluster.scenario_template, 2, &cluster.run)).await?;
        wait_pool_ready(&pools, &pool_name, 2).await?;

        let kubeconfig = token_kubeconfig(&cluster.kubeconfig, &token, cluster.scratch(), &pool_name)?;
        let mut router = start_router(cluster, &kubeconfig).await?;
        let pods_only = router
            .log()
            .iter()
            .any(|line| line.contains("routing from pods alone"));
        if !pods_only {
            return Ok(Verdict::Skipped(format!(
                "this cluster's API server let a ServiceAccount granted pods only list \
                 Sandboxes (it enforces no RBAC), so the router did not route from pods \
                 alone; it logged: {:?}",
                router.log()
            )));
        }
        let addr = router.addr;
        let namespace = cluster.namespace.as_str();

        let member = unclaimed_member(cluster, &pool_name, "").await?;
        let (status, body) = execute(addr, namespace, &member, &[]).await?;
        ensure!(
            status == 404 && body.contains("unclaimed warm-pool member"),
            "POST /execute to the unclaimed pool member {namespace}/{member} through a router \
             that routes from pods alone answered {status} {body} (expected 404: an unclaimed \
             member is handed to someone's claim later)"
        );
        // The same rule with the full checks: the installed router reads Sandboxes.
        if let Some((installed, authorization)) = installed_router(cluster, &member)? {
            let (status, body) = execute(installed, namespace, &member, &authorization).await?;
            ensure!(
                status == 404 && body.contains("unclaimed warm-pool member"),
                "POST /execute to the unclaimed pool member {namespace}/{member} through the \
                 installed router at {installed} answered {status} {body} (expected 404)"
            );
        }

        let claims: Api<SandboxClaim> = cluster.api();
        let claim_name = cluster.name("pods-only-claim");
        create(&claims, &claim(&claim_name, &pool_name, &cluster.run)).await?;
        let claimed = wait_claim_ready(&claims, &claim_name).await?;
        let sandbox = claimed
            .status
            .as_ref()
            .map(|s| s.sandbox.name.clone())
            .unwrap_or_default();
        let (status, body) = execute(addr, namespace, &sandbox, &[]).await?;
        ensure!(
            status == 200 && body.contains("reached"),
            "POST /execute to the claimed sandbox {namespace}/{sandbox} through the pods-only \
             router answered {status} {body}; it logged: {:?}",
            router.log()
        );

        let other = unclaimed_member(cluster, &pool_name, &sandbox).await?;
        let (status, body) = execute(addr, namespace, &other, &[]).await?;
        ensure!(
            status == 404 && body.contains("unclaimed warm-pool member"),
            "after the claim, POST /execute to the unclaimed member {namespace}/{other} \
             answered {status} {body}"
        );
        let _ = claims.delete(&claim_name, &DeleteParams::default()).await;
        let _ = pools.delete(&pool_name, &DeleteParams::default()).await;
        Ok(Verdict::Passed)
    }
    .await;
    let _ = bindings.delete(&name, &DeleteParams::default()).await;
    let _ = roles.delete(&name, &DeleteParams::default()).await;
    let _ = accounts.delete(&name, &DeleteParams::default()).await;
    outcome
}

#[cfg(test)]
mod tests {
    use super::unchunk;

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(
            unchunk("5\r\nhello\r\n7\r\n world!\r\n0\r\n\r\n"),
            "hello world!"
        );
    }
}
