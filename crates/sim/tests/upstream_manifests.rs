//! Upstream's own manifests against our CRDs: every Sandbox, SandboxTemplate, SandboxWarmPool and
//! SandboxClaim in upstream v1.0.3's `examples/`, `k8s/` and `clients/` (copied, unmodified, to
//! `tests/upstream-manifests/v1.0.3/`; see its README) is applied with the real
//! `kubectl apply --server-side` (strict field validation, kubectl's default) to a sim that has
//! our generated CRDs (`deploy/crds/`, applied with kubectl too), and must be accepted and stored
//! without losing a field.
//!
//! Only objects of our four kinds are applied: the other kinds in those files (Deployments,
//! ConfigMaps, Gateways, ...) are the sim's business, not our CRDs'. Kustomize patches are applied
//! as their overlays render them.
//!
//! The list markers the CRDs now share with upstream's are what server-side apply merges by:
//! two field managers' containers, ports and env live side by side instead of one replacing the
//! other (`lists_merge_by_upstreams_keys`).
//!
//! Skipped, with a printed reason, where `kubectl` is not installed; under `CI=true` a missing
//! kubectl fails instead.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};

use agent_sandbox_sim::{Sim, SimConfig};
use assert_json_diff::{CompareMode, Config, assert_json_matches_no_panic};
use common::Kubectl;
use serde_json::Value;

/// Skips the test without kubectl (reported as skipped; a failure under `CI=true`).
macro_rules! require_kubectl {
    () => {
        if agent_sandbox_local::testkit::missing(agent_sandbox_local::testkit::Tool::Kubectl) {
            return;
        }
    };
}

const OUR_KINDS: [(&str, &str); 4] = [
    ("agents.x-k8s.io/v1beta1", "Sandbox"),
    ("extensions.agents.x-k8s.io/v1beta1", "SandboxTemplate"),
    ("extensions.agents.x-k8s.io/v1beta1", "SandboxWarmPool"),
    ("extensions.agents.x-k8s.io/v1beta1", "SandboxClaim"),
];

/// Files holding our kinds that are not manifests to apply on their own, and why.
const NOT_MANIFESTS: [(&str, &str); 3] = [
    (
        "examples/vscode-sandbox/overlays/gvisor/patch-gvisor.yaml",
        "a kustomize patch (a partial Sandbox), applied as its overlay renders it",
    ),
    (
        "examples/vscode-sandbox/overlays/kata/patch-kata.yaml",
        "a kustomize patch (a partial Sandbox), applied as its overlay renders it",
    ),
    (
        "examples/vscode-sandbox/overlays/kata-mshv/patch-kata.yaml",
        "a kustomize patch (a partial Sandbox), applied as its overlay renders it",
    ),
];

/// Kustomizations whose output holds our kinds, rendered with `kubectl kustomize`.
const KUSTOMIZATIONS: [&str; 5] = [
    "examples/nono-sandbox",
    "examples/vscode-sandbox/base",
    "examples/vscode-sandbox/overlays/gvisor",
    "examples/vscode-sandbox/overlays/kata",
    "examples/vscode-sandbox/overlays/kata-mshv",
];

/// Manifests our CRDs refuse, and why (each also in docs/controller.md, "Differences from
/// upstream"). None today.
const REFUSED: [(&str, &str); 0] = [];

/// How many files of the data set hold our kinds, patches included: a guard against a data set
/// that silently shrank.
const FILES_WITH_OUR_KINDS: usize = 86;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/upstream-manifests/v1.0.3")
}

/// Every `.yaml`/`.yml` file below `dir`, as paths relative to it, sorted.
fn yaml_files(dir: &Path, relative: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let name = relative.join(entry.file_name());
        if path.is_dir() {
            yaml_files(&path, &name, out);
        } else if path
            .extension()
            .is_some_and(|ext| ext == "yaml" || ext == "yml")
        {
            out.push(name);
        }
    }
}

/// Templates that upstream's docs render with `envsubst` before applying, with the values their
/// READMEs export (`examples/python-sdk-quickstart/README.md`,
/// `examples/keda-scale-to-zero/README.md`): as they stand, `${NAME}` is not a valid object name.
const ENVSUBST: [(&str, &[(&str, &str)]); 4] = [
    (
        "clients/python/agentic-sandbox-client/python-sandbox-template.yaml",
        &[
            ("SANDBOX_NAMESPACE", "default"),
            ("SANDBOX_TEMPLATE_NAME", "python-sandbox-template"),
        ],
    ),
    (
        "clients/python/agentic-sandbox-client/python-sandbox-warmpool.yaml",
        &[
            ("SANDBOX_NAMESPACE", "default"),
            ("SANDBOX_TEMPLATE_NAME", "python-sandbox-template"),
            ("SANDBOX_WARMPOOL_NAME", "python-sandbox-pool"),
        ],
    ),
    (
        "examples/keda-scale-to-zero/python-sandbox-template.yaml",
        &[
            ("NAMESPACE", "keda-test"),
            ("TEMPLATE_NAME", "python-sandbox-template"),
        ],
    ),
    (
        "examples/keda-scale-to-zero/sandboxwarmpool.yaml",
        &[
            ("NAMESPACE", "keda-test"),
            ("TEMPLATE_NAME", "python-sandbox-template"),
            ("WARM_POOL_NAME", "python-sdk-warmpool"),
        ],
    ),
];

