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
use super::{DEFAULT_MAX_KEYS, MAX_COUNT, Windows};

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
    windows: Windows,
    max_keys: usize,
    keys: HashMap<String, LocalKey>,
    /// Limit keys forgotten with a published ring, and when (ms): the ring can be
    /// deleted from the cluster state once [`Self::take_retired`] finds it quiet
    /// for long enough.
    retired: BTreeMap<String, u64>,
}

impl LocalCounters {
    /// Empty counters over `windows`, tracking at most `DEFAULT_MAX_KEYS` keys.
    pub fn new(windows: impl Into<Windows>) -> Self {
        Self::with_max_keys(windows, DEFAULT_MAX_KEYS)
    }

    /// Empty counters tracking at most `max_keys` limit keys at once.
    pub fn with_max_keys(windows: impl Into<Windows>, max_keys: usize) -> Self {
        Self {
            windows: windows.into(),
            max_keys,
            keys: HashMap::new(),
            retired: BTreeMap::new(),
        }
    }

    /// The windows the counters are bucketed by (each key's by its name).
    pub fn windows(&self) -> &Windows {
        &self.windows
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
        let window = *self.windows.of(limit_key);
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
        let slot = self.windows.of(limit_key).slot(bucket_index);
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
        let window = self.windows.of(limit_key);
        self.keys.get(limit_key).map_or(0, |key| {
            key.slots
                .values()
                .filter(|s| window.counts(s.bucket, now_ms))
                .fold(0u64, |sum, s| sum.saturating_add(s.count))
        })
    }

    /// The key-value pairs that changed since the last publish, sorted by key, one per
    /// slot however many records hit it. Buckets that left the window at `now_ms` are
    /// forgotten (not published: every reader already counts them 0), and so are limit
    /// keys left idle. Every key is <= `MAX_KEY_BYTES`, every value <= `MAX_VALUE_BYTES`.
    pub fn publish(&mut self, now_ms: u64) -> Vec<(String, String)> {
        let windows = self.windows;
        let retired = &mut self.retired;
        let mut out = Vec::new();
        self.keys.retain(|limit_key, key| {
            let window = windows.of(limit_key);
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
    /// Only keys forgotten at or before `quiet_since_ms` are taken (a key of the
    /// long window, that much longer before it): the caller waits a base window
    /// after forgetting, so that no reader, however far behind or
    /// however its clock is set against this one, can still count a bucket of the
    /// ring when it goes (a reader that joins later would never see it). At most
    /// `max` at a time, oldest first (the rest wait for the next call), so that
    /// one write stays small when many keys go quiet together.
    pub fn take_retired(&mut self, quiet_since_ms: u64, max: usize) -> Vec<String> {
        let windows = self.windows;
        let longer_by =
            |key: &str| (windows.of(key).window_ms()).saturating_sub(windows.base().window_ms());
        let mut due: Vec<(u64, String)> = (self.retired.iter())
            .filter(|(key, at)| at.saturating_add(longer_by(key)) <= quiet_since_ms)
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
mod tests;
