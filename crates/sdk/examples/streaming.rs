//! Streaming: print a command's output as it is produced, then its exit code.
//!
//! ```sh
//! cargo run -p agent-sandbox --example streaming -- python-sandbox-pool
//! ```

use std::io::Write as _;

use agent_sandbox::{Client, ClientOptions, ExecEvent, ExecOptions};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let pool = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "python-sandbox-pool".to_owned());
    let client = Client::new(ClientOptions::default()).await?;
    let _cleanup = client.enable_auto_cleanup()?;
    let sandbox = client.create_sandbox(&pool).await?;

    let mut stream = sandbox
        .exec_stream(ExecOptions::shell(
            "for i in 1 2 3; do echo step $i; sleep 0.2; done; echo done >&2",
        ))
        .await?;
    let mut exit_code = None;
    while let Some(event) = stream.next_event().await {
        match event? {
            ExecEvent::Stdout(chunk) => {
                std::io::stdout().write_all(&chunk.bytes().unwrap_or_default())?;
            }
            ExecEvent::Stderr(chunk) => {
                std::io::stderr().write_all(&chunk.bytes().unwrap_or_default())?;
            }
            ExecEvent::Exit(exit) => exit_code = exit.exit_code,
            _ => {}
        }
    }
    println!("exit code: {exit_code:?}");
    sandbox.close().await?;
    Ok(())
}
