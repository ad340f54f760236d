//! Pod IP allocation: a random loopback address per pod, never `127.0.0.1`.
//!
//! Many sims run at once (parallel tests, several test binaries, other people's runs), so
//! addresses are drawn at random across 127.1.0.0–127.254.255.254, skipped when this process
//! already handed them out, and kept only when every port the pod will listen on can be bound
//! there (a probe bind that is released immediately).

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::sync::{Mutex, OnceLock, PoisonError};

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

/// Allocates an address where `ports` are free; `None` after many failed attempts.
pub(crate) fn allocate(ports: &[u16]) -> Option<PodIp> {
    for _ in 0..256 {
        let ip = candidate();
        {
            let mut reserved = in_use().lock().unwrap_or_else(PoisonError::into_inner);
            if reserved.contains(&ip) {
                continue;
            }
            reserved.insert(ip);
        }
        if ports_free(ip, ports) {
            return Some(PodIp(ip));
        }
        release(ip);
    }
    None
}

/// Returns an address to the pool.
pub(crate) fn release(ip: Ipv4Addr) {
    in_use()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&ip);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_loopback_distinct_and_usable() {
        let a = allocate(&[8888]).unwrap();
        let b = allocate(&[8888]).unwrap();
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
    fn an_occupied_port_rejects_the_address() {
        let ip = candidate();
        let _holder = TcpListener::bind(SocketAddrV4::new(ip, 0)).unwrap();
        let port = _holder.local_addr().unwrap().port();
        assert!(!ports_free(ip, &[port]));
    }
}
