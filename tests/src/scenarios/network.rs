//! The seed's network probe, from inside a sandbox: the Kubernetes API server's Service
//! address is blocked by the template's NetworkPolicy, a public address is reachable.

use std::time::Duration;

use agent_sandbox::CreateOptions;
use k8s_openapi::api::core::v1::Service;
use kube::Api;

use super::Verdict;
use crate::cluster::{ClusterUnderTest, NetworkEnforcement, SdkMode};
use crate::ensure;
use crate::error::{Error, Result};
use crate::support::RUN_LABEL;

/// A TCP connect from the sandbox with a timeout; prints `open`, `refused` or `timeout`.
const PROBE: &str = "import socket,sys\n\
host,port=sys.argv[1],int(sys.argv[2])\n\
s=socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET)\n\
s.settimeout(5)\n\
try:\n    s.connect((host,port)); print('open')\n\
except socket.timeout:\n    print('timeout')\n\
except OSError as e:\n    print('refused' if e.errno==111 else 'error %s' % e)\n";

/// The API server (Service `kubernetes` in `default`) times out from a sandbox; the public
/// address connects.
pub(super) async fn a_sandbox_cannot_reach_the_api_server_but_reaches_the_internet(
    cluster: &ClusterUnderTest,
) -> Result<Verdict> {
    if let NetworkEnforcement::NotEnforced(reason) = &cluster.network {
        return Ok(Verdict::Skipped(reason.clone()));
    }
    let services: Api<Service> = Api::namespaced(cluster.kube.clone(), "default");
    let api_ip = services
        .get("kubernetes")
        .await
        .map_err(Error::kube("get Service default/kubernetes"))?
        .spec
        .and_then(|s| s.cluster_ip)
        .ok_or_else(|| Error::Check("Service default/kubernetes has no cluster IP".to_owned()))?;
    let (public_host, public_port) = cluster.public_address.rsplit_once(':').ok_or_else(|| {
        Error::Config(format!(
            "{} must be HOST:PORT, not {:?}",
            crate::env::PUBLIC_ADDRESS,
            cluster.public_address
        ))
    })?;
    let client = cluster.sdk(SdkMode::PortForward).map_err(Error::Config)?;
    let sandbox = client
        .create_sandbox_with(
            &cluster.pool,
            CreateOptions::default()
                .label(RUN_LABEL, cluster.run.clone())
                .shutdown_after(Duration::from_secs(600)),
        )
        .await
        .map_err(Error::sdk("claim a sandbox for the network probe"))?;
    let outcome = async {
        sandbox
            .write("probe.py", PROBE.as_bytes().to_vec())
            .await
            .map_err(Error::sdk("write probe.py"))?;
        let api = sandbox
            .run(&format!("python3 probe.py {api_ip} 443"))
            .await
            .map_err(Error::sdk("probe the API server"))?;
        ensure!(
            api.stdout.trim() == "timeout",
            "from the sandbox, the API server {api_ip}:443 answered {:?} (expected a silent \
             drop by the NetworkPolicy; stderr {:?})",
            api.stdout.trim(),
            api.stderr
        );
        let public = sandbox
            .run(&format!("python3 probe.py {public_host} {public_port}"))
            .await
            .map_err(Error::sdk("probe the public address"))?;
        ensure!(
            public.stdout.trim() == "open",
            "from the sandbox, {} gave {:?} (expected open; stderr {:?})",
            cluster.public_address,
            public.stdout.trim(),
            public.stderr
        );
        Ok(())
    }
    .await;
    let _ = sandbox.close().await;
    outcome.map(|()| Verdict::Passed)
}
