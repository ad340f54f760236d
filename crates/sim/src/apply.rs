//! Server-side apply and field ownership (sans IO), approximated.
//!
//! Every write records which field manager owns which fields in `metadata.managedFields`
//! (`FieldsV1` format). An apply merges the manager's configuration into the live object, fails
//! with a conflict when it would change a field another manager owns (unless forced, which
//! takes the field over), and removes the fields the manager applied before and no longer
//! applies, unless another manager also owns them. Non-apply writes (create, update, patch) give
//! their manager the fields they changed. Lists merge by their [`ListType`] (CRD schema markers
//! or the built-in table). `docs/sim.md` lists where this differs from the real implementation.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::resources::ListType;

/// One step of a field path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Element {
    /// A map field.
    Field(String),
    /// An item of a map-type list, by the canonical JSON of its key fields.
    Key(String),
    /// An item of a set-type list, by its canonical JSON.
    Value(String),
}

/// A path from the object root.
pub(crate) type FieldPath = Vec<Element>;
/// The fields one manager owns.
pub(crate) type FieldSet = BTreeSet<FieldPath>;

/// One `metadata.managedFields` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ManagedEntry {
    pub(crate) manager: String,
    /// `Apply` or `Update`.
    pub(crate) operation: String,
    pub(crate) api_version: String,
    pub(crate) time: String,
    /// Empty for the main resource, `status` or `scale` otherwise.
    pub(crate) subresource: String,
    pub(crate) fields: FieldSet,
}

/// Gives the list type of a list by its field-name path.
pub(crate) type ListTypes<'a> = &'a dyn Fn(&[String]) -> ListType;

/// Metadata fields the server owns; never part of a field set.
const SERVER_METADATA: [&str; 10] = [
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

fn field_names(path: &FieldPath) -> Vec<String> {
    path.iter()
        .filter_map(|element| match element {
            Element::Field(name) => Some(name.clone()),
            _ => None,
        })
        .collect()
}

fn item_key(item: &Value, keys: &[String]) -> String {
    let mut key = Map::new();
    for name in keys {
        if let Some(value) = item.get(name) {
            key.insert(name.clone(), value.clone());
        }
    }
    Value::Object(key).to_string()
}

/// The fields set in `value`: leaves, empty maps, atomic lists, set members and map-list items.
pub(crate) fn field_set(value: &Value, lists: ListTypes<'_>) -> FieldSet {
    let mut out = FieldSet::new();
    let mut path = Vec::new();
    collect(value, &mut path, &mut out, lists, true);
    out
}

fn collect(
    value: &Value,
    path: &mut FieldPath,
    out: &mut FieldSet,
    lists: ListTypes<'_>,
    root: bool,
) {
    match value {
        Value::Object(map) if !map.is_empty() || root => {
            for (key, child) in map {
                if root && (key == "apiVersion" || key == "kind") {
                    continue;
                }
                if path.len() == 1
                    && path.first() == Some(&Element::Field("metadata".into()))
                    && SERVER_METADATA.contains(&key.as_str())
                {
                    continue;
                }
                path.push(Element::Field(key.clone()));
                collect(child, path, out, lists, false);
                path.pop();
            }
        }
        Value::Array(items) => match lists(&field_names(path)) {
            ListType::Atomic => {
                out.insert(path.clone());
            }
            ListType::Set => {
                for item in items {
                    let mut member = path.clone();
                    member.push(Element::Value(item.to_string()));
                    out.insert(member);
                }
            }
            ListType::Map(keys) => {
                for item in items {
                    path.push(Element::Key(item_key(item, &keys)));
                    out.insert(path.clone());
                    collect(item, path, out, lists, false);
                    path.pop();
                }
            }
        },
        _ => {
            out.insert(path.clone());
        }
    }
}

/// Whether a set item is the member encoded as `member` (canonical JSON).
fn same_member(item: &Value, member: &str) -> bool {
    serde_json::from_str::<Value>(member).is_ok_and(|parsed| parsed == *item)
}

/// The value at `path`.
pub(crate) fn get_at<'a>(
    value: &'a Value,
    path: &[Element],
    lists: ListTypes<'_>,
) -> Option<&'a Value> {
    let mut current = value;
    let mut names = Vec::new();
    for element in path {
        current = match element {
            Element::Field(name) => {
                names.push(name.clone());
                current.get(name)?
            }
            Element::Key(key) => {
                let keys = match lists(&names) {
                    ListType::Map(keys) => keys,
                    _ => return None,
                };
                current
                    .as_array()?
                    .iter()
                    .find(|item| item_key(item, &keys) == *key)?
            }
            Element::Value(member) => current
                .as_array()?
                .iter()
                .find(|item| same_member(item, member))?,
        };
    }
    Some(current)
}

