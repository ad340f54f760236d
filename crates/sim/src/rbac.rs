//! Authorization (sans IO): what an authenticated user may do, decided as a real API server
//! with `--authorization-mode=Node,RBAC` decides it, approximated.
//!
//! Members of `system:masters` (the administrator) may do everything, and so may nodes
//! (`system:nodes`: the Node authorizer and NodeRestriction are not modelled). Every
//! authenticated user may read discovery, the OpenAPI index, `/version` and the health checks
//! (the bootstrap roles `system:discovery` and `system:public-info-viewer`). Anyone else, such as
//! a ServiceAccount, may do what the Roles and ClusterRoles bound to it (by user, group or
//! ServiceAccount subject) allow: verbs, API groups, resources (`pods`, `pods/log`, `*`,
//! `*/scale`), resource names and non-resource URLs (`/sim/metrics`, with a trailing `*` as a
//! prefix), as RBAC evaluates rules. Aggregated ClusterRoles and the bootstrap roles other than
//! `cluster-admin` are not there, and nothing stops a user who may write roles and bindings from
//! granting more than it has (no escalation check).

use std::sync::Arc;

use serde_json::Value;

use crate::auth::{AUTHENTICATED_GROUP, Identity, MASTERS_GROUP, NODES_GROUP};

/// The RBAC API group.
pub(crate) const GROUP: &str = "rbac.authorization.k8s.io";

/// What a request asks to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Request<'a> {
    /// A request of the resource API.
    Resource {
        verb: &'a str,
        group: &'a str,
        /// `pods`, `pods/log`, ...
        resource: &'a str,
        /// Empty for cluster-scoped resources and requests across namespaces.
        namespace: &'a str,
        /// Empty for collections.
        name: &'a str,
    },
    /// Any other path.
    Path { verb: &'a str, path: &'a str },
}

/// The RBAC objects a decision is made from: ClusterRoles and ClusterRoleBindings, and the
/// Roles and RoleBindings of the request's namespace.
#[derive(Debug, Default)]
pub(crate) struct Policy {
    pub(crate) cluster_roles: Vec<Arc<Value>>,
    pub(crate) cluster_bindings: Vec<Arc<Value>>,
    pub(crate) roles: Vec<Arc<Value>>,
    pub(crate) bindings: Vec<Arc<Value>>,
}

/// Paths every authenticated user may read.
fn public_path(path: &str) -> bool {
    let path = path.trim_end_matches('/');
    [
        "/api", "/apis", "/openapi", "/version", "/healthz", "/livez", "/readyz",
    ]
    .iter()
    .any(|prefix| path == *prefix || path.starts_with(&format!("{prefix}/")))
}

/// Whether `identity` needs no rule for anything.
pub(crate) fn unrestricted(identity: &Identity) -> bool {
    identity.in_group(MASTERS_GROUP) || identity.in_group(NODES_GROUP)
}

/// Whether `identity` may do `request` under `policy`.
pub(crate) fn allows(identity: &Identity, request: &Request<'_>, policy: &Policy) -> bool {
    if unrestricted(identity) {
        return true;
    }
    if let Request::Path { verb: "get", path } = request
        && identity.in_group(AUTHENTICATED_GROUP)
        && public_path(path)
    {
        return true;
    }
    let namespace = match request {
        Request::Resource { namespace, .. } => *namespace,
        Request::Path { .. } => "",
    };
    let cluster_role = |name: &str| {
        policy
            .cluster_roles
            .iter()
            .find(|role| crate::meta::name(role) == name)
    };
    let mut roles: Vec<&Arc<Value>> = Vec::new();
    for binding in &policy.cluster_bindings {
        if binds(binding, identity, "")
            && role_ref(binding).0 == "ClusterRole"
            && let Some(role) = cluster_role(role_ref(binding).1)
        {
            roles.push(role);
        }
    }
    // RoleBindings grant only in their own namespace, and only to namespaced requests.
    if !namespace.is_empty() {
        for binding in &policy.bindings {
            if crate::meta::namespace(binding) != namespace || !binds(binding, identity, namespace)
            {
                continue;
            }
            let (kind, name) = role_ref(binding);
            let role = match kind {
                "ClusterRole" => cluster_role(name),
                "Role" => policy.roles.iter().find(|role| {
                    crate::meta::name(role) == name && crate::meta::namespace(role) == namespace
                }),
                _ => None,
            };
            if let Some(role) = role {
                roles.push(role);
            }
        }
    }
    roles.iter().any(|role| {
        role.get("rules")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|rule| rule_allows(rule, request))
    })
}

fn role_ref(binding: &Value) -> (&str, &str) {
    let text = |field: &str| {
        binding
            .pointer(&format!("/roleRef/{field}"))
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    (text("kind"), text("name"))
}

/// Whether one of `binding`'s subjects is `identity` (a ServiceAccount subject without a
/// namespace is in the binding's, `binding_namespace`).
fn binds(binding: &Value, identity: &Identity, binding_namespace: &str) -> bool {
    binding
        .get("subjects")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|subject| {
            let text = |field: &str| {
                subject
                    .get(field)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
            };
            match text("kind") {
                "User" => text("name") == identity.user,
                "Group" => identity.in_group(text("name")),
                "ServiceAccount" => {
                    let namespace = Some(text("namespace"))
                        .filter(|ns| !ns.is_empty())
                        .unwrap_or(binding_namespace);
                    identity.user == format!("system:serviceaccount:{namespace}:{}", text("name"))
                }
                _ => false,
            }
        })
}

fn strings<'a>(rule: &'a Value, field: &str) -> impl Iterator<Item = &'a str> {
    rule.get(field)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

