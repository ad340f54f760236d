//! Who a request comes from, and the ServiceAccount tokens the API server issues.
//!
//! As a real API server configured with bearer tokens: the sim makes, when it starts, a random
//! token for its administrator (the kubeconfig's user, in `system:masters`) and one for its
//! node (`system:node:sim-node`, in `system:nodes`), both known only to this process and to
//! whoever reads the kubeconfig; and it issues ServiceAccount tokens through the TokenRequest
//! API (`serviceaccounts/{name}/token`, what a kubelet asks for a pod's projected token), signed
//! with a key of its own. A ServiceAccount token authenticates while it has not expired, names
//! the API server's audience, and the ServiceAccount (and the pod or Secret it is bound to)
//! still exists with the uid it was issued for. A request with no credential is anonymous; one
//! with a credential the server does not accept is refused (401), whatever its path.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{KeyInit as _, Mac as _};
use http::{HeaderMap, header};
use serde_json::{Value, json};

use crate::api_error::{ApiError, ApiResult, Cause};
use crate::error::{Error, Result};
use crate::meta;
use crate::resources::StorageKey;
use crate::store::Store;

/// The issuer of ServiceAccount tokens, and the audience the API server accepts (what kubeadm
/// and kind configure).
pub(crate) const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";
/// The administrator's user name.
pub(crate) const ADMIN_USER: &str = "kube-sim-admin";
/// The group whose members every request is allowed (as on a real API server).
pub(crate) const MASTERS_GROUP: &str = "system:masters";
/// The group of nodes.
pub(crate) const NODES_GROUP: &str = "system:nodes";
/// The group of every authenticated user.
pub(crate) const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// A token's lifetime when the request names none, and the shortest one allowed.
const DEFAULT_TOKEN_SECONDS: i64 = 3600;
const MIN_TOKEN_SECONDS: i64 = 600;
/// The longest lifetime a token may ask for (2^32 seconds, the API's validation bound).
const MAX_TOKEN_SECONDS: i64 = 1 << 32;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// An authenticated user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) user: String,
    pub(crate) groups: Vec<String>,
}

impl Identity {
    fn new(user: String, mut groups: Vec<String>) -> Self {
        groups.push(AUTHENTICATED_GROUP.to_owned());
        Self { user, groups }
    }

    /// The administrator of the kubeconfig.
    pub(crate) fn admin() -> Self {
        Self::new(ADMIN_USER.to_owned(), vec![MASTERS_GROUP.to_owned()])
    }

    /// The kubelet of node `name`.
    pub(crate) fn node(name: &str) -> Self {
        Self::new(format!("system:node:{name}"), vec![NODES_GROUP.to_owned()])
    }

    /// ServiceAccount `namespace/name`.
    pub(crate) fn service_account(namespace: &str, name: &str) -> Self {
        Self::new(
            format!("system:serviceaccount:{namespace}:{name}"),
            vec![
                "system:serviceaccounts".to_owned(),
                format!("system:serviceaccounts:{namespace}"),
            ],
        )
    }

    pub(crate) fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}

/// The token a TokenRequest issues: whose, for which audiences, until when, bound to what.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Claims {
    namespace: String,
    account: String,
    account_uid: String,
    audiences: Vec<String>,
    issued_at: i64,
    expires_at: i64,
    /// `pod` or `secret`, with the object's name and uid.
    bound: Option<(String, String, String)>,
}

impl Claims {
    fn to_json(&self) -> Value {
        let mut kubernetes = json!({
            "namespace": self.namespace,
            "serviceaccount": {"name": self.account, "uid": self.account_uid},
        });
        if let Some((kind, name, uid)) = &self.bound {
            kubernetes[kind] = json!({"name": name, "uid": uid});
        }
        json!({
            "aud": self.audiences,
            "exp": self.expires_at,
            "iat": self.issued_at,
            "nbf": self.issued_at,
            "iss": API_AUDIENCE,
            "sub": format!("system:serviceaccount:{}:{}", self.namespace, self.account),
            "kubernetes.io": kubernetes,
        })
    }

    fn from_json(value: &Value) -> Option<Self> {
        let text = |pointer: &str| value.pointer(pointer).and_then(Value::as_str);
        let bound = ["pod", "secret"].iter().find_map(|kind| {
            let object = value.get("kubernetes.io")?.get(*kind)?;
            Some((
                (*kind).to_owned(),
                object.get("name")?.as_str()?.to_owned(),
                object.get("uid")?.as_str()?.to_owned(),
            ))
        });
        if text("/iss")? != API_AUDIENCE {
            return None;
        }
        Some(Self {
            namespace: text("/kubernetes.io/namespace")?.to_owned(),
            account: text("/kubernetes.io/serviceaccount/name")?.to_owned(),
            account_uid: text("/kubernetes.io/serviceaccount/uid")?.to_owned(),
            audiences: value
                .get("aud")?
                .as_array()?
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            issued_at: value.get("nbf")?.as_i64()?,
            expires_at: value.get("exp")?.as_i64()?,
            bound,
        })
    }
}

