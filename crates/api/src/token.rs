//! Scoped router tokens: HMAC-SHA256 bearer tokens bound to one sandbox and an expiry.
//!
//! Minted by whoever hands an agent access to its sandbox (a platform backend, `sandboxctl`, a
//! test) with the signing key the router was given; verified locally by `sandbox-router --auth
//! scoped`, which refuses a valid token for another sandbox with 403. Pure functions: the caller
//! passes the current time, so minting and verifying need no clock and no IO.
//!
//! The format is upstream's `scoped-token` (kubernetes-sigs/agent-sandbox, router
//! `--authz-mode=scoped-token`), so tokens minted by either implementation verify in the other:
//!
//! ```text
//! v1.<payload>.<signature>
//! payload   = base64url-nopad(JSON {"ns": <namespace>, "name": <sandbox>, "exp": <unix seconds>})
//! signature = base64url-nopad(HMAC-SHA256(key, "agent-sandbox/scoped-token/v1." || payload))
//! ```
//!
//! The key is the secret's bytes with surrounding ASCII whitespace removed (a mounted Secret
//! often ends in a newline), at least [`MIN_KEY_BYTES`] long. A token is valid while
//! `now < exp`.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{KeyInit as _, Mac as _};
use serde::{Deserialize, Serialize};

/// The format version, the token's first dot-separated field.
pub const VERSION: &str = "v1";

/// Prefix of the MAC input: separates these signatures from any other use of the same key, and
/// binds them to [`VERSION`].
const MAC_CONTEXT: &[u8] = b"agent-sandbox/scoped-token/v1.";

/// Shortest accepted signing key, in bytes after trimming: the size of the HMAC-SHA256 output.
pub const MIN_KEY_BYTES: usize = 32;

/// Longest token [`verify`] looks at; anything longer is malformed without further work.
const MAX_TOKEN_BYTES: usize = 4096;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// What a scoped token grants: requests to one sandbox until an instant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Namespace of the sandbox.
    #[serde(rename = "ns")]
    pub namespace: String,
    /// Name of the sandbox.
    pub name: String,
    /// Expiry, Unix seconds; the token is valid strictly before it.
    #[serde(rename = "exp")]
    pub expires_at: i64,
}

impl Claims {
    /// Claims for `namespace/name` valid until `expires_at` (Unix seconds).
    pub fn new(namespace: impl Into<String>, name: impl Into<String>, expires_at: i64) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            expires_at,
        }
    }
}

/// Why a key, a token or claims were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// The signing key is shorter than [`MIN_KEY_BYTES`] after trimming whitespace.
    #[error(
        "scoped-token signing key must be at least {MIN_KEY_BYTES} bytes after trimming whitespace, got {len}"
    )]
    KeyTooShort {
        /// Length of the trimmed key.
        len: usize,
    },
    /// Minting was asked for claims without a namespace or name.
    #[error("scoped-token claims need a namespace and a name")]
    EmptyScope,
    /// The token is not `v1.<payload>.<signature>` with decodable parts.
    #[error("malformed scoped token")]
    Malformed,
    /// The signature does not match the payload under this key.
    #[error("scoped token signature does not match")]
    BadSignature,
    /// The token expired.
    #[error("scoped token for {namespace}/{name} expired at {expires_at} (Unix seconds)")]
    Expired {
        /// Namespace the token was for.
        namespace: String,
        /// Sandbox the token was for.
        name: String,
        /// Its expiry.
        expires_at: i64,
    },
}

/// The signing key in `raw` (a key file's bytes): surrounding ASCII whitespace removed, at least
/// [`MIN_KEY_BYTES`] long.
pub fn signing_key(raw: &[u8]) -> Result<&[u8], TokenError> {
    let key = raw.trim_ascii();
    if key.len() < MIN_KEY_BYTES {
        return Err(TokenError::KeyTooShort { len: key.len() });
    }
    Ok(key)
}

/// A token granting `claims`, signed with `key` (trimmed and checked as [`signing_key`] does).
pub fn mint(key: &[u8], claims: &Claims) -> Result<String, TokenError> {
    let key = signing_key(key)?;
    if claims.namespace.is_empty() || claims.name.is_empty() {
        return Err(TokenError::EmptyScope);
    }
    // Serializing a struct of two strings and an integer cannot fail; map it anyway rather than
    // assert.
    let json = serde_json::to_vec(claims).map_err(|_| TokenError::Malformed)?;
    let payload = URL_SAFE_NO_PAD.encode(json);
    let signature = URL_SAFE_NO_PAD.encode(mac(key, &payload)?.finalize().into_bytes());
    Ok(format!("{VERSION}.{payload}.{signature}"))
}

