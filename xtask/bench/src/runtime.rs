//! Cases for `crates/runtime`: the release `sandbox-runtime` binary started as the simulated
//! cluster starts it (env `SANDBOX_LISTEN`, `SANDBOX_BASE_DIR`) and driven over loopback HTTP:
//! `/execute` round trips at concurrency 1 and 16 (hyper client), the exec hot path against the
//! physical floor measured in the same run, the no-process throughput, idle RSS, and 1 GiB
//! streamed PUT and GET with the server's peak RSS.

use std::io::{BufRead, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;

use super::{Case, Options, Row, Samples, format_duration};

pub(super) fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "runtime/exec-echo",
            about: "POST /execute {\"command\":\"echo hi\"} round trips, concurrency 1 and 16",
            run: exec_echo,
        },
        Case {
            name: "runtime/exec-floor",
            about: "POST /execute {\"command\":\"true\"} against spawning `true` from the bench, interleaved, c1 and c16",
            run: exec_floor,
        },
        Case {
            name: "runtime/exists-c16",
            about: "GET /exists/x (no process) throughput over 16 keep-alive connections",
            run: exists_c16,
        },
        Case {
            name: "runtime/idle-rss",
            about: "resident memory of an idle sandbox-runtime after startup and one request",
            run: idle_rss,
        },
        Case {
            name: "runtime/transfer-1gib",
            about: "1 GiB streamed PUT and GET through /v1/files, with the server's peak RSS",
            run: transfer,
        },
    ]
}

/// The release binary, built on demand.
fn build(root: &Path) -> Result<PathBuf> {
    Ok(super::build_release(root, &["sandbox-runtime"])?.join("sandbox-runtime"))
}

/// A running runtime, killed on drop, with its base directory removed.
struct Runtime {
    child: Child,
    addr: SocketAddr,
    base: PathBuf,
}