/// The credentials this API server accepts.
pub(crate) struct Credentials {
    admin: String,
    node: String,
    node_name: String,
    signing_key: [u8; 32],
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

fn random_bytes<const N: usize>() -> Result<[u8; N]> {
    let mut bytes = [0_u8; N];
    rustls::crypto::aws_lc_rs::default_provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| Error::Random)?;
    Ok(bytes)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares secrets without stopping at the first difference.
fn same_secret(given: &str, known: &str) -> bool {
    given.len() == known.len()
        && given
            .bytes()
            .zip(known.bytes())
            .fold(0_u8, |diff, (a, b)| diff | (a ^ b))
            == 0
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn time_text(unix: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(unix)
        .map(meta::format_time)
        .unwrap_or_default()
}

impl Credentials {
    /// Fresh random tokens for the administrator and node `node_name`, and a fresh signing key.
    pub(crate) fn generate(node_name: &str) -> Result<Self> {
        Ok(Self {
            admin: hex(&random_bytes::<32>()?),
            node: hex(&random_bytes::<32>()?),
            node_name: node_name.to_owned(),
            signing_key: random_bytes::<32>()?,
        })
    }

    /// The administrator's bearer token (the kubeconfig's).
    pub(crate) fn admin_token(&self) -> &str {
        &self.admin
    }

    /// The node's bearer token (the sim's own kubelet's).
    pub(crate) fn node_token(&self) -> &str {
        &self.node
    }

    /// Who sent a request: `None` without a credential (anonymous); 401 with one the server
    /// does not accept.
    pub(crate) fn authenticate(
        &self,
        headers: &HeaderMap,
        store: &Store,
    ) -> ApiResult<Option<Identity>> {
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return Ok(None);
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|text| text.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .filter(|token| !token.is_empty())
            .ok_or_else(ApiError::unauthorized)?;
        if same_secret(token, &self.admin) {
            return Ok(Some(Identity::admin()));
        }
        if same_secret(token, &self.node) {
            return Ok(Some(Identity::node(&self.node_name)));
        }
        self.service_account(token, store, unix_now())
            .map(Some)
            .ok_or_else(ApiError::unauthorized)
    }

    fn sign(&self, text: &str) -> Option<HmacSha256> {
        let mut mac = HmacSha256::new_from_slice(&self.signing_key).ok()?;
        mac.update(text.as_bytes());
        Some(mac)
    }

    /// A signed JWT carrying `claims`.
    fn issue(&self, claims: &Claims) -> ApiResult<String> {
        let head = URL_SAFE_NO_PAD
            .encode(json!({"alg": "HS256", "kid": "kube-sim", "typ": "JWT"}).to_string());
        let body = URL_SAFE_NO_PAD.encode(claims.to_json().to_string());
        let signed = format!("{head}.{body}");
        let mac = self
            .sign(&signed)
            .ok_or_else(|| ApiError::internal("the token signing key is unusable"))?;
        Ok(format!(
            "{signed}.{}",
            URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
        ))
    }

    /// The ServiceAccount a token stands for, if it is one this server signed, valid at `now`,
    /// for the API's audience, and everything it names still exists with the same uid.
    fn service_account(&self, token: &str, store: &Store, now: i64) -> Option<Identity> {
        let mut parts = token.split('.');
        let (head, body, signature) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let header: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(head).ok()?).ok()?;
        if header.get("alg").and_then(Value::as_str) != Some("HS256") {
            return None;
        }
        let signature = URL_SAFE_NO_PAD.decode(signature).ok()?;
        self.sign(&format!("{head}.{body}"))?
            .verify_slice(&signature)
            .ok()?;
        let claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(body).ok()?).ok()?;
        let claims = Claims::from_json(&claims)?;
        if now < claims.issued_at
            || now >= claims.expires_at
            || !claims.audiences.iter().any(|a| a == API_AUDIENCE)
        {
            return None;
        }
        let exists = |plural: &str, name: &str, uid: &str| {
            store
                .get(&StorageKey::new("", plural), &claims.namespace, name)
                .is_some_and(|object| meta::uid(&object) == uid)
        };
        if !exists("serviceaccounts", &claims.account, &claims.account_uid) {
            return None;
        }
        if let Some((kind, name, uid)) = &claims.bound {
            let plural = if kind == "pod" { "pods" } else { "secrets" };
            if !exists(plural, name, uid) {
                return None;
            }
        }
        Some(Identity::service_account(
            &claims.namespace,
            &claims.account,
        ))
    }

