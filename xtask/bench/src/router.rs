//! Cases for `crates/router`: the release `sandbox-router` binary in front of the release
//! `sandbox-runtime`, the router's index fed by its real watchers from a minimal fake Kubernetes
//! API in this process (one Ready Sandbox and its Pod; watches stay open and idle). Measures a
//! trivial `/execute` through the router against the same call direct to the runtime (median,
//! p99, requests per second at concurrency 1 and 16, measured in the same run so the difference
//! is the router's cost), the router's idle RSS, and 1 GiB streamed up and down through it with
//! its peak RSS.

use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;

use super::{Case, Options, Row, Samples, format_duration};

const SANDBOX: &str = "bench";

pub(super) fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "router/exec-echo",
            about: "POST /execute {\"command\":\"echo hi\"} (c1, c16) and GET / (c1) through the router vs direct",
            run: exec_echo,
        },
        Case {
            name: "router/idle-rss",
            about: "resident memory of an idle sandbox-router after its initial lists and one request",
            run: idle_rss,
        },
        Case {
            name: "router/transfer-1gib",
            about: "1 GiB streamed PUT and GET through the router, with the router's peak RSS",
            run: transfer,
        },
    ]
}

/// Builds a release binary on demand.
fn build(root: &Path, bin: &str) -> Result<PathBuf> {
    Ok(super::build_release(root, &[bin])?.join(bin))
}

/// A child process that logs `listening on <addr>` on stderr; killed on drop.
struct Process {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
}

impl Process {
    fn start(mut command: Command, dir: PathBuf, marker: &str) -> Result<Self> {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("failed to start a bench process")?;
        let stderr = child.stderr.take().context("no stderr")?;
        let mut process = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            dir,
        };
        let mut lines = BufReader::new(stderr).lines();
        process.addr = loop {
            let line = lines
                .next()
                .context("the process exited before listening")??;
            if let Some(rest) = line.split(marker).nth(1) {
                break rest
                    .split_whitespace()
                    .next()
                    .context("no address in the log line")?
                    .parse()?;
            }
        };
        // Keep draining the log (the router's access log included) so that it never blocks.
        std::thread::spawn(move || for _ in lines {});
        Ok(process)
    }

    /// `(VmRSS, VmHWM)` in KiB.
    fn memory(&self) -> Result<(u64, u64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let field = |name: &str| -> Result<u64> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
                .with_context(|| format!("no {name} in /proc status"))
        };
        Ok((field("VmRSS:")?, field("VmHWM:")?))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The runtime, the fake API and the router, wired together.
struct Stack {
    runtime: Process,
    router: Process,
    _api: tokio::task::JoinHandle<()>,
}

