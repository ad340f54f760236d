//! The idle lifecycle's costs (issue 19), measured the same way on both tiers through the SDK in
//! direct mode and the router: how long a request to a suspended sandbox takes to be answered
//! (resume on traffic) next to cold and warm claims to their first answer, and how many API
//! writes a sandbox receiving 100 requests a second causes per minute. The tiers' cases
//! (`sdk/…` in [`super::sdk`], `control-plane/…` in [`super::control_plane`]) start their
//! cluster, call these and write the rows.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use agent_sandbox::{CreateOptions, ExecOptions, Sandbox};
use agent_sandbox_api::SandboxWarmPool;
use agent_sandbox_api::conditions::sandbox as cond;
use agent_sandbox_api::sandbox::OperatingMode;
use agent_sandbox_local::testkit::http::get;
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::wait::await_condition;

use super::{Options, Samples};

/// A bound for each wait (a pool refilled, a sandbox suspended or Ready again), not a speed
/// assertion.
const WAIT: Duration = Duration::from_secs(120);
/// The router sends one resume per sandbox per 5 s (`RESUME_AGAIN` in
/// crates/router/src/activity.rs: requests meanwhile share it), so a sandbox is suspended again
/// no sooner than this after the request that woke it.
const RESUME_SPACING: Duration = Duration::from_secs(6);
/// Time for the router's watch to see a suspension (the pod gone) once this process saw it.
const ROUTER_CATCH_UP: Duration = Duration::from_millis(200);
/// Sandboxes suspended and woken in turn, so that the spacing above costs little waiting.
const RESUMED_SANDBOXES: usize = 5;
/// The request rate of [`writes_under_load`].
pub(super) const RATE: u32 = 100;

/// Where a tier's measurements run: an SDK client in direct mode (with the router's
/// credentials), an admin client, and the pools to claim from.
pub(super) struct Tier<'a> {
    pub(super) sdk: &'a agent_sandbox::Client,
    pub(super) kube: &'a kube::Client,
    pub(super) namespace: &'a str,
    /// A pool of [`Tier::warm_replicas`] (the warm claims and the resumed sandboxes).
    pub(super) warm_pool: &'a str,
    pub(super) warm_replicas: i32,
    /// A pool of 0 on the same template: every claim is served cold.
    pub(super) cold_pool: &'a str,
}

/// [`resume_on_traffic`]'s samples.
pub(super) struct Resumes {
    /// A request to a suspended sandbox (pod gone) -> its answer.
    pub(super) resume: Samples,
    /// Claim from the pool of 0 -> Ready -> the first request's answer.
    pub(super) cold: Samples,
    /// Claim from the full warm pool -> Ready -> the first request's answer.
    pub(super) warm: Samples,
    /// How many sandboxes the resumes were spread over.
    pub(super) sandboxes: usize,
}

/// `POST /execute {"command":"true"}` through the router; an error unless it exits 0.
async fn run_true(sandbox: &Sandbox) -> Result<()> {
    let answer = sandbox
        .run_with(ExecOptions::new("true").timeout(Duration::from_secs(60)))
        .await
        .with_context(|| format!("run(\"true\") in {}", sandbox.sandbox_name()))?;
    if answer.exit_code != 0 {
        bail!(
            "run(\"true\") in {} exited {} (stderr {:?})",
            sandbox.sandbox_name(),
            answer.exit_code,
            answer.stderr
        );
    }
    Ok(())
}

async fn pool_ready(tier: &Tier<'_>) -> Result<()> {
    let pools: Api<SandboxWarmPool> = Api::namespaced(tier.kube.clone(), tier.namespace);
    let replicas = tier.warm_replicas;
    let full = move |pool: Option<&SandboxWarmPool>| {
        pool.and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.ready_replicas == replicas && s.replicas == replicas)
    };
    tokio::time::timeout(WAIT, await_condition(pools, tier.warm_pool, full))
        .await
        .with_context(|| {
            format!(
                "pool {} did not reach {replicas} ready members within {WAIT:?}",
                tier.warm_pool
            )
        })??;
    Ok(())
}

fn has_condition(sandbox: &agent_sandbox_api::Sandbox, type_: &str) -> bool {
    sandbox.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == "True")
    })
}

