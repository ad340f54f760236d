//! Commands about warm pools: `pools`, and the check that the pool a claim asks for exists
//! (with the pools that do in its error), through the SDK's [`Client`]. The table is drawn by a
//! pure function ([`pools_table`]) so that it is snapshot-tested without a cluster.

use agent_sandbox::{Client, WarmPoolInfo};

use super::{print, render, sdk};
use crate::cli::PoolsArgs;
use crate::error::{Error, Result};
use crate::output::{self, Format};

/// One line of `sandboxctl pools` (also its JSON and YAML): the SDK's pool, as it is.
pub type PoolRow = WarmPoolInfo;

/// The `pools` table.
pub fn pools_table(rows: &[PoolRow], with_namespace: bool) -> String {
    let mut header = vec!["NAME", "TEMPLATE", "DESIRED", "CURRENT", "READY"];
    if with_namespace {
        header.insert(0, "NAMESPACE");
    }
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut row = vec![
                r.name.clone(),
                r.template.clone(),
                r.desired.to_string(),
                r.current.to_string(),
                r.ready.to_string(),
            ];
            if with_namespace {
                row.insert(0, r.namespace.clone());
            }
            row
        })
        .collect();
    output::table(&header, &body)
}

/// Checks that `pool` exists in the client's namespace, with an error listing the pools that
/// do.
pub async fn ensure_pool(client: &Client, pool: &str) -> Result<()> {
    let namespace = client.namespace();
    let found = client
        .warm_pool(pool)
        .await
        .map_err(sdk(format!("get SandboxWarmPool {namespace}/{pool}")))?;
    if found.is_some() {
        return Ok(());
    }
    let existing = client
        .warm_pools()
        .await
        .map_err(sdk(format!("list the warm pools in {namespace}")))?;
    Err(Error::PoolNotFound {
        namespace: namespace.to_owned(),
        pool: pool.to_owned(),
        existing: existing.into_iter().map(|p| p.name).collect(),
    })
}

/// `sandboxctl pools`.
pub async fn pools(client: &Client, args: PoolsArgs) -> Result<i32> {
    let (listed, ns) = if args.all_namespaces {
        (client.warm_pools_all_namespaces().await, "*")
    } else {
        (client.warm_pools().await, client.namespace())
    };
    let mut rows: Vec<PoolRow> =
        listed.map_err(sdk(format!("list the warm pools in namespace {ns}")))?;
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    if rows.is_empty() && args.output == Format::Table {
        eprintln!("No warm pools in namespace {ns}.");
        return Ok(0);
    }
    let text = render(args.output, &rows, || {
        pools_table(&rows, args.all_namespaces)
    })?;
    print(&text)?;
    Ok(0)
}
