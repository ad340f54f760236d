//! Authentication and per-sandbox authorization of requests, without IO: a decision from the
//! configured [`Auth`], the `Authorization` header, the sandbox the request addresses and the
//! current time.
//!
//! - `none`: everything passes.
//! - `token`: `Authorization: Bearer <token>` must equal the static token (constant-time
//!   comparison); otherwise 401.
//! - `scoped`: the bearer token must be a scoped token ([`agent_sandbox_api::token`]) signed with
//!   one of the keys; missing, forged, malformed or expired tokens get 401, a valid token for
//!   another sandbox gets 403.

use agent_sandbox_api::token::{self, TokenError};
use http::{HeaderMap, header};
use subtle::ConstantTimeEq as _;

use crate::config::Auth;
use crate::reject::{Reason, Rejection};

fn unauthenticated(detail: String) -> Rejection {
    Rejection::new(Reason::Unauthenticated, detail)
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

/// Whether a request with `headers` may reach sandbox `namespace/name` at `now` (Unix seconds).
pub(crate) fn authorize(
    auth: &Auth,
    headers: &HeaderMap,
    namespace: &str,
    name: &str,
    now: i64,
) -> Result<(), Rejection> {
    let sandbox = format!("{namespace}/{name}");
    let token = match auth {
        Auth::None => return Ok(()),
        Auth::Token(_) | Auth::Scoped(_) => bearer(headers).ok_or_else(|| {
            unauthenticated(format!(
                "A bearer token is required to reach sandbox {sandbox} (Authorization: Bearer ...)."
            ))
        })?,
    };
    match auth {
        Auth::None => Ok(()),
        Auth::Token(expected) => {
            if bool::from(token.as_bytes().ct_eq(expected.expose())) {
                Ok(())
            } else {
                Err(unauthenticated(format!(
                    "Invalid bearer token for sandbox {sandbox}."
                )))
            }
        }
        Auth::Scoped(keys) => {
            let mut expired = None;
            for key in keys {
                match token::verify(key.expose(), token, now) {
                    Ok(claims) if claims.namespace == namespace && claims.name == name => {
                        return Ok(());
                    }
                    Ok(claims) => {
                        return Err(Rejection::new(
                            Reason::Forbidden,
                            format!(
                                "The scoped token is for sandbox {}/{}, not for sandbox {sandbox}.",
                                claims.namespace, claims.name
                            ),
                        ));
                    }
                    Err(error @ TokenError::Expired { .. }) => expired = Some(error),
                    Err(_) => {}
                }
            }
            Err(unauthenticated(match expired {
                Some(TokenError::Expired {
                    namespace,
                    name,
                    expires_at,
                }) => format!(
                    "The scoped token for sandbox {namespace}/{name} expired at {expires_at} \
                     (Unix seconds); request for sandbox {sandbox}."
                ),
                _ => format!("Invalid scoped token for sandbox {sandbox}."),
            }))
        }
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

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
    const OLD_KEY: &[u8] = b"fedcba9876543210fedcba9876543210";
    const NOW: i64 = 1_800_000_000;

    fn with_auth(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    fn status(result: Result<(), Rejection>) -> StatusCode {
        result.map_or_else(|r| r.status, |()| StatusCode::OK)
    }

    #[test]
    fn none_lets_everything_through() {
        assert_eq!(
            status(authorize(
                &Auth::None,
                &HeaderMap::new(),
                "default",
                "a",
                NOW
            )),
            StatusCode::OK
        );
    }

    #[test]
    fn static_token() {
        let auth = Auth::Token(Secret::new(KEY));
        let check = |headers: &HeaderMap| status(authorize(&auth, headers, "default", "a", NOW));
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
        let missing = authorize(&auth, &HeaderMap::new(), "default", "a", NOW).unwrap_err();
        assert_eq!(missing.status, StatusCode::UNAUTHORIZED);
        assert!(missing.detail.contains("default/a"), "{}", missing.detail);
        let mut twice = with_auth("Bearer 0123456789abcdef0123456789abcdef");
        twice.append(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer 0123456789abcdef0123456789abcdef"),
        );
        assert_eq!(check(&twice), StatusCode::UNAUTHORIZED);
    }

    #[test]
    fn scoped_tokens() {
        let auth = Auth::Scoped(vec![Secret::new(KEY), Secret::new(OLD_KEY)]);
        let mint = |key: &[u8], ns: &str, name: &str, exp: i64| {
            format!(
                "Bearer {}",
                token::mint(key, &Claims::new(ns, name, exp)).unwrap()
            )
        };
        let check =
            |value: &str, ns: &str, name: &str| authorize(&auth, &with_auth(value), ns, name, NOW);

        assert_eq!(
            status(check(&mint(KEY, "team", "box", NOW + 60), "team", "box")),
            StatusCode::OK
        );
        // A token signed with the second (rotating) key.
        assert_eq!(
            status(check(
                &mint(OLD_KEY, "team", "box", NOW + 60),
                "team",
                "box"
            )),
            StatusCode::OK
        );
        let other = check(&mint(KEY, "team", "box", NOW + 60), "team", "other").unwrap_err();
        assert_eq!(other.status, StatusCode::FORBIDDEN);
        assert_eq!(
            other.detail,
            "The scoped token is for sandbox team/box, not for sandbox team/other."
        );
        assert_eq!(
            status(check(
                &mint(KEY, "team", "box", NOW + 60),
                "other-team",
                "box"
            )),
            StatusCode::FORBIDDEN
        );
        let expired = check(&mint(KEY, "team", "box", NOW), "team", "box").unwrap_err();
        assert_eq!(expired.status, StatusCode::UNAUTHORIZED);
        assert!(expired.detail.contains("expired"), "{}", expired.detail);
        let forged = mint(b"an attacker's key of 32 bytes!!!", "team", "box", NOW + 60);
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
}
