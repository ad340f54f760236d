//! A real Kubernetes node joined to the control plane of [`crate::control_plane`]: containerd
//! (its CRI plugin, runtimes `runc` and `gvisor`), the real kubelet, the CNI plugins `bridge`,
//! `host-local`, `portmap` and `loopback`, and a real NetworkPolicy enforcer ([`Enforcer`]:
//! `kube-network-policies`, or `kube-router` where the kernel lacks what that needs), from the
//! binaries `cargo xtask tools --node` builds and Debian's `runc`, `catatonit`, `iptables` and
//! `ipset`.
//!
//! [`RealNode::start`] must run inside the namespaces of [`crate::netns::Layout::Node`]: a
//! network namespace where the CNI bridge routes the pod range, a private mount namespace
//! (containerd's overlay and shm mounts, the kubelet's volumes, a fresh `/run` for shim
//! sockets and the enforcer's in-cluster credentials), and a PID namespace whose end kills
//! every process of the run. Within it the node keeps everything in one scratch directory:
//! containerd's root and state, the kubelet's root and pod logs, the CNI configuration and
//! address leases, and every log. Its pods' cgroups live under one cgroup of the run's own in
//! every hierarchy ([`crate::netns::NODE_CGROUP_ENV`]).
//!
//! The pause image is Debian's static `catatonit` in a one-layer image imported under the
//! name containerd's CRI plugin is told to use; [`RealNode::import_images`] imports more (OCI
//! archives). gVisor's `runsc` runs through containerd's runc shim (`BinaryName`, see
//! `RealNode::runsc_adapter` on why a script of ours sits between): gVisor's own shim sets an OOM score, which needs
//! `CAP_SYS_RESOURCE`, and the bounding set of these machines lacks it. Dropping the node (or
//! [`RealNode::stop`]) kills the enforcer and the kubelet, removes every pod sandbox through
//! the CRI, stops containerd, unmounts what is left under the scratch directory and removes
//! the node's cgroups.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use serde_json::json;

use agent_sandbox_local::testkit::{CNI_PLUGINS, NODE_PROGRAMS};
use agent_sandbox_local::wait::{Check, wait_for};

use crate::control_plane::{ControlPlane, die_with_this_process, log_tail};
use crate::error::{Error, Result};
use crate::netns::{NODE_CGROUP_ENV, POD_NETWORK};
use crate::oci_archive::{LayerFile, OneLayerImage};

/// The node's name.
pub const NODE: &str = "node-1";
/// The node's address: on `lo` of the run's namespace, not a loopback address (the kubelet
/// refuses those as node IPs), named by the kubelet's serving certificate.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 243, 0, 1);
/// The pods' subnet on this node (the first /24 of [`POD_NETWORK`]) and its gateway, the
/// bridge's address.
pub const POD_SUBNET: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 244, 0, 0), 24);
const POD_GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
/// The CNI bridge.
const BRIDGE: &str = "cni0";
/// The image containerd's CRI plugin runs as every pod's sandbox.
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";
/// containerd's namespace of the CRI plugin, where pods' images must be.
const CRI_NAMESPACE: &str = "k8s.io";
/// The RuntimeClasses the node offers, and the containerd runtimes (handlers) behind them.
pub const RUNTIME_CLASSES: [&str; 2] = ["runc", "gvisor"];
/// The program that enforces NetworkPolicies on the node: SIG Network's reference where the
/// kernel lets it work, else kube-router's NetworkPolicy controller. Both are real
/// implementations nobody here wrote; which one ran is in the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Enforcer {
    /// `kube-network-policies`, the SIG Network reference: nftables rules, each connection's
    /// first packet handed to its verdict through nftables' queue statement.
    KubeNetworkPolicies,
    /// `kube-router --run-firewall` alone: iptables chains per pod and ipsets of pod
    /// addresses, for kernels without nftables' queue statement (`CONFIG_NFT_QUEUE`).
    KubeRouter,
}

impl Enforcer {
    /// The reference where this kernel has nftables' queue statement, else kube-router.
    pub fn for_this_kernel() -> Self {
        match agent_sandbox_local::testkit::Tool::NftQueue.unavailable() {
            None => Self::KubeNetworkPolicies,
            Some(_) => Self::KubeRouter,
        }
    }

    /// Its program (also its ServiceAccount and ClusterRole in `kube-system`, and its log's
    /// name).
    pub fn program(self) -> &'static str {
        match self {
            Self::KubeNetworkPolicies => "kube-network-policies",
            Self::KubeRouter => "kube-router",
        }
    }

    /// What a report says about it: its name, and for kube-router why not the reference.
    pub fn describe(self) -> String {
        match self {
            Self::KubeNetworkPolicies => {
                "kube-network-policies (the SIG Network reference, nftables)".to_owned()
            }
            Self::KubeRouter => format!(
                "kube-router's NetworkPolicy controller (iptables, ipsets), not the reference \
                 kube-network-policies: {}",
                agent_sandbox_local::testkit::Tool::NftQueue
                    .unavailable()
                    .unwrap_or_default()
            ),
        }
    }
}

