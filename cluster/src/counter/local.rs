//! [`LocalCounters`]: this node's own consumption per limit key (the single writer).
//!
//! Reservations add to the bucket of the reservation, refunds subtract from it (never
//! below zero), debts add to it. `publish` returns only the key-value pairs that
//! changed since the last publish, one per slot however many records hit it, and
//! forgets buckets that left the window (their slot keys are simply overwritten when
//! the slot is reused). Bounded by `max_keys`; see [`RecordError::Full`].

use std::collections::{BTreeMap, HashMap};

use super::codec::{
    KeyError, demand_key, held_key, in_flight_key, scalar_value, slot_key, slot_value,
    validate_limit_key,
};
use super::{DEFAULT_MAX_KEYS, MAX_COUNT, Window};

/// What a record did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// The bucket's count changed; the next publish carries it (unless it changes
    /// back first).
    Changed,
    /// Nothing changed (delta 0, a refund on an empty bucket, a clamp at a bound).
    Unchanged,
    /// The bucket no longer counts at `now_ms` (or its slot holds a newer bucket that
    /// still counts, after a clock step back): the correction is dropped, as the local
    /// limiter reports an expired settlement.
    Expired,
}

/// Why a record or a setter was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The limit key cannot be gossiped.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// `max_keys` limit keys already hold live values; this new key is not published
    /// (it is still enforced locally). Keys leave once idle: nothing in the window,
    /// demand and in-flight published as 0.
    #[error("already tracking {max_keys} limit keys")]
    Full {
        /// The bound that was hit.
        max_keys: usize,
    },
}

/// One remembered bucket: its absolute index, its count, and the count last published
/// for it (0 for a bucket new to its slot: readers hold either nothing or a bucket
/// that no longer counts there, so they read 0 too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LocalSlot {
    bucket: u64,
    count: u64,
    published: u64,
}

/// A demand or in-flight value and the value last published (0 before any: readers
/// read a missing value as 0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Scalar {
    value: u64,
    published: u64,
}

impl Scalar {
    fn set(&mut self, value: u64) {
        self.value = value.min(MAX_COUNT);
    }

    /// The value, if readers do not have it yet; they will after this publish.
    fn take_changed(&mut self) -> Option<u64> {
        let changed = self.value != self.published;
        self.published = self.value;
        changed.then_some(self.value)
    }
}

/// Everything this node holds for one limit key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct LocalKey {
    /// Ring slot -> the bucket living in it. Only slots written since they were last
    /// forgotten; a missing slot reads as 0 everywhere (its published bucket is stale).
    slots: BTreeMap<u32, LocalSlot>,
    demand: Scalar,
    in_flight: Scalar,
    /// `lease`: the cut-off share this node holds for the key (see
    /// [`LocalCounters::set_held`]).
    held: Scalar,
    /// Whether any value of this key went out since it was (last) tracked: only
    /// then does the cluster state hold a ring to delete once it is forgotten.
    published_any: bool,
}

impl LocalKey {
    /// Nothing to publish and nothing that counts: the key can be forgotten, every
    /// reader already evaluates its published values to 0.
    fn is_idle(&self) -> bool {
        self.slots.is_empty()
            && self.demand == Scalar::default()
            && self.in_flight == Scalar::default()
            && self.held == Scalar::default()
    }
}

/// This node's consumption per limit key, published coalesced into a fixed ring of
/// chitchat keys. Pure: every time is an argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalCounters {
    window: Window,
    max_keys: usize,
    keys: HashMap<String, LocalKey>,
    /// Limit keys forgotten with a published ring, and when (ms): the ring can be
    /// deleted from the cluster state once [`Self::take_retired`] finds it quiet
    /// for long enough.
    retired: BTreeMap<String, u64>,
}

impl LocalCounters {
    /// Empty counters over `window`, tracking at most `DEFAULT_MAX_KEYS` keys.
    pub fn new(window: Window) -> Self {
        Self::with_max_keys(window, DEFAULT_MAX_KEYS)
    }

    /// Empty counters tracking at most `max_keys` limit keys at once.
    pub fn with_max_keys(window: Window, max_keys: usize) -> Self {
        Self {
            window,
            max_keys,
            keys: HashMap::new(),
            retired: BTreeMap::new(),
        }
    }

    /// The window the counters are bucketed by.
    pub fn window(&self) -> &Window {
        &self.window
    }

