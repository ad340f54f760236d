//! System tests: the controller against the simulated cluster, with the real runtime as the pod
//! process of every sandbox (`agent_sandbox_local`'s in-process cluster, without a router or
//! default objects).
//!
//! Each test starts its own cluster and controller; dropping the harness stops the controller and
//! the sim, which kills every pod process.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use agent_sandbox_api::claim::{ClaimLifecycle, ClaimShutdownPolicy, EnvVar, SandboxWarmPoolRef};
use agent_sandbox_api::conditions::{
    claim as claim_cond, events as event_reasons, sandbox as sandbox_cond, warm_pool as pool_cond,
};
use agent_sandbox_api::sandbox::{
    EmbeddedObjectMetadata, OperatingMode, PersistentVolumeClaimTemplate, PodTemplate,
    SandboxBlueprint, ShutdownPolicy,
};
use agent_sandbox_api::template::EnvVarsInjectionPolicy;
use agent_sandbox_api::warm_pool::SandboxTemplateRef;
use agent_sandbox_api::{
    Sandbox, SandboxClaim, SandboxClaimSpec, SandboxSpec, SandboxTemplate, SandboxTemplateSpec,
    SandboxWarmPool, SandboxWarmPoolSpec, labels, name_hash,
};
use agent_sandbox_controller::Config;
use agent_sandbox_controller::config::LeaderElection;
use agent_sandbox_local::testkit::{self, Check};
use agent_sandbox_local::{ControllerTask, LocalCluster, LocalConfig, PodNetworks};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, PersistentVolumeClaim, PersistentVolumeClaimSpec, Pod, PodSpec,
    VolumeResourceRequirements,
};
use k8s_openapi::api::events::v1::Event as KubeEvent;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ApiResource, DynamicObject};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tokio::task::JoinHandle;

const NS: &str = "default";
const WAIT: Duration = Duration::from_secs(60);

struct Harness {
    cluster: LocalCluster,
    client: Client,
}

impl Harness {
    async fn start() -> Self {
        Self::start_with(Config::default()).await
    }

    async fn start_with(config: Config) -> Self {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new(
                        "agent_sandbox_controller=debug,kube_runtime=debug",
                    )
                }),
            )
            .with_test_writer()
            .try_init();
        let cluster = LocalCluster::start(LocalConfig {
            runtime: testkit::runtime_program().unwrap(),
            controller: Some(config),
            // These tests run commands in pods at their IPs from this process, which a pod's
            // network of its own (loopback only, the default) does not let through.
            networks: PodNetworks::Host,
            ..LocalConfig::api_only()
        })
        .await
        .unwrap();
        let client = cluster.client();
        Self { cluster, client }
    }

    /// Starts the controller again in this process (after a stop or a kill).
    fn start_controller(&mut self) {
        self.cluster.start_controller();
    }

    /// Stops the controller the way SIGTERM does (graceful shutdown) and waits for it to end;
    /// the controller's own failure fails the test.
    async fn stop_controller(&mut self) {
        self.cluster.stop_controller(WAIT).await.unwrap();
    }

    /// Kills the controller abruptly (in-flight requests are dropped), as a crash would.
    fn kill_controller(&mut self) {
        self.cluster.kill_controller();
    }

    /// A guard that prints sandboxes, pods and pod logs if the test panics.
    fn dump_on_panic(&self) -> DumpOnPanic {
        let sandboxes: Api<Sandbox> = self.api();
        let pods: Api<Pod> = self.api();
        DumpOnPanic(Some(Box::pin(async move {
            for s in sandboxes.list(&Default::default()).await.unwrap().items {
                eprintln!(
                    "sandbox {} owner={:?} status={:?}",
                    s.name_any(),
                    s.metadata.owner_references.map(|o| o[0].kind.clone()),
                    s.status.map(|st| st
                        .conditions
                        .iter()
                        .map(|c| format!("{}={}/{}: {}", c.type_, c.status, c.reason, c.message))
                        .collect::<Vec<_>>())
                );
            }
            for p in pods.list(&Default::default()).await.unwrap().items {
                let name = p.name_any();
                eprintln!(
                    "pod {name} uid={:?} deleting={} status={:#?}",
                    p.metadata.uid,
                    p.metadata.deletion_timestamp.is_some(),
                    p.status
                );
                if let Ok(log) = pods.logs(&name, &Default::default()).await {
                    eprintln!("pod {name} log:\n{log}");
                }
            }
        })))
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), NS)
    }
}

/// Aborts a task when dropped, so that a failing test leaves nothing running.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Prints cluster state when a wait fails, to tell a slow cluster from a stuck controller.
struct DumpOnPanic(Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>);

impl Drop for DumpOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(dump) = self.0.take()
        {
            let handle = tokio::runtime::Handle::current();
            std::thread::scope(|scope| {
                scope.spawn(|| handle.block_on(dump));
            });
        }
    }
}

/// Polls `get` until `check` holds, for at most [`WAIT`]; the timeout shows the last value seen.
async fn wait_for<T, F, Fut>(what: &str, mut get: F, check: impl Fn(&T) -> bool) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
    T: std::fmt::Debug,
{
    let check = &check;
    let found = testkit::wait_for(what, WAIT, || {
        let value = get();
        async move {
            Ok::<_, testkit::Timeout>(match value.await {
                Some(value) if check(&value) => Check::Done(value),
                seen => Check::NotYet(format!("{seen:#?}")),
            })
        }
    });
    found.await.unwrap_or_else(|timeout| panic!("{timeout}"))
}

async fn get<K>(api: &Api<K>, name: &str) -> Option<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await.unwrap()
}

fn runtime_pod_spec() -> PodSpec {
    PodSpec {
        containers: vec![Container {
            name: "runtime".into(),
            image: Some("registry.example.com/python-runtime:latest".into()),
            ports: Some(vec![ContainerPort {
                container_port: 8888,
                ..ContainerPort::default()
            }]),
            ..Container::default()
        }],
        ..PodSpec::default()
    }
}

