//! Authentication and per-sandbox authorization of requests, without IO: a decision from the
//! configured [`Auth`], the `Authorization` header, the request's target and the current time.
//!
//! - `none`: everything passes.
//! - `token`: `Authorization: Bearer <token>` must equal the static token (constant-time
//!   comparison); otherwise 401.
//! - `scoped`: the bearer token must be a scoped token ([`agent_sandbox_api::token`]):
//!   - v1, signed with one of the v1 keys (and, when an end of v1 is configured, presented
//!     before it), for the sandbox the request addresses;
//!   - v2 ([`agent_sandbox_api::token::v2`]), signed with one of the v2 keys, bound to the
//!     request's namespace, sandbox, `X-Sandbox-UID` header (required, as upstream requires it),
//!     port, method and path (without the query); `X-Sandbox-Pod-IP` is refused with it, as
//!     upstream refuses it, since the signed target has no address.
//!
//!   Missing, forged, malformed and expired tokens get 401, a valid token for another target
//!   gets 403.
//!
//! A request let through gets a [`Grant`]: until when its credential is good. An upgraded
//! connection lives on that grant: it is closed when it runs out, or when the credentials are
//! read again ([`Authorizer::reread`]) and its request no longer passes.

use agent_sandbox_api::token::{self, TokenError, v2};
use http::{HeaderMap, Method, header};
use subtle::ConstantTimeEq as _;

use crate::config::{
    Auth, Config, CredentialFiles, read_signing_key, read_static_token, read_verification_keys,
};
use crate::headers::Routing;
use crate::reject::{Reason, Rejection, shown};

fn unauthenticated(detail: String) -> Rejection {
    Rejection::new(Reason::Unauthenticated, detail)
}

fn forbidden(detail: String) -> Rejection {
    Rejection::new(Reason::Forbidden, detail)
}

/// The bearer token of `headers`, if there is exactly one well-formed `Authorization: Bearer`.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let value = value.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// What the request asks for, as authorization sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    /// Routing headers.
    pub(crate) routing: &'a Routing,
    /// The method.
    pub(crate) method: &'a Method,
    /// The path as sent, without the query.
    pub(crate) path: &'a str,
}

/// What an authorized request may rely on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    /// The credential is good strictly before this instant (Unix seconds): a scoped token's
    /// expiry, or the end of v1 tokens if earlier. `None`: until the credentials change.
    pub(crate) expires_at: Option<i64>,
}

impl Grant {
    const UNTIL_CHANGED: Self = Self { expires_at: None };
}

/// What a tunnel keeps of the request that opened it, to authorize it again when the
/// credentials are read again.
#[derive(Debug, Clone)]
pub(crate) struct OpenedWith {
    /// Its `Authorization` headers.
    headers: HeaderMap,
    routing: Routing,
    method: Method,
    path: String,
}

impl OpenedWith {
    pub(crate) fn new(headers: &HeaderMap, request: Request<'_>) -> Self {
        let mut kept = HeaderMap::new();
        for value in headers.get_all(header::AUTHORIZATION) {
            kept.append(header::AUTHORIZATION, value.clone());
        }
        Self {
            headers: kept,
            routing: request.routing.clone(),
            method: request.method.clone(),
            path: request.path.to_owned(),
        }
    }

    /// Whether `authorizer` still lets this request through at `now`, and until when.
    pub(crate) fn authorize(&self, authorizer: &Authorizer, now: i64) -> Result<Grant, Rejection> {
        authorizer.authorize(
            &self.headers,
            Request {
                routing: &self.routing,
                method: &self.method,
                path: &self.path,
            },
            now,
        )
    }
}

/// The configured authentication, with the scoped-token settings beside [`Auth`].
#[derive(Debug, Clone)]
pub(crate) struct Authorizer {
    auth: Auth,
    v2_keys: v2::VerificationKeys,
    v1_accept_until: Option<i64>,
}

impl Authorizer {
    pub(crate) fn new(config: &Config) -> Self {
        Self {
            auth: config.auth.clone(),
            v2_keys: config.scoped_v2_keys.clone(),
            v1_accept_until: config.scoped_v1_accept_until,
        }
    }