    /// Serves a TokenRequest (`POST .../serviceaccounts/{account}/token`): the request with its
    /// defaults and, in its status, a token and when it expires.
    pub(crate) fn token_request(
        &self,
        store: &Store,
        namespace: &str,
        account: &str,
        request: &Value,
    ) -> ApiResult<Value> {
        let stored = store
            .get(&StorageKey::new("", "serviceaccounts"), namespace, account)
            .ok_or_else(|| ApiError::not_found("", "serviceaccounts", account))?;
        let spec = request.get("spec").cloned().unwrap_or_else(|| json!({}));
        let mut audiences: Vec<String> = spec
            .get("audiences")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect();
        if audiences.is_empty() {
            audiences.push(API_AUDIENCE.to_owned());
        }
        let seconds = spec
            .get("expirationSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(DEFAULT_TOKEN_SECONDS);
        let invalid = |message: String| {
            ApiError::invalid(
                "authentication.k8s.io",
                "TokenRequest",
                "serviceaccounts",
                account,
                vec![Cause {
                    reason: "FieldValueInvalid",
                    message,
                    field: "spec.expirationSeconds".to_owned(),
                }],
            )
        };
        if seconds < MIN_TOKEN_SECONDS {
            return Err(invalid(format!(
                "Invalid value: {seconds}: may not specify a duration less than 10 minutes"
            )));
        }
        if seconds > MAX_TOKEN_SECONDS {
            return Err(invalid(format!(
                "Invalid value: {seconds}: may not specify a duration larger than 2^32 seconds"
            )));
        }
        let bound = match spec.get("boundObjectRef").filter(|r| !r.is_null()) {
            None => None,
            Some(reference) => Some(bound_object(store, namespace, reference)?),
        };
        let now = unix_now();
        let claims = Claims {
            namespace: namespace.to_owned(),
            account: account.to_owned(),
            account_uid: meta::uid(&stored).to_owned(),
            audiences: audiences.clone(),
            issued_at: now,
            expires_at: now.saturating_add(seconds),
            bound,
        };
        let token = self.issue(&claims)?;
        let mut spec = spec;
        spec["audiences"] = json!(audiences);
        spec["expirationSeconds"] = json!(seconds);
        Ok(json!({
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": account, "namespace": namespace, "creationTimestamp": null},
            "spec": spec,
            "status": {"token": token, "expirationTimestamp": time_text(claims.expires_at)},
        }))
    }
}

/// The object a token is bound to (`pod` or `secret`, name, uid), which must exist, with the
/// given uid when one is given.
fn bound_object(
    store: &Store,
    namespace: &str,
    reference: &Value,
) -> ApiResult<(String, String, String)> {
    let kind = reference
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let plural = match kind {
        "Pod" => "pods",
        "Secret" => "secrets",
        other => {
            return Err(ApiError::bad_request(format!(
                "cannot bind token to object of type {other}"
            )));
        }
    };
    let name = reference
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let object = store
        .get(&StorageKey::new("", plural), namespace, name)
        .ok_or_else(|| ApiError::not_found("", plural, name))?;
    let uid = meta::uid(&object);
    if let Some(wanted) = reference.get("uid").and_then(Value::as_str)
        && !wanted.is_empty()
        && wanted != uid
    {
        return Err(ApiError::conflict(
            "",
            plural,
            name,
            &format!(
                "the UID in the bound object reference ({wanted}) does not match the UID in record. The object might have been deleted and then recreated"
            ),
        ));
    }
    Ok((kind.to_lowercase(), name.to_owned(), uid.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn store_with(objects: &[(&str, &str, &str, &str)]) -> Store {
        let store = Store::new(16);
        for (plural, namespace, name, uid) in objects {
            store
                .commit(&StorageKey::new("", plural), namespace, name, |_| {
                    Ok(crate::store::Decision::Put(json!({"metadata": {
                        "name": name, "namespace": namespace, "uid": uid}})))
                })
                .unwrap();
        }
        store
    }

    fn bearer(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        headers
    }

    fn token_of(answer: &Value) -> String {
        answer["status"]["token"].as_str().unwrap().to_owned()
    }

    #[test]
    fn the_admin_and_node_tokens_authenticate_and_anything_else_is_refused() {
        let credentials = Credentials::generate("sim-node").unwrap();
        let store = store_with(&[]);
        let who = |headers: &HeaderMap| credentials.authenticate(headers, &store);
        assert_eq!(who(&HeaderMap::new()), Ok(None));
        assert_eq!(
            who(&bearer(credentials.admin_token())),
            Ok(Some(Identity::admin()))
        );
        assert_eq!(
            who(&bearer(credentials.node_token())),
            Ok(Some(Identity::node("sim-node")))
        );
        let other = Credentials::generate("sim-node").unwrap();
        for headers in [
            bearer(other.admin_token()),
            bearer("not-a-token"),
            bearer(""),
            {
                let mut basic = HeaderMap::new();
                basic.insert(
                    header::AUTHORIZATION,
                    "Basic YWRtaW46YWRtaW4=".parse().unwrap(),
                );
                basic
            },
        ] {
            let refused = who(&headers).unwrap_err();
            assert_eq!((refused.code, refused.reason), (401, "Unauthorized"));
        }
    }

    #[test]
    fn service_account_tokens_hold_while_what_they_name_exists() {
        let credentials = Credentials::generate("sim-node").unwrap();
        let store = store_with(&[
            ("serviceaccounts", "team", "builder", "sa-1"),
            ("pods", "team", "p", "pod-1"),
        ]);
        let request =
            json!({"spec": {"boundObjectRef": {"kind": "Pod", "name": "p", "uid": "pod-1"}}});
        let answer = credentials
            .token_request(&store, "team", "builder", &request)
            .unwrap();
        assert_eq!(answer["spec"]["audiences"], json!([API_AUDIENCE]));
        assert_eq!(answer["spec"]["expirationSeconds"], json!(3600));
        let token = token_of(&answer);
        assert_eq!(
            credentials.authenticate(&bearer(&token), &store),
            Ok(Some(Identity::service_account("team", "builder")))
        );
        let identity = Identity::service_account("team", "builder");
        assert_eq!(identity.user, "system:serviceaccount:team:builder");
        assert!(identity.in_group("system:serviceaccounts:team"));

        // Tampered, expired, for another audience, signed by another server: refused.
        let mut tampered = token.clone();
        tampered.insert(tampered.find('.').unwrap() + 2, 'x');
        let now = unix_now();
        let later = credentials.service_account(&token, &store, now + 3600);
        assert_eq!(later, None);
        assert!(credentials.service_account(&token, &store, now).is_some());
        let other_audience = credentials
            .token_request(
                &store,
                "team",
                "builder",
                &json!({"spec": {"audiences": ["vault"]}}),
            )
            .unwrap();
        let other_server = Credentials::generate("sim-node")
            .unwrap()
            .token_request(&store, "team", "builder", &json!({}))
            .unwrap();
        for refused in [tampered, token_of(&other_audience), token_of(&other_server)] {
            assert_eq!(
                credentials
                    .authenticate(&bearer(&refused), &store)
                    .unwrap_err()
                    .code,
                401
            );
        }

        // Once its pod is gone (or recreated under the same name), a bound token is refused.
        store
            .commit(&StorageKey::new("", "pods"), "team", "p", |_| {
                Ok(crate::store::Decision::Put(json!({"metadata": {
                    "name": "p", "namespace": "team", "uid": "pod-2"}})))
            })
            .unwrap();
        assert_eq!(
            credentials
                .authenticate(&bearer(&token), &store)
                .unwrap_err()
                .code,
            401
        );
    }

    #[test]
    fn token_requests_are_checked_like_the_api_server_checks_them() {
        let credentials = Credentials::generate("sim-node").unwrap();
        let store = store_with(&[
            ("serviceaccounts", "team", "builder", "sa-1"),
            ("pods", "team", "p", "pod-1"),
        ]);
        let ask = |account: &str, request: Value| {
            credentials
                .token_request(&store, "team", account, &request)
                .unwrap_err()
        };
        assert_eq!(ask("nobody", json!({})).code, 404);
        let short = ask("builder", json!({"spec": {"expirationSeconds": 60}}));
        assert_eq!(short.code, 422);
        assert!(
            short.message.contains("less than 10 minutes"),
            "{}",
            short.message
        );
        let gone = ask(
            "builder",
            json!({"spec": {"boundObjectRef": {"kind": "Pod", "name": "q"}}}),
        );
        assert_eq!(gone.code, 404);
        let recreated = ask(
            "builder",
            json!({"spec": {"boundObjectRef": {"kind": "Pod", "name": "p", "uid": "old"}}}),
        );
        assert_eq!(recreated.code, 409);
        let odd = ask(
            "builder",
            json!({"spec": {"boundObjectRef": {"kind": "ConfigMap", "name": "p"}}}),
        );
        assert_eq!(odd.code, 400);
    }
}