/// The text of `source` as upstream's instructions apply it.
fn rendered(source: &str, text: String) -> String {
    let Some((_, variables)) = ENVSUBST.iter().find(|(path, _)| *path == source) else {
        return text;
    };
    let mut text = text;
    for (name, value) in *variables {
        let placeholder = format!("${{{name}}}");
        assert!(text.contains(&placeholder), "{source} has no {placeholder}");
        text = text.replace(&placeholder, value);
    }
    text
}

/// One object of our kinds: its YAML text as written (kubectl parses it, YAML 1.1 octals and
/// all) and its namespace.
struct Manifest {
    text: String,
    namespace: String,
}

/// The documents of a YAML stream that are objects of our kinds.
fn our_objects(text: &str, source: &str) -> Vec<Manifest> {
    let mut documents = vec![String::new()];
    for line in text.lines() {
        if line.trim_end() == "---" || line.starts_with("--- ") {
            documents.push(line.strip_prefix("---").unwrap_or_default().to_owned());
        } else if let Some(last) = documents.last_mut() {
            last.push_str(line);
            last.push('\n');
        }
    }
    documents
        .into_iter()
        .filter_map(|document| {
            let value: Value = serde_saphyr::from_str(&document)
                .unwrap_or_else(|e| panic!("{source}: {e}\n{document}"));
            let ours = OUR_KINDS.iter().any(|(api_version, kind)| {
                value["apiVersion"] == *api_version && value["kind"] == *kind
            });
            ours.then(|| Manifest {
                namespace: value["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("default")
                    .to_owned(),
                text: document,
            })
        })
        .collect()
}

/// The objects of a `kubectl ... -o json` answer (one JSON document per object, or a `List`).
fn items(json: &str) -> Vec<Value> {
    serde_json::Deserializer::from_str(json)
        .into_iter::<Value>()
        .flat_map(|value| {
            let value = value.unwrap();
            match value["kind"].as_str() {
                Some("List") => value["items"].as_array().cloned().unwrap_or_default(),
                _ => vec![value],
            }
        })
        .collect()
}

/// Applies `manifests` (from `source`), and returns why they were refused, if they were. Accepted
/// objects must come back with every field kubectl sent. They are deleted again, so that
/// same-named objects of different examples do not meet.
async fn apply(kubectl: &Kubectl, source: &str, manifests: &[Manifest]) -> Option<String> {
    let mut namespaces: Vec<&str> = manifests.iter().map(|m| m.namespace.as_str()).collect();
    namespaces.sort_unstable();
    namespaces.dedup();
    for namespace in namespaces.into_iter().filter(|ns| *ns != "default") {
        let object = serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace},
        });
        kubectl
            .ok_with_input(
                &["apply", "--server-side", "-f", "-"],
                Some(&object.to_string()),
            )
            .await;
    }
    let stream: Vec<&str> = manifests.iter().map(|m| m.text.as_str()).collect();
    let stream = stream.join("\n---\n");
    // What kubectl makes of the YAML, before any server sees it.
    let sent = items(
        &kubectl
            .ok_with_input(
                &["create", "--dry-run=client", "-o", "json", "-f", "-"],
                Some(&stream),
            )
            .await,
    );
    let output = kubectl
        .run_with_input(
            &["apply", "--server-side", "-o", "json", "-f", "-"],
            Some(&stream),
        )
        .await;
    if !output.status.success() {
        return Some(String::from_utf8_lossy(&output.stderr).trim().to_owned());
    }
    let stored = items(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(stored.len(), sent.len(), "{source}");
    let mut problem = None;
    for (sent, stored) in sent.iter().zip(&stored) {
        if let Err(lost) =
            assert_json_matches_no_panic(stored, sent, Config::new(CompareMode::Inclusive))
        {
            problem = Some(format!(
                "{} {} did not come back as applied:\n{lost}",
                sent["kind"], sent["metadata"]["name"]
            ));
        }
    }
    kubectl
        .ok_with_input(&["delete", "-f", "-"], Some(&stream))
        .await;
    problem
}

