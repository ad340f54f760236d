//! Refusals: every answer the router gives instead of proxying, as `{"detail": "..."}` with a
//! status, upstream's error shape. The detail names the sandbox whenever the request named a
//! valid one.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use crate::body::ResponseBody;

/// Why the router answered a request itself: a bounded set, named in the access log and, for
/// failures on the way to or from a sandbox, in `sandbox_router_upstream_errors_total`. Each
/// reason has one status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Reason {
    /// Malformed routing headers, target, port or pod IP hint (400).
    BadRequest,
    /// No valid bearer token (401).
    Unauthenticated,
    /// A valid scoped token for another sandbox (403).
    Forbidden,
    /// A method the router does not proxy, `CONNECT` (405).
    Method,
    /// Request line and headers above the limit (431).
    HeadersTooLarge,
    /// The index has not finished its initial lists (503).
    NotSynced,
    /// No such sandbox (404).
    NotFound,
    /// An unclaimed warm-pool member, never routable (404).
    WarmPoolMember,
    /// The sandbox or its pod is not ready to take requests (404).
    NotReady,
    /// `X-Sandbox-UID` names another incarnation of the sandbox (404).
    UidMismatch,
    /// The request body is above the limit (413).
    TooLarge,
    /// Reading the client's request body failed (400).
    Client,
    /// The sandbox's pod could not be reached (502).
    Connect,
    /// The sandbox did not answer within the deadline (504).
    Timeout,
    /// The sandbox's answer failed or made no sense (502).
    Upstream,
}

impl Reason {
    /// The name in logs and metric labels.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::BadRequest => "bad_request",
            Self::Unauthenticated => "unauthenticated",
            Self::Forbidden => "forbidden",
            Self::Method => "method",
            Self::HeadersTooLarge => "headers_too_large",
            Self::NotSynced => "not_synced",
            Self::NotFound => "not_found",
            Self::WarmPoolMember => "warm_pool_member",
            Self::NotReady => "not_ready",
            Self::UidMismatch => "uid_mismatch",
            Self::TooLarge => "too_large",
            Self::Client => "client",
            Self::Connect => "connect",
            Self::Timeout => "timeout",
            Self::Upstream => "upstream",
        }
    }

    /// The status the client gets.
    pub(crate) fn status(self) -> StatusCode {
        match self {
            Self::BadRequest | Self::Client => StatusCode::BAD_REQUEST,
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
            Self::Forbidden => StatusCode::FORBIDDEN,
            Self::Method => StatusCode::METHOD_NOT_ALLOWED,
            Self::HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::NotSynced => StatusCode::SERVICE_UNAVAILABLE,
            Self::NotFound | Self::WarmPoolMember | Self::NotReady | Self::UidMismatch => {
                StatusCode::NOT_FOUND
            }
            Self::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Connect | Self::Upstream => StatusCode::BAD_GATEWAY,
            Self::Timeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// Whether the request failed on the way to or from a sandbox (counted in
    /// `sandbox_router_upstream_errors_total`), rather than being refused up front.
    pub(crate) fn is_upstream_failure(self) -> bool {
        matches!(
            self,
            Self::TooLarge | Self::Client | Self::Connect | Self::Timeout | Self::Upstream
        )
    }
}

/// A request the router answers itself, with a status, a detail and the [`Reason`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rejection {
    pub(crate) status: StatusCode,
    pub(crate) reason: Reason,
    pub(crate) detail: String,
}

impl Rejection {
    pub(crate) fn new(reason: Reason, detail: impl Into<String>) -> Self {
        Self {
            status: reason.status(),
            reason,
            detail: detail.into(),
        }
    }

    pub(crate) fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(Reason::BadRequest, detail)
    }

    /// The JSON answer.
    pub(crate) fn into_response(self) -> Response<ResponseBody> {
        json_response(
            self.status,
            &serde_json::json!({ "detail": self.detail }),
            self.status == StatusCode::UNAUTHORIZED,
        )
    }
}

/// A JSON answer; `challenge` adds `WWW-Authenticate: Bearer` (for 401).
pub(crate) fn json_response(
    status: StatusCode,
    value: &serde_json::Value,
    challenge: bool,
) -> Response<ResponseBody> {
    let body = Bytes::from(value.to_string());
    let mut response = Response::new(ResponseBody::full(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if challenge {
        headers.insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"sandbox-router\""),
        );
    }
    response
}

/// At most 64 characters of a client-supplied value, for echoing in a detail.
pub(crate) fn shown(value: &str) -> String {
    const MAX: usize = 64;
    match value.char_indices().nth(MAX) {
        None => value.to_owned(),
        Some((cut, _)) => format!("{}…", &value[..cut]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn failures_on_the_way_to_a_sandbox_are_told_apart_from_refusals() {
        let upstream: Vec<&str> = [
            Reason::BadRequest,
            Reason::Unauthenticated,
            Reason::Forbidden,
            Reason::Method,
            Reason::HeadersTooLarge,
            Reason::NotSynced,
            Reason::NotFound,
            Reason::WarmPoolMember,
            Reason::NotReady,
            Reason::UidMismatch,
            Reason::TooLarge,
            Reason::Client,
            Reason::Connect,
            Reason::Timeout,
            Reason::Upstream,
        ]
        .into_iter()
        .filter(|reason| reason.is_upstream_failure())
        .map(Reason::as_str)
        .collect();
        // The set `sandbox_router_upstream_errors_total` documents.
        assert_eq!(
            upstream,
            ["too_large", "client", "connect", "timeout", "upstream"]
        );
        assert_eq!(Reason::Timeout.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(Rejection::bad_request("x").status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn long_values_are_cut() {
        assert_eq!(shown("abc"), "abc");
        let long = "x".repeat(100);
        assert_eq!(shown(&long), format!("{}…", "x".repeat(64)));
        let wide = "é".repeat(70);
        assert_eq!(shown(&wide).chars().count(), 65);
    }
}
