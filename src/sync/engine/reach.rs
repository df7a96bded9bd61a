//! What this node cannot reach: its own Redis loss and the owners its holder
//! is cut off from.

use super::*;

impl Engine {
    /// `redis`: this node's current loss (none while Redis answers), its divisor
    /// fixed the first time it is asked for: the largest member count known then.
    pub(super) fn own_redis_loss(&mut self) -> Option<Loss> {
        let epoch = self.redis_gate.as_ref()?.lost_since();
        if epoch == 0 {
            self.redis_loss = None;
        } else if !self.redis_losses.is_read() {
            // Lost before the first reading of the members: no divisor yet (1
            // would let it spend all of L); announced, and confirmable, next round.
            return None;
        } else if self.redis_loss.is_none_or(|l| l.epoch != epoch) {
            let divisor = self.redis_losses.known_members();
            self.redis_loss = Some(Loss { epoch, divisor });
        }
        self.redis_loss
    }

    /// Whether this node currently cannot reach Redis.
    pub(super) fn redis_lost_here(&self) -> bool {
        if let Some(gate) = &self.redis_gate {
            return gate.is_lost();
        }
        (self.unreachable_owners().iter()).any(|o| o == crate::sync::lease::holder::REDIS_OWNER)
    }

    /// The lease owners this node's holder cannot reach now (none outside the
    /// leased modes).
    pub(super) fn unreachable_owners(&self) -> Vec<String> {
        (self.lease.as_ref())
            .map(|feed| (feed.cut_off.read()).clone())
            .unwrap_or_default()
    }
}