impl Stack {
    fn start(root: &Path, rt: &tokio::runtime::Runtime, name: &str) -> Result<Self> {
        let runtime_bin = build(root, "sandbox-runtime")?;
        let router_bin = build(root, "sandbox-router")?;
        let pid = std::process::id();
        let runtime_dir = std::env::temp_dir().join(format!("bench-router-rt-{name}-{pid}"));
        std::fs::create_dir_all(&runtime_dir)?;
        let mut command = Command::new(runtime_bin);
        command
            .env("SANDBOX_LISTEN", "127.0.0.1:0")
            .env("SANDBOX_BASE_DIR", &runtime_dir)
            .env("RUST_LOG", "info");
        let runtime = Process::start(command, runtime_dir, "listening on ")?;

        let (api_addr, api) = rt.block_on(fake_api(runtime.addr))?;
        let router_dir = std::env::temp_dir().join(format!("bench-router-{name}-{pid}"));
        std::fs::create_dir_all(&router_dir)?;
        let kubeconfig = router_dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: bench\n  cluster:\n    server: http://{api_addr}\n\
                 contexts:\n- name: bench\n  context:\n    cluster: bench\n    user: bench\n\
                 current-context: bench\nusers:\n- name: bench\n  user: {{}}\n"
            ),
        )?;
        let mut command = Command::new(router_bin);
        command
            .env_clear()
            .env("KUBECONFIG", &kubeconfig)
            .env("HOME", &router_dir)
            .env("RUST_LOG", "info")
            .args(["--listen", "127.0.0.1:0", "--auth", "none"]);
        let router = Process::start(command, router_dir, "sandbox-router listening on ")?;
        let stack = Self {
            runtime,
            router,
            _api: api,
        };
        rt.block_on(stack.wait_ready())?;
        Ok(stack)
    }

    async fn wait_ready(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut sender = connect(self.router.addr).await?;
            let request = Request::builder()
                .uri("/readyz")
                .header("host", "router")
                .body(Full::new(Bytes::new()))?;
            if sender.send_request(request).await?.status() == StatusCode::OK {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the router's index did not sync within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Headers that route to the runtime: through the router they name the sandbox and the
    /// runtime's (declared) port; direct they are absent.
    fn routing(&self) -> Vec<(&'static str, String)> {
        vec![
            ("x-sandbox-id", SANDBOX.to_owned()),
            ("x-sandbox-port", self.runtime.addr.port().to_string()),
        ]
    }
}

type ApiBody = UnsyncBoxBody<Bytes, Infallible>;

/// A fake Kubernetes API serving one Ready Sandbox and its Pod at `runtime`; watches never send
/// anything.
async fn fake_api(runtime: SocketAddr) -> Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let hash = agent_sandbox_api::name_hash(SANDBOX);
    let sandbox = json!({
        "apiVersion": agent_sandbox_api::API_VERSION, "kind": agent_sandbox_api::kinds::SANDBOX,
        "metadata": {"name": SANDBOX, "namespace": "default", "uid": "uid-bench", "resourceVersion": "1"},
        "spec": {"podTemplate": {"spec": {"containers": []}}},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "DependenciesReady",
            "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    });
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": SANDBOX, "namespace": "default", "resourceVersion": "1",
            "labels": {agent_sandbox_api::labels::SANDBOX_NAME_HASH: hash},
            "ownerReferences": [{"apiVersion": agent_sandbox_api::API_VERSION, "kind": agent_sandbox_api::kinds::SANDBOX,
                "name": SANDBOX, "uid": "uid-bench", "controller": true}]},
        "spec": {"containers": [{"name": "runtime", "ports": [{"containerPort": runtime.port()}]}]},
        "status": {"phase": "Running", "podIP": runtime.ip().to_string(),
            "podIPs": [{"ip": runtime.ip().to_string()}]}
    });
    let sandboxes = json!({"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "SandboxList",
        "metadata": {"resourceVersion": "1"}, "items": [sandbox]})
    .to_string();
    let pods = json!({"apiVersion": "v1", "kind": "PodList",
        "metadata": {"resourceVersion": "1"}, "items": [pod]})
    .to_string();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (sandboxes, pods) = (sandboxes.clone(), pods.clone());
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                        let (sandboxes, pods) = (sandboxes.clone(), pods.clone());
                        async move {
                            let watching = request.uri().query().unwrap_or("").contains("watch=");
                            let path = request.uri().path();
                            let list = if path.ends_with("/sandboxes") {
                                Some(sandboxes)
                            } else if path.ends_with("/pods") {
                                Some(pods)
                            } else {
                                None
                            };
                            let body: ApiBody = match (list, watching) {
                                (Some(_), true) => {
                                    StreamBody::new(futures_util::stream::pending::<
                                        Result<Frame<Bytes>, Infallible>,
                                    >())
                                    .boxed_unsync()
                                }
                                (Some(list), false) => Full::new(Bytes::from(list)).boxed_unsync(),
                                (None, _) => {
                                    let mut response =
                                        Response::new(Full::new(Bytes::new()).boxed_unsync());
                                    *response.status_mut() = StatusCode::NOT_FOUND;
                                    return Ok::<_, Infallible>(response);
                                }
                            };
                            let mut response = Response::new(body);
                            response.headers_mut().insert(
                                "content-type",
                                hyper::header::HeaderValue::from_static("application/json"),
                            );
                            Ok(response)
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok((addr, task))
}

fn mib(kib: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let value = kib as f64 / 1024.0;
    format!("{value:.1} MiB")
}

fn tokio_runtime(threads: usize) -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()?)
}

