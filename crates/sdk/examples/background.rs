//! Background process: start a long-running command, follow its output (reconnecting if the
//! connection drops), then stop it with a signal.
//!
//! ```sh
//! cargo run -p agent-sandbox --example background -- python-sandbox-pool
//! ```

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

    let process = sandbox
        .start_process(ExecOptions::shell(
            "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.1; done",
        ))
        .await?;
    println!("started process {} (pid {})", process.id, process.pid);

    let mut output = sandbox.follow_output(&process.id, 0);
    let mut ticks = 0;
    while let Some(event) = output.next_event().await {
        match event? {
            ExecEvent::Stdout(chunk) => {
                print!(
                    "{}",
                    String::from_utf8_lossy(&chunk.bytes().unwrap_or_default())
                );
                ticks += 1;
                if ticks == 5 {
                    sandbox.signal_process(&process.id, "TERM").await?;
                }
            }
            ExecEvent::Exit(exit) => println!("ended by signal {:?}", exit.signal),
            _ => {}
        }
    }
    sandbox.close().await?;
    Ok(())
}
