//! Watch streams: initial events, the backlog after a resource version, live events filtered by
//! namespace and selectors (objects moving in and out of the selection become ADDED / DELETED),
//! periodic and initial-events-end bookmarks, `timeoutSeconds`, and the `410 Gone` ERROR event
//! for versions that left the history.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use serde_json::{Value, json};
use tokio::sync::broadcast::{
    self,
    error::{RecvError, TryRecvError},
};
use tokio::time::Instant;

use super::table::{self, IncludeObject};
use crate::api_error::ApiError;
use crate::meta;
use crate::ops::ApiObjects;
use crate::resources::ResourceInfo;
use crate::selector::Selectors;
use crate::store::{Change, EventType};

/// How objects are rendered in events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    Object,
    PartialMetadata,
    Table(IncludeObject),
}

/// A parsed watch request.
#[derive(Debug)]
pub(crate) struct WatchRequest {
    pub(crate) info: Arc<ResourceInfo>,
    pub(crate) namespace: Option<String>,
    pub(crate) selectors: Selectors,
    pub(crate) resource_version: Option<String>,
    /// `sendInitialEvents`; absent means "yes" for a watch from now (`""` or `"0"`).
    pub(crate) send_initial_events: Option<bool>,
    pub(crate) bookmarks: bool,
    pub(crate) timeout: Duration,
    pub(crate) format: Format,
}

/// Renders one object for `format`.
pub(crate) fn render_object(info: &ResourceInfo, object: &Value, format: Format) -> Value {
    match format {
        Format::Object => object.clone(),
        Format::PartialMetadata => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": object.get("metadata").cloned().unwrap_or(json!({})),
        }),
        Format::Table(include) => table::render(
            info,
            std::slice::from_ref(object),
            meta::resource_version(object),
            include,
        ),
    }
}

fn line(kind: &str, object: Value) -> Bytes {
    let mut text = json!({"type": kind, "object": object}).to_string();
    text.push('\n');
    Bytes::from(text)
}

struct State {
    objects: Arc<ApiObjects>,
    request: WatchRequest,
    queue: VecDeque<Bytes>,
    backlog: VecDeque<Arc<Change>>,
    live: Option<broadcast::Receiver<Arc<Change>>>,
    seen: u64,
    deadline: Instant,
    bookmark_every: Duration,
    next_bookmark: Instant,
    finished: bool,
    epoch: tokio::sync::watch::Receiver<u64>,
}

impl State {
    fn selected(&self, object: &Value) -> bool {
        let namespace_ok = self
            .request
            .namespace
            .as_deref()
            .is_none_or(|ns| meta::namespace(object) == ns);
        namespace_ok && self.request.selectors.matches(object)
    }

    fn push(&mut self, kind: &str, object: &Value) {
        let rendered = render_object(&self.request.info, object, self.request.format);
        self.queue.push_back(line(kind, rendered));
    }

    fn bookmark(&mut self, rv: u64, initial_end: bool) {
        let info = &self.request.info;
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let (kind, api_version) = match self.request.format {
            Format::Object => (info.kind.clone(), info.api_version()),
            _ => (
                "PartialObjectMetadata".to_owned(),
                "meta.k8s.io/v1".to_owned(),
            ),
        };
        let object = json!({"kind": kind, "apiVersion": api_version, "metadata": metadata});
        self.queue.push_back(line("BOOKMARK", object));
    }

    fn process(&mut self, change: &Change) {
        self.seen = self.seen.max(change.rv);
        if change.key != self.request.info.storage() {
            return;
        }
        let info = self.request.info.clone();
        let object = self.objects.present(&info, &change.object);
        let old = change
            .old
            .as_ref()
            .map(|old| self.objects.present(&info, old));
        let now_selected = self.selected(&object);
        let was_selected = old.as_ref().is_some_and(|old| self.selected(old));
        match change.kind {
            EventType::Added if now_selected => self.push("ADDED", &object),
            EventType::Modified => match (was_selected, now_selected) {
                (true, true) => self.push("MODIFIED", &object),
                (false, true) => self.push("ADDED", &object),
                (true, false) => self.push("DELETED", &object),
                (false, false) => {}
            },
            EventType::Deleted if now_selected || was_selected => self.push("DELETED", &object),
            _ => {}
        }
    }

