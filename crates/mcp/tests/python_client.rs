//! The MCP server as MCP clients see it: the real `sandboxctl mcp --local` binary (on a local
//! cluster it starts itself, no kubeconfig) driven by the official MCP Python SDK (PyPI `mcp`,
//! pinned in `tests/python/requirements.txt`, in a virtualenv of its own under the target
//! directory) running `tests/python/client.py`: once over stdio (the client spawns the
//! server), once over streamable HTTP (the test starts the server on a free loopback port,
//! reads its address from stderr, and stops it with SIGTERM).
//!
//! The scenario and its checks are the script's; each test compares the transcript it prints
//! with the one expected here. Every child is killed when its test ends, also on failure
//! (`kill_on_drop`; the local cluster's pods die with the server), and every wait is bounded.
//! Without `python3` the tests are skipped with the reason, and fail under `CI=true`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use agent_sandbox_local::testkit::{self, Tool};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt as _;
use tokio::process::{Child, Command};

/// How long one run of the client script may take (it starts a local cluster over stdio).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(300);
/// How long the HTTP server may take to start its local cluster and listen.
const START_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the HTTP server may take to stop after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

fn python_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("python")
}

/// `<target>/<profile>/mcp-python-venv` for the running test binary
/// (`<target>/<profile>/deps/<test>`).
fn venv_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("the deps directory");
    let profile = if deps.ends_with("deps") {
        deps.parent().expect("the profile directory")
    } else {
        deps
    };
    profile.join("mcp-python-venv")
}

fn run(what: &str, command: &mut std::process::Command) -> Result<(), String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|error| format!("{what}: cannot run {:?}: {error}", command.get_program()))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{what} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    ))
}

/// Makes (or reuses, while `requirements.txt` is unchanged) the virtualenv with the MCP Python
/// SDK, and returns its interpreter.
fn prepare_venv() -> Result<PathBuf, String> {
    let venv = venv_dir();
    let python = venv.join("bin").join("python");
    let requirements = python_dir().join("requirements.txt");
    let wanted = std::fs::read(&requirements)
        .map_err(|error| format!("cannot read {}: {error}", requirements.display()))?;
    // A copy of the requirements it was made from, written last: an interrupted install is
    // redone next time.
    let stamp = venv.join(".requirements.txt");
    if python.is_file() && std::fs::read(&stamp).ok().as_deref() == Some(&wanted[..]) {
        return Ok(python);
    }
    eprintln!(
        "python_client: creating the virtualenv {} ...",
        venv.display()
    );
    let _ = std::fs::remove_dir_all(&venv);
    run(
        "python3 -m venv (on Debian/Ubuntu: apt-get install python3-venv)",
        std::process::Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv),
    )?;
    run(
        "pip install -r crates/mcp/tests/python/requirements.txt (it needs PyPI)",
        std::process::Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-input",
                "-r",
            ])
            .arg(&requirements),
    )?;
    std::fs::write(&stamp, &wanted)
        .map_err(|error| format!("cannot write {}: {error}", stamp.display()))?;
    Ok(python)
}

fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| !matches!(value.as_str(), "" | "0" | "false"))
}

/// The virtualenv's interpreter, once per process; `None` (the test is skipped, with the
/// reason) when `python3` is missing or the virtualenv cannot be made, except under `CI=true`,
/// where that fails the test.
fn python() -> Option<PathBuf> {
    if testkit::missing(Tool::Python3) {
        return None;
    }
    static VENV: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match VENV.get_or_init(prepare_venv) {
        Ok(python) => Some(python.clone()),
        Err(reason) if is_ci() => panic!("the MCP Python SDK is not available: {reason}"),
        Err(reason) => {
            eprintln!("SKIPPED: the MCP Python SDK is not available: {reason}");
            None
        }
    }
}

