#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `/v1/files` and large transfers: streamed 64 MiB round trips checked by SHA-256 (v1 and
//! legacy), atomic writes, listings, deletes, mkdir, limits and traversal.

mod common;

use std::os::unix::fs::PermissionsExt;

use assert_json_diff::assert_json_include;
use bytes::Bytes;
use common::TestServer;
use futures_util::StreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::{Method, Request, StatusCode};
use pretty_assertions::assert_eq;
use serde_json::json;
use sha2::{Digest, Sha256};

const BIG: usize = 64 << 20;
const CHUNK: usize = 256 << 10;

/// A streamed request body of `data` in chunks.
fn streamed(
    data: Vec<u8>,
) -> StreamBody<impl futures_util::Stream<Item = Result<Frame<Bytes>, std::io::Error>>> {
    let data = Bytes::from(data);
    let chunks = (0..data.len()).step_by(CHUNK).map(move |start| {
        let end = (start + CHUNK).min(data.len());
        Ok(Frame::data(data.slice(start..end)))
    });
    StreamBody::new(futures_util::stream::iter(chunks.collect::<Vec<_>>()))
}

/// Downloads `path`, hashing the body as it streams in.
async fn download_digest(server: &TestServer, path: &str) -> (StatusCode, usize, Vec<u8>) {
    let response = common::open(
        server.addr,
        common::request(Method::GET, path, &[], Bytes::new()),
    )
    .await;
    let status = response.status();
    let mut body = response.into_body().into_data_stream();
    let mut hasher = Sha256::new();
    let mut len = 0;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.unwrap();
        len += chunk.len();
        hasher.update(&chunk);
    }
    (status, len, hasher.finalize().to_vec())
}

#[tokio::test]
async fn v1_put_and_get_64_mib_by_checksum() {
    let server = TestServer::start().await;
    let data = common::pseudo_random(7, BIG);
    let expected = Sha256::digest(&data).to_vec();
    let request = Request::builder()
        .method(Method::PUT)
        .uri("/v1/files/big/data.bin?mode=0640")
        .header("host", "sandbox")
        .body(streamed(data))
        .unwrap();
    let response = common::open(server.addr, request).await;
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let meta = std::fs::metadata(server.base.path().join("big/data.bin")).unwrap();
    assert_eq!(meta.len(), BIG as u64);
    assert_eq!(meta.permissions().mode() & 0o777, 0o640);
    let (status, len, digest) = download_digest(&server, "/v1/files/big/data.bin").await;
    assert_eq!((status, len), (StatusCode::OK, BIG));
    assert_eq!(digest, expected);
}

#[tokio::test]
async fn legacy_upload_and_download_64_mib_by_checksum() {
    let server = TestServer::start().await;
    let data = common::pseudo_random(11, BIG);
    let expected = Sha256::digest(&data).to_vec();
    let boundary = "bigboundaryQ8x";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"data/big.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(&data);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    drop(data);
    let request = Request::builder()
        .method(Method::POST)
        .uri("/upload")
        .header("host", "sandbox")
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(streamed(body))
        .unwrap();
    let response = common::open(server.addr, request).await;
    let status = response.status();
    let text = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&text));
    assert_eq!(
        text.as_ref(),
        br#"{"message":"File 'data/big.bin' uploaded successfully."}"#
    );
    let (status, len, digest) = download_digest(&server, "/download/data/big.bin").await;
    assert_eq!((status, len), (StatusCode::OK, BIG));
    assert_eq!(digest, expected);
}

