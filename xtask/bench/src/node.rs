//! Cases on the node tier: the control plane of [`super::control_plane`] with a real node
//! (`agent_sandbox_e2e::node::RealNode`: containerd, the real kubelet, kube-proxy, CNI, a
//! NetworkPolicy enforcer), `deploy/overlays/kind` applied, our OCI images imported, so the
//! controller, the routers and every sandbox are real containers. Each case measures under the
//! `runc` RuntimeClass and again under `gvisor`: claim to the first command's output, warm and
//! cold; a pool of 50 filled from empty; the resident memory of an idle sandbox pod.
//!
//! The sandboxes come from a copy of `deploy/sandboxes`' template with the pass's
//! `runtimeClassName` and a CPU request of [`CPU_REQUEST`] (the node has this machine's two
//! CPUs; the template's own request fits about six), and `deploy/sandboxes`' own pool is scaled
//! to none first. `cargo xtask bench node/` builds what the cases need (the node's programs,
//! the OCI images) and runs them as root in namespaces of their own
//! (`agent_sandbox_e2e::netns::Layout::Node`); they are not part of a bare `cargo xtask bench`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent_sandbox::ExecOptions;
use agent_sandbox_api::{SandboxTemplate, SandboxWarmPool};
use agent_sandbox_e2e::Install;
use agent_sandbox_e2e::plane_target::{NodeKind, PlaneCluster};
use agent_sandbox_local::testkit::Tool;
use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::control_plane::{control_plane_bin_dir, pool_full, sdk_client, tokio_runtime};
use super::{Case, Options, Row, Samples, format_duration};

/// The prefix of this tier's case names.
pub(super) const PREFIX: &str = "node/";
/// The namespace of `deploy/sandboxes`.
const NS: &str = "default";
/// `deploy/sandboxes`' template and pool.
const DEPLOYED_TEMPLATE: &str = "python-runtime";
const DEPLOYED_POOL: &str = "python-sandbox-pool";
/// The CPU each bench sandbox requests: fifty fit the node's two CPUs beside the controller
/// and the routers.
const CPU_REQUEST: &str = "10m";
/// The RuntimeClasses measured, in order.
const RUNTIMES: [&str; 2] = ["runc", "gvisor"];
/// A bound for each wait (not a speed assertion).
const WAIT: Duration = Duration::from_secs(600);

pub(super) fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "node/claim-to-first-output",
            about: "warm and cold claim -> the first command's output (echo), under runc and gVisor, on a real node",
            run: claim_to_first_output,
        },
        Case {
            name: "node/pool-50",
            about: "a pool of 50 created -> all members Ready, under runc and gVisor, on a real node",
            run: pool_50,
        },
        Case {
            name: "node/idle-rss",
            about: "resident memory of an idle sandbox pod's processes (runtime and pause), under runc and gVisor",
            run: idle_rss,
        },
    ]
}

const NOTES_SETUP: &str = "SDK (direct) to one router pod (--auth scoped); real kube-apiserver, kube-scheduler, containerd, kubelet, kube-proxy and CNI; controller, routers and sandboxes as containers of our OCI images";

/// The control plane and the real node, with `deploy/sandboxes`' pool scaled to none.
async fn start() -> Result<PlaneCluster> {
    let bin_dir = control_plane_bin_dir()?;
    let tools = Tool::node_dir().with_context(|| {
        Tool::Node
            .unavailable()
            .unwrap_or_else(|| "the node's programs are missing".to_owned())
    })?;
    let images = std::env::var_os(agent_sandbox_e2e::env::IMAGES)
        .map(PathBuf::from)
        .with_context(|| {
            format!(
                "the node cases need our images: {} names their OCI archive (`cargo xtask \
                 bench node/` builds it)",
                agent_sandbox_e2e::env::IMAGES
            )
        })?;
    let cluster = PlaneCluster::start_with(
        &bin_dir,
        Install::Kustomize,
        NodeKind::Real {
            tools,
            images: vec![images],
        },
    )
    .await
    .context("the node tier did not start")?;
    let client = cluster.client().await?;
    scale(&client, DEPLOYED_POOL, 0).await?;
    Ok(cluster)
}

