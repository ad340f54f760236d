//! Cases for `crates/controller`, against the release `kube-sim` with the release
//! `agent-sandbox-controller` running as its own process (as in a cluster), driven by a kube-rs
//! client: warm-claim latency and API writes per warm claim, a pool of 200 filled from zero, and
//! the controller's memory with 10,000 Sandboxes in its cache.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agent_sandbox_api::claim::SandboxWarmPoolRef;
use agent_sandbox_api::conditions::claim as claim_cond;
use agent_sandbox_api::sandbox::{OperatingMode, PodTemplate, SandboxBlueprint};
use agent_sandbox_api::warm_pool::SandboxTemplateRef;
use agent_sandbox_api::{
    Sandbox, SandboxClaim, SandboxClaimSpec, SandboxSpec, SandboxTemplate, SandboxTemplateSpec,
    SandboxWarmPool, SandboxWarmPoolSpec,
};
use agent_sandbox_local::testkit::http::get;
use agent_sandbox_local::{DEFAULT_POOL, DEFAULT_TEMPLATE};
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Api, Client};

use super::{Case, Options, Row, Samples, format_duration};

pub(super) fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "controller/warm-claim",
            about: "claim created -> claim Ready from a full warm pool (100 claims), and API writes per claim",
            run: warm_claim,
        },
        Case {
            name: "controller/pool-200",
            about: "a SandboxWarmPool of 200 filled from zero (runtime pods in the sim)",
            run: pool_200,
        },
        Case {
            name: "controller/rss-10k",
            about: "controller memory with 10,000 (Suspended) Sandboxes in its cache",
            run: rss_10k,
        },
    ]
}

const NS: &str = agent_sandbox_local::DEFAULT_NAMESPACE;

fn build(root: &Path) -> Result<PathBuf> {
    super::build_release(
        root,
        &["kube-sim", "sandbox-runtime", "agent-sandbox-controller"],
    )
}

/// A child process killed on drop.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Process {
    fn memory(&self) -> Result<(u64, u64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.0.id()))?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
                .unwrap_or(0)
        };
        Ok((field("VmRSS:"), field("VmHWM:")))
    }
}

fn mib(kib: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let value = kib as f64 / 1024.0;
    format!("{value:.1} MiB")
}

/// The release `kube-sim` and (optionally) the release `agent-sandbox-controller` as child
/// processes of the bench, with a client of the sim: the controller measured as it runs in a
/// cluster, in its own process.
struct SimAndControllerProcesses {
    _sim: Process,
    controller: Option<Process>,
    client: Client,
    kubeconfig: PathBuf,
    bin: PathBuf,
    _dir: PathBuf,
}

