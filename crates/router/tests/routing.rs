#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Routing through the router to the real runtime and to small test backends, with the index
//! fed directly: what reaches a sandbox, what is refused and with which code (400, 404, 405,
//! 413, 431, 502, 503), the SSRF guards, and connect retries that never replay a request.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agent_sandbox_api::{annotations, labels};
use bytes::Bytes;
use common::{
    Backend, Runtime, TestRouter, controller, echo_http, execute, loopback_ip, not_ready, pod_for,
    read_head, sandbox, sandbox_in, synced_index,
};
use hyper::{Method, StatusCode};
use pretty_assertions::assert_eq;
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

#[tokio::test]
async fn executes_through_the_router_with_default_headers() {
    let runtime = Runtime::start();
    let sandbox = sandbox("box");
    let pod = pod_for(&sandbox, runtime.ip, &[8888]);
    let router = TestRouter::start(synced_index(&[(&sandbox, &pod)])).await;

    let reply = router
        .call(
            "box",
            Method::POST,
            "/execute",
            execute("echo hi; echo err >&2; exit 3"),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let json = reply.json();
    assert_eq!(json["stdout"], "hi\n");
    assert_eq!(json["stderr"], "err\n");
    assert_eq!(json["exit_code"], 3);

    let health = router.call("box", Method::GET, "/", Bytes::new()).await;
    assert_eq!(health.status, StatusCode::OK);
    assert_eq!(health.json()["status"], "ok");
}

#[tokio::test]
async fn what_reaches_the_sandbox_is_cleaned_and_forwarded() {
    let backend = Backend::on_fresh_ip(8888, echo_http).await;
    let sandbox = sandbox("echo");
    let pod = pod_for(&sandbox, backend.addr.ip(), &[]);
    let router = TestRouter::start(synced_index(&[(&sandbox, &pod)])).await;

    let reply = router
        .send(
            Method::POST,
            "/some/path?q=1&r=two",
            &[
                ("x-sandbox-id", "echo"),
                ("x-sandbox-namespace", "default"),
                ("x-sandbox-port", "8888"),
                ("x-sandbox-timeout", "30"),
                ("x-sandbox-uid", "uid-echo"),
                ("x-sandbox-pod-ip", &backend.addr.ip().to_string()),
                ("authorization", "Bearer for-the-router-only"),
                ("x-forwarded-for", "6.6.6.6"),
                ("connection", "keep-alive, x-hop"),
                ("x-hop", "secret-hop"),
                ("x-request-id", "req-42"),
                ("content-type", "text/plain"),
            ],
            "body bytes",
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.text(), "body bytes");
    let echoed = |name: &str| {
        reply
            .headers
            .get(format!("x-echo-{name}"))
            .map(|v| v.to_str().unwrap().to_owned())
    };
    assert_eq!(echoed("method").as_deref(), Some("POST"));
    assert_eq!(echoed("uri").as_deref(), Some("/some/path?q=1&r=two"));
    assert_eq!(
        echoed("host"),
        Some(format!("{}:8888", backend.addr.ip())),
        "Host is the pod's address"
    );
    assert_eq!(echoed("x-forwarded-for").as_deref(), Some("127.0.0.1"));
    assert_eq!(echoed("x-forwarded-host").as_deref(), Some("router.test"));
    assert_eq!(echoed("x-forwarded-proto").as_deref(), Some("http"));
    assert_eq!(echoed("x-request-id").as_deref(), Some("req-42"));
    assert_eq!(echoed("content-type").as_deref(), Some("text/plain"));
    for stripped in [
        "authorization",
        "x-sandbox-id",
        "x-sandbox-namespace",
        "x-sandbox-port",
        "x-sandbox-timeout",
        "x-sandbox-uid",
        "x-sandbox-pod-ip",
        "x-hop",
    ] {
        assert_eq!(echoed(stripped), None, "{stripped} reached the sandbox");
    }
}

#[tokio::test]
async fn a_warm_sandbox_without_service_is_reachable_and_an_unclaimed_one_is_not() {
    let runtime = Runtime::start();
    // A pool member as the warm-pool reconciler creates it: controlled by the pool, labelled,
    // no Service (spec.service unset, status.serviceFQDN empty), in a non-default namespace.
    let mut member = sandbox_in("team-a", "pool-x7k2p");
    member.metadata.owner_references = Some(vec![controller(
        agent_sandbox_api::kinds::SANDBOX_WARM_POOL,
        "pool",
        "uid-pool",
    )]);
    member.metadata.labels = Some(
        [
            (
                labels::WARM_POOL_SANDBOX.to_owned(),
                agent_sandbox_api::name_hash("pool"),
            ),
            (
                labels::LAUNCH_TYPE.to_owned(),
                labels::LAUNCH_TYPE_WARM.to_owned(),
            ),
        ]
        .into_iter()
        .collect(),
    );
    member.metadata.annotations = Some(
        [(annotations::POD_NAME.to_owned(), "pool-x7k2p".to_owned())]
            .into_iter()
            .collect(),
    );
    assert!(member.spec.blueprint.service.is_none());
    let pod = pod_for(&member, runtime.ip, &[8888]);
    let router = TestRouter::start(synced_index(&[(&member, &pod)])).await;
    let headers = [
        ("x-sandbox-id", "pool-x7k2p"),
        ("x-sandbox-namespace", "team-a"),
    ];

    let unclaimed = router
        .send(Method::POST, "/execute", &headers, execute("echo no"))
        .await;
    assert_eq!(unclaimed.status, StatusCode::NOT_FOUND);
    assert_eq!(
        unclaimed.detail(),
        "Sandbox team-a/pool-x7k2p is an unclaimed warm-pool member (pool pool); claim it with a \
         SandboxClaim first."
    );

    // Adoption by a claim: the claim becomes the controller, the pool label goes.
    let mut adopted = member.clone();
    adopted.metadata.owner_references = Some(vec![controller(
        agent_sandbox_api::kinds::SANDBOX_CLAIM,
        "my-claim",
        "uid-claim",
    )]);
    adopted
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .remove(labels::WARM_POOL_SANDBOX);
    // It reaches the router's index while a request waits (its watch a moment behind the
    // claim the client saw adopt the sandbox): the request goes through, not a 404.
    let index = router.index.clone();
    let adopt = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        index.write().apply_sandbox(&adopted);
    });
    let reply = router
        .send(Method::POST, "/execute", &headers, execute("echo warm"))
        .await;
    adopt.await.unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.json()["stdout"], "warm\n");
}