/// Runs `measure` on a freshly started node tier, stopping it either way.
fn on_node<F>(measure: F) -> Result<Vec<Row>>
where
    F: AsyncFnOnce(&PlaneCluster, &Client) -> Result<Vec<Row>>,
{
    tokio_runtime()?.block_on(async {
        let cluster = start().await?;
        let outcome = match cluster.client().await {
            Ok(client) => measure(&cluster, &client).await,
            Err(error) => Err(error.into()),
        };
        cluster.stop().await;
        outcome
    })
}

/// A copy of `deploy/sandboxes`' template named `bench-<runtime>`, under that RuntimeClass,
/// requesting [`CPU_REQUEST`] per container; returns its name.
async fn template_for(client: &Client, runtime: &str) -> Result<String> {
    let templates: Api<SandboxTemplate> = Api::namespaced(client.clone(), NS);
    let original = templates
        .get(DEPLOYED_TEMPLATE)
        .await
        .with_context(|| format!("SandboxTemplate {NS}/{DEPLOYED_TEMPLATE}"))?;
    let mut spec = serde_json::to_value(&original.spec)?;
    let pod = spec
        .pointer_mut("/podTemplate/spec")
        .context("the template has no pod spec")?;
    pod["runtimeClassName"] = json!(runtime);
    if let Some(containers) = pod["containers"].as_array_mut() {
        for container in containers {
            container["resources"]["requests"]["cpu"] = json!(CPU_REQUEST);
        }
    }
    let name = format!("bench-{runtime}");
    let copy: SandboxTemplate = serde_json::from_value(json!({
        "apiVersion": agent_sandbox_api::EXTENSIONS_API_VERSION,
        "kind": agent_sandbox_api::kinds::SANDBOX_TEMPLATE,
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }))?;
    templates
        .patch(
            &name,
            &PatchParams::apply("agent-sandbox-bench").force(),
            &Patch::Apply(&copy),
        )
        .await
        .with_context(|| format!("create SandboxTemplate {name}"))?;
    Ok(name)
}

/// Creates pool `name` of `replicas` on `template`.
async fn create_pool(client: &Client, template: &str, name: &str, replicas: i32) -> Result<()> {
    let pool: SandboxWarmPool = serde_json::from_value(json!({
        "apiVersion": agent_sandbox_api::EXTENSIONS_API_VERSION,
        "kind": agent_sandbox_api::kinds::SANDBOX_WARM_POOL,
        "metadata": {"name": name, "namespace": NS},
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": template}},
    }))?;
    Api::<SandboxWarmPool>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pool)
        .await
        .with_context(|| format!("create SandboxWarmPool {name}"))?;
    Ok(())
}

/// Sets pool `name`'s replicas and waits until it has that many members, all Ready.
async fn scale(client: &Client, name: &str, replicas: i32) -> Result<()> {
    Api::<SandboxWarmPool>::namespaced(client.clone(), NS)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .with_context(|| format!("scale SandboxWarmPool {name} to {replicas}"))?;
    pool_full(client, name, replicas, WAIT).await
}

/// Claim -> `echo 42`'s output, with the sandbox closed afterwards.
async fn claim_and_echo(sdk: &agent_sandbox::Client, pool: &str) -> Result<Duration> {
    let started = Instant::now();
    let sandbox = sdk.create_sandbox(pool).await?;
    let answer = sandbox
        .run_with(ExecOptions::new("echo 42").timeout(Duration::from_secs(60)))
        .await;
    let took = started.elapsed();
    sandbox.close().await?;
    let answer = answer.with_context(|| format!("echo 42 in a sandbox of {pool}"))?;
    ensure!(
        answer.exit_code == 0 && answer.stdout.trim() == "42",
        "echo 42 in a sandbox of {pool} gave exit {} and {:?} (stderr {:?})",
        answer.exit_code,
        answer.stdout,
        answer.stderr
    );
    Ok(took)
}

