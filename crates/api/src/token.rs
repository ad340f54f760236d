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
//!
//! [`v2`] is upstream's newer format: Ed25519 signatures (so the router holds only public keys)
//! over claims bound to one request target (sandbox UID, port, method and path as well).

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
    /// A v2 verification key file (`{"keys":[{"kid","publicKey"}]}`) cannot be used.
    #[error("invalid scoped-token v2 verification key file: {reason}")]
    KeyFile {
        /// What is wrong, naming the key when there is one.
        reason: String,
    },
    /// A v2 key ID is empty, longer than 128 characters, or has characters other than ASCII
    /// letters, digits, `-` and `_`.
    #[error("invalid scoped-token key ID {kid:?}: use 1 to 128 ASCII letters, digits, '-' or '_'")]
    InvalidKeyId {
        /// The key ID.
        kid: String,
    },
    /// A v2 token names a key ID the verifier does not hold.
    #[error("scoped token signed with unknown key ID {kid:?}")]
    UnknownKeyId {
        /// The key ID.
        kid: String,
    },
    /// A v2 private key (signing seed) cannot be used.
    #[error("invalid scoped-token v2 private key: {reason}")]
    PrivateKey {
        /// What is wrong.
        reason: String,
    },
    /// A v2 request target cannot be normalised (minting, or a request the router cannot name).
    #[error("invalid scoped-token target: {reason}")]
    InvalidTarget {
        /// What is wrong.
        reason: &'static str,
    },
    /// A valid v2 token bound to another target than the request's.
    #[error("scoped token is bound to {field} {claimed:?}, the request has {requested:?}")]
    TargetMismatch {
        /// The claim that differs (`namespace`, `name`, `uid`, `port`, `method`, `path`).
        field: &'static str,
        /// The token's value.
        claimed: String,
        /// The request's value.
        requested: String,
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

/// Upstream's scoped tokens v2: Ed25519-signed claims bound to one request target.
///
/// ```text
/// v2.<kid>.<payload>.<signature>
/// kid       = 1 to 128 of [A-Za-z0-9_-], naming the verification key
/// payload   = base64url-nopad(JSON {"ns", "name", "uid", "port", "method", "path", "exp"})
/// signature = base64url-nopad(Ed25519(private key, "agent-sandbox/scoped-token/v2." || kid || "." || payload))
/// ```
///
/// The signature covers the key ID, so a token cannot be pointed at another key. The target is
/// compared in its normal form ([`v2::Target::normalize`]): method upper-cased, path
/// percent-escaped with upper-case hex digits and without the query. A token is valid while
/// `now < exp`.
///
/// Verification keys come from a JSON key set ([`v2::VerificationKeys::parse`]), parsed as
/// strictly as upstream's router parses it. Private keys ([`v2::PrivateKey`]) are 32-byte Ed25519
/// seeds, stored as unpadded base64url text; the router never needs one.
pub mod v2 {
    use std::collections::BTreeMap;

    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use ed25519_dalek::{Signer as _, Verifier as _};
    use serde::{Deserialize, Serialize};

    use super::{MAX_TOKEN_BYTES, TokenError};

    /// The format version, the token's first dot-separated field.
    pub const VERSION: &str = "v2";

    /// Prefix of the signed bytes; the key ID, a dot and the payload follow.
    const SIGNING_CONTEXT: &str = "agent-sandbox/scoped-token/v2.";

    /// Longest key ID.
    pub const MAX_KEY_ID_LEN: usize = 128;

    /// Whether `kid` is a valid key ID: 1 to [`MAX_KEY_ID_LEN`] ASCII letters, digits, `-`, `_`.
    pub fn is_key_id(kid: &str) -> bool {
        (1..=MAX_KEY_ID_LEN).contains(&kid.len())
            && kid
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    }

    fn check_key_id(kid: &str) -> Result<(), TokenError> {
        if is_key_id(kid) {
            Ok(())
        } else {
            Err(TokenError::InvalidKeyId {
                kid: kid.to_owned(),
            })
        }
    }

    /// The request a v2 token is for, as the router sees it (or as a minter names it).
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Target {
        /// Namespace of the sandbox.
        pub namespace: String,
        /// Name of the sandbox.
        pub name: String,
        /// UID of the sandbox.
        pub uid: String,
        /// Port in the sandbox's pod.
        pub port: u16,
        /// HTTP method.
        pub method: String,
        /// Path the sandbox receives, as sent (percent-encoded), without the query.
        pub path: String,
    }

    impl Target {
        /// The normal form claims are compared in: the method trimmed and upper-cased (and a
        /// valid token), the path percent-escaped as Go's `url.URL.EscapedPath` escapes it, with
        /// upper-case hex digits, `/` when empty.
        pub fn normalize(&self) -> Result<Self, TokenError> {
            let method = self.method.trim().to_ascii_uppercase();
            if method.is_empty() || !method.bytes().all(is_method_byte) {
                return Err(TokenError::InvalidTarget {
                    reason: "the HTTP method is not a valid token",
                });
            }
            if self.namespace.is_empty() || self.name.is_empty() {
                return Err(TokenError::InvalidTarget {
                    reason: "the namespace and the sandbox name are required",
                });
            }
            if self.port == 0 {
                return Err(TokenError::InvalidTarget {
                    reason: "the port must be between 1 and 65535",
                });
            }
            Ok(Self {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                uid: self.uid.clone(),
                port: self.port,
                method,
                path: normalize_path(&self.path)?,
            })
        }
    }

    fn is_method_byte(b: u8) -> bool {
        b.is_ascii_uppercase() || b.is_ascii_digit() || b"!#$%&'*+-.^_`|~".contains(&b)
    }

    /// Bytes a path keeps unescaped when it is escaped afresh.
    fn keeps_in_path(b: u8) -> bool {
        b.is_ascii_alphanumeric() || b"-_.~$&+,/:;=@".contains(&b)
    }

    /// Bytes a path sent by a client may carry as they are (besides `%xx`): what
    /// [`keeps_in_path`] keeps, the other sub-delimiters, and brackets.
    fn allowed_as_sent(b: u8) -> bool {
        keeps_in_path(b) || b"!'()*[]%".contains(&b)
    }

    fn hex_value(b: u8) -> Option<u8> {
        match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'a'..=b'f' => Some(b - b'a' + 10),
            b'A'..=b'F' => Some(b - b'A' + 10),
            _ => None,
        }
    }

    /// The normal form of a request path (see [`Target::normalize`]): a path that only carries
    /// characters allowed in a path stays as sent; otherwise it is decoded and escaped afresh.
    /// Either way `%xx` escapes get upper-case hex digits.
    pub fn normalize_path(path: &str) -> Result<String, TokenError> {
        if path.is_empty() {
            return Ok("/".to_owned());
        }
        if !path.starts_with('/') {
            return Err(TokenError::InvalidTarget {
                reason: "the path must start with '/'",
            });
        }
        let bytes = path.as_bytes();
        let mut decoded = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' {
                let value = bytes
                    .get(i + 1)
                    .and_then(|&h| hex_value(h))
                    .zip(bytes.get(i + 2).and_then(|&l| hex_value(l)));
                let Some((high, low)) = value else {
                    return Err(TokenError::InvalidTarget {
                        reason: "the path has an invalid percent-encoding",
                    });
                };
                decoded.push(high << 4 | low);
                i += 3;
            } else {
                decoded.push(bytes[i]);
                i += 1;
            }
        }
        let mut out = String::with_capacity(path.len());
        if bytes.iter().all(|&b| allowed_as_sent(b)) {
            let mut i = 0;
            while i < bytes.len() {
                out.push(char::from(bytes[i]));
                if bytes[i] == b'%' {
                    out.push(char::from(bytes[i + 1].to_ascii_uppercase()));
                    out.push(char::from(bytes[i + 2].to_ascii_uppercase()));
                    i += 3;
                } else {
                    i += 1;
                }
            }
        } else {
            for b in decoded {
                if keeps_in_path(b) {
                    out.push(char::from(b));
                } else {
                    out.push_str(&format!("%{b:02X}"));
                }
            }
        }
        Ok(out)
    }

    /// What a v2 token grants: one request target until an instant.
    #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(default)]
    pub struct Claims {
        /// Namespace of the sandbox.
        #[serde(rename = "ns")]
        pub namespace: String,
        /// Name of the sandbox.
        pub name: String,
        /// UID of the sandbox.
        pub uid: String,
        /// Port in the sandbox's pod (an integer on the wire; out-of-range values match nothing).
        pub port: i64,
        /// HTTP method, upper case.
        pub method: String,
        /// Normalised path, without the query.
        pub path: String,
        /// Expiry, Unix seconds; the token is valid strictly before it.
        #[serde(rename = "exp")]
        pub expires_at: i64,
    }

    impl Claims {
        /// Claims for `target` (normalised) valid until `expires_at` (Unix seconds).
        pub fn for_target(target: &Target, expires_at: i64) -> Result<Self, TokenError> {
            let target = target.normalize()?;
            if target.uid.is_empty() {
                return Err(TokenError::InvalidTarget {
                    reason: "the sandbox UID is required",
                });
            }
            Ok(Self {
                namespace: target.namespace,
                name: target.name,
                uid: target.uid,
                port: i64::from(target.port),
                method: target.method,
                path: target.path,
                expires_at,
            })
        }

        /// Whether these claims are for `target`; the first claim that differs otherwise. The
        /// target is normalised first; an empty UID never matches.
        pub fn check(&self, target: &Target) -> Result<(), TokenError> {
            let target = target.normalize()?;
            let port = target.port.to_string();
            let claimed_port = self.port.to_string();
            for (field, claimed, requested) in [
                (
                    "namespace",
                    self.namespace.as_str(),
                    target.namespace.as_str(),
                ),
                ("name", self.name.as_str(), target.name.as_str()),
                ("uid", self.uid.as_str(), target.uid.as_str()),
                ("port", claimed_port.as_str(), port.as_str()),
                ("method", self.method.as_str(), target.method.as_str()),
                ("path", self.path.as_str(), target.path.as_str()),
            ] {
                if claimed != requested || (field == "uid" && requested.is_empty()) {
                    return Err(TokenError::TargetMismatch {
                        field,
                        claimed: claimed.to_owned(),
                        requested: requested.to_owned(),
                    });
                }
            }
            Ok(())
        }
    }

    /// An Ed25519 signing key (the minter's; never the router's).
    #[derive(Clone)]
    pub struct PrivateKey(ed25519_dalek::SigningKey);

    impl std::fmt::Debug for PrivateKey {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("PrivateKey(<redacted>)")
        }
    }

    impl PrivateKey {
        /// The key of a 32-byte seed.
        pub fn from_seed(seed: [u8; 32]) -> Self {
            Self(ed25519_dalek::SigningKey::from_bytes(&seed))
        }

        /// A private key file's text: the 32-byte seed as unpadded base64url, surrounding
        /// whitespace ignored.
        pub fn parse(text: &[u8]) -> Result<Self, TokenError> {
            let seed = URL_SAFE_NO_PAD.decode(text.trim_ascii()).map_err(|error| {
                TokenError::PrivateKey {
                    reason: format!("expected a 32-byte seed as unpadded base64url: {error}"),
                }
            })?;
            let seed: [u8; 32] =
                seed.try_into()
                    .map_err(|seed: Vec<u8>| TokenError::PrivateKey {
                        reason: format!("the seed must be 32 bytes, got {}", seed.len()),
                    })?;
            Ok(Self::from_seed(seed))
        }

        /// The public key, unpadded base64url, as a key file's `publicKey` holds it.
        pub fn public_key(&self) -> String {
            URL_SAFE_NO_PAD.encode(self.0.verifying_key().as_bytes())
        }

        /// A key file (`{"keys":[{"kid","publicKey"}]}`) with this key's public half as `kid`.
        pub fn key_file(&self, kid: &str) -> Result<String, TokenError> {
            check_key_id(kid)?;
            Ok(
                serde_json::json!({"keys": [{"kid": kid, "publicKey": self.public_key()}]})
                    .to_string(),
            )
        }
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct KeyFile {
        keys: Vec<KeyEntry>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct KeyEntry {
        kid: String,
        #[serde(rename = "publicKey")]
        public_key: String,
    }

    /// The public keys a router verifies v2 tokens with, by key ID.
    #[derive(Clone, Default, PartialEq, Eq)]
    pub struct VerificationKeys(BTreeMap<String, ed25519_dalek::VerifyingKey>);

    impl std::fmt::Debug for VerificationKeys {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_tuple("VerificationKeys")
                .field(&self.0.keys().collect::<Vec<_>>())
                .finish()
        }
    }

    impl VerificationKeys {
        /// A key file's JSON, `{"keys":[{"kid":"...","publicKey":"<base64url, 32 bytes>"}]}`:
        /// no other fields, nothing after the object, at least one key, no key ID twice, every
        /// key a valid Ed25519 public key.
        pub fn parse(json: &[u8]) -> Result<Self, TokenError> {
            let file: KeyFile =
                serde_json::from_slice(json).map_err(|error| TokenError::KeyFile {
                    reason: error.to_string(),
                })?;
            if file.keys.is_empty() {
                return Err(TokenError::KeyFile {
                    reason: "it must hold at least one key".to_owned(),
                });
            }
            let mut keys = BTreeMap::new();
            for entry in file.keys {
                check_key_id(&entry.kid)?;
                if keys.contains_key(&entry.kid) {
                    return Err(TokenError::KeyFile {
                        reason: format!("key ID {:?} appears twice", entry.kid),
                    });
                }
                let bytes = URL_SAFE_NO_PAD.decode(&entry.public_key).map_err(|error| {
                    TokenError::KeyFile {
                        reason: format!(
                            "publicKey of {:?} is not unpadded base64url: {error}",
                            entry.kid
                        ),
                    }
                })?;
                let bytes: [u8; 32] =
                    bytes
                        .try_into()
                        .map_err(|bytes: Vec<u8>| TokenError::KeyFile {
                            reason: format!(
                                "publicKey of {:?} must be 32 bytes, got {}",
                                entry.kid,
                                bytes.len()
                            ),
                        })?;
                let key = ed25519_dalek::VerifyingKey::from_bytes(&bytes).map_err(|_| {
                    TokenError::KeyFile {
                        reason: format!(
                            "publicKey of {:?} is not an Ed25519 public key",
                            entry.kid
                        ),
                    }
                })?;
                keys.insert(entry.kid, key);
            }
            Ok(Self(keys))
        }

        /// Whether no key is held (v2 verification is off).
        pub fn is_empty(&self) -> bool {
            self.0.is_empty()
        }

        /// Number of keys.
        pub fn len(&self) -> usize {
            self.0.len()
        }

        /// The key IDs, sorted.
        pub fn key_ids(&self) -> impl Iterator<Item = &str> {
            self.0.keys().map(String::as_str)
        }
    }

    fn signed_bytes(kid: &str, payload: &str) -> Vec<u8> {
        format!("{SIGNING_CONTEXT}{kid}.{payload}").into_bytes()
    }

    /// A v2 token granting `claims`, signed with `key` under key ID `kid`.
    pub fn mint(key: &PrivateKey, kid: &str, claims: &Claims) -> Result<String, TokenError> {
        check_key_id(kid)?;
        if claims.namespace.is_empty() || claims.name.is_empty() || claims.uid.is_empty() {
            return Err(TokenError::EmptyScope);
        }
        // Serializing strings and integers cannot fail; map it anyway rather than assert.
        let json = serde_json::to_vec(claims).map_err(|_| TokenError::Malformed)?;
        let payload = URL_SAFE_NO_PAD.encode(json);
        let signature = key.0.sign(&signed_bytes(kid, &payload));
        Ok(format!(
            "{VERSION}.{kid}.{payload}.{}",
            URL_SAFE_NO_PAD.encode(signature.to_bytes())
        ))
    }

    /// The claims of `token` if one of `keys` signed it under its key ID and it has not expired
    /// at `now` (Unix seconds). The caller still has to [`Claims::check`] them against the
    /// request.
    pub fn verify(keys: &VerificationKeys, token: &str, now: i64) -> Result<Claims, TokenError> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(TokenError::Malformed);
        }
        let mut parts = token.split('.');
        let (Some(version), Some(kid), Some(payload), Some(signature), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(TokenError::Malformed);
        };
        if version != VERSION {
            return Err(TokenError::Malformed);
        }
        let Some(key) = keys.0.get(kid) else {
            return Err(TokenError::UnknownKeyId {
                kid: kid.chars().take(MAX_KEY_ID_LEN).collect(),
            });
        };
        let signature = URL_SAFE_NO_PAD
            .decode(signature)
            .ok()
            .and_then(|bytes| ed25519_dalek::Signature::from_slice(&bytes).ok())
            .ok_or(TokenError::Malformed)?;
        key.verify(&signed_bytes(kid, payload), &signature)
            .map_err(|_| TokenError::BadSignature)?;
        let json = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| TokenError::Malformed)?;
        let claims: Claims = serde_json::from_slice(&json).map_err(|_| TokenError::Malformed)?;
        if claims.uid.is_empty() {
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

    mod v2 {
        use super::super::v2::*;
        use super::super::{MAX_TOKEN_BYTES, TokenError};
        use pretty_assertions::assert_eq;

        /// Seed 0, 1, ..., 31; the public key, token and paths below were computed with Go's
        /// standard library (`crypto/ed25519`, `encoding/base64`, `net/url`) from the format in
        /// the module docs, independently of this code.
        const SEED: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8";
        const PUBLIC: &str = "A6EHv_POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg";
        const VECTOR: &str = "v2.2026-08.eyJucyI6ImRlZmF1bHQiLCJuYW1lIjoibXktc2FuZGJveCIsInVpZCI6InUtMSIsInBvcnQiOjg4ODgsIm1ldGhvZCI6IlBPU1QiLCJwYXRoIjoiL2V4ZWN1dGUiLCJleHAiOjE4OTM0NTYwMDB9.fAenTIP3TK1u4bRBqMfe4Anwyxe6_BjqgJY15mvxPDruL59ch0fg-P0D_RiOQrWDK3sTQb6eK3ReBpWOvAqABQ";
        const EXP: i64 = 1_893_456_000;

        fn key() -> PrivateKey {
            PrivateKey::parse(format!("{SEED}\n").as_bytes()).unwrap()
        }

        fn keys() -> VerificationKeys {
            VerificationKeys::parse(
                format!(r#"{{"keys":[{{"kid":"2026-08","publicKey":"{PUBLIC}"}}]}}"#).as_bytes(),
            )
            .unwrap()
        }

        fn target() -> Target {
            Target {
                namespace: "default".to_owned(),
                name: "my-sandbox".to_owned(),
                uid: "u-1".to_owned(),
                port: 8888,
                method: "post".to_owned(),
                path: "/execute".to_owned(),
            }
        }

        #[test]
        fn mints_and_verifies_the_reference_vector() {
            assert_eq!(key().public_key(), PUBLIC);
            let claims = Claims::for_target(&target(), EXP).unwrap();
            assert_eq!(mint(&key(), "2026-08", &claims).unwrap(), VECTOR);
            let verified = verify(&keys(), VECTOR, EXP - 1).unwrap();
            assert_eq!(verified, claims);
            assert_eq!(verified.check(&target()), Ok(()));
            assert_eq!(
                VerificationKeys::parse(key().key_file("2026-08").unwrap().as_bytes()).unwrap(),
                keys()
            );
        }

        #[test]
        fn expiry_forgery_and_unknown_keys() {
            assert!(matches!(
                verify(&keys(), VECTOR, EXP),
                Err(TokenError::Expired {
                    expires_at: EXP,
                    ..
                })
            ));
            // The key ID is signed: pointing the token at another ID fails even with the key.
            let other = VerificationKeys::parse(
                format!(r#"{{"keys":[{{"kid":"other","publicKey":"{PUBLIC}"}}]}}"#).as_bytes(),
            )
            .unwrap();
            let renamed = VECTOR.replacen("2026-08", "other", 1);
            assert_eq!(verify(&other, &renamed, 0), Err(TokenError::BadSignature));
            assert_eq!(
                verify(&other, VECTOR, 0),
                Err(TokenError::UnknownKeyId {
                    kid: "2026-08".to_owned()
                })
            );
            let stranger = PrivateKey::from_seed([7; 32]);
            let forged = mint(
                &stranger,
                "2026-08",
                &Claims::for_target(&target(), EXP).unwrap(),
            )
            .unwrap();
            assert_eq!(verify(&keys(), &forged, 0), Err(TokenError::BadSignature));
            let too_long = "v2.".repeat(MAX_TOKEN_BYTES);
            for malformed in [
                "",
                "v2.2026-08.abc",
                "v1.2026-08.a.b",
                "v2.2026-08.a.b.c",
                "v2.2026-08.eyJ9.!!!",
                too_long.as_str(),
            ] {
                assert!(
                    matches!(
                        verify(&keys(), malformed, 0),
                        Err(TokenError::Malformed | TokenError::UnknownKeyId { .. })
                    ),
                    "{malformed}"
                );
            }
        }

        #[test]
        fn every_bound_field_is_checked() {
            let claims = Claims::for_target(&target(), EXP).unwrap();
            type Change = fn(&mut Target);
            let cases: [(&str, Change); 7] = [
                ("namespace", |t| t.namespace = "other".to_owned()),
                ("name", |t| t.name = "other".to_owned()),
                ("uid", |t| t.uid = "u-2".to_owned()),
                ("uid", |t| t.uid = String::new()),
                ("port", |t| t.port = 9000),
                ("method", |t| t.method = "GET".to_owned()),
                ("path", |t| t.path = "/upload".to_owned()),
            ];
            for (field, change) in cases {
                let mut request = target();
                change(&mut request);
                assert!(
                    matches!(claims.check(&request), Err(TokenError::TargetMismatch { field: f, .. }) if f == field),
                    "{field}: {:?}",
                    claims.check(&request)
                );
            }
            // The query is never part of the target: the router passes the path alone.
            let mut request = target();
            request.method = " Post ".to_owned();
            assert_eq!(claims.check(&request), Ok(()));
        }

        #[test]
        fn paths_are_normalised_as_go_escapes_them() {
            for (raw, normal) in [
                ("", "/"),
                ("/", "/"),
                ("/execute", "/execute"),
                ("/download/a%2fb", "/download/a%2Fb"),
                ("/a b", "/a%20b"),
                ("/x%20y", "/x%20y"),
                ("/caf\u{e9}", "/caf%C3%A9"),
                ("/q?x", "/q%3Fx"),
                ("/a!'()*[]", "/a!'()*[]"),
                ("/%7e~", "/%7E~"),
                ("/a\"b", "/a%22b"),
                ("/a{b}", "/a%7Bb%7D"),
                ("/a|b^", "/a%7Cb%5E"),
                ("/a;b,c=d@e:f+g$h&i", "/a;b,c=d@e:f+g$h&i"),
            ] {
                assert_eq!(normalize_path(raw).unwrap(), normal, "{raw:?}");
            }
            for bad in ["/%zz", "/%4", "relative"] {
                assert!(
                    matches!(normalize_path(bad), Err(TokenError::InvalidTarget { .. })),
                    "{bad}"
                );
            }
        }

        #[test]
        fn key_files_are_parsed_strictly() {
            let entry = format!(r#"{{"kid":"a","publicKey":"{PUBLIC}"}}"#);
            assert_eq!(
                VerificationKeys::parse(format!(r#"{{"keys":[{entry}]}}"#).as_bytes())
                    .unwrap()
                    .key_ids()
                    .collect::<Vec<_>>(),
                ["a"]
            );
            for (bad, says) in [
                (r#"{"keys":[]}"#.to_owned(), "at least one key"),
                (format!(r#"{{"keys":[{entry},{entry}]}}"#), "twice"),
                (format!(r#"{{"keys":[{entry}]}} {{}}"#), "trailing"),
                (
                    format!(r#"{{"keys":[{entry}],"extra":1}}"#),
                    "unknown field",
                ),
                (
                    format!(r#"{{"keys":[{{"kid":"a","publicKey":"{PUBLIC}","use":"sig"}}]}}"#),
                    "unknown field",
                ),
                (
                    r#"{"keys":[{"kid":"a","publicKey":"AAAA"}]}"#.to_owned(),
                    "must be 32 bytes",
                ),
                (
                    format!(r#"{{"keys":[{{"kid":"a","publicKey":"{PUBLIC}="}}]}}"#),
                    "base64url",
                ),
                (r#"{"keys":[{"kid":"a"}]}"#.to_owned(), "publicKey"),
                (String::new(), "EOF"),
            ] {
                let error = VerificationKeys::parse(bad.as_bytes()).unwrap_err();
                assert!(error.to_string().contains(says), "{bad}: {error}");
            }
            for kid in ["", "a.b", "a b", &"k".repeat(129)] {
                let file = format!(r#"{{"keys":[{{"kid":"{kid}","publicKey":"{PUBLIC}"}}]}}"#);
                assert_eq!(
                    VerificationKeys::parse(file.as_bytes()),
                    Err(TokenError::InvalidKeyId {
                        kid: kid.to_owned()
                    })
                );
            }
            assert!(is_key_id(&"k".repeat(128)));
        }

        #[test]
        fn private_keys_are_32_byte_seeds() {
            assert!(PrivateKey::parse(b"AAAA").is_err());
            assert!(PrivateKey::parse(b"not base64!").is_err());
            assert!(!format!("{:?}", key()).contains(SEED));
            assert!(matches!(
                mint(
                    &key(),
                    "bad kid",
                    &Claims::for_target(&target(), EXP).unwrap()
                ),
                Err(TokenError::InvalidKeyId { .. })
            ));
            let mut no_uid = target();
            no_uid.uid = String::new();
            assert!(matches!(
                Claims::for_target(&no_uid, EXP),
                Err(TokenError::InvalidTarget { .. })
            ));
        }
    }
}
