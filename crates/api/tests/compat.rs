//! Compatibility of our CRD types and schemas with upstream's v1beta1 API.
//!
//! The manifests in `tests/manifests/` are written with upstream's field names and shapes. Each
//! full manifest sets every field of our own types, so that removing or renaming a field in a
//! Rust type makes a round trip lose it; `manifests_cover_every_field_of_our_schemas` keeps it
//! that way when fields are added.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;

use agent_sandbox_api::sandbox::{OperatingMode, ShutdownPolicy};
use agent_sandbox_api::schema::{self, FieldErrorKind};
use agent_sandbox_api::template::{
    EnvVarsInjectionPolicy, NetworkPolicyManagement, VolumeClaimTemplatesPolicy,
};
use agent_sandbox_api::warm_pool::UpdateStrategyType;
use agent_sandbox_api::{Sandbox, SandboxClaim, SandboxTemplate, SandboxWarmPool, claim, crds};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use pretty_assertions::assert_eq;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

const SANDBOXES: &str = "sandboxes.agents.x-k8s.io";
const TEMPLATES: &str = "sandboxtemplates.extensions.agents.x-k8s.io";
const POOLS: &str = "sandboxwarmpools.extensions.agents.x-k8s.io";
const CLAIMS: &str = "sandboxclaims.extensions.agents.x-k8s.io";

