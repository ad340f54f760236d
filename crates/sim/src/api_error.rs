//! Kubernetes `Status` errors: the error type of every API operation and its wire form.
//!
//! Clients (kube-rs, kubectl) branch on `code` and `reason`, so each constructor produces the
//! message, reason and details the real API server produces for the same failure.

use serde_json::{Value, json};

/// A failed API operation, rendered as a `Status` object with `code` as the HTTP status.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `StatusReason` (`NotFound`, `Conflict`, ...).
    pub reason: &'static str,
    /// Human-readable message, worded like the API server's.
    pub message: String,
    /// `StatusDetails`, when the API server gives them.
    pub details: Option<Value>,
}

/// Names a resource the way the API server does in messages: `pods`, or
/// `sandboxes.agents.x-k8s.io` outside the core group.
pub(crate) fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_owned()
    } else {
        format!("{plural}.{group}")
    }
}

/// One field problem of a 422 `Invalid` error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Cause {
    /// `FieldValueRequired`, `FieldValueInvalid`, ...
    pub(crate) reason: &'static str,
    /// What is wrong.
    pub(crate) message: String,
    /// Path of the field, e.g. `spec.containers`.
    pub(crate) field: String,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, group: &str, plural: &str, name: &str) -> Self {
        let mut details = json!({"group": group, "kind": plural});
        if !name.is_empty() {
            details["name"] = json!(name);
        }
        self.details = Some(details);
        self
    }

    /// 404 for an object.
    pub(crate) fn not_found(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(group, plural)),
        )
        .with_details(group, plural, name)
    }

    /// 404 for a path that names no resource.
    pub(crate) fn no_route(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// 409 on create of an existing name.
    pub(crate) fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(group, plural)),
        )
        .with_details(group, plural, name)
    }

    /// 409 on a stale `resourceVersion` or a failed precondition.
    pub(crate) fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(group, plural)
            ),
        )
        .with_details(group, plural, name)
    }

    /// 409 for the stale-`resourceVersion` case, worded like the API server.
    pub(crate) fn stale(group: &str, plural: &str, name: &str) -> Self {
        Self::conflict(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 409 for server-side apply conflicts between field managers.
    pub(crate) fn apply_conflict(
        group: &str,
        plural: &str,
        name: &str,
        conflicts: &[(String, String)],
    ) -> Self {
        let lines: Vec<String> = conflicts
            .iter()
            .map(|(manager, field)| format!("conflict with \"{manager}\": {field}"))
            .collect();
        let plural_s = if conflicts.len() == 1 { "" } else { "s" };
        let message = format!(
            "Apply failed with {} conflict{plural_s}: {}",
            conflicts.len(),
            lines.join("\n")
        );
        let mut error = Self::new(409, "Conflict", message).with_details(group, plural, name);
        if let Some(details) = error.details.as_mut() {
            details["causes"] = conflicts
                .iter()
                .map(|(manager, field)| {
                    json!({"reason": "FieldManagerConflict",
                           "message": format!("conflict with \"{manager}\""),
                           "field": field})
                })
                .collect();
        }
        error
    }

    /// 422 with field causes.
    pub(crate) fn invalid(
        group: &str,
        kind: &str,
        plural: &str,
        name: &str,
        causes: Vec<Cause>,
    ) -> Self {
        let summary: Vec<String> = causes
            .iter()
            .map(|cause| {
                if cause.field.is_empty() {
                    cause.message.clone()
                } else {
                    format!("{}: {}", cause.field, cause.message)
                }
            })
            .collect();
        let summary = if summary.len() == 1 {
            summary.join("")
        } else {
            format!("[{}]", summary.join(", "))
        };
        let mut error = Self::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {summary}"),
        )
        .with_details(group, plural, name);
        if let Some(details) = error.details.as_mut() {
            details["kind"] = json!(kind);
            details["causes"] = causes
                .iter()
                .map(|cause| {
                    json!({"reason": cause.reason, "message": cause.message, "field": cause.field})
                })
                .collect();
        }
        error
    }

    /// 400.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 401, for a request without a credential the server accepts.
    pub(crate) fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 403.
    pub(crate) fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// 403 from authorization: `user` may not `verb` the resource (`plural` or
    /// `plural/subresource`) in `group`, in `namespace` (or at the cluster scope).
    pub(crate) fn not_allowed(
        user: &str,
        verb: &str,
        group: &str,
        resource: &str,
        namespace: &str,
        name: &str,
    ) -> Self {
        let plural = resource.split('/').next().unwrap_or(resource);
        let object = if name.is_empty() {
            qualified(group, plural)
        } else {
            format!("{} \"{name}\"", qualified(group, plural))
        };
        let scope = if namespace.is_empty() {
            "at the cluster scope".to_owned()
        } else {
            format!("in the namespace \"{namespace}\"")
        };
        Self::forbidden(format!(
            "{object} is forbidden: User \"{user}\" cannot {verb} resource \"{resource}\" in API group \"{group}\" {scope}"
        ))
        .with_details(group, plural, name)
    }

    /// 403 from authorization of a path outside the resource API.
    pub(crate) fn path_not_allowed(user: &str, verb: &str, path: &str) -> Self {
        Self::forbidden(format!(
            "forbidden: User \"{user}\" cannot {verb} path \"{path}\""
        ))
    }

    /// 413 for a request body over the API server's limit.
    pub(crate) fn body_too_large(limit: usize) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {limit}"),
        )
    }

    /// What the API server answers when etcd refuses to store an object over its request size
    /// limit: etcd's own message as an internal error without a reason.
    pub(crate) fn storage_too_large() -> Self {
        Self::new(500, "", "etcdserver: request is too large")
    }

    /// 405.
    pub(crate) fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 410, as sent in a watch `ERROR` event for a compacted `resourceVersion`.
    pub(crate) fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 415.
    pub(crate) fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    /// 500.
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if self.reason.is_empty()
            && let Some(map) = status.as_object_mut()
        {
            // `StatusReasonUnknown` is the empty string, which the API server leaves out.
            map.remove("reason");
        }
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

/// Result of an API operation.
pub(crate) type ApiResult<T> = std::result::Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn not_found_is_worded_like_the_api_server() {
        let error = ApiError::not_found("agents.x-k8s.io", "sandboxes", "s1");
        assert_eq!(
            error.to_status(),
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": "sandboxes.agents.x-k8s.io \"s1\" not found", "reason": "NotFound",
                   "details": {"group": "agents.x-k8s.io", "kind": "sandboxes", "name": "s1"},
                   "code": 404})
        );
    }

    #[test]
    fn invalid_lists_causes() {
        let error = ApiError::invalid(
            "",
            "Pod",
            "pods",
            "p",
            vec![Cause {
                reason: "FieldValueRequired",
                message: "Required value".into(),
                field: "spec.containers".into(),
            }],
        );
        assert_eq!(
            error.message,
            "Pod \"p\" is invalid: spec.containers: Required value"
        );
        assert_eq!(error.code, 422);
    }
}
