//! The sim's API through kube-rs: watches, optimistic concurrency, finalizers, garbage
//! collection, server-side apply, subresources, errors, Events, Leases and request counters.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;

use agent_sandbox_api::{Sandbox, SandboxWarmPool};
use agent_sandbox_sim::Isolation;
use common::{eventually, sim};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};
use pretty_assertions::assert_eq;
use serde_json::json;

fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        ),
        ..Default::default()
    }
}

fn api_error(error: kube::Error) -> kube::core::Status {
    match error {
        kube::Error::Api(status) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn watcher_sees_changes_in_order_and_recovers_from_gone() {
    let sim = sim(Isolation::None).await;
    let api: Api<ConfigMap> = Api::default_namespaced(sim.client().unwrap());
    let mut events = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
    assert!(matches!(
        events.try_next().await.unwrap(),
        Some(Event::Init)
    ));
    // The default namespace already holds nothing of ours.
    assert!(matches!(
        events.try_next().await.unwrap(),
        Some(Event::InitDone)
    ));

    api.create(&PostParams::default(), &config_map("a", &[("k", "1")]))
        .await
        .unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    api.delete("a", &DeleteParams::default()).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match events.try_next().await.unwrap().unwrap() {
            Event::Apply(cm) => seen.push(format!(
                "apply {} {}",
                cm.name_any(),
                cm.data.unwrap_or_default()["k"]
            )),
            Event::Delete(cm) => seen.push(format!("delete {}", cm.name_any())),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, vec!["apply a 1", "apply a 2", "delete a"]);

    // The server drops the connection, a change happens and the history is compacted: resuming
    // from the last seen version answers 410, and the watcher lists again.
    sim.close_watches();
    api.create(&PostParams::default(), &config_map("b", &[]))
        .await
        .unwrap();
    sim.compact_watch_history();
    let gone = events.try_next().await;
    match gone {
        Err(watcher::Error::WatchError(status)) => assert_eq!(status.code, 410),
        other => panic!("expected the 410 watch error, got {other:?}"),
    }
    assert!(matches!(
        events.try_next().await.unwrap(),
        Some(Event::Init)
    ));
    match events.try_next().await.unwrap() {
        Some(Event::InitApply(cm)) => assert_eq!(cm.name_any(), "b"),
        other => panic!("expected the relisted object, got {other:?}"),
    }
    assert!(matches!(
        events.try_next().await.unwrap(),
        Some(Event::InitDone)
    ));
}

#[tokio::test]
async fn raw_watch_from_a_compacted_version_gets_a_410_error_event() {
    let sim = sim(Isolation::None).await;
    let api: Api<ConfigMap> = Api::default_namespaced(sim.client().unwrap());
    let created = api
        .create(&PostParams::default(), &config_map("x", &[]))
        .await
        .unwrap();
    api.create(&PostParams::default(), &config_map("y", &[]))
        .await
        .unwrap();
    sim.compact_watch_history();
    let mut stream = api
        .watch(
            &WatchParams::default(),
            &created.resource_version().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Error(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
        }
        other => panic!("expected an ERROR event, got {other:?}"),
    }
}

#[tokio::test]
async fn streaming_list_watch_ends_initial_events_with_a_bookmark() {
    let sim = sim(Isolation::None).await;
    let api: Api<ConfigMap> = Api::default_namespaced(sim.client().unwrap());
    api.create(&PostParams::default(), &config_map("s1", &[]))
        .await
        .unwrap();
    let config = watcher::Config::default().streaming_lists();
    let mut events = watcher::watcher(api.clone(), config).boxed();
    assert!(matches!(
        events.try_next().await.unwrap(),
        Some(Event::Init)
    ));
    match events.try_next().await.unwrap() {
        Some(Event::InitApply(cm)) => assert_eq!(cm.name_any(), "s1"),
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(
        events.try_next().await.unwrap(),
        Some(Event::InitDone)
    ));
    api.create(&PostParams::default(), &config_map("s2", &[]))
        .await
        .unwrap();
    match events.try_next().await.unwrap() {
        Some(Event::Apply(cm)) => assert_eq!(cm.name_any(), "s2"),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn stale_resource_versions_conflict() {
    let sim = sim(Isolation::None).await;
    let api: Api<ConfigMap> = Api::default_namespaced(sim.client().unwrap());
    let first = api
        .create(&PostParams::default(), &config_map("c", &[("k", "1")]))
        .await
        .unwrap();
    let mut second = first.clone();
    second.data = Some(BTreeMap::from([("k".into(), "2".into())]));
    let updated = api
        .replace("c", &PostParams::default(), &second)
        .await
        .unwrap();
    assert_ne!(updated.resource_version(), first.resource_version());
    // Replacing from the old version fails.
    let status = api_error(
        api.replace("c", &PostParams::default(), &second)
            .await
            .unwrap_err(),
    );
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert!(
        status.message.contains("the object has been modified"),
        "{}",
        status.message
    );
    // A merge patch carrying the old version as a precondition fails the same way.
    let patch =
        json!({"metadata": {"resourceVersion": first.resource_version()}, "data": {"k": "3"}});
    let status = api_error(
        api.patch("c", &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 409);
    // With the current version it succeeds.
    let patch =
        json!({"metadata": {"resourceVersion": updated.resource_version()}, "data": {"k": "3"}});
    api.patch("c", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

#[tokio::test]
async fn errors_are_kubernetes_status_objects() {
    let sim = sim(Isolation::None).await;
    let client = sim.client().unwrap();
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let missing = api_error(api.get("nope").await.unwrap_err());
    assert_eq!((missing.code, missing.reason.as_str()), (404, "NotFound"));
    assert_eq!(missing.message, "configmaps \"nope\" not found");
    api.create(&PostParams::default(), &config_map("dup", &[]))
        .await
        .unwrap();
    let dup = api_error(
        api.create(&PostParams::default(), &config_map("dup", &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!((dup.code, dup.reason.as_str()), (409, "AlreadyExists"));
    let invalid = api_error(
        api.create(&PostParams::default(), &config_map("Not_Valid", &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!((invalid.code, invalid.reason.as_str()), (422, "Invalid"));
    let elsewhere: Api<ConfigMap> = Api::namespaced(client.clone(), "no-such-namespace");
    let no_ns = api_error(
        elsewhere
            .create(&PostParams::default(), &config_map("x", &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!(no_ns.code, 404);
    assert_eq!(no_ns.message, "namespaces \"no-such-namespace\" not found");
    // Schema validation of custom resources: unsupported enum value.
    let sandboxes: Api<Sandbox> = Api::default_namespaced(client);
    let bad: Sandbox = serde_json::from_value(json!({
        "apiVersion": agent_sandbox_api::API_VERSION, "kind": agent_sandbox_api::kinds::SANDBOX, "metadata": {"name": "bad"},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}
    }))
    .unwrap();
    let mut raw = serde_json::to_value(&bad).unwrap();
    raw["spec"]["operatingMode"] = json!("Sideways");
    let invalid = api_error(
        sandboxes
            .patch("bad", &PatchParams::apply("test"), &Patch::Apply(raw))
            .await
            .unwrap_err(),
    );
    assert_eq!(invalid.code, 422);
    assert!(
        invalid.message.contains("spec.operatingMode"),
        "{}",
        invalid.message
    );
}

#[tokio::test]
async fn finalizers_hold_deletion() {
    let sim = sim(Isolation::None).await;
    let api: Api<ConfigMap> = Api::default_namespaced(sim.client().unwrap());
    let mut cm = config_map("held", &[]);
    cm.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    api.create(&PostParams::default(), &cm).await.unwrap();
    api.delete("held", &DeleteParams::default()).await.unwrap();
    let deleting = api.get("held").await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    assert_eq!(deleting.finalizers(), ["example.com/hold".to_owned()]);
    // Removing the last finalizer, the way kube-runtime's finalizer helper does, completes it.
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers/0", "value": "example.com/hold"},
        {"op": "remove", "path": "/metadata/finalizers/0"}
    ]))
    .unwrap();
    api.patch("held", &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
        .unwrap();
    assert_eq!(api_error(api.get("held").await.unwrap_err()).code, 404);
}

fn owned_by(name: &str, owner: &ConfigMap, block: bool) -> ConfigMap {
    let mut cm = config_map(name, &[]);
    cm.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: owner.name_any(),
        uid: owner.uid().unwrap(),
        block_owner_deletion: Some(block),
        controller: Some(true),
    }]);
    cm
}

#[tokio::test]
async fn garbage_collection_deletes_dependents_in_the_background() {
    let sim = sim(Isolation::None).await;
    let api: Api<ConfigMap> = Api::default_namespaced(sim.client().unwrap());
    let owner = api
        .create(&PostParams::default(), &config_map("owner", &[]))
        .await
        .unwrap();
    api.create(&PostParams::default(), &owned_by("dep", &owner, false))
        .await
        .unwrap();
    api.delete("owner", &DeleteParams::default()).await.unwrap();
    eventually("the dependent to be collected", || async {
        api.get_opt("dep").await.unwrap().is_none().then_some(())
    })
    .await;
    // A dependent whose owner never existed is collected too.
    let mut ghost = config_map("ghost-owner", &[]);
    ghost.metadata.uid = Some("00000000-0000-4000-8000-000000000000".into());
    api.create(&PostParams::default(), &owned_by("orphaned", &ghost, false))
        .await
        .unwrap();
    eventually("the dangling dependent to be collected", || async {
        api.get_opt("orphaned")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn foreground_deletion_waits_for_blocking_dependents() {
    let sim = sim(Isolation::None).await;
    let api: Api<ConfigMap> = Api::default_namespaced(sim.client().unwrap());
    let owner = api
        .create(&PostParams::default(), &config_map("owner", &[]))
        .await
        .unwrap();
    let mut dependent = owned_by("dep", &owner, true);
    dependent.metadata.finalizers = Some(vec!["example.com/slow".into()]);
    api.create(&PostParams::default(), &dependent)
        .await
        .unwrap();
    api.delete("owner", &DeleteParams::foreground())
        .await
        .unwrap();
    // The dependent is being deleted, but its finalizer holds it; so the owner waits.
    eventually("the dependent to be marked for deletion", || async {
        api.get("dep")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .map(|_| ())
    })
    .await;
    let waiting = api.get("owner").await.unwrap();
    assert!(waiting.metadata.deletion_timestamp.is_some());
    assert!(
        waiting
            .finalizers()
            .contains(&"foregroundDeletion".to_owned())
    );
    api.patch(
        "dep",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    eventually("the owner to go once its dependent is gone", || async {
        api.get_opt("owner").await.unwrap().is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn orphan_deletion_keeps_dependents() {
    let sim = sim(Isolation::None).await;
    let api: Api<ConfigMap> = Api::default_namespaced(sim.client().unwrap());
    let owner = api
        .create(&PostParams::default(), &config_map("owner", &[]))
        .await
        .unwrap();
    api.create(&PostParams::default(), &owned_by("dep", &owner, true))
        .await
        .unwrap();
    api.delete("owner", &DeleteParams::orphan()).await.unwrap();
    eventually("the owner to go", || async {
        api.get_opt("owner").await.unwrap().is_none().then_some(())
    })
    .await;
    let kept = api.get("dep").await.unwrap();
    assert!(kept.owner_references().is_empty());
    assert!(kept.metadata.deletion_timestamp.is_none());
}

#[tokio::test]
async fn server_side_apply_by_two_field_managers() {
    let sim = sim(Isolation::None).await;
    let api: Api<ConfigMap> = Api::default_namespaced(sim.client().unwrap());
    let apply = |manager: &'static str, data: serde_json::Value, force: bool| {
        let api = api.clone();
        async move {
            let mut params = PatchParams::apply(manager);
            params.force = force;
            let config = json!({"apiVersion": "v1", "kind": "ConfigMap",
                                "metadata": {"name": "shared"}, "data": data});
            api.patch("shared", &params, &Patch::Apply(config)).await
        }
    };
    let data = |cm: ConfigMap| cm.data.unwrap_or_default();
    // Apply creates.
    let created = apply("alice", json!({"x": "1", "y": "2"}), false)
        .await
        .unwrap();
    assert_eq!(
        data(created),
        BTreeMap::from([("x".into(), "1".into()), ("y".into(), "2".into())])
    );
    // A second manager adds a field; fields merge.
    let merged = apply("bob", json!({"z": "3"}), false).await.unwrap();
    assert_eq!(data(merged).len(), 3);
    // Changing a field another manager owns conflicts, naming the owner and the field.
    let conflict = api_error(
        apply("bob", json!({"x": "other"}), false)
            .await
            .unwrap_err(),
    );
    assert_eq!(conflict.code, 409);
    assert!(
        conflict.message.contains("conflict with \"alice\""),
        "{}",
        conflict.message
    );
    assert!(conflict.message.contains(".data.x"), "{}", conflict.message);
    // Forcing takes the field over.
    let forced = apply("bob", json!({"x": "other", "z": "3"}), true)
        .await
        .unwrap();
    assert_eq!(data(forced)["x"], "other");
    // Alice stops applying x (now Bob's) and keeps y: x stays with Bob's value.
    let after = apply("alice", json!({"y": "2"}), false).await.unwrap();
    assert_eq!(data(after)["x"], "other");
    // Alice stops applying y: nobody else owns it, so it is removed.
    let after = apply("alice", json!({}), false).await.unwrap();
    assert_eq!(
        data(after.clone()),
        BTreeMap::from([("x".into(), "other".into()), ("z".into(), "3".into())])
    );
    let managers: Vec<String> = after
        .managed_fields()
        .iter()
        .filter_map(|entry| entry.manager.clone())
        .collect();
    assert!(managers.contains(&"bob".to_owned()), "{managers:?}");
    // Applying the same configuration again changes nothing, not even the resource version.
    let again = apply("bob", json!({"x": "other", "z": "3"}), true)
        .await
        .unwrap();
    assert_eq!(again.resource_version(), after.resource_version());
}

#[tokio::test]
async fn status_and_scale_subresources_and_generation() {
    let sim = sim(Isolation::None).await;
    let client = sim.client().unwrap();
    let sandboxes: Api<Sandbox> = Api::default_namespaced(client.clone());
    let sandbox = json!({"apiVersion": agent_sandbox_api::API_VERSION, "kind": agent_sandbox_api::kinds::SANDBOX,
        "metadata": {"generateName": "sb-"},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}});
    let created = sandboxes
        .create(
            &PostParams::default(),
            &serde_json::from_value(sandbox).unwrap(),
        )
        .await
        .unwrap();
    let name = created.name_any();
    assert!(name.starts_with("sb-") && name.len() == 8, "{name}");
    assert_eq!(created.metadata.generation, Some(1));
    // Status through server-side apply with a fixed manager and force, as the controller does.
    let status = json!({"apiVersion": agent_sandbox_api::API_VERSION, "kind": agent_sandbox_api::kinds::SANDBOX,
                        "status": {"serviceFQDN": format!("{name}.default.svc.cluster.local")}});
    let applied = sandboxes
        .patch_status(
            &name,
            &PatchParams::apply("sandbox-controller").force(),
            &Patch::Apply(status),
        )
        .await
        .unwrap();
    assert!(
        applied
            .status
            .unwrap()
            .service_fqdn
            .ends_with(".svc.cluster.local")
    );
    assert_eq!(applied.metadata.generation, Some(1));
    // Spec changes bump the generation; status in a main-resource patch is ignored.
    let patched = sandboxes
        .patch(&name, &PatchParams::default(),
               &Patch::Merge(json!({"spec": {"operatingMode": "Suspended"}, "status": {"serviceFQDN": "ignored"}})))
        .await
        .unwrap();
    assert_eq!(patched.metadata.generation, Some(2));
    assert_ne!(patched.status.unwrap().service_fqdn, "ignored");

    let pools: Api<SandboxWarmPool> = Api::default_namespaced(client);
    let pool = json!({"apiVersion": agent_sandbox_api::EXTENSIONS_API_VERSION, "kind": agent_sandbox_api::kinds::SANDBOX_WARM_POOL,
        "metadata": {"name": "pool"}, "spec": {"replicas": 1, "sandboxTemplateRef": {"name": "t"}}});
    pools
        .create(
            &PostParams::default(),
            &serde_json::from_value(pool).unwrap(),
        )
        .await
        .unwrap();
    let scale = pools.get_scale("pool").await.unwrap();
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(1));
    pools
        .patch_scale(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 4}})),
        )
        .await
        .unwrap();
    assert_eq!(pools.get("pool").await.unwrap().spec.replicas, 4);
}

#[tokio::test]
async fn events_written_through_events_k8s_io_are_core_events_too() {
    use kube::runtime::events::{Event as RuntimeEvent, EventType, Recorder, Reporter};
    let sim = sim(Isolation::None).await;
    let client = sim.client().unwrap();
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let cm = api
        .create(&PostParams::default(), &config_map("subject", &[]))
        .await
        .unwrap();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "sandbox-controller".into(),
            instance: None,
        },
    );
    let event = RuntimeEvent {
        type_: EventType::Normal,
        reason: "Tested".into(),
        note: Some("hello".into()),
        action: "Test".into(),
        secondary: None,
    };
    let reference = cm.object_ref(&());
    recorder.publish(&event, &reference).await.unwrap();
    // The same event again becomes a series (a merge patch of the existing event).
    recorder.publish(&event, &reference).await.unwrap();
    let core: Api<CoreEvent> = Api::default_namespaced(client);
    let list = core
        .list(&ListParams::default().fields("involvedObject.name=subject"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].message.as_deref(), Some("hello"));
    assert_eq!(list.items[0].reason.as_deref(), Some("Tested"));
}

#[tokio::test]
async fn leases_support_leader_election_updates() {
    let sim = sim(Isolation::None).await;
    let leases: Api<Lease> = Api::default_namespaced(sim.client().unwrap());
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "a3317529.agent-sandbox.x-k8s.io"},
        "spec": {"holderIdentity": "one", "leaseDurationSeconds": 15}
    }))
    .unwrap();
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    let mut takeover = created.clone();
    takeover.spec.as_mut().unwrap().holder_identity = Some("two".into());
    leases
        .replace(&created.name_any(), &PostParams::default(), &takeover)
        .await
        .unwrap();
    let mut late = created.clone();
    late.spec.as_mut().unwrap().holder_identity = Some("three".into());
    let status = api_error(
        leases
            .replace(&created.name_any(), &PostParams::default(), &late)
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 409);
}

#[tokio::test]
async fn selectors_filter_lists() {
    let sim = sim(Isolation::None).await;
    let api: Api<ConfigMap> = Api::default_namespaced(sim.client().unwrap());
    for (name, tier) in [("a", "web"), ("b", "db"), ("c", "web")] {
        let mut cm = config_map(name, &[]);
        cm.metadata.labels = Some(BTreeMap::from([("tier".into(), tier.into())]));
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    let names = |list: kube::core::ObjectList<ConfigMap>| {
        list.items
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(
            api.list(&ListParams::default().labels("tier=web"))
                .await
                .unwrap()
        ),
        ["a", "c"]
    );
    assert_eq!(
        names(
            api.list(&ListParams::default().labels("tier notin (web)"))
                .await
                .unwrap()
        ),
        ["b"]
    );
    assert_eq!(
        names(
            api.list(&ListParams::default().fields("metadata.name=c"))
                .await
                .unwrap()
        ),
        ["c"]
    );
    // Pagination with limit and continue.
    let first = api
        .list(&ListParams::default().labels("tier").limit(2))
        .await
        .unwrap();
    assert_eq!(first.items.len(), 2);
    let token = first.metadata.continue_.clone().unwrap();
    let rest = api
        .list(
            &ListParams::default()
                .labels("tier")
                .limit(2)
                .continue_token(&token),
        )
        .await
        .unwrap();
    assert_eq!(names(rest), ["c"]);
}

#[tokio::test]
async fn deleting_a_namespace_removes_its_content() {
    let sim = sim(Isolation::None).await;
    let client = sim.client().unwrap();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "scratch"}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, "scratch");
    api.create(&PostParams::default(), &config_map("inside", &[]))
        .await
        .unwrap();
    namespaces
        .delete("scratch", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the namespace to be gone", || async {
        namespaces
            .get_opt("scratch")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    assert!(api.get_opt("inside").await.unwrap().is_none());
}

#[tokio::test]
async fn another_namespace_finalizer_holds_it_until_removed_through_finalize() {
    let sim = sim(Isolation::None).await;
    let namespaces: Api<Namespace> = Api::all(sim.client().unwrap());
    let ns: Namespace = serde_json::from_value(
        json!({"metadata": {"name": "held"}, "spec": {"finalizers": ["example.com/hold"]}}),
    )
    .unwrap();
    let created = namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let finalizers = |ns: &Namespace| ns.spec.as_ref().and_then(|s| s.finalizers.clone());
    assert_eq!(
        finalizers(&created),
        Some(vec!["example.com/hold".to_owned(), "kubernetes".to_owned()])
    );
    // A plain update does not change them: only `finalize` does.
    let mut edited = created.clone();
    edited.spec = None;
    let updated = namespaces
        .replace("held", &PostParams::default(), &edited)
        .await
        .unwrap();
    assert_eq!(finalizers(&updated), finalizers(&created));
    namespaces
        .delete("held", &DeleteParams::default())
        .await
        .unwrap();
    let terminating = eventually("the kubernetes finalizer to go", || async {
        let ns = namespaces.get("held").await.unwrap();
        (finalizers(&ns) == Some(vec!["example.com/hold".to_owned()])).then_some(ns)
    })
    .await;
    assert_eq!(
        terminating.status.and_then(|s| s.phase).as_deref(),
        Some("Terminating")
    );
    let mut released = namespaces.get("held").await.unwrap();
    released.spec = Some(Default::default());
    namespaces
        .replace_subresource("finalize", "held", &PostParams::default(), &released)
        .await
        .unwrap();
    assert!(namespaces.get_opt("held").await.unwrap().is_none());
}

#[tokio::test]
async fn our_sandbox_crd_keeps_volume_claim_templates_immutable() {
    let sim = sim(Isolation::None).await;
    let sandboxes: Api<Sandbox> = Api::default_namespaced(sim.client().unwrap());
    let sandbox: Sandbox = serde_json::from_value(json!({
        "apiVersion": agent_sandbox_api::API_VERSION, "kind": "Sandbox",
        "metadata": {"name": "with-claims"},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}},
                 "volumeClaimTemplates": [{"metadata": {"name": "data"},
                                           "spec": {"accessModes": ["ReadWriteOnce"],
                                                    "resources": {"requests": {"storage": "1Gi"}}}}]}
    }))
    .unwrap();
    sandboxes
        .create(&PostParams::default(), &sandbox)
        .await
        .unwrap();
    let patch = |body: serde_json::Value| {
        let sandboxes = sandboxes.clone();
        async move {
            sandboxes
                .patch("with-claims", &PatchParams::default(), &Patch::Merge(body))
                .await
        }
    };
    // Other fields of spec may change.
    patch(json!({"spec": {"operatingMode": "Suspended"}}))
        .await
        .unwrap();
    let error = patch(json!({"spec": {"volumeClaimTemplates": []}}))
        .await
        .unwrap_err();
    let status = api_error(error);
    assert_eq!(status.code, 422);
    assert!(
        status
            .message
            .ends_with("spec: Invalid value: \"object\": volumeClaimTemplates is immutable"),
        "{}",
        status.message
    );
}

#[tokio::test]
async fn request_counters_count_writes_per_verb_and_resource() {
    let sim = sim(Isolation::None).await;
    let api: Api<ConfigMap> = Api::default_namespaced(sim.client().unwrap());
    let before = sim.request_counts();
    api.create(&PostParams::default(), &config_map("m", &[]))
        .await
        .unwrap();
    api.get("m").await.unwrap();
    api.patch(
        "m",
        &PatchParams::apply("t"),
        &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "b"}})),
    )
    .await
    .unwrap();
    api.delete("m", &DeleteParams::default()).await.unwrap();
    let counts = sim.request_counts().since(&before);
    assert_eq!(counts.get("create", "", "configmaps"), 1);
    assert_eq!(counts.get("get", "", "configmaps"), 1);
    assert_eq!(counts.get("apply", "", "configmaps"), 1);
    assert_eq!(counts.get("delete", "", "configmaps"), 1);
    assert_eq!(counts.writes(), 3);
    let (code, text) = common::api_get(&sim, "/sim/metrics", None).await;
    assert_eq!(code, 200);
    assert!(
        text.contains(
            "sim_api_requests_total{verb=\"create\",group=\"\",resource=\"configmaps\"} 1"
        ),
        "{text}"
    );
}

