//! NetworkPolicy as an nftables ruleset for one pod's network namespace (sans IO): what a CNI
//! plugin enforces on a real node, for the pods of this one.
//!
//! The semantics are the API's: a pod is isolated for ingress (egress) when some policy of its
//! namespace selects it with that policy type; an isolated pod admits only what the union of
//! those policies' rules allows (policies are additive); a rule's peers are pods (by pod and
//! namespace selector: the pods this node runs, the only ones on its pod network), namespaces,
//! or IP blocks with exceptions; its ports are numbers, ranges (`endPort`) or, for ingress, the
//! target pod's named ports. Replies of allowed connections pass (connection tracking); so do
//! loopback and, as on every CNI, traffic from the node itself (probes, port-forward, a router
//! running on the host). IPv6 rules are left out: pods have IPv4 only (IPv6 is disabled in
//! their namespace), so everything IPv6 is dropped for an isolated pod.
//!
//! Dropped, not refused: a peer that is not admitted sees its packets vanish and times out, as
//! on a real cluster (the seed's gotcha 3).
//!
//! The same ruleset also carries the pod's way to the API server: the `kubernetes` Service's
//! address translated to where the node forwards it ([`NodeRules::api`]), as kube-proxy would.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddrV4};

use agent_sandbox_api::labels::{self, selector_matches};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The nftables table the kubelet owns in each pod's namespace.
pub(crate) const TABLE: &str = "agent_sandbox";

/// A pod on this node's network, as policies see it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PodPeer {
    pub(crate) namespace: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) ip: Option<Ipv4Addr>,
    /// Named container ports: name → (port, protocol).
    pub(crate) ports: BTreeMap<String, (u16, String)>,
}

/// What the policies are evaluated against.
#[derive(Clone, Debug, Default)]
pub(crate) struct Cluster {
    pub(crate) policies: Vec<NetworkPolicy>,
    /// Namespace labels by name (with `kubernetes.io/metadata.name`, which the API server sets).
    pub(crate) namespaces: BTreeMap<String, BTreeMap<String, String>>,
    pub(crate) pods: Vec<PodPeer>,
}

/// What every pod's ruleset has regardless of policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NodeRules {
    /// The node's address on the pod network (the bridge's).
    pub(crate) node_ip: Ipv4Addr,
    /// The `kubernetes` Service's address and where the node forwards it.
    pub(crate) api: Option<(SocketAddrV4, SocketAddrV4)>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    fn name(self) -> &'static str {
        match self {
            Self::Ingress => "Ingress",
            Self::Egress => "Egress",
        }
    }

    /// The address field of the peer: the source coming in, the destination going out.
    fn field(self) -> &'static str {
        match self {
            Self::Ingress => "ip saddr",
            Self::Egress => "ip daddr",
        }
    }
}

/// One rule of a policy: its peers (`from` or `to`) and its ports.
type Rule<'a> = (
    Option<&'a Vec<NetworkPolicyPeer>>,
    Option<&'a Vec<NetworkPolicyPort>>,
);

/// Whether `policy` (of `target`'s namespace) selects `target` for `direction`.
fn isolates(policy: &NetworkPolicy, target: &PodPeer, direction: Direction) -> bool {
    let Some(spec) = &policy.spec else {
        return false;
    };
    if policy.metadata.namespace.as_deref() != Some(&target.namespace)
        || !selector_matches(
            &spec.pod_selector.clone().unwrap_or_default(),
            &target.labels,
        )
    {
        return false;
    }
    match &spec.policy_types {
        Some(types) => types.iter().any(|t| t == direction.name()),
        // Ingress always; Egress when the policy has egress rules.
        None => direction == Direction::Ingress || spec.egress.is_some(),
    }
}

