#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The `sandbox-router` binary's configuration errors: a flag value, file or address that cannot
//! be used is one line saying what is wrong and exit code 2, even when backtraces are asked for
//! (backtraces are for real panics).

use std::path::Path;
use std::process::{Command, Output, Stdio};

use agent_sandbox_local::testkit::assert_configuration_error;

/// A kubeconfig for an API server that is never contacted (nothing listens on port 9): the
/// router builds its client from it, then fails before connecting.
fn kubeconfig(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:9\n\
         users:\n- name: u\n  user: {}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\n\
         current-context: x\n",
    )
    .unwrap();
    path
}

fn router(kubeconfig: &Path, args: &[&str]) -> Output {
    router_env(kubeconfig, &[], args)
}

/// [`router`] with `env` set.
fn router_env(kubeconfig: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sandbox-router"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("SANDBOX_ROUTER_") {
            command.env_remove(name);
        }
    }
    command
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
        .env("RUST_LOG", "error")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn configuration_errors_are_one_line_and_exit_code_2_even_with_backtraces_on() {
    let dir = tempfile::tempdir().unwrap();
    let config = kubeconfig(dir.path());
    let missing = dir.path().join("missing-key");
    let missing = missing.to_str().unwrap();
    let short = dir.path().join("short-token");
    std::fs::write(&short, "too short\n").unwrap();
    let short = short.to_str().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();

    // clap's own errors: a bad value, a missing flag.
    assert_configuration_error(&router(&config, &["--auth", "bogus"]), "--auth");
    assert_configuration_error(&router(&config, &[]), "--auth");
    assert_configuration_error(
        &router(&config, &["--auth", "none", "--listen", "localhost"]),
        "--listen",
    );
    assert_configuration_error(
        &router(&config, &["--auth", "none", "--max-timeout-seconds", "abc"]),
        "--max-timeout-seconds",
    );
    // Files that cannot be used.
    assert_configuration_error(
        &router(
            &config,
            &["--auth", "scoped", "--signing-key-file", missing],
        ),
        missing,
    );
    assert_configuration_error(
        &router(&config, &["--auth", "token", "--token-file", short]),
        short,
    );
    assert_configuration_error(
        &router(&config, &["--auth", "none", "--namespace", "Not_A_Label"]),
        "Not_A_Label",
    );
    // An address that is taken.
    assert_configuration_error(
        &router(&config, &["--auth", "none", "--listen", &taken]),
        &taken,
    );
    // No usable Kubernetes configuration.
    assert_configuration_error(
        &router(
            &dir.path().join("no-kubeconfig"),
            &["--auth", "none", "--listen", "127.0.0.1:0"],
        ),
        "kubeconfig",
    );
    // mint-token's own checks.
    assert_configuration_error(
        &router(
            &config,
            &[
                "mint-token",
                "--signing-key-file",
                missing,
                "--sandbox",
                "box",
            ],
        ),
        missing,
    );
    assert_configuration_error(
        &router(
            &config,
            &[
                "mint-token",
                "--signing-key-file",
                missing,
                "--sandbox",
                "a.b",
            ],
        ),
        "a.b",
    );
}

#[test]
fn upstream_configuration_errors_are_one_line_and_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let config = kubeconfig(dir.path());
    assert_configuration_error(
        &router(&config, &["--authz-mode=tokenreview"]),
        "--authz-mode=scoped-token",
    );
    assert_configuration_error(
        &router(
            &config,
            &["-authz-mode=allow-all", "-http-bind-address=:http"],
        ),
        "--http-bind-address",
    );
    assert_configuration_error(
        &router(&config, &["--authz-mode=allow-all", "--config=/etc/x.yaml"]),
        "--config",
    );
    assert_configuration_error(
        &router(&config, &["--authz-mode=allow-all", "--zap-log-level=loud"]),
        "--zap-log-level",
    );
    // A bare Go boolean never takes the next argument.
    assert_configuration_error(
        &router(
            &config,
            &["--authz-mode=allow-all", "--cache-enabled", "false"],
        ),
        "false",
    );
}

/// One of our own settings beside upstream's Go router flags makes the command line ours, so
/// that router's default (allow-all) does not apply: no auth mode, and the binary refuses to
/// start naming the setting. The proxy address given is taken, so that a router that started
/// anyway stops at once with another error rather than serving.
#[test]
fn our_settings_beside_go_flags_never_start_an_open_router() {
    let dir = tempfile::tempdir().unwrap();
    let config = kubeconfig(dir.path());
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let bind = format!("--http-bind-address={}", taken.local_addr().unwrap());
    // The binary's own --log-format.
    assert_configuration_error(
        &router(&config, &[&bind, "--log-format=json"]),
        "--log-format",
    );
    // One of ours through its SANDBOX_ROUTER_* variable.
    assert_configuration_error(
        &router_env(
            &config,
            &[("SANDBOX_ROUTER_MAX_TIMEOUT_SECONDS", "30")],
            &[&bind, "--cluster-domain=cluster.local"],
        ),
        "--max-timeout-seconds",
    );
}

#[test]
fn go_spelled_version_and_v2_minting() {
    let dir = tempfile::tempdir().unwrap();
    let config = kubeconfig(dir.path());
    let version = router(&config, &["-version"]);
    assert!(version.status.success(), "{version:?}");
    assert!(
        String::from_utf8_lossy(&version.stdout).contains(env!("CARGO_PKG_VERSION")),
        "{version:?}"
    );

    let private = dir.path().join("v2.key");
    std::fs::write(&private, "BQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQU\n").unwrap();
    let private = private.to_str().unwrap();
    let keys = router(
        &config,
        &["v2-key-file", "--private-key-file", private, "--kid", "k1"],
    );
    assert!(keys.status.success(), "{keys:?}");
    let keys = agent_sandbox_api::token::v2::VerificationKeys::parse(&keys.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&keys.stdout)));
    let minted = router(
        &config,
        &[
            "mint-token",
            "--v2-private-key-file",
            private,
            "--kid",
            "k1",
            "--uid",
            "uid-1",
            "--sandbox",
            "box",
            "--path",
            "/upload",
        ],
    );
    assert!(minted.status.success(), "{minted:?}");
    let token = String::from_utf8(minted.stdout).unwrap();
    let claims = agent_sandbox_api::token::v2::verify(&keys, token.trim(), 0).unwrap();
    assert_eq!(
        (
            claims.namespace.as_str(),
            claims.name.as_str(),
            claims.uid.as_str(),
            claims.port,
            claims.method.as_str(),
            claims.path.as_str()
        ),
        ("default", "box", "uid-1", 8888, "POST", "/upload")
    );
    assert_configuration_error(
        &router(
            &config,
            &[
                "mint-token",
                "--v2-private-key-file",
                private,
                "--kid",
                "bad kid",
                "--uid",
                "u",
                "--sandbox",
                "box",
            ],
        ),
        "bad kid",
    );
}