#[tokio::test]
async fn unknown_and_not_ready_sandboxes_are_404_saying_which() {
    let runtime = Runtime::start();
    let ready = sandbox("ready");
    let pending = not_ready(
        sandbox("pending"),
        "DependenciesNotReady",
        "Pod exists with phase: Pending",
    );
    let podless = sandbox("podless");
    let ready_pod = pod_for(&ready, runtime.ip, &[]);
    let pending_pod = pod_for(&pending, runtime.ip, &[]);
    let index = synced_index(&[(&ready, &ready_pod), (&pending, &pending_pod)]);
    index.write().apply_sandbox(&podless);
    let router = TestRouter::start(index).await;

    let unknown = router.call("nobody", Method::GET, "/", Bytes::new()).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.detail(), "Sandbox default/nobody not found.");

    let other_namespace = router
        .send(
            Method::GET,
            "/",
            &[
                ("x-sandbox-id", "ready"),
                ("x-sandbox-namespace", "elsewhere"),
            ],
            Bytes::new(),
        )
        .await;
    assert_eq!(other_namespace.status, StatusCode::NOT_FOUND);
    assert_eq!(
        other_namespace.detail(),
        "Sandbox elsewhere/ready not found."
    );

    let pending = router.call("pending", Method::GET, "/", Bytes::new()).await;
    assert_eq!(pending.status, StatusCode::NOT_FOUND);
    assert_eq!(
        pending.detail(),
        "Sandbox default/pending is not Ready: DependenciesNotReady: Pod exists with phase: Pending"
    );

    let podless = router.call("podless", Method::GET, "/", Bytes::new()).await;
    assert_eq!(podless.status, StatusCode::NOT_FOUND);
    assert_eq!(
        podless.detail(),
        "Sandbox default/podless is not Ready: its pod podless is not known yet."
    );

    assert_eq!(
        router
            .call("ready", Method::GET, "/", Bytes::new())
            .await
            .status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn before_the_initial_lists_unknown_sandboxes_are_503_and_readyz_waits() {
    let index = agent_sandbox_router::SharedIndex::new();
    let router = TestRouter::start(index.clone()).await;
    let early = router.call("box", Method::GET, "/", Bytes::new()).await;
    assert_eq!(early.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        early.detail().contains("has not finished its initial list"),
        "{}",
        early.detail()
    );
    let readyz = router.send(Method::GET, "/readyz", &[], Bytes::new()).await;
    assert_eq!(readyz.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        readyz.detail(),
        "The router's index has not synced yet (sandboxes listed: false, pods listed: false)."
    );
    let healthz = router
        .send(Method::GET, "/healthz", &[], Bytes::new())
        .await;
    assert_eq!(healthz.status, StatusCode::OK);
    assert_eq!(healthz.json(), json!({"status": "ok"}));

    index.write().reset_sandboxes([]);
    index.write().reset_pods([]);
    let readyz = router.send(Method::GET, "/readyz", &[], Bytes::new()).await;
    assert_eq!(readyz.status, StatusCode::OK);
    assert_eq!(readyz.json(), json!({"status": "ok"}));
    let late = router.call("box", Method::GET, "/", Bytes::new()).await;
    assert_eq!(late.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn malformed_headers_are_400() {
    let router = TestRouter::start(synced_index(&[])).await;
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (vec![], "X-Sandbox-ID header is required."),
        (
            vec![("x-sandbox-id", "my.box")],
            "Invalid sandbox ID format",
        ),
        (
            vec![("x-sandbox-id", "box.evil.example.com")],
            "Invalid sandbox ID format",
        ),
        (
            vec![("x-sandbox-id", "../etc")],
            "Invalid sandbox ID format",
        ),
        (vec![("x-sandbox-id", "a/b")], "Invalid sandbox ID format"),
        (vec![("x-sandbox-id", "Box")], "Invalid sandbox ID format"),
        (
            vec![
                ("x-sandbox-id", "box"),
                ("x-sandbox-namespace", "kube-system/x"),
            ],
            "Invalid namespace format",
        ),
        (
            vec![("x-sandbox-id", "box"), ("x-sandbox-namespace", "a.b")],
            "Invalid namespace format",
        ),
        (
            vec![("x-sandbox-id", "box"), ("x-sandbox-port", "0")],
            "Invalid port format",
        ),
        (
            vec![("x-sandbox-id", "box"), ("x-sandbox-port", "99999")],
            "Invalid port format",
        ),
        (
            vec![("x-sandbox-id", "box"), ("x-sandbox-port", "ssh")],
            "Invalid port format",
        ),
        (
            vec![
                ("x-sandbox-id", "box"),
                ("x-sandbox-pod-ip", "metadata.google.internal"),
            ],
            "Invalid target IP address",
        ),
        (
            vec![("x-sandbox-id", "box"), ("x-sandbox-timeout", "-1")],
            "Invalid timeout",
        ),
        (
            vec![("x-sandbox-id", "box"), ("x-sandbox-timeout", "soon")],
            "Invalid timeout",
        ),
    ];
    for (headers, expected) in cases {
        let reply = router.send(Method::GET, "/", &headers, Bytes::new()).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{headers:?}");
        let detail = reply.detail();
        assert!(detail.starts_with(expected), "{headers:?}: {detail}");
    }
    // CONNECT is never tunnelled.
    let mut stream = tokio::net::TcpStream::connect(router.addr).await.unwrap();
    stream
        .write_all(
            b"CONNECT 10.0.0.1:22 HTTP/1.1\r\nHost: 10.0.0.1:22\r\nX-Sandbox-ID: box\r\n\r\n",
        )
        .await
        .unwrap();
    let mut answer = vec![0u8; 1024];
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..read]);
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");
    assert!(
        answer.contains("CONNECT is not proxied (sandbox default/box)."),
        "{answer}"
    );
}

