#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Property test over HTTP: random client paths (dot forms, empty components, absolute
//! spellings, symlinks in, out and looping, percent-encoded in several ways) sent to every
//! endpoint that takes a path (legacy and `/v1`, file paths, upload filenames and `cwd`). No
//! request may touch anything outside the base directory, remove the base directory, run a
//! command outside it, or answer a 5xx.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use common::TestServer;
use hyper::{Method, StatusCode};
use percent_encoding::{AsciiSet, CONTROLS, NON_ALPHANUMERIC, utf8_percent_encode};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::json;

#[derive(Debug, Clone, Copy)]
enum Endpoint {
    V1Get,
    V1Head,
    V1Put,
    V1PutMultipart,
    V1Delete { recursive: bool },
    V1Mkdir,
    Download,
    List,
    Exists,
    Upload,
    Execute,
    V1Exec,
}

fn endpoint() -> impl Strategy<Value = Endpoint> {
    prop_oneof![
        Just(Endpoint::V1Get),
        Just(Endpoint::V1Head),
        Just(Endpoint::V1Put),
        Just(Endpoint::V1PutMultipart),
        any::<bool>().prop_map(|recursive| Endpoint::V1Delete { recursive }),
        Just(Endpoint::V1Mkdir),
        Just(Endpoint::Download),
        Just(Endpoint::List),
        Just(Endpoint::Exists),
        Just(Endpoint::Upload),
        Just(Endpoint::Execute),
        Just(Endpoint::V1Exec),
    ]
}

/// How the path goes into the URL.
#[derive(Debug, Clone, Copy)]
enum Encoding {
    /// Only what a URL cannot carry is encoded.
    Plain,
    /// `/` too.
    Slashes,
    /// Everything but letters and digits (dots included).
    All,
    /// Everything, twice (the legacy endpoints unquote twice, as upstream).
    Twice,
}

fn encoding() -> impl Strategy<Value = Encoding> {
    prop_oneof![
        Just(Encoding::Plain),
        Just(Encoding::Slashes),
        Just(Encoding::All),
        Just(Encoding::Twice),
    ]
}

const PLAIN: &AsciiSet = &CONTROLS.add(b' ').add(b'%').add(b'?').add(b'#').add(b'"');

fn encode(path: &str, encoding: Encoding) -> String {
    match encoding {
        Encoding::Plain => utf8_percent_encode(path, PLAIN).to_string(),
        Encoding::Slashes => utf8_percent_encode(path, PLAIN)
            .to_string()
            .replace('/', "%2F"),
        Encoding::All => utf8_percent_encode(path, NON_ALPHANUMERIC).to_string(),
        Encoding::Twice => {
            let once = utf8_percent_encode(path, NON_ALPHANUMERIC).to_string();
            utf8_percent_encode(&once, NON_ALPHANUMERIC).to_string()
        }
    }
}

/// A path made of the fixture's names, dot forms and empty components; relative, absolute, or
/// absolute through the base directory's own spelling.
fn client_path(base: String) -> impl Strategy<Value = String> {
    let long = "n".repeat(256);
    let names = [
        "a",
        "f.txt",
        "b",
        "..",
        ".",
        "",
        "in",
        "out",
        "rel-out",
        "file-out",
        "loop1",
        "new",
        "secret.txt",
        "x y",
    ];
    let component = prop::sample::select(
        names
            .iter()
            .map(|name| (*name).to_owned())
            .chain([long])
            .collect::<Vec<String>>(),
    );
    (0..3u8, prop::collection::vec(component, 0..6)).prop_map(move |(form, parts)| {
        let joined = parts.join("/");
        match form {
            0 => joined,
            1 => format!("/{joined}"),
            _ => format!("{base}/{joined}"),
        }
    })
}

/// Everything under `dir`, without following symlinks.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let value = if meta.file_type().is_symlink() {
                format!("link {}", std::fs::read_link(&path).unwrap().display())
            } else if meta.is_dir() {
                stack.push(path.clone());
                "dir".to_owned()
            } else {
                format!("file {:?}", std::fs::read(&path).unwrap())
            };
            out.insert(path.strip_prefix(dir).unwrap().to_path_buf(), value);
        }
    }
    out
}

/// Empties `base` and lays out the fixture: a directory, a file, links in, out (absolute and
/// relative), to a file outside, and a loop.
fn reset(base: &Path, outside: &Path) {
    for entry in std::fs::read_dir(base).unwrap() {
        let path = entry.unwrap().path();
        if std::fs::symlink_metadata(&path).unwrap().is_dir() {
            std::fs::remove_dir_all(&path).unwrap();
        } else {
            std::fs::remove_file(&path).unwrap();
        }
    }
    std::fs::create_dir_all(base.join("a/b")).unwrap();
    std::fs::write(base.join("a/f.txt"), "f").unwrap();
    std::os::unix::fs::symlink("a", base.join("in")).unwrap();
    std::os::unix::fs::symlink(outside, base.join("out")).unwrap();
    let relative_out = PathBuf::from("..").join(outside.file_name().unwrap());
    std::os::unix::fs::symlink(&relative_out, base.join("rel-out")).unwrap();
    std::os::unix::fs::symlink(relative_out.join("secret.txt"), base.join("file-out")).unwrap();
    std::os::unix::fs::symlink("loop2", base.join("loop1")).unwrap();
    std::os::unix::fs::symlink("loop1", base.join("loop2")).unwrap();
}

