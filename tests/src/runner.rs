//! Runs the scenarios against one cluster and reports like a test harness: one line per
//! scenario with its time, skipped ones with their reason, failures in full at the end.
//!
//! Arguments (after `--` with `cargo test`): `--sim` (the default), `--kubeconfig PATH` or
//! `--k3s [--images TAR]` choose the cluster (else [`env::CLUSTER`] does); words select
//! scenarios whose name contains one of them; `--list` lists them; `--jobs N` runs N at once
//! (default [`env::JOBS`] or 4); flags cargo's own harness takes (`--nocapture`,
//! `--test-threads=N`, ...) are accepted and ignored.
//! With a filter that selects nothing, no cluster is started (so `cargo test <filter>` over
//! the whole workspace stays cheap).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;

use crate::cluster::{ClusterUnderTest, Target};
use crate::env;
use crate::scenarios::{self, Scenario, Verdict};

/// Longest one scenario may run before it counts as failed.
const SCENARIO_LIMIT: Duration = Duration::from_secs(600);

#[derive(Debug, Default)]
struct Args {
    filters: Vec<String>,
    list: bool,
    jobs: Option<usize>,
    target: Option<Target>,
    /// Leave the cluster the suite started running after the report, until Ctrl-C.
    keep: bool,
    /// `--images PATH`: the image archive of `--k3s` (the default target of the flag) or
    /// `--node`.
    images: Option<std::path::PathBuf>,
}

/// `--images PATH` goes to `--node`'s target, else to `--k3s`'s (which it implies).
fn with_images(mut parsed: Args) -> Args {
    if let Some(path) = parsed.images.take() {
        parsed.target = Some(match parsed.target {
            Some(Target::Node { .. }) => Target::Node { images: Some(path) },
            _ => Target::K3s { images: Some(path) },
        });
    }
    parsed
}

/// `--helm` after (or before) `--control-plane`: the tier installs with the Helm chart.
fn with_helm(mut parsed: Args, helm: bool) -> Result<Args, String> {
    if helm {
        match parsed.target {
            Some(Target::ControlPlane(_)) => {
                parsed.target = Some(Target::ControlPlane(crate::plane_target::Install::Helm));
            }
            _ => return Err("--helm goes with --control-plane".to_owned()),
        }
    }
    Ok(parsed)
}

fn parse(args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut parsed = Args::default();
    let mut helm = false;
    let mut args = args.peekable();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--list" => parsed.list = true,
            "--keep" => parsed.keep = true,
            "--sim" => parsed.target = Some(Target::Sim),
            "--control-plane" => {
                parsed.target = Some(Target::ControlPlane(
                    crate::plane_target::Install::Kustomize,
                ));
            }
            "--node" => parsed.target = Some(Target::Node { images: None }),
            "--helm" => helm = true,
            "--k3s" => {
                if !matches!(parsed.target, Some(Target::K3s { .. })) {
                    parsed.target = Some(Target::K3s { images: None });
                }
            }
            "--kubeconfig" => {
                let path = args.next().ok_or("--kubeconfig needs a path")?;
                parsed.target = Some(Target::Kubeconfig(path.into()));
            }
            "--images" => {
                let path = args
                    .next()
                    .ok_or("--images needs the path of an image archive")?;
                parsed.images = Some(path.into());
            }
            "--jobs" => {
                let value = args.next().ok_or("--jobs needs a number")?;
                parsed.jobs = Some(value.parse().map_err(|_| format!("--jobs {value:?}"))?);
            }
            // Taken by libtest-style harnesses; meaningless here.
            "--nocapture" | "--show-output" | "--quiet" | "-q" | "--exact" | "--ignored"
            | "--include-ignored" => {}
            flag if flag.starts_with("--test-threads")
                || flag.starts_with("--color")
                || flag.starts_with("--format")
                || flag.starts_with("-Z") =>
            {
                if !flag.contains('=') && args.peek().is_some_and(|v| !v.starts_with('-')) {
                    args.next();
                }
            }
            flag if flag.starts_with('-') => return Err(format!("unknown option {flag}")),
            filter => parsed.filters.push(filter.to_owned()),
        }
    }
    with_helm(with_images(parsed), helm)
}

fn jobs(args: &Args) -> usize {
    let default = match args.target {
        // The real node has this machine's CPUs (two here): after the system's pods and the
        // pool's two members, room for about four sandboxes of `deploy/sandboxes`' template,
        // which the scenarios claiming from the pool share.
        Some(Target::Node { .. }) => 2,
        _ => 4,
    };
    args.jobs
        .or_else(|| std::env::var(env::JOBS).ok()?.parse().ok())
        .unwrap_or(default)
        .max(1)
}

/// The outcome of one scenario.
#[derive(Debug)]
enum Outcome {
    Passed,
    Skipped(String),
    Failed(String),
}

