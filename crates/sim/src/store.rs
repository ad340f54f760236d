//! The storage and watch core: every object of every resource, the cluster-wide
//! `resourceVersion`, the bounded event history that watches resume from, and the indexes the
//! garbage collector uses (uid → object, owner uid → dependents).
//!
//! All state sits behind one mutex, so a write and the event it emits are atomic and events
//! carry strictly increasing resource versions. Events are fanned out on a broadcast channel
//! to API watches and to the sim's own controllers (kubelet, GC, endpoints, namespaces).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::api_error::{ApiError, ApiResult};
use crate::meta;
use crate::resources::{Registry, StorageKey};

/// `(namespace, name)`; the namespace is empty for cluster-scoped objects.
pub(crate) type ObjKey = (String, String);

/// The kind of a change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One committed change.
#[derive(Debug)]
pub(crate) struct Change {
    pub(crate) rv: u64,
    pub(crate) kind: EventType,
    pub(crate) key: StorageKey,
    /// The object after the change (for `Deleted`, its last state with the deletion's version).
    pub(crate) object: Arc<Value>,
    /// The object before the change.
    pub(crate) old: Option<Arc<Value>>,
}

/// What a commit closure decides.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Store this object (create or update).
    Put(Value),
    /// Remove the object, recording this final state in the `DELETED` event.
    Remove(Value),
    /// Change nothing; answer with this object.
    Keep(Arc<Value>),
}

/// Result of a commit.
#[derive(Debug)]
pub(crate) struct Committed {
    pub(crate) object: Arc<Value>,
    pub(crate) kind: Option<EventType>,
}

#[derive(Debug)]
struct Inner {
    rv: u64,
    collections: HashMap<StorageKey, BTreeMap<ObjKey, Arc<Value>>>,
    history: VecDeque<Arc<Change>>,
    history_limit: usize,
    /// Every event with a version at or below this one has left the history.
    compacted: u64,
    uids: HashMap<String, (StorageKey, ObjKey)>,
    dependents: HashMap<String, BTreeSet<(StorageKey, ObjKey)>>,
}

/// The watch of one resource, from a version: the backlog to send first, then live events.
#[derive(Debug)]
pub(crate) struct WatchStart {
    pub(crate) backlog: Vec<Arc<Change>>,
    pub(crate) live: broadcast::Receiver<Arc<Change>>,
}