/// Within this, each step of the start is done (usually in well under a tenth).
const STEP: Duration = Duration::from_secs(120);
/// kube-proxy's health and metrics addresses (in the node's network namespace).
const PROXY_HEALTHZ: &str = "127.0.0.1:10256";
const PROXY_METRICS: &str = "127.0.0.1:10249";

/// Bound on each command the node runs (`ctr`, `crictl`).
const COMMAND_WITHIN: Duration = Duration::from_secs(60);

/// The node's binaries: those `cargo xtask tools --node` builds (programs in one directory,
/// CNI plugins in `../cni` next to it) and Debian's `runc` and `catatonit`.
#[derive(Clone, Debug)]
pub struct NodeTools {
    bin_dir: PathBuf,
    cni_dir: PathBuf,
    runc: PathBuf,
    catatonit: PathBuf,
}

impl NodeTools {
    /// The binaries with the programs in `bin_dir`, `runc` and `catatonit` from `PATH`; fails
    /// naming the first one missing and how to get it.
    pub fn in_dir(bin_dir: impl Into<PathBuf>) -> Result<Self> {
        let bin_dir = bin_dir.into();
        let cni_dir = bin_dir
            .parent()
            .map(|parent| parent.join("cni"))
            .unwrap_or_default();
        for path in NODE_PROGRAMS
            .iter()
            .map(|name| bin_dir.join(name))
            .chain(CNI_PLUGINS.iter().map(|name| cni_dir.join(name)))
        {
            if !path.is_file() {
                return Err(Error::Config(format!(
                    "{} is missing: run `cargo xtask tools --node` (it builds the node from its \
                     Go modules)",
                    path.display()
                )));
            }
        }
        let on_path = |name: &str, package: &str| {
            let path = std::env::var_os("PATH").unwrap_or_default();
            std::env::split_paths(&path)
                .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
                .map(|dir| dir.join(name))
                .find(|candidate| candidate.is_file())
                .ok_or_else(|| {
                    Error::Config(format!(
                        "{name} is not installed: apt-get install {package} (bash .ci/run \
                         installs it)"
                    ))
                })
        };
        Ok(Self {
            runc: on_path("runc", "runc")?,
            catatonit: on_path("catatonit", "catatonit")?,
            bin_dir,
            cni_dir,
        })
    }

    /// The path of one program of `cargo xtask tools --node` (`kubelet`, `crictl`, ...).
    pub fn path(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }
}

