//! Bounded polling: [`wait_for`] looks at a condition until it holds or a limit passes, and its
//! [`Timeout`] says what was awaited, for how long, and what the last look saw (so that a slow
//! cluster can be told from a stuck one).

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// What one look at an awaited condition saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check<T> {
    /// It holds; the wait returns this.
    Done(T),
    /// Not yet; what was seen instead (quoted in the timeout message).
    NotYet(String),
}

impl<T> Check<T> {
    /// `Done(value)` when `value` is `Some`, else `NotYet(seen)`.
    pub fn from_option(value: Option<T>, seen: impl FnOnce() -> String) -> Self {
        match value {
            Some(value) => Self::Done(value),
            None => Self::NotYet(seen()),
        }
    }
}

/// An awaited condition did not hold in time.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("timed out after {after:?} waiting for {what}; last seen: {last}")]
pub struct Timeout {
    /// What was awaited (`SandboxWarmPool default/python-sandbox-pool to have 2 ready sandboxes`).
    pub what: String,
    /// How long.
    pub after: Duration,
    /// What the last look saw.
    pub last: String,
}

/// First pause between looks; it doubles up to [`MAX_PAUSE`]. Short, because most waits in
/// tests are over in milliseconds.
const FIRST_PAUSE: Duration = Duration::from_millis(10);
/// Longest pause between looks.
const MAX_PAUSE: Duration = Duration::from_millis(250);

/// Looks at a condition with `probe` until it returns [`Check::Done`], at most `limit`.
///
/// A probe error ends the wait at once (the condition cannot be looked at); running out of time
/// is [`Timeout`], converted into the caller's error type (`Timeout` itself, this crate's
/// [`Error`](crate::Error), `anyhow::Error`, ...).
pub async fn wait_for<T, E, F, Fut>(what: &str, limit: Duration, mut probe: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Check<T>, E>>,
    E: From<Timeout>,
{
    let deadline = Instant::now() + limit;
    let mut pause = FIRST_PAUSE;
    loop {
        let last = match probe().await? {
            Check::Done(value) => return Ok(value),
            Check::NotYet(seen) => seen,
        };
        if Instant::now() >= deadline {
            return Err(Timeout {
                what: what.to_owned(),
                after: limit,
                last,
            }
            .into());
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[tokio::test]
    async fn returns_what_the_probe_found_once_it_holds() {
        let mut looks = 0;
        let found: Result<u32, Timeout> = wait_for("three looks", Duration::from_secs(5), || {
            looks += 1;
            let seen = looks;
            async move {
                Ok(if seen >= 3 {
                    Check::Done(seen)
                } else {
                    Check::NotYet(format!("look {seen}"))
                })
            }
        })
        .await;
        assert_eq!(found, Ok(3));
    }

    #[tokio::test]
    async fn a_timeout_says_what_was_awaited_and_last_seen() {
        let error = wait_for::<(), Timeout, _, _>("nothing", Duration::ZERO, || async {
            Ok(Check::NotYet("still nothing".to_owned()))
        })
        .await
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "timed out after 0ns waiting for nothing; last seen: still nothing"
        );
    }

    #[tokio::test]
    async fn a_probe_error_ends_the_wait_at_once() {
        #[derive(Debug, PartialEq)]
        enum Failure {
            Probe,
            Timeout,
        }
        impl From<Timeout> for Failure {
            fn from(_: Timeout) -> Self {
                Self::Timeout
            }
        }
        let result = wait_for::<(), Failure, _, _>("x", Duration::from_secs(60), || async {
            Err(Failure::Probe)
        })
        .await;
        assert_eq!(result, Err(Failure::Probe));
    }
}
