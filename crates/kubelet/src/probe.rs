//! Readiness and liveness probes: parsing a container's probe (sans IO) and running one
//! check.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::images::DefaultReadiness;

/// One check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ProbeAction {
    Http {
        addr: SocketAddr,
        path: String,
        host: String,
    },
    Tcp {
        addr: SocketAddr,
    },
    Exec {
        argv: Vec<String>,
    },
}

/// A probe with its timing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Probe {
    pub(crate) action: ProbeAction,
    pub(crate) initial_delay: Duration,
    pub(crate) period: Duration,
    pub(crate) timeout: Duration,
    pub(crate) success_threshold: u32,
    pub(crate) failure_threshold: u32,
}

fn seconds(probe: &Value, field: &str, default: u64) -> Duration {
    Duration::from_secs(probe.get(field).and_then(Value::as_u64).unwrap_or(default))
}

/// Resolves a probe port: a number, or the name of one of the container's ports.
fn port(value: Option<&Value>, container: &Value) -> Option<u16> {
    let value = value?;
    if let Some(number) = value.as_u64() {
        return u16::try_from(number).ok();
    }
    let name = value.as_str()?;
    if let Ok(number) = name.parse() {
        return Some(number);
    }
    container
        .get("ports")?
        .as_array()?
        .iter()
        .find(|p| p.get("name").and_then(Value::as_str) == Some(name))
        .and_then(|p| p.get("containerPort")?.as_u64())
        .and_then(|n| u16::try_from(n).ok())
}

/// The readiness probe of `container` on `pod_ip`, or the image's default readiness.
pub(crate) fn readiness(
    container: &Value,
    pod_ip: IpAddr,
    default: Option<&DefaultReadiness>,
) -> Option<Probe> {
    let Some(probe) = container.get("readinessProbe") else {
        return default.map(|readiness| Probe {
            action: match readiness {
                DefaultReadiness::Tcp(port) => ProbeAction::Tcp {
                    addr: SocketAddr::new(pod_ip, *port),
                },
                DefaultReadiness::Http { port, path } => ProbeAction::Http {
                    addr: SocketAddr::new(pod_ip, *port),
                    path: path.clone(),
                    host: pod_ip.to_string(),
                },
            },
            initial_delay: Duration::ZERO,
            period: Duration::from_secs(10),
            timeout: Duration::from_secs(1),
            success_threshold: 1,
            failure_threshold: 3,
        });
    };
    parse(probe, container, pod_ip)
}

/// The liveness probe of `container` on `pod_ip` (none by default: a container without one is
/// alive while it runs).
pub(crate) fn liveness(container: &Value, pod_ip: IpAddr) -> Option<Probe> {
    parse(container.get("livenessProbe")?, container, pod_ip)
}

/// A probe's action and timing, with the API's defaults.
fn parse(probe: &Value, container: &Value, pod_ip: IpAddr) -> Option<Probe> {
    let action = if let Some(http) = probe.get("httpGet") {
        let host_ip = http
            .get("host")
            .and_then(Value::as_str)
            .and_then(|h| h.parse().ok())
            .unwrap_or(pod_ip);
        ProbeAction::Http {
            addr: SocketAddr::new(host_ip, port(http.get("port"), container)?),
            path: http
                .get("path")
                .and_then(Value::as_str)
                .unwrap_or("/")
                .to_owned(),
            host: host_ip.to_string(),
        }
    } else if let Some(tcp) = probe.get("tcpSocket") {
        let host_ip = tcp
            .get("host")
            .and_then(Value::as_str)
            .and_then(|h| h.parse().ok())
            .unwrap_or(pod_ip);
        ProbeAction::Tcp {
            addr: SocketAddr::new(host_ip, port(tcp.get("port"), container)?),
        }
    } else if let Some(exec) = probe.get("exec") {
        ProbeAction::Exec {
            argv: exec
                .get("command")?
                .as_array()?
                .iter()
                .filter_map(|a| a.as_str().map(str::to_owned))
                .collect(),
        }
    } else {
        return None;
    };
    Some(Probe {
        action,
        initial_delay: seconds(probe, "initialDelaySeconds", 0),
        period: seconds(probe, "periodSeconds", 10).max(Duration::from_secs(1)),
        timeout: seconds(probe, "timeoutSeconds", 1).max(Duration::from_secs(1)),
        success_threshold: u32::try_from(
            probe
                .get("successThreshold")
                .and_then(Value::as_u64)
                .unwrap_or(1),
        )
        .unwrap_or(1)
        .max(1),
        failure_threshold: u32::try_from(
            probe
                .get("failureThreshold")
                .and_then(Value::as_u64)
                .unwrap_or(3),
        )
        .unwrap_or(3)
        .max(1),
    })
}

