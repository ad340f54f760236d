//! Our generated CRDs against upstream's released ones (`tests/upstream-crds/v1.0.3/`, see its
//! README): everything a client can observe of a CRD must match, apart from the deliberate
//! differences listed in [`DELIBERATE`] (and in docs/controller.md, "Differences from upstream").
//!
//! Observable means: the CRD's names, scope, versions, subresources and printer columns, and
//! every keyword of every node of the OpenAPI schema (properties present, `type`, `format`, the
//! `required` set, `default`, `enum`, bounds and patterns, the `x-kubernetes-*` markers, CEL
//! rules, the int-or-string `anyOf`) except `description`, which is ours.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::fmt;

use agent_sandbox_api::crds;
use serde_json::{Value, json};

/// The upstream file of each of our CRDs.
const UPSTREAM: [(&str, &str); 4] = [
    (
        "sandboxes.agents.x-k8s.io",
        "agents.x-k8s.io_sandboxes.yaml",
    ),
    (
        "sandboxtemplates.extensions.agents.x-k8s.io",
        "extensions.agents.x-k8s.io_sandboxtemplates.yaml",
    ),
    (
        "sandboxwarmpools.extensions.agents.x-k8s.io",
        "extensions.agents.x-k8s.io_sandboxwarmpools.yaml",
    ),
    (
        "sandboxclaims.extensions.agents.x-k8s.io",
        "extensions.agents.x-k8s.io_sandboxclaims.yaml",
    ),
];

/// Schema keywords that are not compared: prose, and the children, which are walked.
const NOT_COMPARED: [&str; 4] = ["description", "properties", "items", "additionalProperties"];

/// One observable difference.
#[derive(Debug)]
struct Difference {
    /// `<crd> <path>`, e.g. `sandboxes.agents.x-k8s.io spec.podTemplate.spec.containers[]`.
    path: String,
    /// The keyword, or `property` for a property present on one side only.
    keyword: String,
    upstream: Option<Value>,
    ours: Option<Value>,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |value: &Option<Value>| {
            value
                .as_ref()
                .map_or_else(|| "(absent)".to_owned(), Value::to_string)
        };
        write!(
            f,
            "{} {}: upstream {}, ours {}",
            self.path,
            self.keyword,
            show(&self.upstream),
            show(&self.ours)
        )
    }
}

/// A kind of difference we keep on purpose, and why.
struct Deliberate {
    what: &'static str,
    why: &'static str,
    matches: fn(&Difference) -> bool,
}

fn int32_bound(difference: &Difference) -> bool {
    let bound = |value: &Option<Value>| value.as_ref().and_then(Value::as_i64);
    (difference.keyword == "minimum" || difference.keyword == "maximum")
        && difference.upstream.is_none()
        && matches!(
            bound(&difference.ours),
            Some(-2_147_483_648 | 2_147_483_647)
        )
}

fn non_negative_count(difference: &Difference) -> bool {
    const COUNTS: [&str; 2] = [
        "sandboxwarmpools.extensions.agents.x-k8s.io status.replicas",
        "sandboxwarmpools.extensions.agents.x-k8s.io status.readyReplicas",
    ];
    difference.keyword == "minimum"
        && difference.upstream.is_none()
        && difference.ours == Some(json!(0))
        && COUNTS.contains(&difference.path.as_str())
}

fn ephemeral_claim_metadata(difference: &Difference) -> bool {
    difference.keyword == "property"
        && difference.upstream.is_none()
        && difference
            .path
            .contains(" spec.podTemplate.spec.volumes[].ephemeral.volumeClaimTemplate.metadata.")
}

fn pool_conditions(difference: &Difference) -> bool {
    difference.keyword == "property"
        && difference.upstream.is_none()
        && difference.path == "sandboxwarmpools.extensions.agents.x-k8s.io status.conditions"
}

fn idle_lifecycle(difference: &Difference) -> bool {
    difference.keyword == "property"
        && difference.upstream.is_none()
        && [
            "sandboxes.agents.x-k8s.io spec.idleLifecycle",
            "sandboxes.agents.x-k8s.io status.lastActivityTime",
            "sandboxtemplates.extensions.agents.x-k8s.io spec.idleLifecycle",
            "sandboxwarmpools.extensions.agents.x-k8s.io spec.claimDefaults",
            "sandboxclaims.extensions.agents.x-k8s.io spec.idleLifecycle",
        ]
        .contains(&difference.path.as_str())
}

