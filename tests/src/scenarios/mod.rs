//! The scenarios, by the issue they come from. Each takes the [`ClusterUnderTest`] and either passes,
//! is skipped with a reason (a capability this cluster lacks), or fails with an [`Error`]
//! saying what was expected and what was seen.
//!
//! Every object a scenario creates is named `e2e-<run>-...` and labelled with the run, and the
//! scenario deletes it; the runner deletes whatever a failed scenario left behind.
//!
//! [`Error`]: crate::Error

use std::future::Future;
use std::pin::Pin;

use crate::cluster::ClusterUnderTest;
use crate::error::Result;

mod agent;
mod cli;
mod controller;
mod idle;
mod network;
mod router;
mod runtime;
mod sdk;
mod upstream;

/// How a scenario ended, when it did not fail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every check held.
    Passed,
    /// Not run on this cluster, for this reason.
    Skipped(String),
}

/// A scenario's future.
pub type ScenarioFuture<'a> = Pin<Box<dyn Future<Output = Result<Verdict>> + Send + 'a>>;

/// One scenario.
#[derive(Clone, Copy)]
pub struct Scenario {
    /// `area::name`, what filters match.
    pub name: &'static str,
    /// Runs it.
    pub run: for<'a> fn(&'a ClusterUnderTest) -> ScenarioFuture<'a>,
}

impl std::fmt::Debug for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

macro_rules! scenario {
    ($area:ident :: $name:ident) => {{
        fn run(cluster: &ClusterUnderTest) -> ScenarioFuture<'_> {
            Box::pin($area::$name(cluster))
        }
        Scenario {
            name: concat!(stringify!($area), "::", stringify!($name)),
            run,
        }
    }};
}

/// Every scenario, in the order they are reported.
pub fn all() -> Vec<Scenario> {
    vec![
        scenario!(controller::a_warm_claim_adopts_a_running_member_and_the_pool_refills),
        scenario!(controller::concurrent_claims_get_distinct_sandboxes_warm_then_cold),
        scenario!(controller::an_expired_claim_is_deleted_with_its_sandbox),
        scenario!(controller::deleting_a_claim_deletes_its_sandbox_and_pod),
        scenario!(controller::a_suspended_sandbox_loses_its_pod_and_resumes),
        scenario!(controller::the_template_policy_admits_only_the_router),
        scenario!(idle::an_idle_sandbox_suspends_and_the_next_run_wakes_it),
        scenario!(idle::a_running_command_keeps_its_sandbox_from_idling),
        scenario!(idle::a_killed_clients_claim_is_gone_after_its_pools_default_idle_ttl),
        scenario!(router::under_upstreams_pods_only_rbac_unclaimed_pool_members_are_refused),
        scenario!(runtime::uname_in_a_sandbox_names_its_runtimes_kernel),
        scenario!(sdk::round_trip_through_port_forward),
        scenario!(sdk::round_trip_through_a_direct_url),
        scenario!(sdk::round_trip_through_a_gateway),
        scenario!(sdk::a_token_for_another_sandbox_is_refused),
        scenario!(cli::run_prints_the_output_and_leaves_no_claim),
        scenario!(cli::claim_exec_cp_cat_extend_delete),
        scenario!(agent::the_agent_writes_and_runs_a_script_then_deletes_its_claim),
        scenario!(network::a_sandbox_cannot_reach_the_api_server_but_reaches_the_internet),
        scenario!(network::a_router_outside_the_admitted_namespace_times_out_until_an_additive_policy_admits_it),
        scenario!(network::a_sandbox_reaches_neither_another_sandbox_nor_its_nodes_kubelet),
        scenario!(network::a_sandbox_cannot_read_the_users_home_or_kubeconfig),
        scenario!(upstream::go_sdk_smoke_test),
        scenario!(upstream::python_sdk_smoke_test),
    ]
}
