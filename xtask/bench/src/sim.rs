//! Cases for `crates/sim`: the release `kube-sim` binary started as scripts start it, driven over
//! loopback HTTP with a hyper client: time to a served kubeconfig, API request latency and
//! throughput, and the time from creating a runtime Pod to its `Ready` condition (confined by the
//! kubelet's pod sandbox and with `--isolation none`), with the sim's peak RSS.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use super::{Case, Options, Row, Samples, format_duration};

pub(super) fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "sim/startup",
            about: "kube-sim from exec to a written kubeconfig and an answering /healthz",
            run: startup,
        },
        Case {
            name: "sim/api",
            about: "GET and create of ConfigMaps through kube-sim, one keep-alive connection",
            run: api,
        },
        Case {
            name: "sim/pod-ready",
            about: "create of a sandbox-runtime Pod until its Ready condition, unconfined and confined",
            run: pod_ready,
        },
    ]
}

/// Builds the release binaries the cases run (the runtime lands next to kube-sim, where the
/// default image table finds it).
fn build(root: &Path) -> Result<PathBuf> {
    Ok(super::build_release(root, &["kube-sim", "sandbox-runtime"])?.join("kube-sim"))
}

/// A running kube-sim, killed on drop, with its files removed.
struct KubeSim {
    child: Child,
    addr: SocketAddr,
    /// The certificate authority and the administrator's token, from its kubeconfig.
    ca_pem: String,
    token: String,
    dir: PathBuf,
}

impl KubeSim {
    /// Starts kube-sim and waits (bounded) until it has written its kubeconfig.
    fn start(binary: &Path, name: &str, isolation: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("bench-sim-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let kubeconfig = dir.join("kubeconfig");
        let child = Command::new(binary)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--isolation", isolation, "--data-dir"])
            .arg(dir.join("data"))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("failed to start kube-sim")?;
        let mut sim = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            ca_pem: String::new(),
            token: String::new(),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let text = loop {
            if let Ok(text) = std::fs::read_to_string(&kubeconfig) {
                break text;
            }
            if Instant::now() > deadline {
                bail!("kube-sim wrote no kubeconfig within 30 s");
            }
            std::thread::sleep(Duration::from_micros(200));
        };
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.trim().strip_prefix(name))
                .with_context(|| format!("no {name} in the kubeconfig"))
        };
        sim.addr = field("server: https://")?.parse()?;
        sim.token = field("token: ")?.to_owned();
        sim.ca_pem = String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(field("certificate-authority-data: ")?)?,
        )?;
        Ok(sim)
    }

    /// `VmHWM` in KiB.
    fn peak_rss(&self) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .context("no VmHWM in /proc status")
    }
}

impl Drop for KubeSim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn mib(kib: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let value = kib as f64 / 1024.0;
    format!("{value:.1} MiB")
}

fn per_second(count: usize, elapsed: Duration) -> String {
    #[allow(clippy::cast_precision_loss)]
    let rate = count as f64 / elapsed.as_secs_f64().max(1e-9);
    format!("{rate:.0} req/s")
}

/// A keep-alive HTTPS connection to the API as its administrator, as kubectl or a client makes.
struct Connection {
    sender: SendRequest<Full<Bytes>>,
    authorization: String,
}

async fn connect(sim: &KubeSim) -> Result<Connection> {
    let stream = agent_sandbox_sim::test_support::tls_connect(&sim.ca_pem, sim.addr).await?;
    stream.get_ref().0.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(Connection {
        sender,
        authorization: format!("Bearer {}", sim.token),
    })
}

async fn call(
    connection: &mut Connection,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> Result<(StatusCode, Bytes)> {
    let sender = &mut connection.sender;
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "kube-sim")
        .header("authorization", &connection.authorization)
        .header("content-type", "application/json")
        .body(Full::new(
            body.map(|b| Bytes::from(b.to_string())).unwrap_or_default(),
        ))?;
    sender.ready().await?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    Ok((status, response.into_body().collect().await?.to_bytes()))
}

fn startup(root: &Path, options: Options) -> Result<Vec<Row>> {
    let binary = build(root)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut samples = Samples::with_capacity(20);
    let mut hwm = 0;
    for index in 0..options.iterations(20) {
        let start = Instant::now();
        let sim = KubeSim::start(&binary, &format!("startup-{index}"), "none")?;
        let (status, _) = rt.block_on(async {
            let mut sender = connect(&sim).await?;
            call(&mut sender, Method::GET, "/healthz", None).await
        })?;
        samples.push(start.elapsed());
        if status != StatusCode::OK {
            bail!("/healthz answered {status}");
        }
        hwm = sim.peak_rss()?;
    }
    Ok(vec![
        Row::new("sim/startup")
            .median(format_duration(samples.median()))
            .p99(format_duration(samples.p99()))
            .peak_rss(mib(hwm))
            .notes(format!(
                "{} starts of the release binary; ends at the first /healthz answer",
                samples.len()
            )),
    ])
}

