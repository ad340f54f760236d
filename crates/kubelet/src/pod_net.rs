//! A network of each pod's own: a bridge per kubelet in the node's network namespace (the
//! kubelet's own as root, else a [`NodeNamespace`] of the kubelet's user) with the first
//! address of the pod range, and per pod a network namespace with one
//! end of a veth pair as `eth0` (the pod IP, a default route through the bridge) and the other
//! end on the bridge. The node forwards and masquerades what pods send elsewhere, forwards the
//! `kubernetes` Service to the API server ([`Bridge::api_forward`]), and enforces each pod's
//! NetworkPolicies inside its namespace ([`PodNet::apply`] with [`netpol::ruleset`]).
//!
//! The kubelet configures with the tools a node has, `ip` (iproute2) and `nft` (nftables), run
//! in the namespaces they configure ([`run_in`]). A pod's namespace is held by a descriptor of
//! the kubelet's; it goes, with its veth pair, when the descriptor is closed and the pod's last
//! process has exited. The kubelet's own connections to pods (probes, port-forward) take their
//! sockets from [`Bridge::sockets`].
//!
//! [`netpol::ruleset`]: crate::netpol::ruleset

use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd, RawFd};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use crate::node_ns::NodeNamespace;

/// Whether this process can give pods networks of their own: `ip` and `nft` that work, and
/// root or user namespaces (checked once). The error says what is missing.
pub(crate) fn available() -> Result<(), String> {
    static FOUND: OnceLock<Result<(), String>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            for (tool, args, package) in [
                ("ip", &["-V"][..], "iproute2"),
                ("nft", &["--version"][..], "nftables"),
            ] {
                let works = Command::new(tool)
                    .args(args)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|status| status.success());
                if !works {
                    return Err(format!(
                        "a network of their own (needs `{tool}`: apt-get install {package})"
                    ));
                }
            }
            if crate::confine::is_root() {
                return Ok(());
            }
            // Without root: a node namespace of this user's (what `NodeNamespace` makes).
            NodeNamespace::possible().map_err(|why| format!("a network of their own ({why})"))
        })
        .clone()
}

/// Runs `program args` (feeding `input` when given) in the user namespace `user` and the
/// network namespace `net` when given (entered in that order, between fork and exec), keeping
/// `keep` open for it; returns an error with its output.
pub(crate) fn run_in(
    user: Option<RawFd>,
    net: Option<RawFd>,
    keep: &[RawFd],
    program: &str,
    args: &[&str],
    input: Option<&str>,
) -> Result<(), String> {
    let mut command = Command::new(program);
    command.args(args);
    crate::process::enter(&mut command, user, net, keep.to_vec());
    output(&mut command, program, args, input)
}

/// The IPv4 routes of this network namespace (destination, prefix length), from
/// `/proc/net/route`.
fn routes() -> Vec<(u32, u32)> {
    let Ok(text) = std::fs::read_to_string("/proc/net/route") else {
        return Vec::new();
    };
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // Little-endian hexadecimal, as the kernel prints them.
            let destination = u32::from_str_radix(fields.get(1)?, 16).ok()?.swap_bytes();
            let mask = u32::from_str_radix(fields.get(7)?, 16).ok()?.swap_bytes();
            Some((destination, mask))
        })
        .collect()
}

/// A /20 in 10.200.0.0/13 that no route of this namespace overlaps (a default route does not
/// count), chosen at random so that kubelets running at once rarely pick the same one. 4094
/// addresses: pod IPs are drawn at random, and a wide range keeps an address from coming back
/// soon after its pod (whose address neighbours may still have cached).
pub(crate) fn free_range() -> Option<(Ipv4Addr, u8)> {
    let routes: Vec<(u32, u32)> = routes()
        .into_iter()
        .filter(|(_, mask)| *mask != 0)
        .collect();
    let base = u32::from(Ipv4Addr::new(10, 200, 0, 0));
    for _ in 0..64 {
        let candidate = base + (fastrand::u32(..128) << 12);
        let mask = 0xffff_f000u32;
        let overlaps = routes.iter().any(|(destination, route_mask)| {
            let common = mask & route_mask;
            candidate & common == destination & common
        });
        if !overlaps {
            return Some((Ipv4Addr::from(candidate), 20));
        }
    }
    None
}

/// Runs `program args` (feeding `input` when given) and returns an error with its output.
fn run(program: &str, args: &[&str], input: Option<&str>) -> Result<(), String> {
    output(Command::new(program).args(args), program, args, input)
}

