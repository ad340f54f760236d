//! Discovery documents (`/api`, `/apis`, `/apis/{group}`, `/api/v1`, `/apis/{group}/{version}`)
//! and `/version`, from the registry (sans IO).

use serde_json::{Value, json};

use crate::resources::Registry;

/// Kubernetes version the sim claims to be.
pub(crate) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "35",
        "gitVersion": "v1.35.0-sim",
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "none (agent-sandbox-sim)",
        "compiler": "rustc",
        "platform": "linux/amd64",
    })
}

/// `/api`.
pub(crate) fn core_versions(server: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server}],
    })
}

fn group_json(group: &str, versions: &[String]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({
        "name": group,
        "versions": versions,
        "preferredVersion": versions.first().cloned().unwrap_or(Value::Null),
    })
}

/// `/apis`.
pub(crate) fn groups(registry: &Registry) -> Value {
    let groups: Vec<Value> = registry
        .groups()
        .iter()
        .filter(|(group, _)| !group.is_empty())
        .map(|(group, versions)| group_json(group, versions))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/{group}`.
pub(crate) fn group(registry: &Registry, name: &str) -> Option<Value> {
    registry
        .groups()
        .iter()
        .find(|(group, _)| group == name)
        .map(|(group, versions)| {
            let mut value = group_json(group, versions);
            value["kind"] = json!("APIGroup");
            value["apiVersion"] = json!("v1");
            value
        })
}

/// Every resource serves every verb.
const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// `/api/v1` or `/apis/{group}/{version}`.
pub(crate) fn resources(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let infos = registry.group_version(group, version);
    if infos.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for info in infos {
        let mut entry = json!({
            "name": info.plural,
            "singularName": info.singular,
            "namespaced": info.namespaced,
            "kind": info.kind,
            "verbs": VERBS,
        });
        if !info.short_names.is_empty() {
            entry["shortNames"] = json!(info.short_names);
        }
        if !info.categories.is_empty() {
            entry["categories"] = json!(info.categories);
        }
        resources.push(entry);
        if info.status {
            resources.push(json!({
                "name": format!("{}/status", info.plural), "singularName": "",
                "namespaced": info.namespaced, "kind": info.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        if info.scale.is_some() {
            resources.push(json!({
                "name": format!("{}/scale", info.plural), "singularName": "",
                "namespaced": info.namespaced, "group": "autoscaling", "version": "v1",
                "kind": "Scale", "verbs": ["get", "patch", "update"],
            }));
        }
        for sub in info.extra_subresources() {
            let (kind, verbs) = match *sub {
                "log" => ("Pod", vec!["get"]),
                "finalize" => ("Namespace", vec!["update"]),
                "token" => ("TokenRequest", vec!["create"]),
                _ => ("PodPortForwardOptions", vec!["create", "get"]),
            };
            let mut entry = json!({
                "name": format!("{}/{sub}", info.plural), "singularName": "",
                "namespaced": info.namespaced, "kind": kind, "verbs": verbs,
            });
            if *sub == "token" {
                entry["group"] = json!("authentication.k8s.io");
                entry["version"] = json!("v1");
            }
            resources.push(entry);
        }
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_lists_builtins_and_crds_with_subresources() {
        let mut registry = Registry::with_builtins();
        for crd in agent_sandbox_api::crds::all() {
            registry.register_crd(&crd).unwrap();
        }
        let groups = groups(&registry);
        let names: Vec<&str> = groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"agents.x-k8s.io"));
        assert!(names.contains(&"events.k8s.io"));
        let core = resources(&registry, "", "v1").unwrap();
        let core_names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        for expected in [
            "pods",
            "pods/status",
            "pods/log",
            "pods/portforward",
            "namespaces",
        ] {
            assert!(core_names.contains(&expected), "{expected}");
        }
        let pools = resources(&registry, "extensions.agents.x-k8s.io", "v1beta1").unwrap();
        assert!(
            pools["resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["name"] == "sandboxwarmpools/scale" && r["kind"] == "Scale")
        );
        assert!(resources(&registry, "nope", "v1").is_none());
    }
}
