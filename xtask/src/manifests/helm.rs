//! The Helm chart (`deploy/helm/agent-sandbox`), checked with the real `helm` that `cargo xtask
//! tools` builds:
//!
//! 1. `helm lint --strict` with the default values and with `ci/custom-values.yaml`;
//! 2. `helm template` with the defaults renders the objects of `deploy/overlays/release`, field
//!    for field, but for [`DIFFERENCES`];
//! 3. every object of every render (defaults, the custom values, each auth mode, the hardening
//!    options) is strict as [`super::check_strict`] defines it (its type's fields only, our kinds
//!    against their CRD schemas), and its pods meet the restricted Pod Security Standard;
//! 4. `values.schema.json` refuses a misspelt key or a value out of its set, with Helm's error
//!    naming it;
//! 5. `flux/release-helm` (a Flux HelmRelease of the chart) is strict, points at the chart in
//!    a source defined beside it, and its values render.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::{
    ImagePolicy, check_strict, describe, image_problems, parse, pod_security_problems, render,
    wiring_problems,
};

/// The chart, relative to the workspace root.
pub(crate) const CHART: &str = "deploy/helm/agent-sandbox";
/// Non-default values that exercise every knob (also chart-testing's convention).
pub(crate) const CUSTOM_VALUES: &str = "deploy/helm/agent-sandbox/ci/custom-values.yaml";
/// The overlay the default render must equal.
pub(crate) const RELEASE: &str = "deploy/overlays/release";
/// The release name the checks use.
const RELEASE_NAME: &str = "agent-sandbox";
/// The Flux folder that installs the chart.
pub(crate) const FLUX_HELM: &str = "flux/release-helm";

/// What the chart's default render and the release overlay hold differently, and why.
pub(crate) const DIFFERENCES: [(&str, &str); 2] = [
    (
        "Namespace agent-sandbox-system",
        "Helm installs into a namespace it is given (`--namespace agent-sandbox-system \
         --create-namespace`) and cannot own that namespace itself; label it for the restricted \
         Pod Security Standard as docs/install.md shows",
    ),
    (
        "Secret agent-sandbox-system/sandbox-router-signing-key",
        "the overlay leaves the router's signing key to the installer (docs/install.md); the \
         chart makes one, once, and keeps it on upgrades, unless router.auth.existingSecret \
         names one",
    ),
];

/// Runs `helm` with `args` in `root`; its standard output, or an error with its standard error.
pub(crate) fn helm(root: &Path, args: &[&str]) -> Result<String> {
    let output = Command::new("helm")
        .args(args)
        .current_dir(root)
        .output()
        .context("failed to run `helm` (cargo xtask tools builds it; .ci/run puts it on PATH)")?;
    if !output.status.success() {
        bail!(
            "`helm {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    String::from_utf8(output.stdout).context("helm printed something that is not UTF-8")
}

/// `helm template` of the chart (its CRDs included) into `namespace` with `extra` arguments
/// (`--set`, `-f`), parsed.
pub(crate) fn template(root: &Path, namespace: &str, extra: &[&str]) -> Result<Vec<Value>> {
    let mut args = vec![
        "template",
        RELEASE_NAME,
        CHART,
        "--include-crds",
        "--namespace",
        namespace,
    ];
    args.extend_from_slice(extra);
    parse(&helm(root, &args)?)
}

/// The key an object is compared by.
fn key(object: &Value) -> String {
    describe(object)
}

/// Where `chart` and `release` differ, beyond [`DIFFERENCES`]: objects only one of them holds,
/// and the first differing field of each object both hold.
pub(crate) fn release_differences(chart: &[Value], release: &[Value]) -> Vec<String> {
    let allowed: Vec<&str> = DIFFERENCES.iter().map(|(what, _)| *what).collect();
    let index = |objects: &[Value]| -> BTreeMap<String, Value> {
        objects
            .iter()
            .map(|o| (key(o), o.clone()))
            .filter(|(k, _)| !allowed.contains(&k.as_str()))
            .collect()
    };
    let (chart, release) = (index(chart), index(release));
    let mut problems = Vec::new();
    for (name, object) in &release {
        match chart.get(name) {
            None => problems.push(format!("{name} is in {RELEASE} but not in the chart")),
            Some(rendered) => {
                if let Some(difference) = first_difference(object, rendered, &mut String::new()) {
                    problems.push(format!("{name}: {difference}"));
                }
            }
        }
    }
    for name in chart.keys().filter(|name| !release.contains_key(*name)) {
        problems.push(format!("{name} is in the chart but not in {RELEASE}"));
    }
    problems
}

/// The first path where `a` (the overlay's) and `b` (the chart's) differ.
fn first_difference(a: &Value, b: &Value, path: &mut String) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
                let found = match (x.get(k), y.get(k)) {
                    (Some(v), Some(w)) => first_difference(v, w, path),
                    (Some(v), None) => {
                        Some(format!("{path}: {v} in {RELEASE}, absent in the chart"))
                    }
                    (None, Some(w)) => {
                        Some(format!("{path}: {w} in the chart, absent in {RELEASE}"))
                    }
                    (None, None) => None,
                };
                path.truncate(len);
                if found.is_some() {
                    return found;
                }
            }
            None
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            x.iter().zip(y).enumerate().find_map(|(i, (v, w))| {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                let found = first_difference(v, w, path);
                path.truncate(len);
                found
            })
        }
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => None,
        (x, y) if x == y => None,
        (x, y) => Some(format!("{path}: {x} in {RELEASE}, {y} in the chart")),
    }
}

