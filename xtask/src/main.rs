//! Project automation, in the style of rust-analyzer's xtask: `cargo xtask <command>`.
//!
//! - `gen-crds`: write `deploy/crds/` from `crates/api` (checked by a test, see [`crds`]);
//! - `bench`: run benchmark cases and write `docs/benchmarks.md` (see [`bench`]).

mod bench;
mod crds;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(about = "Project automation for agent-sandbox", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write the CRDs of crates/api to deploy/crds (or check them with --check).
    #[command(after_help = "Examples:\n  cargo xtask gen-crds\n  cargo xtask gen-crds --check")]
    GenCrds {
        /// Fail instead of writing when the files differ.
        #[arg(long)]
        check: bool,
    },
    /// Run benchmark cases and record them in docs/benchmarks.md.
    #[command(
        after_help = "Examples:\n  cargo xtask bench                 # every case\n  cargo xtask bench api/            # cases whose name starts with api/\n  cargo xtask bench --quick --dry-run\n  cargo xtask bench --list"
    )]
    Bench {
        /// Case name prefixes to run (all when none).
        cases: Vec<String>,
        /// Fewer iterations (a smoke run of the harness).
        #[arg(long)]
        quick: bool,
        /// Print the rows without writing docs/benchmarks.md.
        #[arg(long)]
        dry_run: bool,
        /// List the cases and exit.
        #[arg(long)]
        list: bool,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = workspace_root();
    match cli.command {
        Command::GenCrds { check: true } => crds::check(&root),
        Command::GenCrds { check: false } => crds::write(&root),
        Command::Bench { list: true, .. } => {
            bench::list();
            Ok(())
        }
        Command::Bench {
            cases,
            quick,
            dry_run,
            list: false,
        } => {
            if cfg!(debug_assertions) && !quick {
                // Measurements of unoptimised code mean nothing: run this command again from a
                // release build of xtask (the cases build their own subjects in release too).
                return rerun_in_release();
            }
            bench::run(&root, &cases, bench::Options { quick }, dry_run)
        }
    }
}

/// Runs `cargo run --release -p xtask -- <same arguments>` and exits with its status.
fn rerun_in_release() -> Result<()> {
    let status =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
            .args(["run", "--quiet", "--release", "--package", "xtask", "--"])
            .args(std::env::args_os().skip(1))
            .current_dir(workspace_root())
            .status()?;
    std::process::exit(status.code().unwrap_or(1));
}

/// The workspace root: xtask lives one level below it.
fn workspace_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(PathBuf::from)
        .unwrap_or(manifest_dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed CRDs are what `gen-crds` would write (rust-analyzer's "generated files are
    /// tested" pattern).
    #[test]
    fn crds_are_fresh() {
        if let Err(error) = crds::check(&workspace_root()) {
            panic!("{error:#}");
        }
    }

    /// `kubectl kustomize deploy/crds` (a renderer nobody here wrote) yields exactly our four
    /// CRDs, with the names, scope, versions, subresources and columns of `crates/api`.
    #[test]
    fn kubectl_kustomize_renders_the_four_crds() {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let root = workspace_root();
        let output = match std::process::Command::new("kubectl")
            .args(["kustomize", "deploy/crds"])
            .current_dir(&root)
            .output()
        {
            Ok(output) => output,
            Err(error) => {
                eprintln!("SKIPPED: kubectl is not installed ({error}); .ci/run installs it");
                return;
            }
        };
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let text = String::from_utf8(output.stdout).unwrap();
        let rendered: Vec<CustomResourceDefinition> = serde_saphyr::from_multiple(&text).unwrap();
        let surface = |crd: &CustomResourceDefinition| {
            let versions: Vec<_> = crd
                .spec
                .versions
                .iter()
                .map(|v| {
                    (
                        v.name.clone(),
                        v.served,
                        v.storage,
                        v.subresources.clone(),
                        v.additional_printer_columns.clone(),
                    )
                })
                .collect();
            (
                crd.metadata.name.clone(),
                crd.spec.group.clone(),
                crd.spec.names.clone(),
                crd.spec.scope.clone(),
                versions,
            )
        };
        let mut expected: Vec<_> = agent_sandbox_api::crds::all().iter().map(surface).collect();
        let mut actual: Vec<_> = rendered.iter().map(surface).collect();
        expected.sort_by(|a, b| a.0.cmp(&b.0));
        actual.sort_by(|a, b| a.0.cmp(&b.0));
        pretty_assertions::assert_eq!(actual, expected);
        assert_eq!(rendered.len(), 4);
    }

    #[test]
    fn bench_harness_runs_a_real_case() {
        let root = workspace_root();
        bench::run(
            &root,
            &["api/name-hash".to_owned()],
            bench::Options { quick: true },
            true,
        )
        .unwrap();
        let error = bench::run(
            &root,
            &["nope/".to_owned()],
            bench::Options { quick: true },
            true,
        )
        .unwrap_err();
        assert!(error.to_string().contains("api/name-hash"), "{error}");
    }

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
