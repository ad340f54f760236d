//! A stand-in Gateway API implementation: every Gateway, whatever its class, is accepted and
//! given an address (the one its spec asks for, or one already in its status, or one of its
//! own), and every HTTPRoute attached to one reports its parent's acceptance and
//! whether its backends exist, in the status fields a Gateway controller writes
//! (`status.addresses`, the `Accepted` and `Programmed` conditions, per-listener status with
//! `attachedRoutes`; a route's `status.parents`). Nothing is served at the address: the sim has no
//! data plane (`docs/sim.md`).
//!
//! The statuses are pure functions ([`gateway_status`], [`route_status`]); [`sync`] writes them.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::meta;
use crate::ops::ApiObjects;
use crate::resources::StorageKey;

/// The group of the Gateway API.
const GROUP: &str = "gateway.networking.k8s.io";
/// The `controllerName` the sim reports in route status.
pub(crate) const CONTROLLER_NAME: &str = "sim.agents.x-k8s.io/gateway-controller";

pub(crate) fn gateways_key() -> StorageKey {
    StorageKey::new(GROUP, "gateways")
}
pub(crate) fn routes_key() -> StorageKey {
    StorageKey::new(GROUP, "httproutes")
}

/// Whether changes to `key` affect Gateway or route status (Services are backends).
pub(crate) fn watches(key: &StorageKey) -> bool {
    *key == gateways_key() || *key == routes_key() || *key == StorageKey::new("", "services")
}

/// The addresses a Gateway reports: those its spec asks for, else those already in its status
/// (an address once given stays, and one written by whoever programs the Gateway, such as the
/// local cluster pointing it at its router, is kept), else one of [`gateway_address`].
fn addresses(gateway: &Value) -> Value {
    let listed = |pointer: &str| {
        gateway
            .pointer(pointer)
            .and_then(Value::as_array)
            .filter(|list| !list.is_empty())
            .cloned()
    };
    if let Some(requested) = listed("/spec/addresses") {
        let resolved: Vec<Value> = requested
            .into_iter()
            .map(|mut address| {
                if address.get("type").is_none() {
                    address["type"] = json!("IPAddress");
                }
                address
            })
            .collect();
        return Value::Array(resolved);
    }
    if let Some(current) = listed("/status/addresses") {
        return Value::Array(current);
    }
    json!([{"type": "IPAddress", "value": gateway_address(gateway)}])
}

/// The address the sim gives a Gateway: stable for its namespace and name, in 10.97.0.0/16
/// (apart from Services' 10.96.0.0/16).
pub(crate) fn gateway_address(gateway: &Value) -> String {
    let key = format!("{}/{}", meta::namespace(gateway), meta::name(gateway));
    let hash = agent_sandbox_api::fnv1a_32(key.as_bytes());
    let [_, _, high, low] = hash.to_be_bytes();
    format!("10.97.{high}.{}", low.clamp(1, 254))
}

fn condition(type_: &str, reason: &str, message: &str, generation: i64) -> Value {
    json!({"type": type_, "status": "True", "reason": reason, "message": message,
           "observedGeneration": generation})
}

fn generation(object: &Value) -> i64 {
    object
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(1)
}

/// Whether `parent_ref` (of a route in `route_namespace`) names `gateway`.
fn refers_to(parent_ref: &Value, route_namespace: &str, gateway: &Value) -> bool {
    let text = |field: &str| parent_ref.get(field).and_then(Value::as_str);
    text("group").unwrap_or(GROUP) == GROUP
        && text("kind").unwrap_or("Gateway") == "Gateway"
        && text("name") == Some(meta::name(gateway))
        && text("namespace").unwrap_or(route_namespace) == meta::namespace(gateway)
}