/// One process of the node.
struct Process {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

/// The running node.
pub struct RealNode {
    dir: tempfile::TempDir,
    tools: NodeTools,
    processes: Vec<Process>,
    /// containerd's socket.
    socket: PathBuf,
    /// The run's cgroup (below each hierarchy's root).
    cgroup: String,
    /// The admin's kubeconfig (the control plane's).
    kubeconfig: PathBuf,
    /// The NetworkPolicy enforcer it runs.
    enforcer: Enforcer,
}

impl std::fmt::Debug for RealNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealNode")
            .field("dir", &self.dir.path())
            .field("socket", &self.socket)
            .field(
                "processes",
                &self.processes.iter().map(|p| p.name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// Why the node cannot start in this process: it is not inside the node's namespaces.
fn outside_namespaces() -> Error {
    Error::Config(format!(
        "a real node must run inside the namespaces of netns::run_inside_as(Layout::Node) \
         ({NODE_CGROUP_ENV} is not set)"
    ))
}

impl RealNode {
    /// Starts containerd, the kubelet (joined to `plane` as [`NODE`] with the node's
    /// credentials) and the NetworkPolicy enforcer, creates the RuntimeClasses, and returns once
    /// the Node is Ready. `plane` must have been started with
    /// [`ControlPlane::start_for_node_at`] for [`NODE`] at [`NODE_IP`].
    pub async fn start(plane: &ControlPlane, tools: NodeTools) -> Result<Self> {
        let started = Instant::now();
        let cgroup = std::env::var(NODE_CGROUP_ENV).map_err(|_| outside_namespaces())?;
        if plane.node().node != NODE {
            return Err(Error::Config(format!(
                "the control plane's node is {}, this node is {NODE}",
                plane.node().node
            )));
        }
        let dir = crate::cluster::scratch_dir()?;
        let mut node = Self {
            socket: dir.path().join("containerd.sock"),
            enforcer: Enforcer::for_this_kernel(),
            kubeconfig: plane.kubeconfig().to_path_buf(),
            dir,
            tools,
            processes: Vec::new(),
            cgroup,
        };
        node.network()?;
        make_cgroups(&node.cgroup)?;
        node.start_containerd().await?;
        let pause = node.dir.path().join("pause.tar");
        OneLayerImage {
            name: PAUSE_IMAGE.to_owned(),
            entrypoint: vec!["/pause".to_owned(), "-P".to_owned()],
            files: vec![LayerFile {
                image_path: "/pause".to_owned(),
                source: node.tools.catatonit.clone(),
            }],
        }
        .write_to(&pause)?;
        node.import_images(&[pause.as_path()]).await?;
        node.start_kubelet(plane)?;
        node.wait_ready(plane).await?;
        for handler in RUNTIME_CLASSES {
            plane
                .kubectl_stdin(
                    &["apply", "-f", "-"],
                    &json!({
                        "apiVersion": "node.k8s.io/v1",
                        "kind": "RuntimeClass",
                        "metadata": { "name": handler },
                        "handler": handler,
                    })
                    .to_string(),
                )
                .await?;
        }
        node.start_enforcer(plane).await?;
        node.start_proxy(plane).await?;
        eprintln!(
            "e2e: node {NODE} ready in {:.1} s (containerd {}, {}); NetworkPolicies enforced by {}",
            started.elapsed().as_secs_f64(),
            node.socket.display(),
            node.dir.path().display(),
            node.enforcer.describe()
        );
        Ok(node)
    }

    /// The node's address and the CNI configuration (the bridge gets the gateway address
    /// when the first pod comes; the pod range is routed by it, not locally).
    fn network(&self) -> Result<()> {
        run_checked(
            Command::new("ip").args(["addr", "add", &format!("{NODE_IP}/32"), "dev", "lo"]),
            "ip addr add (the node's address)",
        )?;
        let conf_dir = self.dir.path().join("cni-conf");
        std::fs::create_dir_all(&conf_dir).map_err(Error::io("create", &conf_dir))?;
        let (subnet, prefix) = POD_SUBNET;
        let conflist = json!({
            "cniVersion": "1.0.0",
            "name": "e2e-node",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": true,
                    // As a real node does, traffic leaving the pod subnet leaves with the
                    // node's address (the run's stand-in for the internet routes only its own
                    // link back).
                    "ipMasq": true,
                    "ipMasqBackend": "nftables",
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{ "subnet": format!("{subnet}/{prefix}"), "gateway": POD_GATEWAY.to_string() }]],
                        // As on a real cluster, everything goes through the node, whose
                        // namespace routes what there is: the pod range, the node's address,
                        // Services' virtual IPs (translated by kube-proxy's rules) and the run's
                        // stand-in for the internet.
                        "routes": [{ "dst": "0.0.0.0/0" }],
                        "dataDir": self.dir.path().join("cni-leases"),
                    },
                },
                { "type": "portmap", "backend": "nftables", "capabilities": { "portMappings": true } },
            ],
        });
        let path = conf_dir.join("10-e2e-node.conflist");
        std::fs::write(&path, conflist.to_string()).map_err(Error::io("write", &path))
    }

    async fn start_containerd(&mut self) -> Result<()> {
        let root = self.dir.path();
        let runtime = r#"[plugins."io.containerd.cri.v1.runtime"]"#;
        let config = format!(
            r#"version = 3
root = "{root}/containerd-root"
state = "{root}/containerd-state"
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/containerd-opt"
[plugins."io.containerd.nri.v1.nri"]
  disable = true
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"
{runtime}
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{root}/cni-conf"
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.gvisor]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.gvisor.options]
        BinaryName = "{runsc}"