async fn sandboxctl() -> PathBuf {
    tokio::task::spawn_blocking(|| testkit::workspace_binary("sandboxctl", "sandboxctl"))
        .await
        .unwrap()
        .expect("build sandboxctl")
}

/// A command with only `PATH` and a scratch `HOME` and `TMPDIR` from this environment: no
/// kubeconfig, no router settings.
fn clean(program: &Path, scratch: &Path) -> Command {
    let mut command = Command::new(program);
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", scratch)
        .env("TMPDIR", scratch)
        .env("SANDBOXCTL_LOG", "warn,agent_sandbox_mcp=info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// Runs the client script to the end (at most [`CLIENT_TIMEOUT`]) and returns its transcript.
async fn client(mut command: Command) -> Value {
    let child = command.spawn().expect("start the client script");
    let output = tokio::time::timeout(CLIENT_TIMEOUT, child.wait_with_output())
        .await
        .expect("the client script did not finish in time")
        .expect("wait for the client script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the client script failed ({}):\nstdout: {stdout}\nstderr: {stderr}",
        output.status
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|error| panic!("no transcript ({error}):\n{stdout}\nstderr: {stderr}"))
}

/// What the script reports on either transport.
fn expected() -> Value {
    json!({
        "server": "agent-sandbox",
        "tools": [
            "create_sandbox", "delete_sandbox", "download_file", "execute_command",
            "file_exists", "list_files", "upload_file"
        ],
        "templates": ["sandboxes://{namespace}"],
        "created": {"namespace": "default", "shutdown_after_seconds": 300},
        "uploads": [{"bytes_written": 15}, {"bytes_written": 255}, {"bytes_written": 5}],
        "exec": {
            "exit_code": 0,
            "stdout": "line 0\nline 1\nline 2\n",
            "stderr": "to stderr\n",
            "stdout_truncated": false,
            "stderr_truncated": false
        },
        "progress": {"saw_stdout": true, "saw_stderr": true, "increasing": true},
        "download": {"content": "HELLO FROM MCP\n", "bytes_read": 15},
        "not_text": "'work/blob.bin' is not UTF-8 text (invalid byte at offset 3); call \
                     download_file again with binary=true to get its content base64-encoded",
        "blob_round_trip": true,
        "exists": [true, true, false],
        "list_out": {
            "entries": [{"name": "result.txt", "size": 15, "type": "file"}],
            "total_entries": 1,
            "truncated": false
        },
        "list_work": {"names": ["blob.bin", "input.txt"], "total_entries": 3, "truncated": true},
        "resource": ["<claim>"],
        "errors": {
            "foreign_claim":
                "Sandbox claim 'sandbox-claim-nope' is not found in namespace 'default'",
            "bad_timeout": "timeout must be between 1 and 600 seconds, not 0",
            "missing_argument": "Invalid arguments for execute_command: missing field `command`",
            "escaping_path": "refusing to download_file \"../../etc/passwd\" in the sandbox: it \
                              leads outside the sandbox's base directory; pass a path inside \
                              the sandbox's working directory, such as work/main.py or \
                              out/result.txt",
            "missing_file": "No such file or directory 'no/such/file' in sandbox claim '<claim>'",
            "timed_out": "The command did not finish within its timeout of 1 seconds and was killed"
        },
        // Nothing larger than one message (1 MiB, the HTTP client's limit on one event) leaves
        // the server: output is cut further and says why, a file is refused with what to do
        // instead, a listing returns fewer entries and says it is truncated.
        "limits": {
            "output": {
                "fits": true,
                "stdout_truncated": true,
                "stderr_truncated": true,
                "says_why": true
            },
            "text_file": {
                "fits": true,
                "is_error": true,
                "says": "'work/control.txt' is 262144 bytes",
                "advice": true
            },
            "binary_file": {"fits": true, "bytes_read": 262144},
            "listing": {"fits": true, "total_entries": 5000, "truncated": true, "some": true}
        },
        "deleted": {"sandbox_claim_name": "<claim>", "namespace": "default", "deleted": true},
        "after_delete": "Sandbox claim '<claim>' is not found in namespace 'default'",
        "resource_after_delete": []
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_sdk_drives_the_server_over_stdio() {
    let Some(python) = python() else {
        return;
    };
    let sandboxctl = sandboxctl().await;
    let scratch = tempfile::tempdir().unwrap();
    let mut command = clean(&python, scratch.path());
    command
        .arg(python_dir().join("client.py"))
        .arg("stdio")
        .arg(&sandboxctl)
        .args(["mcp", "--local", "--replicas", "1"]);
    assert_eq!(client(command).await, expected());
}

/// The HTTP server, killed when dropped.
struct Server {
    child: Child,
    stderr: Arc<Mutex<String>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Starts `sandboxctl mcp --local --listen 127.0.0.1:0` and returns it with the URL it
    /// printed.
    async fn start(sandboxctl: &Path, scratch: &Path) -> (Self, String) {
        let mut command = clean(sandboxctl, scratch);
        command.args([
            "mcp",
            "--local",
            "--replicas",
            "1",
            "--listen",
            "127.0.0.1:0",
        ]);
        let mut child = command.spawn().expect("start sandboxctl mcp");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (url_tx, url_rx) = tokio::sync::oneshot::channel();
        let lines = child.stderr.take().expect("piped stderr");
        let reader = tokio::spawn({
            let stderr = stderr.clone();
            async move {
                let mut url_tx = Some(url_tx);
                let mut lines = tokio::io::BufReader::new(lines).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(url) = line
                        .split_once("streamable HTTP at ")
                        .and_then(|(_, rest)| rest.split_whitespace().next())
                        && let Some(tx) = url_tx.take()
                    {
                        let _ = tx.send(url.to_owned());
                    }
                    let mut all = stderr.lock().unwrap();
                    all.push_str(&line);
                    all.push('\n');
                }
            }
        });
        let server = Self {
            child,
            stderr,
            reader,
        };
        let url = match tokio::time::timeout(START_TIMEOUT, url_rx).await {
            Ok(Ok(url)) => url,
            Ok(Err(_)) => panic!("the server ended without serving:\n{}", server.stderr()),
            Err(_) => panic!("the server did not start in time:\n{}", server.stderr()),
        };
        (server, url)
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// SIGTERM, and the exit status (at most [`STOP_TIMEOUT`]).
    async fn stop(mut self) -> (std::process::ExitStatus, String) {
        let pid = i32::try_from(self.child.id().expect("running")).unwrap();
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid).unwrap(),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        let status = tokio::time::timeout(STOP_TIMEOUT, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the server did not stop in time:\n{}", self.stderr()))
            .unwrap();
        // The rest of stderr, up to its end.
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.reader).await;
        (status, self.stderr())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_sdk_drives_the_server_over_streamable_http() {
    let Some(python) = python() else {
        return;
    };
    let sandboxctl = sandboxctl().await;
    let scratch = tempfile::tempdir().unwrap();
    let (server, url) = Server::start(&sandboxctl, scratch.path()).await;
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with("/mcp"),
        "{url}"
    );
    let health = testkit::http::get(&url.replace("/mcp", "/healthz"))
        .await
        .expect("GET /healthz");
    assert_eq!(
        (health.status.as_u16(), health.text()),
        (200, "ok\n".to_owned())
    );

    let mut command = clean(&python, scratch.path());
    command
        .arg(python_dir().join("client.py"))
        .arg("http")
        .arg(&url);
    let transcript = client(command).await;
    assert_eq!(transcript, expected(), "server:\n{}", server.stderr());

    let (status, stderr) = server.stop().await;
    assert!(status.success(), "{status}:\n{stderr}");
    assert!(
        stderr.contains("sandboxctl mcp: stopping the local cluster\nsandboxctl mcp: stopped\n"),
        "{stderr}"
    );
}
