//! Per-verb and per-resource request counters, readable from tests and as Prometheus text at
//! `GET /sim/metrics`.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

/// Verbs that change state.
pub const WRITE_VERBS: [&str; 6] = [
    "create",
    "update",
    "patch",
    "apply",
    "delete",
    "deletecollection",
];

/// One counter's identity: verb, API group and resource (with `/subresource` when addressed).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestKey {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `apply` (server-side apply),
    /// `delete`, `deletecollection` or `connect` (port-forward).
    pub verb: String,
    /// API group (empty for the core group).
    pub group: String,
    /// Plural resource name, with `/status`, `/scale`, `/log` or `/portforward` for subresources.
    pub resource: String,
}

/// A snapshot of the counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestCounts(pub BTreeMap<RequestKey, u64>);

impl RequestCounts {
    /// Requests with this verb, group and resource.
    pub fn get(&self, verb: &str, group: &str, resource: &str) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| k.verb == verb && k.group == group && k.resource == resource)
            .map(|(_, v)| *v)
            .sum()
    }

    /// Requests with this verb, whatever the resource.
    pub fn verb(&self, verb: &str) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| k.verb == verb)
            .map(|(_, v)| *v)
            .sum()
    }

    /// All writes (create, update, patch, apply, delete, deletecollection).
    pub fn writes(&self) -> u64 {
        WRITE_VERBS.iter().map(|verb| self.verb(verb)).sum()
    }

    /// Every request.
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// The requests counted after `earlier` was taken.
    #[must_use]
    pub fn since(&self, earlier: &Self) -> Self {
        Self(
            self.0
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v - earlier.0.get(k).copied().unwrap_or(0).min(*v),
                    )
                })
                .filter(|(_, v)| *v > 0)
                .collect(),
        )
    }
}

/// The live counters.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    counts: Mutex<BTreeMap<RequestKey, u64>>,
}

fn escape(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    /// Counts one request.
    pub(crate) fn count(&self, verb: &str, group: &str, resource: &str) {
        let key = RequestKey {
            verb: verb.to_owned(),
            group: group.to_owned(),
            resource: resource.to_owned(),
        };
        *self
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key)
            .or_default() += 1;
    }

    /// A snapshot.
    pub(crate) fn snapshot(&self) -> RequestCounts {
        RequestCounts(
            self.counts
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }

    /// Prometheus text exposition.
    pub(crate) fn render(&self) -> String {
        let mut out = String::from(
            "# HELP sim_api_requests_total API requests served by the simulated cluster, by verb, group and resource.\n# TYPE sim_api_requests_total counter\n",
        );
        for (key, value) in self.snapshot().0 {
            out.push_str(&format!(
                "sim_api_requests_total{{verb=\"{}\",group=\"{}\",resource=\"{}\"}} {value}\n",
                escape(&key.verb),
                escape(&key.group),
                escape(&key.resource)
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_render_as_prometheus_text() {
        let metrics = Metrics::default();
        let before = metrics.snapshot();
        metrics.count("create", "", "pods");
        metrics.count("create", "", "pods");
        metrics.count("get", "agents.x-k8s.io", "sandboxes");
        metrics.count("apply", "agents.x-k8s.io", "sandboxes/status");
        let text = metrics.render();
        assert!(
            text.contains(
                "sim_api_requests_total{verb=\"create\",group=\"\",resource=\"pods\"} 2\n"
            )
        );
        let counts = metrics.snapshot();
        assert_eq!(counts.get("create", "", "pods"), 2);
        assert_eq!(counts.writes(), 3);
        assert_eq!(counts.total(), 4);
        assert_eq!(counts.since(&before).total(), 4);
        assert_eq!(counts.since(&counts).total(), 0);
    }
}