impl Drop for SimAndControllerProcesses {
    fn drop(&mut self) {
        self.controller = None;
        let _ = std::fs::remove_dir_all(&self._dir);
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl SimAndControllerProcesses {
    async fn start(root: &Path, name: &str, with_controller: bool) -> Result<Self> {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let bin = build(root)?;
        let dir =
            std::env::temp_dir().join(format!("bench-controller-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let kubeconfig = dir.join("kubeconfig");
        let sim = Process(
            Command::new(bin.join("kube-sim"))
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("failed to start kube-sim")?,
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while !kubeconfig.exists() {
            if Instant::now() > deadline {
                bail!("kube-sim did not write {} within 30s", kubeconfig.display());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let text = std::fs::read_to_string(&kubeconfig)?;
        // The kubeconfig carries the sim's certificate authority and the administrator's token.
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::from_yaml(&text)?,
            &kube::config::KubeConfigOptions::default(),
        )
        .await?;
        let client = Client::try_from(config)?;
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in agent_sandbox_api::crds::all() {
            crds.create(&PostParams::default(), &crd)
                .await
                .context("failed to register a CRD")?;
        }
        let mut cluster = Self {
            _sim: sim,
            controller: None,
            client,
            kubeconfig,
            bin,
            _dir: dir,
        };
        if with_controller {
            cluster.start_controller().await?;
        }
        Ok(cluster)
    }

    async fn start_controller(&mut self) -> Result<()> {
        let port = free_port()?;
        let child = Command::new(self.bin.join("agent-sandbox-controller"))
            .args(["--leader-elect=false", "--metrics-bind-address", "0"])
            .arg("--health-probe-bind-address")
            .arg(format!("127.0.0.1:{port}"))
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("failed to start agent-sandbox-controller")?;
        self.controller = Some(Process(child));
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if get(&format!("http://{addr}/readyz"))
                .await
                .is_ok_and(|answer| answer.status == 200)
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the controller was not ready within 120s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The sim's request counters, by (verb, group, resource).
    async fn counts(&self) -> Result<BTreeMap<(String, String, String), u64>> {
        let body = self
            .client
            .request_text(http::Request::get("/sim/metrics").body(Vec::new())?)
            .await
            .context("failed to read the sim's request counters")?;
        let mut counts = BTreeMap::new();
        for line in body
            .lines()
            .filter(|l| l.starts_with("sim_api_requests_total{"))
        {
            let Some((labels, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let label = |name: &str| super::metric_label(labels, name);
            counts.insert(
                (label("verb"), label("group"), label("resource")),
                value.trim().parse().unwrap_or(0),
            );
        }
        Ok(counts)
    }
}

fn runtime_spec() -> PodSpec {
    PodSpec {
        containers: vec![Container {
            name: "runtime".into(),
            image: Some("python-runtime-sandbox:latest".into()),
            ..Container::default()
        }],
        ..PodSpec::default()
    }
}

async fn create_pool(client: &Client, replicas: i32) -> Result<()> {
    let template = SandboxTemplate::new(
        DEFAULT_TEMPLATE,
        SandboxTemplateSpec {
            blueprint: SandboxBlueprint {
                pod_template: PodTemplate {
                    spec: runtime_spec(),
                    ..PodTemplate::default()
                },
                ..SandboxBlueprint::default()
            },
            ..SandboxTemplateSpec::default()
        },
    );
    Api::<SandboxTemplate>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &template)
        .await?;
    let pool = SandboxWarmPool::new(
        DEFAULT_POOL,
        SandboxWarmPoolSpec {
            replicas,
            sandbox_template_ref: SandboxTemplateRef {
                name: DEFAULT_TEMPLATE.into(),
            },
            update_strategy: None,
            claim_defaults: None,
        },
    );
    Api::<SandboxWarmPool>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pool)
        .await?;
    Ok(())
}

async fn pool_full(client: &Client, replicas: i32, within: Duration) -> Result<()> {
    let pools: Api<SandboxWarmPool> = Api::namespaced(client.clone(), NS);
    let condition = move |pool: Option<&SandboxWarmPool>| {
        pool.and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.ready_replicas == replicas && s.replicas == replicas)
    };
    tokio::time::timeout(within, await_condition(pools, DEFAULT_POOL, condition))
        .await
        .with_context(|| {
            format!("the pool did not reach {replicas} ready members within {within:?}")
        })??;
    Ok(())
}

fn tokio_runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

const CLAIM_PATH: [(&str, &str, &str); 5] = [
    ("create", "extensions.agents.x-k8s.io", "sandboxclaims"),
    // The annotations upstream's tools read (sandbox-name, controller-first-observed-at).
    ("patch", "extensions.agents.x-k8s.io", "sandboxclaims"),
    (
        "apply",
        "extensions.agents.x-k8s.io",
        "sandboxclaims/status",
    ),
    ("patch", "agents.x-k8s.io", "sandboxes"),
    ("create", "events.k8s.io", "events"),
];

fn warm_claim(root: &Path, options: Options) -> Result<Vec<Row>> {
    tokio_runtime()?.block_on(async {
        let cluster = SimAndControllerProcesses::start(root, "warm-claim", true).await?;
        let replicas = 5;
        create_pool(&cluster.client, replicas).await?;
        pool_full(&cluster.client, replicas, Duration::from_secs(120)).await?;
        let claims: Api<SandboxClaim> = Api::namespaced(cluster.client.clone(), NS);
        let count = options.iterations(100);
        let mut samples = Samples::with_capacity(count);
        let mut claim_path_writes = 0u64;
        let mut all_writes = 0u64;
        for i in 0..count {
            pool_full(&cluster.client, replicas, Duration::from_secs(60)).await?;
            let before = cluster.counts().await?;
            let name = format!("bench-{i}");
            let claim = SandboxClaim::new(
                &name,
                SandboxClaimSpec { warm_pool_ref: SandboxWarmPoolRef { name: DEFAULT_POOL.into() }, ..SandboxClaimSpec::default() },
            );
            let start = Instant::now();
            claims.create(&PostParams::default(), &claim).await?;
            let ready = |claim: Option<&SandboxClaim>| {
                claim.and_then(|c| c.status.as_ref()).is_some_and(|s| {
                    !s.sandbox.name.is_empty()
                        && s.conditions.iter().any(|c| c.type_ == claim_cond::READY && c.status == "True")
                })
            };
            tokio::time::timeout(Duration::from_secs(30), await_condition(claims.clone(), &name, ready))
                .await
                .context("a warm claim was not Ready within 30s")??;
            samples.push(start.elapsed());
            // Let the follow-up passes run, so that a redundant write would be counted.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let after = cluster.counts().await?;
            let delta = |key: &(String, String, String)| after.get(key).copied().unwrap_or(0) - before.get(key).copied().unwrap_or(0);
            for (verb, group, resource) in CLAIM_PATH {
                claim_path_writes += delta(&(verb.to_owned(), group.to_owned(), resource.to_owned()));
            }
            all_writes += after
                .keys()
                .filter(|(verb, _, _)| ["create", "update", "patch", "apply", "delete", "deletecollection"].contains(&verb.as_str()))
                .map(delta)
                .sum::<u64>();
            claims.delete(&name, &DeleteParams::default()).await?;
        }
        #[allow(clippy::cast_precision_loss)]
        let per_claim = claim_path_writes as f64 / count as f64;
        #[allow(clippy::cast_precision_loss)]
        let per_claim_all = all_writes as f64 / count as f64;
        Ok(vec![
            Row::new("controller/warm-claim")
                .median(format_duration(samples.median()))
                .p99(format_duration(samples.p99()))
                .notes(format!("create -> Ready seen by a watch, {count} claims, pool of {replicas}")),
            Row::new("controller/writes-per-warm-claim").notes(format!(
                "{per_claim:.2} on the claim path (create, adoption patch, annotations, status, event); {per_claim_all:.2} including the pool's refill"
            )),
        ])
    })
}

fn pool_200(root: &Path, options: Options) -> Result<Vec<Row>> {
    tokio_runtime()?.block_on(async {
        let cluster = SimAndControllerProcesses::start(root, "pool-200", true).await?;
        let replicas = if options.quick { 20 } else { 200 };
        let start = Instant::now();
        create_pool(&cluster.client, replicas).await?;
        pool_full(&cluster.client, replicas, Duration::from_secs(600)).await?;
        let elapsed = start.elapsed();
        let (rss, peak) = cluster
            .controller
            .as_ref()
            .context("no controller")?
            .memory()?;
        #[allow(clippy::cast_precision_loss)]
        let rate = f64::from(replicas) / elapsed.as_secs_f64();
        Ok(vec![
            Row::new(format!("controller/pool-{replicas}"))
                .median(format_duration(elapsed))
                .throughput(format!("{rate:.1} sandboxes/s"))
                .peak_rss(mib(peak))
                .notes(format!(
                    "pool created -> {replicas} Ready members; controller RSS after: {}",
                    mib(rss)
                )),
        ])
    })
}

fn rss_10k(root: &Path, options: Options) -> Result<Vec<Row>> {
    tokio_runtime()?.block_on(async {
        let mut cluster = SimAndControllerProcesses::start(root, "rss-10k", false).await?;
        let count = options.iterations(10_000);
        let sandboxes: Api<Sandbox> = Api::namespaced(cluster.client.clone(), NS);
        let mut spec = SandboxSpec {
            blueprint: SandboxBlueprint {
                pod_template: PodTemplate { spec: runtime_spec(), ..PodTemplate::default() },
                ..SandboxBlueprint::default()
            },
            ..SandboxSpec::default()
        };
        spec.operating_mode = OperatingMode::Suspended;
        let names: Vec<String> = (0..count).map(|i| format!("s-{i:05}")).collect();
        for chunk in names.chunks(16) {
            let creations = chunk.iter().map(|name| {
                let sandboxes = sandboxes.clone();
                let sandbox = Sandbox::new(name, spec.clone());
                async move { sandboxes.create(&PostParams::default(), &sandbox).await }
            });
            for result in futures_util::future::join_all(creations).await {
                result.context("failed to create a Sandbox")?;
            }
        }
        let start = Instant::now();
        cluster.start_controller().await?;
        // Wait until every sandbox has been reconciled once (its status written).
        let key = ("apply".to_owned(), "agents.x-k8s.io".to_owned(), "sandboxes/status".to_owned());
        let deadline = Instant::now() + Duration::from_secs(600);
        while cluster.counts().await?.get(&key).copied().unwrap_or(0) < count as u64 {
            if Instant::now() > deadline {
                bail!("the controller did not reconcile {count} sandboxes within 600s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let settled = start.elapsed();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (rss, peak) = cluster.controller.as_ref().context("no controller")?.memory()?;
        Ok(vec![
            Row::new(format!("controller/rss-{}k", count / 1000))
                .peak_rss(mib(peak))
                .median(format_duration(settled))
                .notes(format!("RSS {} with {count} Suspended Sandboxes cached; median column = start -> all reconciled", mib(rss))),
        ])
    })
}