/// No SSRF: a hint pointing anywhere but the sandbox's own pod, an undeclared port, a stale UID
/// and names that are not DNS labels are refused, and nothing reaches the other address.
#[tokio::test]
async fn the_router_reaches_only_the_sandboxs_own_pod_and_ports() {
    let runtime = Runtime::start();
    // A second service on the same pod IP, on a port the pod declares.
    let declared = Backend::bind(runtime.ip, 0, echo_http).await.unwrap();
    // Another service on the same pod IP that the pod does not declare.
    let undeclared = Backend::bind(runtime.ip, 0, echo_http).await.unwrap();
    // Something else in the "cluster" that an attacker would like to reach.
    let victim = Backend::on_fresh_ip(8888, echo_http).await;

    let sandbox = sandbox("box");
    let pod = pod_for(&sandbox, runtime.ip, &[8888, declared.addr.port()]);
    let router = TestRouter::start(synced_index(&[(&sandbox, &pod)])).await;

    let declared_port = declared.addr.port().to_string();
    let ok = router
        .send(
            Method::GET,
            "/hello",
            &[("x-sandbox-id", "box"), ("x-sandbox-port", &declared_port)],
            Bytes::new(),
        )
        .await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text());
    assert_eq!(ok.headers["x-echo-uri"], "/hello");

    let undeclared_port = undeclared.addr.port().to_string();
    let refused = router
        .send(
            Method::GET,
            "/",
            &[
                ("x-sandbox-id", "box"),
                ("x-sandbox-port", &undeclared_port),
            ],
            Bytes::new(),
        )
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    let mut allowed = [8888, declared.addr.port()];
    allowed.sort_unstable();
    assert_eq!(
        refused.detail(),
        format!(
            "Port {undeclared_port} is not open on sandbox default/box: allowed are {}, {} \
             (8888 and the ports its containers declare).",
            allowed[0], allowed[1]
        )
    );

    let victim_ip = victim.addr.ip().to_string();
    for hint in [
        victim_ip.as_str(),
        "127.0.0.1",
        "169.254.169.254",
        "10.0.0.1",
        "::1",
    ] {
        let reply = router
            .send(
                Method::GET,
                "/",
                &[("x-sandbox-id", "box"), ("x-sandbox-pod-ip", hint)],
                Bytes::new(),
            )
            .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{hint}");
        assert_eq!(
            reply.detail(),
            format!(
                "Invalid target IP address: {hint} is not an address of sandbox default/box's \
                 pod box."
            )
        );
    }
    // The right hint is accepted.
    let runtime_ip = runtime.ip.to_string();
    let hinted = router
        .send(
            Method::GET,
            "/",
            &[("x-sandbox-id", "box"), ("x-sandbox-pod-ip", &runtime_ip)],
            Bytes::new(),
        )
        .await;
    assert_eq!(hinted.status, StatusCode::OK);

    // A UID from an earlier incarnation of the sandbox.
    let stale = router
        .send(
            Method::GET,
            "/",
            &[
                ("x-sandbox-id", "box"),
                ("x-sandbox-uid", "uid-of-the-old-box"),
            ],
            Bytes::new(),
        )
        .await;
    assert_eq!(stale.status, StatusCode::NOT_FOUND);
    assert_eq!(
        stale.detail(),
        "Sandbox default/box has UID uid-box, not uid-of-the-old-box (it was deleted and created \
         again)."
    );
    let current = router
        .send(
            Method::GET,
            "/",
            &[("x-sandbox-id", "box"), ("x-sandbox-uid", "uid-box")],
            Bytes::new(),
        )
        .await;
    assert_eq!(current.status, StatusCode::OK);

    // Names that could steer a DNS-based router elsewhere.
    for name in ["box.default.svc.cluster.local", "box/..", "box:8888"] {
        let reply = router
            .send(Method::GET, "/", &[("x-sandbox-id", name)], Bytes::new())
            .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{name}");
    }

    assert_eq!(victim.accepted(), 0, "the victim was reached");
    assert_eq!(undeclared.accepted(), 0, "the undeclared port was reached");
}

