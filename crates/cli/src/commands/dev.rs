//! `sandboxctl dev`: a local cluster until Ctrl-C.

use std::time::Duration;

use agent_sandbox_local::{
    DEFAULT_NAMESPACE, DEFAULT_POOL, DEFAULT_TEMPLATE, LocalCluster, LocalConfig, PodNetworks,
    RouterAuth,
};

use crate::cli::{DevArgs, ENV_ROUTER_TOKEN, ENV_ROUTER_URL, ENV_SIGNING_KEY_FILE};
use crate::error::{Error, Result};
use crate::spinner::Spinner;

/// Starts the local cluster, prints how to use it, and runs until Ctrl-C or SIGTERM.
pub async fn dev(args: DevArgs) -> Result<i32> {
    let auth: RouterAuth = args.auth.parse().map_err(Error::Usage)?;
    // The router also as a pod behind `sandbox-router-svc`, as an installation has it (upstream's
    // SDKs' default modes port-forward to that Service), when its binary sits next to ours and
    // pods have networks of their own (it reaches the API server and the sandboxes).
    let networks = args.network.resolve();
    let router_pod = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("sandbox-router")))
        .filter(|path| path.is_file() && networks == PodNetworks::Own);
    let config = LocalConfig {
        router_pod,
        data_dir: args.data_dir.clone(),
        kubeconfig: args.kubeconfig_out.clone(),
        isolation: args.isolation,
        networks,
        api_port: args.api_port,
        router_port: args.router_port,
        router_auth: auth,
        pool_replicas: args.replicas,
        ..LocalConfig::default()
    };
    let spinner = Spinner::start("starting the local cluster");
    let started = tokio::select! {
        cluster = LocalCluster::start(config) => Some(cluster),
        () = super::interrupted() => None,
    };
    let Some(cluster) = started else {
        return Ok(130);
    };
    let cluster = cluster.map_err(|source| Error::Local { source })?;
    if args.replicas > 0 {
        spinner.set_message(format!("warming the pool {DEFAULT_POOL}"));
        let waited = tokio::select! {
            waited = cluster.wait_for_pool(1, Duration::from_secs(120), |ready, want| {
                spinner.set_message(format!("warming the pool {DEFAULT_POOL}: {ready}/{want} ready"));
            }) => Some(waited),
            () = super::interrupted() => None,
        };
        let Some(waited) = waited else {
            spinner.finish();
            cluster.stop().await;
            return Ok(130);
        };
        waited.map_err(|source| Error::Local { source })?;
    }
    spinner.finish();
    eprint!("{}", banner(&cluster, args.replicas));
    super::interrupted().await;
    eprintln!("stopping the local cluster…");
    cluster.stop().await;
    eprintln!("stopped; no process left behind");
    Ok(0)
}

/// What `dev` prints once the cluster is up.
fn banner(cluster: &LocalCluster, replicas: i32) -> String {
    let kubeconfig = cluster.kubeconfig_path().display().to_string();
    let router = cluster.router_url().unwrap_or_default();
    let mut env = vec![
        format!("export KUBECONFIG={kubeconfig}"),
        format!("export {ENV_ROUTER_URL}={router}"),
    ];
    let mut sdk_token = String::new();
    match (cluster.router_auth(), cluster.secret_path()) {
        (RouterAuth::Token, Some(path)) => {
            env.push(format!(
                "export {ENV_ROUTER_TOKEN}=$(cat {})",
                path.display()
            ));
            sdk_token = format!("\n        .router_token(std::env::var(\"{ENV_ROUTER_TOKEN}\")?)");
        }
        (RouterAuth::Scoped, Some(path)) => {
            env.push(format!("export {ENV_SIGNING_KEY_FILE}={}", path.display()));
        }
        _ => {}
    }
    format!(
        "\
Local agent-sandbox cluster is up (simulated API, controller, router; pods run on this machine, isolation: {isolation}).
Sandboxes: {protections}.

  API server    {api} (TLS; requests without the kubeconfig's token get 401, pods use their ServiceAccount tokens)
  kubeconfig    {kubeconfig} (its certificate authority and admin token; mode 0600)
  router        {router} (auth: {auth:?}; 127.0.0.1 only)
  router pod    {router_pod}
  warm pool     {DEFAULT_NAMESPACE}/{DEFAULT_POOL} ({replicas} sandboxes, template {DEFAULT_NAMESPACE}/{template})
  data          {data}

In another terminal:

  {env}

  kubectl get sandboxwarmpools,sandboxclaims,sandboxes,pods
  sandboxctl run -- python3 -c 'print(6*7)'
  C=$(sandboxctl claim --pool {DEFAULT_POOL}) && sandboxctl exec $C -- 'echo hello from $(hostname)'

From Rust (the SDK, crate agent-sandbox), with that environment:

  let client = agent_sandbox::Client::new(
      agent_sandbox::ClientOptions::default()
        .connection(agent_sandbox::ConnectionMode::direct(\"{router}\")){sdk_token},
  ).await?;

Ctrl-C stops everything.
",
        isolation = cluster.isolation(),
        protections = cluster.startup_notes().join(".\n"),
        router_pod = match cluster.router_pod_url() {
            Some(url) => format!(
                "{url} behind {}/{} (port-forward mode)",
                agent_sandbox_api::wire::SYSTEM_NAMESPACE,
                agent_sandbox_api::wire::ROUTER_SERVICE
            ),
            None => "none (it needs the sandbox-router binary next to sandboxctl and pods on a \
                     network of their own: port-forward mode has no Service to reach)"
                .to_owned(),
        },
        api = cluster.api_url(),
        auth = cluster.router_auth(),
        template = DEFAULT_TEMPLATE,
        data = cluster.data_dir().display(),
        env = env.join("\n  "),
    )
}