fn template(name: &str) -> SandboxTemplate {
    SandboxTemplate::new(
        name,
        SandboxTemplateSpec {
            blueprint: SandboxBlueprint {
                pod_template: PodTemplate {
                    spec: runtime_pod_spec(),
                    ..PodTemplate::default()
                },
                ..SandboxBlueprint::default()
            },
            ..SandboxTemplateSpec::default()
        },
    )
}

fn pool(name: &str, template: &str, replicas: i32) -> SandboxWarmPool {
    SandboxWarmPool::new(
        name,
        SandboxWarmPoolSpec {
            replicas,
            sandbox_template_ref: SandboxTemplateRef {
                name: template.into(),
            },
            update_strategy: None,
            claim_defaults: None,
        },
    )
}

fn claim(name: &str, pool: &str) -> SandboxClaim {
    let mut claim = SandboxClaim::new(
        name,
        SandboxClaimSpec {
            warm_pool_ref: SandboxWarmPoolRef { name: pool.into() },
            ..SandboxClaimSpec::default()
        },
    );
    claim.metadata.labels = Some(BTreeMap::from([(
        labels::CREATED_BY.into(),
        labels::CREATED_BY_RUST_CLIENT.into(),
    )]));
    claim
}

fn sandbox(name: &str) -> Sandbox {
    Sandbox::new(
        name,
        SandboxSpec {
            blueprint: SandboxBlueprint {
                pod_template: PodTemplate {
                    spec: runtime_pod_spec(),
                    ..PodTemplate::default()
                },
                ..SandboxBlueprint::default()
            },
            ..SandboxSpec::default()
        },
    )
}

fn condition_is(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
    status: &str,
    reason: &str,
) -> bool {
    conditions.iter().any(|c| {
        c.type_ == type_ && c.status == status && (reason.is_empty() || c.reason == reason)
    })
}

fn claim_ready(claim: &SandboxClaim) -> bool {
    claim.status.as_ref().is_some_and(|s| {
        !s.sandbox.name.is_empty() && condition_is(&s.conditions, claim_cond::READY, "True", "")
    })
}

fn sandbox_ready(sandbox: &Sandbox) -> bool {
    sandbox
        .status
        .as_ref()
        .is_some_and(|s| condition_is(&s.conditions, sandbox_cond::READY, "True", ""))
}

async fn create<K>(api: &Api<K>, object: &K) -> K
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.create(&PostParams::default(), object).await.unwrap()
}

async fn ready_pool(h: &Harness, name: &str, replicas: i32) -> SandboxWarmPool {
    let pools: Api<SandboxWarmPool> = h.api();
    let _dump = h.dump_on_panic();
    wait_for(
        &format!("pool {name} to have {replicas} ready members"),
        || get(&pools, name),
        |p: &SandboxWarmPool| {
            p.status
                .as_ref()
                .is_some_and(|s| s.ready_replicas == replicas && s.replicas == replicas)
        },
    )
    .await
}

/// Runs `command` (legacy `/execute`) in the pod at `ip`.
async fn execute(ip: &str, command: &str) -> serde_json::Value {
    let url = format!("http://{ip}:8888/execute");
    testkit::http::post_json(&url, &json!({"command": command}))
        .await
        .unwrap()
        .json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_fills_and_a_claim_adopts_a_running_member_then_the_pool_refills() {
    let h = Harness::start().await;
    create(&h.api(), &template("python")).await;
    create(&h.api(), &pool("pool", "python", 3)).await;
    ready_pool(&h, "pool", 3).await;

    let sandboxes: Api<Sandbox> = h.api();
    let pods: Api<Pod> = h.api();
    let members: Vec<Sandbox> = sandboxes.list(&Default::default()).await.unwrap().items;
    assert_eq!(members.len(), 3);
    let member_pods = pods.list(&Default::default()).await.unwrap().items;
    // Upstream's labels: a member's pod names its pool, so that a router reading pods only
    // refuses it.
    for pod in &member_pods {
        assert_eq!(
            pod.labels().get(labels::WARM_POOL_SANDBOX),
            Some(&name_hash("pool")),
            "{}",
            pod.name_any()
        );
    }
    let pod_uids: BTreeMap<String, String> = member_pods
        .into_iter()
        .map(|p| (p.name_any(), p.metadata.uid.unwrap()))
        .collect();

    let claims: Api<SandboxClaim> = h.api();
    create(&claims, &claim("claim-a", "pool")).await;
    let ready = wait_for(
        "claim-a to be Ready",
        || get(&claims, "claim-a"),
        claim_ready,
    )
    .await;
    let name = ready.status.as_ref().unwrap().sandbox.name.clone();
    assert!(
        name.starts_with("pool-"),
        "a warm member keeps its name, got {name}"
    );
    assert!(
        pod_uids.contains_key(&name),
        "{name} was one of the pool's members"
    );

    let adopted = get(&sandboxes, &name).await.unwrap();
    let owner = &adopted.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        (agent_sandbox_api::kinds::SANDBOX_CLAIM, "claim-a")
    );
    assert_eq!(
        adopted
            .labels()
            .get(labels::LAUNCH_TYPE)
            .map(String::as_str),
        Some("warm")
    );
    assert_eq!(
        adopted.labels().get(labels::CLAIM_UID),
        ready.metadata.uid.as_ref()
    );
    assert!(!adopted.labels().contains_key(labels::WARM_POOL_SANDBOX));
    assert_eq!(
        adopted
            .annotations()
            .get(agent_sandbox_api::annotations::POD_NAME),
        Some(&name)
    );

    // Same pod, still running: adoption did not restart it; the pool label goes.
    let pod = wait_for(
        "the adopted member's pod to lose the pool label",
        || get(&pods, &name),
        |pod: &Pod| !pod.labels().contains_key(labels::WARM_POOL_SANDBOX),
    )
    .await;
    assert_eq!(pod.metadata.uid.as_ref(), pod_uids.get(&name));
    let ip = &ready.status.as_ref().unwrap().sandbox.pod_ips[0];
    assert_eq!(
        execute(ip, "echo still-here").await["stdout"],
        "still-here\n"
    );

    // The pool refills to three unclaimed members.
    wait_for(
        "a fourth sandbox",
        || async {
            Some(
                sandboxes
                    .list(&Default::default())
                    .await
                    .unwrap()
                    .items
                    .len(),
            )
        },
        |n| *n == 4,
    )
    .await;
    let pools: Api<SandboxWarmPool> = h.api();
    wait_for(
        "the pool to have 3 ready members again",
        || get(&pools, "pool"),
        |p: &SandboxWarmPool| {
            p.status
                .as_ref()
                .is_some_and(|s| s.ready_replicas == 3 && s.replicas == 3)
        },
    )
    .await;
    let members = sandboxes.list(&Default::default()).await.unwrap().items;
    assert_eq!(members.iter().filter(|s| sandbox_ready(s)).count(), 4);
}