/// Removes the value at `path`; returns whether something was removed.
fn remove_at(
    value: &mut Value,
    path: &[Element],
    names: &mut Vec<String>,
    lists: ListTypes<'_>,
) -> bool {
    let Some((first, rest)) = path.split_first() else {
        return false;
    };
    match first {
        Element::Field(name) => {
            let Value::Object(map) = value else {
                return false;
            };
            if rest.is_empty() {
                return map.remove(name).is_some();
            }
            names.push(name.clone());
            let removed = map
                .get_mut(name)
                .is_some_and(|child| remove_at(child, rest, names, lists));
            names.pop();
            removed
        }
        Element::Key(key) => {
            let keys = match lists(names) {
                ListType::Map(keys) => keys,
                _ => return false,
            };
            let Value::Array(items) = value else {
                return false;
            };
            let Some(index) = items.iter().position(|item| item_key(item, &keys) == *key) else {
                return false;
            };
            if rest.is_empty() {
                items.remove(index);
                return true;
            }
            items
                .get_mut(index)
                .is_some_and(|item| remove_at(item, rest, names, lists))
        }
        Element::Value(member) => {
            let Value::Array(items) = value else {
                return false;
            };
            let before = items.len();
            items.retain(|item| !same_member(item, member));
            before != items.len()
        }
    }
}

/// Merges an apply configuration into the live object.
fn merge(live: &mut Value, config: &Value, names: &mut Vec<String>, lists: ListTypes<'_>) {
    match (live, config) {
        (Value::Object(live_map), Value::Object(config_map)) => {
            for (key, value) in config_map {
                names.push(key.clone());
                match live_map.get_mut(key) {
                    Some(existing) => merge(existing, value, names, lists),
                    None => {
                        live_map.insert(key.clone(), value.clone());
                    }
                }
                names.pop();
            }
        }
        (Value::Array(live_items), Value::Array(config_items)) => match lists(names) {
            ListType::Atomic => *live_items = config_items.clone(),
            ListType::Set => {
                for item in config_items {
                    if !live_items.contains(item) {
                        live_items.push(item.clone());
                    }
                }
            }
            ListType::Map(keys) => {
                for item in config_items {
                    let key = item_key(item, &keys);
                    match live_items
                        .iter_mut()
                        .find(|candidate| item_key(candidate, &keys) == key)
                    {
                        Some(existing) => merge(existing, item, names, lists),
                        None => live_items.push(item.clone()),
                    }
                }
            }
        },
        (live, config) => *live = config.clone(),
    }
}

fn overlaps(a: &FieldPath, b: &FieldPath) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// Whether a manager owning `owned` contends for `path`, which an apply sets: the same field,
/// an owned atomic value (list or scalar) containing it, or an owned field inside the atomic
/// value the apply sets. Owning a map does not contend with adding keys to it.
fn contends(
    owned: &FieldPath,
    path: &FieldPath,
    live: &Value,
    config: &Value,
    lists: ListTypes<'_>,
) -> bool {
    if owned == path {
        return true;
    }
    if path.starts_with(owned) {
        return !get_at(live, owned, lists).is_some_and(Value::is_object);
    }
    if owned.starts_with(path) {
        return !get_at(config, path, lists).is_some_and(Value::is_object);
    }
    false
}

/// Renders a path the way apply conflicts name fields: `.spec.containers[name="c"].image`.
pub(crate) fn render_path(path: &FieldPath) -> String {
    let mut out = String::new();
    for element in path {
        match element {
            Element::Field(name) => {
                out.push('.');
                out.push_str(name);
            }
            Element::Key(key) => {
                let parsed: Map<String, Value> = serde_json::from_str(key).unwrap_or_default();
                let parts: Vec<String> = parsed.iter().map(|(k, v)| format!("{k}={v}")).collect();
                out.push('[');
                out.push_str(&parts.join(","));
                out.push(']');
            }
            Element::Value(member) => {
                out.push_str("[=");
                out.push_str(member);
                out.push(']');
            }
        }
    }
    out
}

