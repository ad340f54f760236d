//! Retry decisions for the Messages API, sans IO: which answers are worth another attempt, and
//! how long to wait (the server's `retry-after` when it gives one, else capped exponential
//! backoff with jitter).

use std::time::Duration;

use jiff::Timestamp;

/// How often and how patiently the Messages API client retries: it counts *retries*, the
/// attempts after the first (unlike the SDK's `agent_sandbox::RetryPolicy`, which counts all
/// attempts), and backs off between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Retries after the first attempt (0: never retry).
    pub max_retries: u32,
    /// Backoff before the first retry when the server names no delay.
    pub initial_backoff: Duration,
    /// Cap on one backoff, and on a server-named delay.
    pub max_backoff: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            max_retries: 4,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(60),
        }
    }
}

/// Whether an HTTP status may succeed when sent again: request timeout, lock conflict, rate
/// limit (429), server errors and overload (529). `x-should-retry` from the server wins.
pub fn is_retryable(status: u16, should_retry: Option<&str>) -> bool {
    match should_retry.map(str::trim) {
        Some("true") => return true,
        Some("false") => return false,
        _ => {}
    }
    matches!(status, 408 | 409 | 429) || status >= 500
}

/// Parses `retry-after-ms` (milliseconds) or `retry-after` (seconds, or an HTTP date) into a
/// delay from `now`.
pub fn server_delay(
    retry_after_ms: Option<&str>,
    retry_after: Option<&str>,
    now: Timestamp,
) -> Option<Duration> {
    if let Some(ms) = retry_after_ms.and_then(|v| v.trim().parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    let value = retry_after?.trim();
    if let Ok(seconds) = value.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds));
    }
    let at = jiff::fmt::rfc2822::parse(value).ok()?.timestamp();
    let delta = at.duration_since(now);
    Some(Duration::try_from(delta).unwrap_or(Duration::ZERO))
}

/// The wait before retry number `retry` (1-based): the server's delay when given (capped),
/// else `initial * 2^(retry-1)` capped, scaled by `jitter` in `[0.5, 1.0]` so that many agents
/// hitting the same limit do not come back in lockstep.
pub fn backoff(policy: &Backoff, retry: u32, server: Option<Duration>, jitter: f64) -> Duration {
    if let Some(delay) = server {
        return delay.min(policy.max_backoff);
    }
    let exponent = retry.saturating_sub(1).min(20);
    let base = policy
        .initial_backoff
        .saturating_mul(1u32 << exponent)
        .min(policy.max_backoff);
    base.mul_f64(jitter.clamp(0.5, 1.0))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn retryable_statuses() {
        for status in [408, 409, 429, 500, 502, 503, 504, 529] {
            assert!(is_retryable(status, None), "{status}");
        }
        for status in [400, 401, 403, 404, 413] {
            assert!(!is_retryable(status, None), "{status}");
        }
        assert!(!is_retryable(529, Some("false")));
        assert!(is_retryable(400, Some("true")));
    }

    #[test]
    fn server_delay_forms() {
        let now: Timestamp = "2026-09-01T12:00:00Z".parse().unwrap();
        assert_eq!(
            server_delay(None, Some("3"), now),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            server_delay(None, Some("0.25"), now),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            server_delay(Some("1500"), Some("9"), now),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            server_delay(None, Some("Tue, 01 Sep 2026 12:00:07 GMT"), now),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            server_delay(None, Some("Tue, 01 Sep 2026 11:00:00 GMT"), now),
            Some(Duration::ZERO)
        );
        assert_eq!(server_delay(None, Some("soon"), now), None);
        assert_eq!(server_delay(None, Some("-1"), now), None);
        assert_eq!(server_delay(None, None, now), None);
    }

    #[test]
    fn backoff_grows_is_capped_and_prefers_the_server() {
        let policy = Backoff {
            max_retries: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
        };
        assert_eq!(backoff(&policy, 1, None, 1.0), Duration::from_millis(100));
        assert_eq!(backoff(&policy, 3, None, 1.0), Duration::from_millis(400));
        assert_eq!(backoff(&policy, 3, None, 0.5), Duration::from_millis(200));
        assert_eq!(backoff(&policy, 9, None, 1.0), Duration::from_secs(1));
        assert_eq!(
            backoff(&policy, 1, Some(Duration::from_millis(30)), 0.5),
            Duration::from_millis(30)
        );
        assert_eq!(
            backoff(&policy, 1, Some(Duration::from_secs(90)), 1.0),
            Duration::from_secs(1)
        );
    }
}