/// API writes other than the pools' status applies (which the write counts below keep apart).
fn writes_but_pool_status(h: &Harness) -> u64 {
    let counts = h.cluster.request_counts();
    counts.writes()
        - counts.get(
            "apply",
            "extensions.agents.x-k8s.io",
            "sandboxwarmpools/status",
        )
}

/// Waits until no write (but the pools' status) has happened for three looks in a row, 100 ms
/// apart; at most 10 s.
async fn quiet(h: &Harness) {
    let mut last = writes_but_pool_status(h);
    let mut unchanged = 0;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = writes_but_pool_status(h);
        if now == last {
            unchanged += 1;
            if unchanged == 3 {
                return;
            }
        } else {
            (last, unchanged) = (now, 0);
        }
    }
    panic!("the API saw writes for 10 s on end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_claim_costs_six_writes_with_upstreams_labels_and_annotations() {
    let h = Harness::start().await;
    create(&h.api(), &template("python")).await;
    create(&h.api(), &pool("pool", "python", 1)).await;
    ready_pool(&h, "pool", 1).await;
    // Without its template the pool cannot refill, so the writes below are the claim's alone
    // (plus the pool's own status, counted separately).
    let templates: Api<SandboxTemplate> = h.api();
    templates
        .delete("python", &DeleteParams::default())
        .await
        .unwrap();
    let policies: Api<NetworkPolicy> = h.api();
    wait_for(
        "the template's policy to be collected",
        || async { Some(get(&policies, "python-network-policy").await.is_none()) },
        |gone| *gone,
    )
    .await;
    // The follow-ups of the deletion (pool and member reconciles) have run once the API has
    // seen no write but the pool's status for a while.
    quiet(&h).await;

    let before = h.cluster.request_counts();
    let claims: Api<SandboxClaim> = h.api();
    create(&claims, &claim("claim-a", "pool")).await;
    wait_for(
        "claim-a to be Ready",
        || get(&claims, "claim-a"),
        claim_ready,
    )
    .await;
    // Let every follow-up reconcile run; a status write when nothing changed would show here.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = h.cluster.request_counts().since(&before);

    let pool_writes = during.get(
        "apply",
        "extensions.agents.x-k8s.io",
        "sandboxwarmpools/status",
    );
    let writes = during.writes() - pool_writes;
    println!(
        "API writes for one warm claim: {writes} (+ {pool_writes} pool status); breakdown: {during:?}"
    );
    assert_eq!(
        writes, 6,
        "claim create, adoption patch, claim annotations, claim status, SandboxAdopted event, \
         the pool label off the pod: {during:?}"
    );
    assert_eq!(
        during.get("patch", "extensions.agents.x-k8s.io", "sandboxclaims"),
        1,
        "one merge patch carries both annotations"
    );
    let claim_a = get(&claims, "claim-a").await.unwrap();
    let sandbox_name = &claim_a.status.as_ref().unwrap().sandbox.name;
    assert_ne!(sandbox_name, "claim-a", "a warm member keeps its own name");
    assert_eq!(
        claim_a.annotations().get("agents.x-k8s.io/sandbox-name"),
        Some(sandbox_name)
    );
    let observed = claim_a
        .annotations()
        .get("agents.x-k8s.io/controller-first-observed-at")
        .expect("controller-first-observed-at is written");
    let observed: Timestamp = observed.parse().unwrap();
    let created = claim_a.metadata.creation_timestamp.as_ref().unwrap().0;
    assert!(
        observed.as_second() >= created.as_second() && observed <= Timestamp::now(),
        "first observed at {observed}, created at {created}"
    );
    assert_eq!(
        during.get("create", "extensions.agents.x-k8s.io", "sandboxclaims"),
        1
    );
    assert_eq!(during.get("patch", "agents.x-k8s.io", "sandboxes"), 1);
    assert_eq!(
        during.get(
            "apply",
            "extensions.agents.x-k8s.io",
            "sandboxclaims/status"
        ),
        1
    );
    assert_eq!(during.get("create", "events.k8s.io", "events"), 1);
    // Upstream's labels: the member's pod carried the pool label until the adoption, so a
    // router that reads pods only refused it; one metadata patch takes it off (the pod is not
    // restarted).
    assert_eq!(
        during.get("patch", "", "pods"),
        1,
        "one metadata patch of the live pod"
    );
    let pods: Api<Pod> = h.api();
    let pod = get(&pods, sandbox_name).await.unwrap();
    assert!(
        !pod.labels().contains_key(labels::WARM_POOL_SANDBOX),
        "{:?}",
        pod.labels()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_injection_is_cold_when_allowed_and_rejected_when_disallowed() {
    let h = Harness::start().await;
    let mut allowed = template("allowed");
    allowed.spec.env_vars_injection_policy = EnvVarsInjectionPolicy::Allowed;
    create(&h.api(), &allowed).await;
    create(&h.api(), &template("strict")).await;
    create(&h.api(), &pool("open-pool", "allowed", 1)).await;
    create(&h.api(), &pool("strict-pool", "strict", 1)).await;
    ready_pool(&h, "open-pool", 1).await;

    let claims: Api<SandboxClaim> = h.api();
    let mut with_env = claim("with-env", "open-pool");
    with_env.spec.env = vec![EnvVar {
        name: "TASK_ID".into(),
        value: "forty-two".into(),
        container_name: String::new(),
    }];
    create(&claims, &with_env).await;
    let ready = wait_for(
        "with-env to be Ready",
        || get(&claims, "with-env"),
        claim_ready,
    )
    .await;
    assert_eq!(
        ready.status.as_ref().unwrap().sandbox.name,
        "with-env",
        "a cold sandbox is named after its claim"
    );
    let sandboxes: Api<Sandbox> = h.api();
    let cold = get(&sandboxes, "with-env").await.unwrap();
    assert_eq!(
        cold.labels().get(labels::LAUNCH_TYPE).map(String::as_str),
        Some("cold")
    );
    let ip = &ready.status.as_ref().unwrap().sandbox.pod_ips[0];
    assert_eq!(
        execute(ip, "printenv TASK_ID").await["stdout"],
        "forty-two\n"
    );

    let mut rejected = claim("rejected", "strict-pool");
    rejected.spec.env = vec![EnvVar {
        name: "TASK_ID".into(),
        value: "1".into(),
        container_name: String::new(),
    }];
    create(&claims, &rejected).await;
    let failed = wait_for(
        "rejected to fail",
        || get(&claims, "rejected"),
        |c: &SandboxClaim| {
            c.status.as_ref().is_some_and(|s| {
                condition_is(
                    &s.conditions,
                    claim_cond::READY,
                    "False",
                    claim_cond::REASON_ENV_VARS_INJECTION_REJECTED,
                )
            })
        },
    )
    .await;
    assert!(failed.status.unwrap().sandbox.name.is_empty());
    assert!(get(&sandboxes, "rejected").await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_deletes_or_retains_and_finds_adopted_sandboxes() {
    let h = Harness::start().await;
    let sandboxes: Api<Sandbox> = h.api();
    let pods: Api<Pod> = h.api();
    let past = Time(Timestamp::now() - SignedDuration::from_secs(60));

    let mut doomed = sandbox("doomed");
    doomed.spec.lifecycle.shutdown_time = Some(past.clone());
    doomed.spec.lifecycle.shutdown_policy = ShutdownPolicy::Delete;
    let mut kept = sandbox("kept");
    kept.spec.lifecycle.shutdown_time = Some(past.clone());
    create(&sandboxes, &doomed).await;
    create(&sandboxes, &kept).await;
    wait_for(
        "doomed to be deleted",
        || async { Some(get(&sandboxes, "doomed").await.is_none()) },
        |gone| *gone,
    )
    .await;
    wait_for(
        "kept to expire",
        || get(&sandboxes, "kept"),
        |s: &Sandbox| {
            s.status.as_ref().is_some_and(|st| {
                condition_is(
                    &st.conditions,
                    sandbox_cond::READY,
                    "False",
                    sandbox_cond::REASON_EXPIRED,
                )
            })
        },
    )
    .await;
    wait_for(
        "their pods to be gone",
        || async { Some(pods.list(&Default::default()).await.unwrap().items.len()) },
        |n| *n == 0,
    )
    .await;
    assert!(
        get(&sandboxes, "kept").await.is_some(),
        "Retain keeps the Sandbox"
    );

    // A claim that adopted a warm member expires and takes that member (not one named after it).
    create(&h.api(), &template("python")).await;
    create(&h.api(), &pool("pool", "python", 1)).await;
    ready_pool(&h, "pool", 1).await;
    let claims: Api<SandboxClaim> = h.api();
    create(&claims, &claim("short", "pool")).await;
    let ready = wait_for("short to be Ready", || get(&claims, "short"), claim_ready).await;
    let adopted = ready.status.as_ref().unwrap().sandbox.name.clone();
    let soon = Time(Timestamp::now() + SignedDuration::from_secs(1));
    let lifecycle = ClaimLifecycle {
        shutdown_time: Some(soon),
        ttl_seconds_after_finished: None,
        shutdown_policy: ClaimShutdownPolicy::Retain,
    };
    claims
        .patch(
            "short",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"lifecycle": lifecycle}})),
        )
        .await
        .unwrap();
    wait_for(
        "the adopted sandbox to be deleted",
        || async { Some(get(&sandboxes, &adopted).await.is_none()) },
        |gone| *gone,
    )
    .await;
    let expired = wait_for(
        "short to be marked expired",
        || get(&claims, "short"),
        |c: &SandboxClaim| {
            c.status.as_ref().is_some_and(|s| {
                condition_is(
                    &s.conditions,
                    claim_cond::READY,
                    "False",
                    claim_cond::REASON_CLAIM_EXPIRED,
                )
            })
        },
    )
    .await;
    assert!(
        expired.metadata.deletion_timestamp.is_none(),
        "Retain keeps the claim"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspend_keeps_the_volume_resume_and_deleted_pods_come_back() {
    let h = Harness::start().await;
    let _dump = h.dump_on_panic();
    let sandboxes: Api<Sandbox> = h.api();
    let pods: Api<Pod> = h.api();
    let pvcs: Api<PersistentVolumeClaim> = h.api();
    let mut with_volume = sandbox("box");
    with_volume.spec.blueprint.volume_claim_templates = vec![PersistentVolumeClaimTemplate {
        metadata: EmbeddedObjectMetadata {
            name: "work".into(),
            ..Default::default()
        },
        spec: PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".into(), Quantity("1Gi".into()))])),
                ..Default::default()
            }),
            ..Default::default()
        },
    }];
    create(&sandboxes, &with_volume).await;
    wait_for("box to be Ready", || get(&sandboxes, "box"), sandbox_ready).await;
    let pvc = get(&pvcs, "work-box").await.expect("the PVC exists");
    let first_pod = get(&pods, "box").await.unwrap();

    sandboxes
        .patch(
            "box",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"operatingMode": "Suspended"}})),
        )
        .await
        .unwrap();
    wait_for(
        "box to be suspended",
        || get(&sandboxes, "box"),
        |s: &Sandbox| {
            s.status.as_ref().is_some_and(|st| {
                condition_is(
                    &st.conditions,
                    sandbox_cond::SUSPENDED,
                    "True",
                    sandbox_cond::REASON_POD_TERMINATED,
                )
            })
        },
    )
    .await;
    assert!(get(&pods, "box").await.is_none());
    assert_eq!(
        get(&pvcs, "work-box").await.unwrap().metadata.uid,
        pvc.metadata.uid,
        "the PVC is kept"
    );

    sandboxes
        .patch(
            "box",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"operatingMode": OperatingMode::Running}})),
        )
        .await
        .unwrap();
    let resumed = wait_for(
        "box to be Ready again",
        || get(&sandboxes, "box"),
        sandbox_ready,
    )
    .await;
    let second_pod = get(&pods, "box").await.unwrap();
    assert_ne!(second_pod.metadata.uid, first_pod.metadata.uid);
    assert!(resumed.status.unwrap().pod_ips[0].starts_with("127."));

    pods.delete("box", &DeleteParams::default()).await.unwrap();
    wait_for(
        "a new pod",
        || get(&pods, "box"),
        |p: &Pod| p.metadata.uid != second_pod.metadata.uid,
    )
    .await;
    wait_for(
        "box to be Ready after the pod was deleted",
        || get(&sandboxes, "box"),
        sandbox_ready,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspending_a_sandbox_whose_name_a_foreign_pod_holds_reports_pod_not_owned() {
    let h = Harness::start().await;
    let _dump = h.dump_on_panic();
    let sandboxes: Api<Sandbox> = h.api();
    let pods: Api<Pod> = h.api();
    // Someone else's pod, without our labels or an owner, holds the sandbox's name.
    let foreign = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some("taken".into()),
            ..Default::default()
        },
        spec: Some(runtime_pod_spec()),
        ..Default::default()
    };
    create(&pods, &foreign).await;
    let mut suspended = sandbox("taken");
    suspended.spec.operating_mode = OperatingMode::Suspended;
    create(&sandboxes, &suspended).await;
    let reported = wait_for(
        "the suspended sandbox to report PodNotOwned",
        || get(&sandboxes, "taken"),
        |sandbox: &Sandbox| {
            sandbox.status.as_ref().is_some_and(|s| {
                condition_is(
                    &s.conditions,
                    sandbox_cond::SUSPENDED,
                    "False",
                    "PodNotOwned",
                )
            })
        },
    )
    .await;
    let status = reported.status.unwrap();
    assert!(
        condition_is(
            &status.conditions,
            sandbox_cond::READY,
            "False",
            "SandboxSuspended"
        ),
        "{:?}",
        status.conditions
    );
    assert_eq!(
        status.selector,
        format!("{}={}", labels::SANDBOX_NAME_HASH, name_hash("taken"))
    );
    // The foreign pod is left alone.
    let still = get(&pods, "taken")
        .await
        .expect("the foreign pod is not deleted");
    assert!(still.metadata.deletion_timestamp.is_none());
}

