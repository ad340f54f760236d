//! Pacing, sans IO where it can be (the time is an argument):
//!
//! - [`TokenBucket`]: the primitive;
//! - [`PoolPacing`]: how fast pool members are created: the controller-wide bucket
//!   (`--sandbox-warm-pool-max-create-rate`), a bucket per pool
//!   (`--sandbox-warm-pool-max-refill-rate`) and the hold after members leave a pool
//!   (`--sandbox-warm-pool-replenish-delay`), shared by every pool reconcile through the
//!   [`crate::Context`];
//! - [`ApiRateLimit`]: the client-side limit of every API request (`--kube-api-qps`,
//!   `--kube-api-burst`), a tower layer on the kube client's service.
//!
//! Without the creation pace a pool asking for many members was filled as fast as the API server
//! answered (~200 Sandboxes, and as many Pods, per second), crowding out every other writer.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
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
        let per_second = per_second.max(1);
        Self::with_burst(f64::from(per_second), per_second, now)
    }

    /// A full bucket refilled at `per_second` (a positive, finite rate; anything else is taken
    /// as one a second), holding `burst` tokens (at least one).
    pub fn with_burst(per_second: f64, burst: u32, now: Instant) -> Self {
        let per_second = if per_second.is_finite() && per_second > 0.0 {
            per_second
        } else {
            1.0
        };
        let burst = f64::from(burst.max(1));
        Self {
            per_second,
            burst,
            tokens: burst,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        if now > self.at {
            let refill = now.duration_since(self.at).as_secs_f64() * self.per_second;
            self.tokens = (self.tokens + refill).min(self.burst);
            self.at = now;
        }
    }

    /// How long until a token is there at `now` (`None`: there is one), taking nothing.
    fn wait(&mut self, now: Instant) -> Option<Duration> {
        self.refill(now);
        if self.tokens >= 1.0 {
            return None;
        }
        let wait = (1.0 - self.tokens) / self.per_second;
        Some(Duration::try_from_secs_f64(wait).unwrap_or(Duration::from_secs(1)))
    }

    /// Takes a token at `now`, or says how long until one is there. Nothing is reserved while
    /// waiting, so a caller that gives up (its pool was deleted) costs nobody a token.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        match self.wait(now) {
            None => {
                self.tokens -= 1.0;
                Ok(())
            }
            Some(wait) => Err(wait),
        }
    }

    /// Whether the bucket is full at `now` (it is then the same as a new one).
    fn is_full(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.tokens >= self.burst
    }
}

/// The per-pool bookkeeping behind the replenish delay.
#[derive(Clone, Copy, Debug)]
struct Hold {
    /// Members (present plus created and not yet seen) at the last pass.
    members: usize,
    /// No replacement is created before this.
    until: Option<Instant>,
}

/// How fast pool members are created (see the module docs).
#[derive(Debug)]
pub struct PoolPacing {
    global: TokenBucket,
    /// Members a second per pool; 0 leaves refills unpaced.
    refill_rate: f64,
    refills: HashMap<String, TokenBucket>,
    replenish_delay: Duration,
    holds: HashMap<String, Hold>,
}

impl PoolPacing {
    /// `create_rate` members a second over all pools; `refill_rate` a second per pool (0: no
    /// limit per pool); replacements wait `replenish_delay` after members leave a pool (zero:
    /// no wait).
    pub fn new(
        create_rate: u32,
        refill_rate: f64,
        replenish_delay: Duration,
        now: Instant,
    ) -> Self {
        Self {
            global: TokenBucket::new(create_rate, now),
            refill_rate: if refill_rate.is_finite() && refill_rate > 0.0 {
                refill_rate
            } else {
                0.0
            },
            refills: HashMap::new(),
            replenish_delay,
            holds: HashMap::new(),
        }
    }

    /// Takes the controller-wide token for one creation, or says how long until one is there.
    pub fn take_creation(&mut self, now: Instant) -> Result<(), Duration> {
        self.global.take(now)
    }

