#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Authentication through the router: a static bearer token, and scoped tokens bound to one
//! sandbox (right sandbox ok, another sandbox 403, expired 401). Authorization is decided before
//! the index is consulted, so an unauthenticated client learns nothing about which sandboxes
//! exist, and the credential never reaches the sandbox.

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use agent_sandbox_api::token::{self, Claims};
use agent_sandbox_router::{Auth, Secret};
use bytes::Bytes;
use common::{
    Backend, Runtime, TestRouter, echo_http, execute, pod_for, sandbox, sandbox_in, synced_index,
};
use hyper::{Method, StatusCode};
use pretty_assertions::assert_eq;

const KEY: &[u8] = b"router-signing-key-of-at-least-32-bytes";
const STATIC: &str = "a-static-token-of-at-least-32-bytes!";

fn now() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap()
}

fn bearer(namespace: &str, name: &str, expires_at: i64) -> String {
    format!(
        "Bearer {}",
        token::mint(KEY, &Claims::new(namespace, name, expires_at)).unwrap()
    )
}

#[tokio::test]
async fn a_static_token_is_required_and_never_forwarded() {
    let backend = Backend::on_fresh_ip(8888, echo_http).await;
    let sandbox = sandbox("box");
    let pod = pod_for(&sandbox, backend.addr.ip(), &[]);
    let router = TestRouter::start_with(synced_index(&[(&sandbox, &pod)]), |config| {
        config.auth = Auth::Token(Secret::new(STATIC));
    })
    .await;

    let missing = router
        .send(Method::GET, "/", &[("x-sandbox-id", "box")], Bytes::new())
        .await;
    assert_eq!(missing.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        missing.headers["www-authenticate"],
        "Bearer realm=\"sandbox-router\""
    );
    assert_eq!(
        missing.detail(),
        "A bearer token is required to reach sandbox default/box (Authorization: Bearer ...)."
    );
    let wrong = router
        .send(
            Method::GET,
            "/",
            &[
                ("x-sandbox-id", "box"),
                (
                    "authorization",
                    "Bearer a-static-token-of-at-least-32-bytes?",
                ),
            ],
            Bytes::new(),
        )
        .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        wrong.detail(),
        "Invalid bearer token for sandbox default/box."
    );
    // Unknown sandboxes are not revealed to unauthenticated clients.
    let unknown = router
        .send(
            Method::GET,
            "/",
            &[("x-sandbox-id", "nobody")],
            Bytes::new(),
        )
        .await;
    assert_eq!(unknown.status, StatusCode::UNAUTHORIZED);
    assert_eq!(backend.accepted(), 0);

    let right = format!("Bearer {STATIC}");
    let ok = router
        .send(
            Method::GET,
            "/",
            &[("x-sandbox-id", "box"), ("authorization", &right)],
            Bytes::new(),
        )
        .await;
    assert_eq!(ok.status, StatusCode::OK);
    assert!(
        !ok.headers.contains_key("x-echo-authorization"),
        "the router's credential reached the sandbox"
    );
    // Probes need no token.
    let healthz = router
        .send(Method::GET, "/healthz", &[], Bytes::new())
        .await;
    assert_eq!(healthz.status, StatusCode::OK);
}

#[tokio::test]
async fn scoped_tokens_open_one_sandbox_only() {
    let runtime = Runtime::start();
    let mine = sandbox("mine");
    let theirs = sandbox("theirs");
    let elsewhere = sandbox_in("team-b", "mine");
    let mine_pod = pod_for(&mine, runtime.ip, &[]);
    let theirs_pod = pod_for(&theirs, runtime.ip, &[]);
    let elsewhere_pod = pod_for(&elsewhere, runtime.ip, &[]);
    let router = TestRouter::start_with(
        synced_index(&[
            (&mine, &mine_pod),
            (&theirs, &theirs_pod),
            (&elsewhere, &elsewhere_pod),
        ]),
        |config| {
            config.auth = Auth::Scoped(vec![Secret::new(KEY)]);
        },
    )
    .await;
    let token = bearer("default", "mine", now() + 600);
    let call = |id: &'static str, namespace: &'static str, authorization: String| {
        let addr = router.addr;
        async move {
            common::send(
                addr,
                Method::POST,
                "/execute",
                &[
                    ("x-sandbox-id", id),
                    ("x-sandbox-namespace", namespace),
                    ("authorization", &authorization),
                ],
                execute("echo in"),
            )
            .await
        }
    };

    let ok = call("mine", "default", token.clone()).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text());
    assert_eq!(ok.json()["stdout"], "in\n");

    let other = call("theirs", "default", token.clone()).await;
    assert_eq!(other.status, StatusCode::FORBIDDEN);
    assert_eq!(
        other.detail(),
        "The scoped token is for sandbox default/mine, not for sandbox default/theirs."
    );
    let other_namespace = call("mine", "team-b", token.clone()).await;
    assert_eq!(other_namespace.status, StatusCode::FORBIDDEN);

    let expired = call("mine", "default", bearer("default", "mine", now() - 1)).await;
    assert_eq!(expired.status, StatusCode::UNAUTHORIZED);
    assert!(
        expired
            .detail()
            .starts_with("The scoped token for sandbox default/mine expired at "),
        "{}",
        expired.detail()
    );

    let forged = format!(
        "Bearer {}",
        token::mint(
            b"not-the-router-key-but-32-bytes-long",
            &Claims::new("default", "mine", now() + 600)
        )
        .unwrap()
    );
    let forged = call("mine", "default", forged).await;
    assert_eq!(forged.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        forged.detail(),
        "Invalid scoped token for sandbox default/mine."
    );

    let static_style = call("mine", "default", format!("Bearer {STATIC}")).await;
    assert_eq!(static_style.status, StatusCode::UNAUTHORIZED);

    // Routing hints are accepted with a scoped token when they agree with the index, and cannot
    // move a valid token to another pod when they do not.
    let runtime_ip = runtime.ip.to_string();
    let hinted = router
        .send(
            Method::GET,
            "/",
            &[
                ("x-sandbox-id", "mine"),
                ("x-sandbox-pod-ip", &runtime_ip),
                ("x-sandbox-uid", "uid-mine"),
                ("authorization", &token),
            ],
            Bytes::new(),
        )
        .await;
    assert_eq!(hinted.status, StatusCode::OK);
    let borrowed_uid = router
        .send(
            Method::GET,
            "/",
            &[
                ("x-sandbox-id", "mine"),
                ("x-sandbox-uid", "uid-theirs"),
                ("authorization", &token),
            ],
            Bytes::new(),
        )
        .await;
    assert_eq!(borrowed_uid.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn tokens_minted_by_the_binary_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("signing-key");
    std::fs::write(&key_file, [KEY, b"\n"].concat()).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sandbox-router"))
        .args(["mint-token", "--signing-key-file"])
        .arg(&key_file)
        .args([
            "--namespace",
            "team-a",
            "--sandbox",
            "box",
            "--ttl-seconds",
            "120",
        ])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let minted = String::from_utf8(output.stdout).unwrap();
    let claims = token::verify(KEY, minted.trim(), now()).unwrap();
    assert_eq!(claims.namespace, "team-a");
    assert_eq!(claims.name, "box");
    assert!(
        (now() + 110..=now() + 121).contains(&claims.expires_at),
        "{claims:?}"
    );

    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_sandbox-router"))
        .args(["mint-token", "--signing-key-file"])
        .arg(&key_file)
        .args(["--sandbox", "a.b"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
}
