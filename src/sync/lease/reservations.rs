//! `redis-lease`: the reservation Redis last confirmed for this node per key, and
//! until when (local ms) Redis keeps it without hearing from this node. It is
//! the share a node cut off from Redis may still spend (docs/design/redis.md).

use std::collections::HashMap;
use tollgate_cluster::maps::shrink_if_sparse;

/// Confirmed reservations by limit key. Only keys stated within a ttl are held:
/// a lapsed one reads 0 and is dropped with the next confirmations, so the map
/// does not keep every key ever used here.
#[derive(Debug, Default)]
pub(super) struct Reservations {
    by_key: HashMap<String, Reservation>,
}

#[derive(Debug, Clone, Copy)]
struct Reservation {
    share: u64,
    until_ms: u64,
}

impl Reservations {
    /// A statement asking `ask` for `key` is about to go out: until Redis
    /// confirms, the reservation is at most that (if the answer is lost, Redis
    /// may already hold the smaller figure).
    pub(super) fn lower_to(&mut self, key: &str, ask: u64) {
        if let Some(r) = self.by_key.get_mut(key) {
            r.share = r.share.min(ask);
        }
    }

    /// Drops the reservations lapsed at `now_ms`, before a statement's
    /// confirmations are recorded.
    pub(super) fn drop_lapsed(&mut self, now_ms: u64) {
        self.by_key.retain(|_, r| r.until_ms > now_ms);
        shrink_if_sparse(&mut self.by_key);
    }

    /// Redis confirmed `share` for `key`, kept until `until_ms`.
    pub(super) fn confirm(&mut self, key: &str, share: u64, until_ms: u64) {
        (self.by_key).insert(key.to_owned(), Reservation { share, until_ms });
    }

    /// What Redis keeps for this node on `key` at `now_ms` (0 once lapsed).
    pub(super) fn at(&self, key: &str, now_ms: u64) -> u64 {
        (self.by_key.get(key))
            .filter(|r| r.until_ms > now_ms)
            .map_or(0, |r| r.share)
    }

    /// Keys held.
    pub(super) fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether no key is held.
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_is_lowered_before_a_statement_and_lapses_after_its_ttl() {
        let mut r = Reservations::default();
        r.confirm("k", 30, 1_000);
        r.lower_to("k", 10);
        r.lower_to("unknown", 5);
        assert_eq!(r.at("k", 999), 10);
        r.confirm("k", 25, 2_000);
        assert_eq!(r.at("k", 1_500), 25, "confirmed again: the new figure");
        assert_eq!(r.at("k", 2_000), 0, "lapsed");
        assert_eq!(r.at("unknown", 0), 0);
    }

    #[test]
    fn lapsed_reservations_are_dropped_and_live_ones_kept() {
        let mut r = Reservations::default();
        for k in 0..100 {
            r.confirm(&format!("old{k}"), 1, 1_000);
        }
        r.confirm("live", 7, 3_000);
        r.drop_lapsed(1_000);
        assert_eq!(r.len(), 1, "only the key stated within its ttl");
        assert_eq!(r.at("live", 1_000), 7);
        r.drop_lapsed(3_000);
        assert!(r.is_empty());
    }
}