    /// Grants up to `wanted` creations for `pool` from its refill bucket: how many, and when
    /// fewer than `wanted`, how long until the next one. Unpaced (all of them) with no refill
    /// rate. A bucket holds at most one second's worth (and at least one), so an idle pool
    /// banks no burst.
    pub fn grant_refills(
        &mut self,
        pool: &str,
        wanted: usize,
        now: Instant,
    ) -> (usize, Option<Duration>) {
        if self.refill_rate <= 0.0 || wanted == 0 {
            return (wanted, None);
        }
        // A full bucket is the same as a fresh one: forget those (deleted pools included).
        self.refills.retain(|_, bucket| !bucket.is_full(now));
        let rate = self.refill_rate;
        // At least one token, at most one second's worth (capacity is a small whole number).
        let burst = rate.ceil().min(f64::from(u32::MAX)) as u32;
        let bucket = self
            .refills
            .entry(pool.to_owned())
            .or_insert_with(|| TokenBucket::with_burst(rate, burst, now));
        let mut granted = 0;
        while granted < wanted {
            match bucket.take(now) {
                Ok(()) => granted += 1,
                Err(wait) => return (granted, Some(wait)),
            }
        }
        (granted, None)
    }

    /// Records that `pool` has `members` (present and created-not-yet-seen) and whether it
    /// lacks any, and says how long its replacements must still wait. The first pass over a
    /// pool (a new pool, or after a restart) and a pool that lacks nothing never wait; every
    /// drop in the count re-arms the wait, so refills start once a burst of adoptions has
    /// settled for the whole delay.
    pub fn replenish_hold(
        &mut self,
        pool: &str,
        members: usize,
        lacking: bool,
        now: Instant,
    ) -> Option<Duration> {
        if self.replenish_delay.is_zero() {
            return None;
        }
        let Some(hold) = self.holds.get_mut(pool) else {
            self.holds.insert(
                pool.to_owned(),
                Hold {
                    members,
                    until: None,
                },
            );
            return None;
        };
        let dropped = members < hold.members;
        hold.members = members;
        if !lacking {
            hold.until = None;
            return None;
        }
        if dropped {
            hold.until = Some(now + self.replenish_delay);
        }
        hold.until
            .and_then(|until| until.checked_duration_since(now))
            .filter(|left| !left.is_zero())
    }

    /// Forgets what is kept about `pool` (it is being deleted).
    pub fn forget(&mut self, pool: &str) {
        self.refills.remove(pool);
        self.holds.remove(pool);
    }
}

/// The client-side limit of API requests: `qps` a second with bursts of `burst`, as client-go's
/// `QPS`/`Burst`. Every request (a watch counts once, when it starts) waits for a token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ApiRateLimit {
    /// Requests a second (positive and finite).
    pub qps: f64,
    /// Requests that may go at once after a quiet time (at least one).
    pub burst: u32,
}

impl<S> tower_layer::Layer<S> for ApiRateLimit {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            bucket: TokenBucket::with_burst(self.qps, self.burst, Instant::now()),
            granted: false,
            sleep: None,
        }
    }
}

/// A service whose calls each wait for a token of [`ApiRateLimit`]'s bucket.
///
/// kube's client puts its service behind a `Buffer`, so there is one instance of this per client
/// (and its clones): the bucket is the client's.
pub struct RateLimited<S> {
    inner: S,
    bucket: TokenBucket,
    /// A token was taken for the next call.
    granted: bool,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> std::fmt::Debug for RateLimited<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimited")
            .field("bucket", &self.bucket)
            .field("granted", &self.granted)
            .finish_non_exhaustive()
    }
}

