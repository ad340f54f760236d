//! Reading and writing `metadata` of objects held as JSON, and the timestamp formats of the API.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value};

/// `metav1.Time`: RFC 3339 with second precision.
pub(crate) fn format_time(ts: Timestamp) -> String {
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Now, as `metav1.Time`.
pub(crate) fn now() -> String {
    format_time(Timestamp::now())
}

/// Parses a `metav1.Time` (or any RFC 3339 timestamp).
pub(crate) fn parse_time(text: &str) -> Option<Timestamp> {
    text.parse().ok()
}

/// The `metadata` object, if any.
pub(crate) fn meta(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

/// The `metadata` object, created when absent (and replacing a non-object).
pub(crate) fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    let map = match obj {
        Value::Object(map) => map,
        _ => unreachable_object(),
    };
    let entry = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !entry.is_object() {
        *entry = Value::Object(Map::new());
    }
    match entry {
        Value::Object(meta) => meta,
        _ => unreachable_object(),
    }
}

// Both call sites above have just made the value an object; this is the proven invariant.
#[allow(clippy::panic)]
fn unreachable_object() -> ! {
    panic!("value was just made an object")
}

/// A string field of `metadata`.
pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    meta(obj).and_then(|m| m.get(field)).and_then(Value::as_str)
}

/// `metadata.name` (empty when absent).
pub(crate) fn name(obj: &Value) -> &str {
    meta_str(obj, "name").unwrap_or_default()
}

/// `metadata.namespace` (empty when absent).
pub(crate) fn namespace(obj: &Value) -> &str {
    meta_str(obj, "namespace").unwrap_or_default()
}

/// `metadata.uid` (empty when absent).
pub(crate) fn uid(obj: &Value) -> &str {
    meta_str(obj, "uid").unwrap_or_default()
}

/// `metadata.resourceVersion` (empty when absent).
pub(crate) fn resource_version(obj: &Value) -> &str {
    meta_str(obj, "resourceVersion").unwrap_or_default()
}

/// Whether `metadata.deletionTimestamp` is set.
pub(crate) fn is_deleting(obj: &Value) -> bool {
    meta_str(obj, "deletionTimestamp").is_some()
}

/// A string map of `metadata` (`labels` or `annotations`).
pub(crate) fn string_map(obj: &Value, field: &str) -> BTreeMap<String, String> {
    meta(obj)
        .and_then(|m| m.get(field))
        .and_then(Value::as_object)
        .map(|map| {
            map.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// `metadata.labels`.
pub(crate) fn labels(obj: &Value) -> BTreeMap<String, String> {
    string_map(obj, "labels")
}

/// `metadata.finalizers`.
pub(crate) fn finalizers(obj: &Value) -> Vec<String> {
    meta(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Replaces `metadata.finalizers` (removing the field when empty, as the API server does).
pub(crate) fn set_finalizers(obj: &mut Value, finalizers: &[String]) {
    let meta = meta_mut(obj);
    if finalizers.is_empty() {
        meta.remove("finalizers");
    } else {
        meta.insert("finalizers".into(), Value::from(finalizers.to_vec()));
    }
}

/// One `metadata.ownerReferences` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OwnerRef {
    pub(crate) api_version: String,
    pub(crate) kind: String,
    pub(crate) name: String,
    pub(crate) uid: String,
    pub(crate) block_owner_deletion: bool,
}

/// `metadata.ownerReferences`.
pub(crate) fn owner_refs(obj: &Value) -> Vec<OwnerRef> {
    meta(obj)
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .map(|item| {
                    let text = |field: &str| {
                        item.get(field)
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned()
                    };
                    OwnerRef {
                        api_version: text("apiVersion"),
                        kind: text("kind"),
                        name: text("name"),
                        uid: text("uid"),
                        block_owner_deletion: item
                            .get("blockOwnerDeletion")
                            .and_then(Value::as_bool)
                            .unwrap_or(false),
                    }
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Value at a dotted path (`status.phase`, `metadata.labels.app`); no list indexing.
pub(crate) fn dotted<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .filter(|segment| !segment.is_empty())
        .try_fold(obj, |value, segment| value.get(segment))
}

/// Renders a JSON scalar the way field selectors and table cells compare it.
pub(crate) fn scalar_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn times_have_api_precision() {
        let ts: Timestamp = "2024-05-01T12:00:00.123456789Z".parse().unwrap();
        assert_eq!(format_time(ts), "2024-05-01T12:00:00Z");
    }

    #[test]
    fn metadata_accessors() {
        let mut obj = json!({"metadata": {"name": "a", "labels": {"x": "1"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "K", "name": "o", "uid": "u",
                                 "blockOwnerDeletion": true}]}});
        assert_eq!(name(&obj), "a");
        assert_eq!(labels(&obj).get("x").map(String::as_str), Some("1"));
        assert_eq!(owner_refs(&obj)[0].uid, "u");
        assert!(owner_refs(&obj)[0].block_owner_deletion);
        set_finalizers(&mut obj, &["f".to_owned()]);
        assert_eq!(finalizers(&obj), vec!["f".to_owned()]);
        set_finalizers(&mut obj, &[]);
        assert!(obj["metadata"].get("finalizers").is_none());
        assert_eq!(dotted(&obj, "metadata.labels.x"), Some(&json!("1")));
    }
}
