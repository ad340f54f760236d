//! Label keys and values shared by the controller, router, SDK and manifests.
//!
//! Every key is byte-identical to upstream's so that objects written by either implementation
//! are recognised by the other. Each constant says who writes it and who reads it.

/// `agents.x-k8s.io/sandbox-name-hash` = [`crate::name_hash`] of the Sandbox name.
///
/// Written by the Sandbox reconciler on the Pod, the headless Service and every PVC it creates,
/// and used as the Service selector. Read by the Sandbox reconciler (finding a sandbox's pods),
/// by the router's index (mapping pods back to sandboxes) and by anyone following
/// `Sandbox.status.selector`.
pub const SANDBOX_NAME_HASH: &str = "agents.x-k8s.io/sandbox-name-hash";

/// `agents.x-k8s.io/launch-type` on a Sandbox: [`LAUNCH_TYPE_COLD`] or [`LAUNCH_TYPE_WARM`].
///
/// Written by the warm-pool reconciler (`warm` on pool members) and by the claim reconciler
/// (`cold` on sandboxes it creates, `warm` on adoption). Read by metrics and `sandboxctl list`.
pub const LAUNCH_TYPE: &str = "agents.x-k8s.io/launch-type";
/// Value of [`LAUNCH_TYPE`] for a sandbox created for one claim.
pub const LAUNCH_TYPE_COLD: &str = "cold";
/// Value of [`LAUNCH_TYPE`] for a sandbox taken from a warm pool.
pub const LAUNCH_TYPE_WARM: &str = "warm";

/// `agents.x-k8s.io/created-by`: which kind of client asked for the object.
///
/// Written by the SDKs on the SandboxClaims they create ([`CREATED_BY_RUST_CLIENT`] by ours), by
/// the warm-pool reconciler on pool members ([`CREATED_BY_CONTROLLER`]) and copied by the
/// controller onto Sandboxes and Pods after normalisation (unknown values become
/// [`CREATED_BY_UNKNOWN`]). Read by metrics, and by users' NetworkPolicies that select sandbox
/// pods.
pub const CREATED_BY: &str = "agents.x-k8s.io/created-by";
/// Value of [`CREATED_BY`] written by upstream's Go SDK.
pub const CREATED_BY_GO_CLIENT: &str = "go-client";
/// Value of [`CREATED_BY`] written by upstream's Python SDK.
pub const CREATED_BY_PYTHON_CLIENT: &str = "python-client";
/// Value of [`CREATED_BY`] written by our Rust SDK (an addition: upstream normalises it to
/// [`CREATED_BY_UNKNOWN`]).
pub const CREATED_BY_RUST_CLIENT: &str = "rust-client";
/// Value of [`CREATED_BY`] on objects the controller creates on its own (warm-pool members).
pub const CREATED_BY_CONTROLLER: &str = "controller";
/// Value of [`CREATED_BY`] that any other value is normalised to.
pub const CREATED_BY_UNKNOWN: &str = "unknown";

/// `agents.x-k8s.io/sandbox-pod-template-hash`: deprecated hash of a template's pod template.
///
/// Written by the warm-pool reconciler on members for upstream compatibility; removed on
/// adoption. Read by nobody in this project (upstream's older staleness check read it).
pub const SANDBOX_POD_TEMPLATE_HASH: &str = "agents.x-k8s.io/sandbox-pod-template-hash";

/// `agents.x-k8s.io/sandbox-template-hash`: hash of the template's blueprint a pool member was
/// built from.
///
/// Written by the warm-pool reconciler on members; removed on adoption. Read by the warm-pool
/// reconciler (staleness under `updateStrategy: Recreate`) and by the claim reconciler (skipping
/// stale candidates).
pub const SANDBOX_TEMPLATE_HASH: &str = "agents.x-k8s.io/sandbox-template-hash";

/// `agents.x-k8s.io/adoptable` = `"true"`: authorises the controller to adopt an unowned Pod,
/// Service or PVC of the same name.
///
/// Written by users (or migration tooling). Read by the Sandbox reconciler before adopting.
pub const ADOPTABLE: &str = "agents.x-k8s.io/adoptable";

/// `agents.x-k8s.io/warm-pool-sandbox` = [`crate::name_hash`] of the pool name; marks an
/// unclaimed pool member.
///
/// Written by the warm-pool reconciler on members (Sandbox labels and pod-template labels);
/// removed by the claim reconciler on adoption. Read by the warm-pool reconciler (its members,
/// `status.selector`), the claim reconciler (adoption candidates) and the Sandbox reconciler
/// (propagated to the Pod only while the pool still owns the sandbox).
pub const WARM_POOL_SANDBOX: &str = "agents.x-k8s.io/warm-pool-sandbox";

/// `agents.x-k8s.io/sandbox-template-ref-hash` = [`crate::name_hash`] of the template name.
///
/// Written by the template reconciler on the template, and by the pool and claim reconcilers on
/// the sandboxes they create (and so on their pods). Read by the template's NetworkPolicy pod
/// selector and by staleness checks.
pub const SANDBOX_TEMPLATE_REF_HASH: &str = "agents.x-k8s.io/sandbox-template-ref-hash";

