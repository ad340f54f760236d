//! The agent-sandbox controller: reconcilers for `Sandbox` (agents.x-k8s.io/v1beta1) and
//! `SandboxTemplate`, `SandboxWarmPool`, `SandboxClaim` (extensions.agents.x-k8s.io/v1beta1).
//!
//! - [`decide`]: every decision as a pure function (sans IO, unit-tested);
//! - [`reconcile`]: the four reconcilers, which read the shared caches ([`cache`]), call the
//!   decisions and write the result;
//! - [`run`]: CRD check, probes and metrics ([`http`], [`metrics`]), leader election
//!   ([`leader`]), the caches and the four controllers, until shutdown.
//!
//! The binary `agent-sandbox-controller` parses [`config::Args`] and calls [`run`].

pub mod cache;
pub mod config;
pub mod context;
pub mod decide;
pub mod error;
pub mod http;
pub mod leader;
pub mod lenient;
pub mod metrics;
pub mod rate;
pub mod reconcile;

use std::future::Future;
use std::sync::Arc;

use agent_sandbox_api::{Sandbox, SandboxClaim, SandboxTemplate, SandboxWarmPool};
use futures::StreamExt;
use futures::future::{FutureExt, Shared};
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, Resource, ResourceExt};
use tokio::task::JoinSet;

pub use config::{Args, Config, Startup};
pub use context::Context;
pub use error::{Error, ErrorClass, Result};
pub use reconcile::Reconciler;

/// Checks that the four CRDs are installed (without `extensions`, the Sandbox CRD), with an
/// error that says how to install them.
///
/// Through API discovery (`/apis/{group}/{version}`), which every authenticated client may read,
/// rather than by reading the CRDs: upstream's ClusterRoles, which our image runs under when
/// deployed with upstream's manifests, grant nothing on CustomResourceDefinitions. A kind is
/// listed there once its CRD is established.
pub async fn check_crds(client: &Client, extensions: bool) -> Result<()> {
    let core_group = Sandbox::group(&());
    for crd in agent_sandbox_api::crds::all()
        .into_iter()
        .filter(|crd| extensions || crd.spec.group == core_group)
    {
        let name = crd.name_any();
        let Some(version) = crd.spec.versions.iter().find(|version| version.served) else {
            continue;
        };
        let api_version = format!("{}/{}", crd.spec.group, version.name);
        let served = match client.list_api_group_resources(&api_version).await {
            Ok(list) => list
                .resources
                .iter()
                .any(|resource| resource.name == crd.spec.names.plural),
            Err(source) if error::is_not_found(&source) => false,
            Err(source) => return Err(Error::CrdCheck { name, source }),
        };
        if !served {
            return Err(Error::CrdMissing { name });
        }
    }
    Ok(())
}

fn error_policy<K: Resource>(
    controller: Reconciler,
) -> impl Fn(Arc<K>, &Error, Arc<Context>) -> Action {
    move |object, error, ctx| {
        let class = error.class();
        ctx.metrics.reconcile_failed(controller, class);
        tracing::warn!(%controller, object = %context::key(object.as_ref()), %error, "reconcile failed");
        // A conflict means the cache is behind a write: look again soon, with a fresh view.
        let retry = if class == ErrorClass::Conflict {
            std::time::Duration::from_millis(100)
        } else {
            std::time::Duration::from_secs(2)
        };
        Action::requeue(retry)
    }
}

