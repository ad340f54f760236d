#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The client's claim and pool API against a simulated API server whose objects the tests write
//! by hand (no controller, no pods): waiting for a claim ends in its typed failure, its
//! deletion or the timeout, and outlives broken watches; claims and pools are listed in one
//! namespace or all; a claim's token is for its sandbox; the connection flags become a client.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_sandbox::args::ConnectArgs;
use agent_sandbox::{
    Client, ClientOptions, ConnectionMode, CreateOptions, Error, Progress, RetryPolicy,
};
use agent_sandbox_api::{Sandbox as SandboxObject, SandboxClaim, SandboxWarmPool};
use agent_sandbox_local::testkit::ready_claim;
use agent_sandbox_local::{LocalCluster, LocalConfig};
use clap::Parser as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

/// The API server alone (CRDs applied; no controller, router or pods of its own).
async fn sim() -> LocalCluster {
    LocalCluster::start(LocalConfig::api_only()).await.unwrap()
}

/// A client in `default` whose router is never asked anything (attaching only builds the
/// transport).
fn client(sim: &LocalCluster) -> Client {
    let options = ClientOptions::default()
        .namespace("default")
        .connection(ConnectionMode::direct("http://127.0.0.1:9"))
        .retry(RetryPolicy::never());
    Client::from_kube(sim.client(), options)
}

/// Polls until `check` holds, at most `WAIT`.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + WAIT;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn claim_names(kube: &kube::Client) -> Vec<String> {
    let api: Api<SandboxClaim> = Api::namespaced(kube.clone(), "default");
    let list = api.list(&ListParams::default()).await.unwrap();
    list.items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect()
}

/// The name of the one claim the client under test created.
async fn created_claim(kube: &kube::Client) -> String {
    eventually("the claim to be created", || async {
        !claim_names(kube).await.is_empty()
    })
    .await;
    claim_names(kube).await.remove(0)
}