#[tokio::test]
async fn v1_file_operations() {
    let server = TestServer::start().await;
    let put = |path: &'static str, body: &'static str| {
        let server = &server;
        async move { server.send(Method::PUT, path, &[], body).await }
    };
    assert_eq!(
        put("/v1/files/src/main.py", "print(1)\n").await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        put("/v1/files/src/lib/util.py", "x = 1\n").await.status,
        StatusCode::NO_CONTENT
    );
    let reply = server.get("/v1/files/src/main.py").await;
    assert_eq!(
        (reply.status, reply.text()),
        (StatusCode::OK, "print(1)\n".to_owned())
    );
    assert_eq!(
        reply.header("content-type").as_deref(),
        Some("application/octet-stream")
    );

    let listing = server.get("/v1/files/src").await;
    assert_eq!(
        listing.header("content-type").as_deref(),
        Some("application/json")
    );
    let listing = listing.json();
    assert_eq!(listing["path"], "src");
    assert_json_include!(actual: listing["entries"].clone(), expected: json!([
        {"name": "lib", "type": "directory"},
        {"name": "main.py", "type": "file", "size": 9, "mode": "0644"},
    ]));
    assert!(
        listing["entries"][1]["modified_at"]
            .as_str()
            .unwrap()
            .ends_with('Z')
    );
    let root = server.get("/v1/files/").await.json();
    assert_eq!(root["entries"][0]["name"], "src");

    let head = server
        .send(Method::HEAD, "/v1/files/src/main.py", &[], "")
        .await;
    assert_eq!(
        (head.status, head.header("content-length")),
        (StatusCode::OK, Some("9".to_owned()))
    );
    let head = server
        .send(Method::HEAD, "/v1/files/src/nope.py", &[], "")
        .await;
    assert_eq!(head.status, StatusCode::NOT_FOUND);

    // Writing over a directory, deleting a non-empty one.
    let reply = put("/v1/files/src", "x").await;
    assert_eq!(
        (reply.status, reply.json()["code"].clone()),
        (StatusCode::CONFLICT, json!("CONFLICT"))
    );
    let reply = server.send(Method::DELETE, "/v1/files/src", &[], "").await;
    assert_eq!(reply.status, StatusCode::CONFLICT);
    let reply = server
        .send(Method::DELETE, "/v1/files/src?recursive=true", &[], "")
        .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    assert!(!server.base.path().join("src").exists());
    let reply = server.send(Method::DELETE, "/v1/files/src", &[], "").await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    let reply = server.send(Method::DELETE, "/v1/files/", &[], "").await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);

    // mkdir: created, then already there.
    let reply = server
        .send(Method::POST, "/v1/files/a/b/c?op=mkdir", &[], "")
        .await;
    assert_eq!(reply.status, StatusCode::CREATED);
    let reply = server
        .send(Method::POST, "/v1/files/a/b/c?op=mkdir", &[], "")
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(server.base.path().join("a/b/c").is_dir());
    let reply = server
        .send(Method::POST, "/v1/files/a?op=rename", &[], "")
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    let reply = server
        .send(Method::PUT, "/v1/files/f?mode=999", &[], "x")
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);

    // A symlink at the target is replaced, not written through.
    std::fs::write(server.base.path().join("real.txt"), "real").unwrap();
    std::os::unix::fs::symlink("real.txt", server.base.path().join("link.txt")).unwrap();
    assert_eq!(
        put("/v1/files/link.txt", "new").await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        std::fs::read_to_string(server.base.path().join("real.txt")).unwrap(),
        "real"
    );
    let listing = server.get("/v1/files/").await.json();
    assert!(
        listing["entries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["type"] != "symlink")
    );
}

