//! The controller-wide pace of pool member creation: a token bucket, sans IO (the time is an
//! argument), shared by every pool reconcile through the [`crate::Context`].
//!
//! Without it a pool asking for many members was filled as fast as the API server answered
//! (~200 Sandboxes, and as many Pods, per second), crowding out every other writer.

use std::time::{Duration, Instant};

/// A token bucket: `per_second` tokens a second, holding at most `burst`.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    per_second: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket refilled at `per_second` (at least one), holding as many tokens.
    pub fn new(per_second: u32, now: Instant) -> Self {
        let per_second = f64::from(per_second.max(1));
        Self {
            per_second,
            burst: per_second,
            tokens: per_second,
            at: now,
        }
    }

    /// Takes a token at `now`, or says how long until one is there. Nothing is reserved while
    /// waiting, so a caller that gives up (its pool was deleted) costs nobody a token.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        if now > self.at {
            let refill = now.duration_since(self.at).as_secs_f64() * self.per_second;
            self.tokens = (self.tokens + refill).min(self.burst);
            self.at = now;
        }
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        let wait = (1.0 - self.tokens) / self.per_second;
        Err(Duration::try_from_secs_f64(wait).unwrap_or(Duration::from_secs(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(10, start);
        for _ in 0..10 {
            assert_eq!(bucket.take(start), Ok(()));
        }
        let wait = bucket.take(start).unwrap_err();
        assert!(
            wait > Duration::from_millis(99) && wait <= Duration::from_millis(100),
            "{wait:?}"
        );
        let later = start + Duration::from_millis(250);
        assert_eq!(bucket.take(later), Ok(()));
        assert_eq!(bucket.take(later), Ok(()));
        let wait = bucket.take(later).unwrap_err();
        assert!(
            wait > Duration::from_millis(49) && wait <= Duration::from_millis(50),
            "{wait:?}"
        );
        // A long idle time refills to the burst, no more.
        let idle = later + Duration::from_secs(3600);
        for _ in 0..10 {
            assert_eq!(bucket.take(idle), Ok(()));
        }
        assert!(bucket.take(idle).is_err());
        // A clock that goes back (another caller's older `now`) takes nothing extra.
        assert!(bucket.take(start).is_err());
    }

    #[test]
    fn a_zero_rate_is_one_per_second() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(0, start);
        assert_eq!(bucket.take(start), Ok(()));
        assert_eq!(bucket.take(start), Err(Duration::from_secs(1)));
    }
}