/// Every difference we keep, each also listed in docs/controller.md.
const DELIBERATE: [Deliberate; 5] = [
    Deliberate {
        what: "int32 fields carry int32's range",
        why: "the API server does not enforce `format: int32`; without bounds it stores \
              `replicas: 2147483648`, which no client with 32-bit fields can decode (issue 15)",
        matches: int32_bound,
    },
    Deliberate {
        what: "SandboxWarmPool status counts are at least 0",
        why: "as its spec.replicas and observedGeneration are upstream too; a negative count is \
              refused at admission",
        matches: non_negative_count,
    },
    Deliberate {
        what: "an ephemeral volume's claim template keeps its metadata fields",
        why: "controller-gen renders the embedded ObjectMeta as a bare object, so upstream's API \
              server prunes (or, under strict validation, refuses) the labels and annotations \
              meant for the PVC; ours keeps ObjectMeta's fields",
        matches: ephemeral_claim_metadata,
    },
    Deliberate {
        what: "SandboxWarmPool status has conditions",
        why: "our `Capped` condition reports a pool held below `spec.replicas`",
        matches: pool_conditions,
    },
    Deliberate {
        what: "the idle lifecycle: `idleLifecycle` (Sandbox, template, claim), `claimDefaults` \
               (pool), `status.lastActivityTime`",
        why: "upstream's largest open request (#849, #968; shapes of its proposals #1160 and \
              KEP-1306), all optional: upstream's manifests stay valid",
        matches: idle_lifecycle,
    },
];