#[tokio::test]
async fn v1_limits_and_traversal() {
    let server = TestServer::start_with(|c| c.max_upload_bytes = 1000).await;
    let reply = server
        .send(Method::PUT, "/v1/files/too-big", &[], vec![b'x'; 2000])
        .await;
    assert_eq!(
        (reply.status, reply.json()["code"].clone()),
        (StatusCode::PAYLOAD_TOO_LARGE, json!("PAYLOAD_TOO_LARGE"))
    );
    // A chunked body without a length is cut off while streaming; nothing is left behind.
    let request = Request::builder()
        .method(Method::PUT)
        .uri("/v1/files/too-big")
        .header("host", "sandbox")
        .body(streamed(vec![b'x'; 5000]))
        .unwrap();
    let response = common::open(server.addr, request).await;
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(std::fs::read_dir(server.base.path()).unwrap().count(), 0);

    let base = server.base.path();
    std::fs::write(base.join("inside.txt"), "ok").unwrap();
    std::os::unix::fs::symlink("/etc", base.join("out")).unwrap();
    std::os::unix::fs::symlink("loop-b", base.join("loop-a")).unwrap();
    std::os::unix::fs::symlink("loop-a", base.join("loop-b")).unwrap();
    for (path, status, code) in [
        (
            "/v1/files/..%2F..%2Fetc%2Fpasswd",
            StatusCode::FORBIDDEN,
            "PERMISSION_DENIED",
        ),
        (
            "/v1/files/%2e%2e/%2e%2e/etc/passwd",
            StatusCode::FORBIDDEN,
            "PERMISSION_DENIED",
        ),
        (
            "/v1/files/%2Fetc%2Fpasswd",
            StatusCode::FORBIDDEN,
            "PERMISSION_DENIED",
        ),
        (
            "/v1/files/out/passwd",
            StatusCode::FORBIDDEN,
            "PERMISSION_DENIED",
        ),
        ("/v1/files/out", StatusCode::FORBIDDEN, "PERMISSION_DENIED"),
        (
            "/v1/files/loop-a",
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            "/v1/files/inside.txt%00",
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        ("/v1/files/%ff", StatusCode::BAD_REQUEST, "INVALID_ARGUMENT"),
    ] {
        let reply = server.get(path).await;
        assert_eq!(
            (reply.status, reply.json()["code"].clone()),
            (status, json!(code)),
            "{path}"
        );
    }
    for path in [
        "/v1/files/out/evil",
        "/v1/files/loop-a/evil",
        "/v1/files/..%2Fevil",
    ] {
        let reply = server.send(Method::PUT, path, &[], "pwned").await;
        assert!(
            reply.status == StatusCode::FORBIDDEN || reply.status == StatusCode::BAD_REQUEST,
            "{path}: {}",
            reply.text()
        );
        let reply = server.send(Method::DELETE, path, &[], "").await;
        assert!(reply.status.is_client_error(), "{path}");
    }
    assert!(!std::path::Path::new("/etc/evil").exists());
    assert!(std::path::Path::new("/etc/passwd").exists());
    // Absolute paths inside the base directory are accepted.
    let absolute = format!("{}/inside.txt", server.base_path().display());
    let encoded =
        percent_encoding::utf8_percent_encode(&absolute, percent_encoding::NON_ALPHANUMERIC)
            .to_string();
    let reply = server.get(&format!("/v1/files/{encoded}")).await;
    assert_eq!(
        (reply.status, reply.text()),
        (StatusCode::OK, "ok".to_owned())
    );
}

/// Issue 15 item 1: a path that normalises to the base directory (`dir/..`, `.`, ``, the base's
/// absolute path) is refused with 400 naming it by every mutating endpoint, and the sandbox's
/// files stay; reading the base directory through such a path still works.
#[tokio::test]
async fn mutations_never_target_the_base_directory() {
    let server = TestServer::start().await;
    let base = server.base.path();
    std::fs::create_dir(base.join("dir")).unwrap();
    std::fs::write(base.join("dir/keep.txt"), "keep").unwrap();
    std::fs::write(base.join("top.txt"), "top").unwrap();
    let absolute = format!("{}/dir/..", server.base_path().display());
    let absolute =
        percent_encoding::utf8_percent_encode(&absolute, percent_encoding::NON_ALPHANUMERIC)
            .to_string();
    let intact = || {
        assert_eq!(
            std::fs::read_to_string(base.join("dir/keep.txt")).unwrap(),
            "keep"
        );
        assert_eq!(
            std::fs::read_to_string(base.join("top.txt")).unwrap(),
            "top"
        );
    };
    for (raw, shown) in [
        ("dir/..", "dir/.."),
        ("dir%2F..", "dir/.."),
        ("dir/%2e%2e/", "dir/../"),
        ("./dir/../.", "./dir/../."),
        (".", "."),
        ("", ""),
        (absolute.as_str(), ""),
    ] {
        for (method, query, body) in [
            (Method::DELETE, "?recursive=true", ""),
            (Method::DELETE, "", ""),
            (Method::PUT, "", "pwned"),
            (Method::POST, "?op=mkdir", ""),
        ] {
            let uri = format!("/v1/files/{raw}{query}");
            let reply = server.send(method.clone(), &uri, &[], body).await;
            assert_eq!(
                (reply.status, reply.json()["code"].clone()),
                (StatusCode::BAD_REQUEST, json!("INVALID_ARGUMENT")),
                "{method} {uri}: {}",
                reply.text()
            );
            let message = reply.json()["message"].as_str().unwrap().to_owned();
            assert!(message.contains("base directory"), "{uri}: {message}");
            if !shown.is_empty() {
                assert!(message.contains(&format!("'{shown}'")), "{uri}: {message}");
            }
            intact();
        }
        // Multipart PUT too.
        let boundary = "b0undary";
        let body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x\"\r\n\r\npwned\r\n--{boundary}--\r\n"
        );
        let content_type = format!("multipart/form-data; boundary={boundary}");
        let reply = server
            .send(
                Method::PUT,
                &format!("/v1/files/{raw}"),
                &[("content-type", &content_type)],
                body,
            )
            .await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{raw}: {}",
            reply.text()
        );
        intact();
    }
    // Reading the base directory through a path that names it stays allowed.
    let listing = server.get("/v1/files/dir/..").await;
    assert_eq!(listing.status, StatusCode::OK);
    assert_eq!(listing.json()["entries"][0]["name"], "dir");
    // `..` inside the base directory is resolved lexically.
    let reply = server.get("/v1/files/dir/../top.txt").await;
    assert_eq!(
        (reply.status, reply.text()),
        (StatusCode::OK, "top".to_owned())
    );
    let reply = server
        .send(Method::DELETE, "/v1/files/dir/../top.txt", &[], "")
        .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    assert!(!base.join("top.txt").exists());
    intact_dir(base);
}

