//! Kubernetes name syntax, as the API server validates it (apimachinery's `validation` package):
//! DNS-1123 labels and subdomains (names of objects and namespaces), qualified names (label and
//! annotation keys) and label values.
//!
//! The router checks routing headers with these, the sim admits objects with them and the
//! controller checks a claim's `additionalPodMetadata` with them, so that the three can never
//! disagree about what a name is.

/// Longest DNS-1123 label, label value, and name part of a qualified name.
pub const MAX_LABEL_LEN: usize = 63;
/// Longest DNS-1123 subdomain (and prefix of a qualified name).
pub const MAX_SUBDOMAIN_LEN: usize = 253;

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, of any length.
fn is_label_shaped(value: &str) -> bool {
    let bytes = value.as_bytes();
    let alphanumeric = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    bytes.first().is_some_and(alphanumeric)
        && bytes.last().is_some_and(alphanumeric)
        && bytes.iter().all(|b| alphanumeric(b) || *b == b'-')
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, of any length: label values and the name part of
/// qualified names.
fn is_name_shaped(value: &str) -> bool {
    let bytes = value.as_bytes();
    bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Whether `value` is a DNS-1123 label: 1 to 63 of `[a-z0-9-]`, starting and ending with a
/// letter or digit. Namespace, Service and container names are labels; so are Sandbox names as
/// the router takes them, so a dot, a slash or anything else that could steer it elsewhere is
/// refused.
pub fn is_dns_label(value: &str) -> bool {
    value.len() <= MAX_LABEL_LEN && is_label_shaped(value)
}

/// Whether `value` is a DNS-1123 subdomain: dot-separated label-shaped parts, at most 253
/// characters in all (the API server limits the whole, not each part). Most object names are
/// subdomains.
pub fn is_dns_subdomain(value: &str) -> bool {
    value.len() <= MAX_SUBDOMAIN_LEN && value.split('.').all(is_label_shaped)
}

/// Whether `key` is a qualified name, the syntax of label and annotation keys: an optional
/// DNS-1123 subdomain prefix and `/`, then 1 to 63 of `[A-Za-z0-9-_.]` starting and ending with
/// a letter or digit (`app`, `sandbox.users.io/session`).
pub fn is_qualified_name(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    prefix.is_none_or(is_dns_subdomain) && name.len() <= MAX_LABEL_LEN && is_name_shaped(name)
}

/// Whether `value` is a label value: empty, or 1 to 63 of `[A-Za-z0-9-_.]` starting and ending
/// with a letter or digit.
pub fn is_label_value(value: &str) -> bool {
    value.is_empty() || (value.len() <= MAX_LABEL_LEN && is_name_shaped(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn dns_labels() {
        for good in ["a", "my-sandbox", "0abc", "a--b", &"a".repeat(63)] {
            assert!(is_dns_label(good), "{good}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a.b",
            "a/b",
            "..",
            "a b",
            "a_b",
            &"a".repeat(64),
            "é",
        ] {
            assert!(!is_dns_label(bad), "{bad}");
        }
    }

    #[test]
    fn dns_subdomains() {
        for good in ["a", "a-b.c", "pool-x1.default", &"a".repeat(253)] {
            assert!(is_dns_subdomain(good), "{good}");
        }
        // Like the API server, parts are not limited to 63 characters, only the whole.
        assert!(is_dns_subdomain(&format!("{}.b", "a".repeat(100))));
        for bad in [
            "",
            "A",
            ".a",
            "a.",
            "a..b",
            "-a.b",
            "a-.b",
            "a_b",
            &"a".repeat(254),
        ] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
    }

    #[test]
    fn qualified_names() {
        for good in [
            "app",
            "App_1.x",
            "sandbox.users.io/session",
            "team.sandbox.users.io/x",
            "example.com/Note-1",
            &"a".repeat(63),
            &format!("{}/a", "b".repeat(253)),
        ] {
            assert!(is_qualified_name(good), "{good}");
        }
        for bad in [
            "",
            "/a",
            "a/",
            "a/b/c",
            "Example.com/a",
            "-a",
            "a_",
            "not valid",
            &"a".repeat(64),
            &format!("{}/a", "b".repeat(254)),
        ] {
            assert!(!is_qualified_name(bad), "{bad}");
        }
    }

    #[test]
    fn label_values() {
        for good in ["", "a", "A.b-c_D", "1", &"a".repeat(63)] {
            assert!(is_label_value(good), "{good}");
        }
        for bad in [
            "-a",
            "a-",
            ".a",
            "a b",
            "not valid!",
            "a/b",
            &"a".repeat(64),
            "é",
        ] {
            assert!(!is_label_value(bad), "{bad}");
        }
    }

    /// The patterns of apimachinery's validation package, checked character by character.
    fn oracle_label_shaped(value: &str) -> bool {
        let chars: Vec<char> = value.chars().collect();
        let edge = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        match chars.as_slice() {
            [] => false,
            [one] => edge(*one),
            [first, middle @ .., last] => {
                edge(*first) && edge(*last) && middle.iter().all(|c| edge(*c) || *c == '-')
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn labels_match_the_pattern(value in "[a-zA-Z0-9._/ -]{0,70}|\\PC{0,8}") {
            prop_assert_eq!(
                is_dns_label(&value),
                value.len() <= 63 && oracle_label_shaped(&value)
            );
        }

        #[test]
        fn subdomains_are_dotted_labels(parts in proptest::collection::vec("[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", 1..12)) {
            let name = parts.join(".");
            prop_assert_eq!(is_dns_subdomain(&name), name.len() <= 253);
            // Every label is a subdomain, a qualified name and a label value.
            if let Some(first) = parts.first() {
                prop_assert!(is_dns_label(first));
                prop_assert!(is_qualified_name(first));
                prop_assert!(is_label_value(first));
            }
        }

        #[test]
        fn a_qualified_name_is_a_subdomain_slash_a_name(
            prefix in proptest::option::of("[a-z0-9]([a-z0-9.-]{0,30}[a-z0-9])?"),
            name in "[A-Za-z0-9._-]{0,70}",
        ) {
            let key = match &prefix {
                Some(prefix) => format!("{prefix}/{name}"),
                None => name.clone(),
            };
            let prefix_ok = prefix.as_deref().is_none_or(is_dns_subdomain);
            // A label value that is not empty is exactly a valid name part.
            let name_ok = !name.is_empty() && is_label_value(&name);
            prop_assert_eq!(is_qualified_name(&key), prefix_ok && name_ok);
        }
    }
}
