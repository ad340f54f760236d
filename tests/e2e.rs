//! The end-to-end suite's entry point (`harness = false`): see `agent_sandbox_e2e::runner`.
//! `cargo test -p agent-sandbox-e2e` runs it on the simulated cluster; `cargo xtask e2e`
//! chooses the cluster.

fn main() {
    // Upstream's clients are built first: that needs the Go module proxy and PyPI, which a run
    // in its own network namespace cannot reach.
    let mut prepared = Vec::new();
    if agent_sandbox_e2e::runner::upstream_selected() {
        prepared = agent_sandbox_e2e::upstream::prepared_env();
    }
    // The control-plane and node tiers run in namespaces of their own (pod IPs that a real API
    // server accepts in EndpointSlices; a real node's mounts and processes); this process then
    // only waits for the run inside them.
    if let Some(layout) = agent_sandbox_e2e::runner::own_namespaces() {
        match agent_sandbox_e2e::netns::run_inside_as(layout, &prepared) {
            Ok(Some(code)) => std::process::exit(code),
            Ok(None) => {}
            Err(message) => {
                eprintln!("e2e: {message}");
                std::process::exit(2);
            }
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("e2e: cannot start a tokio runtime: {error}");
            std::process::exit(2);
        }
    };
    let code = runtime.block_on(agent_sandbox_e2e::runner::main());
    // Pods, port-forwards and child processes end with the runtime.
    runtime.shutdown_timeout(std::time::Duration::from_secs(10));
    std::process::exit(code);
}