impl Runtime {
    fn start(root: &Path, name: &str) -> Result<Self> {
        let binary = build(root)?;
        let base =
            std::env::temp_dir().join(format!("bench-runtime-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&base)?;
        let mut child = Command::new(binary)
            .env("SANDBOX_LISTEN", "127.0.0.1:0")
            .env("SANDBOX_BASE_DIR", &base)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("failed to start sandbox-runtime")?;
        let stderr = child.stderr.take().context("no stderr")?;
        let mut runtime = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            base,
        };
        let mut lines = BufReader::new(stderr).lines();
        runtime.addr = loop {
            let line = lines
                .next()
                .context("sandbox-runtime exited before listening")??;
            if let Some(rest) = line.split("listening on ").nth(1) {
                break rest
                    .split_whitespace()
                    .next()
                    .context("no address in the log line")?
                    .parse()?;
            }
        };
        // Keep draining the log so the runtime never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Ok(runtime)
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

impl Drop for Runtime {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

pub(super) fn mib(kib: u64) -> String {
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

/// `n` sequential `/execute` calls on one keep-alive connection; per-call latencies.
async fn execute_loop(addr: SocketAddr, n: usize) -> Result<Vec<Duration>> {
    let mut sender = connect(addr).await?;
    let body = Bytes::from_static(br#"{"command":"echo hi"}"#);
    let mut latencies = Vec::with_capacity(n);
    for _ in 0..n {
        let request = Request::builder()
            .method(Method::POST)
            .uri("/execute")
            .header("host", "sandbox")
            .header("content-type", "application/json")
            .body(Full::new(body.clone()))?;
        let start = Instant::now();
        sender.ready().await?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        let bytes = response.into_body().collect().await?.to_bytes();
        latencies.push(start.elapsed());
        if status != StatusCode::OK || !bytes.starts_with(br#"{"stdout":"hi\n""#) {
            bail!(
                "unexpected answer {status}: {}",
                String::from_utf8_lossy(&bytes)
            );
        }
    }
    Ok(latencies)
}

fn per_second(count: usize, elapsed: Duration) -> String {
    #[allow(clippy::cast_precision_loss)]
    let rate = count as f64 / elapsed.as_secs_f64().max(1e-9);
    format!("{rate:.0} req/s")
}

fn exec_echo(root: &Path, options: Options) -> Result<Vec<Row>> {
    // The machine's floor: spawning and reaping `echo` directly, no HTTP, no runtime.
    let mut floor = Samples::with_capacity(200);
    for _ in 0..options.iterations(500) {
        let start = Instant::now();
        let output = Command::new("echo").arg("hi").output()?;
        floor.push(start.elapsed());
        if output.stdout != b"hi\n" {
            bail!("echo printed {:?}", output.stdout);
        }
    }
    let mut rows = vec![
        Row::new("runtime/spawn-floor")
            .median(format_duration(floor.median()))
            .p99(format_duration(floor.p99()))
            .notes(format!(
                "{} x std::process::Command echo from the bench process: what one fork+exec+wait costs on this machine",
                floor.len()
            )),
    ];
    let server = Runtime::start(root, "exec")?;
    let addr = server.addr;
    let rt = tokio_runtime(2)?;
    // Warm up (page cache, connection paths).
    rt.block_on(execute_loop(addr, 50))?;
    for concurrency in [1usize, 16] {
        let per_client = options.iterations(if concurrency == 1 { 2000 } else { 250 });
        let start = Instant::now();
        let results = rt.block_on(async {
            let mut tasks = Vec::new();
            for _ in 0..concurrency {
                tasks.push(tokio::spawn(execute_loop(addr, per_client)));
            }
            let mut all = Vec::new();
            for task in tasks {
                all.extend(task.await??);
            }
            anyhow::Ok(all)
        })?;
        let elapsed = start.elapsed();
        let mut samples = Samples::with_capacity(results.len());
        for latency in &results {
            samples.push(*latency);
        }
        let (_, hwm) = server.memory()?;
        rows.push(
            Row::new(format!("runtime/exec-echo-c{concurrency}"))
                .median(format_duration(samples.median()))
                .p99(format_duration(samples.p99()))
                .throughput(per_second(results.len(), elapsed))
                .peak_rss(mib(hwm))
                .notes(format!(
                    "{} requests, {concurrency} keep-alive connection(s), fork+exec of echo each",
                    results.len()
                )),
        );
    }
    Ok(rows)
}

/// A keep-alive HTTP/1.1 connection with blocking std sockets and a request prepared as bytes:
/// the cheapest client there is, so that what it costs stays out of the runtime's figures.
struct RawClient {
    stream: TcpStream,
    buffer: Vec<u8>,
}

impl RawClient {
    fn connect(addr: SocketAddr) -> Result<Self> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buffer: Vec::with_capacity(4096),
        })
    }

    /// Sends `request` and reads the whole answer (its `Content-Length` body); `Err` unless 200.
    fn call(&mut self, request: &[u8]) -> Result<()> {
        self.stream.write_all(request)?;
        self.buffer.clear();
        let mut chunk = [0u8; 4096];
        let (head_end, length) = loop {
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                bail!("the runtime closed the connection");
            }
            self.buffer.extend_from_slice(&chunk[..n]);
            if let Some(end) = self.buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break (end + 4, content_length(&self.buffer[..end])?);
            }
        };
        while self.buffer.len() < head_end + length {
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                bail!("the runtime closed the connection mid-answer");
            }
            self.buffer.extend_from_slice(&chunk[..n]);
        }
        if !self.buffer.starts_with(b"HTTP/1.1 200") {
            bail!(
                "unexpected answer: {}",
                String::from_utf8_lossy(&self.buffer)
            );
        }
        Ok(())
    }
}

fn content_length(head: &[u8]) -> Result<usize> {
    let head = std::str::from_utf8(head)?;
    head.split("\r\n")
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())
                .flatten()
        })
        .context("an answer without Content-Length")
}