fn multipart(filename: &str) -> (String, Bytes) {
    let boundary = "propboundary";
    let filename = filename.replace('"', "%22");
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n\r\npwned\r\n--{boundary}--\r\n"
    );
    (
        format!("multipart/form-data; boundary={boundary}"),
        Bytes::from(body),
    )
}

async fn request(
    server: &TestServer,
    endpoint: Endpoint,
    path: &str,
    encoded: &str,
) -> common::Reply {
    match endpoint {
        Endpoint::V1Get => server.get(&format!("/v1/files/{encoded}")).await,
        Endpoint::V1Head => {
            server
                .send(Method::HEAD, &format!("/v1/files/{encoded}"), &[], "")
                .await
        }
        Endpoint::V1Put => {
            server
                .send(Method::PUT, &format!("/v1/files/{encoded}"), &[], "pwned")
                .await
        }
        Endpoint::V1PutMultipart => {
            let (content_type, body) = multipart("ignored.txt");
            server
                .send(
                    Method::PUT,
                    &format!("/v1/files/{encoded}"),
                    &[("content-type", &content_type)],
                    body,
                )
                .await
        }
        Endpoint::V1Delete { recursive } => {
            let query = if recursive { "?recursive=true" } else { "" };
            server
                .send(
                    Method::DELETE,
                    &format!("/v1/files/{encoded}{query}"),
                    &[],
                    "",
                )
                .await
        }
        Endpoint::V1Mkdir => {
            server
                .send(
                    Method::POST,
                    &format!("/v1/files/{encoded}?op=mkdir"),
                    &[],
                    "",
                )
                .await
        }
        Endpoint::Download => server.get(&format!("/download/{encoded}")).await,
        Endpoint::List => server.get(&format!("/list/{encoded}")).await,
        Endpoint::Exists => server.get(&format!("/exists/{encoded}")).await,
        Endpoint::Upload => {
            let (content_type, body) = multipart(path);
            server
                .send(
                    Method::POST,
                    "/upload",
                    &[("content-type", &content_type)],
                    body,
                )
                .await
        }
        Endpoint::Execute => {
            server
                .post_json("/execute", &json!({"command": "pwd", "cwd": path}))
                .await
        }
        Endpoint::V1Exec => {
            server
                .post_json("/v1/exec", &json!({"argv": ["pwd"], "cwd": path}))
                .await
        }
    }
}

#[test]
fn no_endpoint_reaches_outside_the_base() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // `top/base` (the base directory) and `top/outside`, which no request may change.
    let top = tempfile::tempdir().unwrap();
    let top = top.path().canonicalize().unwrap();
    let base = top.join("base");
    let outside = top.join("outside");
    std::fs::create_dir_all(outside.join("sub")).unwrap();
    std::fs::create_dir(&base).unwrap();
    std::fs::write(outside.join("secret.txt"), "secret").unwrap();
    let untouched = snapshot(&outside);
    let server = runtime.block_on(TestServer::start_with(|c| c.base_dir = base.clone()));

    let strategy = prop::collection::vec(
        (
            endpoint(),
            client_path(base.display().to_string()),
            encoding(),
        ),
        1..4,
    );
    let mut runner = TestRunner::new(Config {
        cases: 512,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |requests| {
        reset(&base, &outside);
        for (endpoint, path, encoding) in &requests {
            let encoded = encode(path, *encoding);
            let reply = runtime.block_on(request(&server, *endpoint, path, &encoded));
            let what = format!("{endpoint:?} {path:?} as {encoded}");
            prop_assert!(
                !reply.status.is_server_error(),
                "{what}: {} {}",
                reply.status,
                reply.text()
            );
            prop_assert_eq!(&snapshot(&outside), &untouched, "{}", what);
            prop_assert!(base.is_dir(), "{what} removed the base directory");
            let beside = std::fs::read_dir(&top).unwrap().count();
            prop_assert_eq!(beside, 2, "{} created something beside the base", what);
            if matches!(endpoint, Endpoint::Execute) && reply.status == StatusCode::OK {
                let body = reply.json();
                if body["exit_code"] == 0 {
                    let cwd = body["stdout"].as_str().unwrap().trim_end();
                    prop_assert!(Path::new(cwd).starts_with(&base), "{what} ran in {cwd}");
                }
            }
            if matches!(endpoint, Endpoint::V1Exec) && reply.status == StatusCode::OK {
                let text = reply.text();
                prop_assert!(
                    text.contains(&format!("\"data\":\"{}", base.display())),
                    "{what} ran elsewhere: {text}"
                );
            }
        }
        Ok::<(), TestCaseError>(())
    });
    runtime.block_on(server.stop());
    if let Err(error) = result {
        panic!("{error}");
    }
}