/// `agents.x-k8s.io/claim-uid`: UID of the SandboxClaim that owns a sandbox.
///
/// Written by the claim reconciler on the Sandbox and its pod template. Read by clients that
/// want to find a claim's sandbox by label, and by `sandboxctl`.
pub const CLAIM_UID: &str = "agents.x-k8s.io/claim-uid";

/// Label key prefixes the controller never copies from a user's pod template onto a Pod: they are
/// reserved for the system.
pub const SYSTEM_PREFIXES: [&str; 2] = ["agents.x-k8s.io/", "extensions.agents.x-k8s.io/"];

/// `app` = [`ROUTER_APP_VALUE`]: the label on router pods that the default per-template
/// NetworkPolicy admits.
///
/// Written by our `deploy/` manifests on the router Deployment's pods. Read by the template
/// reconciler's default NetworkPolicy (the default router peer). Upstream rejects it in a
/// claim's `additionalPodMetadata`, so a sandbox cannot pretend to be the router.
pub const ROUTER_APP: &str = "app";
/// Value of [`ROUTER_APP`] on router pods.
pub const ROUTER_APP_VALUE: &str = "sandbox-router";

/// `kubernetes.io/metadata.name`: the label the API server puts on every Namespace with its own
/// name. Read by NetworkPolicy namespace selectors.
pub const NAMESPACE_NAME: &str = "kubernetes.io/metadata.name";

/// Pod Security Admission: the Pod Security Standard a namespace enforces (the API server refuses
/// pods that do not meet it). Ours (agent-sandbox-system, and sandboxes' namespaces that our
/// manifests create) enforce [`POD_SECURITY_RESTRICTED`].
pub const POD_SECURITY_ENFORCE: &str = "pod-security.kubernetes.io/enforce";
/// Pod Security Admission: the standard whose violations are recorded in the audit log.
pub const POD_SECURITY_AUDIT: &str = "pod-security.kubernetes.io/audit";
/// Pod Security Admission: the standard whose violations are returned as warnings.
pub const POD_SECURITY_WARN: &str = "pod-security.kubernetes.io/warn";
/// The restricted Pod Security Standard, as the value of the labels above.
pub const POD_SECURITY_RESTRICTED: &str = "restricted";

/// On claims an MCP server (`sandboxctl mcp`) creates: its session id, so that it touches only
/// its own claims. Upstream's MCP server's default key, so that tooling written for it finds ours.
pub const MCP_SESSION: &str = "mcp.k8s-agent-sandbox/session-id";

/// `kubernetes.io/service-name`: the label that ties an EndpointSlice to its Service.
///
/// Written by the cluster (or the sim). Read by the SDK's port-forward mode to find a ready
/// router pod.
pub const ENDPOINTSLICE_SERVICE_NAME: &str = "kubernetes.io/service-name";

/// Whether `selector` selects an object with `labels`, as `metav1.LabelSelectorAsSelector`
/// decides: every `matchLabels` pair and every `matchExpressions` requirement must hold (`In`,
/// `NotIn`, `Exists`, `DoesNotExist`); an empty selector selects everything. An unknown
/// operator selects nothing (the API server refuses one).
pub fn selector_matches(
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    let pairs = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(key, value)| labels.get(key) == Some(value));
    let expressions = selector
        .match_expressions
        .iter()
        .flatten()
        .all(|requirement| {
            let value = labels.get(&requirement.key);
            let listed = |v: &String| requirement.values.iter().flatten().any(|w| w == v);
            match requirement.operator.as_str() {
                "In" => value.is_some_and(listed),
                "NotIn" => !value.is_some_and(listed),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        });
    pairs && expressions
}

#[cfg(test)]
mod selector_tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
    use std::collections::BTreeMap;

    #[test]
    fn selectors_match_as_kubernetes_matches_them() {
        let labels = BTreeMap::from([
            ("app".to_owned(), "sandbox-router".to_owned()),
            ("tier".to_owned(), "edge".to_owned()),
        ]);
        assert!(selector_matches(&LabelSelector::default(), &labels));
        assert!(selector_matches(
            &LabelSelector::default(),
            &BTreeMap::new()
        ));
        let by_label = LabelSelector {
            match_labels: Some(BTreeMap::from([(
                "app".to_owned(),
                "sandbox-router".to_owned(),
            )])),
            match_expressions: None,
        };
        assert!(selector_matches(&by_label, &labels));
        assert!(!selector_matches(&by_label, &BTreeMap::new()));
        let expression = |operator: &str, values: &[&str]| LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".to_owned(),
                operator: operator.to_owned(),
                values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
            }]),
        };
        assert!(selector_matches(
            &expression("In", &["edge", "core"]),
            &labels
        ));
        assert!(!selector_matches(&expression("NotIn", &["edge"]), &labels));
        assert!(selector_matches(
            &expression("NotIn", &["edge"]),
            &BTreeMap::new()
        ));
        assert!(selector_matches(&expression("Exists", &[]), &labels));
        assert!(!selector_matches(&expression("DoesNotExist", &[]), &labels));
        assert!(!selector_matches(&expression("Near", &[]), &labels));
    }
}
