//! Request paths of the Kubernetes API, parsed (sans IO).

/// A resource request: which resource, which object, which subresource.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ResourcePath {
    pub(crate) group: String,
    pub(crate) version: String,
    pub(crate) namespace: Option<String>,
    pub(crate) plural: String,
    pub(crate) name: Option<String>,
    pub(crate) subresource: Option<String>,
    /// The legacy `/watch/` path prefix.
    pub(crate) watch: bool,
}

/// What a path addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    Version,
    Health,
    /// `/api`.
    CoreVersions,
    /// `/apis`.
    Groups,
    /// `/apis/{group}`.
    Group(String),
    /// `/api/v1`, `/apis/{group}/{version}`.
    Resources {
        group: String,
        version: String,
    },
    Resource(ResourcePath),
    OpenApiV2,
    OpenApiV3,
    OpenApiV3GroupVersion {
        group: String,
        version: String,
    },
    Metrics,
    NotFound,
}

/// Parses a request path (without the query).
pub(crate) fn parse(path: &str) -> Route {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segments.as_slice() {
        ["version"] => Route::Version,
        ["healthz" | "readyz" | "livez", ..] => Route::Health,
        ["api"] => Route::CoreVersions,
        ["apis"] => Route::Groups,
        ["sim", "metrics"] => Route::Metrics,
        ["openapi", "v2"] => Route::OpenApiV2,
        ["openapi", "v3"] => Route::OpenApiV3,
        ["openapi", "v3", "api", version] => Route::OpenApiV3GroupVersion {
            group: String::new(),
            version: (*version).to_owned(),
        },
        ["openapi", "v3", "apis", group, version] => Route::OpenApiV3GroupVersion {
            group: (*group).to_owned(),
            version: (*version).to_owned(),
        },
        ["apis", group] => Route::Group((*group).to_owned()),
        ["api", version] => Route::Resources {
            group: String::new(),
            version: (*version).to_owned(),
        },
        ["apis", group, version] => Route::Resources {
            group: (*group).to_owned(),
            version: (*version).to_owned(),
        },
        ["api", version, rest @ ..] => resource("", version, rest),
        ["apis", group, version, rest @ ..] => resource(group, version, rest),
        _ => Route::NotFound,
    }
}

fn resource(group: &str, version: &str, rest: &[&str]) -> Route {
    let mut path = ResourcePath {
        group: group.to_owned(),
        version: version.to_owned(),
        ..ResourcePath::default()
    };
    let mut rest = rest;
    if let ["watch", tail @ ..] = rest {
        path.watch = true;
        rest = tail;
    }
    let owned = |s: &&str| (*s).to_owned();
    match rest {
        ["namespaces", namespace, "status" | "finalize"] => {
            path.plural = "namespaces".into();
            path.name = Some((*namespace).to_owned());
            path.subresource = rest.get(2).map(owned);
        }
        ["namespaces", namespace, plural, tail @ ..] => {
            path.namespace = Some((*namespace).to_owned());
            path.plural = (*plural).to_owned();
            match tail {
                [] => {}
                [name] => path.name = Some((*name).to_owned()),
                [name, sub] => {
                    path.name = Some((*name).to_owned());
                    path.subresource = Some((*sub).to_owned());
                }
                _ => return Route::NotFound,
            }
        }
        [plural] => path.plural = (*plural).to_owned(),
        [plural, name] => {
            path.plural = (*plural).to_owned();
            path.name = Some((*name).to_owned());
        }
        [plural, name, sub] => {
            path.plural = (*plural).to_owned();
            path.name = Some((*name).to_owned());
            path.subresource = Some((*sub).to_owned());
        }
        _ => return Route::NotFound,
    }
    Route::Resource(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn resource_path(
        group: &str,
        namespace: Option<&str>,
        plural: &str,
        name: Option<&str>,
        sub: Option<&str>,
    ) -> Route {
        Route::Resource(ResourcePath {
            group: group.into(),
            version: if group.is_empty() {
                "v1".into()
            } else {
                "v1beta1".into()
            },
            namespace: namespace.map(Into::into),
            plural: plural.into(),
            name: name.map(Into::into),
            subresource: sub.map(Into::into),
            watch: false,
        })
    }

    #[test]
    fn parses_every_shape() {
        assert_eq!(parse("/api"), Route::CoreVersions);
        assert_eq!(parse("/apis"), Route::Groups);
        assert_eq!(
            parse("/apis/agents.x-k8s.io"),
            Route::Group("agents.x-k8s.io".into())
        );
        assert_eq!(
            parse("/api/v1"),
            Route::Resources {
                group: String::new(),
                version: "v1".into()
            }
        );
        assert_eq!(
            parse("/api/v1/pods"),
            resource_path("", None, "pods", None, None)
        );
        assert_eq!(
            parse("/api/v1/namespaces/default/pods/p/log"),
            resource_path("", Some("default"), "pods", Some("p"), Some("log"))
        );
        assert_eq!(
            parse("/api/v1/namespaces/default"),
            resource_path("", None, "namespaces", Some("default"), None)
        );
        assert_eq!(
            parse("/api/v1/namespaces/default/status"),
            resource_path("", None, "namespaces", Some("default"), Some("status"))
        );
        assert_eq!(
            parse("/apis/agents.x-k8s.io/v1beta1/namespaces/ns/sandboxes/s/status"),
            resource_path(
                "agents.x-k8s.io",
                Some("ns"),
                "sandboxes",
                Some("s"),
                Some("status")
            )
        );
        let Route::Resource(watch) = parse("/api/v1/watch/namespaces/ns/pods") else {
            panic!("not a resource");
        };
        assert!(watch.watch);
        assert_eq!(parse("/api/v1/a/b/c/d"), Route::NotFound);
        assert_eq!(parse("/sim/metrics"), Route::Metrics);
    }
}