#[tokio::test]
async fn services_get_cluster_ips_and_endpoint_slices_follow_ready_pods() {
    use k8s_openapi::api::core::v1::Pod;
    let sim = sim(Isolation::None).await;
    let client = sim.client().unwrap();
    let services: Api<Service> = Api::default_namespaced(client.clone());
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "sandbox-router-svc"},
        "spec": {"selector": {"app": "sandbox-router"}, "ports": [{"name": "http", "port": 8080}]}
    }))
    .unwrap();
    let created = services
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
    let ip = created.spec.unwrap().cluster_ip.unwrap();
    assert!(ip.starts_with("10.96."), "{ip}");
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "router-0", "labels": {"app": "sandbox-router"}},
        "spec": {"containers": [{"name": "router", "image": "busybox",
                                 "command": ["sh", "-c", "exec sleep 60"]}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let slices: Api<EndpointSlice> = Api::default_namespaced(client);
    let selector = ListParams::default().labels("kubernetes.io/service-name=sandbox-router-svc");
    let slice = eventually("a ready endpoint", || async {
        let list = slices.list(&selector).await.unwrap();
        list.items.into_iter().find(|slice| {
            slice
                .endpoints
                .iter()
                .flatten()
                .any(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        })
    })
    .await;
    let pod_ip = pods
        .get("router-0")
        .await
        .unwrap()
        .status
        .unwrap()
        .pod_ip
        .unwrap();
    assert_eq!(slice.endpoints.unwrap()[0].addresses, vec![pod_ip]);
    assert_eq!(slice.ports.unwrap()[0].port, Some(8080));
    pods.delete("router-0", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    eventually("the endpoint to go", || async {
        let list = slices.list(&selector).await.unwrap();
        list.items
            .iter()
            .all(|s| s.endpoints.as_ref().is_none_or(Vec::is_empty))
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn metadata_lists_and_watches_return_partial_objects() {
    let sim = sim(Isolation::None).await;
    let api: Api<ConfigMap> = Api::default_namespaced(sim.client().unwrap());
    let mut cm = config_map("meta", &[("big", "value")]);
    cm.metadata.labels = Some(BTreeMap::from([("app".into(), "x".into())]));
    api.create(&PostParams::default(), &cm).await.unwrap();
    let list = api.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].labels()["app"], "x");
    let metadata: Api<kube::core::PartialObjectMeta<ConfigMap>> =
        Api::default_namespaced(sim.client().unwrap());
    let mut events = watcher::watcher(metadata, watcher::Config::default()).boxed();
    assert!(matches!(
        events.try_next().await.unwrap(),
        Some(Event::Init)
    ));
    match events.try_next().await.unwrap() {
        Some(Event::InitApply(meta)) => assert_eq!(meta.name_any(), "meta"),
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(
        events.try_next().await.unwrap(),
        Some(Event::InitDone)
    ));
    api.delete("meta", &DeleteParams::default()).await.unwrap();
    match events.try_next().await.unwrap() {
        Some(Event::Delete(meta)) => assert_eq!(meta.name_any(), "meta"),
        other => panic!("unexpected {other:?}"),
    }
}

/// `format: date-time` as the API server checks it: the far future (a claim that never expires)
/// is a date-time, an offset beyond 23:59 is not.
#[tokio::test]
async fn custom_resource_date_times_are_rfc_3339() {
    let sim = sim(Isolation::None).await;
    let resource = kube::api::ApiResource {
        group: "extensions.agents.x-k8s.io".into(),
        version: "v1beta1".into(),
        api_version: agent_sandbox_api::EXTENSIONS_API_VERSION.into(),
        kind: agent_sandbox_api::kinds::SANDBOX_CLAIM.into(),
        plural: "sandboxclaims".into(),
    };
    let claims: Api<kube::api::DynamicObject> =
        Api::default_namespaced_with(sim.client().unwrap(), &resource);
    let claim = |name: &str, when: &str| -> kube::api::DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": agent_sandbox_api::EXTENSIONS_API_VERSION, "kind": agent_sandbox_api::kinds::SANDBOX_CLAIM,
            "metadata": {"name": name},
            "spec": {"warmPoolRef": {"name": "pool"}, "lifecycle": {"shutdownTime": when}}
        }))
        .unwrap()
    };
    for (name, when) in [
        ("far", "9999-12-31T23:59:59Z"),
        ("offset", "2026-06-30T08:15:00.25-23:59"),
    ] {
        let created = claims
            .create(&PostParams::default(), &claim(name, when))
            .await
            .unwrap();
        assert_eq!(created.data["spec"]["lifecycle"]["shutdownTime"], when);
    }
    for (name, when) in [
        ("beyond", "2026-01-01T00:00:00+25:00"),
        ("leap", "2016-12-31T23:59:60Z"),
        ("year", "10000-01-01T00:00:00Z"),
    ] {
        let invalid = api_error(
            claims
                .create(&PostParams::default(), &claim(name, when))
                .await
                .unwrap_err(),
        );
        assert_eq!(
            (invalid.code, invalid.reason.as_str()),
            (422, "Invalid"),
            "{when}"
        );
        assert!(
            invalid.message.contains("spec.lifecycle.shutdownTime"),
            "{}",
            invalid.message
        );
    }
}