/// How long one reconcile may take before it is abandoned (and retried): a hung API call must
/// never wedge an object.
const RECONCILE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Wraps a reconciler with [`RECONCILE_TIMEOUT`] and a debug line per outcome.
fn bounded<K, F, Fut>(
    controller: Reconciler,
    reconcile: F,
) -> impl FnMut(Arc<K>, Arc<Context>) -> futures::future::BoxFuture<'static, Result<Action>>
where
    K: Resource + Send + Sync + 'static,
    F: Fn(Arc<K>, Arc<Context>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action>> + Send + 'static,
{
    move |object, ctx| {
        let key = context::key(object.as_ref());
        let metrics = ctx.metrics.clone();
        let pass = reconcile(object, ctx);
        async move {
            let started = std::time::Instant::now();
            let outcome = match tokio::time::timeout(RECONCILE_TIMEOUT, pass).await {
                Ok(outcome) => outcome,
                Err(_) => Err(Error::Timeout {
                    controller,
                    object: key.clone(),
                    after: RECONCILE_TIMEOUT,
                }),
            };
            tracing::debug!(%controller, object = %key, ok = outcome.is_ok(), "reconciled");
            let requeue = outcome
                .as_ref()
                .is_ok_and(|action| *action != Action::await_change());
            metrics.reconciled(controller, started.elapsed(), requeue, outcome.is_err());
            outcome
        }
        .boxed()
    }
}

/// Logs what a controller stream reports besides successful reconciles (queue and watch errors).
fn quiet<K, E: std::fmt::Display>(result: std::result::Result<(ObjectRef<K>, Action), E>)
where
    K: Resource,
{
    if let Err(error) = result {
        tracing::debug!(%error, "controller event");
    }
}

type ShutdownSignal = Shared<futures::future::BoxFuture<'static, ()>>;

/// How long shutdown waits for the Lease release; past it the Lease simply expires.
const RELEASE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

async fn release_lease(api: &Api<Lease>, settings: &config::LeaderElection) {
    match tokio::time::timeout(RELEASE_TIMEOUT, leader::release(api, settings)).await {
        Ok(Ok(true)) => tracing::info!(lease = %settings.name, "released leadership"),
        Ok(Ok(false)) => {}
        Ok(Err(error)) => tracing::warn!(%error, "failed to release the leader Lease"),
        Err(_) => tracing::warn!(lease = %settings.name, "releasing the leader Lease timed out"),
    }
}

/// Runs the controller until `shutdown` resolves (or leadership is lost, which is an error).
pub async fn run(
    client: Client,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let shutdown: ShutdownSignal = shutdown.boxed().shared();
    let mut config = config;
    match check_crds(&client, config.extensions).await {
        // Upstream's core-only install (`k8s/controller.yaml`: the Sandbox CRD alone, no
        // `--extensions`): run as upstream's controller does there, and say what is missing.
        Err(Error::CrdMissing { name })
            if config.extensions
                && !config.extensions_given
                && check_crds(&client, false).await.is_ok() =>
        {
            tracing::warn!(
                missing = %name,
                "only the Sandbox CRD is installed and --extensions was not given: running the \
                 Sandbox controller alone (as upstream's does without --extensions); install \
                 all four CRDs (deploy/crds) and restart for SandboxClaims, SandboxWarmPools and \
                 SandboxTemplates, or pass --extensions=false to silence this"
            );
            config.extensions = false;
        }
        result => result?,
    }

    let mut tasks: JoinSet<()> = JoinSet::new();
    let readiness = http::Readiness::default();
    if let Some(addr) = config.health_addr {
        let listener = http::bind(addr, "health probes").await?;
        tasks.spawn(http::serve(
            listener,
            http::health_router(readiness.clone()),
            shutdown.clone(),
        ));
    }

    // Leadership first: a standby replica keeps no caches.
    let lease_api = config.leader_election.as_ref().map(|settings| {
        (
            Api::<Lease>::namespaced(client.clone(), &settings.namespace),
            settings.clone(),
        )
    });
    if let Some((api, settings)) = &lease_api {
        tokio::select! {
            result = leader::acquire(api, settings) => result?,
            () = shutdown.clone() => return Ok(()),
        }
    }

    let (caches, subs) = cache::start(
        &client,
        config.namespace.as_deref(),
        config.extensions,
        &mut tasks,
    );
    let metrics = metrics::Metrics::new(caches.clone());
    if let Some(addr) = config.metrics_addr {
        let listener = http::bind(addr, "metrics").await?;
        tasks.spawn(http::serve(
            listener,
            http::metrics_router(metrics.clone()),
            shutdown.clone(),
        ));
    }
    let workers = config.workers;
    let extensions = config.extensions;
    let ctx = Arc::new(Context::new(
        client.clone(),
        config,
        caches.clone(),
        metrics,
    ));
    {
        let caches = caches.clone();
        let readiness = readiness.clone();
        tasks.spawn(async move {
            caches.wait_until_ready().await;
            readiness.set_ready();
            tracing::info!("caches synced; reconciling");
        });
    }

    let drain = |stream: futures::stream::BoxStream<'static, ()>| {
        stream.for_each(|()| futures::future::ready(()))
    };

    let sandboxes = Controller::for_stream(subs.sandboxes_for_sandbox, caches.sandboxes.clone())
        .owns_stream(subs.pods)
        .owns_stream(subs.services)
        .with_config(controller::Config::default().concurrency(workers.sandbox))
        .graceful_shutdown_on(shutdown.clone())
        .run(
            bounded(Reconciler::Sandbox, reconcile::sandbox::reconcile),
            error_policy::<Sandbox>(Reconciler::Sandbox),
            ctx.clone(),
        )
        .map(quiet)
        .boxed();

    let templates = Controller::for_stream(subs.templates_for_template, caches.templates.clone())
        .owns_stream(subs.policies)
        .with_config(controller::Config::default().concurrency(workers.template))
        .graceful_shutdown_on(shutdown.clone())
        .run(
            bounded(Reconciler::Template, reconcile::template::reconcile),
            error_policy::<SandboxTemplate>(Reconciler::Template),
            ctx.clone(),
        )
        .map(quiet)
        .boxed();

    let pools_by_template = caches.pools.clone();
    let claims_for_members = caches.claims.clone();
    let pools = Controller::for_stream(subs.pools_for_pool, caches.pools.clone())
        .watches_stream(subs.sandboxes_for_pool, move |sandbox: Sandbox| {
            reconcile::pools_for_sandbox(&claims_for_members, &sandbox)
        })
        .watches_stream(subs.templates_for_pool, move |template: SandboxTemplate| {
            let namespace = template.namespace();
            let name = template.name_any();
            pools_by_template
                .state()
                .into_iter()
                .filter(|pool| {
                    pool.namespace() == namespace && pool.spec.sandbox_template_ref.name == name
                })
                .map(|pool| ObjectRef::from_obj(pool.as_ref()))
                .collect::<Vec<_>>()
        })
        .watches_stream(subs.claims_for_pool, |claim: SandboxClaim| {
            let mut pool = ObjectRef::<SandboxWarmPool>::new(&claim.spec.warm_pool_ref.name);
            if let Some(namespace) = claim.namespace() {
                pool = pool.within(&namespace);
            }
            Some(pool)
        })
        .with_config(controller::Config::default().concurrency(workers.warm_pool))
        .graceful_shutdown_on(shutdown.clone())
        .run(
            bounded(Reconciler::WarmPool, reconcile::warm_pool::reconcile),
            error_policy::<SandboxWarmPool>(Reconciler::WarmPool),
            ctx.clone(),
        )
        .map(quiet)
        .boxed();

    let claims_for_sandboxes = caches.claims.clone();
    let claims_for_pools = caches.claims.clone();
    let claims_for_templates = caches.claims.clone();
    let pools_for_templates = caches.pools.clone();
    let claims = Controller::for_stream(subs.claims, caches.claims.clone())
        .watches_stream(subs.sandboxes_for_claim, move |sandbox: Sandbox| {
            reconcile::claims_for_sandbox(&claims_for_sandboxes, &sandbox)
        })
        .watches_stream(subs.pools_for_claim, move |pool: SandboxWarmPool| {
            let namespace = pool.namespace();
            let name = pool.name_any();
            claims_for_pools
                .state()
                .into_iter()
                .filter(|claim| {
                    claim.namespace() == namespace && claim.spec.warm_pool_ref.name == name
                })
                .map(|claim| ObjectRef::from_obj(claim.as_ref()))
                .collect::<Vec<_>>()
        })
        .watches_stream(
            subs.templates_for_claim,
            move |template: SandboxTemplate| {
                let namespace = template.namespace();
                let name = template.name_any();
                let pools: Vec<String> = pools_for_templates
                    .state()
                    .into_iter()
                    .filter(|pool| {
                        pool.namespace() == namespace && pool.spec.sandbox_template_ref.name == name
                    })
                    .map(|pool| pool.name_any())
                    .collect();
                claims_for_templates
                    .state()
                    .into_iter()
                    .filter(|claim| {
                        claim.namespace() == namespace
                            && pools.contains(&claim.spec.warm_pool_ref.name)
                    })
                    .filter(|claim| {
                        claim
                            .status
                            .as_ref()
                            .is_none_or(|s| s.sandbox.name.is_empty())
                    })
                    .map(|claim| ObjectRef::from_obj(claim.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
        .with_config(controller::Config::default().concurrency(workers.claim))
        .graceful_shutdown_on(shutdown.clone())
        .run(
            bounded(Reconciler::Claim, reconcile::claim::reconcile),
            error_policy::<SandboxClaim>(Reconciler::Claim),
            ctx.clone(),
        )
        .map(quiet)
        .boxed();

    // Upstream's `--extensions=false`: the Sandbox controller alone (the others' caches are not
    // watched either).
    let (templates, pools, claims) = if extensions {
        (templates, pools, claims)
    } else {
        let off = || futures::stream::empty().boxed();
        (off(), off(), off())
    };
    let controllers = futures::future::join4(
        drain(sandboxes),
        drain(templates),
        drain(pools),
        drain(claims),
    );
    let outcome = match &lease_api {
        Some((api, settings)) => {
            tokio::select! {
                _ = controllers => {
                    // Every reconcile has finished: hand leadership over now rather than after
                    // the lease duration.
                    release_lease(api, settings).await;
                    Ok(())
                }
                error = leader::keep(api, settings) => Err(error),
            }
        }
        None => {
            controllers.await;
            Ok(())
        }
    };
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    outcome
}