fn has(rule: &Value, field: &str, wanted: &str) -> bool {
    strings(rule, field).any(|item| item == "*" || item == wanted)
}

fn rule_allows(rule: &Value, request: &Request<'_>) -> bool {
    match request {
        Request::Resource {
            verb,
            group,
            resource,
            name,
            ..
        } => {
            let resource_matches = strings(rule, "resources").any(|item| {
                item == "*"
                    || item == *resource
                    || resource
                        .split_once('/')
                        .is_some_and(|(_, sub)| item == format!("*/{sub}"))
            });
            let names: Vec<&str> = strings(rule, "resourceNames").collect();
            has(rule, "verbs", verb)
                && has(rule, "apiGroups", group)
                && resource_matches
                && (names.is_empty() || (!name.is_empty() && names.contains(name)))
        }
        Request::Path { verb, path } => {
            has(rule, "verbs", verb)
                && strings(rule, "nonResourceURLs").any(|url| {
                    url == *path
                        || url
                            .strip_suffix('*')
                            .is_some_and(|prefix| path.starts_with(prefix))
                })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> Arc<Value> {
        Arc::new(value)
    }

    /// deploy/base's router ClusterRole, bound to its ServiceAccount, and a Role in `team`.
    fn policy() -> Policy {
        Policy {
            cluster_roles: vec![object(json!({
                "metadata": {"name": "sandbox-router"},
                "rules": [
                    {"apiGroups": ["agents.x-k8s.io"], "resources": ["sandboxes"], "verbs": ["get", "list", "watch"]},
                    {"apiGroups": ["agents.x-k8s.io"], "resources": ["sandboxes/status"], "verbs": ["patch"]},
                    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
                    {"nonResourceURLs": ["/sim/*"], "verbs": ["get"]}
                ]
            }))],
            cluster_bindings: vec![object(json!({
                "metadata": {"name": "sandbox-router"},
                "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": "sandbox-router"},
                "subjects": [{"kind": "ServiceAccount", "name": "sandbox-router", "namespace": "agent-sandbox-system"}]
            }))],
            roles: vec![object(json!({
                "metadata": {"name": "reader", "namespace": "team"},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"], "resourceNames": ["settings"]}]
            }))],
            bindings: vec![object(json!({
                "metadata": {"name": "reader", "namespace": "team"},
                "roleRef": {"apiGroup": GROUP, "kind": "Role", "name": "reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "default"}, {"kind": "Group", "name": "ops"}]
            }))],
        }
    }

    fn resource<'a>(
        verb: &'a str,
        group: &'a str,
        resource: &'a str,
        namespace: &'a str,
        name: &'a str,
    ) -> Request<'a> {
        Request::Resource {
            verb,
            group,
            resource,
            namespace,
            name,
        }
    }

    #[test]
    fn a_service_account_may_do_what_its_roles_allow_and_nothing_else() {
        let router = Identity::service_account("agent-sandbox-system", "sandbox-router");
        let policy = policy();
        let allowed = [
            resource("watch", "agents.x-k8s.io", "sandboxes", "", ""),
            resource("get", "agents.x-k8s.io", "sandboxes", "team", "s"),
            resource("patch", "agents.x-k8s.io", "sandboxes/status", "team", "s"),
            resource("list", "", "pods", "team", ""),
            Request::Path {
                verb: "get",
                path: "/apis/agents.x-k8s.io/v1beta1",
            },
            Request::Path {
                verb: "get",
                path: "/sim/metrics",
            },
        ];
        for request in &allowed {
            assert!(allows(&router, request, &policy), "{request:?}");
        }
        let refused = [
            resource("patch", "agents.x-k8s.io", "sandboxes", "team", "s"),
            resource("create", "", "pods", "team", ""),
            resource("get", "", "pods/log", "team", "p"),
            resource("get", "", "secrets", "team", "key"),
            resource("create", "", "serviceaccounts/token", "team", "default"),
            Request::Path {
                verb: "post",
                path: "/sim/metrics",
            },
        ];
        for request in &refused {
            assert!(!allows(&router, request, &policy), "{request:?}");
        }
    }

    #[test]
    fn role_bindings_grant_in_their_namespace_by_name_and_group() {
        let policy = policy();
        let default = Identity::service_account("team", "default");
        assert!(allows(
            &default,
            &resource("get", "", "configmaps", "team", "settings"),
            &policy
        ));
        // Not another object, not a list, not another namespace's account.
        assert!(!allows(
            &default,
            &resource("get", "", "configmaps", "team", "other"),
            &policy
        ));
        assert!(!allows(
            &default,
            &resource("list", "", "configmaps", "team", ""),
            &policy
        ));
        let elsewhere = Identity::service_account("other", "default");
        assert!(!allows(
            &elsewhere,
            &resource("get", "", "configmaps", "team", "settings"),
            &policy
        ));
        assert!(!allows(
            &elsewhere,
            &resource("get", "", "configmaps", "other", "settings"),
            &policy
        ));
        // A group subject.
        let mut ops = Identity::service_account("elsewhere", "bot");
        ops.groups.push("ops".into());
        assert!(allows(
            &ops,
            &resource("get", "", "configmaps", "team", "settings"),
            &policy
        ));
    }

    #[test]
    fn masters_and_nodes_need_no_rule() {
        let nothing = Policy::default();
        let request = resource("delete", "", "namespaces", "", "default");
        assert!(allows(&Identity::admin(), &request, &nothing));
        assert!(allows(&Identity::node("sim-node"), &request, &nothing));
        assert!(!allows(
            &Identity::service_account("default", "default"),
            &request,
            &nothing
        ));
    }
}