fn manifest(name: &str) -> Value {
    let path = format!("{}/tests/manifests/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn crd_schema(name: &str) -> JSONSchemaProps {
    crds::schema(name).unwrap_or_else(|| panic!("no CRD named {name}"))
}

/// Parses `file` as `T`, and checks that serializing it again gives exactly what an API server
/// would store: the manifest plus the schema's defaults.
fn assert_round_trip<T: Serialize + DeserializeOwned>(file: &str, crd: &str) -> T {
    let raw = manifest(file);
    let schema = crd_schema(crd);
    let mut stored = raw.clone();
    schema::apply_defaults(&schema, &mut stored);
    let errors = schema::validate(&schema, &stored);
    assert!(errors.is_empty(), "{file} does not validate: {errors:?}");

    let typed: T = serde_json::from_value(raw).unwrap_or_else(|e| panic!("{file}: {e}"));
    let back = serde_json::to_value(&typed).unwrap();
    assert_eq!(
        back, stored,
        "{file} changed in a round trip through the Rust type"
    );
    typed
}

#[test]
fn sandbox_round_trips() {
    let sandbox: Sandbox = assert_round_trip("sandbox.yaml", SANDBOXES);
    assert_eq!(sandbox.spec.operating_mode, OperatingMode::Suspended);
    assert_eq!(
        sandbox.spec.lifecycle.shutdown_policy,
        ShutdownPolicy::Delete
    );
    assert_eq!(sandbox.spec.blueprint.service, Some(true));
    let group = sandbox.spec.blueprint.pod_template.spec.scheduling_group;
    assert_eq!(
        group.and_then(|group| group.pod_group_name).as_deref(),
        Some("workers")
    );
}

#[test]
fn template_round_trips() {
    let template: SandboxTemplate = assert_round_trip("template.yaml", TEMPLATES);
    assert_eq!(
        template.spec.env_vars_injection_policy,
        EnvVarsInjectionPolicy::Allowed
    );
}

#[test]
fn warm_pool_round_trips() {
    let pool: SandboxWarmPool = assert_round_trip("warm-pool.yaml", POOLS);
    assert_eq!(
        pool.spec.update_strategy_type(),
        UpdateStrategyType::Recreate
    );
}

#[test]
fn claim_round_trips() {
    let claim: SandboxClaim = assert_round_trip("claim.yaml", CLAIMS);
    assert_eq!(claim.spec.env[0].container_name, "python-runtime");
}

#[test]
fn defaults_match_upstream_in_rust_and_in_the_schema() {
    let sandbox: Sandbox = assert_round_trip("sandbox-minimal.yaml", SANDBOXES);
    assert_eq!(
        sandbox.spec.lifecycle.shutdown_policy,
        ShutdownPolicy::Retain
    );
    assert_eq!(sandbox.spec.operating_mode, OperatingMode::Running);
    assert_eq!(sandbox.spec.lifecycle.shutdown_time, None);
    assert_eq!(sandbox.spec.blueprint.service, None);

    let template: SandboxTemplate = assert_round_trip("template-minimal.yaml", TEMPLATES);
    assert_eq!(
        template.spec.network_policy_management,
        NetworkPolicyManagement::Managed
    );
    assert_eq!(
        template.spec.env_vars_injection_policy,
        EnvVarsInjectionPolicy::Disallowed
    );
    assert_eq!(
        template.spec.volume_claim_templates_policy,
        VolumeClaimTemplatesPolicy::Disallowed
    );
    assert_eq!(template.spec.network_policy, None);

    let pool: SandboxWarmPool = assert_round_trip("warm-pool-minimal.yaml", POOLS);
    assert_eq!(pool.spec.replicas, 1);
    assert_eq!(
        pool.spec.update_strategy_type(),
        UpdateStrategyType::OnReplenish
    );

    let claim: SandboxClaim = assert_round_trip("claim-minimal.yaml", CLAIMS);
    let lifecycle = claim.spec.lifecycle.unwrap();
    assert_eq!(
        lifecycle.shutdown_policy,
        claim::ClaimShutdownPolicy::Retain
    );
    assert_eq!(lifecycle.ttl_seconds_after_finished, None);

    // The same defaults, as the API server applies them from the schema alone.
    let mut stored = manifest("sandbox-minimal.yaml");
    schema::apply_defaults(&crd_schema(SANDBOXES), &mut stored);
    assert_eq!(stored["spec"]["shutdownPolicy"], json!("Retain"));
    assert_eq!(stored["spec"]["operatingMode"], json!("Running"));
    let mut stored = manifest("template-minimal.yaml");
    schema::apply_defaults(&crd_schema(TEMPLATES), &mut stored);
    assert_eq!(stored["spec"]["networkPolicyManagement"], json!("Managed"));
    assert_eq!(
        stored["spec"]["envVarsInjectionPolicy"],
        json!("Disallowed")
    );
    assert_eq!(
        stored["spec"]["volumeClaimTemplatesPolicy"],
        json!("Disallowed")
    );
    let mut stored = manifest("warm-pool-minimal.yaml");
    schema::apply_defaults(&crd_schema(POOLS), &mut stored);
    assert_eq!(stored["spec"]["replicas"], json!(1));
    assert_eq!(
        stored["spec"]["updateStrategy"]["type"],
        json!("OnReplenish")
    );
    let mut stored = manifest("claim-minimal.yaml");
    schema::apply_defaults(&crd_schema(CLAIMS), &mut stored);
    assert_eq!(
        stored["spec"]["lifecycle"]["shutdownPolicy"],
        json!("Retain")
    );
}

/// Paths below which the schema is a Kubernetes type (PodSpec, PVC spec, NetworkPolicy rules,
/// Condition): those are k8s-openapi's, not ours, and are not enumerated.
const EMBEDDED: [&str; 6] = [
    "spec.podTemplate.spec",
    "spec.volumeClaimTemplates[].spec",
    "spec.networkPolicy.ingress[]",
    "spec.networkPolicy.egress[]",
    "status.conditions[]",
    "metadata",
];

fn schema_paths(schema: &JSONSchemaProps, path: &str, out: &mut BTreeSet<String>) {
    if EMBEDDED.contains(&path) {
        return;
    }
    if let Some(properties) = &schema.properties {
        for (name, child) in properties {
            let child_path = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            if EMBEDDED.contains(&child_path.as_str())
                || ["apiVersion", "kind"].contains(&name.as_str())
            {
                out.insert(child_path);
                continue;
            }
            out.insert(child_path.clone());
            schema_paths(child, &child_path, out);
        }
    }
    if let Some(JSONSchemaPropsOrArray::Schema(item)) = &schema.items {
        schema_paths(item, &format!("{path}[]"), out);
    }
}

fn value_paths(value: &Value, path: &str, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (name, child) in map {
                let child_path = if path.is_empty() {
                    name.clone()
                } else {
                    format!("{path}.{name}")
                };
                out.insert(child_path.clone());
                value_paths(child, &child_path, out);
            }
        }
        Value::Array(items) => items
            .iter()
            .for_each(|item| value_paths(item, &format!("{path}[]"), out)),
        _ => {}
    }
}