#[tokio::test]
async fn upstream_manifests_are_accepted_by_our_crds() {
    require_kubectl!();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let kubectl = Kubectl::new(&sim);
    let crds: Vec<String> = [
        "sandboxes",
        "sandboxtemplates",
        "sandboxwarmpools",
        "sandboxclaims",
    ]
    .iter()
    .map(|name| {
        workspace_root()
            .join(format!("deploy/crds/{name}.yaml"))
            .display()
            .to_string()
    })
    .collect();
    let mut args = vec!["apply", "--server-side"];
    for crd in &crds {
        args.extend(["-f", crd.as_str()]);
    }
    kubectl.ok(&args).await;

    let mut files = Vec::new();
    yaml_files(&data_dir(), Path::new(""), &mut files);
    files.sort();
    let mut with_our_kinds = 0;
    let mut applied = 0;
    let mut refused: Vec<(String, String)> = Vec::new();
    for file in &files {
        let source = file.display().to_string();
        let text = rendered(
            &source,
            std::fs::read_to_string(data_dir().join(file)).unwrap(),
        );
        let objects = our_objects(&text, &source);
        if objects.is_empty() {
            continue;
        }
        with_our_kinds += 1;
        if NOT_MANIFESTS.iter().any(|(path, _)| *path == source) {
            continue;
        }
        applied += objects.len();
        if let Some(why) = apply(&kubectl, &source, &objects).await {
            refused.push((source, why));
        }
    }
    for dir in KUSTOMIZATIONS {
        let path = data_dir().join(dir).display().to_string();
        let rendered = kubectl.ok(&["kustomize", &path]).await;
        let source = format!("{dir} (kustomize)");
        let objects = our_objects(&rendered, &source);
        assert!(!objects.is_empty(), "{source} renders none of our kinds");
        applied += objects.len();
        if let Some(why) = apply(&kubectl, &source, &objects).await {
            refused.push((source, why));
        }
    }
    println!(
        "{applied} objects of our kinds from {with_our_kinds} upstream files and {} \
         kustomizations applied; {} refused",
        KUSTOMIZATIONS.len(),
        refused.len()
    );
    assert_eq!(
        with_our_kinds, FILES_WITH_OUR_KINDS,
        "the data set changed: update FILES_WITH_OUR_KINDS and the README"
    );
    let unexpected: Vec<String> = refused
        .iter()
        .filter(|(source, _)| !REFUSED.iter().any(|(path, _)| path == source))
        .map(|(source, why)| format!("{source}:\n  {why}"))
        .collect();
    assert!(
        unexpected.is_empty(),
        "{} upstream manifests were refused:\n{}",
        unexpected.len(),
        unexpected.join("\n")
    );
    for (path, why) in REFUSED {
        assert!(
            refused.iter().any(|(source, _)| source == path),
            "{path} is accepted now ({why}): remove it from REFUSED and docs/controller.md"
        );
    }
}

/// Two appliers of one Sandbox, each owning its own container, port and variable: on upstream's
/// CRDs (and ours) `containers` merges by name, `ports` by port and protocol, `env` by name, so
/// both keep theirs; an atomic list would be a conflict between the two managers.
#[tokio::test]
async fn lists_merge_by_upstreams_keys() {
    require_kubectl!();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    sim.apply_crds().unwrap();
    let kubectl = Kubectl::new(&sim);
    let sandbox = |container: &str, port: u16, variable: &str| {
        serde_json::json!({
            "apiVersion": "agents.x-k8s.io/v1beta1",
            "kind": "Sandbox",
            "metadata": {"name": "shared"},
            "spec": {"podTemplate": {"spec": {"containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "ports": [{"containerPort": port}],
                    "env": [{"name": variable, "value": "1"}],
                },
                {"name": container, "image": "busybox"},
            ]}}},
        })
        .to_string()
    };
    for (manager, container, port, variable) in [
        ("first", "one", 8080, "FIRST"),
        ("second", "two", 9090, "SECOND"),
    ] {
        kubectl
            .ok_with_input(
                &[
                    "apply",
                    "--server-side",
                    &format!("--field-manager={manager}"),
                    "-f",
                    "-",
                ],
                Some(&sandbox(container, port, variable)),
            )
            .await;
    }
    let stored: Value = serde_json::from_str(
        &kubectl
            .ok(&["get", "sandbox", "shared", "-o", "json"])
            .await,
    )
    .unwrap();
    let spec = &stored["spec"]["podTemplate"]["spec"];
    let names: Vec<&str> = spec["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["main", "one", "two"], "{spec}");
    let main = &spec["containers"][0];
    assert_eq!(
        main["ports"],
        serde_json::json!([
            {"containerPort": 8080, "protocol": "TCP"},
            {"containerPort": 9090, "protocol": "TCP"},
        ])
    );
    assert_eq!(
        main["env"],
        serde_json::json!([{"name": "FIRST", "value": "1"}, {"name": "SECOND", "value": "1"}])
    );
}
