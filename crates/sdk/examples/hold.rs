//! Hold a sandbox until Ctrl-C (or SIGTERM), then delete its claim: `enable_auto_cleanup`.
//!
//! ```sh
//! cargo run -p agent-sandbox --example hold -- python-sandbox-pool
//! ```
//!
//! Prints `claim=<name>` once the sandbox is ready. Set `SANDBOX_ROUTER_URL` for direct mode
//! and `SANDBOX_NAMESPACE` for the claims' namespace.

use agent_sandbox::{Client, ClientOptions, ConnectionMode};

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
    if let Ok(namespace) = std::env::var("SANDBOX_NAMESPACE") {
        options = options.namespace(namespace);
    }
    let client = Client::new(options).await?;
    let _cleanup = client.enable_auto_cleanup()?;
    let sandbox = client.create_sandbox(&pool).await?;
    println!("claim={}", sandbox.claim_name());
    // Wait for the signal; the cleanup handler deletes the claim and exits the process.
    std::future::pending::<()>().await;
    Ok(())
}