/// Problems of one render: objects that are not strict, and images not pinned by digest when
/// `pinned`.
fn render_problems(label: &str, objects: &[Value], pinned: bool) -> Vec<String> {
    let mut problems: Vec<String> = objects
        .iter()
        .filter_map(|o| check_strict(o).err())
        .map(|e| format!("{label}: {e:#}"))
        .collect();
    problems.extend(
        pod_security_problems(objects)
            .into_iter()
            .map(|p| format!("{label}: {p}")),
    );
    if pinned {
        problems.extend(
            image_problems(objects, ImagePolicy::Release)
                .into_iter()
                .map(|p| format!("{label}: {p}")),
        );
    }
    problems
}

/// Every check of the chart; one summary line per check, or every problem.
pub(crate) fn check_chart(root: &Path) -> Result<Vec<String>> {
    let mut summary = Vec::new();
    let mut problems = Vec::new();
    for extra in [&[][..], &["--values", CUSTOM_VALUES][..]] {
        let mut args = vec!["lint", "--strict", CHART];
        args.extend_from_slice(extra);
        match helm(root, &args) {
            Ok(_) => summary.push(format!("helm {}: ok", args.join(" "))),
            Err(error) => problems.push(format!("{error:#}")),
        }
    }
    let system = agent_sandbox_api::wire::SYSTEM_NAMESPACE;
    let defaults = template(root, system, &[])?;
    problems.extend(render_problems("chart defaults", &defaults, true));
    problems.extend(
        wiring_problems(&defaults)
            .into_iter()
            .map(|p| format!("chart defaults: {p}")),
    );
    let release = render(root, RELEASE)?;
    problems.extend(release_differences(&defaults, &release));
    summary.push(format!(
        "chart defaults: {} objects, the same as {RELEASE} but for {} known differences",
        defaults.len(),
        DIFFERENCES.len()
    ));
    for (label, namespace, extra) in [
        (
            "chart custom values",
            "sandboxes-system",
            &["--values", CUSTOM_VALUES][..],
        ),
        (
            "chart token auth",
            system,
            &["--set", "router.auth.mode=token"][..],
        ),
        (
            "chart no auth",
            system,
            &["--set", "router.auth.mode=none"][..],
        ),
        (
            "chart hardened",
            system,
            &[
                "--set",
                "router.scope=namespace,controller.networkPolicy.enabled=true,\
                 sandboxes.enabled=true,sandboxes.createNamespace=true,sandboxes.namespace=agents",
            ][..],
        ),
    ] {
        let objects = template(root, namespace, extra)?;
        problems.extend(render_problems(label, &objects, false));
        summary.push(format!("{label}: {} objects", objects.len()));
    }
    let flux = render(root, FLUX_HELM)?;
    problems.extend(render_problems(FLUX_HELM, &flux, false));
    problems.extend(flux_problems(root, &flux)?);
    summary.push(format!("{FLUX_HELM}: {} objects", flux.len()));
    if !problems.is_empty() {
        bail!(
            "{} problem(s) in the Helm chart:\n  {}",
            problems.len(),
            problems.join("\n  ")
        );
    }
    Ok(summary)
}

