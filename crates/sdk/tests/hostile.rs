#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The SDK against a hostile sandbox: a scripted server on 127.0.0.1 plays the router (and the
//! runtime behind it) through a direct URL, with a Ready claim in the simulated API server (no
//! controller, no pods). Whatever names, paths and sizes it sends back, the SDK never writes
//! outside the destination it was given, never follows a symlink out of it, never buffers
//! without bound, and says which name or path it refused.

use std::path::Path;
use std::time::Duration;

use agent_sandbox::{Client, ClientOptions, ConnectionMode, Error, FileType, RetryPolicy, Sandbox};
use agent_sandbox_local::testkit::{FakeBoxError, FakeRequest, FakeRouter, ready_claim};
use agent_sandbox_local::{LocalCluster, LocalConfig};

const CLAIM: &str = "hostile-claim";

/// An API server with a Ready claim, and a client attached to it through `fake`.
async fn attach(fake: &FakeRouter, options: ClientOptions) -> (LocalCluster, Sandbox) {
    let sim = LocalCluster::start(LocalConfig::api_only()).await.unwrap();
    let kube = sim.client();
    ready_claim(&kube, "default", CLAIM, "hostile-sandbox")
        .await
        .unwrap();
    let options = options
        .namespace("default")
        .connection(ConnectionMode::direct(fake.url()))
        .retry(RetryPolicy::never());
    let sandbox = Client::from_kube(kube, options)
        .get_sandbox(CLAIM)
        .await
        .unwrap();
    (sim, sandbox)
}

/// Every file and directory under `root`, relative, sorted (symlinks not followed).
fn tree(root: &Path) -> Vec<String> {
    agent_sandbox_local::testkit::tree(root).unwrap()
}

#[tokio::test]
async fn listings_with_names_that_are_not_one_component_are_refused_naming_them() {
    for bad in ["../evil", "/abs", "a/b", "..", ".", "", "nul\0byte"] {
        let fake = FakeRouter::start(move |_| {
            FakeRouter::listing(
                "dir",
                &[("fine.txt", FileType::File), (bad, FileType::File)],
            )
        })
        .await
        .unwrap();
        let (sim, sandbox) = attach(&fake, ClientOptions::default()).await;
        let error = sandbox.list("dir").await.err();
        match &error {
            Some(Error::UnsafeName { name, .. }) => assert_eq!(name, bad),
            other => panic!("listing with {bad:?}: {other:?}"),
        }
        let message = error.map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains(&format!("{bad:?}")), "{message}");
        sim.stop().await;
    }
}

#[tokio::test]
async fn mutating_the_base_directory_is_refused_before_anything_is_sent() {
    let fake = FakeRouter::start(|_| FakeRouter::json(204, &serde_json::json!({})))
        .await
        .unwrap();
    let (sim, sandbox) = attach(&fake, ClientOptions::default()).await;
    let before = fake.requests().len();
    for path in [
        "",
        ".",
        "./",
        "work/..",
        "work/../",
        "a/b/../..",
        "./work/./..",
        "//",
    ] {
        let error = sandbox.remove(path, true).await.err();
        assert!(
            matches!(&error, Some(Error::InvalidPath { path: p, .. }) if p == path),
            "remove {path:?}: {error:?}"
        );
        let message = error.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            message.contains(&format!("{path:?}")) && message.contains("base directory"),
            "{message}"
        );
        assert!(sandbox.write(path, "x").await.is_err(), "write {path:?}");
        assert!(sandbox.mkdir(path).await.is_err(), "mkdir {path:?}");
    }
    // Climbing out is refused for every operation, reads too.
    for path in ["..", "../x", "work/../../x", "/.."] {
        let error = sandbox.list(path).await.err();
        assert!(
            matches!(&error, Some(Error::InvalidPath { .. })),
            "list {path:?}: {error:?}"
        );
    }
    assert_eq!(fake.requests()[before..], [] as [FakeRequest; 0]);
    sim.stop().await;
}

