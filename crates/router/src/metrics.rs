//! Prometheus metrics of the router, served at `/metrics`. Labels are bounded: methods outside
//! the standard set count as `OTHER`, and no label carries a sandbox or namespace name (both are
//! client-chosen strings, an unbounded series count).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::reject::Reason;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: &'static str,
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// The router's metrics and their registry.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    duration: Histogram,
    upstream_errors: Family<ReasonLabels, Counter>,
    retries: Counter,
    inflight: Gauge,
    tunnels: Gauge,
    activity_writes: Counter,
    resumes: Counter,
    credential_reloads: Family<OutcomeLabels, Counter>,
    tunnels_revoked: Family<ReasonLabels, Counter>,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("sandbox_router");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "requests",
            "Requests answered, by method and status code",
            requests.clone(),
        );
        // 0.5 ms to about 70 min: trivial exec round trips up to the longest default deadline.
        let duration = Histogram::new(exponential_buckets(0.0005, 2.0, 24));
        registry.register(
            "request_duration_seconds",
            "Time from request to the end of the response body",
            duration.clone(),
        );
        let upstream_errors = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "upstream_errors",
            "Requests that failed on the way to or from a sandbox (connect, timeout, upstream, \
             too_large, client)",
            upstream_errors.clone(),
        );
        let retries = Counter::default();
        registry.register(
            "upstream_retries",
            "Connect attempts repeated after a failed one",
            retries.clone(),
        );
        let inflight = Gauge::default();
        registry.register(
            "inflight_requests",
            "Requests whose response has not ended",
            inflight.clone(),
        );
        let tunnels = Gauge::default();
        registry.register(
            "open_tunnels",
            "Upgraded connections (WebSocket and others) being relayed",
            tunnels.clone(),
        );
        let activity_writes = Counter::default();
        registry.register(
            "activity_writes",
            "Writes of a sandbox's status.lastActivityTime (at most one per sandbox and interval)",
            activity_writes.clone(),
        );
        let resumes = Counter::default();
        registry.register(
            "resumes",
            "Suspended sandboxes resumed for a request",
            resumes.clone(),
        );
        let credential_reloads = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "credential_reloads",
            "Changed token or key files read again (success), or left unused because they \
             cannot be (failure: the previous credentials stay)",
            credential_reloads.clone(),
        );
        let tunnels_revoked = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "tunnels_revoked",
            "Upgraded connections closed because the credential they were opened with ran out \
             (expired) or was no longer accepted after the credentials were read again (rejected)",
            tunnels_revoked.clone(),
        );
        Self {
            registry,
            requests,
            duration,
            upstream_errors,
            retries,
            inflight,
            tunnels,
            activity_writes,
            resumes,
            credential_reloads,
            tunnels_revoked,
        }
    }

    pub(crate) fn request_started(&self) {
        self.inflight.inc();
    }

    pub(crate) fn request_finished(&self, method: &http::Method, code: u16, seconds: f64) {
        self.inflight.dec();
        self.requests
            .get_or_create(&RequestLabels {
                method: method_label(method),
                code,
            })
            .inc();
        self.duration.observe(seconds);
    }

    pub(crate) fn upstream_error(&self, reason: Reason) {
        self.upstream_errors
            .get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            })
            .inc();
    }

    pub(crate) fn retried(&self) {
        self.retries.inc();
    }

    pub(crate) fn activity_written(&self) {
        self.activity_writes.inc();
    }

    pub(crate) fn resumed(&self) {
        self.resumes.inc();
    }

    pub(crate) fn tunnel_opened(&self) {
        self.tunnels.inc();
    }

    pub(crate) fn tunnel_closed(&self) {
        self.tunnels.dec();
    }

    pub(crate) fn credentials_reloaded(&self, ok: bool) {
        self.credential_reloads
            .get_or_create(&OutcomeLabels {
                outcome: if ok { "success" } else { "failure" },
            })
            .inc();
    }

    /// A tunnel closed because its credential `expired` or was `rejected`.
    pub(crate) fn tunnel_revoked(&self, reason: &'static str) {
        self.tunnels_revoked
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// The text exposition format.
    pub(crate) fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

fn method_label(method: &http::Method) -> &'static str {
    match *method {
        http::Method::GET => "GET",
        http::Method::POST => "POST",
        http::Method::PUT => "PUT",
        http::Method::DELETE => "DELETE",
        http::Method::PATCH => "PATCH",
        http::Method::HEAD => "HEAD",
        http::Method::OPTIONS => "OPTIONS",
        _ => "OTHER",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_names_and_bounded_labels() {
        let metrics = Metrics::new();
        metrics.request_started();
        metrics.request_finished(&http::Method::POST, 200, 0.002);
        metrics.request_started();
        metrics.request_finished(
            &http::Method::from_bytes(b"BREW").unwrap_or_default(),
            400,
            0.001,
        );
        metrics.upstream_error(Reason::Connect);
        metrics.retried();
        let text = metrics.encode();
        for needle in [
            "sandbox_router_requests_total{method=\"POST\",code=\"200\"} 1",
            "sandbox_router_requests_total{method=\"OTHER\",code=\"400\"} 1",
            "sandbox_router_request_duration_seconds_count 2",
            "sandbox_router_upstream_errors_total{reason=\"connect\"} 1",
            "sandbox_router_upstream_retries_total 1",
            "sandbox_router_inflight_requests 0",
            "sandbox_router_open_tunnels 0",
        ] {
            assert!(text.contains(needle), "{needle} missing in:\n{text}");
        }
    }
}