/// The address matches of `peer` (nft expressions, without the field), or an empty list when
/// it matches nothing here.
fn peer_matches(
    peer: &NetworkPolicyPeer,
    policy_namespace: &str,
    cluster: &Cluster,
    direction: Direction,
) -> Vec<String> {
    let field = direction.field();
    if let Some(block) = &peer.ip_block {
        if block.cidr.contains(':') {
            return Vec::new();
        }
        let except: Vec<&str> = block
            .except
            .iter()
            .flatten()
            .map(String::as_str)
            .filter(|cidr| !cidr.contains(':'))
            .collect();
        let mut text = format!("{field} {}", block.cidr);
        if !except.is_empty() {
            let _ = write!(text, " {field} != {{ {} }}", except.join(", "));
        }
        return vec![text];
    }
    let namespaces: Vec<&String> = match &peer.namespace_selector {
        Some(selector) => cluster
            .namespaces
            .iter()
            .filter(|(_, labels)| selector_matches(selector, labels))
            .map(|(name, _)| name)
            .collect(),
        None => cluster
            .namespaces
            .keys()
            .filter(|name| *name == policy_namespace)
            .collect(),
    };
    let pod_selector = peer.pod_selector.clone().unwrap_or_default();
    let mut ips: Vec<String> = cluster
        .pods
        .iter()
        .filter(|pod| namespaces.contains(&&pod.namespace))
        .filter(|pod| selector_matches(&pod_selector, &pod.labels))
        .filter_map(|pod| pod.ip.map(|ip| ip.to_string()))
        .collect();
    ips.sort();
    ips.dedup();
    if ips.is_empty() {
        return Vec::new();
    }
    vec![format!("{field} {{ {} }}", ips.join(", "))]
}

/// The port matches of `ports` (empty: any port), resolving names against `target`'s ports for
/// ingress. A port that cannot be resolved matches nothing.
fn port_matches(
    ports: Option<&Vec<NetworkPolicyPort>>,
    target: &PodPeer,
    direction: Direction,
) -> Option<Vec<String>> {
    let ports = ports.filter(|ports| !ports.is_empty())?;
    let mut matches = Vec::new();
    for port in ports {
        let mut protocol = port.protocol.clone().unwrap_or_else(|| "TCP".to_owned());
        let number = match &port.port {
            None => None,
            Some(IntOrString::Int(n)) => Some(u16::try_from(*n).unwrap_or(0)),
            Some(IntOrString::String(name)) => match (direction, target.ports.get(name)) {
                (Direction::Ingress, Some((number, named_protocol))) => {
                    protocol.clone_from(named_protocol);
                    Some(*number)
                }
                _ => continue,
            },
        };
        let protocol = protocol.to_ascii_lowercase();
        if !["tcp", "udp", "sctp"].contains(&protocol.as_str()) {
            continue;
        }
        matches.push(match (number, port.end_port) {
            (None, _) => format!("meta l4proto {protocol}"),
            (Some(start), Some(end)) => format!("{protocol} dport {start}-{end}"),
            (Some(start), None) => format!("{protocol} dport {start}"),
        });
    }
    Some(matches)
}

/// The accept rules for `target` in `direction` from the policies that isolate it, or `None`
/// when none does (everything passes).
fn rules(target: &PodPeer, cluster: &Cluster, direction: Direction) -> Option<Vec<String>> {
    let policies: Vec<&NetworkPolicy> = cluster
        .policies
        .iter()
        .filter(|policy| isolates(policy, target, direction))
        .collect();
    if policies.is_empty() {
        return None;
    }
    let mut accepted = Vec::new();
    for policy in policies {
        let namespace = policy.metadata.namespace.clone().unwrap_or_default();
        let Some(spec) = &policy.spec else { continue };
        let entries: Vec<Rule<'_>> = match direction {
            Direction::Ingress => spec
                .ingress
                .iter()
                .flatten()
                .map(|rule| (rule.from.as_ref(), rule.ports.as_ref()))
                .collect(),
            Direction::Egress => spec
                .egress
                .iter()
                .flatten()
                .map(|rule| (rule.to.as_ref(), rule.ports.as_ref()))
                .collect(),
        };
        for (peers, ports) in entries {
            let peers: Vec<String> = match peers.filter(|peers| !peers.is_empty()) {
                // No peers: every address.
                None => vec![String::new()],
                Some(peers) => peers
                    .iter()
                    .flat_map(|peer| peer_matches(peer, &namespace, cluster, direction))
                    .collect(),
            };
            let ports = port_matches(ports, target, direction);
            for peer in &peers {
                match &ports {
                    None => accepted.push(peer.clone()),
                    Some(ports) => accepted.extend(
                        ports
                            .iter()
                            .map(|port| format!("{peer} {port}").trim().to_owned()),
                    ),
                }
            }
        }
    }
    Some(accepted)
}