fn output(
    command: &mut Command,
    program: &str,
    args: &[&str],
    input: Option<&str>,
) -> Result<(), String> {
    let mut child = command
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| format!("cannot run {program}: {error}"))?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(input.as_bytes())
            .map_err(|error| format!("writing to {program}: {error}"))?;
    }
    let output = child
        .wait_with_output()
        .map_err(|error| format!("waiting for {program}: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// A fresh name with `prefix` that fits an interface name (15 bytes).
fn interface_name(prefix: &str) -> String {
    format!("{prefix}{:08x}", fastrand::u32(..))
}

/// The alias of a kubelet's bridge: this and the kubelet's pid.
const ALIAS_PREFIX: &str = "agent-sandbox-kubelet-";

/// Removes the bridges (and their tables) of kubelets whose process is gone: a kubelet killed
/// with SIGKILL leaves its bridge behind; the next one to start here takes it away.
fn sweep() {
    let Ok(output) = Command::new("ip")
        .args(["-o", "link", "show", "type", "bridge"])
        .stderr(Stdio::null())
        .output()
    else {
        return;
    };
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Some(name) = line
            .split(": ")
            .nth(1)
            .map(|n| n.split('@').next().unwrap_or(n))
        else {
            continue;
        };
        let Some(pid) = line
            .split("alias ")
            .nth(1)
            .and_then(|alias| alias.trim().strip_prefix(ALIAS_PREFIX))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run("ip", &["link", "del", name], None);
            let _ = run("nft", &["delete", "table", "ip", name], None);
        }
    }
}

/// The forwarding setting of this namespace before the first bridge, restored after the last.
static FORWARDING: Mutex<(usize, Option<String>)> = Mutex::new((0, None));
const FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

/// The kubelet's bridge.
#[derive(Debug)]
pub(crate) struct Bridge {
    name: String,
    prefix: u8,
    /// The node namespace the bridge is in (`None`: the kubelet's own, as root).
    node: Option<Arc<NodeNamespace>>,
    /// The bridge's address: the pods' gateway and the node's address on their network.
    pub(crate) gateway: Ipv4Addr,
    /// Where pods reach the API server (on the gateway) and where that goes.
    api: Option<(std::net::TcpListener, SocketAddr)>,
}

impl Bridge {
    /// Makes the bridge for pods in `network/prefix` (the gateway takes the first address), with
    /// forwarding and masquerading for what pods send off the bridge, and a listener on the
    /// gateway for the API server at `api` when given.
    pub(crate) fn create(
        network: Ipv4Addr,
        prefix: u8,
        api: Option<SocketAddr>,
    ) -> Result<Self, String> {
        available()?;
        let node = if crate::confine::is_root() {
            sweep();
            None
        } else {
            Some(NodeNamespace::shared()?)
        };
        let size = 1u32 << (32 - u32::from(prefix.clamp(8, 30)));
        let base = u32::from(network) & !(size - 1);
        let network = Ipv4Addr::from(base);
        let gateway = Ipv4Addr::from(base + 1);
        let mut bridge = Self {
            name: interface_name("asb"),
            prefix,
            node,
            gateway,
            api: None,
        };
        bridge.run("ip", &["link", "add", &bridge.name, "type", "bridge"], None)?;
        // Who made it, for [`sweep`] after a kubelet that could not clean up (SIGKILL).
        let alias = format!("{ALIAS_PREFIX}{}", std::process::id());
        bridge.run("ip", &["link", "set", &bridge.name, "alias", &alias], None)?;
        let cidr = format!("{gateway}/{prefix}");
        bridge.run("ip", &["addr", "add", &cidr, "dev", &bridge.name], None)?;
        bridge.run("ip", &["link", "set", &bridge.name, "up"], None)?;
        if bridge.node.is_some() {
            // The node namespace is the kubelet's alone: nothing to restore.
            bridge.run("sh", &["-c", &format!("echo 1 > {FORWARD}")], None)?;
        } else {
            let mut forwarding = FORWARDING.lock().unwrap_or_else(PoisonError::into_inner);
            if forwarding.0 == 0 {
                forwarding.1 = std::fs::read_to_string(FORWARD).ok();
            }
            forwarding.0 += 1;
            std::fs::write(FORWARD, "1")
                .map_err(|error| format!("enabling IPv4 forwarding ({FORWARD}): {error}"))?;
        }
        let table = format!(
            "table ip {name} {{\n  chain postrouting {{\n    type nat hook postrouting priority \
             100; policy accept;\n    ip saddr {network}/{prefix} oifname != \"{name}\" \
             masquerade\n  }}\n}}\n",
            name = bridge.name
        );
        bridge.run("nft", &["-f", "-"], Some(&table))?;
        if let Some(upstream) = api {
            let address = SocketAddrV4::new(gateway, 0);
            let listener = match &bridge.node {
                Some(node) => node.listen(address),
                None => std::net::TcpListener::bind(address),
            };
            let listener = listener
                .and_then(|listener| listener.set_nonblocking(true).map(|()| listener))
                .map_err(|error| format!("listening on {gateway} for the API server: {error}"))?;
            bridge.api = Some((listener, upstream));
        }
        Ok(bridge)
    }

