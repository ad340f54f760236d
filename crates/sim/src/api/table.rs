//! Server-side `Table` output (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`), which
//! `kubectl get` asks for: the columns the API server prints for pods, services, namespaces,
//! nodes, events, CRDs and custom resources (their `additionalPrinterColumns`), and a
//! name-and-age table for the rest (sans IO).

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::jsonpath::JsonPath;
use crate::meta;
use crate::resources::{Builtin, ResourceInfo};

/// What each row carries besides its cells (`includeObject`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum IncludeObject {
    None,
    #[default]
    Metadata,
    Object,
}

impl IncludeObject {
    pub(crate) fn parse(text: Option<&str>) -> Self {
        match text {
            Some("None") => Self::None,
            Some("Object") => Self::Object,
            _ => Self::Metadata,
        }
    }
}

/// The age of a timestamp the way kubectl prints it (`45s`, `3m20s`, `5h`, `2d3h`, `400d`).
pub(crate) fn human_age(since: Option<&str>, now: Timestamp) -> String {
    let Some(since) = since.and_then(meta::parse_time) else {
        return "<unknown>".to_owned();
    };
    let seconds = now.as_second().saturating_sub(since.as_second()).max(0);
    let minutes = seconds / 60;
    let hours = minutes / 60;
    let days = hours / 24;
    if seconds < 120 {
        format!("{seconds}s")
    } else if minutes < 10 {
        let s = seconds % 60;
        if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        }
    } else if minutes < 180 {
        format!("{minutes}m")
    } else if hours < 8 {
        let m = minutes % 60;
        if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        }
    } else if hours < 48 {
        format!("{hours}h")
    } else if hours < 192 {
        let h = hours % 24;
        if h == 0 {
            format!("{days}d")
        } else {
            format!("{days}d{h}h")
        }
    } else if days < 730 {
        format!("{days}d")
    } else {
        format!("{}y{}d", days / 365, days % 365)
    }
}

struct Column {
    name: &'static str,
    type_: &'static str,
    format: &'static str,
    priority: i32,
}

fn column(name: &'static str, type_: &'static str, priority: i32) -> Column {
    Column {
        name,
        type_,
        // kubectl finds the name column by its format (to print `kind/name` for several kinds).
        format: if name == "Name" { "name" } else { "" },
        priority,
    }
}

fn text(object: &Value, pointer: &str) -> String {
    object
        .pointer(pointer)
        .map(meta::scalar_text)
        .unwrap_or_default()
}

fn or_none(value: String) -> String {
    if value.is_empty() {
        "<none>".to_owned()
    } else {
        value
    }
}

fn created(object: &Value, now: Timestamp) -> String {
    human_age(meta::meta_str(object, "creationTimestamp"), now)
}

fn pod_row(pod: &Value, now: Timestamp) -> Vec<Value> {
    let statuses = pod
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let total = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let ready = statuses
        .iter()
        .filter(|s| s["ready"] == json!(true))
        .count();
    let restarts: i64 = statuses
        .iter()
        .filter_map(|s| s["restartCount"].as_i64())
        .sum();
    vec![
        json!(meta::name(pod)),
        json!(format!("{ready}/{total}")),
        json!(display_status(pod)),
        json!(restarts.to_string()),
        json!(created(pod, now)),
        json!(or_none(text(pod, "/status/podIP"))),
        json!(or_none(text(pod, "/spec/nodeName"))),
        json!("<none>"),
        json!("<none>"),
    ]
}

fn service_ports(service: &Value) -> String {
    let ports: Vec<String> = service
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|p| {
            format!(
                "{}/{}",
                meta::scalar_text(&p["port"]),
                p.get("protocol").and_then(Value::as_str).unwrap_or("TCP")
            )
        })
        .collect();
    or_none(ports.join(","))
}

fn selector_text(service: &Value) -> String {
    let pairs: Vec<String> = service
        .pointer("/spec/selector")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", meta::scalar_text(v)))
        .collect();
    or_none(pairs.join(","))
}

fn custom_cell(column: &crate::resources::PrinterColumn, object: &Value, now: Timestamp) -> Value {
    let Ok(path) = JsonPath::parse(&column.json_path) else {
        return Value::Null;
    };
    let Some(value) = path.find(object).into_iter().next() else {
        return Value::Null;
    };
    match column.type_.as_str() {
        "date" => json!(human_age(value.as_str(), now)),
        "integer" | "number" | "boolean" => value.clone(),
        _ => json!(meta::scalar_text(value)),
    }
}

