//! Scoped router tokens: a token that opens one sandbox until it expires, signed with the
//! router's key (the format is `agent_sandbox_api::token`'s). Used by the transport for
//! [`ClientOptions::router_signing_key`](crate::ClientOptions::router_signing_key) and offered to
//! callers that hand a token to someone else (`sandboxctl token`).

use std::time::Duration;

use jiff::Timestamp;

use crate::error::{Error, Result};
use crate::options::expiry;

/// Mints a scoped router token for `namespace/sandbox`, valid for `ttl` (at most
/// [`MAX_TTL`](crate::MAX_TTL)), signed with `key` (the router's signing key, at least 32 bytes).
pub fn mint_token(key: &[u8], namespace: &str, sandbox: &str, ttl: Duration) -> Result<String> {
    let expires = expiry("token ttl", Timestamp::now(), ttl)?.as_second();
    let token_error = |source| Error::Token {
        namespace: namespace.to_owned(),
        sandbox: sandbox.to_owned(),
        source,
    };
    let key = agent_sandbox_api::token::signing_key(key).map_err(token_error)?;
    agent_sandbox_api::token::mint(
        key,
        &agent_sandbox_api::token::Claims::new(namespace, sandbox, expires),
    )
    .map_err(token_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_tokens_verify_for_their_sandbox_until_expiry() {
        let key = [7_u8; 32];
        let token = mint_token(&key, "team-a", "box-1", Duration::from_secs(60)).unwrap();
        let now = Timestamp::now().as_second();
        let claims = agent_sandbox_api::token::verify(&key, &token, now).unwrap();
        assert_eq!(
            (claims.namespace.as_str(), claims.name.as_str()),
            ("team-a", "box-1")
        );
        assert!(agent_sandbox_api::token::verify(&key, &token, now + 61).is_err());
    }

    #[test]
    fn short_keys_are_refused() {
        assert!(mint_token(b"short", "ns", "box", Duration::from_secs(1)).is_err());
    }
}