/// `POST /execute {"command":"true"}` as bytes.
fn execute_true() -> Vec<u8> {
    let body = br#"{"command":"true"}"#;
    let mut request = format!(
        "POST /execute HTTP/1.1\r\nhost: sandbox\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}

/// The floor of one `/execute {"command":"true"}`: what the runtime does for it minus HTTP and
/// the runtime itself, done by the bench process. `true` is looked up in `PATH` (the runtime's
/// environment is the bench's), standard input is `/dev/null`, standard output and error are
/// pipes read to their end, and the exit status is reaped; std spawns it with `posix_spawn`.
fn floor_once() -> Result<()> {
    let output = Command::new("true")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()?;
    if !output.status.success() {
        bail!("`true` failed: {:?}", output.status);
    }
    Ok(())
}

/// Median and spread (lowest and highest) of per-block figures.
fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let median = values.get(values.len() / 2).copied().unwrap_or(0.0);
    let low = values.first().copied().unwrap_or(0.0);
    let high = values.last().copied().unwrap_or(0.0);
    (median, low, high)
}

/// `per_thread` calls of `call` on each of `threads` threads at once; calls per second.
fn throughput<C: Send + 'static>(
    threads: usize,
    per_thread: usize,
    make: impl Fn() -> Result<C>,
    call: fn(&mut C) -> Result<()>,
) -> Result<f64> {
    let mut states = Vec::with_capacity(threads);
    for _ in 0..threads {
        states.push(make()?);
    }
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(threads + 1));
    let workers: Vec<_> = states
        .into_iter()
        .map(|mut state| {
            let barrier = std::sync::Arc::clone(&barrier);
            std::thread::spawn(move || -> Result<()> {
                barrier.wait();
                for _ in 0..per_thread {
                    call(&mut state)?;
                }
                Ok(())
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for worker in workers {
        worker
            .join()
            .map_err(|_| anyhow::anyhow!("a load thread panicked"))??;
    }
    #[allow(clippy::cast_precision_loss)]
    let rate = (threads * per_thread) as f64 / start.elapsed().as_secs_f64().max(1e-9);
    Ok(rate)
}

fn exec_floor(root: &Path, options: Options) -> Result<Vec<Row>> {
    let server = Runtime::start(root, "floor")?;
    let request = execute_true();
    let mut client = RawClient::connect(server.addr)?;
    // Warm up both paths (page cache, connection, allocator).
    for _ in 0..50 {
        floor_once()?;
        client.call(&request)?;
    }
    // Concurrency 1: one floor spawn and one request in turn, so that both see the same load
    // on a shared machine; the overhead is measured per block and reported with its spread.
    let blocks = if options.quick { 2 } else { 7 };
    let per_block = options.iterations(400);
    let (mut floor, mut ours) = (Samples::default(), Samples::default());
    let mut overheads = Vec::with_capacity(blocks);
    for _ in 0..blocks {
        let (mut block_floor, mut block_ours) = (Samples::default(), Samples::default());
        for _ in 0..per_block {
            let start = Instant::now();
            floor_once()?;
            let elapsed = start.elapsed();
            block_floor.push(elapsed);
            floor.push(elapsed);
            let start = Instant::now();
            client.call(&request)?;
            let elapsed = start.elapsed();
            block_ours.push(elapsed);
            ours.push(elapsed);
        }
        overheads.push(
            block_ours.median().as_secs_f64() * 1e3 - block_floor.median().as_secs_f64() * 1e3,
        );
    }
    drop(client);
    let (overhead, low, high) = spread(overheads);
    let floor_median = floor.median();
    let mut rows = vec![
        Row::new("runtime/exec-floor-c1")
            .median(format_duration(floor_median))
            .p99(format_duration(floor.p99()))
            .notes(format!(
                "{} x spawn `true` from the bench (PATH lookup, stdin /dev/null, stdout+stderr piped and read to the end, reaped; std's posix_spawn): the floor of the next row",
                floor.len()
            )),
        Row::new("runtime/exec-true-c1")
            .median(format_duration(ours.median()))
            .p99(format_duration(ours.p99()))
            .notes(format!(
                "{} x POST /execute {{\"command\":\"true\"}}, 1 keep-alive connection, interleaved with the floor; over the floor: median {overhead:.3} ms (blocks of {per_block}: {low:.3} to {high:.3}); target <= 0.25 ms",
                ours.len()
            )),
    ];

    // Concurrency 16: floor and runtime in alternating blocks, throughput ratio per pair. The
    // CPU time both sides spend is counted too: on a shared machine the throughput also depends
    // on the share of the cores each side gets, the CPU time per call does not.
    let concurrency = 16;
    let per_thread = options.iterations(60);
    let pairs = if options.quick { 2 } else { 7 };
    let (mut floor_rates, mut our_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut floor_cpu, mut our_cpu) = (FloorCpu::default(), OurCpu::default());
    let server_pid = server.child.id().to_string();
    for _ in 0..pairs {
        let bench_before = CpuTicks::of("self")?;
        let floor_rate = throughput(concurrency, per_thread, || Ok(()), |()| floor_once())?;
        let (bench_between, server_before) = (CpuTicks::of("self")?, CpuTicks::of(&server_pid)?);
        let addr = server.addr;
        let request = request.clone();
        let our_rate = throughput(
            concurrency,
            per_thread,
            move || Ok((RawClient::connect(addr)?, request.clone())),
            |(client, request)| client.call(request),
        )?;
        let (bench_after, server_after) = (CpuTicks::of("self")?, CpuTicks::of(&server_pid)?);
        floor_cpu.spawner += bench_between.own - bench_before.own;
        floor_cpu.children += bench_between.children - bench_before.children;
        our_cpu.client += bench_after.own - bench_between.own;
        our_cpu.runtime += server_after.own - server_before.own;
        our_cpu.children += server_after.children - server_before.children;
        ratios.push(our_rate / floor_rate * 100.0);
        floor_rates.push(floor_rate);
        our_rates.push(our_rate);
    }
    let calls = pairs * concurrency * per_thread;
    let per_call = |ticks: u64| CpuTicks::micros(ticks, calls);
    let floor_total = per_call(floor_cpu.spawner + floor_cpu.children);
    let our_total = per_call(our_cpu.client + our_cpu.runtime + our_cpu.children);
    let (floor_rate, floor_low, floor_high) = spread(floor_rates);
    let (our_rate, our_low, our_high) = spread(our_rates);
    let (ratio, ratio_low, ratio_high) = spread(ratios);
    let (_, hwm) = server.memory()?;
    rows.push(
        Row::new("runtime/exec-floor-c16")
            .throughput(format!("{floor_rate:.0} spawns/s"))
            .notes(format!(
                "{concurrency} bench threads spawning `true` as in runtime/exec-floor-c1, {pairs} blocks of {} (from {floor_low:.0} to {floor_high:.0}/s); CPU per spawn {floor_total:.0} µs (spawning threads {:.0}, the children {:.0})",
                concurrency * per_thread,
                per_call(floor_cpu.spawner),
                per_call(floor_cpu.children),
            )),
    );
    rows.push(
        Row::new("runtime/exec-true-c16")
            .throughput(format!("{our_rate:.0} req/s"))
            .peak_rss(mib(hwm))
            .notes(format!(
                "{concurrency} keep-alive connections, blocks alternating with the floor's (from {our_low:.0} to {our_high:.0}/s); {ratio:.0} % of the floor (blocks: {ratio_low:.0} to {ratio_high:.0} %); target >= 90 %; CPU per request {our_total:.0} µs (client {:.0}, runtime {:.0}, its children {:.0}): the floor's is {:.0} % of it",
                per_call(our_cpu.client),
                per_call(our_cpu.runtime),
                per_call(our_cpu.children),
                floor_total / our_total.max(1e-9) * 100.0,
            )),
    );
    Ok(rows)
}

/// CPU time of a process from `/proc/<pid>/stat`, in clock ticks (1/100 s: Linux's `USER_HZ`,
/// which `/proc` always uses): of its own threads, and of its children it has waited for.
#[derive(Debug, Clone, Copy)]
struct CpuTicks {
    own: u64,
    children: u64,
}

impl CpuTicks {
    /// `pid` is a number or `self`.
    fn of(pid: &str) -> Result<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        let (_, rest) = stat
            .rsplit_once(") ")
            .context("no command name in /proc stat")?;
        // After the command name: state (field 3) ... utime (14), stime, cutime, cstime (17).
        let fields: Vec<u64> = rest
            .split_whitespace()
            .skip(11)
            .take(4)
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        let [utime, stime, cutime, cstime] = fields[..] else {
            bail!("a short /proc/{pid}/stat");
        };
        Ok(Self {
            own: utime + stime,
            children: cutime + cstime,
        })
    }

    /// `ticks` spread over `calls`, in microseconds.
    fn micros(ticks: u64, calls: usize) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let per_call = ticks as f64 * 10_000.0 / calls.max(1) as f64;
        per_call
    }
}

/// CPU ticks of the floor's blocks: the bench threads that spawn, and the spawned children.
#[derive(Debug, Default)]
struct FloorCpu {
    spawner: u64,
    children: u64,
}

/// CPU ticks of the runtime's blocks: the bench's client threads, the runtime's threads and the
/// commands it ran.
#[derive(Debug, Default)]
struct OurCpu {
    client: u64,
    runtime: u64,
    children: u64,
}

fn exists_c16(root: &Path, options: Options) -> Result<Vec<Row>> {
    let server = Runtime::start(root, "exists")?;
    let request = b"GET /exists/x HTTP/1.1\r\nhost: sandbox\r\n\r\n".to_vec();
    let concurrency = 16;
    let per_thread = options.iterations(2000);
    let blocks = if options.quick { 2 } else { 5 };
    let mut rates = Vec::with_capacity(blocks);
    for _ in 0..blocks {
        let addr = server.addr;
        let request = request.clone();
        rates.push(throughput(
            concurrency,
            per_thread,
            move || Ok((RawClient::connect(addr)?, request.clone())),
            |(client, request)| client.call(request),
        )?);
    }
    let (rate, low, high) = spread(rates);
    let (_, hwm) = server.memory()?;
    Ok(vec![
        Row::new("runtime/exists-c16")
            .throughput(format!("{rate:.0} req/s"))
            .peak_rss(mib(hwm))
            .notes(format!(
                "GET /exists/x (a stat, no process), {concurrency} keep-alive connections, median of {blocks} blocks of {} (from {low:.0} to {high:.0}/s); target >= 25000 req/s",
                concurrency * per_thread
            )),
    ])
}

fn idle_rss(root: &Path, _: Options) -> Result<Vec<Row>> {
    let server = Runtime::start(root, "idle")?;
    let rt = tokio_runtime(1)?;
    let health = rt.block_on(async {
        let mut sender = connect(server.addr).await?;
        let request = Request::builder()
            .uri("/")
            .header("host", "sandbox")
            .body(Full::new(Bytes::new()))?;
        let response = sender.send_request(request).await?;
        anyhow::Ok(response.status())
    })?;
    if health != StatusCode::OK {
        bail!("GET / answered {health}");
    }
    std::thread::sleep(Duration::from_millis(500));
    let (rss, hwm) = server.memory()?;
    Ok(vec![
        Row::new("runtime/idle-rss")
            .median(mib(rss))
            .peak_rss(mib(hwm))
            .notes("VmRSS after startup and GET / (median column); target < 5 MiB"),
    ])
}

fn transfer(root: &Path, options: Options) -> Result<Vec<Row>> {
    let size: u64 = if options.quick { 128 << 20 } else { 1 << 30 };
    let server = Runtime::start(root, "transfer")?;
    let (_, idle_hwm) = server.memory()?;
    let rt = tokio_runtime(2)?;
    let addr = server.addr;
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
        let request = Request::builder()
            .method(Method::PUT)
            .uri("/v1/files/bench.bin")
            .header("host", "sandbox")
            .header("content-length", size)
            .body(body)?;
        let start = Instant::now();
        let response = sender.send_request(request).await?;
        let status = response.status();
        let _ = response.into_body().collect().await?;
        if status != StatusCode::NO_CONTENT {
            bail!("PUT answered {status}");
        }
        anyhow::Ok(start.elapsed())
    })?;
    let (_, put_hwm) = server.memory()?;

    let (get_elapsed, received) = rt.block_on(async {
        let mut sender = connect(addr).await?;
        let request = Request::builder()
            .uri("/v1/files/bench.bin")
            .header("host", "sandbox")
            .body(Full::new(Bytes::new()))?;
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
    let (_, get_hwm) = server.memory()?;
    let rate = |elapsed: Duration| {
        #[allow(clippy::cast_precision_loss)]
        let value = size as f64 / (1024.0 * 1024.0) / elapsed.as_secs_f64().max(1e-9);
        format!("{value:.0} MiB/s")
    };
    let label = if options.quick { "128 MiB" } else { "1 GiB" };
    Ok(vec![
        Row::new("runtime/put-1gib")
            .median(format_duration(put_elapsed))
            .throughput(rate(put_elapsed))
            .peak_rss(mib(put_hwm))
            .notes(format!(
                "{label} streamed PUT /v1/files (temp + rename); idle peak {}",
                mib(idle_hwm)
            )),
        Row::new("runtime/get-1gib")
            .median(format_duration(get_elapsed))
            .throughput(rate(get_elapsed))
            .peak_rss(mib(get_hwm))
            .notes(format!(
                "{label} streamed GET /v1/files; peak RSS since start"
            )),
    ])
}
