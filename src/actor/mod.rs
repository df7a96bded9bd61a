//! # Limiter actors
//!
//! One actor per active tenant and per upstream: its scope's limiters, waiting
//! queues and in-flight permits behind one lock, decided in the request's own task
//! while nothing waits, and a plain tokio task that queues the rest
//! (docs/design/architecture.md, "Decided in the caller's task").
//!
//! - [`scope`]: the limits of one scope (requests, tokens, concurrency, cool-down)
//!   and the all-or-nothing admission across them. Pure.
//! - [`binding`]: a limit key the cluster bounds, and how its bound arrives.
//! - [`credit`]: `lease` mode's credit per key, shared with the sync engine.
//! - [`metrics`]: the actors' metric families and per-actor handles.
//! - [`queue`]: waiting queues per lane, FIFO with aging. Pure.
//! - [`estimate`]: adaptive completion estimates from recent completions. Pure.
//! - [`state`]: the scope's state and decisions, shared under one lock.
//! - [`task`]: the actor loop (forwarded requests, the release bell, timers, idle
//!   stop).
//! - [`registry`]: sharded map of live actors, spawned lazily, retired when idle.
//! - [`permit`]: what a request holds; released and settled exactly once.

pub mod binding;
pub mod credit;
pub mod estimate;
pub mod metrics;
pub mod permit;
pub mod queue;
pub mod registry;
pub mod scope;
pub mod state;
pub mod task;

pub use binding::Binding;
pub use permit::{Permit, SettleWith};
pub use registry::{Registry, ScopeSpec, WindowSpecs};
pub use scope::{Blocked, ScopeStatus};

use serde::Serialize;
use std::fmt;
use std::sync::Arc;

/// Priority lane of a request (`x-tollgate-priority`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Lane {
    /// Latency-sensitive traffic: may use all of a key's capacity.
    #[default]
    Interactive,
    /// Throughput traffic: capped at `batch_share` of each capacity.
    Batch,
}

impl Lane {
    /// Parses the header value; `None` for anything but the two lane names.
    pub fn parse(value: &str) -> Option<Lane> {
        match value {
            "interactive" => Some(Lane::Interactive),
            "batch" => Some(Lane::Batch),
            _ => None,
        }
    }

    /// Label value for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Interactive => "interactive",
            Lane::Batch => "batch",
        }
    }
}

/// Whose limits an actor enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScopeKind {
    /// A caller's limits.
    Tenant,
    /// A provider deployment's quota.
    Upstream,
    /// A tenant's quota for some of its models (`[[tenants.model_limits]]`).
    TenantModel,
    /// A provider's limits for some of its models (`[[upstreams.model_limits]]`).
    UpstreamModel,
}

impl ScopeKind {
    /// Label value for metrics and keys.
    pub fn as_str(self) -> &'static str {
        match self {
            ScopeKind::Tenant => "tenant",
            ScopeKind::Upstream => "upstream",
            ScopeKind::TenantModel => "tenant-model",
            ScopeKind::UpstreamModel => "upstream-model",
        }
    }
}

/// Identity of one actor: `tenant:acme`, `upstream:openai-main`, or a model
/// group's within one, `upstream-model:openai-main@gpt-4o`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ScopeId {
    /// Tenant or upstream.
    pub kind: ScopeKind,
    /// The configured id.
    pub id: Arc<str>,
}

impl ScopeId {
    /// A tenant scope.
    pub fn tenant(id: &str) -> ScopeId {
        ScopeId {
            kind: ScopeKind::Tenant,
            id: id.into(),
        }
    }

    /// An upstream scope.
    pub fn upstream(id: &str) -> ScopeId {
        ScopeId {
            kind: ScopeKind::Upstream,
            id: id.into(),
        }
    }

    /// The scope of model group `group` within `owner` (a tenant's or an
    /// upstream's): `id` is `<owner id>@<group>`, which no owner id can be
    /// (ids have no `@`).
    pub fn model_group(owner: &ScopeId, group: &str) -> ScopeId {
        let kind = match owner.kind {
            ScopeKind::Tenant | ScopeKind::TenantModel => ScopeKind::TenantModel,
            ScopeKind::Upstream | ScopeKind::UpstreamModel => ScopeKind::UpstreamModel,
        };
        ScopeId {
            kind,
            id: format!("{}@{group}", owner.id).into(),
        }
    }
}

impl fmt::Display for ScopeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind.as_str(), self.id)
    }
}

/// A limit dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Dimension {
    /// Requests per window.
    Requests,
    /// Prompt + completion tokens per window.
    Tokens,
    /// Input (prompt) tokens per window: Anthropic's ITPM.
    InputTokens,
    /// Output (completion) tokens per window: Anthropic's OTPM.
    OutputTokens,
    /// Requests per day window (RPD).
    RequestsPerDay,
    /// Prompt + completion tokens per day window (TPD).
    TokensPerDay,
    /// Requests in flight.
    Concurrency,
    /// An upstream cooling down after it answered 429.
    Cooldown,
    /// The scope's waiting queue is full.
    Queue,
}

/// Window dimensions a scope may limit (requests, tokens, input and output
/// tokens per window; requests and tokens per day), the length of the arrays
/// that keep one entry per window dimension.
pub const WINDOWS: usize = 6;

impl Dimension {
    /// The window dimensions, in the order scopes keep them.
    pub const WINDOWED: [Dimension; WINDOWS] = [
        Dimension::Requests,
        Dimension::Tokens,
        Dimension::InputTokens,
        Dimension::OutputTokens,
        Dimension::RequestsPerDay,
        Dimension::TokensPerDay,
    ];

    /// This dimension's place in [`Self::WINDOWED`]; `None` for the others.
    pub fn window_index(self) -> Option<usize> {
        Self::WINDOWED.iter().position(|d| *d == self)
    }

    /// Whether it is counted over the day window (`[limits] day_window`).
    pub fn is_daily(self) -> bool {
        matches!(self, Dimension::RequestsPerDay | Dimension::TokensPerDay)
    }

    /// Label value for metrics, keys and error messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Dimension::Requests => "requests",
            Dimension::Tokens => "tokens",
            Dimension::InputTokens => "input_tokens",
            Dimension::OutputTokens => "output_tokens",
            // The day window's names end in the cluster's long-window suffix:
            // a key's name says which window the cluster counts it over.
            Dimension::RequestsPerDay => "requests_per_day",
            Dimension::TokensPerDay => "tokens_per_day",
            Dimension::Concurrency => "concurrency",
            Dimension::Cooldown => "cooldown",
            Dimension::Queue => "queue",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_ending_fits_the_room_config_leaves_for_it() {
        let room = crate::config::model_limits::LONGEST_KEY_ENDING.len();
        for d in Dimension::WINDOWED {
            // `:` and the name.
            assert!(d.as_str().len() < room, "{d:?}");
            // The day's dimensions are named so that the cluster counts their
            // keys over the day window.
            let long = d
                .as_str()
                .ends_with(tollgate_cluster::counter::LONG_WINDOW_SUFFIX);
            assert_eq!(long, d.is_daily(), "{d:?}");
        }
        assert!(Dimension::Concurrency.as_str().len() < room);
    }
}