    /// The `--auth` mode, for the startup log.
    pub(crate) fn mode(&self) -> &'static str {
        self.auth.mode()
    }

    /// This authorizer with its token or keys read again from `files` (the mode and the end of
    /// v1 tokens stay); credentials without a file are kept.
    pub(crate) fn reread(&self, files: &CredentialFiles) -> crate::Result<Self> {
        let auth = match &self.auth {
            Auth::None => Auth::None,
            Auth::Token(token) => Auth::Token(match &files.token {
                Some(path) => read_static_token(path)?,
                None => token.clone(),
            }),
            Auth::Scoped(keys) if files.signing_keys.is_empty() => Auth::Scoped(keys.clone()),
            Auth::Scoped(_) => Auth::Scoped(
                files
                    .signing_keys
                    .iter()
                    .map(|path| read_signing_key(path))
                    .collect::<crate::Result<_>>()?,
            ),
        };
        let v2_keys = match (&self.auth, &files.verification_keys) {
            (Auth::Scoped(_), Some(path)) => read_verification_keys(path)?,
            _ => self.v2_keys.clone(),
        };
        Ok(Self {
            auth,
            v2_keys,
            v1_accept_until: self.v1_accept_until,
        })
    }

    /// Whether a request with `headers` may reach `request`'s target at `now` (Unix seconds),
    /// and until when.
    pub(crate) fn authorize(
        &self,
        headers: &HeaderMap,
        request: Request<'_>,
        now: i64,
    ) -> Result<Grant, Rejection> {
        let routing = request.routing;
        let sandbox = routing.sandbox();
        let token = match &self.auth {
            Auth::None => return Ok(Grant::UNTIL_CHANGED),
            Auth::Token(_) | Auth::Scoped(_) => bearer(headers).ok_or_else(|| {
                unauthenticated(format!(
                    "A bearer token is required to reach sandbox {sandbox} (Authorization: Bearer ...)."
                ))
            })?,
        };
        match &self.auth {
            Auth::None => Ok(Grant::UNTIL_CHANGED),
            Auth::Token(expected) => {
                if bool::from(token.as_bytes().ct_eq(expected.expose())) {
                    Ok(Grant::UNTIL_CHANGED)
                } else {
                    Err(unauthenticated(format!(
                        "Invalid bearer token for sandbox {sandbox}."
                    )))
                }
            }
            Auth::Scoped(keys) => {
                if token.starts_with("v2.") {
                    self.authorize_v2(token, request, now)
                } else {
                    self.authorize_v1(keys, token, routing, now)
                }
            }
        }
    }

    fn authorize_v1(
        &self,
        keys: &[crate::config::Secret],
        token: &str,
        routing: &Routing,
        now: i64,
    ) -> Result<Grant, Rejection> {
        let sandbox = routing.sandbox();
        if keys.is_empty() {
            return Err(unauthenticated(format!(
                "Invalid scoped token for sandbox {sandbox}: this router accepts v2 scoped tokens \
                 only."
            )));
        }
        if let Some(until) = self.v1_accept_until
            && now >= until
        {
            return Err(unauthenticated(format!(
                "Invalid scoped token for sandbox {sandbox}: v1 scoped tokens are refused since \
                 {until} (Unix seconds); use a v2 token."
            )));
        }
        let mut expired = None;
        for key in keys {
            match token::verify(key.expose(), token, now) {
                Ok(claims)
                    if claims.namespace == routing.namespace && claims.name == routing.id =>
                {
                    let until = self
                        .v1_accept_until
                        .map_or(claims.expires_at, |until| until.min(claims.expires_at));
                    return Ok(Grant {
                        expires_at: Some(until),
                    });
                }
                Ok(claims) => {
                    return Err(forbidden(format!(
                        "The scoped token is for sandbox {}/{}, not for sandbox {sandbox}.",
                        claims.namespace, claims.name
                    )));
                }
                Err(error @ TokenError::Expired { .. }) => expired = Some(error),
                Err(_) => {}
            }
        }
        Err(unauthenticated(expired_or_invalid(expired, &sandbox)))
    }

    fn authorize_v2(
        &self,
        token: &str,
        request: Request<'_>,
        now: i64,
    ) -> Result<Grant, Rejection> {
        let routing = request.routing;
        let sandbox = routing.sandbox();
        if self.v2_keys.is_empty() {
            return Err(unauthenticated(format!(
                "Invalid scoped token for sandbox {sandbox}: this router accepts v1 scoped tokens \
                 only (no v2 verification keys)."
            )));
        }
        let claims = match v2::verify(&self.v2_keys, token, now) {
            Ok(claims) => claims,
            Err(error @ TokenError::Expired { .. }) => {
                return Err(unauthenticated(expired_or_invalid(Some(error), &sandbox)));
            }
            Err(TokenError::UnknownKeyId { kid }) => {
                return Err(unauthenticated(format!(
                    "Invalid scoped token for sandbox {sandbox}: unknown key ID {:?}.",
                    shown(&kid)
                )));
            }
            Err(_) => return Err(unauthenticated(expired_or_invalid(None, &sandbox))),
        };
        if routing.pod_ip.is_some() {
            return Err(forbidden(format!(
                "X-Sandbox-Pod-IP cannot be used with a v2 scoped token (sandbox {sandbox}): the \
                 signed target has no address; drop the header."
            )));
        }
        let Some(uid) = routing.uid.as_deref() else {
            return Err(forbidden(format!(
                "A v2 scoped token needs the X-Sandbox-UID header (the sandbox UID it is bound to) \
                 for sandbox {sandbox}."
            )));
        };
        let target = v2::Target {
            namespace: routing.namespace.clone(),
            name: routing.id.clone(),
            uid: uid.to_owned(),
            port: routing.port,
            method: request.method.as_str().to_owned(),
            path: request.path.to_owned(),
        };
        match claims.check(&target) {
            Ok(()) => Ok(Grant {
                expires_at: Some(claims.expires_at),
            }),
            Err(TokenError::TargetMismatch {
                field,
                claimed,
                requested,
            }) => Err(forbidden(format!(
                "The scoped token is bound to {field} {:?}, not {:?} (sandbox {sandbox}).",
                shown(&claimed),
                shown(&requested)
            ))),
            Err(error) => Err(forbidden(format!(
                "The request to sandbox {sandbox} cannot be matched with a v2 scoped token: \
                 {error}."
            ))),
        }
    }
}

