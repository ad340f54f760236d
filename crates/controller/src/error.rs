//! The controller's one error type, and its classes.

use crate::reconcile::Reconciler;

/// Everything that can go wrong in the controller. Variants name the operation and the object.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("failed to {verb} {kind} {object}: {source}")]
    Kube {
        /// What was attempted (`create`, `patch status of`, ...).
        verb: &'static str,
        /// The object's kind.
        kind: &'static str,
        /// `namespace/name` of the object.
        object: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// A child object cannot be used or adopted (owned by someone else, not authorised).
    #[error("{0}")]
    Ownership(String),
    /// A required CustomResourceDefinition is not installed.
    #[error(
        "the CustomResourceDefinition {name} is not installed in this cluster: install the CRDs first \
         (kubectl apply --server-side -f deploy/crds/, or kubectl apply --server-side -k deploy/crds)"
    )]
    CrdMissing {
        /// The CRD's name.
        name: String,
    },
    /// The CRD check could not talk to the API server.
    #[error("failed to check the CustomResourceDefinition {name}: {source}")]
    CrdCheck {
        /// The CRD's name.
        name: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Building the Kubernetes client failed.
    #[error("failed to create a Kubernetes client from the kubeconfig or in-cluster config: {0}")]
    Client(#[source] kube::Error),
    /// The health or metrics listener could not start.
    #[error("failed to listen on {addr} for {what}: {source}")]
    Listen {
        /// What the listener serves.
        what: &'static str,
        /// The address.
        addr: std::net::SocketAddr,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The leader-election Lease was lost to another replica, or could not be renewed in time.
    #[error("lost leadership of Lease {lease}: {reason}")]
    LeadershipLost {
        /// `namespace/name` of the Lease.
        lease: String,
        /// Why.
        reason: String,
    },
    /// A reconcile pass did not finish in time (a hung API call); it is retried.
    #[error("{controller} reconcile of {object} did not finish within {after:?}")]
    Timeout {
        /// Which reconciler.
        controller: Reconciler,
        /// `namespace/name`.
        object: String,
        /// The limit.
        after: std::time::Duration,
    },
    /// An object could not be encoded to JSON.
    #[error("failed to encode {what}: {source}")]
    Encode {
        /// What was being encoded.
        what: &'static str,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What kind of failure an [`Error`] is: the `error` label of
/// `agent_sandbox_reconcile_errors_total`, and what the error policy decides the retry by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// A write lost to a concurrent one (409): the cache is behind; normal, retried soon.
    Conflict,
    /// Any other failed API call.
    Kube,
    /// A child object belongs to someone else.
    Ownership,
    /// A CRD is missing or could not be checked.
    Crd,
    /// No Kubernetes client could be built.
    Client,
    /// A listener could not start.
    Listen,
    /// Leadership was lost.
    Leadership,
    /// An object could not be encoded.
    Encode,
    /// A reconcile pass took too long.
    Timeout,
}

impl ErrorClass {
    /// The metric label (short and bounded).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Conflict => "conflict",
            Self::Kube => "kube",
            Self::Ownership => "ownership",
            Self::Crd => "crd",
            Self::Client => "client",
            Self::Listen => "listen",
            Self::Leadership => "leadership",
            Self::Encode => "encode",
            Self::Timeout => "timeout",
        }
    }
}

impl Error {
    /// The class of this error.
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Kube { source, .. } if is_conflict(source) => ErrorClass::Conflict,
            Error::Kube { .. } => ErrorClass::Kube,
            Error::Ownership(_) => ErrorClass::Ownership,
            Error::CrdMissing { .. } | Error::CrdCheck { .. } => ErrorClass::Crd,
            Error::Client(_) => ErrorClass::Client,
            Error::Listen { .. } => ErrorClass::Listen,
            Error::LeadershipLost { .. } => ErrorClass::Leadership,
            Error::Encode { .. } => ErrorClass::Encode,
            Error::Timeout { .. } => ErrorClass::Timeout,
        }
    }
}

/// Wraps a kube error with what was attempted on which object.
pub(crate) fn kube_err(
    verb: &'static str,
    kind: &'static str,
    namespace: &str,
    name: &str,
) -> impl FnOnce(kube::Error) -> Error {
    let object = format!("{namespace}/{name}");
    move |source| Error::Kube {
        verb,
        kind,
        object,
        source,
    }
}

/// The HTTP status of an API error, if the error is one.
pub(crate) fn api_status(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// True for 404 Not Found.
pub(crate) fn is_not_found(error: &kube::Error) -> bool {
    api_status(error) == Some(404)
}

/// True for 422 Unprocessable Entity: the object itself is invalid; sending it again cannot help.
pub(crate) fn is_invalid(error: &kube::Error) -> bool {
    api_status(error) == Some(422)
}

/// The API server's message of an API error (the error itself otherwise).
pub(crate) fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) if !status.message.is_empty() => status.message.clone(),
        other => other.to_string(),
    }
}

/// True for 409 Conflict (stale resourceVersion) or AlreadyExists.
pub(crate) fn is_conflict(error: &kube::Error) -> bool {
    api_status(error) == Some(409)
}
