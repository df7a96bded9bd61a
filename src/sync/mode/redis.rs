//! `redis`: Redis is the bound (one Lua call per reservation), so a round only
//! keeps the figures for when it is not: the capacity asked of Redis, lowered by
//! what the peers that lost Redis may spend meanwhile, and this node's own
//! fallback should it lose Redis (docs/design/redis.md).

use super::gossip::{Figures, allowance};
use super::{KeyInput, Mode, Output, RedisFallback, Round};
use crate::actor::Dimension;
use crate::config::CutOff;

/// `redis` mode, with what a node that lost Redis may spend.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Redis {
    /// The cut-off policy: its share, nothing, or no bound.
    pub cut_off: CutOff,
}

impl Mode for Redis {
    fn promise(&self) -> &'static str {
        "redis: cluster total <= L; Redis lost by some nodes: <= L, by all: <= L x (1 + e)"
    }

    fn key(&self, round: &Round<'_>, key: &KeyInput<'_>, out: &mut Output) {
        let binding = key.binding;
        if binding.allowance.is_none() {
            return;
        }
        let divisor = round.redis.divisor.max(1);
        // Peers that lost Redis are charged what each announced it may spend,
        // `capacity / its divisor`, by lowering the capacity asked of Redis
        // (`partition::redis_loss`).
        let lost: u64 = (round.redis.charged.iter())
            .map(|loss| loss.share_of(binding.capacity))
            .sum();
        out.redis_caps.insert(
            binding.key.to_string(),
            binding.capacity.saturating_sub(lost),
        );
        // The fallback (policy `share`): windows fall back to gossip mode's rule,
        // this node's demand-weighted share of the headroom the counters show
        // (what others already spent through Redis counts: a plain share of L
        // would add to it; the harness measures 5%); concurrency to an equal
        // share of the slots.
        let share = match binding.dimension {
            Dimension::Concurrency => binding.capacity / divisor,
            _ => allowance(&Figures {
                capacity: binding.capacity,
                self_id: round.self_id,
                own_used: key.own.used,
                own_seen: key.own.seen,
                others_used: key.others_live,
                demands: key.demands,
            }),
        };
        let (own, charged) = match self.cut_off {
            CutOff::Share => (share, binding.capacity / divisor),
            CutOff::FailClosed => (0, binding.capacity / divisor),
            CutOff::FailOpen => (u64::MAX, u64::MAX),
        };
        out.redis_fallback.push(RedisFallback {
            index: key.index,
            own,
            charged,
        });
        out.allow(key, if round.redis.lost { own } else { u64::MAX });
    }
}