async fn claim_burst(h: &Harness, prefix: &str, count: usize) {
    let claims: Api<SandboxClaim> = h.api();
    let creations = (0..count).map(|i| {
        let claims = claims.clone();
        let name = format!("{prefix}-{i}");
        async move { create(&claims, &claim(&name, "pool")).await }
    });
    futures::future::join_all(creations).await;
}

async fn all_claims_on_distinct_sandboxes(h: &Harness, count: usize) {
    let claims: Api<SandboxClaim> = h.api();
    let all = wait_for(
        &format!("{count} Ready claims"),
        || async { Some(claims.list(&Default::default()).await.unwrap().items) },
        |items: &Vec<SandboxClaim>| items.len() == count && items.iter().all(claim_ready),
    )
    .await;
    let names: BTreeSet<String> = all
        .iter()
        .map(|c| c.status.as_ref().unwrap().sandbox.name.clone())
        .collect();
    assert_eq!(names.len(), count, "every claim has its own sandbox");
    let sandboxes: Api<Sandbox> = h.api();
    for claim in &all {
        let name = &claim.status.as_ref().unwrap().sandbox.name;
        let sandbox = get(&sandboxes, name).await.unwrap();
        let owners: Vec<_> = sandbox.metadata.owner_references.unwrap_or_default();
        assert_eq!(owners.len(), 1, "{name} has exactly one owner");
        assert_eq!(
            owners[0].uid,
            claim.metadata.uid.clone().unwrap(),
            "{name} is owned by its claim"
        );
    }
    for sandbox in sandboxes.list(&Default::default()).await.unwrap().items {
        assert!(
            sandbox
                .metadata
                .owner_references
                .as_ref()
                .is_some_and(|o| o.iter().any(|r| r.controller == Some(true))),
            "{} has no controller",
            sandbox.name_any()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_claims_get_twenty_distinct_sandboxes() {
    let h = Harness::start().await;
    create(&h.api(), &template("python")).await;
    create(&h.api(), &pool("pool", "python", 20)).await;
    ready_pool(&h, "pool", 20).await;
    claim_burst(&h, "c", 20).await;
    all_claims_on_distinct_sandboxes(&h, 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_killed_mid_burst_leaves_every_claim_on_its_own_sandbox() {
    let mut h = Harness::start().await;
    create(&h.api(), &template("python")).await;
    create(&h.api(), &pool("pool", "python", 10)).await;
    ready_pool(&h, "pool", 10).await;
    let claims: Api<SandboxClaim> = h.api();
    let burst = {
        let claims = claims.clone();
        tokio::spawn(async move {
            for i in 0..10 {
                create(&claims, &claim(&format!("k-{i}"), "pool")).await;
            }
        })
    };
    // Kill the controller once a few claims have been served, while the rest are arriving.
    wait_for(
        "some claims to be served",
        || async { Some(claims.list(&Default::default()).await.unwrap().items) },
        |items: &Vec<SandboxClaim>| items.iter().filter(|c| claim_ready(c)).count() >= 2,
    )
    .await;
    h.kill_controller();
    burst.await.unwrap();
    h.start_controller();
    all_claims_on_distinct_sandboxes(&h, 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_template_policy_has_the_secure_shape_and_follows_the_router_setting() {
    let mut config = Config::default();
    config.policy.router_namespace = "routers".into();
    let h = Harness::start_with(config).await;
    create(&h.api(), &template("python")).await;
    let policies: Api<NetworkPolicy> = h.api();
    let policy = wait_for(
        "the template's policy",
        || get(&policies, "python-network-policy"),
        |_| true,
    )
    .await;
    let spec = serde_json::to_value(policy.spec.unwrap()).unwrap();
    assert_eq!(
        spec["podSelector"]["matchLabels"][labels::SANDBOX_TEMPLATE_REF_HASH],
        json!(name_hash("python"))
    );
    assert_eq!(spec["policyTypes"], json!(["Ingress", "Egress"]));
    let peer = &spec["ingress"][0]["from"][0];
    assert_eq!(
        peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        json!("routers")
    );
    assert_eq!(
        peer["podSelector"]["matchLabels"]["app"],
        json!("sandbox-router")
    );
    let except = spec["egress"][0]["to"][0]["ipBlock"]["except"]
        .as_array()
        .unwrap()
        .clone();
    for private in [
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "169.254.0.0/16",
        "198.18.0.0/15",
        "224.0.0.0/4",
        "240.0.0.0/4",
    ] {
        assert!(except.contains(&json!(private)), "{private} is denied");
    }
    assert_eq!(spec["egress"][0]["to"][1]["ipBlock"]["cidr"], json!("::/0"));
    let templates: Api<SandboxTemplate> = h.api();
    let stamped = get(&templates, "python").await.unwrap();
    assert_eq!(
        stamped.labels().get(labels::SANDBOX_TEMPLATE_REF_HASH),
        Some(&name_hash("python"))
    );
}

async fn http_status(addr: std::net::SocketAddr, path: &str) -> Option<u16> {
    let answer = testkit::http::get(&format!("http://{addr}{path}"))
        .await
        .ok()?;
    Some(answer.status.as_u16())
}

/// Regression: with many objects listed at startup, `/readyz` once waited on the same store
/// readiness signal as a controller did, and the signal woke only one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_becomes_ready_with_a_thousand_sandboxes_already_there() {
    const COUNT: usize = 1000;
    let health = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut h = Harness::start_with(Config {
        health_addr: Some(health),
        ..Config::default()
    })
    .await;
    h.kill_controller();
    let _dump = h.dump_on_panic();
    let sandboxes: Api<Sandbox> = h.api();
    let names: Vec<String> = (0..COUNT).map(|i| format!("many-{i:04}")).collect();
    for chunk in names.chunks(25) {
        let creations = chunk.iter().map(|name| {
            let mut object = sandbox(name);
            object.spec.operating_mode = OperatingMode::Suspended;
            let sandboxes = sandboxes.clone();
            async move { sandboxes.create(&PostParams::default(), &object).await }
        });
        for created in futures::future::join_all(creations).await {
            created.unwrap();
        }
    }
    h.start_controller();
    wait_for(
        "/readyz to answer 200",
        || async { Some(http_status(health, "/readyz").await) },
        |status| *status == Some(200),
    )
    .await;
    // Every sandbox was reconciled: its status says Suspended.
    wait_for(
        "every sandbox to have a status",
        || async {
            let listed = sandboxes.list(&Default::default()).await.unwrap();
            Some(
                listed
                    .items
                    .iter()
                    .filter(|s| s.status.as_ref().is_some_and(|s| !s.conditions.is_empty()))
                    .count(),
            )
        },
        |count| *count == COUNT,
    )
    .await;
}

fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Removes every `maximum` from a schema: the CRDs as they were before integer bounds.
fn without_maxima(schema: &mut JSONSchemaProps) {
    schema.maximum = None;
    for child in schema.properties.iter_mut().flat_map(|p| p.values_mut()) {
        without_maxima(child);
    }
}

/// Regression (issue 15): a pool stored with `replicas: 2147483648` (accepted by the CRD before
/// it had bounds) made the pool list undecodable, so a restarted controller never became ready.
/// Now that pool is reported (a Warning Event naming the field) and skipped; the others are
/// reconciled and `/readyz` answers 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_pool_is_reported_and_skipped_while_the_rest_reconciles() {
    let health = free_addr();
    let mut h = Harness::start_with(Config {
        health_addr: Some(health),
        ..Config::default()
    })
    .await;
    h.kill_controller();
    let _dump = h.dump_on_panic();

    // The pool is stored under an older CRD without bounds, then the CRD is upgraded, as a real
    // upgrade of an existing cluster would do.
    let crds: Api<CustomResourceDefinition> = Api::all(h.client.clone());
    let name = "sandboxwarmpools.extensions.agents.x-k8s.io";
    let current = crds.get(name).await.unwrap();
    let mut older = current.clone();
    for version in &mut older.spec.versions {
        without_maxima(
            version
                .schema
                .as_mut()
                .unwrap()
                .open_api_v3_schema
                .as_mut()
                .unwrap(),
        );
    }
    let older = crds
        .replace(name, &PostParams::default(), &older)
        .await
        .unwrap();
    let pools = Api::<DynamicObject>::namespaced_with(
        h.client.clone(),
        NS,
        &ApiResource::erase::<SandboxWarmPool>(&()),
    );
    let huge = |name: &str| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": agent_sandbox_api::EXTENSIONS_API_VERSION,
            "kind": agent_sandbox_api::kinds::SANDBOX_WARM_POOL,
            "metadata": {"name": name},
            "spec": {"replicas": 2_147_483_648_i64, "sandboxTemplateRef": {"name": "python"}}
        }))
        .unwrap()
    };
    pools
        .create(&PostParams::default(), &huge("huge"))
        .await
        .unwrap();
    let mut upgraded = current;
    upgraded.metadata.resource_version = older.metadata.resource_version;
    crds.replace(name, &PostParams::default(), &upgraded)
        .await
        .unwrap();
    assert!(
        pools
            .create(&PostParams::default(), &huge("huge-again"))
            .await
            .is_err(),
        "the upgraded CRD refuses what the old one stored"
    );

    create(&h.api(), &template("python")).await;
    create(&h.api(), &pool("good", "python", 2)).await;
    h.start_controller();
    wait_for(
        "/readyz to answer 200",
        || async { Some(http_status(health, "/readyz").await) },
        |status| *status == Some(200),
    )
    .await;
    ready_pool(&h, "good", 2).await;

    let events: Api<KubeEvent> = h.api();
    let event = wait_for(
        "the UndecodableObject Event on the huge pool",
        || async {
            events
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .find(|event| {
                    event.reason.as_deref() == Some(event_reasons::UNDECODABLE_OBJECT)
                        && event
                            .regarding
                            .as_ref()
                            .is_some_and(|r| r.name.as_deref() == Some("huge"))
                })
        },
        |_| true,
    )
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains("SandboxWarmPool default/huge")
            && note.contains("spec.replicas")
            && note.contains("2147483648"),
        "{note}"
    );
    let sandboxes: Api<Sandbox> = h.api();
    let members = sandboxes.list(&Default::default()).await.unwrap().items;
    assert!(
        members.iter().all(|s| s.name_any().starts_with("good-")),
        "nothing was built for the undecodable pool: {:?}",
        members
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>()
    );
}

