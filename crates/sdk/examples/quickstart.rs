//! Quickstart: claim a sandbox from a warm pool, run a command, round-trip a file, release it.
//!
//! ```sh
//! cargo run -p agent-sandbox --example quickstart -- python-sandbox-pool
//! ```
//!
//! Uses the default kubeconfig and port-forward to the router in `agent-sandbox-system`; set
//! `SANDBOX_ROUTER_URL` to talk to a router directly instead.

use std::time::{Duration, Instant};

use agent_sandbox::{Client, ClientOptions, ConnectionMode, CreateOptions, ExecOptions};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let pool = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "python-sandbox-pool".to_owned());
    let mut options = ClientOptions::default();
    if let Ok(url) = std::env::var("SANDBOX_ROUTER_URL") {
        options = options.connection(ConnectionMode::direct(url));
    }
    let client = Client::new(options).await?;

    let started = Instant::now();
    let sandbox = client
        .create_sandbox_with(
            &pool,
            CreateOptions::default().shutdown_after(Duration::from_secs(600)),
        )
        .await?;
    println!(
        "sandbox ready in {:?}: claim={} sandbox={} pod={}",
        started.elapsed(),
        sandbox.claim_name(),
        sandbox.sandbox_name(),
        sandbox.pod_name()
    );

    let hello = sandbox
        .run_with(ExecOptions::shell("echo hello from $(hostname)"))
        .await?;
    print!("run: {}", hello.stdout);

    sandbox.write("work/hello.txt", "hi there\n").await?;
    let back = sandbox.read("work/hello.txt").await?;
    println!("read back: {:?}", String::from_utf8_lossy(&back));
    for entry in sandbox.list("work").await? {
        println!("  {} {} bytes", entry.name, entry.size);
    }

    sandbox.close().await?;
    Ok(())
}
