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
