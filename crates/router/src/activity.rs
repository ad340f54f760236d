//! Sandboxes' idle lifecycle as the router takes part in it: it records their activity in
//! `status.lastActivityTime` without a write per request, and resumes a suspended sandbox when
//! a request for it arrives.
//!
//! - **Activity** ([`Recorder`]): a request counts from its start to the end of its response
//!   (and an upgraded connection until it closes), so a command still running or a stream still
//!   open keeps its sandbox active. [`Recorder::due`] (sans IO) says which sandboxes to write
//!   now: those active since their last write, at most once per interval, the interval being
//!   the configured one or a quarter of the sandbox's `activeTTLSeconds` if that is shorter
//!   (so that the recorded time is never more than a quarter TTL behind). A sandbox receiving
//!   100 requests a second costs one write per interval.
//! - **Resume** ([`Cluster::resume`]): the first request for a suspended sandbox records its
//!   activity at once, and the controller resumes a suspended sandbox whose activity is newer
//!   than its suspension; requests arriving while it wakes share that one write and wait for
//!   the index to show it routable. The router writes only `status` (RBAC: `patch` on
//!   `sandboxes/status`, never on the spec), so a compromised router cannot change what a
//!   sandbox runs.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use agent_sandbox_api::Sandbox;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};

use crate::metrics::Metrics;

/// How often the writer looks for sandboxes due.
const TICK: Duration = Duration::from_millis(500);
/// The shortest interval between two writes for one sandbox.
const MIN_INTERVAL: Duration = Duration::from_secs(1);

type Key = (String, String);

#[derive(Debug)]
struct Entry {
    /// When the last request for it ended (or began).
    last: Timestamp,
    /// Requests and tunnels still open.
    open: usize,
    /// Activity since the last write.
    pending: bool,
    /// When it was last written.
    written: Option<Instant>,
    interval: Duration,
}

/// Activity per sandbox since its last write.
#[derive(Debug)]
pub(crate) struct Recorder {
    entries: Mutex<HashMap<Key, Entry>>,
    interval: Duration,
}

impl Recorder {
    /// Writes at most once per `interval` per sandbox.
    pub(crate) fn new(interval: Duration) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            interval: interval.max(MIN_INTERVAL),
        }
    }

    /// A request for `namespace/name` begins; it is active until the returned guard drops.
    /// `idle_ttl` is the sandbox's `activeTTLSeconds`, if any.
    pub(crate) fn begin(
        self: &Arc<Self>,
        namespace: &str,
        name: &str,
        idle_ttl: Option<Duration>,
        now: Timestamp,
    ) -> Active {
        let key = (namespace.to_owned(), name.to_owned());
        let interval = idle_ttl
            .map_or(self.interval, |ttl| self.interval.min(ttl / 4))
            .max(MIN_INTERVAL);
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = entries.entry(key.clone()).or_insert(Entry {
            last: now,
            open: 0,
            pending: false,
            written: None,
            interval,
        });
        entry.open += 1;
        entry.pending = true;
        entry.last = now;
        entry.interval = interval;
        Active {
            recorder: Arc::clone(self),
            key,
        }
    }

    fn end(&self, key: &Key, now: Timestamp) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = entries.get_mut(key) {
            entry.open = entry.open.saturating_sub(1);
            entry.pending = true;
            entry.last = entry.last.max(now);
        }
    }

    /// The sandboxes to write at `now` (`wall` on the clock the API server sees) and the
    /// activity time for each: `wall` while a request is open, else when the last one ended.
    /// Each is marked written; sandboxes quiet for two intervals are forgotten. With `all`,
    /// every sandbox with activity not written yet, whatever its interval (the router stopping).
    pub(crate) fn due(&self, now: Instant, wall: Timestamp, all: bool) -> Vec<(Key, Timestamp)> {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let mut due = Vec::new();
        entries.retain(|key, entry| {
            let since_write = entry.written.map(|at| now.saturating_duration_since(at));
            let active = entry.pending || entry.open > 0;
            if active && (all || since_write.is_none_or(|since| since >= entry.interval)) {
                let at = if entry.open > 0 { wall } else { entry.last };
                due.push((key.clone(), at));
                entry.written = Some(now);
                entry.pending = false;
                return true;
            }
            active || since_write.is_none_or(|since| since < entry.interval * 2)
        });
        due
    }
}

/// A request or tunnel in progress; dropping it ends it.
#[derive(Debug)]
pub(crate) struct Active {
    recorder: Arc<Recorder>,
    key: Key,
}

impl Drop for Active {
    fn drop(&mut self) {
        self.recorder.end(&self.key, Timestamp::now());
    }
}

/// The router's writes to the cluster: activity and resumes.
pub(crate) struct Cluster {
    client: kube::Client,
    pub(crate) recorder: Arc<Recorder>,
    /// Sandboxes whose resume was sent, with when: requests arriving while it wakes send none.
    /// Forgotten once the sandbox is routable again ([`Cluster::awake`]), so a sandbox
    /// suspended again right after it woke is woken again by the next request.
    resuming: Mutex<HashMap<Key, Instant>>,
    /// Sandboxes whose activity the router may not write (no RBAC), said once each.
    denied: Mutex<HashSet<String>>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("recorder", &self.recorder)
            .finish_non_exhaustive()
    }
}

/// How long a sent resume covers later requests before one of them sends it again (when the
/// sandbox has not become routable meanwhile: a lost write, a controller that is down).
const RESUME_AGAIN: Duration = Duration::from_secs(5);