fn api(root: &Path, options: Options) -> Result<Vec<Row>> {
    let binary = build(root)?;
    let sim = KubeSim::start(&binary, "api", "none")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let count = options.iterations(2000);
    let (gets, creates, get_elapsed, create_elapsed) = rt.block_on(async {
        let mut sender = connect(&sim).await?;
        let mut creates = Samples::with_capacity(count);
        let started = Instant::now();
        for index in 0..count {
            let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
                              "metadata": {"name": format!("cm-{index}")},
                              "data": {"key": "value"}});
            let start = Instant::now();
            let (status, _) = call(
                &mut sender,
                Method::POST,
                "/api/v1/namespaces/default/configmaps",
                Some(&body),
            )
            .await?;
            creates.push(start.elapsed());
            if status != StatusCode::CREATED {
                bail!("create answered {status}");
            }
        }
        let create_elapsed = started.elapsed();
        let mut gets = Samples::with_capacity(count);
        let started = Instant::now();
        for index in 0..count {
            let path = format!("/api/v1/namespaces/default/configmaps/cm-{index}");
            let start = Instant::now();
            let (status, _) = call(&mut sender, Method::GET, &path, None).await?;
            gets.push(start.elapsed());
            if status != StatusCode::OK {
                bail!("get answered {status}");
            }
        }
        anyhow::Ok((gets, creates, started.elapsed(), create_elapsed))
    })?;
    let hwm = sim.peak_rss()?;
    Ok(vec![
        Row::new("sim/api-get")
            .median(format_duration(gets.median()))
            .p99(format_duration(gets.p99()))
            .throughput(per_second(gets.len(), get_elapsed))
            .peak_rss(mib(hwm))
            .notes(format!("{} GETs of a ConfigMap, 1 connection", gets.len())),
        Row::new("sim/api-create")
            .median(format_duration(creates.median()))
            .p99(format_duration(creates.p99()))
            .throughput(per_second(creates.len(), create_elapsed))
            .peak_rss(mib(hwm))
            .notes(format!(
                "{} ConfigMap creates (admission, field ownership, watch event), 1 connection",
                creates.len()
            )),
    ])
}

fn is_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

fn pod_ready(root: &Path, options: Options) -> Result<Vec<Row>> {
    let binary = build(root)?;
    let mut rows = Vec::new();
    for isolation in ["none", "confined"] {
        if isolation == "confined"
            && let Some(why) = agent_sandbox_local::testkit::Tool::Confinement.unavailable()
        {
            eprintln!("bench: sim/pod-ready-confined skipped: {why}");
            continue;
        }
        let sim = KubeSim::start(&binary, &format!("pods-{isolation}"), isolation)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let count = options.iterations(40);
        let samples = rt.block_on(async {
            let mut sender = connect(&sim).await?;
            let mut samples = Samples::with_capacity(count);
            for index in 0..count {
                let name = format!("rt-{index}");
                let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                    "spec": {"containers": [{"name": "runtime", "image": "sandbox-runtime:bench"}]}});
                let start = Instant::now();
                let (status, _) = call(
                    &mut sender,
                    Method::POST,
                    "/api/v1/namespaces/default/pods",
                    Some(&pod),
                )
                .await?;
                if status != StatusCode::CREATED {
                    bail!("pod create answered {status}");
                }
                let path = format!("/api/v1/namespaces/default/pods/{name}");
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    let (_, body) = call(&mut sender, Method::GET, &path, None).await?;
                    if is_ready(&serde_json::from_slice(&body)?) {
                        break;
                    }
                    if Instant::now() > deadline {
                        bail!("pod {name} not Ready within 30 s");
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                samples.push(start.elapsed());
                let (status, _) = call(
                    &mut sender,
                    Method::DELETE,
                    &format!("{path}?gracePeriodSeconds=0"),
                    None,
                )
                .await?;
                if status != StatusCode::OK {
                    bail!("pod delete answered {status}");
                }
            }
            anyhow::Ok(samples)
        })?;
        let hwm = sim.peak_rss()?;
        rows.push(
            Row::new(format!("sim/pod-ready-{isolation}"))
                .median(format_duration(samples.median()))
                .p99(format_duration(samples.p99()))
                .peak_rss(mib(hwm))
                .notes(format!(
                    "{} runtime pods: schedule, IP, spawn, TCP readiness (polled by GET every 1 ms); isolation {isolation}",
                    samples.len()
                )),
        );
    }
    Ok(rows)
}