    /// How many limit keys are tracked now (<= `max_keys`).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no limit key is tracked.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The limit keys tracked now, in no order.
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.keys.keys()
    }

    /// Adds `delta` cost units to bucket `bucket_index` of `limit_key`: positive for a
    /// reservation or a debt, negative for a refund. The bucket is the reservation's
    /// (`window.bucket_index(reserved_at_ms)`), not now's. The count is clamped to
    /// `0..=MAX_COUNT`. A bucket that no longer counts at `now_ms` is `Expired`.
    pub fn record(
        &mut self,
        limit_key: &str,
        bucket_index: u64,
        delta: i64,
        now_ms: u64,
    ) -> Result<Recorded, RecordError> {
        validate_limit_key(limit_key)?;
        let window = self.window;
        if !window.counts(bucket_index, now_ms) {
            return Ok(Recorded::Expired);
        }
        if delta == 0 {
            return Ok(Recorded::Unchanged);
        }
        let slot = window.slot(bucket_index);
        let key = self.key_mut(limit_key)?;
        let fresh = LocalSlot {
            bucket: bucket_index,
            count: 0,
            published: 0,
        };
        let entry = key.slots.entry(slot).or_insert(fresh);
        if entry.bucket != bucket_index {
            if entry.bucket > bucket_index && window.counts(entry.bucket, now_ms) {
                return Ok(Recorded::Expired);
            }
            // The slot's old bucket left the window: reuse the slot (its key is
            // overwritten at the next publish if the new bucket is not 0).
            *entry = fresh;
        }
        let wide = i128::from(entry.count) + i128::from(delta);
        // Clamped into 0..=MAX_COUNT, so the cast is exact.
        let count = wide.clamp(0, i128::from(MAX_COUNT)) as u64;
        let recorded = if count == entry.count {
            Recorded::Unchanged
        } else {
            Recorded::Changed
        };
        entry.count = count;
        debug_assert_eq!(window.slot(entry.bucket), slot);
        debug_assert!(entry.count <= MAX_COUNT);
        Ok(recorded)
    }

    /// Sets this node's count for `bucket_index` of `limit_key` to `count` (the
    /// gateway exports absolute per-bucket figures from its local window; this turns
    /// them into the delta `record` takes).
    pub fn set_bucket(
        &mut self,
        limit_key: &str,
        bucket_index: u64,
        count: u64,
        now_ms: u64,
    ) -> Result<Recorded, RecordError> {
        let current = self.bucket_count(limit_key, bucket_index);
        let delta = i128::from(count.min(MAX_COUNT)) - i128::from(current);
        // Both sides are within 0..=MAX_COUNT (2^50), so the difference fits an i64.
        self.record(limit_key, bucket_index, delta as i64, now_ms)
    }

    /// This node's count for `bucket_index` of `limit_key` (0 if none is held).
    pub fn bucket_count(&self, limit_key: &str, bucket_index: u64) -> u64 {
        let slot = self.window.slot(bucket_index);
        (self.keys.get(limit_key))
            .and_then(|key| key.slots.get(&slot))
            .filter(|entry| entry.bucket == bucket_index)
            .map_or(0, |entry| entry.count)
    }

    /// Sets this node's demand for `limit_key`: cost units asked for in the last
    /// window, admitted or not (shares are weighted by it). Clamped to `MAX_COUNT`.
    pub fn set_demand(
        &mut self,
        limit_key: &str,
        demand_per_window: u64,
    ) -> Result<(), RecordError> {
        // A key not tracked reads as 0 everywhere already: a 0 would only track
        // it again (and, forgotten next publish, retire it every round).
        if demand_per_window == 0 && !self.keys.contains_key(limit_key) {
            return validate_limit_key(limit_key).map_err(RecordError::from);
        }
        self.key_mut(limit_key)?.demand.set(demand_per_window);
        Ok(())
    }

    /// Sets this node's in-flight count for `limit_key` (concurrency limits).
    /// Clamped to `MAX_COUNT`.
    pub fn set_in_flight(&mut self, limit_key: &str, in_flight: u64) -> Result<(), RecordError> {
        // As in `set_demand`: a 0 for a key not tracked changes nothing anywhere.
        if in_flight == 0 && !self.keys.contains_key(limit_key) {
            return validate_limit_key(limit_key).map_err(RecordError::from);
        }
        self.key_mut(limit_key)?.in_flight.set(in_flight);
        Ok(())
    }

    /// Sets the cut-off share this node holds for `limit_key` (`lease`: what its
    /// owner for the key told it, which it may spend per window if it loses that
    /// owner), so that an owner that forgot it (a rebuilt line) charges it.
    /// Clamped to `MAX_COUNT`.
    pub fn set_held(&mut self, limit_key: &str, held: u64) -> Result<(), RecordError> {
        // As in `set_demand`: a 0 for a key not tracked changes nothing anywhere.
        if held == 0 && !self.keys.contains_key(limit_key) {
            return validate_limit_key(limit_key).map_err(RecordError::from);
        }
        self.key_mut(limit_key)?.held.set(held);
        Ok(())
    }

    /// This node's usage of `limit_key` at `now_ms`: the sum of its buckets that count.
    pub fn local_usage(&self, limit_key: &str, now_ms: u64) -> u64 {
        self.keys.get(limit_key).map_or(0, |key| {
            key.slots
                .values()
                .filter(|s| self.window.counts(s.bucket, now_ms))
                .fold(0u64, |sum, s| sum.saturating_add(s.count))
        })
    }

    /// The key-value pairs that changed since the last publish, sorted by key, one per
    /// slot however many records hit it. Buckets that left the window at `now_ms` are
    /// forgotten (not published: every reader already counts them 0), and so are limit
    /// keys left idle. Every key is <= `MAX_KEY_BYTES`, every value <= `MAX_VALUE_BYTES`.
    pub fn publish(&mut self, now_ms: u64) -> Vec<(String, String)> {
        let window = self.window;
        let retired = &mut self.retired;
        let mut out = Vec::new();
        self.keys.retain(|limit_key, key| {
            let before = out.len();
            key.slots.retain(|&slot, s| {
                let counts = window.counts(s.bucket, now_ms);
                if counts && s.count != s.published {
                    out.push((slot_key(limit_key, slot), slot_value(s.bucket, s.count)));
                    s.published = s.count;
                }
                counts
            });
            if let Some(demand) = key.demand.take_changed() {
                out.push((demand_key(limit_key), scalar_value(demand)));
            }
            if let Some(in_flight) = key.in_flight.take_changed() {
                out.push((in_flight_key(limit_key), scalar_value(in_flight)));
            }
            if let Some(held) = key.held.take_changed() {
                out.push((held_key(limit_key), scalar_value(held)));
            }
            key.published_any |= out.len() > before;
            // An idle key is forgotten one publish after its last values went out,
            // so that `unpublish` can still resend them if that write failed (its
            // final 0s above all: readers would keep the old figures for good).
            let keep = !key.is_idle() || out.len() > before;
            if !keep && key.published_any {
                retired.insert(limit_key.clone(), now_ms);
            }
            keep
        });
        crate::maps::shrink_if_sparse(&mut self.keys);
        out.sort_unstable();
        debug_assert!(self.keys.len() <= self.max_keys);
        out
    }

    /// The limit keys [`Self::publish`] forgot since the last call, sorted: each
    /// one's ring ([`super::codec::all_keys`]) can be deleted from the cluster
    /// state. Their last values went out with an earlier publish (a key whose
    /// write failed is resent, not forgotten), and every reader evaluates them to
    /// 0, so deleting them changes no figure; it only stops every member from
    /// holding, gossiping and re-reading a dead ring, and frees this node's state
    /// cap for keys in use (without it, about a thousand tenants ever used on one
    /// node would fill the cap and every later publish would be refused).
    /// Only keys forgotten at or before `quiet_since_ms` are taken: the caller
    /// waits a window after forgetting, so that no reader, however far behind or
    /// however its clock is set against this one, can still count a bucket of the
    /// ring when it goes (a reader that joins later would never see it). At most
    /// `max` at a time, oldest first (the rest wait for the next call), so that
    /// one write stays small when many keys go quiet together.
    pub fn take_retired(&mut self, quiet_since_ms: u64, max: usize) -> Vec<String> {
        let mut due: Vec<(u64, String)> = (self.retired.iter())
            .filter(|(_, at)| **at <= quiet_since_ms)
            .map(|(key, at)| (*at, key.clone()))
            .collect();
        due.sort_unstable();
        due.truncate(max);
        for (_, key) in &due {
            self.retired.remove(key);
        }
        due.into_iter().map(|(_, key)| key).collect()
    }

    /// The write carrying `retired`'s deletions failed: they are due again at
    /// once, except keys recorded into since (their ring is live).
    pub fn retire_again(&mut self, retired: Vec<String>) {
        for key in retired {
            if !self.keys.contains_key(&key) {
                self.retired.entry(key).or_insert(0);
            }
        }
    }

    /// Limit keys waiting for their ring to be deleted.
    pub fn retired_len(&self) -> usize {
        self.retired.len()
    }

    /// The last [`Self::publish`] never reached the cluster (the write was refused):
    /// everything that counts goes out again with the next one. Without this, a
    /// bucket that stopped changing would keep its unpublished count from peers
    /// for good.
    pub fn unpublish(&mut self) {
        for key in self.keys.values_mut() {
            for slot in key.slots.values_mut() {
                // Counts are capped at MAX_COUNT, so never equal to this.
                slot.published = u64::MAX;
            }
            key.demand.published = u64::MAX;
            key.in_flight.published = u64::MAX;
            key.held.published = u64::MAX;
        }
    }

    /// The state of `limit_key`, inserted if new and there is room.
    fn key_mut(&mut self, limit_key: &str) -> Result<&mut LocalKey, RecordError> {
        let max_keys = self.max_keys;
        if !self.keys.contains_key(limit_key) {
            validate_limit_key(limit_key)?;
            if self.keys.len() >= max_keys {
                return Err(RecordError::Full { max_keys });
            }
            // In use again before its ring was deleted: keep the ring (its stale
            // slots read as 0 and are overwritten as they are reused).
            self.retired.remove(limit_key);
            self.keys.insert(limit_key.to_owned(), LocalKey::default());
        }
        // Present: found or inserted just above (Full is unreachable here).
        self.keys
            .get_mut(limit_key)
            .ok_or(RecordError::Full { max_keys })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: &str = "tenant:acme:tokens";

    fn counters() -> LocalCounters {
        LocalCounters::new(Window::try_new(60_000, 60).unwrap())
    }

    #[test]
    fn refunds_never_go_below_zero_and_debts_add() {
        let mut c = counters();
        let t = 1_000_000;
        let b = c.window().bucket_index(t);
        assert_eq!(c.record(K, b, 100, t), Ok(Recorded::Changed));
        assert_eq!(c.record(K, b, -30, t), Ok(Recorded::Changed));
        assert_eq!(c.local_usage(K, t), 70);
        assert_eq!(c.record(K, b, -500, t), Ok(Recorded::Changed));
        assert_eq!(c.local_usage(K, t), 0);
        assert_eq!(c.record(K, b, -1, t), Ok(Recorded::Unchanged));
        assert_eq!(c.record(K, b, 25, t + 5_000), Ok(Recorded::Changed));
        assert_eq!(c.local_usage(K, t + 5_000), 25);
        assert_eq!(c.record(K, b, i64::MAX, t), Ok(Recorded::Changed));
        assert_eq!(c.local_usage(K, t), MAX_COUNT);
    }

    #[test]
    fn publish_is_coalesced_and_only_carries_changes() {
        let mut c = counters();
        let t = 1_000_000;
        let b = c.window().bucket_index(t);
        for _ in 0..100 {
            c.record(K, b, 3, t).unwrap();
        }
        c.record(K, b - 1, 7, t).unwrap();
        c.set_demand(K, 500).unwrap();
        let first = c.publish(t);
        assert_eq!(
            first,
            vec![
                // Bucket 999 lives in slot 999 mod 61 = 23 ("n"), bucket 1000 in 24.
                ("c:tenant:acme:tokens:n".to_owned(), "rr:7".to_owned()),
                ("c:tenant:acme:tokens:o".to_owned(), "rs:8c".to_owned()),
                ("d:tenant:acme:tokens".to_owned(), "dw".to_owned()),
            ]
        );
        assert!(c.publish(t).is_empty(), "nothing changed");
        c.record(K, b, 1, t).unwrap();
        c.record(K, b, -1, t).unwrap();
        c.set_demand(K, 500).unwrap();
        // Back and forth since the last publish: nothing to say.
        assert!(c.publish(t).is_empty());
    }

    #[test]
    fn a_publish_that_never_arrived_is_carried_again() {
        let mut c = counters();
        let t = 1_000_000;
        let b = c.window().bucket_index(t);
        c.record(K, b, 9, t).unwrap();
        c.set_demand(K, 12).unwrap();
        let lost = c.publish(t);
        assert_eq!(lost.len(), 2);
        c.unpublish();
        // The same values again, and the in-flight and held 0s (a value the lost
        // write may have changed to 0 must reach readers too; a redundant 0 costs
        // nothing).
        let mut again = lost.clone();
        again.push(("f:tenant:acme:tokens".to_owned(), "0".to_owned()));
        again.push(("h:tenant:acme:tokens".to_owned(), "0".to_owned()));
        assert_eq!(c.publish(t), again);
        assert!(c.publish(t).is_empty(), "then nothing new");
    }

    #[test]
    fn a_lost_final_zero_of_a_key_going_idle_is_carried_again() {
        let mut c = counters();
        c.set_in_flight(K, 2).unwrap();
        assert_eq!(c.publish(1_000).len(), 1);
        // The key goes idle: its in-flight 0 is published, and that write fails.
        c.set_in_flight(K, 0).unwrap();
        assert_eq!(
            c.publish(2_000),
            vec![("f:tenant:acme:tokens".to_owned(), "0".to_owned())]
        );
        c.unpublish();
        assert!(
            c.publish(3_000)
                .contains(&("f:tenant:acme:tokens".to_owned(), "0".to_owned())),
            "the final 0 goes out again"
        );
    }

    #[test]
    fn a_forgotten_key_is_retired_once_unless_it_is_used_again_first() {
        let mut c = counters();
        let w = *c.window();
        let t = 1_000_000;
        let all = u64::MAX;
        c.record(K, w.bucket_index(t), 10, t).unwrap();
        c.set_demand("tenant:other:requests", 3).unwrap();
        c.publish(t);
        assert!(
            c.take_retired(all, usize::MAX).is_empty(),
            "both keys count"
        );
        // K's bucket leaves the window: its forgetting retires it, once, and only
        // a window after it was forgotten.
        let later = t + w.window_ms() + w.bucket_ms();
        assert!(c.publish(later).is_empty());
        assert!(c.take_retired(later - 1, usize::MAX).is_empty());
        assert_eq!(c.take_retired(later, usize::MAX), vec![K.to_owned()]);
        assert!(c.take_retired(all, usize::MAX).is_empty());
        // The write carrying the deletion failed: it is retried, unless the key
        // was used again meanwhile (its ring is live then).
        c.retire_again(vec![K.to_owned()]);
        c.retire_again(vec![K.to_owned()]);
        assert_eq!(c.take_retired(0, usize::MAX), vec![K.to_owned()]);
        c.retire_again(vec![K.to_owned()]);
        c.record(K, w.bucket_index(later), 1, later).unwrap();
        assert!(c.take_retired(all, usize::MAX).is_empty(), "in use again");
        c.retire_again(vec![K.to_owned()]);
        assert!(
            c.take_retired(all, usize::MAX).is_empty(),
            "nor on a late retry"
        );
        // The other key's demand drops to 0: published, then retired.
        c.set_demand("tenant:other:requests", 0).unwrap();
        assert_eq!(c.publish(later).len(), 2);
        assert!(
            c.take_retired(all, usize::MAX).is_empty(),
            "its final 0 just went out"
        );
        c.publish(later);
        assert_eq!(
            c.take_retired(all, usize::MAX),
            vec!["tenant:other:requests".to_owned()]
        );
        // Many at once go out a few per call, oldest first.
        c.retire_again(vec!["c".to_owned(), "a".to_owned(), "b".to_owned()]);
        assert_eq!(c.take_retired(all, 2), vec!["a".to_owned(), "b".to_owned()]);
        assert_eq!(c.take_retired(all, 2), vec!["c".to_owned()]);
    }

    #[test]
    fn zeros_for_keys_not_tracked_track_nothing_and_retire_nothing() {
        let mut c = counters();
        // An idle actor's export every round: demand and in-flight 0.
        for round in 0..3 {
            c.set_demand(K, 0).unwrap();
            c.set_in_flight(K, 0).unwrap();
            assert!(c.publish(round).is_empty());
        }
        assert!(c.is_empty());
        assert!(c.take_retired(u64::MAX, usize::MAX).is_empty());
        assert!(c.set_in_flight("bad key", 0).is_err(), "still validated");
        // A key tracked but never published (recorded and refunded before any
        // publish) leaves no ring either.
        let w = *c.window();
        c.record(K, w.bucket_index(5), 4, 5).unwrap();
        c.record(K, w.bucket_index(5), -4, 5).unwrap();
        assert!(c.publish(5).is_empty());
        assert!(c.publish(5 + w.window_ms() + w.bucket_ms()).is_empty());
        assert!(c.is_empty());
        assert_eq!(c.retired_len(), 0);
    }

    #[test]
    fn slot_reuse_after_a_full_window_overwrites_cleanly() {
        let mut c = counters();
        let w = *c.window();
        let t = 1_000_000;
        let b = w.bucket_index(t);
        c.record(K, b, 10, t).unwrap();
        c.publish(t);
        let later = t + u64::from(w.ring_slots()) * w.bucket_ms();
        let b2 = w.bucket_index(later);
        assert_eq!(w.slot(b2), w.slot(b));
        // A late refund to the old bucket is expired, and the old bucket is forgotten.
        assert_eq!(c.record(K, b, -5, later), Ok(Recorded::Expired));
        assert!(c.publish(later).is_empty());
        assert!(c.is_empty(), "idle key forgotten");
        c.record(K, b2, 4, later).unwrap();
        let out = c.publish(later);
        assert_eq!(out, vec![(slot_key(K, w.slot(b2)), slot_value(b2, 4))]);
        assert_eq!(c.local_usage(K, later), 4);
    }

    #[test]
    fn a_newer_bucket_keeps_its_slot_after_a_clock_step_back() {
        let mut c = counters();
        let w = *c.window();
        let t = 1_000_000;
        let newer = w.bucket_index(t);
        c.record(K, newer, 10, t).unwrap();
        let back = t - 50_000;
        let older = newer - u64::from(w.ring_slots());
        assert!(w.counts(older, back) && w.counts(newer, back));
        assert_eq!(c.record(K, older, 5, back), Ok(Recorded::Expired));
        assert_eq!(c.local_usage(K, t), 10);
    }

    #[test]
    fn demand_and_in_flight_are_published_when_they_change() {
        let mut c = counters();
        c.set_in_flight(K, 3).unwrap();
        c.set_demand(K, 0).unwrap();
        assert_eq!(c.publish(0), vec![(in_flight_key(K), "3".to_owned())]);
        c.set_in_flight(K, 0).unwrap();
        assert_eq!(c.publish(0), vec![(in_flight_key(K), "0".to_owned())]);
        // Kept one more publish (its 0 may have to go out again), then forgotten.
        assert!(!c.is_empty());
        assert!(c.publish(0).is_empty());
        assert!(c.is_empty(), "0 published, nothing counts: forgotten");
        c.set_demand(K, u64::MAX).unwrap();
        assert_eq!(c.publish(0), vec![(demand_key(K), scalar_value(MAX_COUNT))]);
    }

    #[test]
    fn a_held_share_is_published_when_it_changes_and_a_zero_tracks_nothing() {
        let mut c = counters();
        c.set_held(K, 0).unwrap();
        assert!(c.is_empty(), "an idle key's 0 costs nothing");
        c.set_held(K, 14).unwrap();
        assert_eq!(c.publish(0), vec![(held_key(K), "e".to_owned())]);
        c.set_held(K, 14).unwrap();
        assert!(c.publish(0).is_empty(), "unchanged: nothing goes out");
        c.set_held(K, 0).unwrap();
        assert_eq!(c.publish(0), vec![(held_key(K), "0".to_owned())]);
        assert!(c.publish(0).is_empty());
        assert!(c.is_empty(), "0 published, nothing held: forgotten");
        assert!(c.set_held("bad key", 0).is_err(), "still validated");
    }

    #[test]
    fn full_refuses_new_keys_until_one_goes_idle() {
        let w = Window::try_new(60_000, 60).unwrap();
        let mut c = LocalCounters::with_max_keys(w, 2);
        let t = 1_000_000;
        let b = w.bucket_index(t);
        c.record("a", b, 1, t).unwrap();
        c.set_in_flight("b", 1).unwrap();
        assert_eq!(
            c.record("c", b, 1, t),
            Err(RecordError::Full { max_keys: 2 })
        );
        assert_eq!(
            c.record("a", b, 1, t),
            Ok(Recorded::Changed),
            "known keys still work"
        );
        c.set_in_flight("b", 0).unwrap();
        c.publish(t);
        assert_eq!(c.record("c", b, 1, t), Ok(Recorded::Changed));
        assert_eq!(
            c.record("bad key", b, 1, t),
            Err(RecordError::Key(KeyError::BadByte { index: 3 }))
        );
    }
}
