//! What an API server does to a custom object with a structural OpenAPI schema: apply defaults,
//! find unknown fields, validate types, required fields, enums, bounds and formats, and the
//! uniqueness `x-kubernetes-list-type: map` and `set` promise (by the list's map keys).
//!
//! Used by the compatibility tests (our generated schemas must reject a typo such as
//! `imagePullPolicyy` and carry upstream's defaults) and by the simulated cluster, which applies
//! registered CRDs' schemas to every create and update like a real API server. CEL rules
//! (`x-kubernetes-validations`) are not evaluated here.

use std::fmt;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use serde_json::Value;

/// Top-level fields every object may carry whatever its schema says.
const ROOT_FIELDS: [&str; 3] = ["apiVersion", "kind", "metadata"];

/// One problem with an object, with the Kubernetes-style path of the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Path such as `spec.podTemplate.spec.containers[0].image`.
    pub path: String,
    /// What is wrong.
    pub kind: FieldErrorKind,
}

/// Kinds of [`FieldError`], mirroring the API server's `FieldValueInvalid` family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// The schema does not know the field (rejected under strict field validation, dropped
    /// otherwise).
    Unknown,
    /// A required field is missing.
    Required,
    /// The value has the wrong JSON type.
    Type {
        /// The schema's type.
        expected: String,
    },
    /// The value is not one of the allowed values.
    NotSupported {
        /// The allowed values, as JSON.
        allowed: Vec<String>,
    },
    /// A number is below the minimum.
    Minimum(String),
    /// A number is above the maximum.
    Maximum(String),
    /// A string does not have the schema's format.
    Format(String),
    /// A second item of a `map` list with the same keys, or of a `set` list with the same value
    /// (the JSON of the keys or the value).
    Duplicate(String),
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = &self.path;
        match &self.kind {
            FieldErrorKind::Unknown => write!(f, "unknown field \"{path}\""),
            FieldErrorKind::Required => write!(f, "{path}: Required value"),
            FieldErrorKind::Type { expected } => {
                write!(f, "{path}: Invalid value: must be of type {expected}")
            }
            FieldErrorKind::NotSupported { allowed } => {
                write!(
                    f,
                    "{path}: Unsupported value: supported values: {}",
                    allowed.join(", ")
                )
            }
            FieldErrorKind::Minimum(min) => {
                write!(
                    f,
                    "{path}: Invalid value: should be greater than or equal to {min}"
                )
            }
            FieldErrorKind::Maximum(max) => {
                write!(
                    f,
                    "{path}: Invalid value: should be less than or equal to {max}"
                )
            }
            FieldErrorKind::Format(format) => {
                write!(f, "{path}: Invalid value: must be a {format}")
            }
            FieldErrorKind::Duplicate(value) => write!(f, "{path}: Duplicate value: {value}"),
        }
    }
}

/// Sets every absent field that has a schema default, recursively (also inside defaults), like
/// the API server does on create, update and read.
pub fn apply_defaults(schema: &JSONSchemaProps, value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(properties) = &schema.properties {
                for (name, property) in properties {
                    if !map.contains_key(name)
                        && let Some(default) = &property.default
                    {
                        map.insert(name.clone(), default.0.clone());
                    }
                    if let Some(child) = map.get_mut(name) {
                        apply_defaults(property, child);
                    }
                }
            }
            if let Some(JSONSchemaPropsOrBool::Schema(values)) = &schema.additional_properties {
                for child in map.values_mut() {
                    apply_defaults(values, child);
                }
            }
        }
        Value::Array(items) => {
            if let Some(JSONSchemaPropsOrArray::Schema(item)) = &schema.items {
                for child in items {
                    apply_defaults(item, child);
                }
            }
        }
        _ => {}
    }
}

/// Removes fields the schema does not know (the API server's pruning), except the root
/// `apiVersion`, `kind` and `metadata`.
pub fn prune(schema: &JSONSchemaProps, value: &mut Value) {
    prune_at(schema, value, true);
}

