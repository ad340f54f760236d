//! Network namespaces a test makes for itself, so that what it does to networks (a kubelet's
//! bridge, forwarding, an "internet") never touches the machine's own:
//!
//! - [`own_network_command`]: a command run in a new network namespace with its loopback up;
//! - [`Internet`]: a namespace joined to the caller's by a veth pair, with an HTTP server on
//!   [`INTERNET_ADDRESS`] port 80 standing for "the internet" (this machine has none), routed
//!   from the caller's namespace. Only in a namespace the caller made itself.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The address standing for the internet: TEST-NET-2, public-looking (outside every range the
/// sandboxes' policies deny) and routed nowhere else.
pub const INTERNET_ADDRESS: &str = "198.51.100.2";
/// The caller's end of the link to [`Internet`].
const NEAR_END: &str = "198.51.100.1/24";
const PATIENCE: Duration = Duration::from_secs(60);

/// `program args` in a network namespace of its own (`unshare --net`, as root) with loopback up.
pub fn own_network_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new("unshare");
    command
        .args([
            "--net",
            "--",
            "sh",
            "-c",
            "ip link set lo up && exec \"$0\" \"$@\"",
        ])
        .arg(program);
    command
}

/// The internet's namespace and server; killed when dropped.
#[derive(Debug)]
pub struct Internet(std::process::Child);

impl Internet {
    /// Starts it and waits until its server answers. Call it only in a network namespace the
    /// caller made (it adds a link and a route there).
    pub fn start() -> Result<Self, String> {
        let script = format!(
            "while ! ip link show inet0 >/dev/null 2>&1; do sleep 0.02; done; \
             ip link set lo up; ip addr add {INTERNET_ADDRESS}/24 dev inet0; \
             ip link set inet0 up; ip route add default dev inet0; \
             exec python3 -m http.server --bind {INTERNET_ADDRESS} 80"
        );
        let child = Command::new("unshare")
            .args(["--net", "--", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|error| format!("cannot run unshare for the internet: {error}"))?;
        // Dropped (and killed) on every early return below.
        let internet = Self(child);
        let netns = format!("/proc/{}/ns/net", internet.0.id());
        // Until `unshare` has made its namespace, the child's is still ours: a link moved there
        // now would stay here.
        let ours = std::fs::read_link("/proc/self/ns/net")
            .map_err(|error| format!("cannot read this process's network namespace: {error}"))?;
        let deadline = Instant::now() + PATIENCE;
        while std::fs::read_link(&netns).is_ok_and(|theirs| theirs == ours) {
            if Instant::now() > deadline {
                return Err("unshare did not make the internet's namespace".to_owned());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        for args in [
            &[
                "link", "add", "inet1", "type", "veth", "peer", "name", "inet0", "netns", &netns,
            ][..],
            &["addr", "add", NEAR_END, "dev", "inet1"][..],
            &["link", "set", "inet1", "up"][..],
        ] {
            let status = Command::new("ip")
                .args(args)
                .status()
                .map_err(|error| format!("cannot run ip: {error}"))?;
            if !status.success() {
                return Err(format!("`ip {}` failed", args.join(" ")));
            }
        }
        while std::net::TcpStream::connect((INTERNET_ADDRESS, 80)).is_err() {
            if Instant::now() > deadline {
                return Err(format!(
                    "the internet's server on {INTERNET_ADDRESS}:80 did not answer"
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(internet)
    }
}

impl Drop for Internet {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