/// The store.
#[derive(Debug)]
pub(crate) struct Store {
    inner: Mutex<Inner>,
    events: broadcast::Sender<Arc<Change>>,
    registry: RwLock<Registry>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Store {
    /// An empty store with the built-in resources registered.
    pub(crate) fn new(history_limit: usize) -> Self {
        let (events, _) = broadcast::channel(16_384);
        Self {
            inner: Mutex::new(Inner {
                rv: 1,
                collections: HashMap::new(),
                history: VecDeque::new(),
                history_limit: history_limit.max(1),
                compacted: 0,
                uids: HashMap::new(),
                dependents: HashMap::new(),
            }),
            events,
            registry: RwLock::new(Registry::with_builtins()),
        }
    }

    /// Reads the registry.
    pub(crate) fn registry(&self) -> std::sync::RwLockReadGuard<'_, Registry> {
        self.registry.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes the registry.
    pub(crate) fn registry_mut(&self) -> std::sync::RwLockWriteGuard<'_, Registry> {
        self.registry
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The latest committed version.
    pub(crate) fn current_rv(&self) -> u64 {
        lock(&self.inner).rv
    }

    /// One object.
    pub(crate) fn get(&self, key: &StorageKey, namespace: &str, name: &str) -> Option<Arc<Value>> {
        lock(&self.inner)
            .collections
            .get(key)
            .and_then(|c| c.get(&(namespace.to_owned(), name.to_owned())))
            .cloned()
    }

    /// Objects of a resource (in one namespace when given), sorted by namespace and name, with
    /// the version the list is consistent with.
    pub(crate) fn list(&self, key: &StorageKey, namespace: Option<&str>) -> (Vec<Arc<Value>>, u64) {
        let inner = lock(&self.inner);
        let items = inner
            .collections
            .get(key)
            .map(|collection| match namespace {
                Some(ns) => collection
                    .range((ns.to_owned(), String::new())..)
                    .take_while(|((item_ns, _), _)| item_ns == ns)
                    .map(|(_, v)| v.clone())
                    .collect(),
                None => collection.values().cloned().collect(),
            })
            .unwrap_or_default();
        (items, inner.rv)
    }

    /// Every collection key that has objects.
    pub(crate) fn keys(&self) -> Vec<StorageKey> {
        lock(&self.inner).collections.keys().cloned().collect()
    }

    /// Where the object with `uid` is stored.
    pub(crate) fn locate_uid(&self, uid: &str) -> Option<(StorageKey, ObjKey)> {
        lock(&self.inner).uids.get(uid).cloned()
    }

    /// The objects whose owner references name `uid`.
    pub(crate) fn dependents_of(&self, uid: &str) -> Vec<(StorageKey, ObjKey)> {
        lock(&self.inner)
            .dependents
            .get(uid)
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Every uid that some object names as its owner.
    pub(crate) fn owner_uids(&self) -> Vec<String> {
        lock(&self.inner).dependents.keys().cloned().collect()
    }

    /// Live events of every resource (for the sim's controllers).
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.events.subscribe()
    }

    /// Starts a watch of `key` after version `from`; `Err` carries the 410 to send when `from` has
    /// left the history.
    pub(crate) fn watch(&self, key: &StorageKey, from: u64) -> ApiResult<WatchStart> {
        let inner = lock(&self.inner);
        if from < inner.compacted {
            return Err(ApiError::expired(format!(
                "too old resource version: {from} ({})",
                inner.compacted
            )));
        }
        let backlog = inner
            .history
            .iter()
            .filter(|change| change.rv > from && change.key == *key)
            .cloned()
            .collect();
        // Subscribing under the lock: no event is both in the backlog and live, and none is lost.
        let live = self.events.subscribe();
        Ok(WatchStart { backlog, live })
    }

    /// Drops the whole event history, so that every watch resuming from an earlier version gets
    /// `410 Gone` (what etcd compaction does to a real cluster).
    pub(crate) fn compact(&self) {
        let mut inner = lock(&self.inner);
        inner.history.clear();
        inner.compacted = inner.rv;
    }

    /// Reads the current object, lets `decide` choose a change and commits it atomically.
    pub(crate) fn commit<F>(
        &self,
        key: &StorageKey,
        namespace: &str,
        name: &str,
        decide: F,
    ) -> ApiResult<Committed>
    where
        F: FnOnce(Option<&Arc<Value>>) -> ApiResult<Decision>,
    {
        let mut inner = lock(&self.inner);
        let obj_key = (namespace.to_owned(), name.to_owned());
        let current = inner
            .collections
            .get(key)
            .and_then(|c| c.get(&obj_key))
            .cloned();
        let decision = decide(current.as_ref())?;
        let (mut object, kind) = match decision {
            Decision::Keep(object) => {
                return Ok(Committed { object, kind: None });
            }
            Decision::Put(object) => {
                if too_large(&object) {
                    return Err(ApiError::storage_too_large());
                }
                let kind = if current.is_some() {
                    EventType::Modified
                } else {
                    EventType::Added
                };
                (object, kind)
            }
            Decision::Remove(object) => {
                if current.is_none() {
                    return Err(ApiError::internal(format!(
                        "cannot remove {namespace}/{name}: not stored"
                    )));
                }
                (object, EventType::Deleted)
            }
        };
        inner.rv += 1;
        let rv = inner.rv;
        meta::meta_mut(&mut object).insert("resourceVersion".into(), json!(rv.to_string()));
        let object = Arc::new(object);
        if let Some(old) = &current {
            inner.unindex(key, &obj_key, old);
        }
        let collection = inner.collections.entry(key.clone()).or_default();
        if kind == EventType::Deleted {
            collection.remove(&obj_key);
            if collection.is_empty() {
                inner.collections.remove(key);
            }
        } else {
            collection.insert(obj_key.clone(), object.clone());
            inner.index(key, &obj_key, &object);
        }
        let change = Arc::new(Change {
            rv,
            kind,
            key: key.clone(),
            object: object.clone(),
            old: current,
        });
        inner.history.push_back(change.clone());
        while inner.history.len() > inner.history_limit {
            if let Some(dropped) = inner.history.pop_front() {
                inner.compacted = dropped.rv;
            }
        }
        // No receiver is fine: nobody watches yet.
        let _ = self.events.send(change);
        Ok(Committed {
            object,
            kind: Some(kind),
        })
    }
}

/// The largest object etcd stores with its default `--max-request-bytes` (1.5 MiB): an API
/// write whose object is larger fails there.
pub(crate) const MAX_STORED_BYTES: usize = 1536 * 1024;

/// Counts the bytes written to it.
struct Counter(usize);

impl std::io::Write for Counter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0 += bytes.len();
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Whether `object`'s JSON encoding exceeds [`MAX_STORED_BYTES`] (etcd holds custom resources
/// as JSON; built-in kinds as protobuf, which is about as large or smaller).
fn too_large(object: &Value) -> bool {
    let mut counter = Counter(0);
    serde_json::to_writer(&mut counter, object).is_err() || counter.0 > MAX_STORED_BYTES
}

impl Inner {
    fn index(&mut self, key: &StorageKey, obj_key: &ObjKey, object: &Value) {
        let uid = meta::uid(object);
        if !uid.is_empty() {
            self.uids
                .insert(uid.to_owned(), (key.clone(), obj_key.clone()));
        }
        for owner in meta::owner_refs(object) {
            self.dependents
                .entry(owner.uid)
                .or_default()
                .insert((key.clone(), obj_key.clone()));
        }
    }

