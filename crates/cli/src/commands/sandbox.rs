//! Commands that work inside sandboxes, through the SDK: `run`, `claim`, `exec`, `cp`, `ls`,
//! `cat`, `rm`.

use crate::cli::{ClaimArgs, CpArgs, ExecArgs, GlobalArgs, LsArgs, PathArg, RunArgs};
use crate::context::Cluster;
use crate::error::{Error, Result};

fn pending() -> Error {
    Error::Usage("not implemented yet".to_owned())
}

/// `sandboxctl run --local`.
pub async fn run_local(_global: &GlobalArgs, _args: RunArgs) -> Result<i32> {
    Err(pending())
}
/// `sandboxctl run`.
pub async fn run(_cluster: &Cluster, _args: RunArgs) -> Result<i32> {
    Err(pending())
}
/// `sandboxctl claim`.
pub async fn claim(_cluster: &Cluster, _args: ClaimArgs) -> Result<i32> {
    Err(pending())
}
/// `sandboxctl exec`.
pub async fn exec(_cluster: &Cluster, _args: ExecArgs) -> Result<i32> {
    Err(pending())
}
/// `sandboxctl cp`.
pub async fn cp(_cluster: &Cluster, _args: CpArgs) -> Result<i32> {
    Err(pending())
}
/// `sandboxctl ls`.
pub async fn ls(_cluster: &Cluster, _args: LsArgs) -> Result<i32> {
    Err(pending())
}
/// `sandboxctl cat`.
pub async fn cat(_cluster: &Cluster, _args: PathArg) -> Result<i32> {
    Err(pending())
}
/// `sandboxctl rm`.
pub async fn rm(_cluster: &Cluster, _args: PathArg) -> Result<i32> {
    Err(pending())
}