#[tokio::test]
async fn paths_reach_the_wire_without_dot_segments() {
    let fake = FakeRouter::start(|_| FakeRouter::listing("x", &[]))
        .await
        .unwrap();
    let (sim, sandbox) = attach(&fake, ClientOptions::default()).await;
    for (given, sent) in [
        ("work/../data/./x", "data/x"),
        ("./a//b/", "a/b"),
        (".", ""),
        ("a/..", ""),
        ("/app/x/../y", "/app/y"),
    ] {
        sandbox.list(given).await.unwrap();
        let last = fake.requests().pop().unwrap();
        assert_eq!(
            last.file_path().as_deref(),
            Some(sent),
            "{given:?}: {last:?}"
        );
        // One segment after /v1/files/: no `/`, `.` or `..` segment for a proxy to resolve.
        let encoded = last.uri.strip_prefix("/v1/files/").unwrap();
        assert!(
            !encoded.contains('/') && encoded != "." && encoded != "..",
            "{last:?}"
        );
    }
    sim.stop().await;
}

#[tokio::test]
async fn an_answer_larger_than_the_cap_is_refused_without_buffering_it() {
    // A listing whose body never ends.
    let endless = FakeRouter::start(|_| {
        let spaces = futures_util::stream::repeat_with(|| {
            Ok::<_, FakeBoxError>(hyper::body::Frame::data(bytes::Bytes::from_static(
                &[b' '; 64 * 1024],
            )))
        });
        let mut response = http::Response::new(http_body_util::BodyExt::boxed_unsync(
            http_body_util::StreamBody::new(spaces),
        ));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        response
    })
    .await
    .unwrap();
    // One that claims a terabyte (and sends a few bytes).
    let terabyte = FakeRouter::start_raw(|_| {
        FakeRouter::raw(
            200,
            &[
                ("content-type", "application/json"),
                ("content-length", "1000000000000"),
            ],
            br#"{"path": "x", "entries": []}"#,
        )
    })
    .await
    .unwrap();
    let options = ClientOptions::default()
        .max_response_bytes(1024 * 1024)
        .request_timeout(Duration::from_secs(30));
    for fake in [endless, terabyte] {
        let (sim, sandbox) = attach(&fake, options.clone()).await;
        let path = "x";
        let error = sandbox.list(path).await.err();
        assert!(
            matches!(
                &error,
                Some(Error::ResponseTooLarge {
                    limit: 1_048_576,
                    ..
                })
            ),
            "{path}: {error:?}"
        );
        let error = sandbox.read(path).await.err();
        assert!(
            matches!(&error, Some(Error::ResponseTooLarge { .. })),
            "{path}: {error:?}"
        );
        sim.stop().await;
    }
}