fn listeners(gateway: &Value) -> Vec<Value> {
    gateway
        .pointer("/spec/listeners")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// The status of `gateway`, given every HTTPRoute (conditions without times).
pub(crate) fn gateway_status(gateway: &Value, routes: &[Arc<Value>]) -> Value {
    let generation = generation(gateway);
    let listeners: Vec<Value> = listeners(gateway)
        .iter()
        .map(|listener| {
            let name = listener
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let attached = routes
                .iter()
                .filter(|route| {
                    route
                        .pointer("/spec/parentRefs")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .any(|parent| {
                            refers_to(parent, meta::namespace(route), gateway)
                                && parent
                                    .get("sectionName")
                                    .and_then(Value::as_str)
                                    .is_none_or(|section| section == name)
                        })
                })
                .count();
            json!({
                "name": name,
                "supportedKinds": [{"group": GROUP, "kind": "HTTPRoute"}],
                "attachedRoutes": attached,
                "conditions": [
                    condition("Accepted", "Accepted", "Listener is accepted", generation),
                    condition("Programmed", "Programmed", "Listener is programmed", generation),
                    condition("ResolvedRefs", "ResolvedRefs", "Listener references are resolved", generation),
                ],
            })
        })
        .collect();
    json!({
        "addresses": addresses(gateway),
        "conditions": [
            condition("Accepted", "Accepted", "Gateway is accepted", generation),
            condition("Programmed", "Programmed", "Gateway is programmed", generation),
        ],
        "listeners": listeners,
    })
}

/// The status of `route`: one entry per parent that is an existing Gateway, with `Accepted` and
/// `ResolvedRefs` (false, `BackendNotFound`, while a backend Service is missing).
pub(crate) fn route_status(
    route: &Value,
    gateways: &[Arc<Value>],
    service_exists: &dyn Fn(&str, &str) -> bool,
) -> Value {
    let generation = generation(route);
    let namespace = meta::namespace(route);
    let missing: Vec<String> = route
        .pointer("/spec/rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(|rule| {
            rule.get("backendRefs")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        })
        .filter(|backend| {
            backend
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("Service")
                == "Service"
                && backend
                    .get("group")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .is_empty()
        })
        .filter_map(|backend| {
            let name = backend.get("name").and_then(Value::as_str)?;
            let backend_namespace = backend
                .get("namespace")
                .and_then(Value::as_str)
                .unwrap_or(namespace);
            (!service_exists(backend_namespace, name))
                .then(|| format!("{backend_namespace}/{name}"))
        })
        .collect();
    let resolved = if missing.is_empty() {
        condition(
            "ResolvedRefs",
            "ResolvedRefs",
            "Resolved all the Object references for the Route",
            generation,
        )
    } else {
        let mut c = condition(
            "ResolvedRefs",
            "BackendNotFound",
            &format!("Service {} not found", missing.join(", ")),
            generation,
        );
        c["status"] = json!("False");
        c
    };
    let parents: Vec<Value> = route
        .pointer("/spec/parentRefs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|parent| gateways.iter().any(|g| refers_to(parent, namespace, g)))
        .map(|parent| {
            json!({
                "parentRef": parent,
                "controllerName": CONTROLLER_NAME,
                "conditions": [
                    condition("Accepted", "Accepted", "Route is accepted", generation),
                    resolved.clone(),
                ],
            })
        })
        .collect();
    json!({"parents": parents})
}

/// `new`'s conditions (anywhere in it) with `lastTransitionTime` from `old` where a condition
/// of the same type kept its status, else now.
fn with_times(new: &mut Value, old: Option<&Value>, now: &str) {
    match new {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                let old_value = old.and_then(|o| o.get(key));
                if key == "conditions"
                    && let Value::Array(conditions) = value
                {
                    let old_list = old_value.and_then(Value::as_array);
                    for condition in conditions.iter_mut() {
                        let previous = old_list.and_then(|list| {
                            list.iter().find(|c| c.get("type") == condition.get("type"))
                        });
                        let time = previous
                            .filter(|p| p.get("status") == condition.get("status"))
                            .and_then(|p| p.get("lastTransitionTime"))
                            .cloned()
                            .unwrap_or_else(|| json!(now));
                        condition["lastTransitionTime"] = time;
                    }
                } else {
                    with_times(value, old_value, now);
                }
            }
        }
        Value::Array(items) => {
            for (index, item) in items.iter_mut().enumerate() {
                with_times(item, old.and_then(|o| o.get(index)), now);
            }
        }
        _ => {}
    }
}

/// Writes the status `desired` computes from the stored object (read inside the write, so that
/// a status another writer just wrote is what it starts from), when it differs. `desired` runs
/// inside the store's write and must not use the store.
fn write_status(
    objects: &ApiObjects,
    key: &StorageKey,
    object: &Value,
    desired: impl Fn(&Value) -> Value,
) {
    let now = meta::now();
    let wanted = |stored: &Value| {
        let mut status = desired(stored);
        with_times(&mut status, stored.get("status"), &now);
        status
    };
    if object.get("status") == Some(&wanted(object)) {
        return;
    }
    objects.mutate(key, meta::namespace(object), meta::name(object), |stored| {
        let status = wanted(stored);
        if stored.get("status") == Some(&status) || meta::is_deleting(stored) {
            return false;
        }
        stored["status"] = status;
        true
    });
}

