//! The `sandboxctl` binary driven as a subprocess against the local cluster (the simulated
//! cluster, controller and router, started in this test process; pods run the `sandboxctl`
//! binary's hidden runtime subcommand).
//!
//! Every child process is killed by its guard, also when a test fails; every cluster stops
//! when its test ends, killing its pods.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use agent_sandbox_api::SandboxClaim;
use agent_sandbox_local::testkit::{self, Check, NAMESPACE, POOL, Tool};
use agent_sandbox_local::{LocalCluster, LocalConfig, RuntimeProgram};
use kube::Api;
use kube::api::ListParams;
use sha2::Digest as _;

const BIN: &str = env!("CARGO_BIN_EXE_sandboxctl");
const WAIT: Duration = Duration::from_secs(120);

/// A local cluster whose pods run this crate's binary, with the pool warm.
async fn cluster(replicas: i32) -> LocalCluster {
    let config = LocalConfig {
        runtime: RuntimeProgram::Subcommand(PathBuf::from(BIN)),
        pool_replicas: replicas,
        ..LocalConfig::default()
    };
    let cluster = LocalCluster::start(config).await.unwrap();
    if replicas > 0 {
        cluster.wait_for_pool(1, WAIT, |_, _| {}).await.unwrap();
    }
    cluster
}

/// `sandboxctl` with only `PATH` and a scratch `HOME` from this environment, pointed at
/// `cluster` (kubeconfig, router URL and token).
fn ctl(cluster: &LocalCluster, home: &Path) -> Command {
    let mut command = clean(home);
    command
        .env("KUBECONFIG", cluster.kubeconfig_path())
        .env("SANDBOX_ROUTER_URL", cluster.router_url().unwrap());
    if let Some(token) = cluster.router_token() {
        command.env("SANDBOX_ROUTER_TOKEN", token);
    }
    command
}

/// `sandboxctl` in a clean environment: `PATH`, a scratch `HOME`, nothing else (no kubeconfig).
fn clean(home: &Path) -> Command {
    let mut command = Command::new(BIN);
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("TMPDIR", home)
        .stdin(Stdio::null());
    command
}

/// Runs the command on a blocking thread (the cluster lives on this test's runtime).
async fn output(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[track_caller]
fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Kills (SIGKILL) and reaps a child when dropped, unless it was waited for.
struct ChildGuard(Option<Child>);

impl ChildGuard {
    fn pid(&self) -> i32 {
        i32::try_from(self.0.as_ref().unwrap().id()).unwrap()
    }

    fn interrupt(&self) {
        let pid = rustix::process::Pid::from_raw(self.pid()).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
    }

    /// Waits for the exit, at most `WAIT`.
    async fn wait(&mut self) -> Output {
        let child = self.0.take().unwrap();
        let waited = tokio::time::timeout(
            WAIT,
            tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()),
        )
        .await;
        waited.expect("the child did not exit in time").unwrap()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

async fn claim_named(cluster: &LocalCluster, name: &str) -> SandboxClaim {
    let api: Api<SandboxClaim> = Api::namespaced(cluster.client(), NAMESPACE);
    api.get(name).await.unwrap()
}

async fn claims(cluster: &LocalCluster) -> Vec<SandboxClaim> {
    let api: Api<SandboxClaim> = Api::namespaced(cluster.client(), NAMESPACE);
    api.list(&ListParams::default()).await.unwrap().items
}

/// Polls until `check` holds, at most `WAIT`.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let looked = testkit::wait_for(what, WAIT, || {
        let holds = check();
        async move {
            Ok::<_, testkit::Timeout>(if holds.await {
                Check::Done(())
            } else {
                Check::NotYet("not yet".to_owned())
            })
        }
    });
    looked.await.unwrap();
}

/// Collects a pipe's text on a thread.
fn collect(
    mut pipe: impl std::io::Read + Send + 'static,
) -> std::sync::Arc<std::sync::Mutex<String>> {
    let shared = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = shared.clone();
    std::thread::spawn(move || {
        let mut buffer = [0_u8; 4096];
        while let Ok(n) = pipe.read(&mut buffer) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buffer[..n]));
        }
    });
    shared
}

/// Processes whose command line or environment mentions `needle` (pods of a cluster whose data lives there).
fn processes_mentioning(needle: &Path) -> Vec<String> {
    let needle = needle.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        let cmdline = text(&cmdline).replace('\0', " ");
        if cmdline.contains(&needle) || text(&environ).contains(&needle) {
            found.push(format!("{name}: {cmdline}"));
        }
    }
    found
}