/// The whole nftables script for `target`'s namespace (replacing the kubelet's table).
pub(crate) fn ruleset(target: &PodPeer, cluster: &Cluster, node: NodeRules) -> String {
    let mut text =
        format!("table inet {TABLE}\ndelete table inet {TABLE}\ntable inet {TABLE} {{\n");
    if let Some((service, forward)) = node.api {
        let _ = writeln!(
            text,
            "  chain nat_output {{\n    type nat hook output priority -100; policy accept;\n    \
             ip daddr {} tcp dport {} dnat ip to {forward}\n  }}",
            service.ip(),
            service.port()
        );
    }
    for (direction, chain, hook, interface) in [
        (Direction::Ingress, "ingress", "input", "iifname"),
        (Direction::Egress, "egress", "output", "oifname"),
    ] {
        let allowed = rules(target, cluster, direction);
        let policy = if allowed.is_some() { "drop" } else { "accept" };
        let _ = writeln!(
            text,
            "  chain {chain} {{\n    type filter hook {hook} priority 0; policy {policy};\n    \
             ct state established,related accept\n    {interface} \"lo\" accept"
        );
        if direction == Direction::Ingress {
            let _ = writeln!(text, "    ip saddr {} accept", node.node_ip);
        }
        for rule in allowed.into_iter().flatten() {
            let _ = writeln!(text, "    {} accept", rule.trim());
        }
        text.push_str("  }\n");
    }
    text.push_str("}\n");
    text
}

