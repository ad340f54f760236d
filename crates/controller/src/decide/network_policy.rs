//! The one NetworkPolicy per SandboxTemplate, `<template>-network-policy`, selecting the pods of
//! every sandbox built from the template.
//!
//! With no user rules the controller writes the secure default: ingress only from the router
//! (its namespace and pod labels are settings whose defaults match `deploy/`, so the seed
//! article's gotchas 2 and 3 cannot happen with defaults), egress to public addresses only
//! (private, shared, link-local, loopback, cloud-metadata, benchmarking, reserved and multicast
//! ranges denied, IPv4 and IPv6), and optionally cluster DNS.

use std::collections::BTreeMap;

use agent_sandbox_api::template::NetworkPolicyManagement;
use agent_sandbox_api::{SandboxTemplate, labels, name_hash};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::controller_reference;

/// IPv4 ranges sandboxes may not reach: RFC 1918, shared address space (also Alibaba's
/// metadata service at 100.100.100.200), link-local (cloud metadata at 169.254.169.254),
/// loopback, "this network", the benchmarking range 198.18.0.0/15 (which some clouds and
/// appliances use internally), multicast, and the reserved 240.0.0.0/4 (broadcast included): none
/// of them is the public internet.
pub const DENIED_IPV4: [&str; 10] = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
];

/// IPv6 ranges sandboxes may not reach: unique-local (AWS metadata at fd00:ec2::254),
/// link-local, loopback and multicast. Not the IPv4-mapped range `::ffff:0:0/96`: the API
/// server rejects an IPv4-mapped address in an `ipBlock`, and there is no need for it, because a
/// connection to `::ffff:a.b.c.d` leaves the pod as an IPv4 packet to `a.b.c.d`, which
/// [`DENIED_IPV4`] covers.
pub const DENIED_IPV6: [&str; 4] = ["::1/128", "fc00::/7", "fe80::/10", "ff00::/8"];

/// Where the router and cluster DNS live, for the default policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicySettings {
    /// Namespace of the router pods.
    pub router_namespace: String,
    /// Labels of the router pods.
    pub router_pod_labels: BTreeMap<String, String>,
    /// Whether sandboxes may query cluster DNS.
    pub allow_cluster_dns: bool,
    /// Namespace of the cluster DNS pods.
    pub dns_namespace: String,
    /// Labels of the cluster DNS pods.
    pub dns_pod_labels: BTreeMap<String, String>,
}

impl Default for PolicySettings {
    fn default() -> Self {
        Self {
            router_namespace: agent_sandbox_api::wire::SYSTEM_NAMESPACE.to_owned(),
            router_pod_labels: BTreeMap::from([(
                labels::ROUTER_APP.to_owned(),
                labels::ROUTER_APP_VALUE.to_owned(),
            )]),
            allow_cluster_dns: false,
            dns_namespace: "kube-system".to_owned(),
            dns_pod_labels: BTreeMap::from([("k8s-app".to_owned(), "kube-dns".to_owned())]),
        }
    }
}

/// Name of the template's policy.
pub fn policy_name(template: &SandboxTemplate) -> String {
    format!(
        "{}-network-policy",
        template.metadata.name.as_deref().unwrap_or_default()
    )
}

fn namespace_selector(namespace: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(
            labels::NAMESPACE_NAME.to_owned(),
            namespace.to_owned(),
        )])),
        match_expressions: None,
    }
}

fn ip_block(cidr: &str, except: &[&str]) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: cidr.to_owned(),
            except: Some(except.iter().map(|s| (*s).to_owned()).collect()),
        }),
        ..NetworkPolicyPeer::default()
    }
}

/// The secure default ingress and egress rules.
pub fn default_rules(
    settings: &PolicySettings,
) -> (Vec<NetworkPolicyIngressRule>, Vec<NetworkPolicyEgressRule>) {
    let ingress = vec![NetworkPolicyIngressRule {
        from: Some(vec![NetworkPolicyPeer {
            namespace_selector: Some(namespace_selector(&settings.router_namespace)),
            pod_selector: Some(LabelSelector {
                match_labels: Some(settings.router_pod_labels.clone()),
                match_expressions: None,
            }),
            ip_block: None,
        }]),
        ports: None,
    }];
    let mut egress = vec![NetworkPolicyEgressRule {
        to: Some(vec![
            ip_block("0.0.0.0/0", &DENIED_IPV4),
            ip_block("::/0", &DENIED_IPV6),
        ]),
        ports: None,
    }];
    if settings.allow_cluster_dns {
        let port = |protocol: &str| NetworkPolicyPort {
            port: Some(IntOrString::Int(53)),
            protocol: Some(protocol.to_owned()),
            end_port: None,
        };
        egress.push(NetworkPolicyEgressRule {
            to: Some(vec![NetworkPolicyPeer {
                namespace_selector: Some(namespace_selector(&settings.dns_namespace)),
                pod_selector: Some(LabelSelector {
                    match_labels: Some(settings.dns_pod_labels.clone()),
                    match_expressions: None,
                }),
                ip_block: None,
            }]),
            ports: Some(vec![port("UDP"), port("TCP")]),
        });
    }
    (ingress, egress)
}