fn upstream_crd(file: &str) -> Value {
    let path = format!(
        "{}/tests/upstream-crds/v1.0.3/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn child_path(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

/// A whole number written as a float (`minimum: 0.0`, how the typed CRD holds bounds) is the
/// integer YAML shows.
fn integral(value: &mut Value) {
    match value {
        Value::Number(number) => {
            if let Some(float) = number.as_f64()
                && number.is_f64()
                && float.fract() == 0.0
                && float.abs() < 9.0e15
            {
                #[allow(clippy::cast_possible_truncation)]
                let integer = float as i64;
                *number = serde_json::Number::from(integer);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral),
        Value::Object(map) => map.values_mut().for_each(integral),
        _ => {}
    }
}

/// Normalised value of a keyword: numbers as YAML shows them, `required` as a set.
fn keyword_value(keyword: &str, value: Option<&Value>) -> Option<Value> {
    let mut value = value.cloned()?;
    integral(&mut value);
    if keyword == "required"
        && let Value::Array(items) = &mut value
    {
        items.sort_by_key(ToString::to_string);
    }
    Some(value)
}

fn compare(crd: &str, path: &str, upstream: &Value, ours: &Value, out: &mut Vec<Difference>) {
    let empty = serde_json::Map::new();
    let (u, o) = (
        upstream.as_object().unwrap_or(&empty),
        ours.as_object().unwrap_or(&empty),
    );
    let mut keywords: Vec<&String> = u.keys().chain(o.keys()).collect();
    keywords.sort();
    keywords.dedup();
    for keyword in keywords {
        if NOT_COMPARED.contains(&keyword.as_str()) {
            continue;
        }
        let (upstream_value, our_value) = (
            keyword_value(keyword, u.get(keyword)),
            keyword_value(keyword, o.get(keyword)),
        );
        if upstream_value != our_value {
            out.push(Difference {
                path: format!("{crd} {path}"),
                keyword: keyword.clone(),
                upstream: upstream_value,
                ours: our_value,
            });
        }
    }
    let properties = |side: &serde_json::Map<String, Value>| {
        side.get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    };
    let (up, op) = (properties(u), properties(o));
    let names: BTreeMap<&String, ()> = up.keys().chain(op.keys()).map(|k| (k, ())).collect();
    for name in names.keys() {
        let child = child_path(path, name);
        match (up.get(*name), op.get(*name)) {
            (Some(a), Some(b)) => compare(crd, &child, a, b, out),
            (a, b) => out.push(Difference {
                path: format!("{crd} {child}"),
                keyword: "property".to_owned(),
                upstream: a.map(|_| json!("present")),
                ours: b.map(|_| json!("present")),
            }),
        }
    }
    let null = Value::Null;
    for (key, suffix) in [("items", "[]"), ("additionalProperties", "{}")] {
        let (a, b) = (u.get(key), o.get(key));
        match (a, b) {
            (None, None) => {}
            (Some(a), Some(b)) if a.is_object() && b.is_object() => {
                compare(crd, &format!("{path}{suffix}"), a, b, out);
            }
            _ if a.is_some_and(Value::is_object) || b.is_some_and(Value::is_object) => {
                compare(
                    crd,
                    &format!("{path}{suffix}"),
                    a.unwrap_or(&null),
                    b.unwrap_or(&null),
                    out,
                );
            }
            _ => out.push(Difference {
                path: format!("{crd} {path}"),
                keyword: key.to_owned(),
                upstream: a.cloned(),
                ours: b.cloned(),
            }),
        }
    }
}

/// What a client sees of a CRD apart from its schema.
fn surface(crd: &Value) -> Value {
    let version = &crd["spec"]["versions"][0];
    json!({
        "name": crd["metadata"]["name"],
        "group": crd["spec"]["group"],
        "names": crd["spec"]["names"],
        "scope": crd["spec"]["scope"],
        "versions": crd["spec"]["versions"].as_array().map(Vec::len),
        "version": version["name"],
        "served": version["served"],
        "storage": version["storage"],
        "subresources": version["subresources"],
        "columns": version["additionalPrinterColumns"],
        "conversion": crd["spec"]["conversion"],
        "preserveUnknownFields": crd["spec"]["preserveUnknownFields"],
    })
}

fn all_differences() -> Vec<Difference> {
    let ours: BTreeMap<String, Value> = crds::all()
        .into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap();
            (name, serde_json::to_value(crd).unwrap())
        })
        .collect();
    assert_eq!(ours.len(), UPSTREAM.len());
    let mut differences = Vec::new();
    for (name, file) in UPSTREAM {
        let upstream = upstream_crd(file);
        let ours = &ours[name];
        pretty_assertions::assert_eq!(surface(&upstream), surface(ours), "{name}");
        let schema = |crd: &Value| crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone();
        compare(
            name,
            "",
            &schema(&upstream),
            &schema(ours),
            &mut differences,
        );
    }
    differences
}

#[test]
fn generated_crds_match_upstreams_but_for_deliberate_differences() {
    let differences = all_differences();
    let mut counts = [0_usize; DELIBERATE.len()];
    let mut unexplained = Vec::new();
    for difference in &differences {
        match DELIBERATE.iter().position(|d| (d.matches)(difference)) {
            Some(index) => counts[index] += 1,
            None => unexplained.push(difference.to_string()),
        }
    }
    println!(
        "{} differences from upstream v1.0.3's CRDs, all deliberate:",
        differences.len()
    );
    for (deliberate, count) in DELIBERATE.iter().zip(counts) {
        println!("  {count:4}  {}: {}", deliberate.what, deliberate.why);
    }
    assert!(
        unexplained.is_empty(),
        "{} differences from upstream's CRDs are not deliberate:\n{}",
        unexplained.len(),
        unexplained.join("\n")
    );
    for (deliberate, count) in DELIBERATE.iter().zip(counts) {
        assert!(
            count > 0,
            "no difference is \"{}\" any more: remove it from DELIBERATE and docs/controller.md",
            deliberate.what
        );
    }
}

/// The comparison sees what it claims to: a marker, default or required field changed on our
/// side shows up as a difference that no allowance covers.
#[test]
fn the_comparison_notices_a_changed_marker() {
    let upstream = upstream_crd("agents.x-k8s.io_sandboxes.yaml");
    let schema = upstream["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone();
    let mut ours = schema.clone();
    let spec = &mut ours["properties"]["spec"]["properties"]["podTemplate"]["properties"]["spec"];
    let containers = &mut spec["properties"]["containers"];
    containers
        .as_object_mut()
        .unwrap()
        .remove("x-kubernetes-list-map-keys");
    containers["items"]["properties"]["ports"]["items"]["properties"]["protocol"]
        .as_object_mut()
        .unwrap()
        .remove("default");
    spec["properties"]["imagePullSecrets"]["items"]["required"] = json!(["name"]);
    spec["properties"]["containers"]["items"]["description"] = json!("ours");
    let mut differences = Vec::new();
    compare("sandboxes", "", &schema, &ours, &mut differences);
    let found: Vec<String> = differences.iter().map(ToString::to_string).collect();
    pretty_assertions::assert_eq!(
        found,
        vec![
            "sandboxes spec.podTemplate.spec.containers x-kubernetes-list-map-keys: upstream [\"name\"], ours (absent)",
            "sandboxes spec.podTemplate.spec.containers[].ports[].protocol default: upstream \"TCP\", ours (absent)",
            "sandboxes spec.podTemplate.spec.imagePullSecrets[] required: upstream (absent), ours [\"name\"]",
        ]
    );
    assert!(
        differences
            .iter()
            .all(|d| !DELIBERATE.iter().any(|allowed| (allowed.matches)(d)))
    );
}