/// What an apply produced.
#[derive(Debug)]
pub(crate) struct Applied {
    pub(crate) object: Value,
    pub(crate) managed: Vec<ManagedEntry>,
}

/// Applies `config` as `manager` to `live` (an empty object when creating).
///
/// `config` and `live` are the parts of the object the endpoint governs (the status
/// subresource passes only `status`). Returns the conflicts as (manager, field) when not forced.
#[allow(clippy::too_many_arguments)]
pub(crate) fn apply(
    live: &Value,
    config: &Value,
    manager: &str,
    force: bool,
    managed: &[ManagedEntry],
    subresource: &str,
    api_version: &str,
    time: &str,
    lists: ListTypes<'_>,
) -> Result<Applied, Vec<(String, String)>> {
    let new_set = field_set(config, lists);
    let mut entries: Vec<ManagedEntry> = managed.to_vec();
    let mine = |entry: &ManagedEntry| {
        entry.manager == manager && entry.operation == "Apply" && entry.subresource == subresource
    };
    let old_set = entries
        .iter()
        .find(|entry| mine(entry))
        .map(|entry| entry.fields.clone())
        .unwrap_or_default();

    // Conflicts: a field another manager owns, which this apply would change.
    let mut conflicts = Vec::new();
    let mut taken: BTreeSet<FieldPath> = BTreeSet::new();
    for path in &new_set {
        let wanted = get_at(config, path, lists);
        let current = get_at(live, path, lists);
        let differs = match (wanted, current) {
            (Some(Value::Object(_)), Some(Value::Object(_))) => false,
            (wanted, current) => wanted != current,
        };
        if !differs {
            continue;
        }
        for entry in &entries {
            if entry.manager == manager {
                continue;
            }
            for owned in &entry.fields {
                if contends(owned, path, live, config, lists) {
                    if force {
                        taken.insert(owned.clone());
                    } else {
                        conflicts.push((entry.manager.clone(), render_path(path)));
                    }
                }
            }
        }
    }
    if !conflicts.is_empty() {
        conflicts.sort();
        conflicts.dedup();
        return Err(conflicts);
    }
    for entry in &mut entries {
        if entry.manager != manager {
            entry.fields.retain(|owned| !taken.contains(owned));
        }
    }

    let mut object = live.clone();
    merge(&mut object, config, &mut Vec::new(), lists);

    // Fields this manager stops applying go away unless someone else owns them.
    let others: Vec<&FieldPath> = entries
        .iter()
        .filter(|entry| !mine(entry))
        .flat_map(|entry| entry.fields.iter())
        .collect();
    let mut removed = Vec::new();
    for path in old_set.difference(&new_set) {
        if new_set.iter().any(|kept| kept.starts_with(path)) {
            continue;
        }
        if others.iter().any(|owned| overlaps(owned, path)) {
            continue;
        }
        if remove_at(&mut object, path, &mut Vec::new(), lists) {
            removed.push(path.clone());
        }
    }
    prune_empty_parents(&mut object, &removed, &new_set, &others, lists);

    let entry = ManagedEntry {
        manager: manager.to_owned(),
        operation: "Apply".to_owned(),
        api_version: api_version.to_owned(),
        time: time.to_owned(),
        subresource: subresource.to_owned(),
        fields: new_set,
    };
    // In place, so that re-applying the same configuration is a no-op.
    match entries.iter().position(mine) {
        Some(index) => entries[index] = entry,
        None => entries.push(entry),
    }
    entries.retain(|entry| !entry.fields.is_empty());
    Ok(Applied {
        object,
        managed: entries,
    })
}