/// Writes the claim's status: its sandbox and its Ready condition.
async fn set_status(kube: &kube::Client, claim: &str, sandbox: &str, ready: &str, reason: &str) {
    let api: Api<SandboxClaim> = Api::namespaced(kube.clone(), "default");
    let status = json!({"status": {
        "sandbox": {"name": sandbox},
        "conditions": [{
            "type": "Ready", "status": ready, "reason": reason, "message": "m",
            "lastTransitionTime": "2026-01-01T00:00:00Z"
        }]
    }});
    api.patch_status(claim, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// Progress steps, recorded.
fn recorder() -> (Arc<Mutex<Vec<Progress>>>, CreateOptions) {
    let steps = Arc::new(Mutex::new(Vec::new()));
    let record = steps.clone();
    let options = CreateOptions::default()
        .ready_timeout(WAIT)
        .on_progress(move |step| record.lock().unwrap().push(step.clone()));
    (steps, options)
}

fn saw(steps: &Mutex<Vec<Progress>>, wanted: &Progress) -> bool {
    steps.lock().unwrap().contains(wanted)
}

#[tokio::test]
async fn a_claim_that_fails_for_good_is_its_typed_error_after_the_steps_before_it() {
    let sim = sim().await;
    let kube = sim.client();
    let client = client(&sim);
    let (steps, options) = recorder();
    let waiting = tokio::spawn({
        let client = client.clone();
        async move { client.create_sandbox_with("pool", options).await }
    });
    let name = created_claim(&kube).await;
    set_status(&kube, &name, "box", "False", "SandboxNotReady").await;
    let assigned = Progress::SandboxAssigned {
        sandbox: "box".into(),
    };
    eventually("the sandbox to be reported", || async {
        saw(&steps, &assigned)
    })
    .await;
    set_status(&kube, &name, "box", "False", "ClaimExpired").await;
    let error = waiting.await.unwrap().err();
    match &error {
        Some(Error::ClaimFailed { claim, reason, .. }) => {
            assert_eq!(
                (claim.as_str(), reason.as_str()),
                (name.as_str(), "ClaimExpired")
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(saw(
        &steps,
        &Progress::Waiting {
            reason: "SandboxNotReady".into(),
            message: "m".into()
        }
    ));
    // Rolled back.
    eventually("the claim to be deleted", || async {
        claim_names(&kube).await.is_empty()
    })
    .await;
    sim.stop().await;
}

#[tokio::test]
async fn a_claim_deleted_while_waiting_is_not_found() {
    let sim = sim().await;
    let kube = sim.client();
    let client = client(&sim);
    let (_, options) = recorder();
    let waiting = tokio::spawn({
        let client = client.clone();
        async move { client.create_sandbox_with("pool", options).await }
    });
    let name = created_claim(&kube).await;
    let api: Api<SandboxClaim> = Api::namespaced(kube.clone(), "default");
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    let error = waiting.await.unwrap().err();
    assert!(
        matches!(&error, Some(Error::ClaimNotFound { claim, .. }) if *claim == name),
        "{error:?}"
    );
    sim.stop().await;
}

#[tokio::test]
async fn a_claim_that_never_gets_ready_times_out_and_is_rolled_back() {
    let sim = sim().await;
    let kube = sim.client();
    let timeout = Duration::from_millis(300);
    let error = client(&sim)
        .create_sandbox_with("pool", CreateOptions::default().ready_timeout(timeout))
        .await
        .err();
    assert!(
        matches!(error, Some(Error::ClaimTimeout { waited, .. }) if waited == timeout),
        "{error:?}"
    );
    assert!(claim_names(&kube).await.is_empty());
    sim.stop().await;
}

#[tokio::test]
async fn the_wait_outlives_broken_watches_and_attaches_to_the_ready_claim() {
    let sim = sim().await;
    let kube = sim.client();
    let sandboxes: Api<SandboxObject> = Api::namespaced(kube.clone(), "default");
    let sandbox: SandboxObject = serde_json::from_value(json!({
        "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
        "metadata": {"name": "box", "annotations": {"agents.x-k8s.io/pod-name": "box-pod"}},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}
    }))
    .unwrap();
    sandboxes
        .create(&PostParams::default(), &sandbox)
        .await
        .unwrap();
    let (steps, options) = recorder();
    let waiting = tokio::spawn({
        let client = client(&sim);
        async move { client.create_sandbox_with("pool", options).await }
    });
    let name = created_claim(&kube).await;
    set_status(&kube, &name, "", "False", "WarmPoolEmpty").await;
    let watched = Progress::Waiting {
        reason: "WarmPoolEmpty".into(),
        message: "m".into(),
    };
    eventually("the watch to report the claim", || async {
        saw(&steps, &watched)
    })
    .await;
    // The watch breaks, and the version it would resume from is compacted away (410 Gone).
    sim.sim().close_watches();
    sim.sim().compact_watch_history();
    set_status(&kube, &name, "box", "True", "DependenciesReady").await;
    let sandbox = waiting.await.unwrap().unwrap();
    assert_eq!(
        (
            sandbox.claim_name(),
            sandbox.sandbox_name(),
            sandbox.pod_name()
        ),
        (name.as_str(), "box", "box-pod")
    );
    sim.stop().await;
}

#[tokio::test]
async fn claims_and_pools_are_listed_in_one_namespace_or_all_and_tokens_open_their_sandbox() {
    let sim = sim().await;
    let kube = sim.client();
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "team-b"}})).unwrap();
    Api::<Namespace>::all(kube.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    ready_claim(&kube, "default", "claim-a", "box-a")
        .await
        .unwrap();
    ready_claim(&kube, "team-b", "claim-b", "box-b")
        .await
        .unwrap();
    for ns in ["default", "team-b"] {
        let pool: SandboxWarmPool = serde_json::from_value(json!({
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
            "metadata": {"name": format!("pool-{ns}")},
            "spec": {"replicas": 2, "sandboxTemplateRef": {"name": "t"}}
        }))
        .unwrap();
        Api::<SandboxWarmPool>::namespaced(kube.clone(), ns)
            .create(&PostParams::default(), &pool)
            .await
            .unwrap();
    }
    let client = client(&sim);

    let here: Vec<String> = client
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.claim)
        .collect();
    assert_eq!(here, ["claim-a"]);
    let mut everywhere: Vec<(String, String)> = client
        .list_all_namespaces()
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.namespace, c.claim))
        .collect();
    everywhere.sort();
    assert_eq!(
        everywhere,
        [
            ("default".to_owned(), "claim-a".to_owned()),
            ("team-b".to_owned(), "claim-b".to_owned())
        ]
    );
    let info = client.claim("claim-a").await.unwrap();
    assert_eq!(
        (
            info.sandbox.as_deref(),
            info.ready,
            info.ready_status.as_deref()
        ),
        (Some("box-a"), true, Some("True"))
    );
    assert!(matches!(
        client.claim("nope").await,
        Err(Error::ClaimNotFound { .. })
    ));

    let pools = client.warm_pools().await.unwrap();
    assert_eq!(
        pools
            .iter()
            .map(|p| (p.name.as_str(), p.desired))
            .collect::<Vec<_>>(),
        [("pool-default", 2)]
    );
    assert_eq!(client.warm_pools_all_namespaces().await.unwrap().len(), 2);
    assert!(client.warm_pool("pool-default").await.unwrap().is_some());
    assert_eq!(client.warm_pool("pool-team-b").await.unwrap(), None);

    let key = [b'k'; 32];
    let token = client
        .mint_claim_token(&key, "claim-a", Duration::from_secs(60))
        .await
        .unwrap();
    let now = jiff::Timestamp::now().as_second();
    let claims = agent_sandbox_api::token::verify(&key, &token, now).unwrap();
    assert_eq!(
        (claims.namespace.as_str(), claims.name.as_str()),
        ("default", "box-a")
    );
    // A claim without a sandbox has nothing to mint a token for, nor a log to read.
    let pending: SandboxClaim = serde_json::from_value(json!({
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
        "metadata": {"name": "pending"}, "spec": {"warmPoolRef": {"name": "pool-default"}}
    }))
    .unwrap();
    Api::<SandboxClaim>::namespaced(kube.clone(), "default")
        .create(&PostParams::default(), &pending)
        .await
        .unwrap();
    let error = client
        .mint_claim_token(&key, "pending", Duration::from_secs(60))
        .await
        .err();
    assert!(
        matches!(error, Some(Error::ClaimNotReady { .. })),
        "{error:?}"
    );
    let error = client.logs("pending", None).await.err();
    assert!(
        matches!(error, Some(Error::ClaimNotReady { .. })),
        "{error:?}"
    );
    sim.stop().await;
}