"#,
            root = root.display(),
            socket = self.socket.display(),
            cni_bin = self.tools.cni_dir.display(),
            runc = self.tools.runc.display(),
            runsc = self.runsc_adapter()?.display(),
        );
        let path = root.join("containerd.toml");
        std::fs::write(&path, config).map_err(Error::io("write", &path))?;
        let args = vec![format!("--config={}", path.display())];
        self.spawn("containerd", &args, &[])?;
        let socket = self.socket.clone();
        wait_for(
            &format!("containerd to listen on {}", socket.display()),
            STEP,
            || {
                let alive = self.check_alive();
                let listening = socket.exists();
                async move {
                    alive?;
                    Ok::<_, Error>(if listening {
                        Check::Done(())
                    } else {
                        Check::NotYet("no socket yet".to_owned())
                    })
                }
            },
        )
        .await?;
        self.ctr(&["version"]).await.map(drop)
    }

    /// The `gvisor` handler's `BinaryName`: the real `runsc`, adapted to containerd's runc
    /// shim, which gVisor's own shim (`containerd-shim-runsc-v1`) would not need; that shim
    /// cannot run here (it sets its OOM score to -999, which needs `CAP_SYS_RESOURCE`, absent
    /// from this machine's bounding set). Two things differ from runc:
    /// - `runsc create` writes the *sandbox's* PID into `--pid-file` for every container of a
    ///   pod, so the shim would never see a container's own exit (its pod stays Terminating).
    ///   For a pod's container (not its pause container) the adapter starts a watcher in its
    ///   place: it waits until the container has started, then `runsc wait`s for it and exits
    ///   with its exit status; the shim, the reaper of the watcher, takes that as the
    ///   container's exit.
    /// - `runsc start` gives a pod's container its own stdio, and the shim reads what `start`
    ///   prints until every writer has closed it (it would wait for the container to end). The
    ///   watcher holds the stdio `create` got (the container's pipes, which the shim copies to
    ///   the kubelet's log), and `start` runs with those; the pause container's `start` prints
    ///   to `<dir>/runsc-start.log`.
    ///
    /// - A `kill` of a container or sandbox that has already stopped fails in runsc with "is
    ///   not running", which the shim does not recognise as "already gone" (it looks for
    ///   runc's "container not running"), so the pod's sandbox could never be stopped; the
    ///   adapter adds runc's words.
    ///
    /// Every other subcommand (`state`, `delete`, ...) runs as is.
    fn runsc_adapter(&self) -> Result<PathBuf> {
        use std::os::unix::fs::PermissionsExt as _;
        let path = self.dir.path().join("runsc-under-runc-shim");
        let watchers = self.dir.path().join("runsc-watchers");
        std::fs::create_dir_all(&watchers).map_err(Error::io("create", &watchers))?;
        let script = format!(
            r#"#!/bin/sh
runsc='{runsc}'
watchers='{watchers}'
globals='' sub='' bundle='' pidfile='' previous=''
for arg in "$@"; do
  if [ -z "$sub" ]; then
    case "$arg" in create|start|kill) sub=$arg ;; *) globals="$globals $arg" ;; esac
  fi
  case "$previous" in --bundle|-b) bundle=$arg ;; --pid-file) pidfile=$arg ;; esac
  previous=$arg
  id=$arg
done
case "$sub" in
create)
  "$runsc" "$@" || exit
  if [ -n "$pidfile" ] && grep -q '"io.kubernetes.cri.container-type": *"container"' "$bundle/config.json"; then
    # An asynchronous list's stdin is /dev/null: the container's is kept on fd 3 for it.
    exec 3<&0
    (
      exec 0<&3 3<&-
      until state=$("$runsc" $globals state "$id" 2>/dev/null)         && ! printf '%s' "$state" | grep -q '"status": *"created"'; do
        [ -n "$state" ] || exit 255
        sleep 0.1
      done
      status=$("$runsc" $globals wait "$id" 2>/dev/null | sed -n 's/.*"exitStatus": *\([0-9]*\).*//p')
      exit "${{status:-255}}"
    ) &
    printf '%s' $! > "$watchers/$id"
    printf '%s' $! > "$pidfile"
  fi
  ;;
start)
  if [ -f "$watchers/$id" ]; then
    watcher=$(cat "$watchers/$id")
    exec "$runsc" "$@" </proc/$watcher/fd/0 >/proc/$watcher/fd/1 2>/proc/$watcher/fd/2
  fi
  exec "$runsc" "$@" >>'{log}' 2>&1
  ;;
kill)
  # The shim takes a kill of a container already gone for success only when the runtime's
  # output says "container not running" (runc's words); runsc says "sandbox is not running".
  output=$("$runsc" "$@" 2>&1) && exit 0
  code=$?
  printf '%s\n' "$output"
  case "$output" in *"is not running"*) echo "container not running" ;; esac
  exit "$code"
  ;;
*)
  exec "$runsc" "$@"
  ;;