/// Regression (issue 15): a `shutdownTime` more than 584 years ahead overflowed into "expired"
/// and the pod was deleted at once; the end of year 9999 is a valid far future.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_expiring_at_the_end_of_year_9999_keeps_its_pod() {
    let h = Harness::start().await;
    let _dump = h.dump_on_panic();
    let sandboxes: Api<Sandbox> = h.api();
    let pods: Api<Pod> = h.api();
    let mut forever = sandbox("forever");
    forever.spec.lifecycle.shutdown_time = Some(Time(
        agent_sandbox_api::time::parse("9999-12-31T23:59:59Z").unwrap(),
    ));
    create(&sandboxes, &forever).await;
    let stored = Api::<DynamicObject>::namespaced_with(
        h.client.clone(),
        NS,
        &ApiResource::erase::<Sandbox>(&()),
    )
    .get("forever")
    .await
    .unwrap();
    assert_eq!(
        stored.data["spec"]["shutdownTime"],
        json!("9999-12-31T23:59:59Z"),
        "stored as written"
    );
    wait_for(
        "forever to be Ready",
        || get(&sandboxes, "forever"),
        sandbox_ready,
    )
    .await;
    let pod = get(&pods, "forever").await.unwrap();

    // Another pass, for a new generation, still finds it far from expiry.
    sandboxes
        .patch(
            "forever",
            &PatchParams::default(),
            &Patch::Merge(
                &json!({"spec": {"podTemplate": {"metadata": {"labels": {"pass": "2"}}}}}),
            ),
        )
        .await
        .unwrap();
    let again = wait_for(
        "forever to be Ready for generation 2",
        || get(&sandboxes, "forever"),
        |s: &Sandbox| {
            s.status.as_ref().is_some_and(|st| {
                st.conditions.iter().any(|c| {
                    c.type_ == sandbox_cond::READY
                        && c.status == "True"
                        && c.observed_generation == Some(2)
                })
            })
        },
    )
    .await;
    assert!(!condition_is(
        &again.status.unwrap().conditions,
        sandbox_cond::READY,
        "False",
        sandbox_cond::REASON_EXPIRED
    ));
    let still = get(&pods, "forever").await.expect("the pod is kept");
    assert_eq!(still.metadata.uid, pod.metadata.uid);
    assert_eq!(
        still.labels().get("pass").map(String::as_str),
        Some("2"),
        "the second pass ran"
    );
}