async fn connect(addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// One kind of request the load loops send.
#[derive(Debug, Clone, Copy)]
enum Call {
    /// `POST /execute {"command":"echo hi"}`: a fork and exec in the runtime.
    Echo,
    /// `GET /`: the runtime's health answer, no process; isolates the router's own cost.
    Health,
}

impl Call {
    fn request(self, headers: &[(&'static str, String)]) -> Result<Request<Full<Bytes>>> {
        let mut builder = Request::builder().header("host", "sandbox");
        builder = match self {
            Self::Echo => builder
                .method(Method::POST)
                .uri("/execute")
                .header("content-type", "application/json"),
            Self::Health => builder.method(Method::GET).uri("/"),
        };
        for (name, value) in headers {
            builder = builder.header(*name, value);
        }
        let body = match self {
            Self::Echo => Bytes::from_static(br#"{"command":"echo hi"}"#),
            Self::Health => Bytes::new(),
        };
        Ok(builder.body(Full::new(body))?)
    }

    fn expected(self) -> &'static [u8] {
        match self {
            Self::Echo => br#"{"stdout":"hi\n""#,
            Self::Health => br#"{"status":"ok""#,
        }
    }
}

/// `n` sequential calls on one keep-alive connection to `addr` with `headers`; per-call
/// latencies.
async fn call_loop(
    addr: SocketAddr,
    headers: Vec<(&'static str, String)>,
    call: Call,
    n: usize,
) -> Result<Vec<Duration>> {
    let mut sender = connect(addr).await?;
    let mut latencies = Vec::with_capacity(n);
    for _ in 0..n {
        let request = call.request(&headers)?;
        let start = Instant::now();
        sender.ready().await?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        let bytes = response.into_body().collect().await?.to_bytes();
        latencies.push(start.elapsed());
        if status != StatusCode::OK || !bytes.starts_with(call.expected()) {
            bail!(
                "unexpected answer {status}: {}",
                String::from_utf8_lossy(&bytes)
            );
        }
    }
    Ok(latencies)
}

/// Runs `concurrency` clients of `per_client` calls each; samples and elapsed wall time.
fn load(
    rt: &tokio::runtime::Runtime,
    addr: SocketAddr,
    headers: &[(&'static str, String)],
    call: Call,
    concurrency: usize,
    per_client: usize,
) -> Result<(Samples, Duration)> {
    let start = Instant::now();
    let latencies = rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..concurrency {
            tasks.push(tokio::spawn(call_loop(
                addr,
                headers.to_vec(),
                call,
                per_client,
            )));
        }
        let mut all = Vec::new();
        for task in tasks {
            all.extend(task.await??);
        }
        anyhow::Ok(all)
    })?;
    let elapsed = start.elapsed();
    let mut samples = Samples::with_capacity(latencies.len());
    for latency in latencies {
        samples.push(latency);
    }
    Ok((samples, elapsed))
}

fn per_second(count: usize, elapsed: Duration) -> String {
    #[allow(clippy::cast_precision_loss)]
    let rate = count as f64 / elapsed.as_secs_f64().max(1e-9);
    format!("{rate:.0} req/s")
}

fn exec_echo(root: &Path, options: Options) -> Result<Vec<Row>> {
    let rt = tokio_runtime(2)?;
    let stack = Stack::start(root, &rt, "exec")?;
    let routing = stack.routing();
    // Warm up both paths (page cache, pooled connection to the runtime).
    for call in [Call::Echo, Call::Health] {
        rt.block_on(call_loop(stack.runtime.addr, Vec::new(), call, 50))?;
        rt.block_on(call_loop(stack.router.addr, routing.clone(), call, 50))?;
    }
    let mut rows = Vec::new();
    for (call, label, what, concurrencies) in [
        (
            Call::Echo,
            "exec-echo",
            "POST /execute echo hi",
            &[1usize, 16][..],
        ),
        (Call::Health, "health", "GET / (no process)", &[1usize][..]),
    ] {
        for &concurrency in concurrencies {
            let per_client = options.iterations(if concurrency == 1 { 2000 } else { 250 });
            let (direct, direct_elapsed) =
                load(&rt, stack.runtime.addr, &[], call, concurrency, per_client)?;
            let (routed, routed_elapsed) = load(
                &rt,
                stack.router.addr,
                &routing,
                call,
                concurrency,
                per_client,
            )?;
            let (_, router_hwm) = stack.router.memory()?;
            let added_median = routed.median().saturating_sub(direct.median());
            let added_p99 = routed.p99().saturating_sub(direct.p99());
            rows.push(
                Row::new(format!("router/{label}-direct-c{concurrency}"))
                    .median(format_duration(direct.median()))
                    .p99(format_duration(direct.p99()))
                    .throughput(per_second(direct.len(), direct_elapsed))
                    .notes(format!(
                        "{} x {what} straight to the runtime, {concurrency} keep-alive \
                         connection(s); baseline of the next row, same run",
                        direct.len()
                    )),
            );
            rows.push(
                Row::new(format!("router/{label}-c{concurrency}"))
                    .median(format_duration(routed.median()))
                    .p99(format_duration(routed.p99()))
                    .throughput(per_second(routed.len(), routed_elapsed))
                    .peak_rss(mib(router_hwm))
                    .notes(format!(
                        "{} x {what} through the router (access log on), {concurrency} \
                         keep-alive connection(s); added over direct: median {}, p99 {}; peak \
                         RSS is the router's",
                        routed.len(),
                        format_duration(added_median),
                        format_duration(added_p99)
                    )),
            );
        }
    }
    Ok(rows)
}

fn idle_rss(root: &Path, _: Options) -> Result<Vec<Row>> {
    let rt = tokio_runtime(1)?;
    let stack = Stack::start(root, &rt, "idle")?;
    rt.block_on(call_loop(stack.router.addr, stack.routing(), Call::Echo, 1))?;
    std::thread::sleep(Duration::from_millis(500));
    let (rss, hwm) = stack.router.memory()?;
    Ok(vec![
        Row::new("router/idle-rss")
            .median(mib(rss))
            .peak_rss(mib(hwm))
            .notes(
                "VmRSS after startup, the initial Sandbox and Pod lists (watches open) and one \
                 proxied /execute (median column); target < 15 MiB",
            ),
    ])
}

fn transfer(root: &Path, options: Options) -> Result<Vec<Row>> {
    let size: u64 = if options.quick { 128 << 20 } else { 1 << 30 };
    let rt = tokio_runtime(2)?;
    let stack = Stack::start(root, &rt, "transfer")?;
    let (_, idle_hwm) = stack.router.memory()?;
    let addr = stack.router.addr;
    let routing = stack.routing();
    let chunk = Bytes::from(
        (0..256 * 1024)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>(),
    );

    let put_elapsed = rt.block_on(async {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let chunks = size / chunk.len() as u64;
        let body_chunk = chunk.clone();
        let body = StreamBody::new(
            futures_util::stream::iter(0..chunks)
                .map(move |_| Ok::<_, std::io::Error>(Frame::data(body_chunk.clone()))),
        );
        let mut builder = Request::builder()
            .method(Method::PUT)
            .uri("/v1/files/bench.bin")
            .header("host", "sandbox")
            .header("content-length", size);
        for (name, value) in &routing {
            builder = builder.header(*name, value);
        }
        let request = builder.body(body)?;
        let start = Instant::now();
        let response = sender.send_request(request).await?;
        let status = response.status();
        let _ = response.into_body().collect().await?;
        if status != StatusCode::NO_CONTENT {
            bail!("PUT answered {status}");
        }
        anyhow::Ok(start.elapsed())
    })?;
    let (_, put_hwm) = stack.router.memory()?;

    let (get_elapsed, received) = rt.block_on(async {
        let mut sender = connect(addr).await?;
        let mut builder = Request::builder()
            .uri("/v1/files/bench.bin")
            .header("host", "sandbox");
        for (name, value) in &routing {
            builder = builder.header(*name, value);
        }
        let request = builder.body(Full::new(Bytes::new()))?;
        let start = Instant::now();
        let response = sender.send_request(request).await?;
        if response.status() != StatusCode::OK {
            bail!("GET answered {}", response.status());
        }
        let mut body = response.into_body().into_data_stream();
        let mut received: u64 = 0;
        while let Some(data) = body.next().await {
            received += data?.len() as u64;
        }
        anyhow::Ok((start.elapsed(), received))
    })?;
    if received != size {
        bail!("GET returned {received} bytes instead of {size}");
    }
    let (_, get_hwm) = stack.router.memory()?;
    let rate = |elapsed: Duration| {
        #[allow(clippy::cast_precision_loss)]
        let value = size as f64 / (1024.0 * 1024.0) / elapsed.as_secs_f64().max(1e-9);
        format!("{value:.0} MiB/s")
    };
    let label = if options.quick { "128 MiB" } else { "1 GiB" };
    Ok(vec![
        Row::new("router/put-1gib")
            .median(format_duration(put_elapsed))
            .throughput(rate(put_elapsed))
            .peak_rss(mib(put_hwm))
            .notes(format!(
                "{label} streamed PUT /v1/files through the router; router peak RSS (idle peak \
                 before: {})",
                mib(idle_hwm)
            )),
        Row::new("router/get-1gib")
            .median(format_duration(get_elapsed))
            .throughput(rate(get_elapsed))
            .peak_rss(mib(get_hwm))
            .notes(format!(
                "{label} streamed GET /v1/files through the router; router peak RSS since start"
            )),
    ])
}