    /// Runs a tool in the bridge's network namespace.
    fn run(&self, program: &str, args: &[&str], input: Option<&str>) -> Result<(), String> {
        match &self.node {
            Some(node) => run_in(
                Some(node.user_fd()),
                Some(node.net_fd()),
                &[],
                program,
                args,
                input,
            ),
            None => run(program, args, input),
        }
    }

    /// Where the node's sockets for connections to pods come from, when not the kubelet's
    /// own namespace.
    pub(crate) fn sockets(&self) -> Option<crate::PodSockets> {
        let node = self.node.clone()?;
        Some(Arc::new(move |_: std::net::IpAddr| node.tcp_socket()))
    }

    /// Why pods have no internet (a node namespace without `slirp4netns`).
    pub(crate) fn no_internet(&self) -> Option<&str> {
        self.node.as_ref()?.internet.as_deref()
    }

    /// Where pods' connections to the `kubernetes` Service go (the gateway's listener).
    pub(crate) fn api_address(&self) -> Option<SocketAddrV4> {
        let (listener, _) = self.api.as_ref()?;
        match listener.local_addr() {
            Ok(SocketAddr::V4(addr)) => Some(addr),
            _ => None,
        }
    }

    /// Forwards the pods' API connections to the API server until dropped (spawned by the
    /// kubelet's start).
    pub(crate) fn api_forward(&self) -> Option<impl std::future::Future<Output = ()> + use<>> {
        let (listener, upstream) = self.api.as_ref()?;
        let listener = tokio::net::TcpListener::from_std(listener.try_clone().ok()?).ok()?;
        let upstream = *upstream;
        Some(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        })
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.run("ip", &["link", "del", &self.name], None);
        let _ = self.run("nft", &["delete", "table", "ip", &self.name], None);
        if self.node.is_some() {
            return;
        }
        let mut forwarding = FORWARDING.lock().unwrap_or_else(PoisonError::into_inner);
        forwarding.0 = forwarding.0.saturating_sub(1);
        if forwarding.0 == 0
            && let Some(previous) = forwarding.1.take()
        {
            let _ = std::fs::write(FORWARD, previous.trim());
        }
    }
}

/// A network namespace (its loopback up) made on a thread of its own, held by the returned
/// descriptor.
#[allow(unsafe_code)]
fn new_namespace() -> Result<OwnedFd, String> {
    std::thread::spawn(|| {
        // SAFETY: unsharing the network namespace changes only this thread's, which holds no
        // socket and ends right after opening the namespace (no other state of the process is
        // shared or changed: not its files, filesystem or memory).
        unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET) }
            .map_err(|error| format!("cannot make a network namespace: {error}"))?;
        if !loopback_up() {
            return Err(format!(
                "cannot bring up the loopback interface of a new network namespace: {}",
                std::io::Error::last_os_error()
            ));
        }
        std::fs::File::open("/proc/thread-self/ns/net")
            .map(OwnedFd::from)
            .map_err(|error| format!("cannot open the new network namespace: {error}"))
    })
    .join()
    .map_err(|_| "the thread making a network namespace panicked".to_owned())?
}

