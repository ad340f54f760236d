//! The garbage collector: ownerReference-driven deletion of dependents (background and
//! foreground), orphaning, and the removal of the `foregroundDeletion` / `orphan` finalizers.
//!
//! Decisions are pure functions of an object and the state of its owners; [`run`] feeds them
//! from the store's events and carries out the actions through [`ApiObjects`].

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::broadcast::{self, error::RecvError};

use crate::meta::{self, OwnerRef};
use crate::ops::{ApiObjects, DeleteOptions, FOREGROUND, ORPHAN, Propagation};
use crate::resources::StorageKey;
use crate::store::{Change, EventType};

/// What the collector knows about one owner of a dependent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OwnerState {
    /// No object with the referenced uid (or in another namespace).
    Absent,
    /// Present and not being deleted (or deleted in the background).
    Present,
    /// Being deleted in the foreground: its dependents go first.
    DeletingForeground,
    /// Being deleted with orphaning: its dependents lose the reference.
    Orphaning,
}

/// Something the collector does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum GcAction {
    Delete {
        key: StorageKey,
        namespace: String,
        name: String,
        uid: String,
        propagation: Propagation,
    },
    RemoveOwnerRefs {
        key: StorageKey,
        namespace: String,
        name: String,
        owner_uids: Vec<String>,
    },
    RemoveFinalizer {
        key: StorageKey,
        namespace: String,
        name: String,
        finalizer: &'static str,
    },
}

/// The state of an owner object.
pub(crate) fn owner_state(owner: Option<&Value>, dependent_namespace: &str) -> OwnerState {
    let Some(owner) = owner else {
        return OwnerState::Absent;
    };
    let owner_namespace = meta::namespace(owner);
    if !owner_namespace.is_empty() && owner_namespace != dependent_namespace {
        return OwnerState::Absent;
    }
    if meta::is_deleting(owner) {
        let finalizers = meta::finalizers(owner);
        if finalizers.iter().any(|f| f == FOREGROUND) {
            return OwnerState::DeletingForeground;
        }
        if finalizers.iter().any(|f| f == ORPHAN) {
            return OwnerState::Orphaning;
        }
    }
    OwnerState::Present
}

/// What to do with a dependent, given the state of each of its owners.
pub(crate) fn dependent_action(
    key: &StorageKey,
    dependent: &Value,
    state: &dyn Fn(&OwnerRef) -> OwnerState,
) -> Option<GcAction> {
    let owners = meta::owner_refs(dependent);
    if owners.is_empty() || meta::is_deleting(dependent) {
        return None;
    }
    let states: Vec<(OwnerRef, OwnerState)> =
        owners.into_iter().map(|o| (o.clone(), state(&o))).collect();
    let with = |wanted: OwnerState| -> Vec<String> {
        states
            .iter()
            .filter(|(_, s)| *s == wanted)
            .map(|(o, _)| o.uid.clone())
            .collect()
    };
    let present = with(OwnerState::Present);
    let absent = with(OwnerState::Absent);
    let foreground = with(OwnerState::DeletingForeground);
    let orphaning = with(OwnerState::Orphaning);
    let namespace = meta::namespace(dependent).to_owned();
    let name = meta::name(dependent).to_owned();
    let remove_refs = |uids: Vec<String>| {
        (!uids.is_empty()).then(|| GcAction::RemoveOwnerRefs {
            key: key.clone(),
            namespace: namespace.clone(),
            name: name.clone(),
            owner_uids: uids,
        })
    };
    if !present.is_empty() {
        // A live owner keeps the dependent; references to owners on their way out go.
        return remove_refs([absent, foreground, orphaning].concat());
    }
    if !orphaning.is_empty() {
        return remove_refs([absent, orphaning].concat());
    }
    Some(GcAction::Delete {
        key: key.clone(),
        namespace,
        name,
        uid: meta::uid(dependent).to_owned(),
        propagation: if foreground.is_empty() {
            Propagation::Background
        } else {
            Propagation::Foreground
        },
    })
}