#[tokio::test]
async fn run_local_works_from_a_clean_environment_and_leaves_nothing_behind() {
    if testkit::missing(Tool::Python3) {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    // With the defaults (every protection this machine allows: as root in CI, pods with
    // networks of their own), in a network namespace of the test's own so that the bridge
    // the local cluster makes never touches this machine's network.
    let unavailable = Tool::PodNetworks.unavailable();
    if let Some(reason) = &unavailable {
        assert!(
            std::env::var("CI").is_err(),
            "CI must run this with pod networks: {reason}"
        );
        eprintln!("note: {reason}: the local cluster's pods share this machine's network");
    }
    let mut command = if unavailable.is_some() {
        clean(home.path())
    } else {
        let mut command = testkit::own_network_command(BIN);
        command
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", home.path())
            .env("TMPDIR", home.path())
            .stdin(Stdio::null());
        command
    };
    command.args(["run", "--local", "--", "python3", "-c", "print(6*7)"]);
    let out = output(command).await;
    assert_eq!(ok(&out), "42\n");
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("MISSING"), "{stderr}");
    assert!(stderr.contains("claimed sandbox-claim-"), "{stderr}");
    assert!(stderr.contains("exit code 0, ran in"), "{stderr}");
    // The local cluster kept its data under TMPDIR (= home): no process mentions it any more
    // (pods are killed before `sandboxctl` exits; reaping by init may lag a moment).
    eventually("no process of the local cluster", || async {
        processes_mentioning(home.path()).is_empty()
    })
    .await;
}

