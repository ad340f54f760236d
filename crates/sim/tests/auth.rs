//! The API server authenticates and authorizes like a real one: TLS, the kubeconfig's bearer
//! token, ServiceAccount tokens from TokenRequest limited by RBAC; it refuses bodies a real API
//! server refuses (media type, size) and objects etcd would not store.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::unix::fs::PermissionsExt as _;

use agent_sandbox_sim::test_support::https_exchange;
use agent_sandbox_sim::{Isolation, Sim, SimConfig};
use common::api_get;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

async fn start() -> Sim {
    Sim::start(SimConfig::default().isolation(Isolation::None))
        .await
        .unwrap()
}

/// A ServiceAccount's token from TokenRequest, asked as the administrator.
async fn token_of(sim: &Sim, namespace: &str, account: &str) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(sim.client().unwrap(), namespace);
    let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                         "spec": {"expirationSeconds": 600}});
    let answer: TokenRequest = accounts
        .create_subresource("token", account, &PostParams::default(), &request)
        .await
        .unwrap();
    answer.status.unwrap().token.unwrap()
}

fn status_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|_| panic!("not a Status: {body}"))
}

fn kube_code(error: kube::Error) -> (u16, String) {
    match error {
        kube::Error::Api(status) => (status.code, status.message),
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test]
async fn requests_without_the_kubeconfigs_credential_get_401() {
    let sim = start().await;
    assert!(sim.base_url().starts_with("https://127.0.0.1:"));
    for path in [
        "/api/v1/namespaces/default/pods",
        "/api/v1/namespaces/kube-system/secrets",
        "/apis/apps/v1/deployments",
        "/api",
        "/apis",
        "/openapi/v3",
        "/sim/metrics",
    ] {
        for token in ["", "not-the-token", "a.b.c"] {
            let (code, body) = api_get(&sim, path, Some(token)).await;
            assert_eq!(code, 401, "{path} with {token:?}: {body}");
            assert_eq!(
                status_of(&body),
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": "Unauthorized", "reason": "Unauthorized", "code": 401})
            );
        }
        let (code, body) = api_get(&sim, path, None).await;
        assert_eq!(code, 200, "{path} as the administrator: {body}");
    }
    // What a real API server leaves open to anonymous users, and nothing else.
    for path in ["/version", "/healthz", "/livez", "/readyz"] {
        let (code, body) = api_get(&sim, path, Some("")).await;
        assert_eq!(code, 200, "{path}: {body}");
    }
    // A token that does not authenticate is refused even there.
    let (code, _) = api_get(&sim, "/version", Some("not-the-token")).await;
    assert_eq!(code, 401);

    // A kube client without the token, one with another sim's, one that does not trust the
    // sim's authority: none gets anything.
    let other = sim_for_credentials().await;
    let foreign = sim.client_with_token(other.admin_token()).unwrap();
    let (code, _) = kube_code(
        Api::<Pod>::namespaced(foreign, "default")
            .list(&ListParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 401);
    let mut untrusting = kube::Config::new(sim.base_url().parse().unwrap());
    let others_authority = {
        use rustls::pki_types::pem::PemObject as _;
        rustls::pki_types::CertificateDer::from_pem_slice(other.ca_pem().as_bytes()).unwrap()
    };
    untrusting.root_cert = Some(vec![others_authority.to_vec()]);
    untrusting.headers.push((
        http::header::AUTHORIZATION,
        format!("Bearer {}", sim.admin_token()).parse().unwrap(),
    ));
    let untrusting = kube::Client::try_from(untrusting).unwrap();
    let refused = Api::<Pod>::namespaced(untrusting, "default")
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert!(!matches!(refused, kube::Error::Api(_)), "{refused}");

    // Plain HTTP is not served at all.
    let mut plain = tokio::net::TcpStream::connect(sim.addr()).await.unwrap();
    plain
        .write_all(
            b"GET /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer).await;
    assert!(!answer.starts_with(b"HTTP/"), "{answer:?}");
    other.stop().await;
    sim.stop().await;
}

async fn sim_for_credentials() -> Sim {
    start().await
}

#[tokio::test]
async fn the_kubeconfig_is_for_its_owner_only() {
    let scratch = tempfile::tempdir().unwrap();
    let path = scratch.path().join("new/dir/kubeconfig");
    let sim = Sim::start(
        SimConfig::default()
            .isolation(Isolation::None)
            .kubeconfig(&path),
    )
    .await
    .unwrap();
    let mode =
        |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(path.parent().unwrap()), 0o700);
    assert_eq!(mode(&scratch.path().join("new")), 0o700);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains(&format!("token: {}", sim.admin_token())),
        "{text}"
    );
    assert!(text.contains("certificate-authority-data: "), "{text}");
    assert!(
        text.contains(&format!("server: {}", sim.base_url())),
        "{text}"
    );
    // The kubeconfig alone is enough for a client.
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&text).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::default_namespaced(kube::Client::try_from(config).unwrap());
    pods.list(&ListParams::default()).await.unwrap();
    sim.stop().await;

    // The default place: a private directory of the data directory.
    let sim = start().await;
    assert_eq!(mode(sim.kubeconfig_path()), 0o600);
    let dir = sim.kubeconfig_path().parent().unwrap();
    assert_eq!(dir, sim.data_dir().join("credentials"));
    assert_eq!(mode(dir), 0o700);
    sim.stop().await;
}