/// Renders `objects` of `info` as a `meta.k8s.io/v1` Table.
pub(crate) fn render(
    info: &ResourceInfo,
    objects: &[Value],
    resource_version: &str,
    include: IncludeObject,
) -> Value {
    let now = Timestamp::now();
    let (columns, rows): (Vec<Value>, Vec<Vec<Value>>) = match info.builtin {
        Builtin::Pod => (
            columns(&[
                column("Name", "string", 0),
                column("Ready", "string", 0),
                column("Status", "string", 0),
                column("Restarts", "string", 0),
                column("Age", "string", 0),
                column("IP", "string", 1),
                column("Node", "string", 1),
                column("Nominated Node", "string", 1),
                column("Readiness Gates", "string", 1),
            ]),
            objects.iter().map(|o| pod_row(o, now)).collect(),
        ),
        Builtin::Service => (
            columns(&[
                column("Name", "string", 0),
                column("Type", "string", 0),
                column("Cluster-IP", "string", 0),
                column("External-IP", "string", 0),
                column("Port(s)", "string", 0),
                column("Age", "string", 0),
                column("Selector", "string", 1),
            ]),
            objects
                .iter()
                .map(|o| {
                    vec![
                        json!(meta::name(o)),
                        json!(text(o, "/spec/type")),
                        json!(or_none(text(o, "/spec/clusterIP"))),
                        json!("<none>"),
                        json!(service_ports(o)),
                        json!(created(o, now)),
                        json!(selector_text(o)),
                    ]
                })
                .collect(),
        ),
        Builtin::Namespace => (
            columns(&[
                column("Name", "string", 0),
                column("Status", "string", 0),
                column("Age", "string", 0),
            ]),
            objects
                .iter()
                .map(|o| {
                    vec![
                        json!(meta::name(o)),
                        json!(text(o, "/status/phase")),
                        json!(created(o, now)),
                    ]
                })
                .collect(),
        ),
        Builtin::Deployment => (
            columns(&[
                column("Name", "string", 0),
                column("Ready", "string", 0),
                column("Up-to-date", "integer", 0),
                column("Available", "integer", 0),
                column("Age", "string", 0),
            ]),
            objects
                .iter()
                .map(|o| {
                    let count = |pointer: &str| o.pointer(pointer).and_then(Value::as_i64);
                    vec![
                        json!(meta::name(o)),
                        json!(format!(
                            "{}/{}",
                            count("/status/readyReplicas").unwrap_or(0),
                            count("/spec/replicas").unwrap_or(0)
                        )),
                        json!(count("/status/updatedReplicas").unwrap_or(0)),
                        json!(count("/status/availableReplicas").unwrap_or(0)),
                        json!(created(o, now)),
                    ]
                })
                .collect(),
        ),
        Builtin::ReplicaSet => (
            columns(&[
                column("Name", "string", 0),
                column("Desired", "integer", 0),
                column("Current", "integer", 0),
                column("Ready", "integer", 0),
                column("Age", "string", 0),
            ]),
            objects
                .iter()
                .map(|o| {
                    let count = |pointer: &str| {
                        json!(o.pointer(pointer).and_then(Value::as_i64).unwrap_or(0))
                    };
                    vec![
                        json!(meta::name(o)),
                        count("/spec/replicas"),
                        count("/status/replicas"),
                        count("/status/readyReplicas"),
                        json!(created(o, now)),
                    ]
                })
                .collect(),
        ),
        Builtin::Node => (
            columns(&[
                column("Name", "string", 0),
                column("Status", "string", 0),
                column("Roles", "string", 0),
                column("Age", "string", 0),
                column("Version", "string", 0),
                column("Internal-IP", "string", 1),
            ]),
            objects
                .iter()
                .map(|o| {
                    vec![
                        json!(meta::name(o)),
                        json!("Ready"),
                        json!("control-plane"),
                        json!(created(o, now)),
                        json!(text(o, "/status/nodeInfo/kubeletVersion")),
                        json!("127.0.0.1"),
                    ]
                })
                .collect(),
        ),
        Builtin::CustomResourceDefinition => (
            {
                let mut cols = columns(&[column("Name", "string", 0)]);
                cols.push(json!({"name": "Created At", "type": "date", "format": "",
                                 "description": "", "priority": 0}));
                cols
            },
            objects
                .iter()
                .map(|o| {
                    vec![
                        json!(meta::name(o)),
                        json!(meta::meta_str(o, "creationTimestamp").unwrap_or_default()),
                    ]
                })
                .collect(),
        ),
        Builtin::Event | Builtin::EventV1 => (
            columns(&[
                column("Last Seen", "string", 0),
                column("Type", "string", 0),
                column("Reason", "string", 0),
                column("Object", "string", 0),
                column("Message", "string", 0),
            ]),
            objects
                .iter()
                .map(|o| {
                    let regarding = o.get("involvedObject").or_else(|| o.get("regarding"));
                    let object = regarding.map_or(String::new(), |r| {
                        format!(
                            "{}/{}",
                            r.get("kind")
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                                .to_lowercase(),
                            r.get("name").and_then(Value::as_str).unwrap_or_default()
                        )
                    });
                    let last = o
                        .get("lastTimestamp")
                        .or_else(|| o.get("deprecatedLastTimestamp"))
                        .or_else(|| o.get("eventTime"))
                        .and_then(Value::as_str);
                    let message = o
                        .get("message")
                        .or_else(|| o.get("note"))
                        .map(meta::scalar_text)
                        .unwrap_or_default();
                    vec![
                        json!(human_age(last, now)),
                        json!(text(o, "/type")),
                        json!(text(o, "/reason")),
                        json!(object),
                        json!(message),
                    ]
                })
                .collect(),
        ),
        Builtin::Custom if !info.columns.is_empty() => {
            let mut cols = columns(&[column("Name", "string", 0)]);
            for c in &info.columns {
                cols.push(json!({"name": c.name, "type": c.type_, "format": c.format,
                                 "description": c.description, "priority": c.priority}));
            }
            let rows = objects
                .iter()
                .map(|o| {
                    let mut row = vec![json!(meta::name(o))];
                    row.extend(info.columns.iter().map(|c| custom_cell(c, o, now)));
                    row
                })
                .collect();
            (cols, rows)
        }
        _ => (
            columns(&[column("Name", "string", 0), column("Age", "string", 0)]),
            objects
                .iter()
                .map(|o| vec![json!(meta::name(o)), json!(created(o, now))])
                .collect(),
        ),
    };
    let rows: Vec<Value> = rows
        .into_iter()
        .zip(objects)
        .map(|(cells, object)| {
            let mut row = json!({"cells": cells});
            match include {
                IncludeObject::None => {}
                IncludeObject::Metadata => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": object.get("metadata").cloned().unwrap_or(json!({})),
                    });
                }
                IncludeObject::Object => row["object"] = object.clone(),
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns,
        "rows": rows,
    })
}

