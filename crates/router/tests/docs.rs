#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `docs/router.md` names every flag `sandbox-router` accepts and every upstream environment
//! variable it reads, and names no flag it does not accept. A flag added to `Args` without a
//! line in the docs (or a documented flag that went away) fails here.

use std::collections::BTreeSet;

use agent_sandbox_api::wire::router_env;
use clap::{Args as _, Command};

fn docs() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/router.md")).unwrap()
}

/// Every `--flag` the router's `Args` define (visible or hidden), plus the binary's own.
fn flags() -> BTreeSet<String> {
    let command = agent_sandbox_router::Args::augment_args(Command::new("sandbox-router"));
    command
        .get_arguments()
        .filter_map(|arg| arg.get_long())
        .map(|long| format!("--{long}"))
        .chain(["--log-format", "--version"].map(str::to_owned))
        .collect()
}

/// Every `` `--flag`` `` (in backticks, possibly followed by `=`, a space or a value) the docs
/// mention outside the mint-token and v2-key-file descriptions.
fn documented_flags(docs: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for chunk in docs.split('`').skip(1).step_by(2) {
        for word in chunk.split_whitespace() {
            if let Some(rest) = word.strip_prefix("--") {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
                    .collect();
                if !name.is_empty() {
                    found.insert(format!("--{name}"));
                }
            }
        }
    }
    found
}

#[test]
fn every_flag_is_documented_and_every_documented_flag_exists() {
    let docs = docs();
    let flags = flags();
    let documented = documented_flags(&docs);
    let missing: Vec<_> = flags.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "flags missing from docs/router.md: {missing:?}"
    );
    // Flags of the subcommands, of other commands (`kubectl`, `basenc`, `sandboxctl`), and the
    // placeholder `--flag`, all named in the same file.
    let subcommand_flags = [
        "--base64url",
        "--local",
        "--flag",
        "--kid",
        "--uid",
        "--port",
        "--method",
        "--path",
        "--sandbox",
        "--ttl-seconds",
        "--v2-private-key-file",
        "--private-key-file",
        "--from-literal",
    ];
    let unknown: Vec<_> = documented
        .iter()
        .filter(|flag| !flags.contains(*flag) && !subcommand_flags.contains(&flag.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "docs/router.md names flags the router does not have: {unknown:?}"
    );
}

#[test]
fn every_upstream_environment_variable_is_documented() {
    let docs = docs();
    for name in router_env::WITHOUT_EFFECT.iter().chain(&[
        router_env::ROUTER_AUTH_TOKEN,
        router_env::ALLOW_UNAUTHENTICATED_ROUTER,
        router_env::PROXY_TIMEOUT_SECONDS,
        router_env::CLUSTER_DOMAIN,
        router_env::SANDBOX_ROUTER_CONFIG,
    ]) {
        assert!(
            docs.contains(&format!("`{name}`")),
            "{name} is not in docs/router.md"
        );
    }
    for truthy in router_env::TRUTHY {
        assert!(
            docs.contains(&format!("`{truthy}`")),
            "truthy value {truthy}"
        );
    }
}