    async fn step(&mut self) -> Option<Bytes> {
        loop {
            if let Some(bytes) = self.queue.pop_front() {
                return Some(bytes);
            }
            if self.finished {
                return None;
            }
            if let Some(change) = self.backlog.pop_front() {
                self.process(&change);
                continue;
            }
            let Some(live) = self.live.as_mut() else {
                self.finished = true;
                continue;
            };
            let bookmarks = self.request.bookmarks;
            tokio::select! {
                // Ending conditions first, so that a closed watch never delivers one more event.
                biased;
                _ = self.epoch.changed() => self.finished = true,
                () = tokio::time::sleep_until(self.deadline) => self.finished = true,
                received = live.recv() => match received {
                    Ok(change) => self.process(&change),
                    // A watcher that cannot keep up is closed; the client resumes from its last
                    // version, as with a real API server.
                    Err(RecvError::Lagged(_) | RecvError::Closed) => self.finished = true,
                },
                () = tokio::time::sleep_until(self.next_bookmark), if bookmarks => {
                    let rv = self.objects.store.current_rv();
                    while let Some(live) = self.live.as_mut() {
                        match live.try_recv() {
                            Ok(change) => self.process(&change),
                            Err(TryRecvError::Empty) => break,
                            Err(_) => {
                                self.finished = true;
                                break;
                            }
                        }
                    }
                    if !self.finished {
                        let rv = rv.max(self.seen);
                        self.bookmark(rv, false);
                    }
                    self.next_bookmark = Instant::now() + self.bookmark_every;
                }
            }
        }
    }
}

/// Starts a watch; the stream ends at the timeout, when the client goes away, or after the 410
/// ERROR event.
pub(crate) fn start(
    objects: Arc<ApiObjects>,
    request: WatchRequest,
    bookmark_every: Duration,
    epoch: tokio::sync::watch::Receiver<u64>,
) -> Result<impl Stream<Item = Result<Bytes, Infallible>> + Send + use<>, ApiError> {
    let rv_param = request.resource_version.clone().unwrap_or_default();
    let from_now = rv_param.is_empty() || rv_param == "0";
    let initial = request.send_initial_events.unwrap_or(from_now);
    let deadline = Instant::now() + request.timeout;
    let mut state = State {
        objects: objects.clone(),
        queue: VecDeque::new(),
        backlog: VecDeque::new(),
        live: None,
        seen: 0,
        deadline,
        bookmark_every,
        next_bookmark: Instant::now() + bookmark_every,
        finished: false,
        epoch,
        request,
    };
    let from = if initial {
        let namespace = state.request.namespace.clone();
        let (items, rv) = objects.list(
            &state.request.info,
            namespace.as_deref(),
            &state.request.selectors,
        );
        for item in &items {
            state.push("ADDED", item);
        }
        if state.request.send_initial_events == Some(true) && state.request.bookmarks {
            state.bookmark(rv, true);
        }
        rv
    } else {
        rv_param
            .parse::<u64>()
            .map_err(|_| ApiError::bad_request(format!("invalid resource version {rv_param:?}")))?
    };
    state.seen = from;
    match objects.store.watch(&state.request.info.storage(), from) {
        Ok(start) => {
            state.backlog = start.backlog.into();
            state.live = Some(start.live);
        }
        Err(gone) => {
            state.queue.clear();
            state.queue.push_back(line("ERROR", gone.to_status()));
            state.finished = true;
        }
    }
    Ok(futures::stream::unfold(state, |mut state| async move {
        state.step().await.map(|bytes| (Ok(bytes), state))
    }))
}
