//! The subset of Kubernetes JSONPath that CRD printer columns use (sans IO): `.a.b`, `['a.b']`,
//! `[0]`, `[*]`, `.*` and filters `[?(@.x.y=='v')]` / `!=`.

use serde_json::Value;

#[derive(Clone, Debug, PartialEq)]
enum Step {
    Field(String),
    Index(i64),
    Wildcard,
    Filter {
        path: Vec<String>,
        equals: bool,
        value: Value,
    },
}

/// A compiled path.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct JsonPath(Vec<Step>);

fn parse_literal(text: &str) -> Result<Value, String> {
    let text = text.trim();
    if let Some(inner) = text
        .strip_prefix('\'')
        .and_then(|rest| rest.strip_suffix('\''))
        .or_else(|| {
            text.strip_prefix('"')
                .and_then(|rest| rest.strip_suffix('"'))
        })
    {
        return Ok(Value::String(inner.to_owned()));
    }
    serde_json::from_str(text).map_err(|_| format!("invalid literal {text:?}"))
}

impl JsonPath {
    /// Parses an expression such as `.status.conditions[?(@.type=='Ready')].status`, with or
    /// without surrounding `{}` and a leading `$`.
    pub(crate) fn parse(expr: &str) -> Result<Self, String> {
        let mut text = expr.trim();
        if let Some(inner) = text.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
            text = inner.trim();
        }
        text = text.strip_prefix('$').unwrap_or(text);
        let mut steps = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix('.') {
                let end = after.find(['.', '[']).unwrap_or(after.len());
                let name = &after[..end];
                if name == "*" {
                    steps.push(Step::Wildcard);
                } else if !name.is_empty() {
                    steps.push(Step::Field(name.to_owned()));
                }
                rest = &after[end..];
            } else if let Some(after) = rest.strip_prefix('[') {
                let end =
                    matching_bracket(after).ok_or_else(|| format!("unclosed '[' in {expr:?}"))?;
                let inner = after[..end].trim();
                rest = &after[end + 1..];
                if inner == "*" {
                    steps.push(Step::Wildcard);
                } else if let Some(filter) =
                    inner.strip_prefix("?(").and_then(|f| f.strip_suffix(')'))
                {
                    steps.push(parse_filter(filter)?);
                } else if inner.starts_with('\'') || inner.starts_with('"') {
                    match parse_literal(inner)? {
                        Value::String(name) => steps.push(Step::Field(name)),
                        _ => return Err(format!("invalid key in {expr:?}")),
                    }
                } else {
                    let index = inner
                        .parse()
                        .map_err(|_| format!("invalid index {inner:?} in {expr:?}"))?;
                    steps.push(Step::Index(index));
                }
            } else {
                return Err(format!("unexpected {rest:?} in {expr:?}"));
            }
        }
        Ok(Self(steps))
    }

    /// Every value the path selects in `root`, in document order.
    pub(crate) fn find<'a>(&self, root: &'a Value) -> Vec<&'a Value> {
        let mut current = vec![root];
        for step in &self.0 {
            let mut next = Vec::new();
            for value in current {
                match step {
                    Step::Field(name) => next.extend(value.get(name)),
                    Step::Index(index) => {
                        if let Value::Array(items) = value {
                            let len = i64::try_from(items.len()).unwrap_or(i64::MAX);
                            let at = if *index < 0 { len + index } else { *index };
                            if let Ok(at) = usize::try_from(at) {
                                next.extend(items.get(at));
                            }
                        }
                    }
                    Step::Wildcard => match value {
                        Value::Array(items) => next.extend(items.iter()),
                        Value::Object(map) => next.extend(map.values()),
                        _ => {}
                    },
                    Step::Filter {
                        path,
                        equals,
                        value: expected,
                    } => {
                        if let Value::Array(items) = value {
                            next.extend(items.iter().filter(|item| {
                                let actual = path
                                    .iter()
                                    .try_fold(*item, |v, segment| v.get(segment.as_str()));
                                (actual == Some(expected)) == *equals
                            }));
                        }
                    }
                }
            }
            current = next;
        }
        current
    }
}

fn matching_bracket(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    for (index, ch) in text.char_indices() {
        match (quote, ch) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(ch),
            (None, '[') => depth += 1,
            (None, ']') if depth == 0 => return Some(index),
            (None, ']') => depth -= 1,
            _ => {}
        }
    }
    None
}

fn parse_filter(filter: &str) -> Result<Step, String> {
    let (left, equals, right) = if let Some((l, r)) = filter.split_once("!=") {
        (l, false, r)
    } else if let Some((l, r)) = filter.split_once("==") {
        (l, true, r)
    } else {
        return Err(format!("unsupported filter {filter:?}"));
    };
    let left = left.trim();
    let path = left
        .strip_prefix("@.")
        .ok_or_else(|| format!("filter must start with '@.': {filter:?}"))?;
    Ok(Step::Filter {
        path: path.split('.').map(str::to_owned).collect(),
        equals,
        value: parse_literal(right)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn printer_column_paths() {
        let obj = json!({
            "metadata": {"creationTimestamp": "2024-01-01T00:00:00Z", "labels": {"a.b/c": "d"}},
            "spec": {"replicas": 3},
            "status": {"conditions": [
                {"type": "Other", "status": "False"},
                {"type": "Ready", "status": "True", "reason": "DependenciesReady"}
            ]}
        });
        let one = |expr: &str| {
            JsonPath::parse(expr)
                .unwrap()
                .find(&obj)
                .first()
                .cloned()
                .cloned()
        };
        assert_eq!(one(".spec.replicas"), Some(json!(3)));
        assert_eq!(one("{.spec.replicas}"), Some(json!(3)));
        assert_eq!(
            one(".status.conditions[?(@.type=='Ready')].status"),
            Some(json!("True"))
        );
        assert_eq!(
            one(".status.conditions[?(@.type!=\"Ready\")].type"),
            Some(json!("Other"))
        );
        assert_eq!(
            one(".status.conditions[-1].reason"),
            Some(json!("DependenciesReady"))
        );
        assert_eq!(one(".metadata.labels['a.b/c']"), Some(json!("d")));
        assert_eq!(
            JsonPath::parse(".status.conditions[*].type")
                .unwrap()
                .find(&obj)
                .len(),
            2
        );
        assert_eq!(one(".status.missing"), None);
        assert!(JsonPath::parse(".a[").is_err());
    }
}
