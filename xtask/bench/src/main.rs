//! `agent-sandbox-bench`, run by `cargo xtask bench`: the project's benchmark harness.
//!
//! Each case measures one thing and returns rows (name, median, p99 or throughput, peak RSS
//! where relevant). The harness prints them and writes `docs/benchmarks.md` with the machine's
//! cores and memory, replacing the rows of the cases that ran and keeping the others, so one
//! case can be re-measured without re-running everything. Speed goals live here, never in timed
//! test assertions.
//!
//! It is its own package, so that building `xtask` (for `gen-crds` and the like) compiles none
//! of the server crates the cases drive. Arguments: case name prefixes (all cases when none,
//! except the node tier's `node/…`, which need root, a real node's programs and our images and
//! run only when named), `--quick` (fewer iterations), `--dry-run` (print, do not write the
//! report), `--list`.

mod api;
mod cli;
mod control_plane;
mod controller;
mod idle;
mod node;
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

fn main() {
    // Errors are for people at a terminal: the message and its causes, and a non-zero exit.
    if let Err(error) = cli(std::env::args().skip(1)) {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}

/// Runs the command line `args` (everything after the program name).
fn cli(args: impl Iterator<Item = String>) -> Result<()> {
    let mut filters = Vec::new();
    let (mut quick, mut dry_run) = (false, false);
    let mut images = None;
    let mut args = args;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--list" => {
                list();
                return Ok(());
            }
            "--quick" => quick = true,
            "--dry-run" => dry_run = true,
            "--images" => {
                images = Some(
                    args.next()
                        .context("--images needs the OCI archive's path")?,
                );
            }
            flag if flag.starts_with('-') => {
                bail!(
                    "unknown option {flag} (--quick, --dry-run, --list, --images PATH or case \
                     prefixes)"
                )
            }
            prefix => filters.push(prefix.to_owned()),
        }
    }
    // The control-plane tier runs in a network namespace of its own (as the end-to-end suite
    // does), the node tier in network, mount and PID namespaces of its own: when their cases
    // are selected, the whole run moves there before any thread starts.
    let selects = |prefix: &str| {
        filters
            .iter()
            .any(|f| f.starts_with(prefix) || (prefix.starts_with(f.as_str()) && !f.is_empty()))
    };
    let control_plane = filters.is_empty() || selects(control_plane::PREFIX);
    let node = selects(node::PREFIX);
    if control_plane && node {
        bail!(
            "the {} and {} cases run in namespaces laid out differently: name one tier's \
             cases at a time",
            control_plane::PREFIX,
            node::PREFIX
        );
    }
    if (control_plane && !dry_run) || node {
        let layout = if node {
            agent_sandbox_e2e::netns::Layout::Node
        } else {
            agent_sandbox_e2e::netns::Layout::LocalPodRange
        };
        // The node cases find our images' archive (`cargo xtask bench` passes `--images`).
        let env: Vec<(&str, String)> = images
            .into_iter()
            .map(|path| (agent_sandbox_e2e::env::IMAGES, path))
            .collect();
        match agent_sandbox_e2e::netns::run_inside_as(layout, &env) {
            Ok(Some(0)) => return Ok(()),
            Ok(Some(code)) => bail!("the run in its own network namespace exited with {code}"),
            Ok(None) => {}
            Err(message) => bail!("{message}"),
        }
    }
    run(&workspace_root(), &filters, Options { quick }, dry_run)
}

/// The workspace root: this package lives two levels below it.
fn workspace_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .ancestors()
        .nth(2)
        .map_or_else(|| manifest_dir.clone(), Path::to_path_buf)
}

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
    cases.extend(cli::cases());
    cases.extend(controller::cases());
    cases.extend(control_plane::cases());
    cases.extend(node::cases());
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
            if filters.is_empty() {
                !case.name.starts_with(node::PREFIX)
            } else {
                filters.iter().any(|f| case.name.starts_with(f.as_str()))
            }
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

/// The value of label `name` in a Prometheus sample (`metric{code="200",verb="GET"}`, or its
/// label set alone), empty when absent. Whole names only: `resource` is not `subresource`.
pub(crate) fn metric_label(sample: &str, name: &str) -> String {
    let labels = sample.split_once('{').map_or(sample, |(_, rest)| rest);
    labels
        .trim_end_matches('}')
        .split(',')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix("=\""))
        .and_then(|value| value.strip_suffix('"'))
        .unwrap_or_default()
        .to_owned()
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
/// `--workspace` resolves features once for the whole workspace, as `cargo xtask bench` built
/// this binary: every case's binaries share that build's dependency artifacts instead of
/// rebuilding the graph with a per-package feature set.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_harness_runs_a_real_case_and_names_the_cases_when_none_matches() {
        let root = workspace_root();
        assert!(
            root.join("docs/benchmarks.md").is_file(),
            "{}",
            root.display()
        );
        run(
            &root,
            &["api/name-hash".to_owned()],
            Options { quick: true },
            true,
        )
        .unwrap();
        let error = run(&root, &["nope/".to_owned()], Options { quick: true }, true).unwrap_err();
        assert!(error.to_string().contains("api/name-hash"), "{error}");
    }

    #[test]
    fn metric_labels_are_found_by_whole_name() {
        let sample = r#"apiserver_request_total{code="201",resource="pods",subresource="status",verb="POST"}"#;
        assert_eq!(metric_label(sample, "resource"), "pods");
        assert_eq!(metric_label(sample, "subresource"), "status");
        assert_eq!(metric_label(sample, "verb"), "POST");
        assert_eq!(metric_label(sample, "group"), "");
    }

    #[test]
    fn unknown_options_are_refused() {
        let error = cli(["--frobnicate".to_owned()].into_iter()).unwrap_err();
        assert!(error.to_string().contains("--frobnicate"), "{error}");
    }
}
