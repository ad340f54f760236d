//! Patch application (sans IO): JSON merge patch (RFC 7386), JSON patch (RFC 6902) and an
//! approximation of strategic merge patch that merges lists by the keys of [`ListType`].

use serde_json::{Map, Value};

use crate::resources::ListType;

/// RFC 7386: objects merge recursively, `null` deletes, everything else replaces.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

/// RFC 6902. A `test` of `null` against a missing path passes, as with the API server's
/// implementation (kube-runtime's finalizer helper relies on it).
pub(crate) fn json_patch(target: &mut Value, patch: &Value) -> Result<(), String> {
    let mut operations = patch
        .as_array()
        .ok_or("a JSON patch must be a list of operations")?
        .clone();
    operations.retain(|operation| {
        let is_null_test = operation.get("op").and_then(Value::as_str) == Some("test")
            && operation.get("value").is_none_or(Value::is_null);
        let missing = operation
            .get("path")
            .and_then(Value::as_str)
            .is_some_and(|path| target.pointer(path).is_none());
        !(is_null_test && missing)
    });
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(operations))
        .map_err(|error| format!("invalid JSON patch: {error}"))?;
    json_patch::patch(target, &patch).map_err(|error| error.to_string())
}

const DIRECTIVE: &str = "$patch";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";
const DELETE_FROM_PRIMITIVE: &str = "$deleteFromPrimitiveList/";
const RETAIN_KEYS: &str = "$retainKeys";

/// Strategic merge patch, approximated: maps merge like a merge patch, lists merge by the keys
/// `list_type` gives for their path (field names from the root), scalar sets union, and the
/// `$patch: replace|delete`, `$deleteFromPrimitiveList/` and `$retainKeys` directives apply.
/// `$setElementOrder/` directives are accepted and ignored.
pub(crate) fn strategic_merge(
    target: &mut Value,
    patch: &Value,
    list_type: &dyn Fn(&[String]) -> ListType,
) {
    let mut path = Vec::new();
    merge_value(target, patch, &mut path, list_type);
}

fn merge_value(
    target: &mut Value,
    patch: &Value,
    path: &mut Vec<String>,
    list_type: &dyn Fn(&[String]) -> ListType,
) {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return;
    };
    // `$patch: delete` on a map is handled by the parent, which removes the key.
    if patch_map.get(DIRECTIVE).and_then(Value::as_str) == Some("replace") {
        let mut replacement = patch_map.clone();
        replacement.remove(DIRECTIVE);
        *target = Value::Object(replacement);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(target_map) = target else {
        return;
    };
    if let Some(Value::Array(keep)) = patch_map.get(RETAIN_KEYS) {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        target_map.retain(|key, _| keep.contains(&key.as_str()));
    }
    for (key, value) in patch_map {
        if key == DIRECTIVE || key == RETAIN_KEYS || key.starts_with(SET_ELEMENT_ORDER) {
            continue;
        }
        if let Some(field) = key.strip_prefix(DELETE_FROM_PRIMITIVE) {
            if let (Some(Value::Array(items)), Value::Array(remove)) =
                (target_map.get_mut(field), value)
            {
                items.retain(|item| !remove.contains(item));
            }
            continue;
        }
        if value.is_null() || value.get(DIRECTIVE).and_then(Value::as_str) == Some("delete") {
            target_map.remove(key);
            continue;
        }
        path.push(key.clone());
        match value {
            Value::Array(patch_items) => {
                let merged = match target_map.remove(key) {
                    Some(Value::Array(existing)) => {
                        merge_list(existing, patch_items, &list_type(path), path, list_type)
                    }
                    _ => strip_list_directives(patch_items),
                };
                target_map.insert(key.clone(), Value::Array(merged));
            }
            Value::Object(_) => {
                let entry = target_map.entry(key.clone()).or_insert(Value::Null);
                merge_value(entry, value, path, list_type);
            }
            _ => {
                target_map.insert(key.clone(), value.clone());
            }
        }
        path.pop();
    }
}

fn strip_list_directives(items: &[Value]) -> Vec<Value> {
    items
        .iter()
        .filter(|item| item.get(DIRECTIVE).is_none())
        .cloned()
        .collect()
}

