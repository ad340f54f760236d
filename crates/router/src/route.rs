//! The routing decision, without IO: from validated headers and the index's answer to the one
//! socket address a request may go to, or a refusal.
//!
//! Only addresses of a Sandbox's own pod, on 8888 or a port its containers declare, are ever
//! produced: `X-Sandbox-Pod-IP` and `X-Sandbox-UID` can narrow the choice, never widen it. That
//! is the router's guarantee against being used as an internal proxy (SSRF).

use std::net::SocketAddr;
use std::time::Duration;

use crate::headers::Routing;
use crate::index::{Backend, Unroutable};
use crate::reject::{Reason, Rejection, shown};

/// The refusal for a sandbox the index cannot route to: 404 (unknown, not Ready, unclaimed
/// warm-pool member), or 503 while the index has not finished its initial lists.
pub(crate) fn unroutable(routing: &Routing, why: &Unroutable) -> Rejection {
    let detail = why.describe(&routing.namespace, &routing.id);
    match why {
        Unroutable::NotSynced => Rejection::new(Reason::NotSynced, detail),
        Unroutable::NotFound => Rejection::new(Reason::NotFound, detail),
        Unroutable::WarmPoolMember { .. } => Rejection::new(Reason::WarmPoolMember, detail),
        Unroutable::Suspended
        | Unroutable::NotReady { .. }
        | Unroutable::NoPod { .. }
        | Unroutable::PodNotControlled { .. }
        | Unroutable::PodTerminating { .. }
        | Unroutable::NoPodIp { .. } => Rejection::new(Reason::NotReady, detail),
    }
}

/// The refusal for a suspended sandbox the router asked to be resumed that did not become
/// routable before the request's deadline, `deadline` after the request arrived; `last` is why
/// the index could not route it when the deadline passed.
pub(crate) fn did_not_wake(routing: &Routing, deadline: Duration, last: &Unroutable) -> Rejection {
    Rejection::new(
        Reason::Timeout,
        format!(
            "Sandbox {} was suspended: the router asked for it to be resumed (it recorded the \
             request as the sandbox's activity, status.lastActivityTime, for which the \
             controller resumes a suspended sandbox) and waited for it to become routable until \
             the request's deadline, {} after it arrived (X-Sandbox-Timeout, at most \
             --max-timeout-seconds); last seen, it {}. Retry with a longer X-Sandbox-Timeout, or \
             resume it first (sandboxctl resume CLAIM) and wait until it is Ready.",
            routing.sandbox(),
            crate::proxy::seconds(deadline),
            last.while_waking()
        ),
    )
}

