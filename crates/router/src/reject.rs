//! Refusals: every answer the router gives instead of proxying, as `{"detail": "..."}` with a
//! status, upstream's error shape. The detail names the sandbox whenever the request named a
//! valid one.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use crate::body::ResponseBody;

/// A request the router answers itself, with a status, a detail and a low-cardinality reason
/// (for the access log and `sandbox_router_upstream_errors_total`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rejection {
    pub(crate) status: StatusCode,
    pub(crate) reason: &'static str,
    pub(crate) detail: String,
}

impl Rejection {
    pub(crate) fn new(status: StatusCode, reason: &'static str, detail: impl Into<String>) -> Self {
        Self {
            status,
            reason,
            detail: detail.into(),
        }
    }

    pub(crate) fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", detail)
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
    fn long_values_are_cut() {
        assert_eq!(shown("abc"), "abc");
        let long = "x".repeat(100);
        assert_eq!(shown(&long), format!("{}…", "x".repeat(64)));
        let wide = "é".repeat(70);
        assert_eq!(shown(&wide).chars().count(), 65);
    }
}
