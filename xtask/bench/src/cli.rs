//! Cases for `sandboxctl run --local`, as a user runs it (the release binary, one process per
//! run): the start-up until a warm sandbox is there, and from then to the command's first
//! output (claim, Ready, the command's start and its `42`), with every protection this machine
//! allows (as root: its own filesystem view, user namespace, seccomp, cgroup limits and a
//! network of its own; run in a network namespace of the bench's own so the bridge never
//! touches the machine's network) and, in the same run for comparison, unconfined
//! (`--isolation none`: plain processes on the host's network).

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use super::{Case, Options, Row, Samples, format_duration};

pub(super) fn cases() -> Vec<Case> {
    vec![Case {
        name: "cli/run-local",
        about: "sandboxctl run --local -- python3 -c 'print(6*7)': start-up and claim-to-first-output, confined and not",
        run: run_local,
    }]
}

/// One run's two figures: start (process start → "local cluster up with a warm sandbox") and
/// first output (that line → the command's `42` on stdout).
fn once(command: &mut Command) -> Result<(Duration, Duration, String)> {
    let started = Instant::now();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting sandboxctl")?;
    let (tx, rx) = mpsc::channel::<(bool, String, Instant)>();
    let stdout = child.stdout.take().context("stdout")?;
    let stderr = child.stderr.take().context("stderr")?;
    let out_tx = tx.clone();
    let readers = [
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = out_tx.send((true, line, Instant::now()));
            }
        }),
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send((false, line, Instant::now()));
            }
        }),
    ];
    let status = child.wait().context("waiting for sandboxctl")?;
    for reader in readers {
        let _ = reader.join();
    }
    let (mut up, mut output, mut log) = (None, None, String::new());
    for (is_stdout, line, at) in rx.try_iter() {
        log.push_str(&line);
        log.push('\n');
        if !is_stdout && line.contains("local cluster up with a warm sandbox") {
            up = Some(at);
        }
        if is_stdout && line == "42" {
            output = Some(at);
        }
    }
    if !status.success() {
        bail!("sandboxctl run --local failed ({status}):\n{log}");
    }
    match (up, output) {
        (Some(up), Some(output)) if output >= up => Ok((up - started, output - up, log)),
        _ => bail!("sandboxctl run --local printed neither its start line nor 42:\n{log}"),
    }
}

fn run_local(root: &Path, options: Options) -> Result<Vec<Row>> {
    let bin = super::build_release(root, &["sandboxctl"])?.join("sandboxctl");
    let count = options.iterations(10);
    let confined_in_own_network = agent_sandbox_local::testkit::Tool::PodNetworks
        .unavailable()
        .is_none();
    let mut rows = Vec::new();
    for (name, extra, own_netns) in [
        ("cli/run-local", &[][..], confined_in_own_network),
        (
            "cli/run-local-unconfined",
            &["--isolation", "none"][..],
            false,
        ),
    ] {
        let (mut start, mut first) = (Samples::with_capacity(count), Samples::with_capacity(count));
        let mut summary = String::new();
        for _ in 0..count {
            let mut command = if own_netns {
                agent_sandbox_local::testkit::own_network_command(&bin)
            } else {
                Command::new(&bin)
            };
            command.args(["run", "--local"]).args(extra).args([
                "--",
                "python3",
                "-c",
                "print(6*7)",
            ]);
            let (up, output, log) = once(&mut command)?;
            start.push(up);
            first.push(output);
            if let Some(line) = log.lines().find(|l| l.contains("pods get: ")) {
                summary = line.trim().to_owned();
            }
        }
        let protections = if name == "cli/run-local" {
            if summary.is_empty() {
                bail!("sandboxctl run --local did not say what its pods get")
            }
            summary
        } else {
            "unconfined (--isolation none): the host's files, network and PATH (its python3 is whatever that PATH finds first: on the machine of the last run a pyenv shim, about 90 ms of this row's claim-to-first-output)".to_owned()
        };
        rows.push(
            Row::new(format!("{name}/start"))
                .median(format_duration(start.median()))
                .p99(format_duration(start.p99()))
                .notes(format!(
                    "{} runs of the release sandboxctl: process start -> a warm sandbox (sim, controller, router, pool of 1); {protections}",
                    start.len()
                )),
        );
        rows.push(
            Row::new(format!("{name}/claim-to-first-output"))
                .median(format_duration(first.median()))
                .p99(format_duration(first.p99()))
                .notes(format!(
                    "same runs: warm sandbox there -> the command's first output (claim, Ready, python3 started, 42 printed); {protections}"
                )),
        );
    }
    Ok(rows)
}
