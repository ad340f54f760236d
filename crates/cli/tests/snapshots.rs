//! Snapshot tests (insta) of every command's help and of the table output, so that a change in
//! what users read shows up in review. Update with `INSTA_UPDATE=always cargo test -p sandboxctl
//! --test snapshots` (or `cargo insta review`) and commit the `.snap` files.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use agent_sandbox_cli::cli::Cli;
use agent_sandbox_cli::commands::claims::{ClaimRow, claims_table};
use agent_sandbox_cli::commands::pools::{PoolRow, pools_table};
use agent_sandbox_cli::commands::sandbox::entries_table;
use clap::CommandFactory as _;

#[test]
fn help_of_every_command() {
    let mut command = Cli::command();
    // Propagates names and global flags to the subcommands, as parsing would.
    command.build();
    insta::assert_snapshot!("help", command.render_long_help().to_string());
    let names: Vec<String> = command
        .get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
        .map(|c| c.get_name().to_owned())
        .collect();
    assert_eq!(names.len(), 18, "{names:?}");
    for name in names {
        let sub = command.find_subcommand_mut(&name).unwrap();
        let help = sub.render_long_help().to_string();
        assert!(help.contains("Examples:"), "{name} has no examples");
        insta::assert_snapshot!(format!("help_{name}"), help);
    }
}

fn claim(name: &str, sandbox: &str, ready: &str, reason: &str, expires: &str) -> ClaimRow {
    ClaimRow {
        namespace: "default".into(),
        name: name.into(),
        pool: "python".into(),
        sandbox: sandbox.into(),
        pod: sandbox.into(),
        ready: ready.into(),
        reason: reason.into(),
        created: "2026-01-01T11:58:00Z".into(),
        expires: expires.into(),
    }
}

#[test]
fn list_table() {
    let now: jiff::Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
    let rows = vec![
        claim(
            "sandbox-claim-x7k2q",
            "python-5zmcv",
            "True",
            "",
            "2026-01-01T12:30:00Z",
        ),
        claim("sandbox-claim-pending", "", "False", "WarmPoolEmpty", ""),
        claim(
            "sandbox-claim-old",
            "python-cbqv2",
            "True",
            "",
            "2026-01-01T11:59:00Z",
        ),
    ];
    insta::assert_snapshot!("list", claims_table(&rows, now, false));
    insta::assert_snapshot!("list_all_namespaces", claims_table(&rows[..1], now, true));
}

#[test]
fn pools_table_output() {
    let rows = vec![
        PoolRow {
            namespace: "default".into(),
            name: "python".into(),
            template: "python".into(),
            desired: 2,
            current: 2,
            ready: 1,
        },
        PoolRow {
            namespace: "default".into(),
            name: "node-large".into(),
            template: "node".into(),
            desired: 10,
            current: 0,
            ready: 0,
        },
    ];
    insta::assert_snapshot!("pools", pools_table(&rows, false));
}

#[test]
fn ls_table() {
    let entries: Vec<agent_sandbox::FileEntry> = serde_json::from_value(serde_json::json!([
        {"name": "data", "size": 4096, "type": "directory", "modified_at": "2026-01-01T12:00:00Z", "mode": "0755"},
        {"name": "main.py", "size": 120, "type": "file", "modified_at": "2026-01-01T12:01:00Z", "mode": "0644"}
    ]))
    .unwrap();
    insta::assert_snapshot!("ls", entries_table(&entries));
}
