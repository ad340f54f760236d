//! Wire types of agent-sandbox, wire-compatible with kubernetes-sigs/agent-sandbox v1beta1.
//!
//! This crate owns every name that crosses a process boundary and does no IO:
//!
//! - the four CRDs: [`Sandbox`] (`agents.x-k8s.io/v1beta1`) and [`SandboxTemplate`],
//!   [`SandboxWarmPool`], [`SandboxClaim`] (`extensions.agents.x-k8s.io/v1beta1`), with
//!   [`crds::all`] giving their `CustomResourceDefinition`s;
//! - label and annotation keys ([`labels`], [`annotations`]), condition types and reasons
//!   ([`conditions`]), ports, names and router headers ([`wire`]);
//! - the FNV-1a [`name_hash`] used in label values;
//! - RFC 3339 date-times as the API server accepts them, up to `9999-12-31T23:59:59Z` ([`time`]);
//! - the JSON of the runtime server: legacy endpoints and the `/v1` API ([`runtime`], [`runtime::v1`]);
//! - the scoped router token format, minted and verified as pure functions ([`token`]);
//! - the Kubernetes name syntax the router, sim and controller validate with ([`names`]), and the
//!   one duration and size syntax of every binary's flags ([`units`]), and Go's flag spelling that
//!   upstream's manifests use ([`go_flag`]);
//! - how every binary reports an error: one line and exit status 2 for configuration ([`exit`]).
//!
//! Other crates import constants from here instead of spelling a string twice.

pub mod annotations;
pub mod claim;
pub mod conditions;
pub mod crds;
pub mod exit;
pub mod go_flag;
mod hash;
pub mod labels;
pub mod names;
pub mod runtime;
pub mod sandbox;
pub mod schema;
pub mod template;
pub mod time;
pub mod token;
pub mod units;
pub mod warm_pool;
pub mod wire;

pub use claim::{SandboxClaim, SandboxClaimSpec, SandboxClaimStatus};
pub use hash::{fnv1a_32, name_hash};
pub use sandbox::{Sandbox, SandboxSpec, SandboxStatus};
pub use template::{SandboxTemplate, SandboxTemplateSpec};
pub use warm_pool::{SandboxWarmPool, SandboxWarmPoolSpec, SandboxWarmPoolStatus};

/// API group of `Sandbox`.
pub const GROUP: &str = "agents.x-k8s.io";
/// API group of `SandboxTemplate`, `SandboxWarmPool` and `SandboxClaim`.
pub const EXTENSIONS_GROUP: &str = "extensions.agents.x-k8s.io";
/// The one version we serve (and store) for both groups.
pub const VERSION: &str = "v1beta1";

/// `apiVersion` of `Sandbox`: [`GROUP`]/[`VERSION`].
pub const API_VERSION: &str = "agents.x-k8s.io/v1beta1";
/// `apiVersion` of `SandboxTemplate`, `SandboxWarmPool` and `SandboxClaim`:
/// [`EXTENSIONS_GROUP`]/[`VERSION`].
pub const EXTENSIONS_API_VERSION: &str = "extensions.agents.x-k8s.io/v1beta1";

/// The four kinds, as `kind` fields and ownerReferences spell them: the same strings as
/// `kube::Resource::kind` of [`Sandbox`], [`SandboxTemplate`], [`SandboxWarmPool`] and
/// [`SandboxClaim`], for places that need a constant (patterns, `&'static str`).
pub mod kinds {
    /// `Sandbox`.
    pub const SANDBOX: &str = "Sandbox";
    /// `SandboxTemplate`.
    pub const SANDBOX_TEMPLATE: &str = "SandboxTemplate";
    /// `SandboxWarmPool`.
    pub const SANDBOX_WARM_POOL: &str = "SandboxWarmPool";
    /// `SandboxClaim`.
    pub const SANDBOX_CLAIM: &str = "SandboxClaim";
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_core::Resource;
    use pretty_assertions::assert_eq;

    #[test]
    fn kind_and_version_constants_match_the_types() {
        assert_eq!(Sandbox::kind(&()), kinds::SANDBOX);
        assert_eq!(SandboxTemplate::kind(&()), kinds::SANDBOX_TEMPLATE);
        assert_eq!(SandboxWarmPool::kind(&()), kinds::SANDBOX_WARM_POOL);
        assert_eq!(SandboxClaim::kind(&()), kinds::SANDBOX_CLAIM);
        assert_eq!(Sandbox::api_version(&()), API_VERSION);
        assert_eq!(API_VERSION, format!("{GROUP}/{VERSION}"));
        for extension in [
            SandboxTemplate::api_version(&()),
            SandboxWarmPool::api_version(&()),
            SandboxClaim::api_version(&()),
        ] {
            assert_eq!(extension, EXTENSIONS_API_VERSION);
        }
        assert_eq!(
            EXTENSIONS_API_VERSION,
            format!("{EXTENSIONS_GROUP}/{VERSION}")
        );
    }
}
