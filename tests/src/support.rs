//! Small helpers the scenarios share: bounded waits, readiness predicates, object builders and
//! child processes that never outlive their scenario.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use agent_sandbox_api::claim::SandboxWarmPoolRef;
use agent_sandbox_api::conditions::{claim as claim_cond, sandbox as sandbox_cond};
use agent_sandbox_api::warm_pool::SandboxTemplateRef;
use agent_sandbox_api::{
    Sandbox, SandboxClaim, SandboxClaimSpec, SandboxWarmPool, SandboxWarmPoolSpec, labels,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;

use crate::error::{Error, Result};

/// Label on every object a run creates (value: the run's id), so that the runner can delete
/// whatever a failed scenario left behind.
pub(crate) const RUN_LABEL: &str = "e2e.agent-sandbox.dev/run";

/// How long one wait for the cluster may take (cold sandboxes on a real cluster pull images).
pub(crate) const WAIT: Duration = Duration::from_secs(180);

pub(crate) use agent_sandbox_local::testkit::Check;

/// The test kit's bounded polling with the suite's error: `probe` answers [`Check::Done`] or
/// [`Check::NotYet`] with what it saw, which a timeout quotes.
pub(crate) async fn wait_for<T, F, Fut>(what: &str, limit: Duration, probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Check<T>>>,
{
    agent_sandbox_local::testkit::wait_for(what, limit, probe).await
}

/// `get_opt` with the error naming the object.
pub(crate) async fn get<K>(api: &Api<K>, name: &str) -> Result<Option<K>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name)
        .await
        .map_err(Error::kube(format!("get {name}")))
}

/// Waits until `name` is gone from `api`.
pub(crate) async fn wait_gone<K>(api: &Api<K>, kind: &str, name: &str) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    wait_for(&format!("{kind} {name} to be deleted"), WAIT, || async {
        Ok(match get(api, name).await? {
            None => Check::Done(()),
            Some(_) => Check::NotYet("still there".to_owned()),
        })
    })
    .await
}

fn condition_is(conditions: &[Condition], type_: &str, status: &str, reason: &str) -> bool {
    conditions.iter().any(|c| {
        c.type_ == type_ && c.status == status && (reason.is_empty() || c.reason == reason)
    })
}

/// The claim is Ready and names its sandbox.
pub(crate) fn claim_ready(claim: &SandboxClaim) -> bool {
    claim.status.as_ref().is_some_and(|s| {
        !s.sandbox.name.is_empty() && condition_is(&s.conditions, claim_cond::READY, "True", "")
    })
}

/// The sandbox is Ready.
pub(crate) fn sandbox_ready(sandbox: &Sandbox) -> bool {
    sandbox
        .status
        .as_ref()
        .is_some_and(|s| condition_is(&s.conditions, sandbox_cond::READY, "True", ""))
}

/// The sandbox reports `Suspended=True`.
pub(crate) fn sandbox_suspended(sandbox: &Sandbox) -> bool {
    sandbox
        .status
        .as_ref()
        .is_some_and(|s| condition_is(&s.conditions, sandbox_cond::SUSPENDED, "True", ""))
}

/// Conditions as `Type=Status (Reason)`, for messages.
pub(crate) fn describe_conditions(conditions: &[Condition]) -> String {
    if conditions.is_empty() {
        return "no conditions".to_owned();
    }
    conditions
        .iter()
        .map(|c| format!("{}={} ({})", c.type_, c.status, c.reason))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Waits for `name` to be Ready and returns it.
pub(crate) async fn wait_claim_ready(api: &Api<SandboxClaim>, name: &str) -> Result<SandboxClaim> {
    wait_for(&format!("claim {name} to be Ready"), WAIT, || async {
        let claim = get(api, name).await?;
        Ok(match claim {
            Some(claim) if claim_ready(&claim) => Check::Done(claim),
            Some(claim) => {
                Check::NotYet(claim.status.as_ref().map_or("no status".to_owned(), |s| {
                    describe_conditions(&s.conditions)
                }))
            }
            None => Check::NotYet("the claim does not exist".to_owned()),
        })
    })
    .await
}

/// Labels of the objects a run creates.
pub(crate) fn run_labels(run: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(RUN_LABEL.to_owned(), run.to_owned())])
}