#[test]
fn manifests_cover_every_field_of_our_schemas() {
    for (file, crd) in [
        ("sandbox.yaml", SANDBOXES),
        ("template.yaml", TEMPLATES),
        ("warm-pool.yaml", POOLS),
        ("claim.yaml", CLAIMS),
    ] {
        let mut wanted = BTreeSet::new();
        schema_paths(&crd_schema(crd), "", &mut wanted);
        let mut present = BTreeSet::new();
        value_paths(&manifest(file), "", &mut present);
        let missing: Vec<_> = wanted.difference(&present).collect();
        assert!(
            missing.is_empty(),
            "{file} does not set {missing:?}: add them so a round trip tests them"
        );
    }
}

#[test]
fn unknown_fields_are_rejected_by_the_generated_schema() {
    let mut sandbox = manifest("sandbox.yaml");
    sandbox["spec"]["podTemplate"]["spec"]["containers"][0]["imagePullPolicyy"] = json!("Always");
    sandbox["spec"]["shutdownPolicyy"] = json!("Delete");
    sandbox["status"]["podIps"] = json!(["10.0.0.1"]);
    let unknown: Vec<String> = schema::validate(&crd_schema(SANDBOXES), &sandbox)
        .into_iter()
        .filter(|error| error.kind == FieldErrorKind::Unknown)
        .map(|error| error.path)
        .collect();
    assert_eq!(
        unknown,
        vec![
            "spec.podTemplate.spec.containers[0].imagePullPolicyy",
            "spec.shutdownPolicyy",
            "status.podIps",
        ]
    );

    let mut claim = manifest("claim.yaml");
    claim["spec"]["warmpool"] = json!("default"); // the v1alpha1 field is gone in v1beta1
    let errors = schema::validate(&crd_schema(CLAIMS), &claim);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].to_string(), "unknown field \"spec.warmpool\"");
}

#[test]
fn enums_and_bounds_are_validated() {
    let mut sandbox = manifest("sandbox-minimal.yaml");
    sandbox["spec"]["operatingMode"] = json!("Paused");
    let errors = schema::validate(&crd_schema(SANDBOXES), &sandbox);
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec!["spec.operatingMode: Unsupported value: supported values: \"Running\", \"Suspended\""]
    );
    let mut pool = manifest("warm-pool-minimal.yaml");
    pool["spec"]["replicas"] = json!(-1);
    let errors = schema::validate(&crd_schema(POOLS), &pool);
    assert_eq!(errors[0].kind, FieldErrorKind::Minimum("0".into()));
    let mut pool = manifest("warm-pool-minimal.yaml");
    pool["spec"]
        .as_object_mut()
        .unwrap()
        .remove("sandboxTemplateRef");
    let errors = schema::validate(&crd_schema(POOLS), &pool);
    assert_eq!(
        errors[0].to_string(),
        "spec.sandboxTemplateRef: Required value"
    );
}

