//! The controller's one error type.

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
        controller: &'static str,
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

impl Error {
    /// A short, bounded label naming the variant, for the reconcile-error metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube { source, .. } if is_conflict(source) => "conflict",
            Error::Kube { .. } => "kube",
            Error::Ownership(_) => "ownership",
            Error::CrdMissing { .. } | Error::CrdCheck { .. } => "crd",
            Error::Client(_) => "client",
            Error::Listen { .. } => "listen",
            Error::LeadershipLost { .. } => "leadership",
            Error::Encode { .. } => "encode",
            Error::Timeout { .. } => "timeout",
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
