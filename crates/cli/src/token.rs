//! Scoped router tokens for one sandbox (the format is `agent_sandbox_api::token`'s).

use std::time::Duration;

use agent_sandbox_api::token::Claims;

use crate::error::{Error, Result};

/// A token for `namespace/sandbox`, valid for `ttl` from now, signed with `key`.
pub fn mint(key: &[u8], namespace: &str, sandbox: &str, ttl: Duration) -> Result<String> {
    let ttl = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
    let expires_at = jiff::Timestamp::now().as_second().saturating_add(ttl);
    agent_sandbox_api::token::mint(key, &Claims::new(namespace, sandbox, expires_at)).map_err(
        |source| Error::Token {
            namespace: namespace.to_owned(),
            sandbox: sandbox.to_owned(),
            source,
        },
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn minted_tokens_verify_for_their_sandbox_until_expiry() {
        let key = [7_u8; 32];
        let token = mint(&key, "team-a", "box-1", Duration::from_secs(60)).unwrap();
        let now = jiff::Timestamp::now().as_second();
        let claims = agent_sandbox_api::token::verify(&key, &token, now).unwrap();
        assert_eq!(
            (claims.namespace.as_str(), claims.name.as_str()),
            ("team-a", "box-1")
        );
        assert!(agent_sandbox_api::token::verify(&key, &token, now + 61).is_err());
    }

    #[test]
    fn short_keys_are_refused() {
        assert!(mint(b"short", "ns", "box", Duration::from_secs(1)).is_err());
    }
}