/// The policy the template needs, or `None` when it is `Unmanaged` (then an owned policy is
/// deleted and any other left alone).
pub fn desired_policy(
    template: &SandboxTemplate,
    settings: &PolicySettings,
) -> Option<NetworkPolicy> {
    if template.spec.network_policy_management == NetworkPolicyManagement::Unmanaged {
        return None;
    }
    let template_name = template.metadata.name.as_deref().unwrap_or_default();
    let (ingress, egress) = match &template.spec.network_policy {
        Some(user) => (
            user.ingress.clone().unwrap_or_default(),
            user.egress.clone().unwrap_or_default(),
        ),
        None => default_rules(settings),
    };
    Some(NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(policy_name(template)),
            namespace: template.metadata.namespace.clone(),
            owner_references: Some(vec![controller_reference(template)]),
            ..ObjectMeta::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    labels::SANDBOX_TEMPLATE_REF_HASH.to_owned(),
                    name_hash(template_name),
                )])),
                match_expressions: None,
            }),
            policy_types: Some(vec!["Ingress".to_owned(), "Egress".to_owned()]),
            ingress: Some(ingress),
            egress: Some(egress),
        }),
    })
}

/// True when the existing policy's spec differs from the desired one (drift to correct).
pub fn drifted(existing: &NetworkPolicy, desired: &NetworkPolicy) -> bool {
    existing.spec != desired.spec
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_sandbox_api::SandboxTemplateSpec;
    use agent_sandbox_api::template::NetworkPolicySpec as UserRules;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn template() -> SandboxTemplate {
        let mut template = SandboxTemplate::new("python-runtime", SandboxTemplateSpec::default());
        template.metadata.namespace = Some("default".into());
        template.metadata.uid = Some("t-uid".into());
        template
    }

    #[test]
    fn secure_default_shape() {
        let policy = desired_policy(&template(), &PolicySettings::default()).unwrap();
        assert_eq!(
            policy.metadata.name.as_deref(),
            Some("python-runtime-network-policy")
        );
        let spec = serde_json::to_value(policy.spec.unwrap()).unwrap();
        assert_eq!(
            spec,
            json!({
                "podSelector": {"matchLabels": {"agents.x-k8s.io/sandbox-template-ref-hash": name_hash("python-runtime")}},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"from": [{
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agent-sandbox-system"}},
                    "podSelector": {"matchLabels": {"app": "sandbox-router"}},
                }]}],
                "egress": [{"to": [
                    {"ipBlock": {"cidr": "0.0.0.0/0", "except": DENIED_IPV4}},
                    {"ipBlock": {"cidr": "::/0", "except": DENIED_IPV6}},
                ]}],
            })
        );
    }

    /// Besides private and metadata ranges: benchmarking (198.18.0.0/15), reserved
    /// (240.0.0.0/4) and multicast (224.0.0.0/4, ff00::/8) addresses are not the internet.
    #[test]
    fn default_egress_denies_benchmarking_reserved_and_multicast_ranges() {
        let policy = desired_policy(&template(), &PolicySettings::default()).unwrap();
        let spec = serde_json::to_value(policy.spec.unwrap()).unwrap();
        let except = |i: usize| spec["egress"][0]["to"][i]["ipBlock"]["except"].clone();
        for denied in [
            "198.18.0.0/15",
            "240.0.0.0/4",
            "224.0.0.0/4",
            "169.254.0.0/16",
        ] {
            assert!(
                except(0).as_array().unwrap().contains(&json!(denied)),
                "{denied}: {}",
                except(0)
            );
        }
        assert!(except(1).as_array().unwrap().contains(&json!("ff00::/8")));
    }

    #[test]
    fn router_peer_and_dns_follow_the_settings() {
        let settings = PolicySettings {
            router_namespace: "routers".into(),
            router_pod_labels: BTreeMap::from([("app.kubernetes.io/name".into(), "router".into())]),
            allow_cluster_dns: true,
            ..PolicySettings::default()
        };
        let policy = desired_policy(&template(), &settings).unwrap();
        let spec = policy.spec.unwrap();
        let peer = &spec.ingress.unwrap()[0].from.clone().unwrap()[0];
        assert_eq!(
            peer.namespace_selector
                .clone()
                .unwrap()
                .match_labels
                .unwrap()["kubernetes.io/metadata.name"],
            "routers"
        );
        assert_eq!(
            peer.pod_selector.clone().unwrap().match_labels.unwrap()["app.kubernetes.io/name"],
            "router"
        );
        let egress = spec.egress.unwrap();
        assert_eq!(egress.len(), 2);
        assert_eq!(egress[1].ports.as_ref().unwrap().len(), 2);
    }

    #[test]
    fn user_rules_are_used_verbatim_and_unmanaged_means_none() {
        let mut template = template();
        template.spec.network_policy = Some(UserRules {
            ingress: Some(vec![]),
            egress: None,
        });
        let spec = desired_policy(&template, &PolicySettings::default())
            .unwrap()
            .spec
            .unwrap();
        assert_eq!(spec.ingress, Some(vec![]));
        assert_eq!(spec.egress, Some(vec![]));
        template.spec.network_policy_management = NetworkPolicyManagement::Unmanaged;
        assert!(desired_policy(&template, &PolicySettings::default()).is_none());
    }
}
