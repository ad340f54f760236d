//! Defaults applied to every sandbox built from a SandboxTemplate (by the warm-pool and claim
//! reconcilers), only where the template leaves the field unset.
//!
//! - `automountServiceAccountToken: false` (upstream): sandboxed code gets no API credentials.
//! - In the secure network mode (managed policy, no user rules, no `dnsPolicy`): the DNS
//!   settings that match what the default NetworkPolicy lets through ([`DnsMode`]).
//! - Our addition, per container and init container, unless the template carries
//!   `agents.x-k8s.io/skip-container-hardening: "true"`: `allowPrivilegeEscalation: false`, all
//!   capabilities dropped, and a `RuntimeDefault` seccomp profile at pod level.

use agent_sandbox_api::SandboxTemplate;
use agent_sandbox_api::annotations;
use agent_sandbox_api::template::NetworkPolicyManagement;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, PodDNSConfig, PodSecurityContext, PodSpec, SeccompProfile,
    SecurityContext,
};

/// How sandboxes in the secure network mode resolve names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DnsMode {
    /// The policy allows cluster DNS: leave `dnsPolicy` alone (ClusterFirst).
    Cluster,
    /// The policy blocks cluster DNS: `dnsPolicy: None` with these public resolvers (upstream's
    /// behaviour, with upstream's `8.8.8.8`, `1.1.1.1` as the default list).
    Public(Vec<String>),
}

/// True when the template asks for the secure default NetworkPolicy.
pub fn secure_network_mode(template: &SandboxTemplate) -> bool {
    template.spec.network_policy_management == NetworkPolicyManagement::Managed
        && template.spec.network_policy.is_none()
}

fn hardening_opted_out(template: &SandboxTemplate) -> bool {
    template
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::SKIP_SECURE_DEFAULTS))
        .is_some_and(|value| value == "true")
}

/// Applies the secure defaults to `spec`, a copy of `template`'s pod spec.
pub fn apply(template: &SandboxTemplate, dns: &DnsMode, spec: &mut PodSpec) {
    if spec.automount_service_account_token.is_none() {
        spec.automount_service_account_token = Some(false);
    }
    if secure_network_mode(template)
        && spec.dns_policy.is_none()
        && let DnsMode::Public(nameservers) = dns
    {
        spec.dns_policy = Some("None".to_owned());
        spec.dns_config = Some(PodDNSConfig {
            nameservers: Some(nameservers.clone()),
            ..spec.dns_config.take().unwrap_or_default()
        });
    }
    if hardening_opted_out(template) {
        return;
    }
    let pod_security = spec
        .security_context
        .get_or_insert_with(PodSecurityContext::default);
    if pod_security.seccomp_profile.is_none() {
        pod_security.seccomp_profile = Some(SeccompProfile {
            type_: "RuntimeDefault".to_owned(),
            localhost_profile: None,
        });
    }
    for container in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        harden(container);
    }
}

fn harden(container: &mut Container) {
    let security = container
        .security_context
        .get_or_insert_with(SecurityContext::default);
    if security.allow_privilege_escalation.is_none() && security.privileged != Some(true) {
        security.allow_privilege_escalation = Some(false);
    }
    if security.capabilities.is_none() && security.privileged != Some(true) {
        security.capabilities = Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            add: None,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_sandbox_api::SandboxTemplateSpec;
    use agent_sandbox_api::sandbox::{PodTemplate, SandboxBlueprint};
    use agent_sandbox_api::template::NetworkPolicySpec;
    use std::collections::BTreeMap;

    fn template() -> SandboxTemplate {
        SandboxTemplate::new(
            "python",
            SandboxTemplateSpec {
                blueprint: SandboxBlueprint {
                    pod_template: PodTemplate {
                        spec: crate::decide::fixtures::pod_spec(),
                        ..PodTemplate::default()
                    },
                    ..SandboxBlueprint::default()
                },
                ..SandboxTemplateSpec::default()
            },
        )
    }

    fn public() -> DnsMode {
        DnsMode::Public(vec!["8.8.8.8".into(), "1.1.1.1".into()])
    }

    #[test]
    fn unset_fields_get_secure_values() {
        let template = template();
        let mut spec = template.spec.blueprint.pod_template.spec.clone();
        apply(&template, &public(), &mut spec);
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.dns_policy.as_deref(), Some("None"));
        assert_eq!(
            spec.dns_config.unwrap().nameservers.unwrap(),
            vec!["8.8.8.8", "1.1.1.1"]
        );
        assert_eq!(
            spec.security_context
                .unwrap()
                .seccomp_profile
                .unwrap()
                .type_,
            "RuntimeDefault"
        );
        let security = spec.containers[0].security_context.clone().unwrap();
        assert_eq!(security.allow_privilege_escalation, Some(false));
        assert_eq!(security.capabilities.unwrap().drop.unwrap(), vec!["ALL"]);
    }

    #[test]
    fn explicit_template_values_win() {
        let mut template = template();
        let spec = &mut template.spec.blueprint.pod_template.spec;
        spec.automount_service_account_token = Some(true);
        spec.dns_policy = Some("ClusterFirst".into());
        spec.containers[0].security_context = Some(SecurityContext {
            allow_privilege_escalation: Some(true),
            capabilities: Some(Capabilities {
                add: Some(vec!["NET_ADMIN".into()]),
                drop: None,
            }),
            ..SecurityContext::default()
        });
        let mut spec = template.spec.blueprint.pod_template.spec.clone();
        apply(&template, &public(), &mut spec);
        assert_eq!(spec.automount_service_account_token, Some(true));
        assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirst"));
        let security = spec.containers[0].security_context.clone().unwrap();
        assert_eq!(security.allow_privilege_escalation, Some(true));
        assert_eq!(
            security.capabilities.unwrap().add.unwrap(),
            vec!["NET_ADMIN"]
        );
    }

    #[test]
    fn dns_is_left_alone_with_user_rules_or_cluster_dns() {
        let mut template = template();
        template.spec.network_policy = Some(NetworkPolicySpec::default());
        let mut spec = template.spec.blueprint.pod_template.spec.clone();
        apply(&template, &public(), &mut spec);
        assert_eq!(spec.dns_policy, None);
        let template = self::template();
        let mut spec = template.spec.blueprint.pod_template.spec.clone();
        apply(&template, &DnsMode::Cluster, &mut spec);
        assert_eq!(spec.dns_policy, None);
    }

    #[test]
    fn hardening_can_be_opted_out_by_annotation() {
        let mut template = template();
        template.metadata.annotations = Some(BTreeMap::from([(
            annotations::SKIP_SECURE_DEFAULTS.to_owned(),
            "true".to_owned(),
        )]));
        let mut spec = template.spec.blueprint.pod_template.spec.clone();
        apply(&template, &public(), &mut spec);
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.containers[0].security_context, None);
        assert_eq!(spec.security_context, None);
    }
}
