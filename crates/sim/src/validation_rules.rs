//! The CEL validation rules of CRD schemas (`x-kubernetes-validations`), checked on every write
//! of a custom resource as the API server checks them (sans IO; CEL by the `cel` crate).
//!
//! Each rule sees the value at its schema node as `self`. A rule that mentions `oldSelf` is a
//! transition rule: it runs only on updates, where the node had a value before (correlated
//! through object properties, map keys and the keys of `map`-type lists), with that value as
//! `oldSelf`. On updates, a node whose value did not change is not checked again (the API
//! server's validation ratcheting), so rules on `spec` do not fail status writes. A failure is
//! reported at the node's path (plus the rule's `fieldPath`) in the API server's words:
//! `Invalid value: "<schema type>": <message>`, `Forbidden: <message>` or `Required value:
//! <message>` per the rule's `reason`, where the message is the rule's `messageExpression`, its
//! `message`, or `failed rule: <rule>`.

use cel::{Context, Program};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool, ValidationRule,
};
use serde_json::Value;

use crate::api_error::Cause;

/// The rule failures of `new` (and, on updates, its transition from `old`) under `schema`.
pub(crate) fn check(schema: &JSONSchemaProps, new: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    walk(schema, new, old, "", &mut causes);
    causes
}

fn child_path(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_owned()
    } else {
        format!("{path}.{field}")
    }
}

fn walk(
    schema: &JSONSchemaProps,
    value: &Value,
    old: Option<&Value>,
    path: &str,
    causes: &mut Vec<Cause>,
) {
    if value.is_null() || old == Some(value) {
        return;
    }
    for rule in schema.x_kubernetes_validations.iter().flatten() {
        if let Some(cause) = evaluate(schema, rule, value, old, path) {
            causes.push(cause);
        }
    }
    match value {
        Value::Object(map) => {
            let properties = schema.properties.as_ref();
            let values = match &schema.additional_properties {
                Some(JSONSchemaPropsOrBool::Schema(values)) => Some(values.as_ref()),
                _ => None,
            };
            for (key, child) in map {
                let Some(child_schema) = properties.and_then(|p| p.get(key)).or(values) else {
                    continue;
                };
                let old_child = old.and_then(|o| o.get(key));
                walk(
                    child_schema,
                    child,
                    old_child,
                    &child_path(path, key),
                    causes,
                );
            }
        }
        Value::Array(items) => {
            let Some(JSONSchemaPropsOrArray::Schema(item_schema)) = &schema.items else {
                return;
            };
            let keys = (schema.x_kubernetes_list_type.as_deref() == Some("map")).then(|| {
                schema
                    .x_kubernetes_list_map_keys
                    .clone()
                    .unwrap_or_default()
            });
            let old_items = old.and_then(Value::as_array);
            for (index, item) in items.iter().enumerate() {
                // Only map-type lists correlate an item with its old self (by its keys).
                let old_item = keys.as_ref().and_then(|keys| {
                    old_items?.iter().find(|candidate| {
                        keys.iter().all(|key| candidate.get(key) == item.get(key))
                    })
                });
                walk(
                    item_schema,
                    item,
                    old_item,
                    &format!("{path}[{index}]"),
                    causes,
                );
            }
        }
        _ => {}
    }
}

/// Whether a rule mentions the identifier `oldSelf` (outside string literals).
fn mentions_old_self(rule: &str) -> bool {
    let mut quote: Option<char> = None;
    let mut previous = ' ';
    let chars: Vec<char> = rule.chars().collect();
    for (index, &c) in chars.iter().enumerate() {
        match quote {
            Some(q) => {
                if c == q && previous != '\\' {
                    quote = None;
                }
            }
            None if c == '"' || c == '\'' => quote = Some(c),
            None => {
                let starts = !(previous.is_alphanumeric() || previous == '_');
                let rest: String = chars[index..].iter().take(8).collect();
                let after = chars.get(index + 7).copied().unwrap_or(' ');
                if starts
                    && rest.starts_with("oldSelf")
                    && !(after.is_alphanumeric() || after == '_')
                {
                    return true;
                }
            }
        }
        previous = c;
    }
    false
}

fn run(source: &str, value: &Value, old: Option<&Value>) -> Result<cel::Value, String> {
    let program = Program::compile(source).map_err(|error| error.to_string())?;
    let mut context = Context::default();
    context.add_variable_from_value("self", cel::to_value(value).map_err(|e| e.to_string())?);
    if let Some(old) = old {
        context.add_variable_from_value("oldSelf", cel::to_value(old).map_err(|e| e.to_string())?);
    }
    program.execute(&context).map_err(|error| error.to_string())
}