async fn http_get(
    addr: SocketAddr,
    path: &str,
    host: &str,
    sockets: Option<&crate::PodSockets>,
) -> std::io::Result<bool> {
    let mut stream = crate::portforward::connect(sockets, addr).await?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}:{}\r\nUser-Agent: kube-probe/sim\r\nAccept: */*\r\nConnection: close\r\n\r\n",
        addr.port()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut head = Vec::new();
    let mut buffer = [0u8; 256];
    while !head.windows(2).any(|w| w == b"\r\n") && head.len() < 4096 {
        let read = stream.read(&mut buffer).await?;
        if read == 0 {
            break;
        }
        head.extend_from_slice(&buffer[..read]);
    }
    let line = String::from_utf8_lossy(&head);
    let code = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .unwrap_or(0);
    Ok((200..400).contains(&code))
}

/// Where an exec probe of a confined container runs: inside it.
#[derive(Debug)]
pub(crate) struct Inside {
    pub(crate) sandbox: std::sync::Arc<crate::sandbox::PodSandbox>,
    /// The container's helper (its process group).
    pub(crate) supervisor: i32,
    pub(crate) workdir: String,
    pub(crate) protections: crate::confine::Protections,
}

/// Runs one check (connecting with sockets from `sockets` when given; an exec probe inside the
/// container when `inside` says where, else in `dir` on the host); a timeout or an error is a
/// failure.
pub(crate) async fn check(
    action: &ProbeAction,
    timeout: Duration,
    env: &std::collections::BTreeMap<String, String>,
    dir: &std::path::Path,
    sockets: Option<&crate::PodSockets>,
    inside: Option<&Inside>,
) -> bool {
    let attempt = async {
        match action {
            ProbeAction::Http { addr, path, host } => {
                http_get(*addr, path, host, sockets).await.unwrap_or(false)
            }
            ProbeAction::Tcp { addr } => crate::portforward::connect(sockets, *addr).await.is_ok(),
            ProbeAction::Exec { argv } => {
                let Some((program, args)) = argv.split_first() else {
                    return false;
                };
                if let Some(inside) = inside {
                    let entered = crate::sandbox::enter(
                        &inside.sandbox,
                        inside.supervisor,
                        argv,
                        env,
                        &inside.workdir,
                        &inside.protections,
                    );
                    let Ok((mut command, held)) = entered else {
                        return false;
                    };
                    let status = command
                        .stdin(std::process::Stdio::null())
                        .stdout(std::process::Stdio::null())
                        .stderr(std::process::Stdio::null())
                        .kill_on_drop(true)
                        .spawn();
                    // The child has its copies of the descriptors now.
                    drop(held);
                    return match status {
                        Ok(mut child) => child.wait().await.is_ok_and(|s| s.success()),
                        Err(_) => false,
                    };
                }
                tokio::process::Command::new(program)
                    .args(args)
                    .env_clear()
                    .envs(env)
                    .current_dir(dir)
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .kill_on_drop(true)
                    .status()
                    .await
                    .is_ok_and(|status| status.success())
            }
        }
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn liveness_probes_have_no_default_and_keep_their_timing() {
        let ip: IpAddr = "10.244.0.9".parse().unwrap();
        assert_eq!(liveness(&json!({}), ip), None);
        let container = json!({"ports": [{"name": "health", "containerPort": 8081}],
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": "health"},
                              "initialDelaySeconds": 5, "periodSeconds": 10}});
        let probe = liveness(&container, ip).unwrap();
        assert_eq!(
            probe.action,
            ProbeAction::Http {
                addr: "10.244.0.9:8081".parse().unwrap(),
                path: "/healthz".into(),
                host: "10.244.0.9".into()
            }
        );
        assert_eq!(probe.initial_delay, Duration::from_secs(5));
        assert_eq!(probe.failure_threshold, 3);
    }

    #[test]
    fn parses_http_probe_with_named_port() {
        let container = json!({"ports": [{"name": "http", "containerPort": 8888}],
            "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 2}});
        let ip: IpAddr = "127.3.4.5".parse().unwrap();
        let probe = readiness(&container, ip, None).unwrap();
        assert_eq!(
            probe.action,
            ProbeAction::Http {
                addr: "127.3.4.5:8888".parse().unwrap(),
                path: "/".into(),
                host: "127.3.4.5".into()
            }
        );
        assert_eq!(probe.period, Duration::from_secs(2));
        assert_eq!(readiness(&json!({}), ip, None), None);
        let default = readiness(&json!({}), ip, Some(&DefaultReadiness::Tcp(8888))).unwrap();
        assert_eq!(
            default.action,
            ProbeAction::Tcp {
                addr: "127.3.4.5:8888".parse().unwrap()
            }
        );
    }

    #[tokio::test]
    async fn checks_succeed_only_against_a_listener() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut buffer = [0u8; 1024];
                let _ = socket.read(&mut buffer).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    .await;
            }
        });
        let env = std::collections::BTreeMap::new();
        let dir = std::env::temp_dir();
        let http = ProbeAction::Http {
            addr,
            path: "/".into(),
            host: "127.0.0.1".into(),
        };
        assert!(check(&http, Duration::from_secs(5), &env, &dir, None, None).await);
        assert!(
            check(
                &ProbeAction::Tcp { addr },
                Duration::from_secs(5),
                &env,
                &dir,
                None,
                None
            )
            .await
        );
        server.abort();
        let _ = server.await;
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed_addr = closed.local_addr().unwrap();
        drop(closed);
        assert!(
            !check(
                &ProbeAction::Tcp { addr: closed_addr },
                Duration::from_secs(5),
                &env,
                &dir,
                None,
                None
            )
            .await
        );
        let exec = ProbeAction::Exec {
            argv: vec!["false".into()],
        };
        let mut path_env = env.clone();
        path_env.insert("PATH".into(), std::env::var("PATH").unwrap_or_default());
        assert!(!check(&exec, Duration::from_secs(5), &path_env, &dir, None, None).await);
    }
}