/// Regression (issue 15): a controller stopped by SIGTERM kept its Lease until it expired, so
/// every rolling restart left a lease duration without a leader. Now it releases the Lease on
/// the way out and a standby takes over at its next attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_leader_hands_the_lease_to_a_standby() {
    // A lease so long that only a release explains a takeover within the test.
    let election = |identity: &str| LeaderElection {
        namespace: NS.into(),
        name: "controller-leader".into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(600),
    };
    let mut h = Harness::start_with(Config {
        leader_election: Some(election("first")),
        ..Config::default()
    })
    .await;
    let leases: Api<Lease> = h.api();
    let holder = |lease: &Lease| {
        lease
            .spec
            .as_ref()
            .and_then(|spec| spec.holder_identity.clone())
            .unwrap_or_default()
    };
    wait_for(
        "first to lead",
        || get(&leases, "controller-leader"),
        |lease| holder(lease) == "first",
    )
    .await;
    let _standby = ControllerTask::spawn(
        h.client.clone(),
        Config {
            leader_election: Some(election("second")),
            ..Config::default()
        },
    );

    h.stop_controller().await;
    let released = get(&leases, "controller-leader").await.unwrap();
    assert_ne!(
        holder(&released),
        "first",
        "a stopped leader gives its Lease up: {released:?}"
    );
    wait_for(
        "second to lead",
        || get(&leases, "controller-leader"),
        |lease| holder(lease) == "second",
    )
    .await;
}