impl Cluster {
    pub(crate) fn new(client: kube::Client, interval: Duration, metrics: Arc<Metrics>) -> Self {
        Self {
            client,
            recorder: Arc::new(Recorder::new(interval)),
            resuming: Mutex::new(HashMap::new()),
            denied: Mutex::new(HashSet::new()),
            metrics,
        }
    }

    /// Writes the activity that is due, every [`TICK`], until `stop`; then what is left.
    pub(crate) async fn write_activity(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let last = tokio::select! {
                () = stop.cancelled() => true,
                _ = tick.tick() => false,
            };
            let due = self.recorder.due(Instant::now(), Timestamp::now(), last);
            for ((namespace, name), at) in due {
                self.write(&namespace, &name, at).await;
            }
            if last {
                return;
            }
        }
    }

    async fn write(&self, namespace: &str, name: &str, at: Timestamp) {
        match self.patch_activity(namespace, name, at).await {
            Ok(()) => self.metrics.activity_written(),
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(kube::Error::Api(status)) if status.code == 403 => {
                let first = self
                    .denied
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(namespace.to_owned());
                if first {
                    tracing::warn!(
                        %namespace,
                        "the router may not patch sandboxes/status here, so idle sandboxes \
                         cannot see their activity: grant it (deploy/base's router Role does)"
                    );
                }
            }
            Err(error) => {
                tracing::debug!(%namespace, %name, %error, "recording activity failed");
            }
        }
    }

    /// `namespace/name` is routable: a resume sent for it is done with.
    pub(crate) fn awake(&self, namespace: &str, name: &str) {
        let mut resuming = self.resuming.lock().unwrap_or_else(PoisonError::into_inner);
        if !resuming.is_empty() {
            resuming.remove(&(namespace.to_owned(), name.to_owned()));
        }
    }

    /// Records activity for the suspended `namespace/name` now (the controller resumes it),
    /// unless that was done moments ago; an error says why it could not be.
    pub(crate) async fn resume(&self, namespace: &str, name: &str) -> Result<(), String> {
        let key = (namespace.to_owned(), name.to_owned());
        {
            let mut resuming = self.resuming.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            resuming.retain(|_, at| now.saturating_duration_since(*at) < RESUME_AGAIN);
            if resuming.contains_key(&key) {
                return Ok(());
            }
            resuming.insert(key.clone(), now);
        }
        match self.patch_activity(namespace, name, Timestamp::now()).await {
            Ok(()) => {
                self.metrics.resumed();
                tracing::info!(%namespace, %name, "a request woke a suspended sandbox");
                Ok(())
            }
            Err(error) => {
                self.resuming
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&key);
                Err(match error {
                    kube::Error::Api(status) if status.code == 403 => format!(
                        "the router may not wake it (it needs patch on sandboxes/status): {}",
                        status.message
                    ),
                    error => format!("waking it failed: {error}"),
                })
            }
        }
    }

    async fn patch_activity(
        &self,
        namespace: &str,
        name: &str,
        at: Timestamp,
    ) -> Result<(), kube::Error> {
        let api: Api<Sandbox> = Api::namespaced(self.client.clone(), namespace);
        let patch = serde_json::json!({"status": {"lastActivityTime": at.to_string()}});
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    #[test]
    fn a_busy_sandbox_is_written_once_per_interval_and_an_open_request_counts_as_activity() {
        let recorder = Arc::new(Recorder::new(Duration::from_secs(30)));
        let start = Instant::now();
        let at = |seconds: u64| start + Duration::from_secs(seconds);
        // 100 requests in the first second: one write.
        for _ in 0..100 {
            drop(recorder.begin("ns", "box", None, t(0)));
        }
        assert_eq!(recorder.due(at(0), t(0), false).len(), 1);
        for second in 1..30 {
            drop(recorder.begin("ns", "box", None, t(second)));
            assert!(recorder.due(at(second as u64), t(second), false).is_empty());
        }
        // The interval passed: the last request's time is written.
        assert_eq!(
            recorder.due(at(30), t(30), false),
            vec![(("ns".to_owned(), "box".to_owned()), t(29))]
        );
        // Quiet: nothing more, then forgotten.
        assert!(recorder.due(at(60), t(60), false).is_empty());
        assert!(recorder.due(at(100), t(100), false).is_empty());
        assert!(recorder.entries.lock().unwrap().is_empty());
        // A request that runs for 90 s: written with the current time while it runs.
        let long = recorder.begin("ns", "long", None, t(100));
        assert_eq!(recorder.due(at(100), t(100), false).len(), 1);
        assert_eq!(
            recorder.due(at(130), t(130), false),
            vec![(("ns".to_owned(), "long".to_owned()), t(130))]
        );
        assert_eq!(recorder.due(at(160), t(160), false)[0].1, t(160));
        drop(long);
        assert!(recorder.due(at(170), t(170), false).is_empty());
        assert_eq!(recorder.due(at(190), t(190), false).len(), 1);
    }

    #[test]
    fn a_short_idle_ttl_shortens_the_interval_to_a_quarter_of_it() {
        let recorder = Arc::new(Recorder::new(Duration::from_secs(30)));
        let start = Instant::now();
        let ttl = Some(Duration::from_secs(20));
        drop(recorder.begin("ns", "box", ttl, t(0)));
        assert_eq!(recorder.due(start, t(0), false).len(), 1);
        drop(recorder.begin("ns", "box", ttl, t(1)));
        assert!(
            recorder
                .due(start + Duration::from_secs(4), t(4), false)
                .is_empty()
        );
        assert_eq!(
            recorder
                .due(start + Duration::from_secs(5), t(5), false)
                .len(),
            1
        );
    }
}
