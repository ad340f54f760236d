//! Header decisions, without IO: parsing and validating the `X-Sandbox-*` routing headers, and
//! rewriting headers between client and sandbox (hop-by-hop, `Host`, `Authorization` and the
//! routing headers stripped; `X-Forwarded-*` set; upgrades kept intact).

use std::net::IpAddr;
use std::time::Duration;

use agent_sandbox_api::names::is_dns_label;
use agent_sandbox_api::wire::{DEFAULT_SANDBOX_NAMESPACE, RUNTIME_PORT, headers as wire};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::reject::{Rejection, shown};

/// Where a request wants to go, as its headers say (validated, not yet checked against the
/// index).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Routing {
    /// `X-Sandbox-ID`: the Sandbox name.
    pub(crate) id: String,
    /// `X-Sandbox-Namespace`, default `default`.
    pub(crate) namespace: String,
    /// `X-Sandbox-Port`, default 8888.
    pub(crate) port: u16,
    /// `X-Sandbox-Pod-IP`: a hint that must match the sandbox's pod.
    pub(crate) pod_ip: Option<IpAddr>,
    /// `X-Sandbox-UID`: must match the Sandbox's UID.
    pub(crate) uid: Option<String>,
    /// `X-Sandbox-Timeout`: the client's deadline.
    pub(crate) timeout: Option<Duration>,
}

impl Routing {
    /// `namespace/name`, for details and logs.
    pub(crate) fn sandbox(&self) -> String {
        format!("{}/{}", self.namespace, self.id)
    }
}

/// The single value of header `name`, if present: `Err` when it is repeated or not visible ASCII.
fn single<'h>(headers: &'h HeaderMap, name: &'static str) -> Result<Option<&'h str>, Rejection> {
    let mut values = headers.get_all(name).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Rejection::bad_request(format!(
            "{name} header given more than once."
        )));
    }
    let text = first
        .to_str()
        .map_err(|_| Rejection::bad_request(format!("{name} header is not visible ASCII.")))?;
    Ok(Some(text.trim()))
}

/// Parses and validates the routing headers.
pub(crate) fn parse_routing(headers: &HeaderMap) -> Result<Routing, Rejection> {
    let id = match single(headers, wire::SANDBOX_ID)? {
        None | Some("") => {
            return Err(Rejection::bad_request("X-Sandbox-ID header is required."));
        }
        Some(id) => id,
    };
    if !is_dns_label(id) {
        return Err(Rejection::bad_request(format!(
            "Invalid sandbox ID format: {:?} is not a DNS-1123 label (lowercase letters, digits \
             and '-', at most 63 characters).",
            shown(id)
        )));
    }
    let namespace = match single(headers, wire::SANDBOX_NAMESPACE)? {
        None | Some("") => DEFAULT_SANDBOX_NAMESPACE,
        Some(namespace) => namespace,
    };
    if !is_dns_label(namespace) {
        return Err(Rejection::bad_request(format!(
            "Invalid namespace format: {:?} (for sandbox {id:?}) is not a DNS-1123 label.",
            shown(namespace)
        )));
    }
    let sandbox = format!("{namespace}/{id}");
    let port = match single(headers, wire::SANDBOX_PORT)? {
        None | Some("") => RUNTIME_PORT,
        // Digits only: `str::parse` would also take a sign.
        Some(raw) => match raw
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| raw.parse::<u16>())
        {
            Some(Ok(port)) if port > 0 => port,
            _ => {
                return Err(Rejection::bad_request(format!(
                    "Invalid port format: {:?} for sandbox {sandbox} (an integer from 1 to 65535).",
                    shown(raw)
                )));
            }
        },
    };
    let pod_ip = match single(headers, wire::SANDBOX_POD_IP)? {
        None | Some("") => None,
        Some(raw) => Some(raw.parse::<IpAddr>().map_err(|_| {
            Rejection::bad_request(format!(
                "Invalid target IP address: {:?} for sandbox {sandbox}.",
                shown(raw)
            ))
        })?),
    };
    let uid = match single(headers, wire::SANDBOX_UID)? {
        None | Some("") => None,
        Some(raw) if raw.len() <= 128 => Some(raw.to_owned()),
        Some(raw) => {
            return Err(Rejection::bad_request(format!(
                "Invalid sandbox UID: {:?} for sandbox {sandbox}.",
                shown(raw)
            )));
        }
    };
    let timeout = match single(headers, wire::SANDBOX_TIMEOUT)? {
        None | Some("") => None,
        Some(raw) => Some(wire::parse_timeout(raw).ok_or_else(|| {
            Rejection::bad_request(format!(
                "Invalid timeout: {:?} for sandbox {sandbox} (a decimal number of seconds above \
                 0, such as 30 or 2.5).",
                shown(raw)
            ))
        })?),
    };
    Ok(Routing {
        id: id.to_owned(),
        namespace: namespace.to_owned(),
        port,
        pod_ip,
        uid,
        timeout,
    })
}