/// Removes maps left empty by removals, unless someone owns them as such.
fn prune_empty_parents(
    object: &mut Value,
    removed: &[FieldPath],
    new_set: &FieldSet,
    others: &[&FieldPath],
    lists: ListTypes<'_>,
) {
    for path in removed {
        let mut parent = path.clone();
        while parent.len() > 1 {
            parent.pop();
            if !matches!(parent.last(), Some(Element::Field(_))) {
                break;
            }
            let empty = get_at(object, &parent, lists)
                .is_some_and(|value| value.as_object().is_some_and(Map::is_empty));
            let owned = new_set.contains(&parent) || others.iter().any(|p| **p == parent);
            if !empty || owned {
                break;
            }
            remove_at(object, &parent, &mut Vec::new(), lists);
        }
    }
}

/// Records a non-apply write by `manager`: it owns the fields it added or changed, which other
/// managers lose; fields the write removed leave every set.
#[allow(clippy::too_many_arguments)]
pub(crate) fn track_update(
    old: &Value,
    new: &Value,
    manager: &str,
    managed: &[ManagedEntry],
    subresource: &str,
    api_version: &str,
    time: &str,
    lists: ListTypes<'_>,
) -> Vec<ManagedEntry> {
    let old_set = field_set(old, lists);
    let new_set = field_set(new, lists);
    let changed: FieldSet = new_set
        .iter()
        .filter(|path| {
            let before = get_at(old, path, lists);
            let after = get_at(new, path, lists);
            match (before, after) {
                (Some(Value::Object(_)), Some(Value::Object(_))) => false,
                (before, after) => before != after,
            }
        })
        .cloned()
        .collect();
    let mut entries: Vec<ManagedEntry> = managed.to_vec();
    for entry in &mut entries {
        entry
            .fields
            .retain(|path| new_set.contains(path) || !old_set.contains(path));
        if entry.manager != manager || entry.operation != "Update" {
            entry.fields.retain(|path| !changed.contains(path));
        }
    }
    if !changed.is_empty() {
        let position = entries.iter().position(|entry| {
            entry.manager == manager
                && entry.operation == "Update"
                && entry.subresource == subresource
        });
        let entry = match position {
            Some(index) => &mut entries[index],
            None => {
                entries.push(ManagedEntry {
                    manager: manager.to_owned(),
                    operation: "Update".to_owned(),
                    api_version: api_version.to_owned(),
                    time: String::new(),
                    subresource: subresource.to_owned(),
                    fields: FieldSet::new(),
                });
                let last = entries.len() - 1;
                &mut entries[last]
            }
        };
        entry.time = time.to_owned();
        entry.api_version = api_version.to_owned();
        entry.fields.extend(changed);
    }
    entries.retain(|entry| !entry.fields.is_empty());
    entries
}

fn encode(element: &Element) -> String {
    match element {
        Element::Field(name) => format!("f:{name}"),
        Element::Key(key) => format!("k:{key}"),
        Element::Value(member) => format!("v:{member}"),
    }
}

fn decode(text: &str) -> Option<Element> {
    let (prefix, rest) = text.split_at_checked(2)?;
    match prefix {
        "f:" => Some(Element::Field(rest.to_owned())),
        "k:" => Some(Element::Key(rest.to_owned())),
        "v:" => Some(Element::Value(rest.to_owned())),
        _ => None,
    }
}

#[derive(Default)]
struct Node {
    owned: bool,
    children: BTreeMap<String, Node>,
}

impl Node {
    fn to_json(&self) -> Value {
        let mut map = Map::new();
        if self.owned && !self.children.is_empty() {
            map.insert(".".into(), json!({}));
        }
        for (key, child) in &self.children {
            map.insert(key.clone(), child.to_json());
        }
        Value::Object(map)
    }
}

/// A field set in the `FieldsV1` format.
pub(crate) fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Node::default();
    for path in set {
        let mut node = &mut root;
        for element in path {
            node = node.children.entry(encode(element)).or_default();
        }
        node.owned = true;
    }
    root.to_json()
}

/// Parses the `FieldsV1` format.
pub(crate) fn from_fields_v1(value: &Value) -> FieldSet {
    fn walk(value: &Value, path: &mut FieldPath, out: &mut FieldSet) {
        let Some(map) = value.as_object() else {
            return;
        };
        if map.is_empty() && !path.is_empty() {
            out.insert(path.clone());
            return;
        }
        for (key, child) in map {
            if key == "." {
                out.insert(path.clone());
                continue;
            }
            if let Some(element) = decode(key) {
                path.push(element);
                walk(child, path, out);
                path.pop();
            }
        }
    }
    let mut out = FieldSet::new();
    walk(value, &mut Vec::new(), &mut out);
    out
}

