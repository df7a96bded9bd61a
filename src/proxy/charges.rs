//! A request's charges: the tenant's permit and the upstream's, and the node's
//! in-flight slot, held together from the send until the answer's last byte.
//! Every step of an attempt moves both the same way (sent, answered, moved to
//! now) and every ending settles both once, so the request path names what
//! happened and this type decides what each permit is charged.

use super::usage::UsageBound;
use crate::actor::{Permit, SettleWith};
use crate::ops::metrics::Metrics;
use std::sync::Arc;

/// Permits and guards a request holds while it is sent and answered.
pub struct Charges {
    /// The tenant's permit.
    pub tenant: Permit,
    /// The upstream's permit.
    pub upstream: Permit,
    /// Anything else to drop at the end (the node's in-flight slot).
    pub guard: Box<dyn Send + Sync>,
    /// The most usage the provider may report for the request.
    pub bound: UsageBound,
    /// Where a clamped usage figure is counted.
    pub metrics: Arc<Metrics>,
}

impl Charges {
    /// From here the provider may count the request: a permit dropped unsettled
    /// (the client gone mid-call) keeps its reservation instead of being
    /// cancelled.
    pub fn sending(&mut self) {
        self.tenant.sending();
        self.upstream.sending();
    }

    /// An answer came (or the wait for one ended): the provider has counted the
    /// request by now, so both charges count a window from here.
    pub fn answered(&mut self) {
        self.tenant.answered();
        self.upstream.answered();
    }

    /// Both charges move to now (a wait that outlasts half a window, a stream
    /// that settles at its end).
    pub fn redate_now(&mut self) {
        self.tenant.redate_now();
        self.upstream.redate_now();
    }

    /// Settles both permits the same way, the provider's usage within the
    /// request's bound (a figure beyond it is clamped, logged and counted).
    pub fn settle(self, how: SettleWith) {
        let (how, clamped) = self.bound.clamp(how);
        if clamped {
            tracing::warn!(
                bound_input = self.bound.input,
                bound_output = self.bound.output,
                "the upstream reported more usage than the request could have used: clamped to its bound"
            );
            self.metrics.usage_clamped();
        }
        self.tenant.settle(how);
        self.upstream.settle(how);
    }

    /// The upstream may have done work the client never got (a body cut short,
    /// a success body that is not JSON): the upstream keeps its charge, since
    /// the provider may have counted it; the tenant is refunded its tokens,
    /// since it is charged for what it was served.
    pub fn settle_unserved(self) {
        self.upstream.settle(SettleWith::KeepReserved);
        self.tenant.settle(SettleWith::RefundTokens);
    }

    /// Never sent: the node stalled between the admission and the send. An
    /// earlier attempt (`retried`) reached the upstream, which did no work, so
    /// the tenant keeps the request; otherwise nothing is charged.
    pub fn settle_expired(self, retried: bool) {
        let tenant = if retried {
            SettleWith::RefundTokens
        } else {
            SettleWith::Cancel
        };
        self.tenant.settle(tenant);
        self.upstream.settle(SettleWith::Cancel);
    }

    /// This attempt failed and another may follow: the upstream's permit
    /// settles as `upstream`; the tenant's charge lives on through the next
    /// attempts, moved to now (not to its settlement, however long they take),
    /// and if the client leaves before the next send it settles as it would if
    /// the request ended here. Gives back the tenant's permit and the guard.
    pub fn for_retry(mut self, upstream: SettleWith) -> (Permit, Box<dyn Send + Sync>) {
        self.tenant.redate_now();
        self.tenant.drop_as(SettleWith::RefundTokens);
        self.upstream.settle(upstream);
        (self.tenant, self.guard)
    }
}
