//! The `sandboxctl` binary against hostile and broken endpoints on 127.0.0.1: a scripted fake
//! router (`agent_sandbox_local::testkit::FakeRouter`) that sends names climbing out of a download's
//! destination, a closed port, a plain HTTP server spoken to with TLS, a server that is not a
//! router. The API server is a simulated one with a Ready claim written by hand (no controller,
//! no pods). Every error must be one line that names what was wrong and what to do.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output, Stdio};

use agent_sandbox::FileType;
use agent_sandbox_local::testkit::{
    FakeRequest, FakeRouter, NAMESPACE, kubeconfig_yaml, ready_claim,
};
use agent_sandbox_local::{LocalCluster, LocalConfig};

const BIN: &str = env!("CARGO_BIN_EXE_sandboxctl");
const CLAIM: &str = "hostile-claim";

/// An API server with the Ready claim [`CLAIM`]; its kubeconfig is in `home`.
async fn sim(home: &Path) -> LocalCluster {
    let config = LocalConfig {
        kubeconfig: Some(home.join("kubeconfig")),
        ..LocalConfig::api_only()
    };
    let sim = LocalCluster::start(config).await.unwrap();
    ready_claim(&sim.client(), NAMESPACE, CLAIM, "hostile-sandbox")
        .await
        .unwrap();
    sim
}

/// `sandboxctl` with only `PATH`, a scratch `HOME` and `extra` in its environment.
fn ctl(home: &Path, extra: &[(&str, &str)]) -> Command {
    let mut command = Command::new(BIN);
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("TMPDIR", home)
        .stdin(Stdio::null());
    for (key, value) in extra {
        command.env(key, value);
    }
    command
}

