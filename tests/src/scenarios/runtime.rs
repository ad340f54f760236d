//! Which kernel a sandbox's code runs on: gVisor's own under `runtimeClassName: gvisor`, the
//! node's under runc and on the tiers whose pods are this machine's processes.

use std::time::Duration;

use agent_sandbox::CreateOptions;

use super::Verdict;
use crate::cluster::{ClusterUnderTest, SdkMode};
use crate::ensure;
use crate::error::{Error, Result};
use crate::support::RUN_LABEL;

/// gVisor's kernel names itself in its release (`4.19.0-gvisor`, not configurable per pod).
const GVISOR_RELEASE_MARK: &str = "gvisor";

/// The kernel's release (`uname -r`) and `/proc/version` in a sandbox of the pass's pool: under gVisor, gVisor's
/// release and not this machine's; with no RuntimeClass on a node of this machine, this
/// machine's own release.
pub(super) async fn uname_in_a_sandbox_names_its_runtimes_kernel(
    cluster: &ClusterUnderTest,
) -> Result<Verdict> {
    let gvisor = cluster.runtime_class.as_deref() == Some("gvisor");
    if !gvisor && !cluster.nodes_share_this_kernel() {
        return Ok(Verdict::Skipped(format!(
            "the nodes of {} are other machines and pool {} names no gVisor RuntimeClass: \
             there is no kernel to compare the sandbox's with",
            cluster.description, cluster.pool
        )));
    }
    let release_file = "/proc/sys/kernel/osrelease";
    let host = std::fs::read_to_string(release_file)
        .map_err(Error::io("read", release_file))?
        .trim()
        .to_owned();
    let client = cluster.sdk(SdkMode::PortForward).map_err(Error::Config)?;
    let sandbox = client
        .create_sandbox_with(
            &cluster.pool,
            CreateOptions::default()
                .label(RUN_LABEL, cluster.run.clone())
                .shutdown_after(Duration::from_secs(600)),
        )
        .await
        .map_err(Error::sdk(format!(
            "claim a sandbox from pool {}",
            cluster.pool
        )))?;
    let outcome = async {
        let run = sandbox
            .run("cat /proc/sys/kernel/osrelease /proc/version")
            .await
            .map_err(Error::sdk("read the kernel's release"))?;
        ensure!(
            run.exit_code == 0,
            "cat /proc/sys/kernel/osrelease /proc/version exited {} (stderr {:?})",
            run.exit_code,
            run.stderr
        );
        let mut lines = run.stdout.lines();
        let release = lines.next().unwrap_or_default().trim();
        let version = lines.next().unwrap_or_default();
        if gvisor {
            ensure!(
                release.contains(GVISOR_RELEASE_MARK) && release != host,
                "under runtimeClassName gvisor the sandbox reports kernel {release:?} \
                 ({version}); gVisor's names itself ({GVISOR_RELEASE_MARK}), this machine's is \
                 {host:?}"
            );
        } else if cluster.runtime_class.is_none() {
            ensure!(
                release == host && version.contains(&host),
                "with the node's default runtime the sandbox reports kernel {release:?} \
                 ({version}), not this machine's {host:?}"
            );
        } else {
            return Ok(Verdict::Skipped(format!(
                "pool {} runs under RuntimeClass {:?}, whose kernel this scenario does not know \
                 (sandbox: {release})",
                cluster.pool, cluster.runtime_class
            )));
        }
        Ok(Verdict::Passed)
    }
    .await;
    let _ = sandbox.close().await;
    outcome
}
