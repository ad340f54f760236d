//! Pod IP allocation: a random address per pod from the [`PodNetwork`] (loopback by default,
//! never `127.0.0.1`).
//!
//! Many sims run at once (parallel tests, several test binaries, other people's runs), so
//! addresses are drawn at random across the range (127.1.0.0–127.254.255.254 for loopback),
//! skipped when this process already handed them out, and kept only when every port the pod
//! will listen on can be bound there (a probe bind that is released immediately).

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::kubelet::PodNetwork;

fn in_use() -> &'static Mutex<HashSet<Ipv4Addr>> {
    static IN_USE: OnceLock<Mutex<HashSet<Ipv4Addr>>> = OnceLock::new();
    IN_USE.get_or_init(|| Mutex::new(HashSet::new()))
}

/// A random candidate in 127.1.0.1–127.254.255.254.
pub(crate) fn candidate() -> Ipv4Addr {
    Ipv4Addr::new(
        127,
        fastrand::u8(1..255),
        fastrand::u8(..),
        fastrand::u8(1..255),
    )
}

/// A random candidate of `network`: in a range, neither its network, first nor broadcast
/// address (the first is where a gateway would be).
fn candidate_in(network: PodNetwork) -> Ipv4Addr {
    match network {
        PodNetwork::Loopback | PodNetwork::Isolated => candidate(),
        PodNetwork::Local { network, prefix }
        | PodNetwork::Bridge {
            network, prefix, ..
        } => {
            let prefix = u32::from(prefix.clamp(8, 30));
            let size = 1u32 << (32 - prefix);
            let base = u32::from(network) & !(size - 1);
            Ipv4Addr::from(base + fastrand::u32(2..size - 1))
        }
    }
}

/// Whether every port can be bound on `ip` (port 0 stands for "any port").
fn ports_free(ip: Ipv4Addr, ports: &[u16]) -> bool {
    let ports: Vec<u16> = if ports.is_empty() {
        vec![0]
    } else {
        ports.to_vec()
    };
    // Bind all at once, so that the check covers the whole set at the same instant.
    let mut held = Vec::with_capacity(ports.len());
    for port in ports {
        match TcpListener::bind(SocketAddrV4::new(ip, port)) {
            Ok(listener) => held.push(listener),
            Err(_) => return false,
        }
    }
    true
}

/// A pod IP, reserved for this process until [`release`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct PodIp(pub(crate) Ipv4Addr);

/// Allocates an address of `network` where `ports` are free; `None` after many failed
/// attempts (for a range, also when the namespace does not route it locally).
pub(crate) fn allocate(network: PodNetwork, ports: &[u16]) -> Option<PodIp> {
    for _ in 0..256 {
        let ip = candidate_in(network);
        {
            let mut reserved = in_use().lock().unwrap_or_else(PoisonError::into_inner);
            let mut released = recently_released()
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            released.retain(|_, at| at.elapsed() < REUSE_AFTER);
            if reserved.contains(&ip) || released.contains_key(&ip) {
                continue;
            }
            reserved.insert(ip);
        }
        // A pod with a network namespace of its own has every port free.
        if matches!(network, PodNetwork::Bridge { .. } | PodNetwork::Isolated)
            || ports_free(ip, ports)
        {
            return Some(PodIp(ip));
        }
        release(ip);
    }
    None
}

/// Returns an address to the pool, to be handed out again only after [`REUSE_AFTER`]: peers
/// may still have the old pod's link-layer address cached for it.
pub(crate) fn release(ip: Ipv4Addr) {
    in_use()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&ip);
    recently_released()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(ip, std::time::Instant::now());
}

/// How long a released address rests.
const REUSE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

fn recently_released() -> &'static Mutex<std::collections::HashMap<Ipv4Addr, std::time::Instant>> {
    static RELEASED: OnceLock<Mutex<std::collections::HashMap<Ipv4Addr, std::time::Instant>>> =
        OnceLock::new();
    RELEASED.get_or_init(|| Mutex::new(std::collections::HashMap::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_loopback_distinct_and_usable() {
        let a = allocate(PodNetwork::Loopback, &[8888]).unwrap();
        let b = allocate(PodNetwork::Loopback, &[8888]).unwrap();
        assert_ne!(a, b);
        for ip in [a.0, b.0] {
            assert!(ip.is_loopback());
            assert_ne!(ip, Ipv4Addr::LOCALHOST);
            assert!(TcpListener::bind(SocketAddrV4::new(ip, 8888)).is_ok());
        }
        release(a.0);
        release(b.0);
    }

    #[test]
    fn range_candidates_stay_inside_and_skip_the_reserved_addresses() {
        let network = PodNetwork::Local {
            network: Ipv4Addr::new(10, 244, 0, 0),
            prefix: 30,
        };
        // A /30 has one address that is not network, first or broadcast.
        for _ in 0..50 {
            assert_eq!(candidate_in(network), Ipv4Addr::new(10, 244, 0, 2));
        }
        let wide = PodNetwork::Local {
            network: Ipv4Addr::new(10, 244, 7, 9),
            prefix: 16,
        };
        for _ in 0..200 {
            let ip = candidate_in(wide).octets();
            assert_eq!(ip[..2], [10, 244]);
            assert!(ip != [10, 244, 0, 0] && ip != [10, 244, 0, 1] && ip != [10, 244, 255, 255]);
        }
    }

    #[test]
    fn an_occupied_port_rejects_the_address() {
        let ip = candidate();
        let _holder = TcpListener::bind(SocketAddrV4::new(ip, 0)).unwrap();
        let port = _holder.local_addr().unwrap().port();
        assert!(!ports_free(ip, &[port]));
    }
}
