//! A permit: what a request holds on one scope while in flight. It is released and
//! settled exactly once: by [`Permit::settle`], or, if the request path never gets
//! there (client disconnect, upstream error, timeout, panic), by `Drop`. Dropped
//! before the request was handed to the upstream ([`Permit::sending`]), nothing
//! reached the provider: the permit is cancelled (a client that gave up while
//! queued is charged nothing). Dropped after, the provider may have counted it and
//! its usage is unknown: the reservation is kept (the conservative choice), unless
//! the path said otherwise ([`Permit::drop_as`]: between retries, after answers
//! that did no work, the request counts and its tokens do not).

use super::registry::ActorHandle;
use super::state::Shared;
use super::task::{Grant, Release};
use std::sync::Arc;
use tokio::time::Instant;

pub use super::task::SettleWith;

/// A charge held outside the node (the `redis` mode's reservation), settled with
/// the local permit, exactly once.
pub trait RemoteCharge: Send + Sync + std::fmt::Debug {
    /// Settles the remote charge as the permit ends (off the request path).
    fn settle(self: Box<Self>, how: SettleWith);

    /// The upstream answered (or is still silent half a window on): the remote
    /// charge counts from now on (see [`Permit::answered`]); applied with the
    /// settlement.
    fn redate(&self);
}

/// A charge on one scope, settled exactly once.
#[derive(Debug)]
pub struct Permit {
    shared: Arc<Shared>,
    permit_id: u64,
    settled: bool,
    remote: Option<Box<dyn RemoteCharge>>,
    /// When the upstream last answered: the settlement moves the charge there.
    answered_at: Option<Instant>,
    /// How `Drop` settles: `Cancel` until [`Self::sending`], `KeepReserved` after.
    on_drop: SettleWith,
    /// The same request's permit on a narrower scope (its model group's),
    /// moved and settled with this one.
    inner: Option<Box<Permit>>,
}

impl Permit {
    /// Wraps a grant from `handle`'s actor.
    pub fn new(handle: &ActorHandle, grant: &Grant) -> Permit {
        Permit {
            shared: handle.shared(),
            permit_id: grant.permit_id,
            settled: false,
            remote: None,
            answered_at: None,
            on_drop: SettleWith::Cancel,
            inner: None,
        }
    }

    /// The same permit, also holding `inner` (the request's permit on a
    /// narrower scope): every step and the settlement apply to both.
    pub fn holding(mut self, inner: Permit) -> Permit {
        self.inner = Some(Box::new(inner));
        self
    }

    /// The request is about to be handed to the upstream: from now on the
    /// provider may count it, so a permit dropped unsettled keeps its reservation.
    pub fn sending(&mut self) {
        self.on_drop = SettleWith::KeepReserved;
        if let Some(inner) = &mut self.inner {
            inner.sending();
        }
    }

    /// How a permit dropped unsettled from now on settles: e.g. `RefundTokens`
    /// between attempts, after an upstream answered without doing the work (the
    /// settlement the request would get if it ended there).
    pub fn drop_as(&mut self, how: SettleWith) {
        self.on_drop = how;
        if let Some(inner) = &mut self.inner {
            inner.drop_as(how);
        }
    }

    /// The same permit, also holding `remote` (settled with it).
    pub fn with_remote(mut self, remote: Box<dyn RemoteCharge>) -> Permit {
        self.remote = Some(remote);
        self
    }

    /// The upstream answered (response headers, an error or a timeout): the
    /// provider has counted the request by now, so its windowed charge must count
    /// a window from here (`ScopeLimits::redate`). Remembered and applied with the
    /// settlement, in the same message: no extra one on the request path. Where the
    /// settlement may come much later (a stream, a retry), also call
    /// [`Self::redate_now`].
    pub fn answered(&mut self) {
        self.answered_at = Some(Instant::now());
        if let Some(remote) = &self.remote {
            remote.redate();
        }
        if let Some(inner) = &mut self.inner {
            inner.answered();
        }
    }

    /// Moves the windowed charge to now at once (under the scope's lock): a
    /// stream starts, an attempt will be retried, or the upstream is still silent
    /// half a window on and the charge must keep counting.
    pub fn redate_now(&self) {
        if let Some(remote) = &self.remote {
            remote.redate();
        }
        if let Some(inner) = &self.inner {
            inner.redate_now();
        }
        self.shared.release(Release {
            permit_id: self.permit_id,
            how: None,
            answered_at: Some(Instant::now()),
        });
    }

    /// Settles and releases. Consumes the permit: a second settlement cannot compile.
    pub fn settle(mut self, how: SettleWith) {
        self.send(how);
    }

    fn send(&mut self, how: SettleWith) {
        if let Some(inner) = self.inner.take() {
            inner.settle(how);
        }
        if !self.settled {
            self.settled = true;
            if let Some(remote) = self.remote.take() {
                remote.settle(how);
            }
            // Applied under the scope's lock, wherever the permit ends: it cannot
            // be refused or lost (the scope cannot retire with permits in flight).
            self.shared.release(Release {
                permit_id: self.permit_id,
                how: Some(how),
                answered_at: self.answered_at,
            });
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.send(self.on_drop);
    }
}