/// Problems of the Flux HelmRelease folder: where its chart comes from, how CRDs are handled,
/// and whether its values pass the chart's schema and render strict objects.
fn flux_problems(root: &Path, objects: &[Value]) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let releases: Vec<super::flux::HelmRelease> = objects
        .iter()
        .filter(|o| o["apiVersion"] == super::flux::HELM_API)
        .filter_map(|o| serde_json::from_value(o.clone()).ok())
        .collect();
    let [release] = releases.as_slice() else {
        problems.push(format!(
            "{FLUX_HELM}: expected one HelmRelease, found {}",
            releases.len()
        ));
        return Ok(problems);
    };
    let spec = &release.spec;
    let chart = &spec.chart.spec;
    if chart.chart.trim_start_matches("./") != CHART {
        problems.push(format!(
            "{FLUX_HELM}: the HelmRelease installs {}, not {CHART}",
            chart.chart
        ));
    }
    let source = objects.iter().find(|o| {
        o["apiVersion"] == super::flux::SOURCE_API
            && o["kind"] == chart.source_ref.kind
            && o["metadata"]["name"] == chart.source_ref.name
    });
    match source {
        None => problems.push(format!(
            "{FLUX_HELM}: source {} {} is not defined beside the HelmRelease",
            chart.source_ref.kind, chart.source_ref.name
        )),
        Some(source) => {
            let ignore = source["spec"]["ignore"].as_str().unwrap_or_default();
            if !ignore.is_empty() && !ignore.contains("!/deploy/helm/") {
                problems.push(format!(
                    "{FLUX_HELM}: the source's ignore rules leave the chart out"
                ));
            }
        }
    }
    let system = agent_sandbox_api::wire::SYSTEM_NAMESPACE;
    if spec.target_namespace.as_deref() != Some(system) {
        problems.push(format!(
            "{FLUX_HELM}: targetNamespace is not {system}, where clients look for the router"
        ));
    }
    let crds = |step: &Option<super::flux::HelmInstall>| {
        step.as_ref()
            .and_then(|s| s.crds.clone())
            .unwrap_or_default()
    };
    if crds(&spec.install) != "Create" || crds(&spec.upgrade) != "CreateReplace" {
        problems.push(format!(
            "{FLUX_HELM}: CRDs must be created on install and replaced on upgrade \
             (install.crds: Create, upgrade.crds: CreateReplace)"
        ));
    }
    // Its values, through the chart's schema and templates.
    let dir = tempfile::tempdir().context("failed to create a temporary directory")?;
    let values = dir.path().join("values.json");
    std::fs::write(
        &values,
        serde_json::to_vec(spec.values.as_ref().unwrap_or(&Value::Null))?,
    )?;
    let values = values.to_string_lossy().into_owned();
    match template(root, system, &["--values", &values]) {
        Ok(rendered) => {
            problems.extend(render_problems(
                &format!("{FLUX_HELM} values"),
                &rendered,
                true,
            ));
        }
        Err(error) => problems.push(format!("{FLUX_HELM} values: {error:#}")),
    }
    Ok(problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace_root;
    use agent_sandbox_api::kinds;
    use agent_sandbox_local::testkit::{Tool, missing};

    /// helm renders, kubectl renders the overlay; without them the test is skipped (fails
    /// under `CI=true`).
    fn tools_available() -> bool {
        !missing(Tool::Helm) && !missing(Tool::Kubectl)
    }

    fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    }

    fn args_of(deployment: &Value) -> Vec<String> {
        deployment["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect()
    }

    /// The acceptance check: lint, the default render equals the release overlay, every render
    /// is strict.
    #[test]
    fn the_chart_lints_and_its_default_render_is_the_release_overlay() {
        if !tools_available() {
            return;
        }
        match check_chart(&workspace_root()) {
            Ok(summary) => assert_eq!(summary.len(), 2 + 1 + 4 + 1, "{summary:#?}"),
            Err(error) => panic!("{error:#}"),
        }
    }

    /// The comparison finds a changed field, a missing object and an extra one.
    #[test]
    fn a_drift_from_the_overlay_is_named() {
        let overlay = vec![
            serde_json::json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "a", "namespace": "n"}, "spec": {"ports": [{"port": 80}]}}),
            serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "b", "namespace": "n"}}),
        ];
        let mut chart = overlay.clone();
        chart[0]["spec"]["ports"][0]["port"] = 81.into();
        chart[1]["metadata"]["name"] = "c".into();
        let problems = release_differences(&chart, &overlay);
        assert_eq!(
            problems,
            [
                format!("Service n/a: spec.ports[0].port: 80 in {RELEASE}, 81 in the chart"),
                format!("ServiceAccount n/b is in {RELEASE} but not in the chart"),
                format!("ServiceAccount n/c is in the chart but not in {RELEASE}"),
            ]
        );
        assert!(release_differences(&overlay, &overlay).is_empty());
    }

    /// Non-default values reach the objects: another namespace (which the controller's default
    /// NetworkPolicy then admits the router from), tags, replicas, extra flags, the optional
    /// template and pool, and each auth mode with its Secret.
    #[test]
    fn values_reach_the_objects() {
        if !tools_available() {
            return;
        }
        let root = workspace_root();
        let custom = template(&root, "sandboxes-system", &["--values", CUSTOM_VALUES]).unwrap();
        let controller = find(&custom, "Deployment", "agent-sandbox-controller").unwrap();
        assert_eq!(controller["metadata"]["namespace"], "sandboxes-system");
        let args = args_of(controller);
        assert!(
            args.contains(&"--router-namespace=sandboxes-system".to_owned()),
            "{args:?}"
        );
        assert!(
            args.contains(&"--sandbox-warm-pool-max-replicas=50".to_owned()),
            "{args:?}"
        );
        assert_eq!(
            controller["spec"]["template"]["spec"]["containers"][0]["image"],
            "registry.example.com/agent-sandbox-controller:v0.1.0-rc1"
        );
        let crb = find(&custom, "ClusterRoleBinding", "agent-sandbox-controller").unwrap();
        assert_eq!(crb["subjects"][0]["namespace"], "sandboxes-system");
        // A namespaced router: bound where it watches, to its account in the release's namespace.
        let binding = find(&custom, "RoleBinding", "sandbox-router").unwrap();
        assert_eq!(binding["metadata"]["namespace"], "agents");
        assert_eq!(binding["subjects"][0]["namespace"], "sandboxes-system");
        let router = find(&custom, "Deployment", "sandbox-router").unwrap();
        assert_eq!(router["spec"]["replicas"], 3);
        let args = args_of(router);
        assert!(args.contains(&"--auth=token".to_owned()), "{args:?}");
        assert!(
            args.contains(&"--token-file=/etc/sandbox-router/token/token".to_owned()),
            "{args:?}"
        );
        assert!(
            args.contains(&"--activity-interval=60".to_owned()),
            "{args:?}"
        );
        assert!(args.contains(&"--namespace=agents".to_owned()), "{args:?}");
        assert_eq!(
            router["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"],
            "team-router-token"
        );
        // An existing Secret: the chart makes none; no PDB or NetworkPolicy when disabled.
        assert!(!custom.iter().any(|o| o["kind"] == "Secret"));
        assert!(find(&custom, "PodDisruptionBudget", "sandbox-router").is_none());
        let template_ = find(&custom, "SandboxTemplate", "python-runtime").unwrap();
        assert_eq!(template_["metadata"]["namespace"], "agents");
        assert_eq!(
            template_["spec"]["podTemplate"]["spec"]["runtimeClassName"],
            "gvisor"
        );
        let pool = find(&custom, "SandboxWarmPool", "python-sandbox-pool").unwrap();
        assert_eq!(pool["spec"]["replicas"], 5);

        let system = agent_sandbox_api::wire::SYSTEM_NAMESPACE;
        let token = template(&root, system, &["--set", "router.auth.mode=token"]).unwrap();
        let secret = find(&token, "Secret", "sandbox-router-token").unwrap();
        let value = secret["data"]["token"].as_str().unwrap();
        assert!(value.len() >= 64, "48 random characters, base64: {value}");
        let none = template(&root, system, &["--set", "router.auth.mode=none"]).unwrap();
        let router = find(&none, "Deployment", "sandbox-router").unwrap();
        assert_eq!(args_of(router)[0], "--auth=none");
        assert!(router["spec"]["template"]["spec"]["volumes"].is_null());
        assert!(!none.iter().any(|o| o["kind"] == "Secret"));
    }

    /// The chart's optional template and pool are deploy/sandboxes' (but for the image), so
    /// both install sandboxes whose pods meet the restricted Pod Security Standard, are
    /// restarted when the runtime stops answering, and have a disk cap.
    #[test]
    fn the_charts_sandboxes_are_deploy_sandboxes() {
        if !tools_available() {
            return;
        }
        let root = workspace_root();
        let system = agent_sandbox_api::wire::SYSTEM_NAMESPACE;
        let chart = template(&root, system, &["--set", "sandboxes.enabled=true"]).unwrap();
        let deployed = render(&root, "deploy/sandboxes").unwrap();
        for (kind, name) in [
            (kinds::SANDBOX_TEMPLATE, "python-runtime"),
            (kinds::SANDBOX_WARM_POOL, "python-sandbox-pool"),
        ] {
            let (mut ours, mut theirs) = (
                find(&chart, kind, name).unwrap().clone(),
                find(&deployed, kind, name).unwrap().clone(),
            );
            for object in [&mut ours, &mut theirs] {
                if let Some(container) =
                    object.pointer_mut("/spec/podTemplate/spec/containers/0/image")
                {
                    *container = Value::Null;
                }
            }
            assert_eq!(ours, theirs, "{kind} {name}");
        }
        let pod = &find(&chart, kinds::SANDBOX_TEMPLATE, "python-runtime").unwrap()["spec"]["podTemplate"]
            ["spec"];
        assert_eq!(
            super::super::tests::sandbox_pod_problems(pod),
            Vec::<String>::new()
        );
    }

    /// router.scope=namespace: the router reads Sandboxes and Pods of one namespace (a Role
    /// and RoleBinding there, its --namespace flag), and nothing elsewhere.
    #[test]
    fn a_namespaced_router_reads_only_the_namespace_it_watches() {
        use clap::Parser as _;
        if !tools_available() {
            return;
        }
        let root = workspace_root();
        let system = agent_sandbox_api::wire::SYSTEM_NAMESPACE;
        let objects = template(
            &root,
            system,
            &["--set", "router.scope=namespace,sandboxes.namespace=team-a"],
        )
        .unwrap();
        assert!(find(&objects, "ClusterRole", "sandbox-router").is_none());
        assert!(find(&objects, "ClusterRoleBinding", "sandbox-router").is_none());
        let role = find(&objects, "Role", "sandbox-router").unwrap();
        assert_eq!(role["metadata"]["namespace"], "team-a");
        let default_role = template(&root, system, &[]).unwrap();
        assert_eq!(
            role["rules"],
            find(&default_role, "ClusterRole", "sandbox-router").unwrap()["rules"],
            "the same rules, in one namespace"
        );
        let binding = find(&objects, "RoleBinding", "sandbox-router").unwrap();
        assert_eq!(binding["metadata"]["namespace"], "team-a");
        assert_eq!(binding["roleRef"]["kind"], "Role");
        assert_eq!(binding["subjects"][0]["namespace"], system);
        #[derive(clap::Parser)]
        struct RouterCli {
            #[command(flatten)]
            args: agent_sandbox_router::Args,
            #[arg(long)]
            log_format: String,
        }
        let router = find(&objects, "Deployment", "sandbox-router").unwrap();
        let argv = std::iter::once("sandbox-router".to_owned()).chain(args_of(router));
        let cli = RouterCli::try_parse_from(argv).unwrap();
        assert_eq!(cli.args.namespace.as_deref(), Some("team-a"));
        // watchNamespace wins over the sandboxes' namespace.
        let objects = template(
            &root,
            system,
            &[
                "--set",
                "router.scope=namespace,router.watchNamespace=team-b",
            ],
        )
        .unwrap();
        let role = find(&objects, "Role", "sandbox-router").unwrap();
        assert_eq!(role["metadata"]["namespace"], "team-b");
        let router = find(&objects, "Deployment", "sandbox-router").unwrap();
        assert!(args_of(router).contains(&"--namespace=team-b".to_owned()));
    }

    /// controller.networkPolicy.enabled: ingress to the controller only on its metrics port,
    /// only from the scraper's pods; its health port is for the kubelet, whose probes come from
    /// the node, which NetworkPolicy always admits.
    #[test]
    fn the_controller_policy_admits_only_the_metrics_scraper() {
        if !tools_available() {
            return;
        }
        let root = workspace_root();
        let system = agent_sandbox_api::wire::SYSTEM_NAMESPACE;
        let defaults = template(&root, system, &[]).unwrap();
        assert!(find(&defaults, "NetworkPolicy", "agent-sandbox-controller").is_none());
        let objects = template(
            &root,
            system,
            &["--set", "controller.networkPolicy.enabled=true"],
        )
        .unwrap();
        let policy = find(&objects, "NetworkPolicy", "agent-sandbox-controller").unwrap();
        let controller = find(&objects, "Deployment", "agent-sandbox-controller").unwrap();
        let pod = &controller["spec"]["template"];
        for (key, value) in policy["spec"]["podSelector"]["matchLabels"]
            .as_object()
            .unwrap()
        {
            assert_eq!(&pod["metadata"]["labels"][key], value, "{key}");
        }
        assert_eq!(
            policy["spec"]["policyTypes"],
            serde_json::json!(["Ingress"])
        );
        assert_eq!(
            policy["spec"]["ingress"],
            serde_json::json!([{
                "from": [{
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
                }],
                "ports": [{"protocol": "TCP", "port": "metrics"}],
            }])
        );
        // The named port is the one the controller serves metrics on.
        let ports = &pod["spec"]["containers"][0]["ports"];
        let metrics = ports
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "metrics")
            .unwrap();
        assert!(args_of(controller).contains(&format!(
            "--metrics-bind-address=0.0.0.0:{}",
            metrics["containerPort"]
        )));
        // Another scraper replaces the default one whole; no scraper at all (which would admit
        // everyone) is refused.
        let custom = template(&root, system, &["--values", CUSTOM_VALUES]).unwrap();
        let policy = find(&custom, "NetworkPolicy", "agent-sandbox-controller").unwrap();
        assert_eq!(
            policy["spec"]["ingress"][0]["from"],
            serde_json::json!([{
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
                "podSelector": {"matchExpressions": [{
                    "key": "app.kubernetes.io/name", "operator": "In", "values": ["prometheus", "vmagent"],
                }]},
            }])
        );
        let none = template(
            &root,
            system,
            &[
                "--set",
                "controller.networkPolicy.enabled=true",
                "--set-json",
                "controller.networkPolicy.metricsFrom=[]",
            ],
        );
        let error = format!("{:#}", none.unwrap_err());
        assert!(error.contains("metricsFrom"), "{error}");
    }

    /// sandboxes.createNamespace: the sandboxes' namespace enforces (and audits and warns about)
    /// the restricted Pod Security Standard; without it the chart makes no namespace.
    #[test]
    fn a_sandbox_namespace_the_chart_creates_enforces_restricted() {
        use agent_sandbox_api::labels;
        if !tools_available() {
            return;
        }
        let root = workspace_root();
        let system = agent_sandbox_api::wire::SYSTEM_NAMESPACE;
        let defaults = template(&root, system, &["--set", "sandboxes.enabled=true"]).unwrap();
        assert!(!defaults.iter().any(|o| o["kind"] == "Namespace"));
        let objects = template(
            &root,
            system,
            &[
                "--set",
                "sandboxes.enabled=true,sandboxes.createNamespace=true,sandboxes.namespace=agents",
            ],
        )
        .unwrap();
        let namespace = find(&objects, "Namespace", "agents").unwrap();
        for key in [
            labels::POD_SECURITY_ENFORCE,
            labels::POD_SECURITY_AUDIT,
            labels::POD_SECURITY_WARN,
        ] {
            assert_eq!(
                namespace["metadata"]["labels"][key],
                labels::POD_SECURITY_RESTRICTED,
                "{key}"
            );
        }
        let template_ = find(&objects, kinds::SANDBOX_TEMPLATE, "python-runtime").unwrap();
        assert_eq!(template_["metadata"]["namespace"], "agents");
        assert_eq!(
            super::super::tests::sandbox_pod_problems(&template_["spec"]["podTemplate"]["spec"]),
            Vec::<String>::new()
        );
    }

    /// A misspelt key or a value outside its set is refused before anything renders, and the
    /// error names it.
    #[test]
    fn the_values_schema_refuses_typos() {
        if !tools_available() {
            return;
        }
        let root = workspace_root();
        let system = agent_sandbox_api::wire::SYSTEM_NAMESPACE;
        for (set, named) in [
            ("controller.replica=2", "replica"),
            ("router.auth.mode=open", "mode"),
            ("router.image.digest=latest", "digest"),
            ("sandboxes.warmpool.replicas=3", "warmpool"),
            ("router.scope=cluster-wide", "scope"),
            ("controller.networkPolicy.from=x", "from"),
            ("controller.networkPolicy.metricsFrom[0].pods=x", "pods"),
        ] {
            let error = template(&root, system, &["--set", set]).unwrap_err();
            let message = format!("{error:#}");
            assert!(
                message.contains("values don't meet the specifications of the schema")
                    && message.contains(named),
                "--set {set}: {message}"
            );
        }
    }
}
