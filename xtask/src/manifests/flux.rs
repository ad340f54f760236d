//! The Flux objects `flux/` uses, as strict serde types (unknown fields are errors): the fields
//! of kustomize.toolkit.fluxcd.io/v1 `Kustomization` and source.toolkit.fluxcd.io/v1
//! `GitRepository` / `OCIRepository` that a Flux 2.5+ cluster accepts and we may write. Fields
//! we never use are left out on purpose: using one makes the offline check fail until it is
//! added here, after reading Flux's API reference for it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// API version of Flux Kustomizations.
pub(crate) const KUSTOMIZE_API: &str = "kustomize.toolkit.fluxcd.io/v1";
/// API version of Flux sources.
pub(crate) const SOURCE_API: &str = "source.toolkit.fluxcd.io/v1";

/// A Flux object: type meta, metadata and a kind-specific spec.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Object<S> {
    pub(crate) api_version: String,
    pub(crate) kind: String,
    pub(crate) metadata: ObjectMeta,
    pub(crate) spec: S,
}

/// `Kustomization.spec`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct KustomizationSpec {
    pub(crate) interval: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) retry_interval: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) timeout: Option<String>,
    pub(crate) source_ref: SourceRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) path: Option<String>,
    pub(crate) prune: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) wait: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) depends_on: Vec<DependsOn>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) images: Vec<Image>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) health_check_exprs: Vec<HealthCheckExpr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) target_namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) suspend: Option<bool>,
}

/// `Kustomization.spec.sourceRef`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct SourceRef {
    pub(crate) kind: String,
    pub(crate) name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) namespace: Option<String>,
}

/// `Kustomization.spec.dependsOn[]`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DependsOn {
    pub(crate) name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) namespace: Option<String>,
}

/// `Kustomization.spec.images[]`: kustomize's image transformer.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Image {
    pub(crate) name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) new_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) new_tag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) digest: Option<String>,
}

/// `Kustomization.spec.healthCheckExprs[]` (CEL).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct HealthCheckExpr {
    pub(crate) api_version: String,
    pub(crate) kind: String,
    pub(crate) current: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) in_progress: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) failed: Option<String>,
}

/// `GitRepository.spec`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct GitRepositorySpec {
    pub(crate) url: String,
    pub(crate) interval: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) r#ref: Option<GitRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) ignore: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) timeout: Option<String>,
}

/// `GitRepository.spec.ref`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GitRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) branch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) semver: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) commit: Option<String>,
}

/// `OCIRepository.spec`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct OciRepositorySpec {
    pub(crate) url: String,
    pub(crate) interval: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) r#ref: Option<OciRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) insecure: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) timeout: Option<String>,
}

/// `OCIRepository.spec.ref`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct OciRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) semver: Option<String>,
}

/// A Flux Kustomization.
pub(crate) type Kustomization = Object<KustomizationSpec>;

/// API version of Flux HelmReleases.
pub(crate) const HELM_API: &str = "helm.toolkit.fluxcd.io/v2";

/// `HelmRelease.spec` (helm.toolkit.fluxcd.io/v2), the fields `flux/release-helm` writes.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct HelmReleaseSpec {
    pub(crate) interval: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) release_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) target_namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) storage_namespace: Option<String>,
    pub(crate) chart: HelmChartTemplate,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) install: Option<HelmInstall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) upgrade: Option<HelmInstall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) values: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) depends_on: Vec<DependsOn>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) suspend: Option<bool>,
}

/// `HelmRelease.spec.chart`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HelmChartTemplate {
    pub(crate) spec: HelmChartSpec,
}

/// `HelmRelease.spec.chart.spec`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct HelmChartSpec {
    /// A path in a GitRepository (or a chart name in a HelmRepository).
    pub(crate) chart: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reconcile_strategy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) interval: Option<String>,
    pub(crate) source_ref: SourceRef,
}

/// `HelmRelease.spec.install` and `.upgrade` (the fields both have that we use).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct HelmInstall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) create_namespace: Option<bool>,
    /// `Skip`, `Create` or (upgrade) `CreateReplace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) crds: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) remediation: Option<HelmRemediation>,
}

/// `HelmRelease.spec.install.remediation`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HelmRemediation {
    pub(crate) retries: i64,
}

/// A Flux HelmRelease.
pub(crate) type HelmRelease = Object<HelmReleaseSpec>;
