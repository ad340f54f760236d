//! `cargo xtask bench`: the project's benchmark harness.
//!
//! Each case measures one thing and returns rows (name, median, p99 or throughput, peak RSS
//! where relevant). The harness prints them and writes `docs/benchmarks.md` with the machine's
//! cores and memory, replacing the rows of the cases that ran and keeping the others, so one
//! case can be re-measured without re-running everything. Speed goals live here, never in timed
//! test assertions.

mod api;
mod controller;
mod report;
mod router;
mod runtime;
mod sdk;
mod sim;
mod stats;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

pub(crate) use report::Row;
pub(crate) use stats::Samples;

/// Options shared by every case.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Options {
    /// Fewer iterations, for a smoke run of the harness itself.
    pub(crate) quick: bool,
}

impl Options {
    /// `full` iterations normally, a tenth (at least one) with `--quick`.
    pub(crate) fn iterations(&self, full: usize) -> usize {
        if self.quick { (full / 10).max(1) } else { full }
    }
}

/// A benchmark case: a name (`group/what`) and the function that measures it.
pub(crate) struct Case {
    pub(crate) name: &'static str,
    pub(crate) about: &'static str,
    pub(crate) run: fn(&Path, Options) -> Result<Vec<Row>>,
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    cases.extend(api::cases());
    cases.extend(controller::cases());
    cases.extend(runtime::cases());
    cases.extend(router::cases());
    cases.extend(sdk::cases());
    cases.extend(sim::cases());
    cases
}

/// Runs the cases whose name starts with one of `filters` (all when empty), prints the rows and,
/// unless `dry_run`, merges them into `docs/benchmarks.md`.
pub(crate) fn run(root: &Path, filters: &[String], options: Options, dry_run: bool) -> Result<()> {
    let selected: Vec<Case> = cases()
        .into_iter()
        .filter(|case| {
            filters.is_empty() || filters.iter().any(|f| case.name.starts_with(f.as_str()))
        })
        .collect();
    if selected.is_empty() {
        let names: Vec<&str> = cases().iter().map(|case| case.name).collect();
        bail!(
            "no benchmark case matches {filters:?}; cases are: {}",
            names.join(", ")
        );
    }
    let mut rows = Vec::new();
    for case in &selected {
        eprintln!("bench: {} ({})", case.name, case.about);
        let case_rows = (case.run)(root, options)?;
        for row in &case_rows {
            println!("{}", row.to_line());
        }
        rows.extend(case_rows);
    }
    if dry_run {
        return Ok(());
    }
    let path = root.join("docs/benchmarks.md");
    report::merge_into(&path, &rows)?;
    eprintln!("bench: wrote {}", path.display());
    Ok(())
}

/// Lists the cases.
pub(crate) fn list() {
    for case in cases() {
        println!("{:<32} {}", case.name, case.about);
    }
}

/// Formats a duration with a unit that keeps three significant digits.
pub(crate) fn format_duration(duration: Duration) -> String {
    let nanos = duration.as_secs_f64() * 1e9;
    if nanos < 1e3 {
        format!("{nanos:.0} ns")
    } else if nanos < 1e6 {
        format!("{:.2} µs", nanos / 1e3)
    } else if nanos < 1e9 {
        format!("{:.2} ms", nanos / 1e6)
    } else {
        format!("{:.2} s", nanos / 1e9)
    }
}

/// Builds the named workspace binaries in release and returns `target/release`.
///
/// `--workspace` resolves features once for the whole workspace, as the release xtask running
/// the benches was built: every case's binaries share that build's dependency artifacts instead
/// of rebuilding the graph with a per-package feature set.
pub(crate) fn build_release(root: &Path, bins: &[&str]) -> Result<PathBuf> {
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()));
    command
        .args(["build", "--quiet", "--release", "--workspace"])
        .current_dir(root);
    for bin in bins {
        command.args(["--bin", bin]);
    }
    let status = command
        .status()
        .with_context(|| format!("failed to run cargo build for {}", bins.join(", ")))?;
    if !status.success() {
        bail!("cargo build --release of {} failed", bins.join(", "));
    }
    Ok(root.join("target/release"))
}