/// The deadline of a request: the client's timeout, capped by the router's maximum (which is
/// also the default).
pub(crate) fn deadline(requested: Option<Duration>, max: Duration) -> Duration {
    requested.map_or(max, |requested| requested.min(max))
}

/// Whether the request asks to switch protocols (`Connection: upgrade` plus an `Upgrade`
/// header), e.g. a WebSocket handshake.
pub(crate) fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE) && connection_has(headers, "upgrade")
}

fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .filter(|token| !token.is_empty())
}

fn connection_has(headers: &HeaderMap, token: &str) -> bool {
    connection_tokens(headers).any(|t| t.eq_ignore_ascii_case(token))
}

/// Headers that describe one connection, never forwarded (RFC 9110 §7.6.1, plus the legacy
/// `Keep-Alive` and `Proxy-Connection`).
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// Removes hop-by-hop headers, including those the `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = connection_tokens(headers)
        .filter_map(|token| HeaderName::from_bytes(token.as_bytes()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
}

/// Headers the router consumes or replaces, never forwarded to the sandbox.
const CONSUMED: [&str; 6] = [
    wire::SANDBOX_ID,
    wire::SANDBOX_NAMESPACE,
    wire::SANDBOX_PORT,
    wire::SANDBOX_POD_IP,
    wire::SANDBOX_UID,
    wire::SANDBOX_TIMEOUT,
];

/// The headers to send to the sandbox for a request with `inbound` headers from `peer`.
///
/// Stripped: hop-by-hop headers, `Host` (the client library sets the pod's), `Authorization`
/// (the client's credential is for the router, not for code in the sandbox), `Expect` (the
/// router answers `100 Continue` itself), the routing headers, and any `X-Forwarded-*` the client
/// sent (a client must not choose the address the sandbox sees). Set: `X-Forwarded-For` (the
/// client's address), `X-Forwarded-Host` (the `Host` the client used), `X-Forwarded-Proto`.
/// On an upgrade, `Connection: upgrade` and `Upgrade` are kept and `Origin` is dropped: the
/// sandbox sees the pod address as `Host`, so an origin check against it would always fail.
pub(crate) fn outbound_headers(inbound: &HeaderMap, upgrade: bool, peer: IpAddr) -> HeaderMap {
    let mut headers = inbound.clone();
    let upgrade_value = headers.get(header::UPGRADE).cloned();
    strip_hop_by_hop(&mut headers);
    for name in [
        header::HOST,
        header::AUTHORIZATION,
        header::EXPECT,
        header::UPGRADE,
        HeaderName::from_static("x-forwarded-for"),
        HeaderName::from_static("x-forwarded-host"),
        HeaderName::from_static("x-forwarded-proto"),
        header::FORWARDED,
    ] {
        headers.remove(name);
    }
    for name in CONSUMED {
        headers.remove(name);
    }
    if upgrade && let Some(value) = upgrade_value {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, value);
        headers.remove(header::ORIGIN);
    }
    if let Ok(value) = HeaderValue::from_str(&peer.to_string()) {
        headers.insert(HeaderName::from_static("x-forwarded-for"), value);
    }
    if let Some(host) = inbound.get(header::HOST) {
        headers.insert(HeaderName::from_static("x-forwarded-host"), host.clone());
    }
    headers.insert(
        HeaderName::from_static("x-forwarded-proto"),
        HeaderValue::from_static("http"),
    );
    headers
}