#[tokio::test]
async fn run_local_as_a_user_not_root_gives_pods_networks_of_their_own() {
    if testkit::missing(Tool::Python3)
        || testkit::missing(Tool::PodNetworks)
        || testkit::missing(Tool::Slirp4netns)
    {
        return;
    }
    // As `nobody`, in a network and mount namespace of the test's own whose /dev/net/tun any
    // user may open (as on most distributions; the machine's own node stays as it is).
    let home = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(home.path(), Some(65534), Some(65534)).unwrap();
    let script = "ip link set lo up && mount -t tmpfs -o mode=0755 tmpfs /dev/net && \
                  mknod -m 0666 /dev/net/tun c 10 200 && \
                  exec setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all \
                  -- \"$0\" \"$@\"";
    let mut command = Command::new("unshare");
    command
        .args(["--net", "--mount", "--", "sh", "-c", script, BIN])
        .args(["run", "--local", "--", "python3", "-c", "print(6*7)"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .env("TMPDIR", home.path())
        .stdin(Stdio::null());
    let out = output(command).await;
    assert_eq!(ok(&out), "42\n");
    let stderr = text(&out.stderr);
    // What a user that is not root lacks is said; a network of their own is not among it.
    assert!(stderr.contains("MISSING: a host uid per pod"), "{stderr}");
    assert!(!stderr.contains("network of their own"), "{stderr}");
    assert!(!stderr.contains("no internet"), "{stderr}");
    // Where this user cannot open /dev/net/tun (the machine's own node here: root's only),
    // pods still get networks of their own, without an internet, and the run says so.
    let script = "ip link set lo up && \
                  exec setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all \
                  -- \"$0\" \"$@\"";
    let tun_open = std::fs::metadata("/dev/net/tun").is_ok_and(|tun| {
        std::os::unix::fs::PermissionsExt::mode(&tun.permissions()) & 0o006 == 0o006
    });
    let mut command = Command::new("unshare");
    command
        .args(["--net", "--", "sh", "-c", script, BIN])
        .args(["run", "--local", "--", "python3", "-c", "print(6*7)"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .env("TMPDIR", home.path())
        .stdin(Stdio::null());
    let out = output(command).await;
    assert_eq!(ok(&out), "42\n");
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("network of their own"), "{stderr}");
    if !tun_open {
        assert!(
            stderr.contains("warning: no internet for pods (slirp4netns needs /dev/net/tun"),
            "{stderr}"
        );
    }
    eventually("no process of the local cluster", || async {
        processes_mentioning(home.path()).is_empty()
    })
    .await;
}

/// A directory with only `tools` of this machine (symbolic links), for a `PATH` without
/// anything else: no bubblewrap, `ip`, `nft` or `slirp4netns`.
fn only(tools: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for tool in tools {
        let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|dir| dir.join(tool))
            .find(|path| path.is_file())
            .unwrap_or_else(|| panic!("{tool} is not on PATH"));
        std::os::unix::fs::symlink(found, dir.path().join(tool)).unwrap();
    }
    dir
}

#[tokio::test]
async fn run_local_confines_with_nothing_installed_and_refuses_without_user_namespaces() {
    if testkit::missing(Tool::Python3) || testkit::missing(Tool::Confinement) {
        return;
    }
    // A user's secrets where a sandbox could look for them.
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir(home.path().join(".kube")).unwrap();
    let kubeconfig = home.path().join(".kube/config");
    std::fs::write(&kubeconfig, "token: SECRET-OF-THE-HOST\n").unwrap();
    let path = only(&["python3", "sh", "unshare"]);
    let command = |args: &[&str]| {
        let mut command = Command::new(BIN);
        command
            .args(args)
            .env_clear()
            .env("PATH", path.path())
            .env("HOME", home.path())
            .env("TMPDIR", home.path())
            .stdin(Stdio::null());
        command
    };
    // The README's first command.
    let out = output(command(&[
        "run",
        "--local",
        "--",
        "python3",
        "-c",
        "print(6*7)",
    ]))
    .await;
    assert_eq!(ok(&out), "42\n");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("own user, mount, PID, IPC and UTS namespaces"),
        "{stderr}"
    );
    assert!(
        stderr.contains("own network with loopback only"),
        "{stderr}"
    );
    // What a sandbox sees: none of the host's secrets, a user that is not root, a PID 1 of its
    // own (the runtime, not the machine's init).
    let script = format!(
        "cat ~/.kube/config {} 2>/dev/null; id -u; tr '\\0' ' ' < /proc/1/cmdline",
        kubeconfig.display()
    );
    let out = output(command(&["run", "--local", "--", "sh", "-c", &script])).await;
    let stdout = ok(&out);
    assert!(!stdout.contains("SECRET-OF-THE-HOST"), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert_ne!(lines[0], "0", "{stdout}");
    assert!(lines[0].parse::<u32>().is_ok(), "{stdout}");
    let host_init = text(&std::fs::read("/proc/1/cmdline").unwrap()).replace('\0', " ");
    assert_ne!(lines[1], host_init.trim_end(), "{stdout}");
    assert!(
        lines[1].contains(agent_sandbox_local::RUNTIME_SUBCOMMAND),
        "{stdout}"
    );
    // Where user namespaces cannot be made, the command refuses and says how to fix it.
    let mut refused = Command::new("unshare");
    refused
        .args(["--user", "--map-root-user", "--", "sh", "-c"])
        .arg("echo 0 > /proc/sys/user/max_user_namespaces && exec \"$0\" \"$@\"")
        .arg(BIN)
        .args(["run", "--local", "--", "python3", "-c", "print(6*7)"])
        .env_clear()
        .env("PATH", path.path())
        .env("HOME", home.path())
        .env("TMPDIR", home.path())
        .stdin(Stdio::null());
    let out = output(refused).await;
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert_eq!(text(&out.stdout), "", "{stderr}");
    for wanted in [
        "cannot confine pods",
        "user namespaces are disabled",
        "user.max_user_namespaces",
        "--isolation none",
    ] {
        assert!(stderr.contains(wanted), "{wanted}: {stderr}");
    }
    eventually("no process of the local cluster", || async {
        processes_mentioning(home.path()).is_empty()
    })
    .await;
}

#[tokio::test]
async fn run_local_propagates_the_exit_code_and_both_streams() {
    let home = tempfile::tempdir().unwrap();
    let mut command = clean(home.path());
    command.args([
        "run",
        "--local",
        "--network",
        "isolated",
        "--",
        "echo out; echo err >&2; exit 7",
    ]);
    let out = output(command).await;
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(text(&out.stdout), "out\n");
    assert!(text(&out.stderr).contains("err\n"));
}

#[tokio::test]
async fn claim_exec_list_extend_logs_token_and_delete() {
    let cluster = cluster(2).await;
    let home = tempfile::tempdir().unwrap();

    let mut command = ctl(&cluster, home.path());
    command.args(["claim", "--pool", POOL, "--ttl", "30m"]);
    let claim = ok(&output(command).await).trim().to_owned();
    assert!(claim.starts_with("sandbox-claim-"), "{claim}");

    // Without --ttl a claim expires in 1h, and stderr says so; --ttl 0 opts out.
    let mut command = ctl(&cluster, home.path());
    command.args(["claim", "--pool", POOL]);
    let out = output(command).await;
    let defaulted = ok(&out).trim().to_owned();
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("claim {defaulted} expires at "))
            && stderr.contains("(in 1h); extend with `sandboxctl extend")
            && stderr.contains("--ttl 0 for none"),
        "{stderr}"
    );
    let object = claim_named(&cluster, &defaulted).await;
    let requested: jiff::Timestamp = object.metadata.annotations.as_ref().unwrap()
        [agent_sandbox_api::annotations::CLIENT_FIRST_REQUESTED_AT]
        .parse()
        .unwrap();
    let expires = object.spec.lifecycle.unwrap().shutdown_time.unwrap().0;
    // shutdownTime = request time + 1h, in whole seconds.
    let ttl = expires.as_second() - requested.as_second();
    assert!((3599..=3600).contains(&ttl), "{requested} -> {expires}");
    let mut command = ctl(&cluster, home.path());
    command.args(["claim", "--pool", POOL, "--ttl", "0", "-o", "json"]);
    let out = output(command).await;
    let forever: serde_json::Value = serde_json::from_str(&ok(&out)).unwrap();
    let forever = forever["claim"].as_str().unwrap().to_owned();
    assert!(
        text(&out.stderr).contains(&format!("claim {forever} never expires (--ttl 0)")),
        "{}",
        text(&out.stderr)
    );
    assert!(
        claim_named(&cluster, &forever)
            .await
            .spec
            .lifecycle
            .is_none()
    );
    let mut command = ctl(&cluster, home.path());
    command.args(["delete", &defaulted, &forever]);
    ok(&output(command).await);

    // Shell semantics by default, the command's exit code otherwise.
    let mut command = ctl(&cluster, home.path());
    command.args(["exec", &claim, "--", "echo hello from $(hostname)"]);
    let hello = ok(&output(command).await);
    assert!(hello.starts_with("hello from "), "{hello}");
    let mut command = ctl(&cluster, home.path());
    command.args(["exec", &claim, "--", "exit 3"]);
    assert_eq!(output(command).await.status.code(), Some(3));
    let mut command = ctl(&cluster, home.path());
    command.args([
        "exec",
        &claim,
        "--no-shell",
        "--",
        "printf",
        "%s-%s",
        "a b",
        "c",
    ]);
    assert_eq!(ok(&output(command).await), "a b-c");

    // Listed with its sandbox, ready, in table and JSON.
    let mut command = ctl(&cluster, home.path());
    command.args(["list"]);
    let table = ok(&output(command).await);
    assert!(table.starts_with("NAME "), "{table}");
    assert!(table.contains(&claim) && table.contains("True"), "{table}");
    let mut command = ctl(&cluster, home.path());
    command.args(["list", "-o", "json"]);
    let rows: serde_json::Value = serde_json::from_str(&ok(&output(command).await)).unwrap();
    let row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == claim.as_str())
        .unwrap();
    assert_eq!(row["ready"], "True");
    assert_eq!(row["pool"], POOL);
    assert!(!row["sandbox"].as_str().unwrap().is_empty());
    let first_expiry = row["expires"].as_str().unwrap().to_owned();

    // Extend moves the claim's shutdownTime.
    let mut command = ctl(&cluster, home.path());
    command.args(["extend", &claim, "5h"]);
    ok(&output(command).await);
    let moved = claims(&cluster)
        .await
        .into_iter()
        .find(|c| c.metadata.name.as_deref() == Some(claim.as_str()))
        .unwrap()
        .spec
        .lifecycle
        .unwrap()
        .shutdown_time
        .unwrap()
        .0;
    assert!(
        moved > first_expiry.parse().unwrap(),
        "{moved} vs {first_expiry}"
    );

    // Logs of the sandbox's pod (the runtime logs its start).
    let mut command = ctl(&cluster, home.path());
    command.args(["logs", &claim]);
    let logs = ok(&output(command).await);
    assert!(logs.contains("sandbox runtime listening"), "{logs}");

    // A scoped token for the claim's sandbox, verifiable with the key.
    let key_file = home.path().join("key");
    std::fs::write(&key_file, "k".repeat(40)).unwrap();
    let mut command = ctl(&cluster, home.path());
    command.args(["token", &claim, "--ttl", "10m", "--signing-key-file"]);
    command.arg(&key_file);
    let token = ok(&output(command).await).trim().to_owned();
    let now = jiff::Timestamp::now().as_second();
    let claims_of_token =
        agent_sandbox_api::token::verify("k".repeat(40).as_bytes(), &token, now).unwrap();
    assert_eq!(claims_of_token.name, row["sandbox"].as_str().unwrap());
    let mut command = ctl(&cluster, home.path());
    command.args(["token", &claim]);
    let out = output(command).await;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("--signing-key-file"));

    // Delete, then it is gone; deleting again says how to find claims.
    let mut command = ctl(&cluster, home.path());
    command.args(["delete", &claim]);
    ok(&output(command).await);
    eventually("the claim to be gone", || async {
        claims(&cluster).await.is_empty()
    })
    .await;
    let mut command = ctl(&cluster, home.path());
    command.args(["exec", &claim, "--", "true"]);
    let out = output(command).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("sandboxctl list"),
        "{}",
        text(&out.stderr)
    );
    cluster.stop().await;
}