fn pool_conditions(pool: &SandboxWarmPool) -> &[Condition] {
    pool.status
        .as_ref()
        .map_or(&[][..], |status| status.conditions.as_slice())
}

/// Every Sandbox the test's watch saw being added, with the resourceVersion it was added at.
type Creations = std::sync::Arc<std::sync::Mutex<Vec<(String, u64)>>>;

/// Records every Sandbox added from now on (also those deleted again at once).
async fn record_creations(api: Api<Sandbox>) -> (Creations, AbortOnDrop) {
    use kube::runtime::watcher;
    let seen: Creations = Creations::default();
    let (listed_tx, listed_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn({
        let seen = seen.clone();
        async move {
            let mut listed = Some(listed_tx);
            let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::Apply(sandbox) | watcher::Event::InitApply(sandbox)) => {
                        let version = sandbox
                            .metadata
                            .resource_version
                            .as_deref()
                            .unwrap()
                            .parse()
                            .unwrap();
                        let mut seen = seen.lock().unwrap();
                        if !seen.iter().any(|(name, _)| *name == sandbox.name_any()) {
                            seen.push((sandbox.name_any(), version));
                        }
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some(listed) = listed.take() {
                            let _ = listed.send(());
                        }
                    }
                    _ => {}
                }
            }
        }
    });
    listed_rx.await.unwrap();
    (seen, AbortOnDrop(task))
}