/// A claim on `pool`, labelled with the run.
pub(crate) fn claim(name: &str, pool: &str, run: &str) -> SandboxClaim {
    let mut claim = SandboxClaim::new(
        name,
        SandboxClaimSpec {
            warm_pool_ref: SandboxWarmPoolRef { name: pool.into() },
            ..SandboxClaimSpec::default()
        },
    );
    let mut labels = run_labels(run);
    labels.insert(
        labels::CREATED_BY.into(),
        labels::CREATED_BY_RUST_CLIENT.into(),
    );
    claim.metadata.labels = Some(labels);
    claim
}

/// A warm pool of `replicas` on `template`, labelled with the run.
pub(crate) fn pool(name: &str, template: &str, replicas: i32, run: &str) -> SandboxWarmPool {
    let mut pool = SandboxWarmPool::new(
        name,
        SandboxWarmPoolSpec {
            replicas,
            sandbox_template_ref: SandboxTemplateRef {
                name: template.into(),
            },
            update_strategy: None,
            claim_defaults: None,
        },
    );
    pool.metadata.labels = Some(run_labels(run));
    pool
}

/// Waits until `pool` has `replicas` ready members.
pub(crate) async fn wait_pool_ready(
    api: &Api<SandboxWarmPool>,
    name: &str,
    replicas: i32,
) -> Result<SandboxWarmPool> {
    wait_for(
        &format!("SandboxWarmPool {name} to have {replicas} ready sandboxes"),
        WAIT,
        || async {
            Ok(match get(api, name).await? {
                Some(pool)
                    if pool
                        .status
                        .as_ref()
                        .is_some_and(|s| s.ready_replicas >= replicas) =>
                {
                    Check::Done(pool)
                }
                Some(pool) => {
                    let ready = pool.status.as_ref().map_or(0, |s| s.ready_replicas);
                    Check::NotYet(format!("{ready} ready"))
                }
                None => Check::NotYet("the pool does not exist".to_owned()),
            })
        },
    )
    .await
}

/// Output of a finished child process.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) status: std::process::ExitStatus,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Finished {
    /// Both streams, for failure messages.
    pub(crate) fn describe(&self) -> String {
        format!(
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Runs `command` to completion within `limit` (killed when the limit passes or the scenario
/// is dropped: `kill_on_drop`).
pub(crate) async fn run_child(
    program: &Path,
    mut command: tokio::process::Command,
    stdin: Option<&[u8]>,
    limit: Duration,
) -> Result<Finished> {
    use tokio::io::AsyncWriteExt as _;
    command
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .map_err(Error::io("start", program.to_path_buf()))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input)
            .await
            .map_err(Error::io("write stdin of", program.to_path_buf()))?;
    }
    let output = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .map_err(|_| agent_sandbox_local::wait::Timeout {
            what: format!("{} to exit", program.display()),
            after: limit,
            last: "still running (killed)".to_owned(),
        })?
        .map_err(Error::io("wait for", program.to_path_buf()))?;
    Ok(Finished {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}

/// A workspace binary built for this test's target directory and profile.
pub(crate) fn binary(package: &str, bin: &str) -> Result<PathBuf> {
    Ok(agent_sandbox_local::testkit::workspace_binary(
        package, bin,
    )?)
}

/// The pod backing `sandbox` (named by its annotation, else after it).
pub(crate) fn pod_name(sandbox: &agent_sandbox_api::Sandbox) -> String {
    use kube::ResourceExt as _;
    sandbox
        .annotations()
        .get(agent_sandbox_api::annotations::POD_NAME)
        .cloned()
        .unwrap_or_else(|| sandbox.name_any())
}

/// Creates `object`, the error naming it.
pub(crate) async fn create<K>(api: &Api<K>, object: &K) -> Result<K>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    use kube::ResourceExt as _;
    api.create(&kube::api::PostParams::default(), object)
        .await
        .map_err(Error::kube(format!("create {}", object.name_any())))
}
