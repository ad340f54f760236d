//! The `CustomResourceDefinition`s of the four kinds, as `cargo xtask gen-crds` writes them to
//! `deploy/crds/` and as the simulated cluster and the controller's startup check use them.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use kube_core::CustomResourceExt;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};

use crate::{Sandbox, SandboxClaim, SandboxTemplate, SandboxWarmPool};

mod kubernetes;

/// Every CRD we serve, in a fixed order (core group first).
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![
        crd::<Sandbox>(),
        crd::<SandboxTemplate>(),
        crd::<SandboxWarmPool>(),
        crd::<SandboxClaim>(),
    ]
}

/// The CRD of `K` as kube derives it, with the Kubernetes API's markers on the embedded
/// Kubernetes types (see [`kubernetes`]) and in the shape controller-gen gives upstream's.
fn crd<K: CustomResourceExt + JsonSchema>() -> CustomResourceDefinition {
    let mut crd = K::crd();
    let shape = kubernetes::shape_of::<K>();
    crd.spec.names.list_kind = Some(format!("{}List", crd.spec.names.kind));
    for version in &mut crd.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|validation| validation.open_api_v3_schema.as_mut())
        {
            kubernetes::annotate(schema, &shape);
            tidy(schema);
            bound_integers(schema);
            add_root_fields(schema);
        }
    }
    crd
}

/// Declares `apiVersion`, `kind` and `metadata` at the root, as upstream's CRDs do.
fn add_root_fields(schema: &mut JSONSchemaProps) {
    let properties = schema.properties.get_or_insert_default();
    for (name, type_) in [
        ("apiVersion", "string"),
        ("kind", "string"),
        ("metadata", "object"),
    ] {
        properties
            .entry(name.to_owned())
            .or_insert_with(|| JSONSchemaProps {
                type_: Some(type_.to_owned()),
                ..JSONSchemaProps::default()
            });
    }
}

/// Schema of a `[]metav1.Condition` with the validation upstream's CRDs carry for it (the
/// k8s-openapi schema of `Condition` has none).
pub(crate) fn conditions_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "description": "Current conditions, one per type.",
        "items": {
            "type": "object",
            "required": ["lastTransitionTime", "message", "reason", "status", "type"],
            "properties": {
                "lastTransitionTime": {"type": "string", "format": "date-time",
                    "description": "When the status last changed."},
                "message": {"type": "string", "maxLength": 32768,
                    "description": "Human-readable details."},
                "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0,
                    "description": "The .metadata.generation the condition was set for."},
                "reason": {"type": "string", "minLength": 1, "maxLength": 1024,
                    "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
                    "description": "Machine-readable CamelCase reason of the last transition."},
                "status": {"type": "string", "enum": ["True", "False", "Unknown"],
                    "description": "True, False or Unknown."},
                "type": {"type": "string", "maxLength": 316,
                    "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
                    "description": "Condition type in CamelCase or foo.example.com/CamelCase."}
            }
        }
    })
}

/// Brings the derived schema to the shape controller-gen gives upstream's CRDs: no `nullable`
/// (upstream rejects explicit nulls rather than storing them) and no `title`.
fn tidy(schema: &mut JSONSchemaProps) {
    schema.nullable = None;
    schema.title = None;
    for child in schema.properties.iter_mut().flat_map(|p| p.values_mut()) {
        tidy(child);
    }
    if let Some(JSONSchemaPropsOrBool::Schema(child)) = &mut schema.additional_properties {
        tidy(child);
    }
    match &mut schema.items {
        Some(JSONSchemaPropsOrArray::Schema(child)) => tidy(child),
        Some(JSONSchemaPropsOrArray::Schemas(children)) => children.iter_mut().for_each(tidy),
        None => {}
    }
}

/// Gives every `int32` integer its range, keeping tighter bounds the types declare (such as
/// `replicas`' minimum 0).
///
/// The API server does not enforce `format: int32`, only `minimum` and `maximum`; without them it
/// stores `replicas: 2147483648`, which no client with 32-bit fields (ours, upstream's Go types)
/// can decode. `int64` needs no bounds: a larger number is not an integer to the API server.
fn bound_integers(schema: &mut JSONSchemaProps) {
    if schema.type_.as_deref() == Some("integer") && schema.format.as_deref() == Some("int32") {
        let (min, max) = (f64::from(i32::MIN), f64::from(i32::MAX));
        schema.minimum = Some(schema.minimum.map_or(min, |bound| bound.max(min)));
        schema.maximum = Some(schema.maximum.map_or(max, |bound| bound.min(max)));
    }
    for child in schema.properties.iter_mut().flat_map(|p| p.values_mut()) {
        bound_integers(child);
    }
    if let Some(JSONSchemaPropsOrBool::Schema(child)) = &mut schema.additional_properties {
        bound_integers(child);
    }
    match &mut schema.items {
        Some(JSONSchemaPropsOrArray::Schema(child)) => bound_integers(child),
        Some(JSONSchemaPropsOrArray::Schemas(children)) => {
            children.iter_mut().for_each(bound_integers);
        }
        None => {}
    }
}

/// The v1beta1 OpenAPI schema of the CRD named `name` (e.g. `sandboxes.agents.x-k8s.io`).
pub fn schema(name: &str) -> Option<JSONSchemaProps> {
    all()
        .into_iter()
        .find(|crd| crd.metadata.name.as_deref() == Some(name))
        .and_then(|crd| crd.spec.versions.into_iter().next())
        .and_then(|version| version.schema)
        .and_then(|validation| validation.open_api_v3_schema)
}
