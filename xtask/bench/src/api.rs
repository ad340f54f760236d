//! Cases for `crates/api`: the name hash and CRD object (de)serialization, which the controller,
//! router and SDK run on every object they touch.

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use agent_sandbox_api::Sandbox;
use anyhow::{Context, Result};

use super::{Case, Options, Row, Samples, format_duration};

pub(super) fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "api/name-hash",
            about: "FNV-1a name hash of a typical pool-member name",
            run: name_hash,
        },
        Case {
            name: "api/sandbox-json",
            about: "decode and re-encode a full Sandbox object as JSON",
            run: sandbox_json,
        },
    ]
}

/// Times `batches` batches of `per_batch` calls of `op`; samples are per-call durations.
fn measure(batches: usize, per_batch: u32, mut op: impl FnMut()) -> Samples {
    let mut samples = Samples::with_capacity(batches);
    for _ in 0..batches {
        let start = Instant::now();
        for _ in 0..per_batch {
            op();
        }
        samples.push(start.elapsed() / per_batch);
    }
    samples
}

fn per_second(duration: Duration) -> String {
    let secs = duration.as_secs_f64();
    if secs <= 0.0 {
        return String::new();
    }
    let rate = 1.0 / secs;
    if rate >= 1e6 {
        format!("{:.1} M/s", rate / 1e6)
    } else if rate >= 1e3 {
        format!("{:.1} k/s", rate / 1e3)
    } else {
        format!("{rate:.0} /s")
    }
}

fn name_hash(_: &Path, options: Options) -> Result<Vec<Row>> {
    let name = "python-sandbox-pool-4mq8r";
    let samples = measure(options.iterations(500), 10_000, || {
        black_box(agent_sandbox_api::name_hash(black_box(name)));
    });
    Ok(vec![
        Row::new("api/name-hash")
            .median(format_duration(samples.median()))
            .p99(format_duration(samples.p99()))
            .throughput(per_second(samples.median()))
            .notes(format!("{} batches of 10k", samples.len())),
    ])
}

fn sandbox_json(root: &Path, options: Options) -> Result<Vec<Row>> {
    let path = root.join("crates/api/tests/manifests/sandbox.yaml");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("failed to read {}", path.display()))?;
    let sandbox: Sandbox = serde_saphyr::from_str(&text)
        .with_context(|| format!("failed to parse {}", path.display()))?;
    let json = serde_json::to_vec(&sandbox)?;
    let mut failure = None;
    let samples = measure(
        options.iterations(500),
        100,
        || match serde_json::from_slice::<Sandbox>(black_box(&json))
            .and_then(|s| serde_json::to_vec(&s))
        {
            Ok(bytes) => {
                black_box(bytes);
            }
            Err(error) => failure = Some(error),
        },
    );
    if let Some(error) = failure {
        return Err(error).context("Sandbox JSON round trip failed");
    }
    Ok(vec![
        Row::new("api/sandbox-json")
            .median(format_duration(samples.median()))
            .p99(format_duration(samples.p99()))
            .throughput(per_second(samples.median()))
            .notes(format!("{} B object, decode+encode", json.len())),
    ])
}
