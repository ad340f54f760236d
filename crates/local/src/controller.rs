//! [`ControllerTask`]: the controller of this workspace as a task of the calling process,
//! against any cluster's API (a local cluster's, or one it did not start).

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};

/// The controller running in this process. Dropping it aborts it (in-flight requests are
/// dropped, as in a crash); [`ControllerTask::stop`] shuts it down the way SIGTERM does.
#[derive(Debug)]
pub struct ControllerTask {
    task: Option<JoinHandle<agent_sandbox_controller::Result<()>>>,
    shutdown: CancellationToken,
}

impl ControllerTask {
    /// Starts `agent_sandbox_controller::run` with `config` against `client`.
    pub fn spawn(client: kube::Client, config: agent_sandbox_controller::Config) -> Self {
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let task = tokio::spawn(async move {
            let ended = agent_sandbox_controller::run(client, config, stop.cancelled_owned()).await;
            if let Err(error) = &ended {
                tracing::error!(%error, "the in-process controller stopped");
            }
            ended
        });
        Self {
            task: Some(task),
            shutdown,
        }
    }

    /// Asks the controller to shut down (leases released, work drained) and waits for it at most
    /// `grace`. Its own failure, a panic, or not stopping in time (it is then aborted) are
    /// errors.
    pub async fn stop(mut self, grace: Duration) -> Result<()> {
        self.shutdown.cancel();
        let Some(mut task) = self.task.take() else {
            return Ok(());
        };
        match tokio::time::timeout(grace, &mut task).await {
            Ok(Ok(ended)) => ended.map_err(|source| Error::Controller { source }),
            Ok(Err(join)) => Err(Error::ControllerPanicked {
                message: join.to_string(),
            }),
            Err(_) => {
                task.abort();
                Err(Error::ControllerStuck { after: grace })
            }
        }
    }

    /// Kills the controller abruptly, as a crash would.
    pub fn abort(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Drop for ControllerTask {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