esac
"#,
            log = self.dir.path().join("runsc-start.log").display(),
            runsc = self.tools.path("runsc").display(),
            watchers = watchers.display(),
        );
        std::fs::write(&path, script).map_err(Error::io("write", &path))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .map_err(Error::io("make executable", &path))?;
        Ok(path)
    }

    fn start_kubelet(&mut self, plane: &ControlPlane) -> Result<()> {
        let root = self.dir.path().to_path_buf();
        let credentials = plane.node();
        let resolv = root.join("resolv.conf");
        std::fs::write(&resolv, "").map_err(Error::io("write", &resolv))?;
        let config = json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": false,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": format!("/{}", self.cgroup),
            "containerRuntimeEndpoint": self.cri_endpoint(),
            "address": "0.0.0.0",
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "authentication": {
                "anonymous": { "enabled": false },
                "webhook": { "enabled": true },
                "x509": { "clientCAFile": credentials.client_ca },
            },
            "authorization": { "mode": "Webhook" },
            "tlsCertFile": credentials.serving_cert,
            "tlsPrivateKeyFile": credentials.serving_key,
            "resolvConf": resolv,
            "podLogsDir": root.join("pod-logs"),
            "failSwapOn": false,
            "registerNode": true,
            // The imported images are the only ones: nothing may collect them, and the shared
            // machine's disk must not evict the test's pods.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "serializeImagePulls": false,
            "syncFrequency": "10s",
            "nodeStatusUpdateFrequency": "5s",
        });
        let path = root.join("kubelet-config.json");
        std::fs::write(&path, config.to_string()).map_err(Error::io("write", &path))?;
        let args = vec![
            format!("--config={}", path.display()),
            format!("--kubeconfig={}", credentials.kubeconfig.display()),
            format!("--root-dir={}", root.join("kubelet").display()),
            format!("--hostname-override={NODE}"),
            format!("--node-ip={NODE_IP}"),
            "--v=1".to_owned(),
        ];
        self.spawn("kubelet", &args, &[])
    }

    async fn wait_ready(&mut self, plane: &ControlPlane) -> Result<()> {
        let nodes: Api<Node> = Api::all(plane.client().await?);
        wait_for(&format!("node {NODE} to be Ready"), STEP, || {
            let nodes = nodes.clone();
            let alive = self.check_alive();
            async move {
                alive?;
                let seen = match nodes.get_opt(NODE).await {
                    Ok(Some(node)) => {
                        let ready = node
                            .status
                            .and_then(|status| status.conditions)
                            .unwrap_or_default()
                            .into_iter()
                            .find(|condition| condition.type_ == "Ready");
                        match ready {
                            Some(condition) if condition.status == "True" => {
                                return Ok(Check::Done(()));
                            }
                            Some(condition) => format!(
                                "Ready={}: {}",
                                condition.status,
                                condition.message.unwrap_or_default()
                            ),
                            None => "no Ready condition".to_owned(),
                        }
                    }
                    Ok(None) => "not registered".to_owned(),
                    Err(error) => error.to_string(),
                };
                Ok::<_, Error>(Check::NotYet(seen))
            }
        })
        .await
    }

    /// The node's NetworkPolicy enforcer ([`Enforcer`]), as a ServiceAccount of its own
    /// granted what its install manifest grants.
    async fn start_enforcer(&mut self, plane: &ControlPlane) -> Result<()> {
        match self.enforcer {
            Enforcer::KubeNetworkPolicies => self.start_kube_network_policies(plane).await,
            Enforcer::KubeRouter => self.start_kube_router(plane).await,
        }
    }

    /// kube-network-policies (list and watch pods, namespaces, NetworkPolicies); it reads
    /// in-cluster credentials only, so they go where a pod has them, in the namespace's own
    /// `/run`.
    async fn start_kube_network_policies(&mut self, plane: &ControlPlane) -> Result<()> {
        let name = Enforcer::KubeNetworkPolicies.program();
        apply_enforcer_rbac(
            plane,
            name,
            json!([
                { "apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["list", "watch"] },
                { "apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["list", "watch"] },
            ]),
        )
        .await?;
        let token = plane.service_account_token("kube-system", name).await?;
        let secrets = Path::new("/run/secrets/kubernetes.io/serviceaccount");
        std::fs::create_dir_all(secrets).map_err(Error::io("create", secrets))?;
        for (file, contents) in [("token", token.as_str()), ("ca.crt", plane.ca_pem())] {
            let path = secrets.join(file);
            std::fs::write(&path, contents).map_err(Error::io("write", &path))?;
        }
        let port = plane
            .server()
            .rsplit(':')
            .next()
            .unwrap_or_default()
            .to_owned();
        let args = vec![
            format!("--hostname-override={NODE}"),
            // NRI would give it pod IPs straight from containerd; the API's are enough here.
            "--disable-nri".to_owned(),
            "--metrics-bind-address=127.0.0.1:0".to_owned(),
            "--nfqueue-id=100".to_owned(),
            "--v=2".to_owned(),
        ];
        self.spawn(
            name,
            &args,
            &[
                ("KUBERNETES_SERVICE_HOST", "127.0.0.1".to_owned()),
                ("KUBERNETES_SERVICE_PORT", port),
            ],
        )
    }

    /// kube-router with its NetworkPolicy controller alone (no routing, no service proxy, no
    /// CNI of its own): iptables chains per pod, ipsets of pod addresses. Its informers cover
    /// nodes, Services, Endpoints and EndpointSlices too, which it must be able to read.
    /// Bridged traffic between pods passes the bridge's netfilter hooks only with
    /// `bridge-nf-call-iptables`, set in the node's network namespace. Ready once its chains
    /// hang off `FORWARD`.
    async fn start_kube_router(&mut self, plane: &ControlPlane) -> Result<()> {
        let name = Enforcer::KubeRouter.program();
        apply_enforcer_rbac(
            plane,
            name,
            json!([
                { "apiGroups": [""], "resources": ["pods", "namespaces", "nodes", "services", "endpoints"], "verbs": ["get", "list", "watch"] },
                { "apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"] },
                { "apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "list", "watch"] },
                { "apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch", "update"] },
            ]),
        )
        .await?;
        let bridge_hook = Path::new("/proc/sys/net/bridge/bridge-nf-call-iptables");
        std::fs::write(bridge_hook, "1").map_err(Error::io("write", bridge_hook))?;
        let kubeconfig = plane
            .service_account_kubeconfig("kube-system", name, "kube-router.kubeconfig")
            .await?;
        let args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--hostname-override={NODE}"),
            "--run-firewall=true".to_owned(),
            "--run-router=false".to_owned(),
            "--run-service-proxy=false".to_owned(),
            "--enable-cni=false".to_owned(),
            format!(
                "--service-cluster-ip-range={}",
                crate::control_plane::SERVICE_CIDR
            ),
            // Its health server would listen on every address of the node's namespace.
            "--health-port=0".to_owned(),
            "--metrics-port=0".to_owned(),
            "--v=2".to_owned(),
        ];
        self.spawn(name, &args, &[])?;
        wait_for(
            "kube-router to install its NetworkPolicy chains",
            STEP,
            || {
                let alive = self.check_alive();
                async move {
                    alive?;
                    let hooked = Command::new("iptables")
                        .args(["-w", "5", "-S", "FORWARD"])
                        .stdin(Stdio::null())
                        .stderr(Stdio::null())
                        .output()
                        .map_err(Error::io("run", "iptables"))?;
                    let rules = String::from_utf8_lossy(&hooked.stdout);
                    Ok::<_, Error>(if rules.contains("-j KUBE-ROUTER-FORWARD") {
                        Check::Done(())
                    } else {
                        Check::NotYet(format!("iptables -S FORWARD:\n{rules}"))
                    })
                }
            },
        )
        .await
    }

    /// kube-proxy in nftables mode, as the ServiceAccount `kube-system/kube-proxy` bound to the
    /// API server's own `system:node-proxier` role: pods reach Services (the `kubernetes`
    /// Service first of all, through which the controller and the router find the API server).
    async fn start_proxy(&mut self, plane: &ControlPlane) -> Result<()> {
        let rbac = json!({
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                { "apiVersion": "v1", "kind": "ServiceAccount",
                  "metadata": { "name": "kube-proxy", "namespace": "kube-system" } },
                { "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                  "metadata": { "name": "e2e-kube-proxy" },
                  "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node-proxier" },
                  "subjects": [{ "kind": "ServiceAccount", "name": "kube-proxy", "namespace": "kube-system" }] },
            ],
        });
        plane
            .kubectl_stdin(&["apply", "-f", "-"], &rbac.to_string())
            .await?;
        let kubeconfig = plane
            .service_account_kubeconfig("kube-system", "kube-proxy", "kube-proxy.kubeconfig")
            .await?;
        let (range, prefix) = POD_NETWORK;
        let args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            "--proxy-mode=nftables".to_owned(),
            format!("--hostname-override={NODE}"),
            format!("--cluster-cidr={range}/{prefix}"),
            // The conntrack table is the machine's: leave its size alone.
            "--conntrack-max-per-core=0".to_owned(),
            // The node has a network namespace of its own: fixed ports cannot collide.
            format!("--metrics-bind-address={PROXY_METRICS}"),
            format!("--healthz-bind-address={PROXY_HEALTHZ}"),
            "--v=2".to_owned(),
        ];
        self.spawn("kube-proxy", &args, &[])?;
        // Healthy once it has written the Services' rules (200 from `/healthz`).
        wait_for("kube-proxy to program the Services", STEP, || {
            let alive = self.check_alive();
            async move {
                alive?;
                Ok::<_, Error>(match http_status(PROXY_HEALTHZ, "/healthz").await {
                    Ok(200) => Check::Done(()),
                    Ok(status) => Check::NotYet(format!("/healthz answers {status}")),
                    Err(error) => Check::NotYet(format!("/healthz: {error}")),
                })
            }
        })
        .await
    }

    /// Starts one program of the node with its output in `<dir>/<name>.log`.
    fn spawn(&mut self, name: &'static str, args: &[String], env: &[(&str, String)]) -> Result<()> {
        let log = self.dir.path().join(format!("{name}.log"));
        let file = std::fs::File::create(&log).map_err(Error::io("create", &log))?;
        let errors = file.try_clone().map_err(Error::io("open", &log))?;
        let program = self.tools.path(name);
        let path = std::env::join_paths([self.tools.bin_dir.clone()].into_iter().chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
        ))
        .map_err(|e| Error::Config(format!("the node's PATH: {e}")))?;
        let mut command = Command::new(&program);
        command
            .args(args)
            .env("PATH", path)
            .envs(env.iter().map(|(key, value)| (key, value)))
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(errors);
        die_with_this_process(&mut command);
        let child = command.spawn().map_err(Error::io("start", &program))?;
        self.processes.push(Process { name, child, log });
        Ok(())
    }

    /// Fails naming the first process that exited, with the end of its log.
    fn check_alive(&mut self) -> Result<()> {
        for process in &mut self.processes {
            if let Ok(Some(status)) = process.child.try_wait() {
                return Err(Error::Config(format!(
                    "{} exited ({status}); the end of {}:\n{}",
                    process.name,
                    process.log.display(),
                    log_tail(&process.log, 25)
                )));
            }
        }
        Ok(())
    }

    /// Imports OCI image archives (`ctr images import`) into the CRI plugin's namespace, where
    /// pods with `imagePullPolicy: Never` find them by the names the archives give.
    pub async fn import_images(&self, archives: &[&Path]) -> Result<()> {
        for archive in archives {
            let path = archive.display().to_string();
            self.ctr(&["-n", CRI_NAMESPACE, "images", "import", &path])
                .await?;
        }
        Ok(())
    }

    /// The CRI endpoint (`unix://…/containerd.sock`), for `crictl --runtime-endpoint` or
    /// another kubelet.
    pub fn cri_endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The admin's kubeconfig of the cluster this node joined.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The scratch directory (every log, containerd's and the kubelet's state).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `crictl <args>` against this node's containerd; its standard output.
    pub async fn crictl(&self, args: &[&str]) -> Result<String> {
        let endpoint = self.cri_endpoint();
        let mut full = vec!["--runtime-endpoint", &endpoint, "--timeout", "30s"];
        full.extend_from_slice(args);
        run_bounded(&self.tools.path("crictl"), &full).await
    }

    /// `crictl ps -a`: every container of the node and its state.
    pub async fn crictl_ps(&self) -> Result<String> {
        self.crictl(&["ps", "-a"]).await
    }

    /// `ctr --address <socket> <args>`; its standard output.
    pub async fn ctr(&self, args: &[&str]) -> Result<String> {
        let socket = self.socket.display().to_string();
        let mut full = vec!["--address", &socket];
        full.extend_from_slice(args);
        run_bounded(&self.tools.path("ctr"), &full).await
    }

    /// The NetworkPolicy enforcer it runs.
    pub fn enforcer(&self) -> Enforcer {
        self.enforcer
    }

    /// The enforcer's log so far.
    pub fn enforcer_log(&self) -> String {
        let log = self
            .dir
            .path()
            .join(format!("{}.log", self.enforcer.program()));
        std::fs::read_to_string(log).unwrap_or_default()
    }

    /// The last `lines` lines of one program's log (`kubelet`, `containerd`, …).
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        log_tail(&self.dir.path().join(format!("{name}.log")), lines)
    }

    /// Tears the node down (see the module's docs); also what dropping it does.
    pub fn stop(&mut self) {
        let containerd_runs = self.processes.iter().any(|p| p.name == "containerd");
        for process in self.processes.iter_mut().rev() {
            if process.name != "containerd" {
                let _ = process.child.kill();
                let _ = process.child.wait();
            }
        }
        // Every sandbox with its containers and its CNI attachment, through the CRI.
        // gVisor's sandboxes do not stop through the runc shim (it does not take runsc's
        // "sandbox is not running" for "already stopped"): they cost the timeout, and their
        // processes end with the run's PID namespace.
        if containerd_runs {
            let endpoint = self.cri_endpoint();
            let _ = run_blocking(Command::new(self.tools.path("crictl")).args([
                "--runtime-endpoint",
                &endpoint,
                "--timeout",
                "30s",
                "rmp",
                "--all",
                "--force",
            ]));
        }
        for process in &mut self.processes {
            let _ = process.child.kill();
            let _ = process.child.wait();
        }
        self.processes.clear();
        kill_cgroup_processes(&self.cgroup);
        unmount_below(self.dir.path());
        crate::netns::remove_cgroups(&self.cgroup);
        reset_network();
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Takes out of the run's network namespace what the node put there (kube-proxy's and the
/// enforcer's rules and sets, the CNI bridge, the node's address), so that another node can
/// start in it (the bench's cases start one each); the namespace's end would take them too.
fn reset_network() {
    let _ = run_blocking(Command::new("nft").args(["flush", "ruleset"]));
    let _ = run_blocking(Command::new("ipset").arg("destroy"));
    let _ = run_blocking(Command::new("ip").args(["link", "del", BRIDGE]));
    let _ = run_blocking(Command::new("ip").args([
        "addr",
        "del",
        &format!("{NODE_IP}/32"),
        "dev",
        "lo",
    ]));
}

/// Makes the run's cgroup in every hierarchy (the kubelet needs its `cgroupRoot` to exist);
/// a new cpuset gets its parent's CPUs and memory nodes, as cgroup v1 starts it with none.
fn make_cgroups(cgroup: &str) -> Result<()> {
    let hierarchies =
        std::fs::read_dir("/sys/fs/cgroup").map_err(Error::io("list", "/sys/fs/cgroup"))?;
    for hierarchy in hierarchies.flatten() {
        let parent = hierarchy.path();
        if !parent.join("cgroup.procs").exists() {
            continue;
        }
        let dir = parent.join(cgroup);
        std::fs::create_dir_all(&dir).map_err(Error::io("create the cgroup", &dir))?;
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(value) = std::fs::read_to_string(parent.join(file)) {
                std::fs::write(dir.join(file), value.trim())
                    .map_err(Error::io("write", dir.join(file)))?;
            }
        }
    }
    Ok(())
}