fn prune_at(schema: &JSONSchemaProps, value: &mut Value, root: bool) {
    if schema.x_kubernetes_preserve_unknown_fields == Some(true) && schema.properties.is_none() {
        return;
    }
    match value {
        Value::Object(map) => {
            if let Some(JSONSchemaPropsOrBool::Schema(values)) = &schema.additional_properties {
                for child in map.values_mut() {
                    prune_at(values, child, false);
                }
                return;
            }
            let preserve = schema.x_kubernetes_preserve_unknown_fields == Some(true);
            map.retain(|name, _| {
                preserve
                    || (root && ROOT_FIELDS.contains(&name.as_str()))
                    || schema
                        .properties
                        .as_ref()
                        .is_some_and(|p| p.contains_key(name))
            });
            if let Some(properties) = &schema.properties {
                for (name, child) in map.iter_mut() {
                    if root && ROOT_FIELDS.contains(&name.as_str()) {
                        continue;
                    }
                    if let Some(property) = properties.get(name) {
                        prune_at(property, child, false);
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(JSONSchemaPropsOrArray::Schema(item)) = &schema.items {
                for child in items {
                    prune_at(item, child, false);
                }
            }
        }
        _ => {}
    }
}

/// Every problem with `value` under `schema`: unknown fields, missing required fields, wrong
/// types, unsupported enum values, out-of-range numbers and malformed `date-time` strings.
pub fn validate(schema: &JSONSchemaProps, value: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    validate_at(schema, value, "", true, &mut errors);
    errors
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

fn validate_at(
    schema: &JSONSchemaProps,
    value: &Value,
    path: &str,
    root: bool,
    errors: &mut Vec<FieldError>,
) {
    let error = |kind| FieldError {
        path: if path.is_empty() {
            "<root>".to_owned()
        } else {
            path.to_owned()
        },
        kind,
    };
    if value.is_null() {
        if schema.nullable != Some(true) {
            let expected = schema.type_.clone().unwrap_or_else(|| "object".to_owned());
            errors.push(error(FieldErrorKind::Type { expected }));
        }
        return;
    }
    if !type_matches(schema, value) {
        let expected = schema.type_.clone().unwrap_or_default();
        errors.push(error(FieldErrorKind::Type { expected }));
        return;
    }
    if let Some(allowed) = &schema.enum_
        && !allowed.iter().any(|candidate| &candidate.0 == value)
    {
        let allowed = allowed
            .iter()
            .map(|candidate| candidate.0.to_string())
            .collect();
        errors.push(error(FieldErrorKind::NotSupported { allowed }));
    }
    if let Some(number) = value.as_f64() {
        if let Some(min) = schema.minimum
            && number < min
        {
            errors.push(error(FieldErrorKind::Minimum(format_bound(min))));
        }
        if let Some(max) = schema.maximum
            && number > max
        {
            errors.push(error(FieldErrorKind::Maximum(format_bound(max))));
        }
    }
    if let (Some("date-time"), Some(text)) = (schema.format.as_deref(), value.as_str())
        && crate::time::parse(text).is_none()
    {
        errors.push(error(FieldErrorKind::Format("date-time".to_owned())));
    }
    match value {
        Value::Object(map) => {
            for name in schema.required.iter().flatten() {
                if !map.contains_key(name) {
                    errors.push(FieldError {
                        path: join(path, name),
                        kind: FieldErrorKind::Required,
                    });
                }
            }
            let preserve = schema.x_kubernetes_preserve_unknown_fields == Some(true);
            for (name, child) in map {
                if root && ROOT_FIELDS.contains(&name.as_str()) {
                    // Checked by the API server as ObjectMeta/TypeMeta, not by the CRD schema.
                    continue;
                }
                let child_path = join(path, name);
                if let Some(property) = schema.properties.as_ref().and_then(|p| p.get(name)) {
                    validate_at(property, child, &child_path, false, errors);
                } else if let Some(JSONSchemaPropsOrBool::Schema(values)) =
                    &schema.additional_properties
                {
                    validate_at(values, child, &child_path, false, errors);
                } else if !(preserve
                    || matches!(
                        schema.additional_properties,
                        Some(JSONSchemaPropsOrBool::Bool(true))
                    ))
                {
                    errors.push(FieldError {
                        path: child_path,
                        kind: FieldErrorKind::Unknown,
                    });
                }
            }
        }
        Value::Array(items) => {
            if let Some(JSONSchemaPropsOrArray::Schema(item)) = &schema.items {
                for (index, child) in items.iter().enumerate() {
                    validate_at(item, child, &format!("{path}[{index}]"), false, errors);
                }
            }
            duplicates(schema, items, path, errors);
        }
        _ => {}
    }
}

/// Items of a `map` list whose keys an earlier item has, or of a `set` list equal to an earlier
/// one: what server-side apply could not tell apart, refused as the API server does.
fn duplicates(schema: &JSONSchemaProps, items: &[Value], path: &str, errors: &mut Vec<FieldError>) {
    let identity = |item: &Value| match schema.x_kubernetes_list_type.as_deref() {
        Some("set") => Some(item.clone()),
        Some("map") => schema.x_kubernetes_list_map_keys.as_ref().map(|keys| {
            Value::Object(
                keys.iter()
                    .filter_map(|key| item.get(key).map(|value| (key.clone(), value.clone())))
                    .collect(),
            )
        }),
        _ => None,
    };
    let mut seen: Vec<Value> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let Some(identity) = identity(item) else {
            return;
        };
        if seen.contains(&identity) {
            errors.push(FieldError {
                path: format!("{path}[{index}]"),
                kind: FieldErrorKind::Duplicate(identity.to_string()),
            });
        } else {
            seen.push(identity);
        }
    }
}

/// Whether `value` has the schema's type. An integer is what the API server decodes as one: a
/// number beyond int64 is read as a float there, and refused as "must be of type integer".
fn type_matches(schema: &JSONSchemaProps, value: &Value) -> bool {
    if schema.x_kubernetes_int_or_string == Some(true) {
        return value.is_string() || value.is_i64();
    }
    match schema.type_.as_deref() {
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        _ => true,
    }
}

fn format_bound(bound: f64) -> String {
    if bound.fract() == 0.0 {
        format!("{bound:.0}")
    } else {
        bound.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema(value: Value) -> JSONSchemaProps {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn defaults_fill_absent_fields_only() {
        let schema = schema(json!({
            "type": "object",
            "properties": {
                "spec": {"type": "object", "properties": {
                    "mode": {"type": "string", "default": "Running"},
                    "count": {"type": "integer", "default": 1},
                    "inner": {"type": "object", "properties": {"x": {"type": "string", "default": "d"}}},
                    "list": {"type": "array", "items": {"type": "object", "properties": {
                        "p": {"type": "string", "default": "q"}}}}
                }}
            }
        }));
        let mut value = json!({"spec": {"count": 3, "inner": {}, "list": [{}, {"p": "r"}]}});
        apply_defaults(&schema, &mut value);
        assert_eq!(
            value,
            json!({"spec": {"mode": "Running", "count": 3, "inner": {"x": "d"},
                            "list": [{"p": "q"}, {"p": "r"}]}})
        );
    }

    #[test]
    fn validation_reports_each_kind_of_problem() {
        let schema = schema(json!({
            "type": "object",
            "required": ["spec"],
            "properties": {"spec": {"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string"},
                "mode": {"type": "string", "enum": ["A", "B"]},
                "n": {"type": "integer", "minimum": 0.0},
                "when": {"type": "string", "format": "date-time"},
                "port": {"x-kubernetes-int-or-string": true},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}}
            }}}
        }));
        let value = json!({
            "apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n"},
            "spec": {"mode": "C", "n": -1, "when": "yesterday", "port": "http",
                     "labels": {"a": "b", "c": 1}, "extra": true}
        });
        let mut found: Vec<String> = validate(&schema, &value)
            .iter()
            .map(ToString::to_string)
            .collect();
        found.sort();
        assert_eq!(
            found,
            vec![
                "spec.labels.c: Invalid value: must be of type string",
                "spec.mode: Unsupported value: supported values: \"A\", \"B\"",
                "spec.n: Invalid value: should be greater than or equal to 0",
                "spec.name: Required value",
                "spec.when: Invalid value: must be a date-time",
                "unknown field \"spec.extra\"",
            ]
        );
    }

    /// Whether `text` passes a `format: date-time` field.
    fn date_time_accepted(text: &str) -> bool {
        let schema = schema(json!({"type": "object", "properties": {
            "when": {"type": "string", "format": "date-time"}}}));
        validate(&schema, &json!({ "when": text })).is_empty()
    }

    #[test]
    fn date_times_are_rfc_3339_as_the_api_server_checks_them() {
        for good in [
            "2026-01-01T00:00:00Z",
            // The far future (a TTL of "forever") and the first year RFC 3339 has.
            "9999-12-31T23:59:59Z",
            "9999-12-31T23:59:59.999999999-23:59",
            "0000-01-01T00:00:00Z",
            "0000-01-01T00:00:00+23:59",
            // Leap days: every 4 years, not every 100, but every 400.
            "2024-02-29T12:00:00Z",
            "2000-02-29T12:00:00Z",
            "2026-04-30T23:59:59Z",
            "2026-06-30T23:59:59.5Z",
            "2026-06-30T23:59:59.123456789Z",
            // RFC 3339 §5.6 allows lower-case `t` and `z`; so does the API server.
            "2026-06-30t23:59:59z",
            "2026-06-30T23:59:59+23:59",
            "2026-06-30T23:59:59-23:59",
            "2026-06-30T23:59:59+00:00",
            "2026-06-30T23:59:59-00:00",
            "2026-06-30T08:15:00.25+05:30",
        ] {
            assert!(date_time_accepted(good), "{good} is a date-time");
        }
        for bad in [
            "",
            "yesterday",
            "2026-01-01",
            "2026-01-01T00:00:00",
            "2026-01-01T00:00Z",
            "2026-01-01 00:00:00Z",
            "2026-01-01T00:00:00 Z",
            "2026-13-01T00:00:00Z",
            "2026-00-01T00:00:00Z",
            "2026-01-00T00:00:00Z",
            "2026-01-32T00:00:00Z",
            "2026-04-31T00:00:00Z",
            "2026-02-29T00:00:00Z",
            "1900-02-29T00:00:00Z",
            "2026-01-01T24:00:00Z",
            "2026-01-01T23:60:00Z",
            // The API server's pattern stops seconds at 59: no leap second.
            "2016-12-31T23:59:60Z",
            // Offsets are -23:59 to +23:59.
            "2026-01-01T00:00:00+25:00",
            "2026-01-01T00:00:00+24:00",
            "2026-01-01T00:00:00-24:00",
            "2026-01-01T00:00:00+23:60",
            "2026-01-01T00:00:00+0100",
            "2026-01-01T00:00:00+01",
            "2026-01-01T00:00:00.Z",
            "2026-01-01T00:00:00,5Z",
            "2026-01-01T00:00:00x5Z",
            "10000-01-01T00:00:00Z",
            "-0001-01-01T00:00:00Z",
            "+002026-01-01T00:00:00Z",
            "2026-1-01T00:00:00Z",
            "2026-01-01T0:00:00Z",
            "2026-01-01T00:00:00Zt",
            "2026-01-01T00:00:00Z[UTC]",
            "2026-01-01T00:00:00Z ",
            " 2026-01-01T00:00:00Z",
            "\u{0662}026-01-01T00:00:00Z",
        ] {
            assert!(!date_time_accepted(bad), "{bad:?} is not a date-time");
        }
    }

    #[test]
    fn date_times_and_integers_are_checked_as_the_api_server_checks_them() {
        let schema = schema(json!({
            "type": "object",
            "properties": {
                "when": {"type": "string", "format": "date-time"},
                "n": {"type": "integer", "format": "int64"}
            }
        }));
        let problems = |value: Value| -> Vec<String> {
            validate(&schema, &value)
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        assert!(problems(json!({"when": "9999-12-31T23:59:59Z"})).is_empty());
        assert!(problems(json!({"n": i64::MAX})).is_empty());
        assert_eq!(
            problems(json!({"when": "2026-01-01T00:00:00+25:00"})),
            vec!["when: Invalid value: must be a date-time"]
        );
        assert_eq!(
            problems(json!({"n": 9_223_372_036_854_775_808_u64})),
            vec!["n: Invalid value: must be of type integer"]
        );
    }

    #[test]
    fn map_and_set_lists_refuse_duplicates() {
        let schema = schema(json!({
            "type": "object",
            "properties": {
                "containers": {"type": "array", "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "items": {"type": "object", "properties": {
                        "name": {"type": "string"},
                        "ports": {"type": "array", "x-kubernetes-list-type": "map",
                            "x-kubernetes-list-map-keys": ["containerPort", "protocol"],
                            "items": {"type": "object", "properties": {
                                "containerPort": {"type": "integer"},
                                "protocol": {"type": "string"}}}}}}},
                "options": {"type": "array", "x-kubernetes-list-type": "set",
                    "items": {"type": "string"}},
                "args": {"type": "array", "x-kubernetes-list-type": "atomic",
                    "items": {"type": "string"}}
            }
        }));
        let value = json!({
            "containers": [
                {"name": "a", "ports": [
                    {"containerPort": 80, "protocol": "TCP"},
                    {"containerPort": 80, "protocol": "UDP"},
                    {"containerPort": 80, "protocol": "TCP"}]},
                {"name": "b"},
                {"name": "a"}],
            "options": ["ro", "rw", "ro"],
            "args": ["x", "x"]
        });
        let found: Vec<String> = validate(&schema, &value)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            found,
            vec![
                "containers[0].ports[2]: Duplicate value: {\"containerPort\":80,\"protocol\":\"TCP\"}",
                "containers[2]: Duplicate value: {\"name\":\"a\"}",
                "options[2]: Duplicate value: \"ro\"",
            ]
        );
    }

    #[test]
    fn pruning_keeps_root_metadata_and_preserved_subtrees() {
        let schema = schema(json!({
            "type": "object",
            "properties": {
                "spec": {"type": "object", "properties": {"a": {"type": "string"}}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
            }
        }));
        let mut value = json!({"kind": "K", "metadata": {}, "spec": {"a": "x", "b": "y"},
                               "free": {"anything": 1}, "junk": 2});
        prune(&schema, &mut value);
        assert_eq!(
            value,
            json!({"kind": "K", "metadata": {}, "spec": {"a": "x"}, "free": {"anything": 1}})
        );
    }
}