/// Runs the suite with the process's arguments and environment; returns the exit code.
/// The namespaces this run needs of its own, if any ([`crate::netns`]): the control-plane tier
/// a network namespace with the pod range routed locally, the node tier a real node's layout;
/// the simulated cluster the former where this machine gives its pods networks of their own
/// (NetworkPolicies enforced, the network scenarios run: the bridge that takes, and the
/// "internet", in the run's own namespace). `e2e.rs` asks before it starts any thread.
pub fn own_namespaces() -> Option<crate::netns::Layout> {
    use crate::netns::Layout;
    let args = parse(std::env::args().skip(1)).ok()?;
    if args.list {
        return None;
    }
    match args.target.map_or_else(Target::from_env, Ok) {
        Ok(Target::ControlPlane(_)) => Some(Layout::LocalPodRange),
        Ok(Target::Node { .. }) => Some(Layout::Node),
        Ok(Target::Sim) => agent_sandbox_local::testkit::Tool::PodNetworks
            .unavailable()
            .is_none()
            .then_some(Layout::LocalPodRange),
        _ => None,
    }
}

/// Whether this run selects a scenario of upstream's clients, whose smoke tests `e2e.rs` then
/// builds before the run ([`crate::upstream::prepare`]).
pub fn upstream_selected() -> bool {
    let Ok(args) = parse(std::env::args().skip(1)) else {
        return false;
    };
    !args.list
        && scenarios::all().iter().any(|s| {
            s.name.starts_with("upstream::")
                && (args.filters.is_empty() || args.filters.iter().any(|f| s.name.contains(f)))
        })
}

pub async fn main() -> i32 {
    let filter = tracing_subscriber::EnvFilter::try_from_env("AGENT_SANDBOX_E2E_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    let args = match parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("e2e: {message}");
            return 2;
        }
    };
    let selected: Vec<Scenario> = scenarios::all()
        .into_iter()
        .filter(|s| args.filters.is_empty() || args.filters.iter().any(|f| s.name.contains(f)))
        .collect();
    if args.list {
        for scenario in &selected {
            println!("{}: test", scenario.name);
        }
        return 0;
    }
    if selected.is_empty() {
        println!("e2e: no scenario matches {:?}; nothing to do", args.filters);
        return 0;
    }
    let target = match args.target.clone().map_or_else(Target::from_env, Ok) {
        Ok(target) => target,
        Err(error) => {
            eprintln!("e2e: {error}");
            return 2;
        }
    };
    let started = Instant::now();
    println!("e2e: starting {} ...", target.describe());
    // Ctrl-C at any point ends the run with everything it started torn down (dropping a
    // cluster that is still being set up ends its processes and removes its files).
    let started_cluster = tokio::select! {
        started = ClusterUnderTest::start(&target) => started,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("e2e: interrupted while starting the cluster; it is torn down");
            return INTERRUPTED;
        }
    };
    let mut cluster = match started_cluster {
        Ok(cluster) => Arc::new(cluster),
        Err(error) => {
            eprintln!("e2e: the cluster is not usable: {error}");
            return 1;
        }
    };
    let passes = cluster.further_passes().to_vec();
    println!(
        "e2e: {} ready in {:.1} s (namespace {}, pool {}, run {}); running {} scenarios, {} at once{}",
        cluster.description,
        started.elapsed().as_secs_f64(),
        cluster.namespace,
        cluster.pool,
        cluster.run,
        selected.len(),
        jobs(&args),
        passes
            .iter()
            .map(|pass| format!(", then again on pool {}", pass.pool))
            .collect::<String>()
    );

    let mut results: Vec<(String, Outcome)> = Vec::new();
    let mut interrupted = false;
    for pass in std::iter::once(None).chain(passes.iter().map(Some)) {
        if let Some(pass) = pass {
            // Every task of the pass before has ended: the run holds the only reference.
            let Some(only) = Arc::get_mut(&mut cluster) else {
                eprintln!("e2e: a scenario of the previous pass still holds the cluster");
                return 1;
            };
            println!(
                "e2e: pass on pool {} (template {}, runtimeClassName {})",
                pass.pool,
                pass.template,
                pass.runtime_class.as_deref().unwrap_or("unset")
            );
            let switched = tokio::select! {
                switched = only.switch_to(pass) => switched,
                _ = tokio::signal::ctrl_c() => {
                    eprintln!("e2e: interrupted; deleting what the scenarios made and stopping the cluster");
                    interrupted = true;
                    break;
                }
            };
            if let Err(error) = switched {
                results.push((
                    format!("pool {} Ready", pass.pool),
                    Outcome::Failed(error.to_string()),
                ));
                println!("FAILED  pool {} Ready", pass.pool);
                break;
            }
        }
        let label = pass
            .and_then(|pass| pass.runtime_class.as_deref())
            .map(|class| format!(" [{class}]"))
            .unwrap_or_default();
        tokio::select! {
            done = run_pass(&cluster, &selected, &label, jobs(&args)) => results.extend(done),
            _ = tokio::signal::ctrl_c() => {
                eprintln!("e2e: interrupted; deleting what the scenarios made and stopping the cluster");
                interrupted = true;
                break;
            }
        }
    }

    let left = match cluster.cleanup().await {
        Ok(left) => left,
        Err(error) => {
            eprintln!("e2e: cleanup failed: {error}");
            0
        }
    };
    let failures: Vec<_> = results
        .iter()
        .filter_map(|(s, o)| match o {
            Outcome::Failed(message) => Some((s, message)),
            _ => None,
        })
        .collect();
    for (name, message) in &failures {
        println!("\n---- {name} ----\n{message}");
    }
    let passed = results
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::Passed))
        .count();
    let skipped = results
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::Skipped(_)))
        .count();
    println!(
        "\ne2e on {}: {passed} passed, {skipped} skipped, {} failed in {:.1} s",
        cluster.description,
        failures.len(),
        started.elapsed().as_secs_f64()
    );
    if left > 0 {
        println!(
            "e2e: deleted {left} object(s) the scenarios left behind (label {}={})",
            crate::support::RUN_LABEL,
            cluster.run
        );
    }
    if args.keep && !interrupted {
        // Inside the run's own network namespace, the API server is reached through it.
        let enter = if crate::netns::inside() {
            crate::netns::enter_command()
        } else {
            String::new()
        };
        println!(
            "e2e: --keep: {} stays up until Ctrl-C; try\n  {enter}kubectl --kubeconfig {} get nodes,pods -A",
            cluster.description,
            cluster.kubeconfig.display()
        );
        let _ = tokio::signal::ctrl_c().await;
    }
    if let Ok(cluster) = Arc::try_unwrap(cluster) {
        cluster.stop().await;
    }
    if interrupted {
        return INTERRUPTED;
    }
    i32::from(!failures.is_empty())
}

