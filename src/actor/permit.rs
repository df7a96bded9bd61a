//! A permit: what a request holds on one scope while in flight. It is released and
//! settled exactly once: by [`Permit::settle`], or, if the request path never gets
//! there (client disconnect mid-stream, upstream error, timeout, panic), by `Drop`,
//! which keeps the reservation (usage unknown, so the conservative choice).

use super::registry::ActorHandle;
use super::task::{Grant, Release};
use tokio::sync::mpsc;

pub use super::task::SettleWith;

/// A charge on one scope, settled exactly once.
#[derive(Debug)]
pub struct Permit {
    releases: mpsc::UnboundedSender<Release>,
    permit_id: u64,
    settled: bool,
}

impl Permit {
    /// Wraps a grant from `handle`'s actor.
    pub fn new(handle: &ActorHandle, grant: &Grant) -> Permit {
        Permit {
            releases: handle.releases(),
            permit_id: grant.permit_id,
            settled: false,
        }
    }

    /// Settles and releases. Consumes the permit: a second settlement cannot compile.
    pub fn settle(mut self, how: SettleWith) {
        self.send(how);
    }

    fn send(&mut self, how: SettleWith) {
        if !self.settled {
            self.settled = true;
            // The actor outlives every permit (it cannot retire with permits in
            // flight), so this send fails only when the runtime is shutting down.
            let _ = self.releases.send(Release {
                permit_id: self.permit_id,
                how,
            });
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.send(SettleWith::KeepReserved);
    }
}