/// The labels of namespace `name` as policies see them: its own and the name label the API
/// server adds to every namespace.
pub(crate) fn namespace_labels(
    name: &str,
    own: Option<&BTreeMap<String, String>>,
) -> BTreeMap<String, String> {
    let mut labels = own.cloned().unwrap_or_default();
    labels.insert(labels::NAMESPACE_NAME.to_owned(), name.to_owned());
    labels
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(value: serde_json::Value) -> NetworkPolicy {
        serde_json::from_value(value).unwrap()
    }

    fn pod(namespace: &str, labels: &[(&str, &str)], ip: [u8; 4]) -> PodPeer {
        PodPeer {
            namespace: namespace.to_owned(),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ip: Some(Ipv4Addr::from(ip)),
            ports: BTreeMap::from([("runtime".to_owned(), (8888, "TCP".to_owned()))]),
        }
    }

    const NODE: NodeRules = NodeRules {
        node_ip: Ipv4Addr::new(10, 250, 0, 1),
        api: None,
    };

    /// The controller's default template policy: the router of agent-sandbox-system only in,
    /// public addresses only out.
    fn template_policy() -> NetworkPolicy {
        policy(json!({
            "metadata": {"name": "t-network-policy", "namespace": "default"},
            "spec": {
                "podSelector": {"matchExpressions": [
                    {"key": "agents.x-k8s.io/sandbox-name-hash", "operator": "Exists"}]},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"from": [{
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agent-sandbox-system"}},
                    "podSelector": {"matchLabels": {"app": "sandbox-router"}}}]}],
                "egress": [{"to": [
                    {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "169.254.0.0/16"]}},
                    {"ipBlock": {"cidr": "::/0", "except": ["fc00::/7"]}}]}]
            }
        }))
    }

    fn cluster(policies: Vec<NetworkPolicy>) -> (PodPeer, Cluster) {
        let sandbox = pod(
            "default",
            &[("agents.x-k8s.io/sandbox-name-hash", "abc")],
            [10, 250, 0, 5],
        );
        let pods = vec![
            sandbox.clone(),
            pod(
                "agent-sandbox-system",
                &[("app", "sandbox-router")],
                [10, 250, 0, 7],
            ),
            pod("default", &[("app", "sandbox-router")], [10, 250, 0, 8]),
            pod("default", &[("app", "other")], [10, 250, 0, 9]),
        ];
        let namespaces = ["default", "agent-sandbox-system"]
            .into_iter()
            .map(|name| (name.to_owned(), namespace_labels(name, None)))
            .collect();
        (
            sandbox,
            Cluster {
                policies,
                namespaces,
                pods,
            },
        )
    }

    #[test]
    fn the_template_policy_admits_only_the_system_router_and_public_addresses() {
        let (sandbox, cluster) = cluster(vec![template_policy()]);
        let text = ruleset(&sandbox, &cluster, NODE);
        assert!(
            text.contains("type filter hook input priority 0; policy drop;"),
            "{text}"
        );
        assert!(
            text.contains("    ip saddr { 10.250.0.7 } accept\n"),
            "{text}"
        );
        assert!(!text.contains("10.250.0.8"), "{text}");
        assert!(
            text.contains("type filter hook output priority 0; policy drop;"),
            "{text}"
        );
        assert!(
            text.contains(
                "    ip daddr 0.0.0.0/0 ip daddr != { 10.0.0.0/8, 169.254.0.0/16 } accept\n"
            ),
            "{text}"
        );
        // The node's own traffic and replies always pass.
        assert!(text.contains("    ip saddr 10.250.0.1 accept\n"));
        assert!(text.contains("ct state established,related accept"));
        assert!(!text.contains("::/0"), "{text}");
    }

    #[test]
    fn policies_are_additive_as_on_a_real_cluster() {
        // deploy/sandboxes/namespace-router's policy: the router of the sandboxes' namespace too.
        let same_namespace = policy(json!({
            "metadata": {"name": "sandbox-router-same-namespace", "namespace": "default"},
            "spec": {
                "podSelector": {"matchExpressions": [
                    {"key": "agents.x-k8s.io/sandbox-name-hash", "operator": "Exists"}]},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "sandbox-router"}}}],
                             "ports": [{"protocol": "TCP", "port": 8888}]}]
            }
        }));
        let (sandbox, alone) = cluster(vec![template_policy()]);
        let (_, both) = cluster(vec![template_policy(), same_namespace]);
        assert!(!ruleset(&sandbox, &alone, NODE).contains("10.250.0.8"));
        let text = ruleset(&sandbox, &both, NODE);
        assert!(
            text.contains("    ip saddr { 10.250.0.8 } tcp dport 8888 accept\n"),
            "{text}"
        );
        assert!(
            text.contains("    ip saddr { 10.250.0.7 } accept\n"),
            "{text}"
        );
    }

    #[test]
    fn an_unselected_pod_is_not_isolated_and_gets_the_api_route() {
        let (_, cluster) = cluster(vec![template_policy()]);
        let other = cluster.pods[3].clone();
        let node = NodeRules {
            api: Some((
                SocketAddrV4::new(Ipv4Addr::new(10, 96, 0, 1), 443),
                SocketAddrV4::new(Ipv4Addr::new(10, 250, 0, 1), 6443),
            )),
            ..NODE
        };
        let text = ruleset(&other, &cluster, node);
        assert!(
            text.contains("hook input priority 0; policy accept;"),
            "{text}"
        );
        assert!(
            text.contains("hook output priority 0; policy accept;"),
            "{text}"
        );
        assert!(
            text.contains("ip daddr 10.96.0.1 tcp dport 443 dnat ip to 10.250.0.1:6443"),
            "{text}"
        );
    }

    #[test]
    fn named_ports_ranges_and_empty_rules() {
        let policy = policy(json!({
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {
                "podSelector": {},
                "ingress": [
                    {"ports": [{"port": "runtime"}, {"port": 9000, "endPort": 9010, "protocol": "UDP"},
                               {"port": "missing"}]},
                    {"from": [{"podSelector": {"matchLabels": {"app": "nobody"}}}]}
                ]
            }
        }));
        let (sandbox, cluster) = cluster(vec![policy]);
        let text = ruleset(&sandbox, &cluster, NODE);
        assert!(text.contains("    tcp dport 8888 accept\n"), "{text}");
        assert!(text.contains("    udp dport 9000-9010 accept\n"), "{text}");
        // No policy type given and no egress rules: egress is not isolated.
        assert!(
            text.contains("hook output priority 0; policy accept;"),
            "{text}"
        );
        // A peer that matches no pod admits nothing (and is not "everyone").
        assert_eq!(text.matches(" accept\n").count(), 2 + 3 + 2, "{text}");
        // A policy with no rules at all isolates and admits nothing.
        let deny = policy_deny_all();
        let (sandbox, cluster) = self::cluster(vec![deny]);
        let text = ruleset(&sandbox, &cluster, NODE);
        assert!(
            text.contains("hook input priority 0; policy drop;"),
            "{text}"
        );
        assert!(
            text.contains("hook output priority 0; policy drop;"),
            "{text}"
        );
    }

    fn policy_deny_all() -> NetworkPolicy {
        policy(json!({
            "metadata": {"name": "deny", "namespace": "default"},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
        }))
    }
}