/// Runs `selected` on `cluster`'s current pool, `jobs` at once, printing a line for each as
/// it ends; `label` follows each name in the report (`[gvisor]`).
async fn run_pass(
    cluster: &Arc<ClusterUnderTest>,
    selected: &[Scenario],
    label: &str,
    jobs: usize,
) -> Vec<(String, Outcome)> {
    futures_util::stream::iter(selected.iter().copied().map(|scenario| {
        let cluster = cluster.clone();
        let name = format!("{}{label}", scenario.name);
        async move {
            let began = Instant::now();
            let task = tokio::spawn(async move {
                let cluster = cluster;
                tokio::time::timeout(SCENARIO_LIMIT, (scenario.run)(&cluster)).await
            });
            let outcome = match task.await {
                Ok(Ok(Ok(Verdict::Passed))) => Outcome::Passed,
                Ok(Ok(Ok(Verdict::Skipped(reason)))) => Outcome::Skipped(reason),
                Ok(Ok(Err(error))) => Outcome::Failed(error.to_string()),
                Ok(Err(_)) => Outcome::Failed(format!(
                    "did not finish within {} s",
                    SCENARIO_LIMIT.as_secs()
                )),
                Err(join) => Outcome::Failed(format!("panicked: {join}")),
            };
            let took = began.elapsed();
            match &outcome {
                Outcome::Passed => println!("ok      {name} ({:.1} s)", took.as_secs_f64()),
                Outcome::Skipped(reason) => println!("skipped {name}: {reason}"),
                Outcome::Failed(_) => println!("FAILED  {name} ({:.1} s)", took.as_secs_f64()),
            }
            (name, outcome)
        }
    }))
    .buffer_unordered(jobs)
    .collect()
    .await
}

/// The exit code of a run ended by Ctrl-C (128 + SIGINT, as shells report it).
const INTERRUPTED: i32 = 130;

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Result<Args, String> {
        parse(words.iter().map(|w| (*w).to_owned()))
    }

    #[test]
    fn filters_flags_and_harness_options_are_told_apart() {
        let parsed = args(&[
            "sdk",
            "--nocapture",
            "--test-threads",
            "2",
            "--jobs",
            "3",
            "cli",
        ])
        .unwrap_or_default();
        assert_eq!(parsed.filters, ["sdk", "cli"]);
        assert_eq!(parsed.jobs, Some(3));
        assert!(!parsed.keep);
        assert!(args(&["--frobnicate"]).is_err());
        assert!(args(&["--jobs"]).is_err());
        let plane = args(&["--control-plane", "--keep"]).unwrap_or_default();
        assert!(plane.keep);
        assert!(matches!(
            plane.target,
            Some(Target::ControlPlane(
                crate::plane_target::Install::Kustomize
            ))
        ));
        let helm = args(&["--helm", "--control-plane"]).unwrap_or_default();
        assert!(matches!(
            helm.target,
            Some(Target::ControlPlane(crate::plane_target::Install::Helm))
        ));
        assert!(args(&["--helm"]).is_err());
    }

    #[test]
    fn every_scenario_has_a_unique_name_in_its_area() {
        let names: Vec<&str> = scenarios::all().iter().map(|s| s.name).collect();
        let unique: std::collections::BTreeSet<&str> = names.iter().copied().collect();
        assert_eq!(unique.len(), names.len());
        for area in ["controller::", "sdk::", "cli::", "agent::", "network::"] {
            assert!(names.iter().any(|n| n.starts_with(area)), "{area}");
        }
    }
}