/// The claims of `token` if `key` signed it and it has not expired at `now` (Unix seconds).
///
/// The signature is checked (in constant time) before the payload is decoded, so an attacker
/// learns nothing from a forged token except that it is forged. The caller still has to compare
/// the claims with the sandbox the request is for.
pub fn verify(key: &[u8], token: &str, now: i64) -> Result<Claims, TokenError> {
    let key = signing_key(key)?;
    if token.len() > MAX_TOKEN_BYTES {
        return Err(TokenError::Malformed);
    }
    let mut parts = token.split('.');
    let (Some(version), Some(payload), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed);
    };
    if version != VERSION || payload.is_empty() {
        return Err(TokenError::Malformed);
    }
    let signature = URL_SAFE_NO_PAD
        .decode(signature)
        .map_err(|_| TokenError::Malformed)?;
    mac(key, payload)?
        .verify_slice(&signature)
        .map_err(|_| TokenError::BadSignature)?;
    let json = URL_SAFE_NO_PAD
        .decode(payload)
        .map_err(|_| TokenError::Malformed)?;
    let claims: Claims = serde_json::from_slice(&json).map_err(|_| TokenError::Malformed)?;
    if claims.namespace.is_empty() || claims.name.is_empty() {
        return Err(TokenError::Malformed);
    }
    if now >= claims.expires_at {
        return Err(TokenError::Expired {
            namespace: claims.namespace,
            name: claims.name,
            expires_at: claims.expires_at,
        });
    }
    Ok(claims)
}

fn mac(key: &[u8], payload: &str) -> Result<HmacSha256, TokenError> {
    // HMAC accepts keys of any length; the constructor's error exists for MACs that do not, and
    // would only mean the key was unusable.
    let mut mac =
        HmacSha256::new_from_slice(key).map_err(|_| TokenError::KeyTooShort { len: key.len() })?;
    mac.update(MAC_CONTEXT);
    mac.update(payload.as_bytes());
    Ok(mac)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    /// Computed independently (Python's `hmac` and `base64`) from the format in the module docs,
    /// so a change of field order, encoding or MAC context breaks this test.
    const VECTOR: &str = "v1.eyJucyI6ImRlZmF1bHQiLCJuYW1lIjoibXktc2FuZGJveCIsImV4cCI6MTg5MzQ1NjAwMH0.KA5cuEhiG4A7JuXID1bkRgc7JePtuETL6lrlXBTW0NQ";

    #[test]
    fn mints_the_reference_vector() {
        let token = mint(KEY, &Claims::new("default", "my-sandbox", 1_893_456_000)).unwrap();
        assert_eq!(token, VECTOR);
        assert_eq!(
            verify(KEY, VECTOR, 1_893_455_999).unwrap(),
            Claims::new("default", "my-sandbox", 1_893_456_000)
        );
    }

    #[test]
    fn keys_are_trimmed_and_must_be_long_enough() {
        let padded = b"  0123456789abcdef0123456789abcdef\n";
        assert_eq!(signing_key(padded).unwrap(), KEY);
        assert_eq!(
            mint(padded, &Claims::new("default", "my-sandbox", 1_893_456_000)).unwrap(),
            VECTOR
        );
        assert_eq!(
            signing_key(b"short key\n"),
            Err(TokenError::KeyTooShort { len: 9 })
        );
        assert_eq!(
            verify(b"short", VECTOR, 0),
            Err(TokenError::KeyTooShort { len: 5 })
        );
    }

    #[test]
    fn expiry_is_exclusive() {
        assert_eq!(
            verify(KEY, VECTOR, 1_893_456_000),
            Err(TokenError::Expired {
                namespace: "default".to_owned(),
                name: "my-sandbox".to_owned(),
                expires_at: 1_893_456_000,
            })
        );
    }

    #[test]
    fn another_key_or_a_changed_payload_is_a_bad_signature() {
        let other_key = b"fedcba9876543210fedcba9876543210";
        assert_eq!(verify(other_key, VECTOR, 0), Err(TokenError::BadSignature));
        // Same signature, payload for another sandbox.
        let forged_payload =
            URL_SAFE_NO_PAD.encode(br#"{"ns":"default","name":"other","exp":1893456000}"#);
        let signature = VECTOR.rsplit('.').next().unwrap();
        let forged = format!("v1.{forged_payload}.{signature}");
        assert_eq!(verify(KEY, &forged, 0), Err(TokenError::BadSignature));
    }

    #[test]
    fn malformed_tokens() {
        let too_long = "a".repeat(MAX_TOKEN_BYTES + 1);
        for token in [
            "",
            "v1",
            "v1.abc",
            "v2.eyJ9.abc",
            "v1..sig",
            "v1.a.b.c",
            "v1.eyJucyI6ImRlZmF1bHQifQ.!!!",
            too_long.as_str(),
        ] {
            assert_eq!(verify(KEY, token, 0), Err(TokenError::Malformed), "{token}");
        }
        // A correctly signed payload that is not the claims object.
        let payload = URL_SAFE_NO_PAD.encode(b"[1,2]");
        let signature = URL_SAFE_NO_PAD.encode(mac(KEY, &payload).unwrap().finalize().into_bytes());
        assert_eq!(
            verify(KEY, &format!("v1.{payload}.{signature}"), 0),
            Err(TokenError::Malformed)
        );
        // Signed claims with an empty name.
        let payload = URL_SAFE_NO_PAD.encode(br#"{"ns":"default","name":"","exp":10}"#);
        let signature = URL_SAFE_NO_PAD.encode(mac(KEY, &payload).unwrap().finalize().into_bytes());
        assert_eq!(
            verify(KEY, &format!("v1.{payload}.{signature}"), 0),
            Err(TokenError::Malformed)
        );
    }

    #[test]
    fn minting_needs_a_scope() {
        assert_eq!(
            mint(KEY, &Claims::new("", "x", 10)),
            Err(TokenError::EmptyScope)
        );
        assert_eq!(
            mint(KEY, &Claims::new("default", "", 10)),
            Err(TokenError::EmptyScope)
        );
    }
}
