//! One object at a time: a watched kind decoded per object, so that one object the controller
//! cannot decode is skipped (and reported) instead of failing the whole list.
//!
//! A typed list (`ObjectList<K>`) is decoded as a whole: a single pool stored with
//! `replicas: 2147483648` (accepted by an older CRD, or written before a bound existed) made every
//! list of pools fail, so the controller never became ready. The watches list and watch
//! [`Lenient<K>`] instead: each item is decoded as `K` on its own, and an item that does not decode
//! becomes [`Undecodable`], which keeps only what is needed to name it.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// A watched object: decoded as `K`, or not decodable.
#[derive(Clone, Debug)]
pub enum Lenient<K> {
    /// The object, decoded.
    Decoded(K),
    /// An object that is not a valid `K` (boxed: rare, and bigger than most `K`s).
    Undecodable(Box<Undecodable>),
}

/// What is known of an object that could not be decoded.
#[derive(Clone, Debug, PartialEq)]
pub struct Undecodable {
    /// Its name, namespace, UID, resourceVersion (read as loosely as possible).
    pub metadata: ObjectMeta,
    /// Why it does not decode, with the path of the field (`spec.replicas: invalid value: ...`).
    pub error: String,
}

impl Undecodable {
    /// Names the object in `value` and says why it is not a `K`.
    fn of<K: DeserializeOwned>(value: &Value) -> Self {
        let text = |field: &str| {
            value
                .pointer(&format!("/metadata/{field}"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let metadata = ObjectMeta {
            name: text("name"),
            namespace: text("namespace"),
            uid: text("uid"),
            resource_version: text("resourceVersion"),
            ..ObjectMeta::default()
        };
        let error = match serde_path_to_error::deserialize::<_, K>(value) {
            Ok(_) => "decodes only on a second attempt".to_owned(),
            Err(error) => error.to_string(),
        };
        Self { metadata, error }
    }
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Lenient<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Any JSON value is accepted here, so that a list (or a watch event) always decodes;
        // whether it is a `K` is decided per object.
        let value = Value::deserialize(deserializer)?;
        Ok(match K::deserialize(&value) {
            Ok(object) => Lenient::Decoded(object),
            Err(_) => Lenient::Undecodable(Box::new(Undecodable::of::<K>(&value))),
        })
    }
}

/// Same URL, kind and scope as `K`: only the decoding differs.
impl<K: Resource<DynamicType = ()>> Resource for Lenient<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }

    fn api_version(dt: &()) -> Cow<'_, str> {
        K::api_version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        match self {
            Lenient::Decoded(object) => object.meta(),
            Lenient::Undecodable(undecodable) => &undecodable.metadata,
        }
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Lenient::Decoded(object) => object.meta_mut(),
            Lenient::Undecodable(undecodable) => &mut undecodable.metadata,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_sandbox_api::SandboxWarmPool;
    use kube::core::ObjectList;
    use serde_json::json;

    fn pool(name: &str, replicas: Value) -> Value {
        json!({
            "apiVersion": agent_sandbox_api::EXTENSIONS_API_VERSION,
            "kind": agent_sandbox_api::kinds::SANDBOX_WARM_POOL,
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                         "resourceVersion": "7"},
            "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": "python"}}
        })
    }

    /// Regression (issue 15): one pool with `replicas: 2147483648` failed the decoding of the
    /// whole list, and with it the controller's readiness.
    #[test]
    fn one_bad_item_does_not_fail_the_list() {
        let list = json!({
            "apiVersion": agent_sandbox_api::EXTENSIONS_API_VERSION,
            "kind": "SandboxWarmPoolList",
            "metadata": {"resourceVersion": "9"},
            "items": [pool("good", json!(3)), pool("huge", json!(2_147_483_648_i64))]
        });
        assert!(
            serde_json::from_value::<ObjectList<SandboxWarmPool>>(list.clone()).is_err(),
            "a typed list fails as a whole"
        );
        let decoded: ObjectList<Lenient<SandboxWarmPool>> = serde_json::from_value(list).unwrap();
        let [good, huge] = decoded.items.as_slice() else {
            panic!("two items expected: {:?}", decoded.items)
        };
        let Lenient::Decoded(good) = good else {
            panic!("the good pool decodes: {good:?}")
        };
        assert_eq!(good.spec.replicas, 3);
        let Lenient::Undecodable(huge) = huge else {
            panic!("the huge pool does not decode: {huge:?}")
        };
        assert_eq!(
            huge.as_ref(),
            &Undecodable {
                metadata: ObjectMeta {
                    name: Some("huge".into()),
                    namespace: Some("default".into()),
                    uid: Some("uid-huge".into()),
                    resource_version: Some("7".into()),
                    ..ObjectMeta::default()
                },
                error: "spec.replicas: invalid value: integer `2147483648`, expected i32".into(),
            }
        );
    }

    #[test]
    fn the_url_and_names_are_those_of_the_kind() {
        assert_eq!(
            Lenient::<SandboxWarmPool>::url_path(&(), Some("default")),
            SandboxWarmPool::url_path(&(), Some("default"))
        );
        assert_eq!(
            Lenient::<SandboxWarmPool>::kind(&()),
            SandboxWarmPool::kind(&())
        );
        assert_eq!(
            Lenient::<SandboxWarmPool>::api_version(&()),
            SandboxWarmPool::api_version(&())
        );
    }
}