fn tree_digests(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let digest = sha2::Sha256::digest(std::fs::read(&path).unwrap());
                let relative = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
                out.insert(relative, hex);
            }
        }
    }
    out
}

#[tokio::test]
async fn cp_copies_directories_both_ways_and_ls_cat_rm_work() {
    let cluster = cluster(1).await;
    let home = tempfile::tempdir().unwrap();
    let src = home.path().join("tree");
    std::fs::create_dir_all(src.join("nested/deeper")).unwrap();
    std::fs::write(src.join("a.txt"), "alpha\n").unwrap();
    std::fs::write(
        src.join("nested/b.bin"),
        (0..=255u8).cycle().take(300_000).collect::<Vec<_>>(),
    )
    .unwrap();
    std::fs::write(src.join("nested/deeper/c.txt"), "").unwrap();

    let mut command = ctl(&cluster, home.path());
    command.args(["claim", "--pool", POOL]);
    let claim = ok(&output(command).await).trim().to_owned();

    // Up: into a path that does not exist yet.
    let mut command = ctl(&cluster, home.path());
    command
        .args(["cp"])
        .arg(&src)
        .arg(format!("{claim}:work/tree"));
    ok(&output(command).await);

    let mut command = ctl(&cluster, home.path());
    command.args(["ls", &format!("{claim}:work/tree")]);
    let listing = ok(&output(command).await);
    assert!(
        listing.contains("a.txt") && listing.contains("nested/"),
        "{listing}"
    );
    let mut command = ctl(&cluster, home.path());
    command.args(["cat", &format!("{claim}:work/tree/a.txt")]);
    assert_eq!(ok(&output(command).await), "alpha\n");
    // The command sees what was copied.
    let mut command = ctl(&cluster, home.path());
    command.args(["exec", &claim, "--", "wc -c < work/tree/nested/b.bin"]);
    assert_eq!(ok(&output(command).await).trim(), "300000");

    // Down: into a fresh local directory; same checksums.
    let back = home.path().join("back");
    let mut command = ctl(&cluster, home.path());
    command
        .arg("cp")
        .arg(format!("{claim}:work/tree"))
        .arg(&back);
    ok(&output(command).await);
    assert_eq!(tree_digests(&back), tree_digests(&src));

    // Standard input up, standard output down.
    let mut command = ctl(&cluster, home.path());
    command
        .args(["cp", "-", &format!("{claim}:stdin.txt")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = tokio::task::spawn_blocking(move || {
        let mut child = command.spawn().unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"from stdin").unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    ok(&out);
    let mut command = ctl(&cluster, home.path());
    command.args(["cp", &format!("{claim}:stdin.txt"), "-"]);
    assert_eq!(ok(&output(command).await), "from stdin");

    // rm: a file, then a directory recursively.
    let mut command = ctl(&cluster, home.path());
    command.args(["rm", &format!("{claim}:stdin.txt")]);
    ok(&output(command).await);
    let mut command = ctl(&cluster, home.path());
    command.args(["rm", "-r", &format!("{claim}:work")]);
    ok(&output(command).await);
    let mut command = ctl(&cluster, home.path());
    command.args(["ls", &claim, "-o", "json"]);
    let entries: serde_json::Value = serde_json::from_str(&ok(&output(command).await)).unwrap();
    let names: Vec<&str> = entries
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(
        !names.contains(&"work") && !names.contains(&"stdin.txt"),
        "{names:?}"
    );
    cluster.stop().await;
}

#[tokio::test]
async fn pools_and_errors_that_say_how_to_fix_them() {
    let cluster = cluster(2).await;
    let home = tempfile::tempdir().unwrap();

    let mut command = ctl(&cluster, home.path());
    command.args(["pools"]);
    let table = ok(&output(command).await);
    assert!(table.starts_with("NAME "), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(POOL) && l.contains(" 2 ")),
        "{table}"
    );
    let mut command = ctl(&cluster, home.path());
    command.args(["pools", "-o", "yaml"]);
    assert!(ok(&output(command).await).contains("desired: 2"));

    // A pool that does not exist: the error names the ones that do.
    let mut command = ctl(&cluster, home.path());
    command.args(["claim", "--pool", "nope"]);
    let out = output(command).await;
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("nope") && stderr.contains(&format!("pools there: {POOL}")),
        "{stderr}"
    );

    // No router URL: port-forward finds no router in the namespace; the error names the flag.
    let mut command = ctl(&cluster, home.path());
    command.env_remove("SANDBOX_ROUTER_URL").args([
        "run",
        "--router-namespace",
        "nowhere",
        "--",
        "true",
    ]);
    let out = output(command).await;
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("--router-namespace") && stderr.contains("nowhere"),
        "{stderr}"
    );
    // ... and the claim it made was rolled back.
    eventually("no claims", || async { claims(&cluster).await.is_empty() }).await;

    // No kubeconfig at all: the error offers the local cluster.
    let out = output({
        let mut command = clean(home.path());
        command.args(["list"]);
        command
    })
    .await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--local"),
        "{}",
        text(&out.stderr)
    );
    cluster.stop().await;
}