/// Reads `metadata.managedFields`.
pub(crate) fn read_managed(obj: &Value) -> Vec<ManagedEntry> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|entries| {
            entries
                .iter()
                .map(|entry| {
                    let text = |field: &str| {
                        entry
                            .get(field)
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned()
                    };
                    ManagedEntry {
                        manager: text("manager"),
                        operation: text("operation"),
                        api_version: text("apiVersion"),
                        time: text("time"),
                        subresource: text("subresource"),
                        fields: entry
                            .get("fieldsV1")
                            .map(from_fields_v1)
                            .unwrap_or_default(),
                    }
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Writes `metadata.managedFields` (removed when empty).
pub(crate) fn write_managed(obj: &mut Value, entries: &[ManagedEntry]) {
    let meta = crate::meta::meta_mut(obj);
    if entries.is_empty() {
        meta.remove("managedFields");
        return;
    }
    let list: Vec<Value> = entries
        .iter()
        .map(|entry| {
            let mut value = json!({
                "manager": entry.manager,
                "operation": entry.operation,
                "apiVersion": entry.api_version,
                "time": entry.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": to_fields_v1(&entry.fields),
            });
            if !entry.subresource.is_empty() {
                value["subresource"] = json!(entry.subresource);
            }
            value
        })
        .collect();
    meta.insert("managedFields".into(), Value::Array(list));
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn lists(path: &[String]) -> ListType {
        match path.last().map(String::as_str) {
            Some("containers" | "conditions") if path.len() > 1 => {
                let key = if path.last().map(String::as_str) == Some("conditions") {
                    "type"
                } else {
                    "name"
                };
                ListType::Map(vec![key.into()])
            }
            Some("finalizers") => ListType::Set,
            _ => ListType::Atomic,
        }
    }

    fn run(
        live: &Value,
        config: Value,
        manager: &str,
        force: bool,
        managed: &[ManagedEntry],
    ) -> Result<Applied, Vec<(String, String)>> {
        apply(
            live, &config, manager, force, managed, "", "v1", "t", &lists,
        )
    }

    #[test]
    fn fields_v1_round_trips() {
        let value = json!({"metadata": {"name": "x", "labels": {"a": "1"}, "finalizers": ["f"]},
                           "spec": {"containers": [{"name": "c", "image": "i"}], "tags": ["t"]}});
        let set = field_set(&value, &lists);
        let v1 = to_fields_v1(&set);
        assert_eq!(
            v1,
            json!({"f:metadata": {"f:labels": {"f:a": {}}, "f:finalizers": {"v:\"f\"": {}}},
                   "f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {".": {}, "f:image": {}, "f:name": {}}},
                              "f:tags": {}}})
        );
        assert_eq!(from_fields_v1(&v1), set);
    }

    #[test]
    fn apply_creates_then_removes_fields_no_longer_applied() {
        let first = run(
            &json!({}),
            json!({"spec": {"a": 1, "b": 2}, "metadata": {"labels": {"x": "1"}}}),
            "m1",
            false,
            &[],
        )
        .unwrap();
        assert_eq!(
            first.object,
            json!({"spec": {"a": 1, "b": 2}, "metadata": {"labels": {"x": "1"}}})
        );
        let second = run(
            &first.object,
            json!({"spec": {"a": 1}}),
            "m1",
            false,
            &first.managed,
        )
        .unwrap();
        assert_eq!(second.object, json!({"spec": {"a": 1}}));
    }

    #[test]
    fn two_managers_conflict_share_and_force() {
        let one = run(
            &json!({}),
            json!({"spec": {"replicas": 1, "shared": "s"}}),
            "a",
            false,
            &[],
        )
        .unwrap();
        // Same value: shared ownership, no conflict.
        let two = run(
            &one.object,
            json!({"spec": {"shared": "s", "other": 2}}),
            "b",
            false,
            &one.managed,
        )
        .unwrap();
        // Different value: conflict naming the owner and the field.
        let conflict = run(
            &two.object,
            json!({"spec": {"replicas": 3}}),
            "b",
            false,
            &two.managed,
        )
        .unwrap_err();
        assert_eq!(
            conflict,
            vec![("a".to_owned(), ".spec.replicas".to_owned())]
        );
        // Forced: b takes the field over.
        let forced = run(
            &two.object,
            json!({"spec": {"replicas": 3, "shared": "s", "other": 2}}),
            "b",
            true,
            &two.managed,
        )
        .unwrap();
        assert_eq!(forced.object["spec"]["replicas"], json!(3));
        // a stops applying everything: replicas (now b's) and shared (also b's) stay.
        let after = run(
            &forced.object,
            json!({"spec": {}}),
            "a",
            false,
            &forced.managed,
        )
        .unwrap();
        assert_eq!(
            after.object,
            json!({"spec": {"replicas": 3, "shared": "s", "other": 2}})
        );
    }

    #[test]
    fn keyed_lists_merge_by_key_and_items_are_removed_when_unowned() {
        let one = run(
            &json!({}),
            json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
            "a",
            false,
            &[],
        )
        .unwrap();
        let two = run(
            &one.object,
            json!({"status": {"conditions": [{"type": "Other", "status": "False"}]}}),
            "b",
            false,
            &one.managed,
        )
        .unwrap();
        assert_eq!(
            two.object["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}, {"type": "Other", "status": "False"}])
        );
        let three = run(
            &two.object,
            json!({"status": {"conditions": []}}),
            "a",
            false,
            &two.managed,
        )
        .unwrap();
        assert_eq!(
            three.object["status"]["conditions"],
            json!([{"type": "Other", "status": "False"}])
        );
    }

    #[test]
    fn updates_take_ownership_of_changed_fields() {
        let applied = run(
            &json!({}),
            json!({"spec": {"a": 1, "b": 2}}),
            "applier",
            false,
            &[],
        )
        .unwrap();
        let updated = json!({"spec": {"a": 5, "b": 2}});
        let managed = track_update(
            &applied.object,
            &updated,
            "editor",
            &applied.managed,
            "",
            "v1",
            "t",
            &lists,
        );
        let editor = managed.iter().find(|e| e.manager == "editor").unwrap();
        assert_eq!(
            editor.fields,
            [vec![
                Element::Field("spec".into()),
                Element::Field("a".into())
            ]]
            .into_iter()
            .collect()
        );
        // The applier lost .spec.a, so re-applying without it keeps the editor's value.
        let again = run(
            &updated,
            json!({"spec": {"b": 2}}),
            "applier",
            false,
            &managed,
        )
        .unwrap();
        assert_eq!(again.object, json!({"spec": {"a": 5, "b": 2}}));
        // And re-applying a different value conflicts with the editor.
        let conflict = run(
            &updated,
            json!({"spec": {"a": 1, "b": 2}}),
            "applier",
            false,
            &managed,
        )
        .unwrap_err();
        assert_eq!(conflict, vec![("editor".to_owned(), ".spec.a".to_owned())]);
    }

    #[test]
    fn owning_a_map_does_not_contend_with_new_keys_but_an_atomic_list_does() {
        let created = track_update(
            &json!({}),
            &json!({"data": {}, "tags": ["a"]}),
            "creator",
            &[],
            "",
            "v1",
            "t",
            &lists,
        );
        let live = json!({"data": {}, "tags": ["a"]});
        assert!(
            run(
                &live,
                json!({"data": {"k": "v"}}),
                "applier",
                false,
                &created
            )
            .is_ok()
        );
        let conflict = run(&live, json!({"tags": ["b"]}), "applier", false, &created).unwrap_err();
        assert_eq!(conflict, vec![("creator".to_owned(), ".tags".to_owned())]);
    }

    #[test]
    fn managed_fields_serialise_into_metadata() {
        let applied = run(&json!({}), json!({"spec": {"a": 1}}), "m", false, &[]).unwrap();
        let mut obj = applied.object.clone();
        write_managed(&mut obj, &applied.managed);
        assert_eq!(obj["metadata"]["managedFields"][0]["manager"], json!("m"));
        assert_eq!(read_managed(&obj), applied.managed);
    }
}