fn columns(list: &[Column]) -> Vec<Value> {
    list.iter()
        .map(|c| {
            json!({"name": c.name, "type": c.type_, "format": c.format,
                   "description": "", "priority": c.priority})
        })
        .collect()
}

/// The STATUS column of `kubectl get pods` (what the API server's table printer shows).
fn display_status(pod: &Value) -> String {
    let status = pod.get("status").cloned().unwrap_or(Value::Null);
    let mut reason = status
        .get("reason")
        .and_then(Value::as_str)
        .or_else(|| status.get("phase").and_then(Value::as_str))
        .unwrap_or("Pending")
        .to_owned();
    let init = status
        .get("initContainerStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut initializing = false;
    for (index, container) in init.iter().enumerate() {
        let state = container.get("state").cloned().unwrap_or(Value::Null);
        if state
            .pointer("/terminated/exitCode")
            .and_then(Value::as_i64)
            == Some(0)
        {
            continue;
        }
        initializing = true;
        reason = if let Some(r) = state.pointer("/terminated/reason").and_then(Value::as_str) {
            format!("Init:{r}")
        } else if let Some(r) = state
            .pointer("/waiting/reason")
            .and_then(Value::as_str)
            .filter(|r| *r != "PodInitializing")
        {
            format!("Init:{r}")
        } else {
            format!("Init:{index}/{}", init.len())
        };
        break;
    }
    if !initializing {
        let containers = status
            .get("containerStatuses")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut running = false;
        for container in containers.iter().rev() {
            let state = container.get("state").cloned().unwrap_or(Value::Null);
            if let Some(r) = state.pointer("/waiting/reason").and_then(Value::as_str) {
                reason = r.to_owned();
            } else if let Some(r) = state.pointer("/terminated/reason").and_then(Value::as_str) {
                reason = r.to_owned();
            } else if state.get("running").is_some() && container.get("ready") == Some(&json!(true))
            {
                running = true;
            }
        }
        if reason == "Completed" && running {
            reason = "Running".to_owned();
        }
    }
    if meta::is_deleting(pod) {
        reason = "Terminating".to_owned();
    }
    reason
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;

    #[test]
    fn ages_read_like_kubectl() {
        let now: Timestamp = "2024-01-10T00:00:00Z".parse().unwrap();
        let age = |since: &str| human_age(Some(since), now);
        assert_eq!(age("2024-01-09T23:59:15Z"), "45s");
        assert_eq!(age("2024-01-09T23:56:40Z"), "3m20s");
        assert_eq!(age("2024-01-09T23:00:00Z"), "60m");
        assert_eq!(age("2024-01-09T19:00:00Z"), "5h");
        assert_eq!(age("2024-01-07T21:00:00Z"), "2d3h");
        assert_eq!(human_age(None, now), "<unknown>");
    }

    #[test]
    fn pods_and_custom_resources_render_their_columns() {
        let mut registry = Registry::with_builtins();
        for crd in agent_sandbox_api::crds::all() {
            registry.register_crd(&crd).unwrap();
        }
        let pods = registry.get("", "v1", "pods").unwrap();
        let pod = json!({"metadata": {"name": "p", "creationTimestamp": meta::now()},
            "spec": {"nodeName": "sim-node", "containers": [{"name": "c"}]},
            "status": {"phase": "Running", "podIP": "127.4.5.6",
                       "containerStatuses": [{"ready": true, "restartCount": 0, "state": {"running": {}}}]}});
        let table = render(&pods, &[pod], "7", IncludeObject::Metadata);
        let cells = &table["rows"][0]["cells"];
        assert_eq!(cells[0], json!("p"));
        assert_eq!(cells[1], json!("1/1"));
        assert_eq!(cells[2], json!("Running"));
        assert_eq!(cells[5], json!("127.4.5.6"));
        assert_eq!(
            table["rows"][0]["object"]["kind"],
            json!("PartialObjectMetadata")
        );
        let sandboxes = registry
            .get("agents.x-k8s.io", "v1beta1", "sandboxes")
            .unwrap();
        let sandbox = json!({"metadata": {"name": "s", "creationTimestamp": meta::now()},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "DependenciesReady"}]}});
        let table = render(&sandboxes, &[sandbox], "8", IncludeObject::None);
        let names: Vec<&str> = table["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, vec!["Name", "Ready", "Reason", "Age"]);
        assert_eq!(table["rows"][0]["cells"][1], json!("True"));
        assert_eq!(table["rows"][0]["cells"][2], json!("DependenciesReady"));
        assert!(table["rows"][0].get("object").is_none());
    }

    #[test]
    fn the_status_column_reads_container_states_like_kubectl() {
        let pod = |status: Value| json!({"metadata": {}, "status": status});
        let running = pod(json!({"phase": "Running", "containerStatuses": [
            {"ready": true, "state": {"running": {"startedAt": "t0"}}}]}));
        assert_eq!(display_status(&running), "Running");
        let pull_failed = pod(json!({"phase": "Pending", "containerStatuses": [
            {"ready": false, "state": {"waiting": {"reason": "ErrImagePull"}}}]}));
        assert_eq!(display_status(&pull_failed), "ErrImagePull");
        let completed = pod(json!({"phase": "Succeeded", "containerStatuses": [
            {"ready": false, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}));
        assert_eq!(display_status(&completed), "Completed");
        let initializing = pod(json!({"phase": "Pending",
            "initContainerStatuses": [{"state": {"running": {}}}, {"state": {"waiting": {"reason": "PodInitializing"}}}],
            "containerStatuses": [{"state": {"waiting": {"reason": "PodInitializing"}}}]}));
        assert_eq!(display_status(&initializing), "Init:0/2");
        let mut deleting = running.clone();
        deleting["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
        assert_eq!(display_status(&deleting), "Terminating");
    }
}