fn expired_or_invalid(expired: Option<TokenError>, sandbox: &str) -> String {
    match expired {
        Some(TokenError::Expired {
            namespace,
            name,
            expires_at,
        }) => format!(
            "The scoped token for sandbox {namespace}/{name} expired at {expires_at} (Unix \
             seconds); request for sandbox {sandbox}."
        ),
        _ => format!("Invalid scoped token for sandbox {sandbox}."),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::config::Secret;
    use agent_sandbox_api::token::Claims;
    use http::HeaderValue;
    use http::StatusCode;
    use pretty_assertions::assert_eq;
    use std::net::SocketAddr;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
    const OLD_KEY: &[u8] = b"fedcba9876543210fedcba9876543210";
    const NOW: i64 = 1_800_000_000;

    fn with_auth(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    fn status(result: Result<Grant, Rejection>) -> StatusCode {
        result.map_or_else(|r| r.status, |_| StatusCode::OK)
    }

    fn authorizer(auth: Auth) -> Authorizer {
        let mut config = Config::new(SocketAddr::from(([127, 0, 0, 1], 0)));
        config.auth = auth;
        Authorizer::new(&config)
    }

    fn routing(namespace: &str, name: &str) -> Routing {
        Routing {
            id: name.to_owned(),
            namespace: namespace.to_owned(),
            port: 8888,
            pod_ip: None,
            uid: None,
            timeout: None,
        }
    }

    fn check(
        authorizer: &Authorizer,
        headers: &HeaderMap,
        ns: &str,
        name: &str,
    ) -> Result<Grant, Rejection> {
        let routing = routing(ns, name);
        authorizer.authorize(
            headers,
            Request {
                routing: &routing,
                method: &Method::POST,
                path: "/execute",
            },
            NOW,
        )
    }

    #[test]
    fn none_lets_everything_through() {
        assert_eq!(
            status(check(
                &authorizer(Auth::None),
                &HeaderMap::new(),
                "default",
                "a"
            )),
            StatusCode::OK
        );
    }

    #[test]
    fn static_token() {
        let auth = authorizer(Auth::Token(Secret::new(KEY)));
        let check = |headers: &HeaderMap| status(check(&auth, headers, "default", "a"));
        assert_eq!(
            check(&with_auth("Bearer 0123456789abcdef0123456789abcdef")),
            StatusCode::OK
        );
        assert_eq!(
            check(&with_auth("bearer   0123456789abcdef0123456789abcdef ")),
            StatusCode::OK
        );
        for bad in [
            "Bearer 0123456789abcdef0123456789abcdeF",
            "Bearer 0123456789abcdef",
            "Basic 0123456789abcdef0123456789abcdef",
            "Bearer",
            "0123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(check(&with_auth(bad)), StatusCode::UNAUTHORIZED, "{bad}");
        }
        let missing = super::tests::check(&auth, &HeaderMap::new(), "default", "a").unwrap_err();
        assert_eq!(missing.status, StatusCode::UNAUTHORIZED);
        assert!(missing.detail.contains("default/a"), "{}", missing.detail);
        let mut twice = with_auth("Bearer 0123456789abcdef0123456789abcdef");
        twice.append(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer 0123456789abcdef0123456789abcdef"),
        );
        assert_eq!(check(&twice), StatusCode::UNAUTHORIZED);
    }

    fn mint_v1(key: &[u8], ns: &str, name: &str, exp: i64) -> String {
        format!(
            "Bearer {}",
            token::mint(key, &Claims::new(ns, name, exp)).unwrap()
        )
    }

    #[test]
    fn scoped_tokens_v1() {
        let auth = authorizer(Auth::Scoped(vec![Secret::new(KEY), Secret::new(OLD_KEY)]));
        let check = |value: &str, ns: &str, name: &str| check(&auth, &with_auth(value), ns, name);

        assert_eq!(
            status(check(&mint_v1(KEY, "team", "box", NOW + 60), "team", "box")),
            StatusCode::OK
        );
        // A token signed with the second (rotating) key.
        assert_eq!(
            status(check(
                &mint_v1(OLD_KEY, "team", "box", NOW + 60),
                "team",
                "box"
            )),
            StatusCode::OK
        );
        let other = check(&mint_v1(KEY, "team", "box", NOW + 60), "team", "other").unwrap_err();
        assert_eq!(other.status, StatusCode::FORBIDDEN);
        assert_eq!(
            other.detail,
            "The scoped token is for sandbox team/box, not for sandbox team/other."
        );
        assert_eq!(
            status(check(
                &mint_v1(KEY, "team", "box", NOW + 60),
                "other-team",
                "box"
            )),
            StatusCode::FORBIDDEN
        );
        let expired = check(&mint_v1(KEY, "team", "box", NOW), "team", "box").unwrap_err();
        assert_eq!(expired.status, StatusCode::UNAUTHORIZED);
        assert!(expired.detail.contains("expired"), "{}", expired.detail);
        let forged = mint_v1(b"an attacker's key of 32 bytes!!!", "team", "box", NOW + 60);
        assert_eq!(
            status(check(&forged, "team", "box")),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            status(check("Bearer not-a-token", "team", "box")),
            StatusCode::UNAUTHORIZED
        );
        // The static-token mode's secret is not a scoped token.
        assert_eq!(
            status(check(
                "Bearer 0123456789abcdef0123456789abcdef",
                "team",
                "box"
            )),
            StatusCode::UNAUTHORIZED
        );
    }

    fn v2_key() -> v2::PrivateKey {
        v2::PrivateKey::from_seed([3; 32])
    }

    fn v2_target() -> v2::Target {
        v2::Target {
            namespace: "team".to_owned(),
            name: "box".to_owned(),
            uid: "uid-1".to_owned(),
            port: 8888,
            method: "POST".to_owned(),
            path: "/execute".to_owned(),
        }
    }

    fn mint_v2(target: &v2::Target, exp: i64) -> String {
        let claims = v2::Claims::for_target(target, exp).unwrap();
        format!("Bearer {}", v2::mint(&v2_key(), "k1", &claims).unwrap())
    }

    fn v2_authorizer(v1: Vec<Secret>, accept_until: Option<i64>) -> Authorizer {
        let mut config = Config::new(SocketAddr::from(([127, 0, 0, 1], 0)));
        config.auth = Auth::Scoped(v1);
        config.scoped_v2_keys =
            v2::VerificationKeys::parse(v2_key().key_file("k1").unwrap().as_bytes()).unwrap();
        config.scoped_v1_accept_until = accept_until;
        Authorizer::new(&config)
    }

    #[test]
    fn scoped_tokens_v2_bind_the_whole_target() {
        let auth = v2_authorizer(Vec::new(), None);
        let token = mint_v2(&v2_target(), NOW + 60);
        let run = |routing: &Routing, method: &Method, path: &str, token: &str| {
            auth.authorize(
                &with_auth(token),
                Request {
                    routing,
                    method,
                    path,
                },
                NOW,
            )
        };
        let mut ok = routing("team", "box");
        ok.uid = Some("uid-1".to_owned());
        assert_eq!(
            status(run(&ok, &Method::POST, "/execute", &token)),
            StatusCode::OK
        );

        // Upstream's semantics: the UID is the X-Sandbox-UID header, which is required.
        let no_uid = routing("team", "box");
        let refusal = run(&no_uid, &Method::POST, "/execute", &token).unwrap_err();
        assert_eq!(refusal.status, StatusCode::FORBIDDEN);
        assert!(
            refusal.detail.contains("X-Sandbox-UID"),
            "{}",
            refusal.detail
        );
        let mut other_uid = ok.clone();
        other_uid.uid = Some("uid-2".to_owned());
        assert_eq!(
            run(&other_uid, &Method::POST, "/execute", &token)
                .unwrap_err()
                .detail,
            "The scoped token is bound to uid \"uid-1\", not \"uid-2\" (sandbox team/box)."
        );
        let mut other_port = ok.clone();
        other_port.port = 9000;
        assert_eq!(
            status(run(&other_port, &Method::POST, "/execute", &token)),
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            status(run(&ok, &Method::GET, "/execute", &token)),
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            status(run(&ok, &Method::POST, "/upload", &token)),
            StatusCode::FORBIDDEN
        );
        let mut other_name = ok.clone();
        other_name.id = "other".to_owned();
        assert_eq!(
            status(run(&other_name, &Method::POST, "/execute", &token)),
            StatusCode::FORBIDDEN
        );
        let mut hinted = ok.clone();
        hinted.pod_ip = Some("10.0.0.1".parse().unwrap());
        let refusal = run(&hinted, &Method::POST, "/execute", &token).unwrap_err();
        assert_eq!(refusal.status, StatusCode::FORBIDDEN);
        assert!(
            refusal.detail.contains("X-Sandbox-Pod-IP"),
            "{}",
            refusal.detail
        );

        // A path is compared in its normal form.
        let mut encoded = v2_target();
        encoded.path = "/download/a%2fb".to_owned();
        let encoded_token = mint_v2(&encoded, NOW + 60);
        assert_eq!(
            status(run(&ok, &Method::POST, "/download/a%2Fb", &encoded_token)),
            StatusCode::OK
        );

        // Expired, forged, unknown key: 401.
        let expired = run(&ok, &Method::POST, "/execute", &mint_v2(&v2_target(), NOW)).unwrap_err();
        assert_eq!(expired.status, StatusCode::UNAUTHORIZED);
        assert!(expired.detail.contains("expired"), "{}", expired.detail);
        let stranger = v2::PrivateKey::from_seed([9; 32]);
        let forged = format!(
            "Bearer {}",
            v2::mint(
                &stranger,
                "k1",
                &v2::Claims::for_target(&v2_target(), NOW + 60).unwrap()
            )
            .unwrap()
        );
        assert_eq!(
            status(run(&ok, &Method::POST, "/execute", &forged)),
            StatusCode::UNAUTHORIZED
        );
        let unknown = format!(
            "Bearer {}",
            v2::mint(
                &v2_key(),
                "k2",
                &v2::Claims::for_target(&v2_target(), NOW + 60).unwrap()
            )
            .unwrap()
        );
        let refusal = run(&ok, &Method::POST, "/execute", &unknown).unwrap_err();
        assert_eq!(refusal.status, StatusCode::UNAUTHORIZED);
        assert!(refusal.detail.contains("k2"), "{}", refusal.detail);
        // v1 tokens with a v2-only router: 401.
        assert_eq!(
            status(run(
                &ok,
                &Method::POST,
                "/execute",
                &mint_v1(KEY, "team", "box", NOW + 60)
            )),
            StatusCode::UNAUTHORIZED
        );
    }

    #[test]
    fn v1_and_v2_together_until_the_end_of_v1() {
        let v1 = mint_v1(KEY, "team", "box", NOW + 600);
        let v2 = mint_v2(&v2_target(), NOW + 600);
        let mut ok = routing("team", "box");
        ok.uid = Some("uid-1".to_owned());
        let run = |auth: &Authorizer, token: &str| {
            status(auth.authorize(
                &with_auth(token),
                Request {
                    routing: &ok,
                    method: &Method::POST,
                    path: "/execute",
                },
                NOW,
            ))
        };
        let open = v2_authorizer(vec![Secret::new(KEY)], Some(NOW + 1));
        assert_eq!(run(&open, &v1), StatusCode::OK);
        assert_eq!(run(&open, &v2), StatusCode::OK);
        let closed = v2_authorizer(vec![Secret::new(KEY)], Some(NOW));
        assert_eq!(run(&closed, &v1), StatusCode::UNAUTHORIZED);
        assert_eq!(run(&closed, &v2), StatusCode::OK);
        // A v2 token with a v1-only router: 401.
        let v1_only = authorizer(Auth::Scoped(vec![Secret::new(KEY)]));
        assert_eq!(run(&v1_only, &v2), StatusCode::UNAUTHORIZED);
    }

    /// A grant lasts as long as its credential: a scoped token's expiry (or the end of v1
    /// tokens, if sooner), until the credentials change for the others.
    #[test]
    fn grants_end_with_the_credential() {
        let grant = |auth: &Authorizer, token: &str, uid: Option<&str>| {
            let mut target = routing("team", "box");
            target.uid = uid.map(str::to_owned);
            auth.authorize(
                &with_auth(token),
                Request {
                    routing: &target,
                    method: &Method::POST,
                    path: "/execute",
                },
                NOW,
            )
            .unwrap()
            .expires_at
        };
        let v1 = mint_v1(KEY, "team", "box", NOW + 600);
        let v2 = mint_v2(&v2_target(), NOW + 300);
        assert_eq!(
            grant(&authorizer(Auth::Scoped(vec![Secret::new(KEY)])), &v1, None),
            Some(NOW + 600)
        );
        let both = v2_authorizer(vec![Secret::new(KEY)], Some(NOW + 60));
        assert_eq!(grant(&both, &v1, None), Some(NOW + 60));
        assert_eq!(grant(&both, &v2, Some("uid-1")), Some(NOW + 300));
        assert_eq!(
            grant(
                &authorizer(Auth::Token(Secret::new(KEY))),
                &format!("Bearer {}", String::from_utf8_lossy(KEY)),
                None
            ),
            None
        );
        assert_eq!(grant(&authorizer(Auth::None), "", None), None);
    }

    /// Credentials read again: what the files hold now is what passes, for requests and for the
    /// tunnels their [`OpenedWith`] stands for; files that cannot be used are an error (the
    /// caller keeps the previous authorizer).
    #[test]
    fn credentials_read_again_replace_those_from_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let (first, second) = (dir.path().join("first"), dir.path().join("second"));
        std::fs::write(&first, KEY).unwrap();
        std::fs::write(&second, OLD_KEY).unwrap();
        let files = CredentialFiles {
            signing_keys: vec![first.clone(), second.clone()],
            ..CredentialFiles::default()
        };
        let scoped = authorizer(Auth::Scoped(vec![Secret::new(KEY), Secret::new(OLD_KEY)]));
        let box_ = routing("team", "box");
        let opened = |token: &str| {
            OpenedWith::new(
                &with_auth(token),
                Request {
                    routing: &box_,
                    method: &Method::GET,
                    path: "/socket",
                },
            )
        };
        let by_first = opened(&mint_v1(KEY, "team", "box", NOW + 600));
        let by_second = opened(&mint_v1(OLD_KEY, "team", "box", NOW + 600));
        assert!(by_first.authorize(&scoped, NOW).is_ok());

        const NEW_KEY: &[u8] = b"a-new-router-signing-key-of-32-bytes-or-more";
        std::fs::write(&first, NEW_KEY).unwrap();
        let rotated = scoped.reread(&files).unwrap();
        assert_eq!(
            by_first.authorize(&rotated, NOW).unwrap_err().status,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            by_second.authorize(&rotated, NOW).unwrap().expires_at,
            Some(NOW + 600)
        );
        assert!(
            opened(&mint_v1(NEW_KEY, "team", "box", NOW + 600))
                .authorize(&rotated, NOW)
                .is_ok()
        );
        // A key file that cannot be used is an error, not an empty key set.
        std::fs::write(&second, "short").unwrap();
        assert!(rotated.reread(&files).is_err());

        // The static token's file.
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, "a-second-static-token-of-32-bytes-or-more").unwrap();
        let static_auth = authorizer(Auth::Token(Secret::new(KEY)));
        let old_token = opened(&format!("Bearer {}", String::from_utf8_lossy(KEY)));
        let reread = static_auth
            .reread(&CredentialFiles {
                token: Some(token_file),
                ..CredentialFiles::default()
            })
            .unwrap();
        assert!(old_token.authorize(&static_auth, NOW).is_ok());
        assert!(old_token.authorize(&reread, NOW).is_err());
        // Without files, nothing changes.
        assert!(
            old_token
                .authorize(
                    &static_auth.reread(&CredentialFiles::default()).unwrap(),
                    NOW
                )
                .is_ok()
        );
    }
}