    fn unindex(&mut self, key: &StorageKey, obj_key: &ObjKey, object: &Value) {
        let uid = meta::uid(object);
        if self
            .uids
            .get(uid)
            .is_some_and(|at| at.0 == *key && at.1 == *obj_key)
        {
            self.uids.remove(uid);
        }
        for owner in meta::owner_refs(object) {
            if let Some(set) = self.dependents.get_mut(&owner.uid) {
                set.remove(&(key.clone(), obj_key.clone()));
                if set.is_empty() {
                    self.dependents.remove(&owner.uid);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods() -> StorageKey {
        StorageKey::new("", "pods")
    }

    fn put(store: &Store, name: &str, value: Value) -> Committed {
        store
            .commit(&pods(), "ns", name, |_| Ok(Decision::Put(value)))
            .unwrap()
    }

    #[test]
    fn commits_bump_versions_and_feed_watches() {
        let store = Store::new(100);
        let first = put(&store, "a", json!({"metadata": {"name": "a", "uid": "u1"}}));
        assert_eq!(first.kind, Some(EventType::Added));
        let rv1: u64 = meta::resource_version(&first.object).parse().unwrap();
        let mut watch = store.watch(&pods(), rv1).unwrap();
        assert!(watch.backlog.is_empty());
        let second = put(
            &store,
            "a",
            json!({"metadata": {"name": "a", "uid": "u1"}, "x": 1}),
        );
        assert_eq!(second.kind, Some(EventType::Modified));
        let event = watch.live.try_recv().unwrap();
        assert_eq!(event.kind, EventType::Modified);
        assert_eq!(event.rv, rv1 + 1);
        let backlog = store.watch(&pods(), 0).unwrap().backlog;
        assert_eq!(backlog.len(), 2);
        store
            .commit(&pods(), "ns", "a", |current| {
                Ok(Decision::Remove((**current.unwrap()).clone()))
            })
            .unwrap();
        assert!(store.get(&pods(), "ns", "a").is_none());
        assert_eq!(watch.live.try_recv().unwrap().kind, EventType::Deleted);
    }

    #[test]
    fn compacted_history_answers_gone() {
        let store = Store::new(2);
        for name in ["a", "b", "c"] {
            put(&store, name, json!({"metadata": {"name": name}}));
        }
        assert_eq!(store.watch(&pods(), 1).unwrap_err().code, 410);
        assert!(store.watch(&pods(), store.current_rv()).is_ok());
        store.compact();
        assert!(store.watch(&pods(), store.current_rv() - 1).is_err());
    }

    #[test]
    fn owner_index_follows_writes() {
        let store = Store::new(10);
        put(
            &store,
            "child",
            json!({"metadata": {"name": "child", "uid": "c",
                   "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "owner"}]}}),
        );
        assert_eq!(store.dependents_of("owner").len(), 1);
        assert_eq!(
            store.locate_uid("c").map(|(_, k)| k.1),
            Some("child".to_owned())
        );
        put(
            &store,
            "child",
            json!({"metadata": {"name": "child", "uid": "c"}}),
        );
        assert!(store.dependents_of("owner").is_empty());
    }
}
