#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// The counting allocator below needs `unsafe impl GlobalAlloc`; nothing else here is unsafe.
#![allow(unsafe_code)]
//! Issue 15 item 10: the memory one `/execute` or `/v1/exec` call takes is bounded by the
//! output cap, also for the worst output to encode (NUL bytes, six bytes each in JSON), and the
//! encoded answer is bounded relative to the cap with truncation reported. Measured with a
//! counting global allocator; its own binary, so that no other test allocates meanwhile.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use common::TestServer;
use futures_util::StreamExt;
use hyper::{Method, StatusCode};
use serde_json::json;

/// Counts live heap bytes and their peak. A reallocation counts as a change of size (glibc
/// moves large blocks with mremap, without a copy).
struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = CURRENT.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to the system allocator unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                CURRENT.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const CAP: u64 = 4 << 20;
/// Room for everything that does not scale with the output: buffers of the connection, of
/// the encoder and of the command's pipes, the client's reads.
const SLACK: usize = 4 << 20;

/// Sends `body` to `path`, streams the answer without keeping it, and returns the status, the
/// answer's size, its last bytes and the peak heap growth during the call.
async fn measure(
    server: &TestServer,
    path: &str,
    body: serde_json::Value,
) -> (StatusCode, usize, String, usize) {
    let request = common::request(
        Method::POST,
        path,
        &[("content-type", "application/json")],
        Bytes::from(body.to_string()),
    );
    let baseline = CURRENT.load(Ordering::Relaxed);
    PEAK.store(baseline, Ordering::Relaxed);
    let response = common::open(server.addr, request).await;
    let status = response.status();
    let mut stream = http_body_util::BodyDataStream::new(response.into_body());
    let mut size = 0;
    let mut tail: Vec<u8> = Vec::with_capacity(4096);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        size += chunk.len();
        tail.extend_from_slice(&chunk[chunk.len().saturating_sub(1024)..]);
        let excess = tail.len().saturating_sub(1024);
        tail.drain(..excess);
    }
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(baseline);
    eprintln!(
        "{path}: {size} bytes answered, heap peak +{} KiB",
        peak >> 10
    );
    (
        status,
        size,
        String::from_utf8_lossy(&tail).into_owned(),
        peak,
    )
}

#[tokio::test]
async fn worst_case_output_is_bounded_before_encoding() {
    let server = TestServer::start_with(|c| c.max_output_bytes = CAP).await;
    // Twice the cap of NUL bytes on each stream.
    let command = "head -c 8388608 /dev/zero; head -c 8388608 /dev/zero >&2";
    // Warm up: the first call allocates what every later one reuses.
    let _ = measure(&server, "/execute", json!({"command": "true"})).await;

    let (status, size, tail, peak) = measure(
        &server,
        "/execute",
        json!({"command": command, "shell": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    // Every kept byte is `\u0000` (6 bytes); the rest is the few fields around them.
    let kept = 2 * CAP as usize;
    assert!(
        size >= 6 * kept && size <= 6 * kept + 1024,
        "answer of {size} bytes"
    );
    assert!(
        tail.contains(r#""stdout_truncated":true,"stderr_truncated":true"#),
        "{tail}"
    );
    assert!(
        peak <= kept + SLACK,
        "/execute took {} MiB for {} MiB of kept output",
        peak >> 20,
        kept >> 20
    );

    let (status, size, tail, peak) =
        measure(&server, "/v1/exec", json!({"command": command})).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        size >= 6 * kept && size <= 7 * kept,
        "answer of {size} bytes"
    );
    assert!(
        tail.contains(r#""stdout_truncated":true,"stderr_truncated":true"#),
        "{tail}"
    );
    assert!(peak <= SLACK, "/v1/exec took {} MiB", peak >> 20);
    server.stop().await;
}