/// A fake whose base directory holds `dir`, listing `entries`; each directory under it lists
/// `inner` (a file), every file holds `pwned`.
async fn hostile_tree(entries: Vec<(String, FileType)>) -> FakeRouter {
    FakeRouter::start(move |request: &FakeRequest| {
        let path = request.file_path().unwrap_or_default();
        let listing = |entries: &[(String, FileType)]| {
            let borrowed: Vec<(&str, FileType)> =
                entries.iter().map(|(n, t)| (n.as_str(), *t)).collect();
            FakeRouter::listing(&path, &borrowed)
        };
        if path == "dir" {
            return listing(&entries);
        }
        let is_dir = entries
            .iter()
            .any(|(n, t)| *t == FileType::Directory && path == format!("dir/{n}"));
        if is_dir {
            listing(&[("inner".to_owned(), FileType::File)])
        } else {
            FakeRouter::answer(200, "application/octet-stream", "pwned")
        }
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_directory_download_stays_in_its_destination_whatever_the_names() {
    let scratch = tempfile::tempdir().unwrap();
    let outside = scratch.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let absolute = outside.join("abs").display().to_string();
    for bad in [
        "../evil",
        "../../evil",
        absolute.as_str(),
        "a/b",
        "..",
        ".",
        "",
        "x\0y",
    ] {
        for kind in [FileType::File, FileType::Directory] {
            let fake = hostile_tree(vec![
                ("fine.txt".to_owned(), FileType::File),
                (bad.to_owned(), kind),
            ])
            .await;
            let (sim, sandbox) = attach(&fake, ClientOptions::default()).await;
            let dest = scratch.path().join("dest");
            let _ = std::fs::remove_dir_all(&dest);
            let error = sandbox.download_dir("dir", dest.join("copy")).await.err();
            match &error {
                Some(Error::UnsafeName { name, .. }) => assert_eq!(name, bad),
                other => panic!("{bad:?} as {kind:?}: {other:?}"),
            }
            assert_eq!(tree(&outside), [] as [&str; 0], "{bad:?} {kind:?}");
            // Refused at the listing: nothing at all was written.
            assert_eq!(tree(&dest), ["copy"], "{bad:?} {kind:?}");
            sim.stop().await;
        }
    }
}

#[tokio::test]
async fn a_directory_download_never_writes_through_a_symlink_in_its_destination() {
    let scratch = tempfile::tempdir().unwrap();
    let outside = scratch.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("precious.txt"), "mine").unwrap();
    for (name, kind, points_to) in [
        ("link", FileType::Directory, outside.clone()),
        ("f.txt", FileType::File, outside.join("precious.txt")),
        ("new.txt", FileType::File, outside.join("created.txt")),
        ("dangling", FileType::Directory, outside.join("missing")),
    ] {
        let fake = hostile_tree(vec![
            ("a.txt".to_owned(), FileType::File),
            (name.to_owned(), kind),
        ])
        .await;
        let (sim, sandbox) = attach(&fake, ClientOptions::default()).await;
        let dest = scratch.path().join("dest");
        let _ = std::fs::remove_dir_all(&dest);
        std::fs::create_dir(&dest).unwrap();
        std::os::unix::fs::symlink(&points_to, dest.join(name)).unwrap();
        let error = sandbox.download_dir("dir", &dest).await.err();
        let message = error.as_ref().map(ToString::to_string).unwrap_or_default();
        assert!(
            matches!(&error, Some(Error::UnsafeDestination { path, .. }) if path.ends_with(name)),
            "{name}: {error:?}"
        );
        assert!(message.contains("symlink"), "{message}");
        assert_eq!(tree(&outside), ["precious.txt"], "{name}");
        assert_eq!(
            std::fs::read_to_string(outside.join("precious.txt")).unwrap(),
            "mine"
        );
        // The symlink is left as it was, and no temporary file is left behind.
        assert!(dest.join(name).is_symlink());
        let mut left = tree(&dest);
        left.retain(|p| p != name);
        assert!(left.iter().all(|p| p == "a.txt"), "{name}: {left:?}");
        sim.stop().await;
    }
}

#[tokio::test]
async fn a_directory_download_copies_a_tree_and_skips_links() {
    let fake = FakeRouter::start(|request: &FakeRequest| {
        match request.file_path().unwrap_or_default().as_str() {
            "src" => FakeRouter::listing(
                "src",
                &[
                    ("a.txt", FileType::File),
                    ("sub", FileType::Directory),
                    ("link", FileType::Symlink),
                ],
            ),
            "src/sub" => FakeRouter::listing("src/sub", &[("b.txt", FileType::File)]),
            "src/a.txt" => FakeRouter::answer(200, "application/octet-stream", "alpha"),
            "src/sub/b.txt" => FakeRouter::answer(200, "application/octet-stream", "beta"),
            _ => FakeRouter::not_found(),
        }
    })
    .await
    .unwrap();
    let (sim, sandbox) = attach(&fake, ClientOptions::default()).await;
    let scratch = tempfile::tempdir().unwrap();
    let dest = scratch.path().join("copy");
    // A file already there is replaced; the one that is not in the sandbox stays.
    std::fs::create_dir_all(dest.join("sub")).unwrap();
    std::fs::write(dest.join("a.txt"), "old").unwrap();
    std::fs::write(dest.join("mine.txt"), "kept").unwrap();
    let summary = sandbox.download_dir("./work/../src/", &dest).await.unwrap();
    assert_eq!((summary.files, summary.directories), (2, 1));
    assert_eq!(summary.skipped, ["src/link"]);
    assert_eq!(tree(&dest), ["a.txt", "mine.txt", "sub", "sub/b.txt"]);
    assert_eq!(
        std::fs::read_to_string(dest.join("a.txt")).unwrap(),
        "alpha"
    );
    assert_eq!(
        std::fs::read_to_string(dest.join("sub/b.txt")).unwrap(),
        "beta"
    );
    sim.stop().await;
}

#[tokio::test]
async fn a_file_whose_length_lies_leaves_nothing_behind() {
    let fake = FakeRouter::start_raw(|request: &FakeRequest| {
        if request.file_path().as_deref() == Some("src") {
            let listing = r#"{"path": "src", "entries": [{"name": "big.bin", "size": 5,
                "type": "file", "modified_at": "2026-01-01T00:00:00Z", "mode": "0644"}]}"#;
            let length = listing.len().to_string();
            return FakeRouter::raw(
                200,
                &[
                    ("content-type", "application/json"),
                    ("content-length", &length),
                ],
                listing.as_bytes(),
            );
        }
        FakeRouter::raw(
            200,
            &[
                ("content-type", "application/octet-stream"),
                ("content-length", "1000000000000"),
            ],
            b"short",
        )
    })
    .await
    .unwrap();
    let (sim, sandbox) = attach(&fake, ClientOptions::default()).await;
    let scratch = tempfile::tempdir().unwrap();
    let error = sandbox.download_dir("src", scratch.path()).await.err();
    assert!(
        matches!(&error, Some(Error::Transport { operation, message, .. })
            if operation == "download src/big.bin" && message.starts_with("reading the file failed")),
        "{error:?}"
    );
    assert_eq!(tree(scratch.path()), [] as [&str; 0]);
    sim.stop().await;
}