impl<S, Request> tower_service::Service<Request> for RateLimited<S>
where
    S: tower_service::Service<Request>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.granted {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            match self.bucket.take(Instant::now()) {
                Ok(()) => self.granted = true,
                Err(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        self.granted = false;
        self.inner.call(request)
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

    #[test]
    fn the_burst_and_the_rate_are_separate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::with_burst(0.5, 3, start);
        for _ in 0..3 {
            assert_eq!(bucket.take(start), Ok(()));
        }
        assert_eq!(bucket.take(start), Err(Duration::from_secs(2)));
        assert_eq!(bucket.take(start + Duration::from_secs(2)), Ok(()));
    }

    #[test]
    fn refills_are_paced_per_pool_and_unpaced_without_a_rate() {
        let start = Instant::now();
        let mut unpaced = PoolPacing::new(100, 0.0, Duration::ZERO, start);
        assert_eq!(unpaced.grant_refills("ns/a", 300, start), (300, None));

        let mut paced = PoolPacing::new(100, 2.0, Duration::ZERO, start);
        // One second's worth at once, then one every half second; pools do not share.
        assert_eq!(
            paced.grant_refills("ns/a", 10, start),
            (2, Some(Duration::from_millis(500)))
        );
        assert_eq!(paced.grant_refills("ns/b", 1, start), (1, None));
        assert_eq!(
            paced.grant_refills("ns/a", 10, start + Duration::from_millis(500)),
            (1, Some(Duration::from_millis(500)))
        );
        // Idle for an hour banks one second's worth, no more.
        let idle = start + Duration::from_secs(3600);
        assert_eq!(
            paced.grant_refills("ns/a", 10, idle),
            (2, Some(Duration::from_millis(500)))
        );

        // Below one a second: one at once, then one every 1/rate seconds.
        let mut slow = PoolPacing::new(100, 0.25, Duration::ZERO, start);
        assert_eq!(
            slow.grant_refills("ns/a", 5, start),
            (1, Some(Duration::from_secs(4)))
        );
    }

    #[test]
    fn replenishment_waits_after_every_drop_and_not_otherwise() {
        let start = Instant::now();
        let delay = Duration::from_secs(10);
        let mut pacing = PoolPacing::new(100, 0.0, delay, start);
        // First sight, lacking members (a new pool filling): no wait.
        assert_eq!(pacing.replenish_hold("ns/a", 0, true, start), None);
        assert_eq!(pacing.replenish_hold("ns/a", 5, false, start), None);
        // Two adopted: wait the whole delay.
        let t1 = start + Duration::from_secs(1);
        assert_eq!(pacing.replenish_hold("ns/a", 3, true, t1), Some(delay));
        // Another adopted 4 s later: the wait starts again.
        let t2 = t1 + Duration::from_secs(4);
        assert_eq!(pacing.replenish_hold("ns/a", 2, true, t2), Some(delay));
        // No drop since: the rest of the wait, then none.
        let t3 = t2 + Duration::from_secs(6);
        assert_eq!(
            pacing.replenish_hold("ns/a", 2, true, t3),
            Some(Duration::from_secs(4))
        );
        assert_eq!(pacing.replenish_hold("ns/a", 2, true, t2 + delay), None);
        // Without a delay nothing ever waits.
        let mut none = PoolPacing::new(100, 0.0, Duration::ZERO, start);
        assert_eq!(none.replenish_hold("ns/a", 5, true, start), None);
        assert_eq!(none.replenish_hold("ns/a", 1, true, t1), None);
        // A forgotten pool is new again.
        pacing.forget("ns/a");
        assert_eq!(pacing.replenish_hold("ns/a", 0, true, t3), None);
    }

    #[tokio::test]
    async fn api_requests_wait_for_tokens() {
        use tower_layer::Layer;
        use tower_service::Service;

        #[derive(Clone)]
        struct Echo;
        impl Service<u32> for Echo {
            type Response = u32;
            type Error = std::convert::Infallible;
            type Future = std::future::Ready<Result<u32, Self::Error>>;
            fn poll_ready(&mut self, _: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
                Poll::Ready(Ok(()))
            }
            fn call(&mut self, request: u32) -> Self::Future {
                std::future::ready(Ok(request))
            }
        }

        let mut service = ApiRateLimit {
            qps: 20.0,
            burst: 3,
        }
        .layer(Echo);
        let start = Instant::now();
        for i in 0..5 {
            std::future::poll_fn(|cx| service.poll_ready(cx))
                .await
                .unwrap();
            assert_eq!(service.call(i).await.unwrap(), i);
        }
        // Three at once, then two at 20 a second: 100 ms (the bound above is for a slow machine).
        let elapsed = start.elapsed();
        assert!(
            elapsed >= Duration::from_millis(95) && elapsed < Duration::from_secs(5),
            "{elapsed:?}"
        );
    }
}