fn key_matches(a: &Value, b: &Value, keys: &[String]) -> bool {
    keys.iter().any(|key| a.get(key).is_some())
        && keys.iter().all(|key| {
            let left = a.get(key);
            let right = b.get(key);
            // A missing protocol means TCP on both sides; other missing keys must both be missing.
            left == right
                || (key == "protocol"
                    && left.is_none_or(|v| v == "TCP")
                    && right.is_none_or(|v| v == "TCP"))
        })
}

fn merge_list(
    mut existing: Vec<Value>,
    patch_items: &[Value],
    kind: &ListType,
    path: &mut Vec<String>,
    list_type: &dyn Fn(&[String]) -> ListType,
) -> Vec<Value> {
    if patch_items
        .iter()
        .any(|item| item.get(DIRECTIVE).and_then(Value::as_str) == Some("replace"))
    {
        return strip_list_directives(patch_items);
    }
    match kind {
        ListType::Atomic => strip_list_directives(patch_items),
        ListType::Set => {
            for item in patch_items {
                if !existing.contains(item) {
                    existing.push(item.clone());
                }
            }
            existing
        }
        ListType::Map(keys) => {
            for item in patch_items {
                let position = existing
                    .iter()
                    .position(|candidate| key_matches(candidate, item, keys));
                let delete = item.get(DIRECTIVE).and_then(Value::as_str) == Some("delete");
                match (position, delete) {
                    (Some(index), true) => {
                        existing.remove(index);
                    }
                    (None, true) => {}
                    (Some(index), false) => {
                        if let Some(slot) = existing.get_mut(index) {
                            merge_value(slot, item, path, list_type);
                        }
                    }
                    (None, false) => existing.push(item.clone()),
                }
            }
            existing
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn pod_lists(path: &[String]) -> ListType {
        match path.last().map(String::as_str) {
            Some("containers") => ListType::Map(vec!["name".into()]),
            Some("finalizers") => ListType::Set,
            _ => ListType::Atomic,
        }
    }

    #[test]
    fn merge_patch_deletes_with_null() {
        let mut target = json!({"a": 1, "b": {"c": 2, "d": 3}, "l": [1, 2]});
        merge_patch(&mut target, &json!({"a": null, "b": {"c": 5}, "l": [3]}));
        assert_eq!(target, json!({"b": {"c": 5, "d": 3}, "l": [3]}));
    }

    #[test]
    fn json_patch_applies_and_null_test_passes_on_missing_path() {
        let mut target = json!({"metadata": {"name": "x"}});
        json_patch(
            &mut target,
            &json!([
                {"op": "test", "path": "/metadata/finalizers", "value": null},
                {"op": "add", "path": "/metadata/finalizers", "value": ["f"]}
            ]),
        )
        .unwrap();
        assert_eq!(target["metadata"]["finalizers"], json!(["f"]));
        let failed = json_patch(
            &mut target,
            &json!([{"op": "test", "path": "/metadata/finalizers/0", "value": "g"}]),
        );
        assert!(failed.is_err());
    }

    #[test]
    fn strategic_merge_merges_keyed_lists() {
        let mut target = json!({
            "metadata": {"finalizers": ["a"]},
            "spec": {"containers": [{"name": "c1", "image": "old"}, {"name": "c2", "image": "x"}],
                     "tolerations": [{"key": "k"}]}
        });
        let patch = json!({
            "metadata": {"finalizers": ["b", "a"]},
            "spec": {
                "$setElementOrder/containers": [{"name": "c1"}],
                "containers": [{"name": "c1", "image": "new"}, {"name": "c2", "$patch": "delete"},
                               {"name": "c3", "image": "y"}],
                "tolerations": [{"key": "j"}]
            }
        });
        strategic_merge(&mut target, &patch, &pod_lists);
        assert_eq!(
            target,
            json!({
                "metadata": {"finalizers": ["a", "b"]},
                "spec": {"containers": [{"name": "c1", "image": "new"}, {"name": "c3", "image": "y"}],
                         "tolerations": [{"key": "j"}]}
            })
        );
    }

    #[test]
    fn strategic_merge_directives() {
        let mut target = json!({"a": {"x": 1, "y": 2}, "l": [1, 2, 3], "m": {"k": 1}});
        strategic_merge(
            &mut target,
            &json!({"a": {"$patch": "replace", "z": 3}, "$deleteFromPrimitiveList/l": [2],
                    "m": {"$patch": "delete"}}),
            &pod_lists,
        );
        assert_eq!(target, json!({"a": {"z": 3}, "l": [1, 3]}));
    }
}