#[tokio::test]
async fn nothing_listening_is_502_after_connect_retries() {
    let sandbox = sandbox("gone");
    // A fresh loopback address nobody listens on: connection refused.
    let pod = pod_for(&sandbox, loopback_ip(), &[]);
    let router = TestRouter::start_with(synced_index(&[(&sandbox, &pod)]), |config| {
        config.connect_retries = 2;
    })
    .await;
    let reply = router
        .call("gone", Method::POST, "/execute", execute("echo never"))
        .await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    let detail = reply.detail();
    assert!(
        detail.starts_with("Could not connect to the backend sandbox default/gone: "),
        "{detail}"
    );
    assert!(detail.contains("3 attempt(s)"), "{detail}");
    let metrics = router
        .send(Method::GET, "/metrics", &[], Bytes::new())
        .await;
    let text = metrics.text();
    assert!(
        text.contains("sandbox_router_upstream_retries_total 2"),
        "{text}"
    );
    assert!(
        text.contains("sandbox_router_upstream_errors_total{reason=\"connect\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("sandbox_router_requests_total{method=\"POST\",code=\"502\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn a_refused_connect_is_retried_until_the_pod_listens() {
    let ip = loopback_ip();
    let sandbox = sandbox("late");
    let pod = pod_for(&sandbox, ip, &[]);
    let router = TestRouter::start_with(synced_index(&[(&sandbox, &pod)]), |config| {
        config.connect_retries = 20;
    })
    .await;
    let addr = router.addr;
    let request = tokio::spawn(async move {
        common::send(
            addr,
            Method::POST,
            "/late",
            &[("x-sandbox-id", "late")],
            Bytes::from_static(b"sent once"),
        )
        .await
    });
    // Wait until the router has been refused at least once, then start listening.
    let refused = common::eventually(Duration::from_secs(20), move || async move {
        let metrics = common::send(addr, Method::GET, "/metrics", &[], Bytes::new()).await;
        metrics
            .text()
            .lines()
            .any(|l| l.starts_with("sandbox_router_upstream_retries_total ") && !l.ends_with(" 0"))
            .then_some(())
    })
    .await;
    assert!(refused.is_some(), "the first connect was never refused");
    let backend = Backend::bind(ip, 8888, echo_http)
        .await
        .expect("the address is still free");
    let reply = tokio::time::timeout(Duration::from_secs(30), request)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.text(), "sent once");
    assert_eq!(backend.accepted(), 1);
}

/// A backend that reads requests and answers only the first `answered` of them, then closes the
/// connection after reading the next one; counts the requests it read.
async fn answer_then_hang_up(ip: std::net::IpAddr, answered: usize) -> (Backend, Arc<AtomicUsize>) {
    let read = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&read);
    let backend = Backend::bind(ip, 8888, move |mut stream| {
        let counter = Arc::clone(&counter);
        async move {
            let mut served = 0;
            while read_head(&mut stream).await {
                counter.fetch_add(1, Ordering::SeqCst);
                if served == answered {
                    return;
                }
                served += 1;
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
            }
        }
    })
    .await
    .unwrap();
    (backend, read)
}

#[tokio::test]
async fn a_request_that_reached_the_sandbox_is_never_replayed() {
    let ip = loopback_ip();
    let (backend, read) = answer_then_hang_up(ip, 0).await;
    let sandbox = sandbox("flaky");
    let pod = pod_for(&sandbox, ip, &[]);
    let router = TestRouter::start(synced_index(&[(&sandbox, &pod)])).await;
    let reply = router
        .call("flaky", Method::GET, "/once", Bytes::new())
        .await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    assert!(
        reply
            .detail()
            .starts_with("The backend sandbox default/flaky failed to answer"),
        "{}",
        reply.detail()
    );
    assert_eq!(read.load(Ordering::SeqCst), 1, "the request was replayed");
    assert_eq!(backend.accepted(), 1);
}

#[tokio::test]
async fn a_reused_connection_that_dies_mid_request_is_not_replayed_either() {
    let ip = loopback_ip();
    let (backend, read) = answer_then_hang_up(ip, 1).await;
    let sandbox = sandbox("flaky");
    let pod = pod_for(&sandbox, ip, &[]);
    let router = TestRouter::start(synced_index(&[(&sandbox, &pod)])).await;
    let first = router.call("flaky", Method::GET, "/1", Bytes::new()).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.text(), "ok");
    // The pooled connection is reused; the backend reads the request and hangs up.
    let second = router.call("flaky", Method::GET, "/2", Bytes::new()).await;
    assert_eq!(second.status, StatusCode::BAD_GATEWAY, "{}", second.text());
    assert_eq!(read.load(Ordering::SeqCst), 2, "a request was replayed");
    assert_eq!(backend.accepted(), 1, "one pooled connection");
}

