//! Minimal OpenAPI v3 documents (`/openapi/v3`), enough for kubectl's discovery
//! of server-side field validation; the schemas themselves are not published (see
//! `docs/sim.md`).

use serde_json::{Value, json};

use crate::resources::Registry;

/// `/openapi/v3`: the index of group-version documents.
pub(crate) fn v3_root(registry: &Registry) -> Value {
    let mut paths = serde_json::Map::new();
    for (group, versions) in registry.groups() {
        for version in versions {
            let key = if group.is_empty() {
                format!("api/{version}")
            } else {
                format!("apis/{group}/{version}")
            };
            paths.insert(
                key.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{key}")}),
            );
        }
    }
    json!({"paths": paths})
}

/// `/openapi/v3/apis/{group}/{version}`.
pub(crate) fn v3_group_version(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let infos = registry.group_version(group, version);
    if infos.is_empty() {
        return None;
    }
    let prefix = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    let field_validation = json!({"name": "fieldValidation", "in": "query", "schema": {"type": "string"},
                                  "uniqueItems": true});
    let mut paths = serde_json::Map::new();
    for info in infos {
        let item = if info.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", info.plural)
        } else {
            format!("{prefix}/{}/{{name}}", info.plural)
        };
        let operation = |verb: &str| {
            json!({"operationId": format!("{verb}{}", info.kind), "parameters": [field_validation.clone()],
                   "x-kubernetes-action": verb,
                   "x-kubernetes-group-version-kind": {"group": info.group, "version": info.version, "kind": info.kind}})
        };
        paths.insert(
            item,
            json!({"put": operation("put"), "patch": operation("patch")}),
        );
        let collection = if info.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}", info.plural)
        } else {
            format!("{prefix}/{}", info.plural)
        };
        paths.insert(collection, json!({"post": operation("post")}));
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (agent-sandbox sim)", "version": "v1.35.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}
