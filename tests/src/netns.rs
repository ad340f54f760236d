//! A network namespace of the run's own for the control-plane tier, so that its pods can have
//! pod IPs that a real API server accepts in EndpointSlices (it refuses loopback addresses):
//! the process runs itself again under `unshare --net`, where loopback is brought up and
//! [`POD_NETWORK`] is routed locally (`ip route add local … dev lo`). The API server, etcd, our
//! kubelet, every pod and every client the suite starts then share that namespace, and nothing
//! of the host's network is touched or reachable.

use std::net::Ipv4Addr;
use std::process::Command;

/// The pods' range inside the namespace (a kind cluster's default pod subnet).
pub const POD_NETWORK: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 244, 0, 0), 16);

/// Set in the child: the namespace is in place.
const INSIDE: &str = "AGENT_SANDBOX_E2E_OWN_NETWORK";

/// Whether this process runs in the namespace [`run_inside`] made.
pub fn inside() -> bool {
    std::env::var_os(INSIDE).is_some()
}

/// Runs this executable again, with the same arguments (and `env` added), in a network
/// namespace of its own and returns its exit code; or `Ok(None)` when this process already
/// runs inside one (go on). Call it before starting any thread. Root makes the namespace
/// directly; anyone else gets a user namespace (mapped to root) around it.
pub fn run_inside(env: &[(&str, String)]) -> Result<Option<i32>, String> {
    if inside() {
        return Ok(None);
    }
    let (network, prefix) = POD_NETWORK;
    if !setup_works() {
        return Err(format!(
            "the control-plane tier needs a network namespace of its own with \
             {network}/{prefix} routed locally, and this machine cannot make one: it needs \
             `unshare --net` (util-linux; as root, or with user namespaces enabled) and `ip` \
             (iproute2: apt-get install iproute2)"
        ));
    }
    let exe = std::env::current_exe()
        .map_err(|error| format!("cannot locate this executable: {error}"))?;
    let setup = format!(
        "ip link set lo up && ip route add local {network}/{prefix} dev lo && exec \"$0\" \"$@\""
    );
    let mut command = Command::new("unshare");
    if !is_root() {
        command.args(["--user", "--map-root-user"]);
    }
    command
        .args(["--net", "--", "sh", "-c", &setup])
        .arg(&exe)
        .args(std::env::args_os().skip(1))
        .envs(env.iter().map(|(name, value)| (name, value)))
        .env(INSIDE, "1");
    let mut child = command.spawn().map_err(|error| {
        format!(
            "cannot run `unshare` (util-linux) to give the control-plane tier a network \
             namespace of its own: {error}"
        )
    })?;
    // Ctrl-C reaches the child too (same process group), which tears the cluster down and
    // exits 130; this process only waits for that.
    let status = child
        .wait()
        .map_err(|error| format!("waiting for the run in its own network namespace: {error}"))?;
    Ok(Some(status.code().unwrap_or(1)))
}

fn is_root() -> bool {
    // The effective uid, without unsafe code: /proc/self/status's `Uid:` line (real,
    // effective, saved, filesystem).
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|id| id == "0"))
        })
        .unwrap_or(false)
}

/// Whether the namespace setup works here (a quick `unshare` run that does only the setup).
fn setup_works() -> bool {
    let (network, prefix) = POD_NETWORK;
    let mut command = Command::new("unshare");
    if !is_root() {
        command.args(["--user", "--map-root-user"]);
    }
    command
        .args(["--net", "--", "sh", "-c"])
        .arg(format!(
            "ip link set lo up && ip route add local {network}/{prefix} dev lo"
        ))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}