/// SIGKILLs every process left in the run's cgroup (pods whose sandbox the CRI could not
/// remove), in every hierarchy.
fn kill_cgroup_processes(cgroup: &str) {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for hierarchy in hierarchies.flatten() {
        let mut stack = vec![hierarchy.path().join(cgroup)];
        while let Some(dir) = stack.pop() {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs
                .lines()
                .filter_map(|line| line.trim().parse::<i32>().ok())
            {
                if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
            if let Ok(entries) = std::fs::read_dir(&dir) {
                stack.extend(
                    entries
                        .flatten()
                        .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
                        .map(|entry| entry.path()),
                );
            }
        }
    }
}

/// Lazily unmounts every mount point below `dir` (containerd's rootfs, shm and netns mounts,
/// the kubelet's volumes), innermost first, so that removing the directory removes files only.
fn unmount_below(dir: &Path) {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        // mountinfo escapes spaces and the like as octal; paths of ours have none.
        .map(PathBuf::from)
        .filter(|point| point.starts_with(dir))
        .collect();
    points.sort();
    points.dedup();
    for point in points.iter().rev() {
        let _ = run_blocking(Command::new("umount").arg("--lazy").arg(point));
    }
}

/// A ServiceAccount `kube-system/<name>` bound to a ClusterRole `<name>` with `rules`.
async fn apply_enforcer_rbac(
    plane: &ControlPlane,
    name: &str,
    rules: serde_json::Value,
) -> Result<()> {
    let rbac = json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            { "apiVersion": "v1", "kind": "ServiceAccount",
              "metadata": { "name": name, "namespace": "kube-system" } },
            { "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
              "metadata": { "name": name },
              "rules": rules },
            { "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
              "metadata": { "name": name },
              "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name },
              "subjects": [{ "kind": "ServiceAccount", "name": name, "namespace": "kube-system" }] },
        ],
    });
    plane
        .kubectl_stdin(&["apply", "-f", "-"], &rbac.to_string())
        .await
        .map(drop)
}

/// Runs a command to its end, its output discarded; whether it succeeded.
fn run_blocking(command: &mut Command) -> bool {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Runs a setup command and fails with its own words.
fn run_checked(command: &mut Command, what: &str) -> Result<()> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(Error::io("run", command.get_program()))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "{what} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

/// Runs `program args` within [`COMMAND_WITHIN`]; its standard output, or an error with its
/// own words.
async fn run_bounded(program: &Path, args: &[&str]) -> Result<String> {
    let run = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(COMMAND_WITHIN, run)
        .await
        .map_err(|_| {
            Error::Config(format!(
                "{} {} did not finish within {} s",
                program.display(),
                args.join(" "),
                COMMAND_WITHIN.as_secs()
            ))
        })?
        .map_err(Error::io("run", program))?;
    if !output.status.success() {
        return Err(Error::Config(format!(
            "{} {} failed ({}): {}{}",
            program.display(),
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout).trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The status code of a plain `GET path` on `addr` (a health endpoint on the node).
async fn http_status(addr: &str, path: &str) -> std::io::Result<u16> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut head = [0_u8; 12];
    stream.read_exact(&mut head).await?;
    std::str::from_utf8(&head[9..12])
        .ok()
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other("not an HTTP status line"))
}