/// Rewrites the sandbox's response headers for the client: hop-by-hop headers removed, except
/// `Connection` and `Upgrade` on a `101 Switching Protocols`.
pub(crate) fn inbound_response_headers(headers: &mut HeaderMap, switching: bool) {
    let kept = if switching {
        (
            headers.get(header::CONNECTION).cloned(),
            headers.get(header::UPGRADE).cloned(),
        )
    } else {
        (None, None)
    };
    strip_hop_by_hop(headers);
    headers.remove(header::UPGRADE);
    if let (Some(connection), Some(upgrade)) = kept {
        headers.insert(header::CONNECTION, connection);
        headers.insert(header::UPGRADE, upgrade);
    }
}

/// Bytes of a request head as the client sent it (approximately: request line plus
/// `name: value\r\n` per header).
pub(crate) fn head_bytes(method: &http::Method, uri: &http::Uri, headers: &HeaderMap) -> usize {
    let line = method.as_str().len() + uri.to_string().len() + " HTTP/1.1\r\n".len() + 1;
    headers.iter().fold(line, |total, (name, value)| {
        total + name.as_str().len() + value.len() + 4
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use pretty_assertions::assert_eq;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn rejected(pairs: &[(&str, &str)]) -> String {
        let rejection = parse_routing(&headers(pairs)).unwrap_err();
        assert_eq!(rejection.status, http::StatusCode::BAD_REQUEST);
        rejection.detail
    }

    #[test]
    fn defaults() {
        assert_eq!(
            parse_routing(&headers(&[("x-sandbox-id", "my-sandbox")])).unwrap(),
            Routing {
                id: "my-sandbox".to_owned(),
                namespace: "default".to_owned(),
                port: 8888,
                pod_ip: None,
                uid: None,
                timeout: None,
            }
        );
    }

    #[test]
    fn every_header() {
        let routing = parse_routing(&headers(&[
            ("X-Sandbox-ID", "box-1"),
            ("X-Sandbox-Namespace", "team-a"),
            ("X-Sandbox-Port", "9000"),
            ("X-Sandbox-Pod-IP", "10.1.2.3"),
            ("X-Sandbox-UID", "0b7c-uid"),
            ("X-Sandbox-Timeout", "2.5"),
        ]))
        .unwrap();
        assert_eq!(
            routing,
            Routing {
                id: "box-1".to_owned(),
                namespace: "team-a".to_owned(),
                port: 9000,
                pod_ip: Some("10.1.2.3".parse().unwrap()),
                uid: Some("0b7c-uid".to_owned()),
                timeout: Some(Duration::from_millis(2500)),
            }
        );
        assert_eq!(routing.sandbox(), "team-a/box-1");
    }

    #[test]
    fn refusals_say_what_is_wrong() {
        assert_eq!(rejected(&[]), "X-Sandbox-ID header is required.");
        assert_eq!(
            rejected(&[("x-sandbox-id", "")]),
            "X-Sandbox-ID header is required."
        );
        assert!(rejected(&[("x-sandbox-id", "a.b")]).starts_with("Invalid sandbox ID format"));
        assert!(rejected(&[("x-sandbox-id", "a/b")]).contains("\"a/b\""));
        assert!(
            rejected(&[("x-sandbox-id", "a"), ("x-sandbox-namespace", "x.y")])
                .starts_with("Invalid namespace format")
        );
        for port in ["0", "65536", "http", "-1", "+80", "80.5", "8 0"] {
            let detail = rejected(&[("x-sandbox-id", "a"), ("x-sandbox-port", port)]);
            assert!(detail.starts_with("Invalid port format"), "{detail}");
            assert!(detail.contains("default/a"), "{detail}");
        }
        for ip in ["999.1.1.1", "example.com", "10.0.0.1:80"] {
            let detail = rejected(&[("x-sandbox-id", "a"), ("x-sandbox-pod-ip", ip)]);
            assert!(detail.starts_with("Invalid target IP address"), "{detail}");
        }
        for timeout in [
            "0", "0.0", ".", "-3", "+3", "1e3", "soon", "NaN", "inf", "1.2.3", "0x10",
        ] {
            let detail = rejected(&[("x-sandbox-id", "a"), ("x-sandbox-timeout", timeout)]);
            assert!(detail.starts_with("Invalid timeout"), "{detail}");
        }
        assert_eq!(
            rejected(&[("x-sandbox-id", "a"), ("x-sandbox-id", "b")]),
            "X-Sandbox-ID header given more than once."
        );
        assert!(
            rejected(&[("x-sandbox-id", "a"), ("x-sandbox-uid", &"u".repeat(200))])
                .starts_with("Invalid sandbox UID")
        );
    }

    #[test]
    fn deadlines_are_capped() {
        let max = Duration::from_secs(3600);
        assert_eq!(deadline(None, max), max);
        assert_eq!(
            deadline(Some(Duration::from_secs(5)), max),
            Duration::from_secs(5)
        );
        assert_eq!(deadline(Some(Duration::from_secs(9999)), max), max);
        assert_eq!(
            wire::parse_timeout(&format!("1{}", "0".repeat(300))),
            Some(Duration::MAX)
        );
        assert_eq!(
            wire::parse_timeout("2.5"),
            Some(Duration::from_millis(2500))
        );
        assert_eq!(wire::parse_timeout(".5"), Some(Duration::from_millis(500)));
        assert_eq!(wire::parse_timeout("5."), Some(Duration::from_secs(5)));
        assert_eq!(
            wire::parse_timeout("0.0000000019"),
            Some(Duration::from_nanos(1))
        );
        assert_eq!(wire::parse_timeout("0.0000000009"), None);
    }

    #[test]
    fn outbound_headers_are_cleaned() {
        let inbound = headers(&[
            ("host", "router.example:8080"),
            ("authorization", "Bearer secret"),
            ("connection", "keep-alive, x-private"),
            ("keep-alive", "timeout=5"),
            ("x-private", "1"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("proxy-authorization", "Basic x"),
            ("expect", "100-continue"),
            ("x-sandbox-id", "a"),
            ("x-sandbox-namespace", "default"),
            ("x-sandbox-port", "8888"),
            ("x-sandbox-pod-ip", "10.0.0.1"),
            ("x-sandbox-uid", "u"),
            ("x-sandbox-timeout", "5"),
            ("x-forwarded-for", "6.6.6.6"),
            ("forwarded", "for=6.6.6.6"),
            ("content-type", "application/json"),
            ("content-length", "12"),
            ("x-request-id", "r-1"),
            ("origin", "http://router.example"),
        ]);
        let out = outbound_headers(&inbound, false, "192.0.2.7".parse().unwrap());
        let mut names: Vec<(String, String)> = out
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        names.sort();
        assert_eq!(
            names,
            vec![
                ("content-length".to_owned(), "12".to_owned()),
                ("content-type".to_owned(), "application/json".to_owned()),
                ("origin".to_owned(), "http://router.example".to_owned()),
                ("x-forwarded-for".to_owned(), "192.0.2.7".to_owned()),
                (
                    "x-forwarded-host".to_owned(),
                    "router.example:8080".to_owned()
                ),
                ("x-forwarded-proto".to_owned(), "http".to_owned()),
                ("x-request-id".to_owned(), "r-1".to_owned()),
            ]
        );
    }

    #[test]
    fn upgrades_keep_their_handshake() {
        let inbound = headers(&[
            ("host", "router"),
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("sec-websocket-version", "13"),
            ("origin", "http://router"),
        ]);
        assert!(is_upgrade(&inbound));
        assert!(!is_upgrade(&headers(&[("upgrade", "websocket")])));
        assert!(!is_upgrade(&headers(&[("connection", "upgrade")])));
        let out = outbound_headers(&inbound, true, "::1".parse().unwrap());
        assert_eq!(out["connection"], "upgrade");
        assert_eq!(out["upgrade"], "websocket");
        assert_eq!(out["sec-websocket-key"], "dGhlIHNhbXBsZSBub25jZQ==");
        assert_eq!(out["x-forwarded-for"], "::1");
        assert!(!out.contains_key("origin"));
    }

    #[test]
    fn response_headers() {
        let mut upstream = headers(&[
            ("connection", "keep-alive"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("content-type", "text/plain"),
        ]);
        inbound_response_headers(&mut upstream, false);
        assert_eq!(upstream.len(), 1);
        assert_eq!(upstream["content-type"], "text/plain");

        let mut switching = headers(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-accept", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
        ]);
        inbound_response_headers(&mut switching, true);
        assert_eq!(switching["connection"], "Upgrade");
        assert_eq!(switching["upgrade"], "websocket");
        assert_eq!(switching.len(), 3);
    }

    #[test]
    fn head_size() {
        let map = headers(&[("x-a", "12345")]);
        let size = head_bytes(&http::Method::GET, &"/p".parse().unwrap(), &map);
        assert_eq!(size, 3 + 2 + 11 + 1 + 3 + 5 + 4);
    }
}

/// Property tests: `parse_routing` never panics, accepts exactly the valid forms of every
/// routing header (checked against an oracle written from `docs/router.md`, not from the code
/// above) and gives each valid value back unchanged.
#[cfg(test)]
mod properties {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use proptest::prelude::*;

    const CASES: u32 = 4096;

    /// What the documentation says a routing header may hold; `None` when it must be refused.
    fn oracle(headers: &HeaderMap) -> Option<Routing> {
        fn value<'h>(headers: &'h HeaderMap, name: &str) -> Option<Option<&'h str>> {
            let all: Vec<&HeaderValue> = headers.get_all(name).iter().collect();
            match all.as_slice() {
                [] => Some(None),
                [one] => {
                    let bytes = one.as_bytes();
                    let visible = bytes
                        .iter()
                        .all(|b| *b == b'\t' || (0x20..0x7f).contains(b));
                    visible.then(|| {
                        let text = std::str::from_utf8(bytes).unwrap();
                        Some(text.trim_matches(|c| c == ' ' || c == '\t')).filter(|t| !t.is_empty())
                    })
                }
                _ => None,
            }
        }
        fn label(text: &str) -> bool {
            (1..=63).contains(&text.len())
                && text
                    .chars()
                    .all(|c| matches!(c, 'a'..='z' | '0'..='9' | '-'))
                && !text.starts_with('-')
                && !text.ends_with('-')
        }
        let id = value(headers, "x-sandbox-id")??;
        let namespace = value(headers, "x-sandbox-namespace")?.unwrap_or("default");
        if !label(id) || !label(namespace) {
            return None;
        }
        let port = match value(headers, "x-sandbox-port")? {
            None => 8888,
            Some(raw) if raw.chars().all(|c| c.is_ascii_digit()) => {
                let digits = raw.trim_start_matches('0');
                if digits.is_empty() || digits.len() > 5 {
                    return None;
                }
                u16::try_from(digits.parse::<u32>().unwrap()).ok()?
            }
            Some(_) => return None,
        };
        let pod_ip = match value(headers, "x-sandbox-pod-ip")? {
            None => None,
            Some(raw) => Some(raw.parse::<IpAddr>().ok()?),
        };
        let uid = match value(headers, "x-sandbox-uid")? {
            None => None,
            Some(raw) if raw.len() <= 128 => Some(raw.to_owned()),
            Some(_) => return None,
        };
        let timeout = match value(headers, "x-sandbox-timeout")? {
            None => None,
            Some(raw) => {
                let (whole, fraction) = raw.split_once('.').unwrap_or((raw, ""));
                let digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
                if whole.len() + fraction.len() == 0 || !digits(whole) || !digits(fraction) {
                    return None;
                }
                let nanos: u32 = format!("{:0<9}", &fraction[..fraction.len().min(9)])
                    .parse()
                    .unwrap();
                let seconds = whole.trim_start_matches('0');
                let duration = match seconds.parse::<u64>() {
                    _ if seconds.is_empty() => Duration::new(0, nanos),
                    Ok(seconds) => Duration::new(seconds, nanos),
                    Err(_) => Duration::MAX,
                };
                Some(Some(duration).filter(|d| !d.is_zero())?)
            }
        };
        Some(Routing {
            id: id.to_owned(),
            namespace: namespace.to_owned(),
            port,
            pod_ip,
            uid,
            timeout,
        })
    }

    /// The routing headers, in any letter case, and an unrelated one.
    fn name() -> impl Strategy<Value = HeaderName> {
        prop_oneof![
            Just(wire::SANDBOX_ID),
            Just(wire::SANDBOX_NAMESPACE),
            Just(wire::SANDBOX_PORT),
            Just(wire::SANDBOX_POD_IP),
            Just(wire::SANDBOX_UID),
            Just(wire::SANDBOX_TIMEOUT),
            Just("x-other"),
        ]
        .prop_map(|name| HeaderName::from_bytes(name.as_bytes()).unwrap())
    }

    /// Values near the valid forms as well as arbitrary bytes: random bytes alone would almost
    /// never be valid.
    fn value() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..80),
            "[ \t]?[a-z0-9-]{0,65}[ \t]?".prop_map(String::into_bytes),
            "[+-]?[0-9]{0,7}".prop_map(String::into_bytes),
            "[0-9+e.-]{0,12}|inf|NaN|infinity".prop_map(String::into_bytes),
            any::<IpAddr>().prop_map(|ip| ip.to_string().into_bytes()),
            "[0-9a-f:.%]{0,40}".prop_map(String::into_bytes),
            "[!-~]{120,135}".prop_map(String::into_bytes),
        ]
    }

    fn header_map(pairs: Vec<(HeaderName, Vec<u8>)>) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, bytes) in pairs {
            // Bytes no HTTP parser would deliver as a header value (CR, LF, NUL...) never
            // reach the router.
            if let Ok(value) = HeaderValue::from_bytes(&bytes) {
                map.append(name, value);
            }
        }
        map
    }

    fn label() -> impl Strategy<Value = String> {
        "[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
    }

    /// Seconds as a decimal number, and the duration it stands for.
    fn timeout() -> impl Strategy<Value = (String, Duration)> {
        (1u64..10_000_000, 0u32..1_000_000_000, 0usize..=9).prop_map(|(secs, nanos, places)| {
            let kept = nanos / 10u32.pow(9 - u32::try_from(places).unwrap());
            let text = if places == 0 {
                secs.to_string()
            } else {
                format!("{secs}.{kept:0places$}")
            };
            let nanos = kept * 10u32.pow(9 - u32::try_from(places).unwrap());
            (text, Duration::new(secs, nanos))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(CASES))]

        #[test]
        fn arbitrary_headers_are_accepted_exactly_when_valid(
            pairs in proptest::collection::vec((name(), value()), 0..10)
        ) {
            let headers = header_map(pairs);
            match (parse_routing(&headers), oracle(&headers)) {
                (Ok(routing), Some(expected)) => prop_assert_eq!(routing, expected),
                (Err(rejection), None) => {
                    prop_assert_eq!(rejection.status, http::StatusCode::BAD_REQUEST);
                    prop_assert!(!rejection.detail.is_empty());
                }
                (Ok(routing), None) => {
                    prop_assert!(false, "accepted {headers:?} as {routing:?}");
                }
                (Err(rejection), Some(expected)) => {
                    prop_assert!(false, "refused {headers:?} ({expected:?}): {}", rejection.detail);
                }
            }
        }

        #[test]
        fn valid_values_parse_to_themselves(
            id in label(),
            namespace in proptest::option::of(label()),
            port in 1u16..,
            pod_ip in proptest::option::of(any::<IpAddr>()),
            uid in proptest::option::of("[!-~]{1,128}"),
            timeout in proptest::option::of(timeout()),
            upper in any::<bool>(),
        ) {
            let case = |name: &str| if upper { name.to_owned() } else { name.to_ascii_lowercase() };
            let mut pairs = vec![(case(wire::SANDBOX_ID), id.clone()), (case(wire::SANDBOX_PORT), port.to_string())];
            pairs.extend(namespace.clone().map(|ns| (case(wire::SANDBOX_NAMESPACE), ns)));
            pairs.extend(pod_ip.map(|ip| (case(wire::SANDBOX_POD_IP), ip.to_string())));
            pairs.extend(uid.clone().map(|uid| (case(wire::SANDBOX_UID), uid)));
            pairs.extend(timeout.clone().map(|(text, _)| (case(wire::SANDBOX_TIMEOUT), text)));
            let mut headers = HeaderMap::new();
            for (name, value) in pairs {
                headers.append(
                    HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    HeaderValue::from_str(&value).unwrap(),
                );
            }
            prop_assert_eq!(
                parse_routing(&headers).unwrap(),
                Routing {
                    id,
                    namespace: namespace.unwrap_or_else(|| "default".to_owned()),
                    port,
                    pod_ip,
                    uid,
                    timeout: timeout.map(|(_, duration)| duration),
                }
            );
        }

        #[test]
        fn routing_headers_never_reach_the_sandbox(
            pairs in proptest::collection::vec((name(), value()), 0..10),
            upgrade in any::<bool>(),
        ) {
            let headers = header_map(pairs);
            let out = outbound_headers(&headers, upgrade, IpAddr::from([192, 0, 2, 1]));
            for name in CONSUMED {
                prop_assert!(!out.contains_key(name), "{name} forwarded");
            }
        }
    }
}
