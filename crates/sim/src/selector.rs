//! Label and field selectors: parsing the query-string syntax and matching objects (sans IO).
//!
//! Label selectors support the full syntax (`a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`,
//! `a`, `!a`, `a>1`, `a<1`). Field selectors support `=`, `==` and `!=` on any dotted path of the
//! object; the real API server accepts only a per-resource list of fields (see `docs/sim.md`).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::meta;

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LabelRequirement {
    /// `key=value` / `key==value`.
    Equals(String, String),
    /// `key!=value` (also matches objects without the key).
    NotEquals(String, String),
    /// `key in (a,b)`.
    In(String, Vec<String>),
    /// `key notin (a,b)` (also matches objects without the key).
    NotIn(String, Vec<String>),
    /// `key`.
    Exists(String),
    /// `!key`.
    DoesNotExist(String),
    /// `key>n` (integer comparison).
    GreaterThan(String, i64),
    /// `key<n` (integer comparison).
    LessThan(String, i64),
}

/// A parsed label selector: all requirements must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LabelSelector(pub(crate) Vec<LabelRequirement>);

/// Splits at commas that are not inside parentheses.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (index, ch) in text.char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn parse_set(text: &str) -> Result<Vec<String>, String> {
    let text = text.trim();
    let inner = text
        .strip_prefix('(')
        .and_then(|rest| rest.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesised set of values, found {text:?}"))?;
    Ok(inner
        .split(',')
        .map(|value| value.trim().to_owned())
        .collect())
}

fn check_key(key: &str) -> Result<String, String> {
    let key = key.trim();
    if key.is_empty()
        || !key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
    {
        return Err(format!("invalid label key {key:?}"));
    }
    Ok(key.to_owned())
}

impl LabelSelector {
    /// Parses the query-string form; an empty string selects everything.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        if text.trim().is_empty() {
            return Ok(Self(requirements));
        }
        for part in split_top_level(text) {
            let part = part.trim();
            if part.is_empty() {
                return Err(format!("empty requirement in label selector {text:?}"));
            }
            let requirement = if let Some(key) = part.strip_prefix('!') {
                LabelRequirement::DoesNotExist(check_key(key)?)
            } else if let Some((key, values)) = part.split_once(" notin ") {
                LabelRequirement::NotIn(check_key(key)?, parse_set(values)?)
            } else if let Some((key, values)) = part.split_once(" in ") {
                LabelRequirement::In(check_key(key)?, parse_set(values)?)
            } else if let Some((key, value)) = part.split_once("!=") {
                LabelRequirement::NotEquals(check_key(key)?, value.trim().to_owned())
            } else if let Some((key, value)) = part.split_once("==") {
                LabelRequirement::Equals(check_key(key)?, value.trim().to_owned())
            } else if let Some((key, value)) = part.split_once('=') {
                LabelRequirement::Equals(check_key(key)?, value.trim().to_owned())
            } else if let Some((key, value)) = part.split_once('>') {
                let bound = value
                    .trim()
                    .parse()
                    .map_err(|_| format!("invalid integer in {part:?}"))?;
                LabelRequirement::GreaterThan(check_key(key)?, bound)
            } else if let Some((key, value)) = part.split_once('<') {
                let bound = value
                    .trim()
                    .parse()
                    .map_err(|_| format!("invalid integer in {part:?}"))?;
                LabelRequirement::LessThan(check_key(key)?, bound)
            } else {
                LabelRequirement::Exists(check_key(part)?)
            };
            requirements.push(requirement);
        }
        Ok(Self(requirements))
    }

    /// A selector from an equality map (a Service's `spec.selector`).
    pub(crate) fn from_map(map: &BTreeMap<String, String>) -> Self {
        Self(
            map.iter()
                .map(|(k, v)| LabelRequirement::Equals(k.clone(), v.clone()))
                .collect(),
        )
    }

    /// Whether `labels` satisfy every requirement.
    pub(crate) fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|requirement| match requirement {
            LabelRequirement::Equals(key, value) => labels.get(key) == Some(value),
            LabelRequirement::NotEquals(key, value) => labels.get(key) != Some(value),
            LabelRequirement::In(key, values) => {
                labels.get(key).is_some_and(|v| values.contains(v))
            }
            LabelRequirement::NotIn(key, values) => {
                labels.get(key).is_none_or(|v| !values.contains(v))
            }
            LabelRequirement::Exists(key) => labels.contains_key(key),
            LabelRequirement::DoesNotExist(key) => !labels.contains_key(key),
            LabelRequirement::GreaterThan(key, bound) => labels
                .get(key)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v > *bound),
            LabelRequirement::LessThan(key, bound) => labels
                .get(key)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v < *bound),
        })
    }

    /// Whether the selector has no requirement.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// One requirement of a field selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FieldRequirement {
    /// Dotted path, e.g. `metadata.name`.
    pub(crate) path: String,
    /// `==` when true, `!=` when false.
    pub(crate) equals: bool,
    /// The value compared with.
    pub(crate) value: String,
}