/// What to do with an owner being deleted, given its remaining dependents.
pub(crate) fn owner_action(
    key: &StorageKey,
    owner: &Value,
    dependents: &[Arc<Value>],
) -> Option<GcAction> {
    if !meta::is_deleting(owner) {
        return None;
    }
    let uid = meta::uid(owner);
    let finalizers = meta::finalizers(owner);
    let refs_to_owner = |dependent: &Arc<Value>| {
        meta::owner_refs(dependent)
            .into_iter()
            .filter(|o| o.uid == uid)
            .collect::<Vec<_>>()
    };
    let finalizer = if finalizers.iter().any(|f| f == ORPHAN)
        && dependents.iter().all(|d| refs_to_owner(d).is_empty())
    {
        ORPHAN
    } else if finalizers.iter().any(|f| f == FOREGROUND)
        && !dependents
            .iter()
            .any(|d| refs_to_owner(d).iter().any(|o| o.block_owner_deletion))
    {
        FOREGROUND
    } else {
        return None;
    };
    Some(GcAction::RemoveFinalizer {
        key: key.clone(),
        namespace: meta::namespace(owner).to_owned(),
        name: meta::name(owner).to_owned(),
        finalizer,
    })
}

/// The collector, over the API's objects.
#[derive(Debug)]
pub(crate) struct Collector {
    objects: Arc<ApiObjects>,
}

impl Collector {
    pub(crate) fn new(objects: Arc<ApiObjects>) -> Self {
        Self { objects }
    }

    fn lookup(&self, uid: &str) -> Option<(StorageKey, Arc<Value>)> {
        let (key, (namespace, name)) = self.objects.store.locate_uid(uid)?;
        let object = self.objects.store.get(&key, &namespace, &name)?;
        Some((key, object))
    }

    fn check_dependent(&self, key: &StorageKey, dependent: &Value) {
        let namespace = meta::namespace(dependent).to_owned();
        let state = |owner: &OwnerRef| {
            let found = self.lookup(&owner.uid).map(|(_, object)| object);
            owner_state(found.as_deref(), &namespace)
        };
        if let Some(action) = dependent_action(key, dependent, &state) {
            self.execute(action);
        }
    }

    fn check_owner_uid(&self, uid: &str) {
        let dependents: Vec<(StorageKey, Arc<Value>)> = self
            .objects
            .store
            .dependents_of(uid)
            .into_iter()
            .filter_map(|(key, (ns, name))| {
                self.objects
                    .store
                    .get(&key, &ns, &name)
                    .map(|object| (key, object))
            })
            .collect();
        for (key, dependent) in &dependents {
            self.check_dependent(key, dependent);
        }
        if let Some((key, owner)) = self.lookup(uid) {
            let remaining: Vec<Arc<Value>> = self
                .objects
                .store
                .dependents_of(uid)
                .into_iter()
                .filter_map(|(key, (ns, name))| self.objects.store.get(&key, &ns, &name))
                .collect();
            if let Some(action) = owner_action(&key, &owner, &remaining) {
                self.execute(action);
            }
        }
    }

    fn execute(&self, action: GcAction) {
        match action {
            GcAction::Delete {
                key,
                namespace,
                name,
                uid,
                propagation,
            } => {
                let Some(info) = self.objects.info_for_storage(&key) else {
                    return;
                };
                let options = DeleteOptions {
                    propagation,
                    uid: Some(uid),
                    ..DeleteOptions::default()
                };
                if let Err(error) = self.objects.delete(&info, &namespace, &name, &options) {
                    tracing::debug!(%namespace, %name, %error, "garbage collection delete skipped");
                }
            }
            GcAction::RemoveOwnerRefs {
                key,
                namespace,
                name,
                owner_uids,
            } => {
                self.objects.mutate(&key, &namespace, &name, |object| {
                    let Some(Value::Array(refs)) = object.pointer_mut("/metadata/ownerReferences")
                    else {
                        return false;
                    };
                    let before = refs.len();
                    refs.retain(|r| {
                        !owner_uids
                            .iter()
                            .any(|uid| r.get("uid").and_then(Value::as_str) == Some(uid))
                    });
                    let changed = before != refs.len();
                    if refs.is_empty()
                        && let Some(m) = object.get_mut("metadata").and_then(Value::as_object_mut)
                    {
                        m.remove("ownerReferences");
                    }
                    changed
                });
            }
            GcAction::RemoveFinalizer {
                key,
                namespace,
                name,
                finalizer,
            } => {
                self.objects.mutate(&key, &namespace, &name, |object| {
                    let mut finalizers = meta::finalizers(object);
                    let before = finalizers.len();
                    finalizers.retain(|f| f != finalizer);
                    meta::set_finalizers(object, &finalizers);
                    before != finalizers.len()
                });
            }
        }
    }