/// Waits until `name` runs and is Ready.
async fn sandbox_ready(tier: &Tier<'_>, name: &str) -> Result<()> {
    let sandboxes: Api<agent_sandbox_api::Sandbox> =
        Api::namespaced(tier.kube.clone(), tier.namespace);
    let ready = |s: Option<&agent_sandbox_api::Sandbox>| {
        s.is_some_and(|s| {
            s.spec.operating_mode == OperatingMode::Running && has_condition(s, cond::READY)
        })
    };
    tokio::time::timeout(WAIT, await_condition(sandboxes, name, ready))
        .await
        .with_context(|| format!("sandbox {name} was not Ready within {WAIT:?}"))??;
    Ok(())
}

/// Waits until `name` is suspended (its condition says so) and its pod is gone.
async fn sandbox_suspended(tier: &Tier<'_>, name: &str) -> Result<()> {
    let sandboxes: Api<agent_sandbox_api::Sandbox> =
        Api::namespaced(tier.kube.clone(), tier.namespace);
    let suspended = |s: Option<&agent_sandbox_api::Sandbox>| {
        s.is_some_and(|s| {
            s.spec.operating_mode == OperatingMode::Suspended && has_condition(s, cond::SUSPENDED)
        })
    };
    let sandbox = tokio::time::timeout(WAIT, await_condition(sandboxes, name, suspended))
        .await
        .with_context(|| format!("sandbox {name} was not suspended within {WAIT:?}"))??
        .context("the sandbox went while it was suspended")?;
    let pod = sandbox
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(agent_sandbox_api::annotations::POD_NAME))
        .cloned()
        .unwrap_or_else(|| name.to_owned());
    let pods: Api<Pod> = Api::namespaced(tier.kube.clone(), tier.namespace);
    tokio::time::timeout(
        WAIT,
        await_condition(pods, &pod, |p: Option<&Pod>| p.is_none()),
    )
    .await
    .with_context(|| format!("pod {pod} of suspended {name} was not gone within {WAIT:?}"))??;
    Ok(())
}

/// Resume on traffic, with cold and warm claims as its baselines from the same run.
///
/// [`RESUMED_SANDBOXES`] sandboxes claimed from the warm pool are, in batches: Ready, suspended
/// (`suspend()`: `operatingMode: Suspended`), seen suspended with their pods gone (plus
/// [`ROUTER_CATCH_UP`] for the router's watch), then woken one after another by timing one
/// `run("true")` each (the router records activity at once, the controller resumes the sandbox,
/// the pod comes back, the router forwards), each woken sandbox Ready before the next is timed.
/// Then warm claims from the full pool and cold claims from the pool of 0, each timed from
/// `create_sandbox` to its first `run("true")` answered.
pub(super) async fn resume_on_traffic(tier: &Tier<'_>, options: Options) -> Result<Resumes> {
    let rounds = options.iterations(25);
    let claims = options.iterations(20);
    pool_ready(tier).await?;
    let mut sandboxes = Vec::with_capacity(RESUMED_SANDBOXES);
    for _ in 0..RESUMED_SANDBOXES.min(rounds) {
        sandboxes.push(tier.sdk.create_sandbox(tier.warm_pool).await?);
    }
    let resumed = async {
        pool_ready(tier).await?;
        let mut resume = Samples::with_capacity(rounds);
        let mut woken: Vec<Option<Instant>> = vec![None; sandboxes.len()];
        while resume.len() < rounds {
            let batch = sandboxes.len().min(rounds - resume.len());
            for sandbox in &sandboxes[..batch] {
                sandbox_ready(tier, sandbox.sandbox_name()).await?;
            }
            if let Some(last) = woken[..batch].iter().flatten().max() {
                let since = last.elapsed();
                if since < RESUME_SPACING {
                    tokio::time::sleep(RESUME_SPACING - since).await;
                }
            }
            for sandbox in &sandboxes[..batch] {
                sandbox.suspend().await?;
            }
            for sandbox in &sandboxes[..batch] {
                sandbox_suspended(tier, sandbox.sandbox_name()).await?;
            }
            tokio::time::sleep(ROUTER_CATCH_UP).await;
            for (sandbox, woken) in sandboxes[..batch].iter().zip(&mut woken) {
                let started = Instant::now();
                *woken = Some(started);
                run_true(sandbox).await?;
                resume.push(started.elapsed());
                sandbox_ready(tier, sandbox.sandbox_name()).await?;
            }
        }
        Ok::<_, anyhow::Error>(resume)
    }
    .await;
    for sandbox in &sandboxes {
        let _ = sandbox.close().await;
    }
    let resume = resumed?;

    let mut warm = Samples::with_capacity(claims);
    for _ in 0..claims {
        pool_ready(tier).await?;
        let started = Instant::now();
        let sandbox = tier.sdk.create_sandbox(tier.warm_pool).await?;
        let answered = run_true(&sandbox).await;
        warm.push(started.elapsed());
        sandbox.close().await?;
        answered?;
    }
    let mut cold = Samples::with_capacity(claims);
    for _ in 0..claims {
        let started = Instant::now();
        let sandbox = tier.sdk.create_sandbox(tier.cold_pool).await?;
        let answered = run_true(&sandbox).await;
        cold.push(started.elapsed());
        sandbox.close().await?;
        answered?;
    }
    Ok(Resumes {
        resume,
        cold,
        warm,
        sandboxes: sandboxes.len(),
    })
}