#[tokio::test]
async fn service_accounts_get_403_beyond_their_rbac() {
    let sim = start().await;
    let admin = sim.client().unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "reader"}})).unwrap(),
        )
        .await
        .unwrap();
    let token = token_of(&sim, "default", "reader").await;
    let reader = sim.client_with_token(&token).unwrap();
    let pods: Api<Pod> = Api::namespaced(reader.clone(), "default");

    // Authenticated, but allowed nothing yet but discovery.
    let (code, message) = kube_code(pods.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(code, 403);
    assert_eq!(
        message,
        "pods is forbidden: User \"system:serviceaccount:default:reader\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""
    );
    let (code, _) = api_get(&sim, "/api/v1", Some(&token)).await;
    assert_eq!(code, 200);
    let (code, body) = api_get(&sim, "/sim/metrics", Some(&token)).await;
    assert_eq!(code, 403, "{body}");

    // A Role and its binding let it read pods in its namespace, and nothing more.
    let rbac = |plural: &str| {
        let resource = kube::api::ApiResource {
            group: "rbac.authorization.k8s.io".into(),
            version: "v1".into(),
            api_version: "rbac.authorization.k8s.io/v1".into(),
            kind: String::new(),
            plural: plural.into(),
        };
        Api::<kube::api::DynamicObject>::namespaced_with(admin.clone(), "default", &resource)
    };
    let apply = PatchParams::apply("test").force();
    rbac("roles")
        .patch(
            "pod-reader",
            &apply,
            &Patch::Apply(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "pod-reader", "namespace": "default"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]})),
        )
        .await
        .unwrap();
    rbac("rolebindings")
        .patch(
            "reader",
            &apply,
            &Patch::Apply(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "reader", "namespace": "default"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "reader"}]})),
        )
        .await
        .unwrap();
    pods.list(&ListParams::default()).await.unwrap();
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}))
    .unwrap();
    let (code, message) = kube_code(pods.create(&PostParams::default(), &pod).await.unwrap_err());
    assert_eq!(code, 403, "{message}");
    let (code, _) = kube_code(
        Api::<Pod>::namespaced(reader.clone(), "kube-system")
            .list(&ListParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    let (code, message) = kube_code(
        Api::<ServiceAccount>::namespaced(reader.clone(), "default")
            .create_subresource::<_, TokenRequest>(
                "token",
                "reader",
                &PostParams::default(),
                &json!({}),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert!(
        message.contains("cannot create resource \"serviceaccounts/token\""),
        "{message}"
    );

    // Once its ServiceAccount is gone, the token authenticates no more.
    accounts
        .delete("reader", &DeleteParams::default())
        .await
        .unwrap();
    let (code, _) = kube_code(pods.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(code, 401);
    sim.stop().await;
}

/// A request with a body, as the administrator.
async fn send(
    sim: &Sim,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> (u16, String) {
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        sim.addr(),
        sim.admin_token(),
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    https_exchange(sim.ca_pem(), sim.addr(), &request)
        .await
        .unwrap()
}

#[tokio::test]
async fn text_plain_bodies_are_refused() {
    let sim = start().await;
    let path = "/api/v1/namespaces/default/configmaps";
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m"},
                      "data": {"a": "b"}})
    .to_string();
    for content_type in [
        "text/plain",
        "text/plain; charset=utf-8",
        "application/x-www-form-urlencoded",
    ] {
        let (code, answer) = send(&sim, "POST", path, content_type, body.as_bytes()).await;
        assert_eq!(code, 415, "{content_type}: {answer}");
        let status = status_of(&answer);
        assert_eq!(status["reason"], "UnsupportedMediaType");
        assert_eq!(
            status["message"],
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf"
        );
    }
    let (code, answer) = send(
        &sim,
        "PUT",
        &format!("{path}/m"),
        "text/plain",
        body.as_bytes(),
    )
    .await;
    assert_eq!(code, 415, "{answer}");
    let (code, answer) = send(&sim, "DELETE", &format!("{path}/m"), "text/plain", b"{}").await;
    assert_eq!(code, 415, "{answer}");
    // Nothing was written; the same body as JSON is.
    let configmaps: Api<ConfigMap> = Api::default_namespaced(sim.client().unwrap());
    assert!(configmaps.get_opt("m").await.unwrap().is_none());
    let (code, answer) = send(&sim, "POST", path, "application/json", body.as_bytes()).await;
    assert_eq!(code, 201, "{answer}");
    sim.stop().await;
}

#[tokio::test]
async fn objects_larger_than_etcd_stores_are_refused() {
    let sim = start().await;
    let configmaps: Api<ConfigMap> = Api::default_namespaced(sim.client().unwrap());
    let with_data = |name: &str, bytes: usize| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name},
                                      "data": {"blob": "x".repeat(bytes)}}))
        .unwrap()
    };
    // Under etcd's 1.5 MiB: stored.
    configmaps
        .create(&PostParams::default(), &with_data("small", 1_500_000))
        .await
        .unwrap();
    // Over it, within the API server's 3 MiB body limit: etcd's error, as the API server
    // passes it on.
    let error = configmaps
        .create(&PostParams::default(), &with_data("large", 1_600_000))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = error else {
        panic!("not an API error: {error}");
    };
    assert_eq!(
        (status.code, status.message.as_str(), status.reason.as_str()),
        (500, "etcdserver: request is too large", "")
    );
    assert!(configmaps.get_opt("large").await.unwrap().is_none());
    // An update that grows an object past it fails the same way and changes nothing.
    let error = configmaps
        .patch(
            "small",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"more": "y".repeat(100_000)}})),
        )
        .await
        .unwrap_err();
    assert_eq!(kube_code(error).1, "etcdserver: request is too large");
    let kept = configmaps.get("small").await.unwrap();
    assert!(!kept.data.unwrap().contains_key("more"));
    // A body over 3 MiB is refused before it is read to the end.
    let body = serde_json::to_vec(&with_data("huge", 3 * 1024 * 1024)).unwrap();
    let (code, answer) = send(
        &sim,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        &body,
    )
    .await;
    assert_eq!(code, 413, "{answer}");
    assert_eq!(
        status_of(&answer),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "Request entity too large: limit is 3145728",
               "reason": "RequestEntityTooLarge", "code": 413})
    );
    sim.stop().await;
}