/// Brings the status of every Gateway and HTTPRoute up to date.
pub(crate) fn sync(objects: &ApiObjects) {
    let store = &objects.store;
    let (gateways, _) = store.list(&gateways_key(), None);
    let (routes, _) = store.list(&routes_key(), None);
    let gateways: Vec<Arc<Value>> = gateways
        .into_iter()
        .filter(|g| !meta::is_deleting(g))
        .collect();
    for gateway in &gateways {
        write_status(objects, &gateways_key(), gateway, |stored| {
            gateway_status(stored, &routes)
        });
    }
    // Read before the writes: the status is computed inside the store's write, which must not
    // read the store again.
    let (services, _) = store.list(&StorageKey::new("", "services"), None);
    let services: std::collections::BTreeSet<(String, String)> = services
        .iter()
        .map(|s| (meta::namespace(s).to_owned(), meta::name(s).to_owned()))
        .collect();
    let exists =
        |namespace: &str, name: &str| services.contains(&(namespace.to_owned(), name.to_owned()));
    for route in routes.iter().filter(|r| !meta::is_deleting(r)) {
        write_status(objects, &routes_key(), route, |stored| {
            route_status(stored, &gateways, &exists)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn gateway() -> Arc<Value> {
        Arc::new(json!({
            "metadata": {"name": "kind-gateway", "namespace": "default", "generation": 1},
            "spec": {"gatewayClassName": "any", "listeners": [{"name": "http", "protocol": "HTTP", "port": 80}]}
        }))
    }

    fn route(parent: Value) -> Arc<Value> {
        Arc::new(json!({
            "metadata": {"name": "r", "namespace": "default", "generation": 3},
            "spec": {"parentRefs": [parent],
                     "rules": [{"backendRefs": [{"name": "sandbox-router-svc", "port": 8080}]}]}
        }))
    }

    #[test]
    fn gateways_get_an_address_and_count_attached_routes() {
        let routes = [
            route(json!({"name": "kind-gateway"})),
            route(json!({"name": "kind-gateway", "sectionName": "other"})),
            route(json!({"name": "elsewhere"})),
        ];
        let status = gateway_status(&gateway(), &routes);
        let address = status["addresses"][0]["value"].as_str().unwrap();
        assert!(address.starts_with("10.97."), "{address}");
        assert_eq!(address, gateway_address(&gateway()));
        assert_eq!(status["addresses"][0]["type"], json!("IPAddress"));
        assert_eq!(
            status["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| (c["type"].as_str().unwrap(), c["status"].as_str().unwrap()))
                .collect::<Vec<_>>(),
            [("Accepted", "True"), ("Programmed", "True")]
        );
        assert_eq!(status["listeners"][0]["attachedRoutes"], json!(1));
    }

    #[test]
    fn requested_and_already_reported_addresses_are_kept() {
        let mut requested = (*gateway()).clone();
        requested["spec"]["addresses"] = json!([{"value": "10.1.2.3"}]);
        assert_eq!(
            gateway_status(&requested, &[])["addresses"],
            json!([{"type": "IPAddress", "value": "10.1.2.3"}])
        );
        let mut programmed = (*gateway()).clone();
        programmed["status"] = json!({"addresses": [{"type": "IPAddress", "value": "127.1.0.9"}]});
        assert_eq!(
            gateway_status(&programmed, &[])["addresses"],
            json!([{"type": "IPAddress", "value": "127.1.0.9"}])
        );
    }

    #[test]
    fn routes_report_their_gateway_parents_and_missing_backends() {
        let r = route(json!({"name": "kind-gateway"}));
        let status = route_status(&r, &[gateway()], &|_, _| false);
        let parent = &status["parents"][0];
        assert_eq!(parent["controllerName"], json!(CONTROLLER_NAME));
        assert_eq!(parent["conditions"][0]["type"], json!("Accepted"));
        assert_eq!(parent["conditions"][1]["reason"], json!("BackendNotFound"));
        assert_eq!(parent["conditions"][1]["observedGeneration"], json!(3));
        let resolved = route_status(&r, &[gateway()], &|ns, name| {
            ns == "default" && name == "sandbox-router-svc"
        });
        assert_eq!(
            resolved["parents"][0]["conditions"][1]["status"],
            json!("True")
        );
        let orphan = route_status(&route(json!({"name": "nope"})), &[gateway()], &|_, _| true);
        assert_eq!(orphan, json!({"parents": []}));
    }

    #[test]
    fn condition_times_survive_unchanged_statuses() {
        let mut new = json!({"conditions": [{"type": "A", "status": "True"}],
                             "listeners": [{"conditions": [{"type": "B", "status": "True"}]}]});
        let old = json!({"conditions": [{"type": "A", "status": "True", "lastTransitionTime": "t0"}],
                         "listeners": [{"conditions": [{"type": "B", "status": "False", "lastTransitionTime": "t0"}]}]});
        with_times(&mut new, Some(&old), "t1");
        assert_eq!(new["conditions"][0]["lastTransitionTime"], json!("t0"));
        assert_eq!(
            new["listeners"][0]["conditions"][0]["lastTransitionTime"],
            json!("t1")
        );
    }
}