/// Regression (issue 15): `replicas: 2147483648` passed the schema and then no controller could
/// decode the pool list. Every integer of every CRD is int32 with int32's range (or tighter), or
/// int64.
#[test]
fn every_integer_has_a_format_and_int32_ones_their_range() {
    let mut int32 = 0;
    for crd in crds::all() {
        let name = crd.metadata.name.clone().unwrap();
        let schema = crd.spec.versions[0]
            .schema
            .clone()
            .unwrap()
            .open_api_v3_schema
            .unwrap();
        walk_schema(&schema, &name, &mut |path, node| {
            if node.type_.as_deref() != Some("integer") {
                return;
            }
            match node.format.as_deref() {
                Some("int32") => {
                    int32 += 1;
                    let (min, max) = (node.minimum.unwrap(), node.maximum.unwrap());
                    assert!(
                        min >= f64::from(i32::MIN) && max <= f64::from(i32::MAX) && min <= max,
                        "{path}: [{min}, {max}] is not within int32"
                    );
                }
                Some("int64") => {}
                other => panic!("{path}: integer with format {other:?}, not int32 or int64"),
            }
        });
    }
    assert!(
        int32 > 100,
        "the pod templates' int32 fields are covered too"
    );

    let pool_schema = crd_schema(POOLS);
    let mut pool = manifest("warm-pool-minimal.yaml");
    pool["spec"]["replicas"] = json!(2_147_483_647);
    assert_eq!(schema::validate(&pool_schema, &pool), vec![]);
    pool["spec"]["replicas"] = json!(2_147_483_648_i64);
    let errors = schema::validate(&pool_schema, &pool);
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec!["spec.replicas: Invalid value: should be less than or equal to 2147483647"]
    );
    let mut sandbox = manifest("sandbox-minimal.yaml");
    sandbox["spec"]["podTemplate"]["spec"]["containers"][0]["ports"] =
        json!([{"containerPort": 4_294_967_296_i64}]);
    let errors = schema::validate(&crd_schema(SANDBOXES), &sandbox);
    assert_eq!(
        errors[0].kind,
        FieldErrorKind::Maximum("2147483647".into()),
        "{errors:?}"
    );
}

fn walk_schema(
    schema: &JSONSchemaProps,
    path: &str,
    check: &mut impl FnMut(&str, &JSONSchemaProps),
) {
    check(path, schema);
    for (name, child) in schema.properties.iter().flatten() {
        walk_schema(child, &format!("{path}.{name}"), check);
    }
    if let Some(JSONSchemaPropsOrArray::Schema(item)) = &schema.items {
        walk_schema(item, &format!("{path}[]"), check);
    }
    if let Some(JSONSchemaPropsOrBool::Schema(values)) = &schema.additional_properties {
        walk_schema(values, &format!("{path}{{}}"), check);
    }
}

#[test]
fn schemas_are_structural_and_never_preserve_unknown_fields() {
    for crd in crds::all() {
        let name = crd.metadata.name.clone().unwrap();
        let schema = crd.spec.versions[0]
            .schema
            .clone()
            .unwrap()
            .open_api_v3_schema
            .unwrap();
        walk_schema(&schema, &name, &mut |path, node| {
            assert!(
                node.type_.is_some() || node.x_kubernetes_int_or_string == Some(true),
                "{path} has no type"
            );
            assert_eq!(
                node.x_kubernetes_preserve_unknown_fields, None,
                "{path} preserves unknown fields"
            );
            // An int-or-string is `anyOf: [integer, string]`, as controller-gen writes it; no
            // other combinator is structural.
            let int_or_string = json!([{"type": "integer"}, {"type": "string"}]);
            assert!(
                node.any_of.is_none()
                    || (node.x_kubernetes_int_or_string == Some(true)
                        && serde_json::to_value(&node.any_of).unwrap() == int_or_string),
                "{path} uses anyOf outside x-kubernetes-int-or-string"
            );
            assert!(
                node.one_of.is_none() && node.all_of.is_none(),
                "{path} uses a combinator"
            );
            assert!(node.ref_path.is_none(), "{path} has a $ref");
            assert!(
                node.nullable.is_none(),
                "{path} is nullable, upstream's is not"
            );
        });
    }
}

#[test]
fn volume_claim_templates_are_immutable_by_cel() {
    let spec = &crd_schema(SANDBOXES).properties.unwrap()["spec"];
    let rules = spec.x_kubernetes_validations.clone().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0].rule,
        "has(self.volumeClaimTemplates) == has(oldSelf.volumeClaimTemplates) && \
         (!has(self.volumeClaimTemplates) || self.volumeClaimTemplates == oldSelf.volumeClaimTemplates)"
    );
    assert_eq!(
        rules[0].message.as_deref(),
        Some("volumeClaimTemplates is immutable")
    );
    let vcts = &spec.properties.as_ref().unwrap()["volumeClaimTemplates"];
    assert_eq!(vcts.x_kubernetes_list_type.as_deref(), Some("atomic"));
}