#[derive(Debug, clap::Parser)]
struct Flags {
    #[command(flatten)]
    connect: ConnectArgs,
}

#[tokio::test]
async fn the_connection_flags_become_a_client_of_the_kubeconfigs_server() {
    let sim = sim().await;
    ready_claim(&sim.client(), "default", "claim-a", "box-a")
        .await
        .unwrap();
    let kubeconfig = sim.sim().kubeconfig_path().display().to_string();
    // Every flag given (empty: unset), so the test's environment does not count.
    let flags = Flags::try_parse_from([
        "test",
        "--kubeconfig",
        &kubeconfig,
        "--router-url",
        "http://127.0.0.1:9",
        "--router-token",
        "",
        "--signing-key-file",
        "",
    ])
    .unwrap();
    let client = flags.connect.connect().await.unwrap();
    assert_eq!(
        client.api_url(),
        Some(format!("{}/", sim.sim().base_url()).as_str())
    );
    assert_eq!(client.namespace(), "default");
    assert_eq!(
        client.options().connection,
        ConnectionMode::direct("http://127.0.0.1:9")
    );
    assert_eq!(client.options().router_token, None);
    let listed: Vec<String> = client
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.claim)
        .collect();
    assert_eq!(listed, ["claim-a"]);
    sim.stop().await;
}