fn claim_to_first_output(_root: &Path, options: Options) -> Result<Vec<Row>> {
    on_node(async |cluster, client| {
        let sdk = sdk_client(cluster, client).await?;
        let (warm_claims, cold_claims, replicas) =
            (options.iterations(50), options.iterations(20), 3);
        let mut rows = Vec::new();
        for runtime in RUNTIMES {
            let template = template_for(client, runtime).await?;
            let (warm_pool, cold_pool) = (format!("{template}-warm"), format!("{template}-cold"));
            create_pool(client, &template, &warm_pool, replicas).await?;
            create_pool(client, &template, &cold_pool, 0).await?;
            let mut warm = Samples::with_capacity(warm_claims);
            for _ in 0..warm_claims {
                pool_full(client, &warm_pool, replicas, WAIT).await?;
                warm.push(claim_and_echo(&sdk, &warm_pool).await?);
            }
            scale(client, &warm_pool, 0).await?;
            let mut cold = Samples::with_capacity(cold_claims);
            for _ in 0..cold_claims {
                cold.push(claim_and_echo(&sdk, &cold_pool).await?);
            }
            eprintln!(
                "bench: {runtime}: warm median {}, cold median {}",
                format_duration(warm.median()),
                format_duration(cold.median())
            );
            rows.push(
                Row::new(format!("node/claim-to-first-output/{runtime}/warm"))
                    .median(format_duration(warm.median()))
                    .p99(format_duration(warm.p99()))
                    .notes(format!(
                        "{} x create_sandbox from a full pool of {replicas} -> Ready -> \
                         run(\"echo 42\") answered with 42 (runtimeClassName {runtime}); \
                         {NOTES_SETUP}",
                        warm.len()
                    )),
            );
            rows.push(
                Row::new(format!("node/claim-to-first-output/{runtime}/cold"))
                    .median(format_duration(cold.median()))
                    .p99(format_duration(cold.p99()))
                    .notes(format!(
                        "{} x create_sandbox from a pool of 0 (pod created, scheduled, \
                         sandbox and container started, readiness probe passed) -> \
                         run(\"echo 42\") answered with 42 (runtimeClassName {runtime}); \
                         {NOTES_SETUP}",
                        cold.len()
                    )),
            );
        }
        Ok(rows)
    })
}

fn pool_50(_root: &Path, options: Options) -> Result<Vec<Row>> {
    on_node(async |_cluster, client| {
        let replicas = i32::try_from(options.iterations(50)).unwrap_or(50);
        let mut rows = Vec::new();
        for runtime in RUNTIMES {
            let template = template_for(client, runtime).await?;
            let pool = format!("{template}-pool-{replicas}");
            let started = Instant::now();
            create_pool(client, &template, &pool, replicas).await?;
            pool_full(client, &pool, replicas, WAIT).await?;
            let took = started.elapsed();
            #[allow(clippy::cast_precision_loss)]
            let rate = f64::from(replicas) / took.as_secs_f64();
            eprintln!("bench: {runtime}: {replicas} Ready in {took:.1?}");
            rows.push(
                Row::new(format!("node/pool-{replicas}/{runtime}"))
                    .median(format_duration(took))
                    .throughput(format!("{rate:.1} sandboxes/s"))
                    .notes(format!(
                        "pool of {replicas} created -> all members Ready (scheduled by \
                         kube-scheduler, pods started by containerd under runtimeClassName \
                         {runtime}, readiness probes passed), requests of {CPU_REQUEST} CPU \
                         each on a node of two CPUs; {NOTES_SETUP}"
                    )),
            );
            scale(client, &pool, 0).await?;
        }
        Ok(rows)
    })
}

fn idle_rss(_root: &Path, _options: Options) -> Result<Vec<Row>> {
    on_node(async |cluster, client| {
        let sdk = sdk_client(cluster, client).await?;
        let mut rows = Vec::new();
        for runtime in RUNTIMES {
            let template = template_for(client, runtime).await?;
            let pool = format!("{template}-idle");
            create_pool(client, &template, &pool, 1).await?;
            pool_full(client, &pool, 1, WAIT).await?;
            let sandbox = sdk.create_sandbox(&pool).await?;
            let measured = async {
                sandbox.run("true").await?;
                // Idle: the answer sent, nothing running since.
                tokio::time::sleep(Duration::from_secs(5)).await;
                let pod = Api::<Pod>::namespaced(client.clone(), NS)
                    .get(sandbox.pod_name())
                    .await?;
                let uid = pod.metadata.uid.context("the pod has no uid")?;
                pod_memory(&uid)
            }
            .await;
            let _ = sandbox.close().await;
            let memory = measured?;
            rows.push(
                Row::new(format!("node/idle-rss/{runtime}"))
                    .median(super::runtime::mib(memory.pss))
                    .peak_rss(super::runtime::mib(memory.pss))
                    .notes(format!(
                        "PSS summed over the processes of a claimed sandbox's pod cgroup (each \
                         page once; VmRSS summed: {}), 5 s after run(\"true\") \
                         (runtimeClassName {runtime}): {}; {NOTES_SETUP}",
                        super::runtime::mib(memory.rss),
                        memory.processes
                    )),
            );
        }
        Ok(rows)
    })
}