/// What `kubectl` and clients see of a CRD: names, scope, versions, subresources, columns.
fn surface(crd: &CustomResourceDefinition) -> Value {
    let version = &crd.spec.versions[0];
    json!({
        "name": crd.metadata.name,
        "group": crd.spec.group,
        "names": crd.spec.names,
        "scope": crd.spec.scope,
        "versions": crd.spec.versions.iter().map(|v| (&v.name, v.served, v.storage)).collect::<Vec<_>>(),
        "subresources": version.subresources,
        "columns": version.additional_printer_columns,
        "conversion": crd.spec.conversion,
    })
}

#[test]
fn crd_surfaces_match_upstream() {
    let ready = |path: &str| json!({"name": "Ready", "type": "string", "jsonPath": path});
    let reason = json!({"name": "Reason", "type": "string",
                        "jsonPath": ".status.conditions[?(@.type=='Ready')].reason"});
    let age = json!({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"});
    let ready_status = ".status.conditions[?(@.type=='Ready')].status";
    let expected = vec![
        json!({
            "name": "sandboxes.agents.x-k8s.io", "group": "agents.x-k8s.io",
            "names": {"kind": "Sandbox", "listKind": "SandboxList", "plural": "sandboxes",
                      "singular": "sandbox", "shortNames": ["sandbox"]},
            "scope": "Namespaced", "versions": [["v1beta1", true, true]],
            "subresources": {"status": {}},
            "columns": [ready(ready_status), reason, age],
            "conversion": null,
        }),
        json!({
            "name": "sandboxtemplates.extensions.agents.x-k8s.io",
            "group": "extensions.agents.x-k8s.io",
            "names": {"kind": "SandboxTemplate", "listKind": "SandboxTemplateList",
                      "plural": "sandboxtemplates", "singular": "sandboxtemplate",
                      "shortNames": ["sandboxtemplate"]},
            "scope": "Namespaced", "versions": [["v1beta1", true, true]],
            "subresources": null, "columns": null, "conversion": null,
        }),
        json!({
            "name": "sandboxwarmpools.extensions.agents.x-k8s.io",
            "group": "extensions.agents.x-k8s.io",
            "names": {"kind": "SandboxWarmPool", "listKind": "SandboxWarmPoolList",
                      "plural": "sandboxwarmpools", "singular": "sandboxwarmpool",
                      "shortNames": ["swp"]},
            "scope": "Namespaced", "versions": [["v1beta1", true, true]],
            "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas",
                "statusReplicasPath": ".status.replicas", "labelSelectorPath": ".status.selector"}},
            "columns": [
                {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
                {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas"},
                age,
            ],
            "conversion": null,
        }),
        json!({
            "name": "sandboxclaims.extensions.agents.x-k8s.io",
            "group": "extensions.agents.x-k8s.io",
            "names": {"kind": "SandboxClaim", "listKind": "SandboxClaimList",
                      "plural": "sandboxclaims", "singular": "sandboxclaim",
                      "shortNames": ["sandboxclaim"]},
            "scope": "Namespaced", "versions": [["v1beta1", true, true]],
            "subresources": {"status": {}},
            "columns": [
                ready(ready_status),
                {"name": "Sandbox", "type": "string", "jsonPath": ".status.sandbox.name"},
                reason, age,
            ],
            "conversion": null,
        }),
    ];
    let actual: Vec<Value> = crds::all().iter().map(surface).collect();
    assert_eq!(actual, expected);
}

#[test]
fn group_and_version_constants_match_the_types() {
    use kube_core::Resource;
    assert_eq!(Sandbox::group(&()), agent_sandbox_api::GROUP);
    for group in [
        SandboxTemplate::group(&()),
        SandboxWarmPool::group(&()),
        SandboxClaim::group(&()),
    ] {
        assert_eq!(group, agent_sandbox_api::EXTENSIONS_GROUP);
    }
    assert_eq!(Sandbox::version(&()), agent_sandbox_api::VERSION);
    assert_eq!(SandboxClaim::version(&()), agent_sandbox_api::VERSION);
}