#[tokio::test]
async fn oversized_bodies_are_413_and_oversized_heads_431() {
    let backend = Backend::on_fresh_ip(8888, common::count_http).await;
    let sandbox = sandbox("limits");
    let pod = pod_for(&sandbox, backend.addr.ip(), &[]);
    let router = TestRouter::start_with(synced_index(&[(&sandbox, &pod)]), |config| {
        config.max_body_bytes = 1 << 20;
        config.max_header_bytes = 4 << 10;
    })
    .await;

    // Declared too large: refused before anything is sent.
    let declared = router
        .send(
            Method::PUT,
            "/v1/files/big",
            &[("x-sandbox-id", "limits")],
            vec![7u8; (1 << 20) + 1],
        )
        .await;
    assert_eq!(declared.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        declared.detail(),
        "Request body for sandbox default/limits exceeds the router's limit of 1048576 bytes."
    );
    assert_eq!(backend.accepted(), 0);

    // Chunked, so the size shows only while streaming.
    let (mut sender, body) = http_body_util::channel::Channel::<Bytes, std::io::Error>::new(4);
    let request = hyper::Request::builder()
        .method(Method::PUT)
        .uri("/v1/files/big")
        .header("host", "router.test")
        .header("x-sandbox-id", "limits")
        .body(body)
        .unwrap();
    let addr = router.addr;
    let response =
        tokio::spawn(async move { common::collect(common::open(addr, request).await).await });
    for _ in 0..20 {
        if sender
            .send_data(Bytes::from(vec![1u8; 64 << 10]))
            .await
            .is_err()
        {
            break;
        }
    }
    drop(sender);
    let streamed = tokio::time::timeout(Duration::from_secs(30), response)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        streamed.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        streamed.text()
    );

    // Head too large.
    let big = "x".repeat(5 << 10);
    let head = router
        .send(
            Method::GET,
            "/",
            &[("x-sandbox-id", "limits"), ("x-padding", &big)],
            Bytes::new(),
        )
        .await;
    assert_eq!(head.status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    assert!(
        head.detail()
            .ends_with("the router accepts at most 4096 (sandbox limits)."),
        "{}",
        head.detail()
    );

    // Within the limits.
    let fine = router
        .send(
            Method::PUT,
            "/v1/files/small",
            &[("x-sandbox-id", "limits")],
            vec![7u8; 1 << 20],
        )
        .await;
    assert_eq!(fine.status, StatusCode::OK);
    assert_eq!(fine.json(), json!({"bytes": 1 << 20}));
}