/// Brings up `lo` in the calling thread's network namespace, as `ip link set lo up` does
/// (system calls only, no allocation: the node namespace's forked helper calls it too);
/// whether it worked (`errno` says why not).
#[allow(unsafe_code)]
pub(crate) fn loopback_up() -> bool {
    // SAFETY: an ioctl socket of our own, and an ifreq on the stack naming `lo`; the kernel
    // reads and writes only that ifreq.
    unsafe {
        let socket = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if socket < 0 {
            return false;
        }
        let mut request: libc::ifreq = std::mem::zeroed();
        for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo\0") {
            *slot = *byte as libc::c_char;
        }
        let mut ok = libc::ioctl(socket, libc::SIOCGIFFLAGS, &raw mut request) == 0;
        if ok {
            request.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            ok = libc::ioctl(socket, libc::SIOCSIFFLAGS, &raw mut request) == 0;
        }
        let errno = *libc::__errno_location();
        libc::close(socket);
        *libc::__errno_location() = errno;
        ok
    }
}

/// Makes sockets in other network namespaces for a kubelet that is root: a thread that enters
/// a namespace, makes a socket and comes back (`setns` moves only the calling thread).
#[derive(Debug)]
struct SocketMaker {
    requests:
        Mutex<std::sync::mpsc::Sender<(RawFd, std::sync::mpsc::Sender<std::io::Result<OwnedFd>>)>>,
}

impl SocketMaker {
    fn shared() -> &'static Self {
        static MAKER: OnceLock<SocketMaker> = OnceLock::new();
        MAKER.get_or_init(|| {
            let (requests, incoming) = std::sync::mpsc::channel::<(
                RawFd,
                std::sync::mpsc::Sender<std::io::Result<OwnedFd>>,
            )>();
            std::thread::Builder::new()
                .name("pod-socket-maker".to_owned())
                .spawn(move || {
                    let home = std::fs::File::open("/proc/thread-self/ns/net").map(OwnedFd::from);
                    for (net, reply) in incoming {
                        let _ = reply.send(make_socket_in(home.as_ref().ok(), net));
                    }
                })
                .map(drop)
                .unwrap_or_default();
            SocketMaker {
                requests: Mutex::new(requests),
            }
        })
    }

    fn socket_in(&self, net: RawFd) -> std::io::Result<OwnedFd> {
        let (reply, answer) = std::sync::mpsc::channel();
        self.requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .send((net, reply))
            .map_err(|_| std::io::Error::other("the pod socket maker is gone"))?;
        answer
            .recv()
            .map_err(|_| std::io::Error::other("the pod socket maker is gone"))?
    }
}

/// On the socket maker's thread: a TCP socket made in `net`, the thread back in `home`.
fn make_socket_in(home: Option<&OwnedFd>, net: RawFd) -> std::io::Result<OwnedFd> {
    use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};
    let home = home.ok_or_else(|| std::io::Error::other("the socket maker has no namespace"))?;
    #[allow(unsafe_code)]
    // SAFETY: `net` is a namespace descriptor the caller holds open until we answer.
    let target = unsafe { std::os::fd::BorrowedFd::borrow_raw(net) };
    move_into_link_name_space(target, Some(LinkNameSpaceType::Network))?;
    #[allow(unsafe_code)]
    // SAFETY: socket(2) with integer arguments; a descriptor it returns is ours.
    let made = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(<OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd))
        }
    };
    move_into_link_name_space(home.as_fd(), Some(LinkNameSpaceType::Network))?;
    made
}

/// A pod's network.
#[derive(Debug)]
pub(crate) struct PodNet {
    namespace: OwnedFd,
    /// The node's end of the pod's veth pair (`None`: the pod has loopback only).
    host_interface: Option<String>,
    /// The node namespace the pod's namespace is below (`None`: the kubelet's own).
    node: Option<Arc<NodeNamespace>>,
    /// The ruleset last applied.
    applied: Mutex<Option<String>>,
}