    /// Reacts to one change.
    pub(crate) fn handle(&self, change: &Change) {
        let mut owners: BTreeSet<String> = BTreeSet::new();
        let object = &change.object;
        for owner in meta::owner_refs(object) {
            owners.insert(owner.uid);
        }
        if let Some(old) = &change.old {
            for owner in meta::owner_refs(old) {
                owners.insert(owner.uid);
            }
        }
        match change.kind {
            EventType::Deleted => {
                owners.insert(meta::uid(object).to_owned());
            }
            EventType::Added | EventType::Modified => {
                if meta::is_deleting(object) {
                    owners.insert(meta::uid(object).to_owned());
                }
                if !meta::owner_refs(object).is_empty() {
                    self.check_dependent(&change.key, object);
                }
            }
        }
        for uid in owners {
            self.check_owner_uid(&uid);
        }
    }

    /// Re-examines every ownership (after missed events).
    pub(crate) fn resync(&self) {
        for uid in self.objects.store.owner_uids() {
            self.check_owner_uid(&uid);
        }
    }
}

/// Runs the collector until the event channel closes.
pub(crate) async fn run(collector: Collector, mut events: broadcast::Receiver<Arc<Change>>) {
    loop {
        match events.recv().await {
            Ok(change) => collector.handle(&change),
            Err(RecvError::Lagged(_)) => collector.resync(),
            Err(RecvError::Closed) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn key() -> StorageKey {
        StorageKey::new("", "pods")
    }

    fn dependent(owners: &[(&str, bool)]) -> Value {
        let refs: Vec<Value> = owners
            .iter()
            .map(|(uid, block)| {
                json!({"apiVersion": "v1", "kind": "X", "name": "o", "uid": uid,
                                       "blockOwnerDeletion": block})
            })
            .collect();
        json!({"metadata": {"name": "d", "namespace": "ns", "uid": "d-uid", "ownerReferences": refs}})
    }

    #[test]
    fn dependents_of_vanished_owners_are_deleted() {
        let action = dependent_action(&key(), &dependent(&[("a", false)]), &|_| OwnerState::Absent);
        assert_eq!(
            action,
            Some(GcAction::Delete {
                key: key(),
                namespace: "ns".into(),
                name: "d".into(),
                uid: "d-uid".into(),
                propagation: Propagation::Background
            })
        );
    }

    #[test]
    fn a_live_owner_keeps_the_dependent_and_drops_dangling_refs() {
        let state = |o: &OwnerRef| {
            if o.uid == "a" {
                OwnerState::Present
            } else {
                OwnerState::Absent
            }
        };
        let action = dependent_action(&key(), &dependent(&[("a", false), ("b", false)]), &state);
        assert_eq!(
            action,
            Some(GcAction::RemoveOwnerRefs {
                key: key(),
                namespace: "ns".into(),
                name: "d".into(),
                owner_uids: vec!["b".into()]
            })
        );
        assert_eq!(
            dependent_action(&key(), &dependent(&[("a", false)]), &state),
            None
        );
    }

    #[test]
    fn foreground_and_orphan_owners() {
        let foreground = dependent_action(&key(), &dependent(&[("a", true)]), &|_| {
            OwnerState::DeletingForeground
        });
        assert!(matches!(
            foreground,
            Some(GcAction::Delete {
                propagation: Propagation::Foreground,
                ..
            })
        ));
        let orphan = dependent_action(&key(), &dependent(&[("a", true)]), &|_| {
            OwnerState::Orphaning
        });
        assert!(matches!(orphan, Some(GcAction::RemoveOwnerRefs { .. })));
    }

    #[test]
    fn owners_release_their_finalizer_when_blocking_dependents_are_gone() {
        let owner = json!({"metadata": {"name": "o", "namespace": "ns", "uid": "a",
            "deletionTimestamp": "2024-01-01T00:00:00Z", "finalizers": [FOREGROUND]}});
        let blocking = Arc::new(dependent(&[("a", true)]));
        let loose = Arc::new(dependent(&[("a", false)]));
        assert_eq!(owner_action(&key(), &owner, &[blocking]), None);
        assert!(matches!(
            owner_action(&key(), &owner, &[loose]),
            Some(GcAction::RemoveFinalizer {
                finalizer: FOREGROUND,
                ..
            })
        ));
        assert_eq!(owner_state(Some(&owner), "other"), OwnerState::Absent);
        assert_eq!(
            owner_state(Some(&owner), "ns"),
            OwnerState::DeletingForeground
        );
    }
}