/// The address to connect to for `routing` on `backend`.
pub(crate) fn target(routing: &Routing, backend: &Backend) -> Result<SocketAddr, Rejection> {
    let sandbox = routing.sandbox();
    if let Some(uid) = &routing.uid
        && *uid != backend.uid
    {
        return Err(Rejection::new(
            Reason::UidMismatch,
            format!(
                "Sandbox {sandbox} has UID {}, not {} (it was deleted and created again).",
                backend.uid,
                shown(uid)
            ),
        ));
    }
    if backend.ports.binary_search(&routing.port).is_err() {
        let allowed: Vec<String> = backend.ports.iter().map(u16::to_string).collect();
        return Err(Rejection::bad_request(format!(
            "Port {} is not open on sandbox {sandbox}: allowed are {} (8888 and the ports its \
             containers declare).",
            routing.port,
            allowed.join(", ")
        )));
    }
    let ip = match routing.pod_ip {
        None => backend.ips.first().copied(),
        Some(hint) => {
            if !backend.ips.contains(&hint) {
                return Err(Rejection::bad_request(format!(
                    "Invalid target IP address: {hint} is not an address of sandbox {sandbox}'s \
                     pod {}.",
                    backend.pod
                )));
            }
            Some(hint)
        }
    };
    let Some(ip) = ip else {
        // The index never returns a backend without an IP; refuse rather than assume.
        return Err(unroutable(
            routing,
            &Unroutable::NoPodIp {
                pod: backend.pod.clone(),
            },
        ));
    };
    Ok(SocketAddr::new(ip, routing.port))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use http::StatusCode;
    use pretty_assertions::assert_eq;

    fn routing() -> Routing {
        Routing {
            id: "box".to_owned(),
            namespace: "default".to_owned(),
            port: 8888,
            pod_ip: None,
            uid: None,
            timeout: None,
        }
    }

    fn backend() -> Backend {
        Backend {
            uid: "uid-1".to_owned(),
            pod: "box".to_owned(),
            ips: vec!["10.0.0.5".parse().unwrap(), "fd00::5".parse().unwrap()],
            ports: vec![8888, 9000],
            idle_ttl: None,
        }
    }

    #[test]
    fn defaults_to_the_primary_ip() {
        assert_eq!(
            target(&routing(), &backend()),
            Ok("10.0.0.5:8888".parse().unwrap())
        );
    }

    #[test]
    fn hints_narrow_never_widen() {
        let mut r = routing();
        r.pod_ip = Some("fd00::5".parse().unwrap());
        r.port = 9000;
        r.uid = Some("uid-1".to_owned());
        assert_eq!(
            target(&r, &backend()),
            Ok("[fd00::5]:9000".parse().unwrap())
        );

        for ip in ["10.0.0.6", "127.0.0.1", "169.254.169.254"] {
            let mut r = routing();
            r.pod_ip = Some(ip.parse().unwrap());
            let refusal = target(&r, &backend()).unwrap_err();
            assert_eq!(refusal.status, StatusCode::BAD_REQUEST);
            assert!(refusal.detail.contains("default/box"), "{}", refusal.detail);
        }

        let mut r = routing();
        r.port = 22;
        let refusal = target(&r, &backend()).unwrap_err();
        assert_eq!(refusal.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            refusal.detail,
            "Port 22 is not open on sandbox default/box: allowed are 8888, 9000 (8888 and the \
             ports its containers declare)."
        );

        let mut r = routing();
        r.uid = Some("uid-0".to_owned());
        let refusal = target(&r, &backend()).unwrap_err();
        assert_eq!(refusal.status, StatusCode::NOT_FOUND);
        assert!(refusal.detail.contains("uid-0"), "{}", refusal.detail);
    }

    #[test]
    fn a_sandbox_that_did_not_wake_is_504_saying_what_was_seen_last() {
        let refusal = did_not_wake(
            &routing(),
            Duration::from_secs(30),
            &Unroutable::NoPodIp {
                pod: "box".to_owned(),
            },
        );
        assert_eq!(refusal.status, StatusCode::GATEWAY_TIMEOUT);
        for part in [
            "Sandbox default/box was suspended: the router asked for it to be resumed",
            "until the request's deadline, 30s after it arrived",
            "last seen, it was resumed, but its pod box had no IP yet. Retry with a longer",
        ] {
            assert!(refusal.detail.contains(part), "{part}: {}", refusal.detail);
        }
    }

    #[test]
    fn unroutable_codes() {
        let r = routing();
        assert_eq!(
            unroutable(&r, &Unroutable::NotSynced).status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        for why in [
            Unroutable::NotFound,
            Unroutable::WarmPoolMember {
                pool: "p".to_owned(),
            },
            Unroutable::NotReady {
                reason: String::new(),
                message: String::new(),
            },
            Unroutable::NoPod {
                pod: "box".to_owned(),
            },
            Unroutable::NoPodIp {
                pod: "box".to_owned(),
            },
        ] {
            let refusal = unroutable(&r, &why);
            assert_eq!(refusal.status, StatusCode::NOT_FOUND, "{why:?}");
            assert!(refusal.detail.contains("default/box"), "{}", refusal.detail);
        }
    }
}