impl PodNet {
    /// Makes the pod's namespace with `ip` on `eth0`, on `bridge`, with `rules` applied before
    /// anything runs there.
    pub(crate) fn create(bridge: &Bridge, ip: Ipv4Addr, rules: &str) -> Result<Self, String> {
        let namespace = match &bridge.node {
            Some(node) => node
                .new_namespace()
                .map_err(|error| format!("cannot make a network namespace: {error}"))?,
            None => new_namespace()?,
        };
        let host_interface = interface_name("asv");
        let net = Self {
            namespace,
            host_interface: Some(host_interface.clone()),
            node: bridge.node.clone(),
            applied: Mutex::new(None),
        };
        let pod_interface = interface_name("asp");
        // `ip` gets the pod's namespace as a descriptor of its own.
        let path = format!("/proc/self/fd/{}", net.fd());
        let (user, node_net) = match &net.node {
            Some(node) => (Some(node.user_fd()), Some(node.net_fd())),
            None => (None, None),
        };
        run_in(
            user,
            node_net,
            &[net.fd()],
            "ip",
            &[
                "link",
                "add",
                &host_interface,
                "type",
                "veth",
                "peer",
                "name",
                &pod_interface,
                "netns",
                &path,
            ],
            None,
        )?;
        bridge.run(
            "ip",
            &["link", "set", &host_interface, "master", &bridge.name, "up"],
            None,
        )?;
        net.apply(rules)?;
        let script = format!(
            "set -e\n\
             for f in /proc/sys/net/ipv6/conf/all/disable_ipv6 /proc/sys/net/ipv6/conf/default/disable_ipv6; do \
               [ -e $f ] && echo 1 > $f; done\n\
             echo 1 > /proc/sys/net/ipv4/conf/all/arp_notify\n\
             echo 1 > /proc/sys/net/ipv4/conf/default/arp_notify\n\
             ip link set lo up\n\
             ip link set {pod_interface} name eth0\n\
             ip addr add {ip}/{prefix} dev eth0\n\
             ip link set eth0 up\n\
             ip route add default via {gateway}\n",
            prefix = bridge.prefix,
            gateway = bridge.gateway,
        );
        net.run("sh", &["-c", &script], None)?;
        Ok(net)
    }

    /// A network namespace with loopback only, below `node` (a kubelet that is not root) or
    /// the kubelet's own: what a pod gets where the machine cannot give it more.
    pub(crate) fn isolated(node: Option<Arc<NodeNamespace>>) -> Result<Self, String> {
        let namespace = match &node {
            Some(node) => node
                .new_namespace()
                .map_err(|error| format!("cannot make a network namespace: {error}"))?,
            None => new_namespace()?,
        };
        Ok(Self {
            namespace,
            host_interface: None,
            node,
            applied: Mutex::new(None),
        })
    }

    /// A new TCP socket (non-blocking) in the pod's namespace, for the node's connections to a
    /// pod with loopback only.
    pub(crate) fn tcp_socket(&self) -> std::io::Result<tokio::net::TcpSocket> {
        let fd = match &self.node {
            Some(node) => return node.tcp_socket_in(self.fd()),
            None => SocketMaker::shared().socket_in(self.fd())?,
        };
        let stream = std::net::TcpStream::from(fd);
        stream.set_nonblocking(true)?;
        Ok(tokio::net::TcpSocket::from_std_stream(stream))
    }

    /// Whether the pod has loopback only.
    pub(crate) fn is_isolated(&self) -> bool {
        self.host_interface.is_none()
    }

    /// Runs a tool in the pod's network namespace.
    fn run(&self, program: &str, args: &[&str], input: Option<&str>) -> Result<(), String> {
        run_in(self.user_fd(), Some(self.fd()), &[], program, args, input)
    }

    /// The descriptor a container's process enters (`setns`) before it starts.
    pub(crate) fn fd(&self) -> RawFd {
        self.namespace.as_raw_fd()
    }

    /// The user namespace a container's process enters first (`setns`), when the pod's network
    /// is below a node namespace.
    pub(crate) fn user_fd(&self) -> Option<RawFd> {
        self.node.as_ref().map(|node| node.user_fd())
    }

    /// Applies `rules` (an nftables script) in the pod's namespace, unless they are what was
    /// applied last.
    pub(crate) fn apply(&self, rules: &str) -> Result<(), String> {
        if self.is_isolated() {
            // Nothing reaches a pod with loopback only, and it reaches nothing.
            return Ok(());
        }
        let mut applied = self.applied.lock().unwrap_or_else(PoisonError::into_inner);
        if applied.as_deref() == Some(rules) {
            return Ok(());
        }
        self.run("nft", &["-f", "-"], Some(rules))?;
        *applied = Some(rules.to_owned());
        Ok(())
    }
}

impl Drop for PodNet {
    fn drop(&mut self) {
        // Deleting one end deletes the pair; the namespace goes with its last holder.
        let Some(host_interface) = &self.host_interface else {
            return;
        };
        let args = ["link", "del", host_interface.as_str()];
        let _ = match &self.node {
            Some(node) => run_in(
                Some(node.user_fd()),
                Some(node.net_fd()),
                &[],
                "ip",
                &args,
                None,
            ),
            None => run("ip", &args, None),
        };
    }
}
