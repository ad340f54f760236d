//! Conversion between `events.k8s.io/v1` Events and core `v1` Events (sans IO).
//!
//! Like the real API server, the sim stores one Event collection and serves it through both
//! APIs; this module renames the fields that differ.

use serde_json::{Map, Value};

/// `(events.k8s.io/v1 field, core/v1 field)`.
const RENAMES: [(&str, &str); 7] = [
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

fn rename(value: &Value, api_version: &str, to_core: bool) -> Value {
    let Some(map) = value.as_object() else {
        return value.clone();
    };
    let mut out = Map::new();
    for (key, field) in map {
        let renamed = RENAMES.iter().find_map(|(v1, core)| {
            let (from, to) = if to_core { (v1, core) } else { (core, v1) };
            (key == from).then(|| (*to).to_owned())
        });
        out.insert(renamed.unwrap_or_else(|| key.clone()), field.clone());
    }
    out.insert("apiVersion".into(), Value::String(api_version.to_owned()));
    Value::Object(out)
}

/// An `events.k8s.io/v1` Event as the core `v1` Event stored.
pub(crate) fn to_core(event: &Value) -> Value {
    rename(event, "v1", true)
}

/// A stored core `v1` Event as `events.k8s.io/v1`.
pub(crate) fn to_v1(event: &Value) -> Value {
    rename(event, "events.k8s.io/v1", false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn round_trips_between_the_two_apis() {
        let v1 = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e"}, "regarding": {"kind": "Pod", "name": "p"},
            "note": "pulled", "reason": "Pulled", "type": "Normal",
            "reportingController": "kubelet", "eventTime": "2024-01-01T00:00:00.000000Z"});
        let core = to_core(&v1);
        assert_eq!(core["involvedObject"]["name"], json!("p"));
        assert_eq!(core["message"], json!("pulled"));
        assert_eq!(core["reportingComponent"], json!("kubelet"));
        assert_eq!(core["apiVersion"], json!("v1"));
        assert_eq!(to_v1(&core), v1);
    }
}