fn intact_dir(base: &std::path::Path) {
    assert_eq!(
        std::fs::read_to_string(base.join("dir/keep.txt")).unwrap(),
        "keep"
    );
}

/// Issue 15 item 11 (`/v1`): an over-long path is a 400, not a 500; `HEAD` answers what `GET`
/// answers for a FIFO; a multipart body with malformed part headers is a 400.
#[tokio::test]
async fn v1_status_codes_for_long_paths_fifos_and_bad_multipart() {
    let server = TestServer::start().await;
    let long_name = "n".repeat(300);
    let long_path = vec!["d"; 2100].join("/");
    for path in [long_name.as_str(), long_path.as_str()] {
        for (method, query) in [
            (Method::GET, ""),
            (Method::HEAD, ""),
            (Method::PUT, ""),
            (Method::DELETE, ""),
            (Method::POST, "?op=mkdir"),
        ] {
            let uri = format!("/v1/files/{path}{query}");
            let reply = server.send(method.clone(), &uri, &[], "x").await;
            assert_eq!(
                reply.status,
                StatusCode::BAD_REQUEST,
                "{method} {}...",
                &uri[..40]
            );
            if method != Method::HEAD {
                assert_eq!(reply.json()["code"], "INVALID_ARGUMENT");
            }
        }
        let reply = server
            .post_json("/v1/exec", &json!({"argv": ["true"], "cwd": path}))
            .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());
    }

    rustix::fs::mknodat(
        rustix::fs::CWD,
        server.base.path().join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from(0o644),
        0,
    )
    .unwrap();
    let get = server.get("/v1/files/fifo").await;
    let head = server.send(Method::HEAD, "/v1/files/fifo", &[], "").await;
    assert_eq!(get.status, StatusCode::CONFLICT, "{}", get.text());
    assert_eq!(head.status, get.status);

    for body in [
        // A part header line without a colon.
        "--b0\r\nContent-Disposition form-data; name=\"file\"; filename=\"x\"\r\n\r\nx\r\n--b0--\r\n",
        // A header name with a space, then garbage.
        "--b0\r\nBad Header: y\r\n\r\nx\r\n--b0--\r\n",
    ] {
        let reply = server
            .send(
                Method::PUT,
                "/v1/files/upload.txt",
                &[("content-type", "multipart/form-data; boundary=b0")],
                body,
            )
            .await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{body:?}: {}",
            reply.text()
        );
        assert_eq!(reply.json()["code"], "INVALID_ARGUMENT");
    }
    assert!(!server.base.path().join("upload.txt").exists());
}