#[tokio::test]
async fn ctrl_c_during_run_deletes_the_claim() {
    let cluster = cluster(1).await;
    let home = tempfile::tempdir().unwrap();
    let mut command = ctl(&cluster, home.path());
    command
        .args(["run", "--pool", POOL, "--", "echo started; sleep 60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut spawned = command.spawn().unwrap();
    let stdout = collect(spawned.stdout.take().unwrap());
    let mut child = ChildGuard(Some(spawned));
    eventually("a ready claim", || async {
        claims(&cluster).await.iter().any(|c| {
            c.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
        })
    })
    .await;
    eventually("the command to run", || {
        let started = stdout.lock().unwrap().contains("started");
        async move { started }
    })
    .await;
    child.interrupt();
    let out = child.wait().await;
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
    eventually("the claim to be deleted", || async {
        claims(&cluster).await.is_empty()
    })
    .await;
    cluster.stop().await;
}

#[tokio::test]
async fn ctrl_c_during_run_local_stops_every_process() {
    let home = tempfile::tempdir().unwrap();
    let mut command = clean(home.path());
    command
        .args([
            "run",
            "--local",
            "--network",
            "isolated",
            "--",
            "echo started; sleep 60",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut spawned = command.spawn().unwrap();
    let stdout = collect(spawned.stdout.take().unwrap());
    let stderr = collect(spawned.stderr.take().unwrap());
    let mut child = ChildGuard(Some(spawned));
    eventually("the claim", || {
        let seen = stderr.lock().unwrap().contains("claimed");
        async move { seen }
    })
    .await;
    eventually("the command to run", || {
        let started = stdout.lock().unwrap().contains("started");
        async move { started }
    })
    .await;
    child.interrupt();
    let out = child.wait().await;
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
    eventually("no process of the local cluster", || async {
        processes_mentioning(home.path()).is_empty()
    })
    .await;
}

#[tokio::test]
async fn dev_serves_until_ctrl_c_and_completion_prints_a_script() {
    let home = tempfile::tempdir().unwrap();
    let kubeconfig = home.path().join("dev.kubeconfig");
    let mut command = clean(home.path());
    command
        // The host's network: the other processes below reach the cluster on this machine's
        // loopback (own pod networks are tested by `run_local_works_from_a_clean_environment...`).
        .args([
            "dev",
            "--network",
            "isolated",
            "--replicas",
            "1",
            "--kubeconfig-out",
        ])
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut spawned = command.spawn().unwrap();
    let stderr = collect(spawned.stderr.take().unwrap());
    let mut child = ChildGuard(Some(spawned));
    eventually("dev to be up", || {
        let up = stderr.lock().unwrap().contains("Ctrl-C stops everything");
        async move { up }
    })
    .await;
    let banner = stderr.lock().unwrap().clone();
    assert!(
        banner.contains(&format!("export KUBECONFIG={}", kubeconfig.display())),
        "{banner}"
    );
    assert!(
        banner.contains("export SANDBOX_ROUTER_URL=http://127.0.0.1:"),
        "{banner}"
    );

    // Another process uses it through the printed kubeconfig.
    let mut pools = clean(home.path());
    pools
        .env("KUBECONFIG", &kubeconfig)
        .args(["pools", "-o", "json"]);
    let rows: serde_json::Value = serde_json::from_str(&ok(&output(pools).await)).unwrap();
    assert_eq!(rows[0]["name"], POOL);
    assert_eq!(rows[0]["ready"], 1);

    child.interrupt();
    let out = child.wait().await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr.lock().unwrap());
    assert!(stderr.lock().unwrap().contains("no process left behind"));
    eventually("no process of the dev cluster", || async {
        processes_mentioning(home.path()).is_empty()
    })
    .await;

    let mut completion = clean(home.path());
    completion.args(["completion", "bash"]);
    let script = ok(&output(completion).await);
    assert!(
        script.contains("_sandboxctl()") && script.contains("extend"),
        "{script}"
    );
}

#[tokio::test]
async fn a_scoped_router_is_reached_with_the_signing_key_alone() {
    use agent_sandbox_local::RouterAuth;
    let config = LocalConfig {
        runtime: RuntimeProgram::Subcommand(PathBuf::from(BIN)),
        pool_replicas: 1,
        router_auth: RouterAuth::Scoped,
        ..LocalConfig::default()
    };
    let cluster = LocalCluster::start(config).await.unwrap();
    cluster.wait_for_pool(1, WAIT, |_, _| {}).await.unwrap();
    let home = tempfile::tempdir().unwrap();
    let key = cluster.secret_path().unwrap().to_owned();
    // No router token: the key mints one per request, for the request's own sandbox.
    let scoped = || {
        let mut command = ctl(&cluster, home.path());
        command.env("SANDBOX_ROUTER_SIGNING_KEY_FILE", &key);
        command
    };
    let mut command = scoped();
    command.args(["claim", "--pool", POOL]);
    let claim = ok(&output(command).await).trim().to_owned();
    let mut command = scoped();
    command.args(["exec", &claim, "--", "echo scoped"]);
    assert_eq!(ok(&output(command).await), "scoped\n");
    let mut command = scoped();
    command.args(["ls", &claim]);
    ok(&output(command).await);
    // Without the key the router refuses.
    let mut command = ctl(&cluster, home.path());
    command.args(["exec", &claim, "--", "true"]);
    let out = output(command).await;
    assert!(!out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("401"), "{}", text(&out.stderr));
    let mut command = scoped();
    command.args(["delete", &claim]);
    ok(&output(command).await);
    cluster.stop().await;
}

/// The hidden runtime subcommand that local pods run reports a configuration error as the
/// `sandbox-runtime` binary does: one line naming the flag, exit status 2, no backtrace even
/// with `RUST_BACKTRACE=1` (issue 15, item 13).
#[test]
fn the_runtime_subcommand_reports_configuration_errors_in_one_line() {
    let scratch = tempfile::tempdir().unwrap();
    let file = scratch.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    // A port this test holds, so that binding it fails.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let cases = [
        (
            "base dir that cannot be created",
            ("SANDBOX_BASE_DIR", file.join("sub").display().to_string()),
            "--base-dir",
        ),
        (
            "listen address in use",
            ("SANDBOX_LISTEN", taken.local_addr().unwrap().to_string()),
            "--listen",
        ),
    ];
    for (what, (name, value), flag) in cases {
        let mut child = Command::new(BIN)
            .arg("__runtime")
            .env("RUST_BACKTRACE", "1")
            .env("RUST_LIB_BACKTRACE", "1")
            .env("SANDBOX_LISTEN", "127.0.0.1:0")
            .env("SANDBOX_BASE_DIR", scratch.path().join("base"))
            .env(name, &value)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                child.wait().unwrap();
                panic!("{what}: still running after 30 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let output = child.wait_with_output().unwrap();
        let line = testkit::one_error_line(&output, 2);
        assert!(line.contains(flag), "{what}: {line}");
    }
    drop(taken);
}