/// The failure of `rule` at `path`, if it fails.
fn evaluate(
    schema: &JSONSchemaProps,
    rule: &ValidationRule,
    value: &Value,
    old: Option<&Value>,
    path: &str,
) -> Option<Cause> {
    if mentions_old_self(&rule.rule) && old.is_none() {
        return None;
    }
    let message = match run(&rule.rule, value, old) {
        Ok(cel::Value::Bool(true)) => return None,
        Ok(cel::Value::Bool(false)) => rule
            .message_expression
            .as_deref()
            .and_then(|expression| match run(expression, value, old) {
                Ok(cel::Value::String(text)) if !text.trim().is_empty() => Some(text.to_string()),
                _ => None,
            })
            .or_else(|| rule.message.clone().filter(|m| !m.is_empty()))
            .unwrap_or_else(|| format!("failed rule: {}", rule.rule)),
        Ok(other) => format!(
            "rule evaluated to {other:?}, not a boolean, evaluating rule: {}",
            rule.rule
        ),
        Err(error) => format!("{error} evaluating rule: {}", rule.rule),
    };
    let field = match rule.field_path.as_deref().filter(|p| !p.is_empty()) {
        Some(relative) => format!("{path}{relative}")
            .trim_start_matches('.')
            .to_owned(),
        None => path.to_owned(),
    };
    let type_ = schema.type_.as_deref().unwrap_or_default();
    let (reason, message) = match rule.reason.as_deref() {
        Some("FieldValueForbidden") => ("FieldValueForbidden", format!("Forbidden: {message}")),
        Some("FieldValueRequired") => ("FieldValueRequired", format!("Required value: {message}")),
        Some("FieldValueDuplicate") => (
            "FieldValueDuplicate",
            format!("Duplicate value: \"{message}\""),
        ),
        _ => (
            "FieldValueInvalid",
            format!("Invalid value: \"{type_}\": {message}"),
        ),
    };
    Some(Cause {
        reason,
        message,
        field,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn schema(value: Value) -> JSONSchemaProps {
        serde_json::from_value(value).unwrap()
    }

    /// The shape of upstream's rule: a list that may not change.
    fn immutable_list() -> JSONSchemaProps {
        schema(json!({
            "type": "object",
            "properties": {"spec": {
                "type": "object",
                "properties": {"claims": {"type": "array", "items": {"type": "string"}},
                               "replicas": {"type": "integer"}},
                "x-kubernetes-validations": [{
                    "rule": "has(self.claims) == has(oldSelf.claims) && (!has(self.claims) || self.claims == oldSelf.claims)",
                    "message": "claims is immutable"}]
            }}
        }))
    }

    #[test]
    fn transition_rules_run_on_updates_only() {
        let schema = immutable_list();
        let created = json!({"spec": {"claims": ["a"]}});
        assert_eq!(check(&schema, &created, None), vec![]);
        let scaled = json!({"spec": {"claims": ["a"], "replicas": 2}});
        assert_eq!(check(&schema, &scaled, Some(&created)), vec![]);
        let changed = json!({"spec": {"claims": ["b"]}});
        assert_eq!(
            check(&schema, &changed, Some(&created)),
            vec![Cause {
                reason: "FieldValueInvalid",
                message: "Invalid value: \"object\": claims is immutable".into(),
                field: "spec".into(),
            }]
        );
        let removed = json!({"spec": {}});
        assert_eq!(check(&schema, &removed, Some(&created)).len(), 1);
    }

    #[test]
    fn rules_see_self_report_reasons_field_paths_and_message_expressions() {
        let schema = schema(json!({
            "type": "object",
            "properties": {"spec": {
                "type": "object",
                "properties": {
                    "min": {"type": "integer"}, "max": {"type": "integer"},
                    "name": {"type": "string",
                             "x-kubernetes-validations": [{"rule": "self.startsWith('x-')"}]},
                    "items": {"type": "array", "x-kubernetes-list-type": "map",
                              "x-kubernetes-list-map-keys": ["id"],
                              "items": {"type": "object",
                                        "properties": {"id": {"type": "string"}, "v": {"type": "integer"}},
                                        "x-kubernetes-validations": [{
                                            "rule": "self.v >= oldSelf.v", "message": "v may only grow"}]}}
                },
                "x-kubernetes-validations": [
                    {"rule": "self.min <= self.max", "fieldPath": ".min", "reason": "FieldValueForbidden",
                     "messageExpression": "'min ' + string(self.min) + ' exceeds max'"}
                ]
            }}
        }));
        let object = json!({"spec": {"min": 3, "max": 2, "name": "y"}});
        assert_eq!(
            check(&schema, &object, None),
            vec![
                Cause {
                    reason: "FieldValueForbidden",
                    message: "Forbidden: min 3 exceeds max".into(),
                    field: "spec.min".into(),
                },
                Cause {
                    reason: "FieldValueInvalid",
                    message: "Invalid value: \"string\": failed rule: self.startsWith('x-')".into(),
                    field: "spec.name".into(),
                },
            ]
        );
        let old = json!({"spec": {"min": 1, "max": 2, "items": [{"id": "a", "v": 5}, {"id": "b", "v": 1}]}});
        let new = json!({"spec": {"min": 1, "max": 2, "items": [{"id": "b", "v": 0}, {"id": "c", "v": 0}, {"id": "a", "v": 6}]}});
        assert_eq!(
            check(&schema, &new, Some(&old)),
            vec![Cause {
                reason: "FieldValueInvalid",
                message: "Invalid value: \"object\": v may only grow".into(),
                field: "spec.items[0]".into(),
            }]
        );
    }

    #[test]
    fn unchanged_values_are_not_checked_again() {
        let schema = schema(json!({
            "type": "object",
            "properties": {"spec": {"type": "object",
                                    "x-kubernetes-validations": [{"rule": "false", "message": "never"}]},
                           "status": {"type": "object"}}
        }));
        let old = json!({"spec": {"a": 1}});
        let status_write = json!({"spec": {"a": 1}, "status": {"ready": true}});
        assert_eq!(check(&schema, &status_write, Some(&old)), vec![]);
        assert_eq!(check(&schema, &old, None).len(), 1);
    }

    #[test]
    fn old_self_is_found_outside_strings_only() {
        assert!(mentions_old_self("self == oldSelf"));
        assert!(mentions_old_self("oldSelf.x == 1"));
        assert!(!mentions_old_self("self.oldSelfish == 1"));
        assert!(!mentions_old_self("self.name == 'oldSelf'"));
    }
}