/// A parsed field selector.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FieldSelector(pub(crate) Vec<FieldRequirement>);

impl FieldSelector {
    /// Parses `a.b=c,d!=e`; an empty string selects everything.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        if text.trim().is_empty() {
            return Ok(Self(requirements));
        }
        for part in text.split(',') {
            let (path, equals, value) = if let Some((path, value)) = part.split_once("!=") {
                (path, false, value)
            } else if let Some((path, value)) = part.split_once("==") {
                (path, true, value)
            } else if let Some((path, value)) = part.split_once('=') {
                (path, true, value)
            } else {
                return Err(format!("invalid field selector requirement {part:?}"));
            };
            let path = path.trim();
            if path.is_empty() {
                return Err(format!("invalid field selector requirement {part:?}"));
            }
            requirements.push(FieldRequirement {
                path: path.to_owned(),
                equals,
                value: value.trim().to_owned(),
            });
        }
        Ok(Self(requirements))
    }

    /// Whether `obj` satisfies every requirement; a missing field compares as the empty string.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|requirement| {
            let actual = meta::dotted(obj, &requirement.path)
                .map(meta::scalar_text)
                .unwrap_or_default();
            (actual == requirement.value) == requirement.equals
        })
    }
}

/// Both selectors of a list or watch.
#[derive(Clone, Debug, Default)]
pub(crate) struct Selectors {
    pub(crate) labels: LabelSelector,
    pub(crate) fields: FieldSelector,
}

impl Selectors {
    /// Whether `obj` is selected.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        (self.labels.is_empty() || self.labels.matches(&meta::labels(obj)))
            && self.fields.matches(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn parses_every_operator() {
        let selector =
            LabelSelector::parse("a=1,b==2,c!=3,d in (x, y),e notin (z),f,!g,h>4,i<5").unwrap();
        assert_eq!(
            selector.0,
            vec![
                LabelRequirement::Equals("a".into(), "1".into()),
                LabelRequirement::Equals("b".into(), "2".into()),
                LabelRequirement::NotEquals("c".into(), "3".into()),
                LabelRequirement::In("d".into(), vec!["x".into(), "y".into()]),
                LabelRequirement::NotIn("e".into(), vec!["z".into()]),
                LabelRequirement::Exists("f".into()),
                LabelRequirement::DoesNotExist("g".into()),
                LabelRequirement::GreaterThan("h".into(), 4),
                LabelRequirement::LessThan("i".into(), 5),
            ]
        );
    }

    #[test]
    fn matching_follows_kubernetes_semantics() {
        let have = labels(&[("app", "web"), ("tier", "front"), ("n", "7")]);
        let yes = [
            "",
            "app=web",
            "app in (web,db)",
            "zone notin (a)",
            "zone!=a",
            "tier",
            "!zone",
            "n>6",
        ];
        let no = [
            "app=db",
            "app notin (web)",
            "zone in (a)",
            "!tier",
            "n<7",
            "app=web,tier=back",
        ];
        for text in yes {
            assert!(LabelSelector::parse(text).unwrap().matches(&have), "{text}");
        }
        for text in no {
            assert!(
                !LabelSelector::parse(text).unwrap().matches(&have),
                "{text}"
            );
        }
    }

    #[test]
    fn rejects_malformed_selectors() {
        assert!(LabelSelector::parse("a in x").is_err());
        assert!(LabelSelector::parse("a,,b").is_err());
        assert!(LabelSelector::parse("a b=c").is_err());
        assert!(FieldSelector::parse("metadata.name").is_err());
    }

    #[test]
    fn field_selectors_compare_dotted_paths() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns"},
                         "spec": {"nodeName": "sim-node"}, "status": {"phase": "Running"}});
        let selector = FieldSelector::parse("metadata.name=p,status.phase!=Failed").unwrap();
        assert!(selector.matches(&pod));
        assert!(
            !FieldSelector::parse("spec.nodeName=")
                .unwrap()
                .matches(&pod)
        );
        assert!(FieldSelector::parse("spec.missing=").unwrap().matches(&pod));
    }
}