#[tokio::test]
async fn operations_endpoints_are_served_only_without_a_sandbox_header() {
    let backend = Backend::on_fresh_ip(8888, echo_http).await;
    let sandbox = sandbox("box");
    let pod = pod_for(&sandbox, backend.addr.ip(), &[]);
    let router = TestRouter::start(synced_index(&[(&sandbox, &pod)])).await;

    // With X-Sandbox-ID, /healthz is the sandbox's path.
    let proxied = router
        .call("box", Method::GET, "/healthz", Bytes::new())
        .await;
    assert_eq!(proxied.status, StatusCode::OK);
    assert_eq!(proxied.headers["x-echo-uri"], "/healthz");

    let metrics = router
        .send(Method::GET, "/metrics", &[], Bytes::new())
        .await;
    assert_eq!(metrics.status, StatusCode::OK);
    assert!(
        metrics.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text"),
    );
    let text = metrics.text();
    for needle in [
        "sandbox_router_requests_total{method=\"GET\",code=\"200\"} 1",
        "sandbox_router_request_duration_seconds_count 1",
        "sandbox_router_inflight_requests 0",
        "sandbox_router_open_tunnels 0",
    ] {
        assert!(text.contains(needle), "{needle} missing:\n{text}");
    }
    // Other paths without X-Sandbox-ID are refused like any request without it.
    let other = router
        .send(Method::GET, "/execute", &[], Bytes::new())
        .await;
    assert_eq!(other.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn graceful_shutdown_lets_in_flight_requests_finish() {
    let runtime = Runtime::start();
    let sandbox = sandbox("box");
    let pod = pod_for(&sandbox, runtime.ip, &[]);
    let router = TestRouter::start(synced_index(&[(&sandbox, &pod)])).await;
    let addr: SocketAddr = router.addr;
    let in_flight = tokio::spawn(async move {
        common::send(
            addr,
            Method::POST,
            "/execute",
            &[("x-sandbox-id", "box")],
            execute("touch started; sleep 2; echo finished"),
        )
        .await
    });
    let started = runtime.base.path().join("started");
    let seen = common::eventually(Duration::from_secs(20), move || {
        let started = started.clone();
        async move { started.exists().then_some(()) }
    })
    .await;
    assert!(seen.is_some(), "the command never started");
    router.stop().await;
    let reply = in_flight.await.unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.json()["stdout"], "finished\n");
    // And the listener is gone.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

/// `OPTIONS *` (the asterisk-form request target, RFC 9112 §3.2.4) asks about the server, not a
/// resource: there is nothing in a sandbox to forward it to. Over real TCP, because HTTP client
/// libraries rarely send it.
#[tokio::test]
async fn asterisk_form_requests_are_refused_with_400() {
    let backend = Backend::on_fresh_ip(8888, echo_http).await;
    let sandbox = sandbox("box");
    let pod = pod_for(&sandbox, backend.addr.ip(), &[]);
    let router = TestRouter::start(synced_index(&[(&sandbox, &pod)])).await;
    for head in [
        "OPTIONS * HTTP/1.1\r\nHost: router\r\nX-Sandbox-ID: box\r\nConnection: close\r\n\r\n",
        "OPTIONS * HTTP/1.1\r\nHost: router\r\nConnection: close\r\n\r\n",
    ] {
        let mut stream = tokio::net::TcpStream::connect(router.addr).await.unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
            .await
            .unwrap()
            .unwrap();
        let answer = String::from_utf8_lossy(&answer).into_owned();
        assert!(answer.starts_with("HTTP/1.1 400 "), "{head:?}: {answer}");
        let (_, body) = answer.split_once("\r\n\r\n").unwrap();
        let detail = serde_json::from_str::<serde_json::Value>(body).unwrap()["detail"]
            .as_str()
            .unwrap()
            .to_owned();
        if head.contains("X-Sandbox-ID") {
            assert_eq!(
                detail,
                "Request target \"*\" for sandbox default/box is not a path: the router forwards \
                 only origin-form targets (/path?query), so OPTIONS * is not proxied."
            );
        } else {
            assert_eq!(detail, "X-Sandbox-ID header is required.");
        }
    }
    assert_eq!(backend.accepted(), 0, "nothing reached the sandbox");
}