async fn output(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The one line of a failed command's stderr (asserting there is exactly one).
#[track_caller]
fn one_line_error(out: &Output) -> String {
    agent_sandbox_local::testkit::one_error_line(out, 1)
}

/// Every path under `root`, relative and sorted (symlinks listed, not followed).
fn tree(root: &Path) -> Vec<String> {
    agent_sandbox_local::testkit::tree(root).unwrap()
}

/// A fake sandbox whose base directory holds the directory `dir`, whose listing is `entries`;
/// every directory below lists `inner` and every file holds `pwned`.
async fn hostile(entries: Vec<(String, FileType)>) -> FakeRouter {
    FakeRouter::start(move |request: &FakeRequest| {
        let path = request.file_path().unwrap_or_default();
        let listing = |entries: &[(String, FileType)]| {
            let borrowed: Vec<(&str, FileType)> =
                entries.iter().map(|(n, t)| (n.as_str(), *t)).collect();
            FakeRouter::listing(&path, &borrowed)
        };
        match path.as_str() {
            "" => listing(&[("dir".to_owned(), FileType::Directory)]),
            "dir" => listing(&entries),
            p if entries
                .iter()
                .any(|(n, t)| *t == FileType::Directory && p == format!("dir/{n}")) =>
            {
                listing(&[("inner".to_owned(), FileType::File)])
            }
            _ => FakeRouter::answer(200, "application/octet-stream", "pwned"),
        }
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn cp_from_a_hostile_sandbox_writes_nothing_outside_the_destination() {
    let home = tempfile::tempdir().unwrap();
    let sim = sim(home.path()).await;
    let kubeconfig = home.path().join("kubeconfig");
    let outside = home.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let absolute = outside.join("abs").display().to_string();
    for bad in ["../evil", "../../evil", absolute.as_str(), "a/b", "..", "."] {
        for kind in [FileType::File, FileType::Directory] {
            let fake = hostile(vec![
                ("fine.txt".to_owned(), FileType::File),
                (bad.to_owned(), kind),
            ])
            .await;
            let dest = home.path().join("dest");
            let _ = std::fs::remove_dir_all(&dest);
            std::fs::create_dir_all(dest.join("deep")).unwrap();
            let target = dest.join("deep/copy");
            let mut command = ctl(
                home.path(),
                &[
                    ("KUBECONFIG", &kubeconfig.display().to_string()),
                    ("SANDBOX_ROUTER_URL", &fake.url()),
                ],
            );
            command.arg("cp").arg(format!("{CLAIM}:dir")).arg(&target);
            let out = output(command).await;
            let line = one_line_error(&out);
            assert!(
                line.contains(&format!("{bad:?}")),
                "{bad:?} {kind:?}: {line}"
            );
            assert_eq!(tree(&outside), [] as [&str; 0], "{bad:?} {kind:?}");
            let written = tree(&dest);
            assert!(
                written
                    .iter()
                    .all(|p| p == "deep" || p.starts_with("deep/copy")),
                "{bad:?} {kind:?}: {written:?}"
            );
        }
    }
    sim.stop().await;
}

#[tokio::test]
async fn cp_never_writes_through_a_symlink_in_the_destination() {
    let home = tempfile::tempdir().unwrap();
    let sim = sim(home.path()).await;
    let kubeconfig = home.path().join("kubeconfig");
    let outside = home.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("precious.txt"), "mine").unwrap();
    // The destination already holds symlinks out of it, with the names the sandbox lists.
    for (name, kind, points_to) in [
        ("link", FileType::Directory, outside.clone()),
        ("f.txt", FileType::File, outside.join("precious.txt")),
        ("new.txt", FileType::File, outside.join("created.txt")),
    ] {
        let fake = hostile(vec![(name.to_owned(), kind)]).await;
        let dest = home.path().join("dest");
        let _ = std::fs::remove_dir_all(&dest);
        std::fs::create_dir_all(dest.join("dir")).unwrap();
        std::os::unix::fs::symlink(&points_to, dest.join("dir").join(name)).unwrap();
        let mut command = ctl(
            home.path(),
            &[
                ("KUBECONFIG", &kubeconfig.display().to_string()),
                ("SANDBOX_ROUTER_URL", &fake.url()),
            ],
        );
        // `dest` exists: the copy goes to dest/dir, where the symlink waits.
        command.arg("cp").arg(format!("{CLAIM}:dir")).arg(&dest);
        let out = output(command).await;
        let line = one_line_error(&out);
        assert!(line.contains(name) && line.contains("symlink"), "{line}");
        assert_eq!(tree(&outside), ["precious.txt"], "{name}");
        assert_eq!(
            std::fs::read_to_string(outside.join("precious.txt")).unwrap(),
            "mine"
        );
    }
    sim.stop().await;
}

#[tokio::test]
async fn rm_of_a_path_that_resolves_to_the_base_directory_sends_nothing() {
    let home = tempfile::tempdir().unwrap();
    let sim = sim(home.path()).await;
    let fake = FakeRouter::start(|_| FakeRouter::json(204, &serde_json::json!({})))
        .await
        .unwrap();
    for path in ["work/..", "work/../", "./a/b/../..", "/", ".", "..", "../x"] {
        let mut command = ctl(
            home.path(),
            &[
                (
                    "KUBECONFIG",
                    &home.path().join("kubeconfig").display().to_string(),
                ),
                ("SANDBOX_ROUTER_URL", &fake.url()),
            ],
        );
        command.args(["rm", "-r", &format!("{CLAIM}:{path}")]);
        let out = output(command).await;
        let line = one_line_error(&out);
        assert!(line.contains(&format!("{path:?}")), "{path}: {line}");
    }
    let deletes: Vec<FakeRequest> = fake
        .requests()
        .into_iter()
        .filter(|r| r.method == "DELETE")
        .collect();
    assert_eq!(deletes, []);
    sim.stop().await;
}

/// A port on 127.0.0.1 with nothing listening (bound, then closed).
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test]
async fn an_unreachable_api_server_is_one_line_that_names_it() {
    let home = tempfile::tempdir().unwrap();
    let port = closed_port();
    let kubeconfig = home.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        kubeconfig_yaml(&format!("http://127.0.0.1:{port}")),
    )
    .unwrap();
    for args in [
        &["list"][..],
        &["claim", "--pool", "python"],
        &["exec", CLAIM, "--", "true"],
    ] {
        let command = {
            let mut command = ctl(
                home.path(),
                &[("KUBECONFIG", &kubeconfig.display().to_string())],
            );
            command.args(args);
            command
        };
        let line = one_line_error(&output(command).await);
        assert_eq!(
            line,
            format!(
                "error: cannot reach the Kubernetes API server at http://127.0.0.1:{port}/: \
                 connection refused; is the cluster running? check --kubeconfig / KUBECONFIG \
                 and --context"
            ),
            "{args:?}"
        );
    }
}

#[tokio::test]
async fn router_errors_are_one_line_that_names_the_router_and_the_fix() {
    let home = tempfile::tempdir().unwrap();
    let sim = sim(home.path()).await;
    let kubeconfig = home.path().join("kubeconfig").display().to_string();
    let port = closed_port();
    let plain = FakeRouter::start(|_| FakeRouter::listing("", &[]))
        .await
        .unwrap();
    let not_a_router = FakeRouter::start(|_| {
        FakeRouter::answer(404, "text/html", "<html><body>Not Found</body></html>")
    })
    .await
    .unwrap();
    let https_plain = format!("https://{}", plain.addr());
    let cases = [
        (
            format!("http://127.0.0.1:{port}"),
            format!(
                "error: cannot reach the router at http://127.0.0.1:{port}: connection refused; \
                 is the router running? check --router-url / SANDBOX_ROUTER_URL"
            ),
        ),
        (
            https_plain.clone(),
            format!(
                "error: TLS handshake with the router at {https_plain} failed \
                 (received corrupt message of type InvalidContentType); if it serves plain HTTP, \
                 use http://; check --router-url / SANDBOX_ROUTER_URL"
            ),
        ),
        (
            not_a_router.url(),
            format!(
                "error: the server at {} is not an agent-sandbox router (it answered HTTP 404 \
                 with text/html); check --router-url / SANDBOX_ROUTER_URL",
                not_a_router.url()
            ),
        ),
    ];
    for (url, expected) in cases {
        for args in [&["exec", CLAIM, "--", "true"][..], &["ls", CLAIM]] {
            let mut command = ctl(
                home.path(),
                &[("KUBECONFIG", &kubeconfig), ("SANDBOX_ROUTER_URL", &url)],
            );
            command.args(args);
            let line = one_line_error(&output(command).await);
            assert_eq!(line, expected, "{args:?}");
        }
    }
    sim.stop().await;
}

#[tokio::test]
async fn empty_environment_variables_count_as_unset() {
    let home = tempfile::tempdir().unwrap();
    let sim = sim(home.path()).await;
    let kubeconfig = home.path().join("kubeconfig").display().to_string();
    // An empty router URL means port-forward, which finds no router: the error says where it
    // looked and which flag fixes it, not that "" is not a URL.
    let mut command = ctl(
        home.path(),
        &[
            ("KUBECONFIG", &kubeconfig),
            ("SANDBOX_ROUTER_URL", ""),
            ("SANDBOX_ROUTER_TOKEN", ""),
            ("SANDBOX_ROUTER_SIGNING_KEY_FILE", ""),
        ],
    );
    command.args(["ls", CLAIM]);
    let line = one_line_error(&output(command).await);
    assert!(
        line.contains("--router-namespace") && line.contains("agent-sandbox-system"),
        "{line}"
    );
    // An empty KUBECONFIG means none: the usual inference, which finds nothing in this HOME.
    let mut command = ctl(home.path(), &[("KUBECONFIG", "")]);
    command.arg("list");
    let out = output(command).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("--local"), "{}", stderr(&out));
    sim.stop().await;
}

#[tokio::test]
async fn durations_beyond_the_maximum_are_refused_naming_it() {
    let home = tempfile::tempdir().unwrap();
    for args in [
        &["claim", "--pool", "p", "--ttl", "100000000h"][..],
        &["claim", "--pool", "p", "--ttl", "87601h"],
        &["run", "--ttl", "10000000h", "--", "true"],
        &[
            "claim",
            "--pool",
            "p",
            "--wait-timeout",
            "99999999999999999999h",
        ],
        &[
            "exec",
            CLAIM,
            "--timeout",
            "99999999999999999999999s",
            "--",
            "true",
        ],
        &["extend", CLAIM, "100000000h"],
        &["token", CLAIM, "--ttl", "100000000h"],
    ] {
        let mut command = ctl(home.path(), &[]);
        command.args(args);
        let out = output(command).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let first = stderr(&out).lines().next().unwrap_or_default().to_owned();
        assert!(
            first.contains("the maximum is 87600h (10 years)"),
            "{args:?}: {first}"
        );
    }
}