fn created_with_prefix(seen: &Creations, prefix: &str) -> Vec<(String, u64)> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|(name, _)| name.starts_with(prefix))
        .cloned()
        .collect()
}

/// Regression (issue 15): `replicas: 1000000` was pursued at ~200 Sandboxes a second, and
/// creation went on long after the pool was deleted. Now the pool is capped at the controller's
/// maximum and says so, members are created at the controller's pace, and creation stops the
/// moment the pool is being deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_pool_is_capped_paced_and_stops_creating_once_deleted() {
    let h = Harness::start_with(Config {
        create_rate: 2,
        ..Config::default()
    })
    .await;
    let _dump = h.dump_on_panic();
    let (seen, _watch) = record_creations(h.api()).await;
    create(&h.api(), &template("python")).await;
    let pools: Api<SandboxWarmPool> = h.api();
    create(&pools, &pool("huge", "python", 1_000_000)).await;

    let capped = wait_for(
        "the pool to say it is capped",
        || get(&pools, "huge"),
        |p: &SandboxWarmPool| {
            condition_is(
                pool_conditions(p),
                pool_cond::CAPPED,
                "True",
                pool_cond::REASON_MAX_REPLICAS_EXCEEDED,
            )
        },
    )
    .await;
    let message = &pool_conditions(&capped)[0].message;
    assert_eq!(
        message,
        "spec.replicas 1000000 is more than this controller keeps per pool (1000, \
         --sandbox-warm-pool-max-replicas); keeping 1000"
    );
    wait_for(
        "a few members",
        || async { Some(created_with_prefix(&seen, "huge-").len()) },
        |n| *n >= 3,
    )
    .await;

    // Foreground deletion: the pool stays, being deleted, until its members are gone.
    let deleted = pools
        .delete("huge", &DeleteParams::foreground())
        .await
        .unwrap()
        .left()
        .expect("a foreground deletion returns the pool being deleted");
    let deleted_at: u64 = deleted.metadata.resource_version.unwrap().parse().unwrap();
    wait_for(
        "the pool to be gone",
        || async { Some(get(&pools, "huge").await.is_none()) },
        |gone| *gone,
    )
    .await;
    // A fence: a new pool's first member needs the next token of the same bucket, so anything
    // the deleted pool still had queued would have been created by then.
    create(&pools, &pool("fence", "python", 1)).await;
    wait_for(
        "the fence pool's member",
        || async { Some(created_with_prefix(&seen, "fence-").len()) },
        |n| *n == 1,
    )
    .await;
    let late: Vec<(String, u64)> = created_with_prefix(&seen, "huge-")
        .into_iter()
        .filter(|(_, version)| *version > deleted_at)
        .collect();
    // At most the one create that was on the wire when the deletion came.
    assert!(
        late.len() <= 1,
        "members created after the pool's deletion: {late:?}"
    );
}

/// Regression (issue 15): a Sandbox with `containers: []` (which upstream's schema allows too)
/// was retried every 2 s forever. The API server's refusal is terminal: `Ready=False`
/// `InvalidPodTemplate` with its message, and the pod is not sent again for this generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_without_containers_is_refused_once_and_says_why() {
    let h = Harness::start().await;
    let _dump = h.dump_on_panic();
    let sandboxes: Api<Sandbox> = h.api();
    let mut empty = sandbox("empty");
    empty.spec.blueprint.pod_template.spec.containers = vec![];
    create(&sandboxes, &empty).await;
    let refused = wait_for(
        "empty to be refused",
        || get(&sandboxes, "empty"),
        |s: &Sandbox| {
            s.status.as_ref().is_some_and(|st| {
                condition_is(
                    &st.conditions,
                    sandbox_cond::READY,
                    "False",
                    sandbox_cond::REASON_INVALID_POD_TEMPLATE,
                )
            })
        },
    )
    .await;
    let ready = refused
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == sandbox_cond::READY)
        .unwrap();
    assert!(
        ready.message.contains("spec.containers"),
        "{}",
        ready.message
    );

    // A fence: another sandbox comes up; meanwhile the refused pod was not sent again (the
    // status write above woke the reconciler once more).
    create(&sandboxes, &sandbox("other")).await;
    wait_for(
        "other to be Ready",
        || get(&sandboxes, "other"),
        sandbox_ready,
    )
    .await;
    assert_eq!(
        h.cluster.request_counts().get("create", "", "pods"),
        2,
        "one refused pod and other's"
    );
}