/// What the processes of one pod hold in memory.
struct PodMemory {
    /// Proportional set sizes summed (KiB): every page once, shared ones split among their
    /// users (gVisor's sentry and its stubs map the same guest memory).
    pss: u64,
    /// VmRSS summed (KiB): shared pages once per process.
    rss: u64,
    /// Each process: its name and PSS.
    processes: String,
}

/// The memory of every process in the pod's cgroup, found by the pod's uid in the memory
/// hierarchy of the run's node cgroup.
fn pod_memory(uid: &str) -> Result<PodMemory> {
    let cgroup = std::env::var(agent_sandbox_e2e::netns::NODE_CGROUP_ENV)
        .context("not inside the node tier's namespaces")?;
    let root = Path::new("/sys/fs/cgroup/memory").join(cgroup.trim_start_matches('/'));
    // cgroupfs names it `pod<uid>`, the systemd driver `…-pod<uid with underscores>.slice`.
    let names = [format!("pod{uid}"), format!("pod{}", uid.replace('-', "_"))];
    let pod_dir = find_dir(&root, &names, 6)
        .with_context(|| format!("no cgroup of pod {uid} under {}", root.display()))?;
    let mut pids = Vec::new();
    collect_procs(&pod_dir, &mut pids)?;
    if pids.is_empty() {
        bail!("the cgroup {} holds no process", pod_dir.display());
    }
    let mut memory = PodMemory {
        pss: 0,
        rss: 0,
        processes: String::new(),
    };
    let mut seen = Vec::new();
    for pid in pids {
        let kib = |file: &str, key: &str| {
            std::fs::read_to_string(format!("/proc/{pid}/{file}"))
                .ok()
                .and_then(|text| {
                    text.lines()
                        .find_map(|line| line.strip_prefix(key))
                        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
                })
        };
        let (Some(pss), Some(rss)) = (kib("smaps_rollup", "Pss:"), kib("status", "VmRSS:")) else {
            continue;
        };
        // runsc re-executes itself (`exe`): its first argument names the part.
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let name = cmdline
            .split(|byte| *byte == 0)
            .next()
            .map(|arg0| {
                String::from_utf8_lossy(arg0)
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            })
            .unwrap_or_default();
        // gVisor's stubs (systrap) have no arguments.
        let name = if name.is_empty() {
            "stub".to_owned()
        } else {
            name
        };
        memory.pss += pss;
        memory.rss += rss;
        seen.push(format!("{name} {}", super::runtime::mib(pss)));
    }
    memory.processes = seen.join(", ");
    Ok(memory)
}

fn find_dir(dir: &Path, names: &[String], depth: usize) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    let children: Vec<PathBuf> = entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.is_dir())
        .collect();
    for child in &children {
        let name = child.file_name()?.to_string_lossy();
        if names.iter().any(|wanted| name.contains(wanted.as_str())) {
            return Some(child.clone());
        }
    }
    if depth == 0 {
        return None;
    }
    children
        .iter()
        .find_map(|child| find_dir(child, names, depth - 1))
}

fn collect_procs(dir: &Path, pids: &mut Vec<u32>) -> Result<()> {
    let procs = dir.join("cgroup.procs");
    let text =
        std::fs::read_to_string(&procs).with_context(|| format!("read {}", procs.display()))?;
    pids.extend(
        text.lines()
            .filter_map(|line| line.trim().parse::<u32>().ok()),
    );
    for entry in std::fs::read_dir(dir)?.flatten() {
        if entry.path().is_dir() {
            collect_procs(&entry.path(), pids)?;
        }
    }
    Ok(())
}