/// [`writes_under_load`]'s counts over its window.
pub(super) struct Writes {
    /// Requests answered in the window, and how long it lasted (between the router's writes
    /// that open and close it, as seen by polling).
    pub(super) requests: usize,
    pub(super) window: Duration,
    /// The latency of every request of the load.
    pub(super) latency: Samples,
    /// `sandbox_router_activity_writes_total` of the router the requests went through.
    pub(super) router: u64,
    /// Writes to Sandboxes by everyone (verb and resource -> count), as the tier counts them.
    pub(super) sandboxes: BTreeMap<String, u64>,
}

impl Writes {
    /// `count` in the window, per minute.
    pub(super) fn per_minute(&self, count: u64) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let count = count as f64;
        count * 60.0 / self.window.as_secs_f64()
    }

    pub(super) fn rate(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let requests = self.requests as f64;
        requests / self.window.as_secs_f64()
    }

    /// All Sandbox writes in the window.
    pub(super) fn sandbox_total(&self) -> u64 {
        self.sandboxes.values().sum()
    }

    /// `VERB resource n.nn/min` for each kind of Sandbox write.
    pub(super) fn breakdown(&self) -> String {
        if self.sandboxes.is_empty() {
            return "none".to_owned();
        }
        self.sandboxes
            .iter()
            .map(|(key, n)| format!("{key} {:.2}", self.per_minute(*n)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The Notes of a tier's row; `counted` says where the Sandbox writes come from, `setup`
    /// what runs where.
    pub(super) fn notes(&self, counted: &str, setup: &str) -> String {
        #[allow(clippy::cast_precision_loss)]
        let every = self.window.as_secs_f64() / self.router.max(1) as f64;
        format!(
            "router activity writes {:.2}/min (sandbox_router_activity_writes_total: {} in {:.1} s, one per {every:.1} s), all Sandbox writes {:.2}/min ({}; {counted}), with {} x run(\"true\") at {:.0}/s to one claimed sandbox (idleLifecycle: suspend after 600 s, so the router's default --activity-interval of 30 s applies); window: from the write of the first request's activity (made at once) to the last of the {} writes after it, seen by polling the router's /metrics every 100 ms; median/p99 = the latency of every request; {setup}",
            self.per_minute(self.router),
            self.router,
            self.window.as_secs_f64(),
            self.per_minute(self.sandbox_total()),
            self.breakdown(),
            self.requests,
            self.rate(),
            self.router,
        )
    }
}

/// `sandbox_router_activity_writes_total` from `GET {router}/metrics` (no X-Sandbox-ID).
async fn router_activity_writes(router: &str) -> Result<u64> {
    let answer = get(&format!("{router}/metrics"))
        .await
        .context("GET /metrics of the router")?;
    let text = answer.text();
    let value = text
        .lines()
        .find_map(|line| line.strip_prefix("sandbox_router_activity_writes_total "))
        .with_context(|| format!("no sandbox_router_activity_writes_total in:\n{text}"))?;
    // Floats in the exposition format ("2" or "2.0").
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let value = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
    Ok(value)
}

/// Requests of [`writes_under_load`] between two reads of the router's counter (100 ms at
/// [`RATE`]).
const POLL_EVERY: u32 = 10;
/// Counters are read this long after a router write was seen, so that what follows that write
/// (the controller's reaction to it) falls on the same side of the window's both ends.
const SETTLE: Duration = Duration::from_secs(1);

/// Sequential requests at [`RATE`] to one sandbox; a slow one is made up for by the next ticks
/// (burst), so that the load keeps its rate.
struct Load<'a> {
    sandbox: &'a Sandbox,
    tick: tokio::time::Interval,
    latency: Samples,
}

impl<'a> Load<'a> {
    fn new(sandbox: &'a Sandbox) -> Self {
        let mut tick = tokio::time::interval(Duration::from_secs(1) / RATE);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        Self {
            sandbox,
            tick,
            latency: Samples::default(),
        }
    }

    /// [`POLL_EVERY`] requests.
    async fn batch(&mut self) -> Result<()> {
        for _ in 0..POLL_EVERY {
            self.tick.tick().await;
            let sent = Instant::now();
            run_true(self.sandbox).await?;
            self.latency.push(sent.elapsed());
        }
        Ok(())
    }

    /// Until the router's activity writes reach `count` (at most `within`): when that was seen.
    async fn until_writes(
        &mut self,
        router: &str,
        count: u64,
        within: Duration,
    ) -> Result<Instant> {
        let deadline = Instant::now() + within;
        loop {
            self.batch().await?;
            if router_activity_writes(router).await? >= count {
                return Ok(Instant::now());
            }
            if Instant::now() > deadline {
                bail!(
                    "the router's activity writes did not reach {count} within {within:?} of load"
                );
            }
        }
    }

    /// Until `at`.
    async fn until(&mut self, at: Instant) -> Result<()> {
        while Instant::now() < at {
            self.batch().await?;
        }
        Ok(())
    }
}

/// [`RATE`] `run("true")` a second through the router at one sandbox claimed from `pool` with
/// an idle lifecycle (suspend after 600 s: the router's write interval stays its
/// `--activity-interval`, 30 s by default, a quarter of that TTL being longer), while the
/// router's activity writes are read every [`POLL_EVERY`] requests. The first request's activity
/// is written at once; the window runs from that write to the `intervals`-th after it (both
/// ends [`SETTLE`] later), so that it holds whole intervals of the steady state. Counts the
/// router's writes in it and, with `sandbox_writes` (the tier's cumulative Sandbox write
/// counters), everyone's Sandbox writes.
pub(super) async fn writes_under_load<F, Fut>(
    sdk: &agent_sandbox::Client,
    router: &str,
    pool: &str,
    intervals: u64,
    sandbox_writes: F,
) -> Result<Writes>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<BTreeMap<String, u64>>>,
{
    let sandbox = sdk
        .create_sandbox_with(
            pool,
            CreateOptions::default().suspend_when_idle(Duration::from_secs(600)),
        )
        .await?;
    let outcome = async {
        let initial = router_activity_writes(router).await?;
        let mut load = Load::new(&sandbox);
        let first = load
            .until_writes(router, initial + 1, Duration::from_secs(10))
            .await?;
        load.until(first + SETTLE).await?;
        let router_before = router_activity_writes(router).await?;
        let sandboxes_before = sandbox_writes().await?;
        let requests_before = load.latency.len();
        // A bound for the load, not a speed assertion: an interval is 30 s by default.
        let within = Duration::from_secs(90) * u32::try_from(intervals).unwrap_or(1);
        let last = load
            .until_writes(router, initial + 1 + intervals, within)
            .await?;
        load.until(last + SETTLE).await?;
        let router_after = router_activity_writes(router).await?;
        let sandboxes_after = sandbox_writes().await?;
        let mut sandboxes = BTreeMap::new();
        for (key, count) in sandboxes_after {
            let delta = count.saturating_sub(sandboxes_before.get(&key).copied().unwrap_or(0));
            if delta > 0 {
                sandboxes.insert(key, delta);
            }
        }
        Ok::<_, anyhow::Error>(Writes {
            requests: load.latency.len() - requests_before,
            window: last - first,
            latency: load.latency,
            router: router_after.saturating_sub(router_before),
            sandboxes,
        })
    }
    .await;
    let closed = sandbox.close().await;
    let writes = outcome?;
    closed?;
    Ok(writes)
}