#[tokio::test]
async fn collected_output_is_capped_and_process_ids_are_never_dot_segments() {
    // A command whose output never ends.
    let fake = FakeRouter::start(|_| {
        let line = serde_json::to_string(&agent_sandbox::ExecEvent::Stdout(
            agent_sandbox::OutputChunk::from_bytes(0, &[b'x'; 32 * 1024]),
        ))
        .unwrap()
            + "\n";
        let line = bytes::Bytes::from(line);
        let events = futures_util::stream::repeat_with(move || {
            Ok::<_, FakeBoxError>(hyper::body::Frame::data(line.clone()))
        });
        let mut response = http::Response::new(http_body_util::BodyExt::boxed_unsync(
            http_body_util::StreamBody::new(events),
        ));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/x-ndjson"),
        );
        response
    })
    .await
    .unwrap();
    let options = ClientOptions::default().max_response_bytes(1024 * 1024);
    let (sim, sandbox) = attach(&fake, options).await;
    let stream = sandbox
        .exec_stream(agent_sandbox::ExecOptions::shell("yes").timeout(Duration::from_secs(1)))
        .await
        .unwrap();
    let error = stream.collect_output().await.err();
    assert!(
        matches!(
            &error,
            Some(Error::ResponseTooLarge {
                limit: 1_048_576,
                ..
            })
        ),
        "{error:?}"
    );
    let before = fake.requests().len();
    for id in ["..", ".", ""] {
        assert!(
            matches!(
                sandbox.kill_process(id).await,
                Err(Error::InvalidOption { .. })
            ),
            "{id:?}"
        );
    }
    assert_eq!(fake.requests().len(), before);
    sim.stop().await;
}
