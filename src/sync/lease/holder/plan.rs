//! What a holder plans, from its figures alone: how much credit to aim for,
//! when a key asked in vain waits for the interval's round, and how
//! statements gather into one batch per owner. Pure.

use super::*;

/// What [`credit_target`] decides from.
pub(super) struct TargetInputs {
    /// This node's demand over the window (cost per window).
    pub(super) demand: u64,
    pub(super) window_ms: u64,
    /// How long the credit should last (four sync intervals).
    pub(super) horizon_ms: u64,
    /// Cost spent since the last statement, and how long ago that was (`None`:
    /// never stated).
    pub(super) spent_since: u64,
    pub(super) elapsed_ms: Option<u64>,
    /// The actor was refused or ran low since, and the largest cost refused (0:
    /// it only ran low).
    pub(super) wanted: bool,
    pub(super) wanted_cost: u64,
    pub(super) last_target: u64,
    pub(super) cap: u64,
}

/// Credit a holder holds and has not spent is committed at its owner, so with
/// every holder holding its horizon's worth, about `horizon / W` of L sits idle
/// where no request needs it. The horizon is four sync intervals (a refill is a
/// round away long before the credit runs out), but at most `W /
/// HORIZON_PARTS_OF_WINDOW`: four 200 ms intervals are 1.3% of a 60 s window,
/// and 16% of the harness's 5 s one (four intervals ahead there, holders keep
/// ~2.3 of 40 unspent while their owners find L committed, and lease trails
/// `local split`; docs/BENCHMARKS.md, "`hot-tenant` at 3 nodes"), or most of a
/// per-second limit.
pub(super) const HORIZON_PARTS_OF_WINDOW: u64 = 50;

/// How long a holder's windowed credit should last ([`HORIZON_PARTS_OF_WINDOW`]).
pub(super) fn horizon_ms(sync_interval: Duration, window_ms: u64) -> u64 {
    (4 * sync_interval.as_millis() as u64)
        .min(window_ms / HORIZON_PARTS_OF_WINDOW)
        .max(1)
}

/// What a holder aims to hold for a windowed key: enough for the horizon at the
/// faster of its rate over the window and its rate since its last statement, and
/// twice its last target when its actor ran dry meanwhile; at least the one
/// request it could not pay; at most `cap`. Over the window alone, a node whose
/// load has just risen (or that has just started: its window not yet full) would
/// ask for a few milliseconds' worth each round and its requests would queue for
/// credit (in lease mode at 64 connections, ~250 statements/s and 1% of requests
/// waiting over 32 ms).
pub(super) fn credit_target(t: &TargetInputs) -> u64 {
    let over_window = t.demand.saturating_mul(t.horizon_ms) / t.window_ms.max(1);
    let recent = t.elapsed_ms.map_or(0, |elapsed| {
        t.spent_since.saturating_mul(t.horizon_ms) / elapsed.max(1)
    });
    // A refusal (a cost it could not pay), not merely running low: a low-water
    // wake is the ordinary refill, and doubling on it would climb to max_credit.
    let grown = if t.wanted && t.wanted_cost > 0 {
        t.last_target.saturating_mul(2)
    } else {
        0
    };
    (over_window.max(recent).max(grown))
        .max(t.wanted_cost)
        .max(u64::from(t.wanted))
        .min(t.cap)
}

/// The statement of a key never used here: no usage, no credit, wants nothing,
/// adopted no reply (what a new budget states).
pub(super) fn nothing_held(seq: u64, now_ms: u64) -> Snapshot {
    Snapshot {
        request: SyncRequest {
            seq,
            ..SyncRequest::default()
        },
        at_ms: now_ms,
        cut_off_spent: 0,
        refunded: 0,
    }
}

/// Whether `key`, asked for in a [`Round::Woken`] round, waits for the next
/// `Normal` one: its last ask was granted nothing or refused within this
/// interval (each `Normal` round forgets it, so a key gone quiet asks at once
/// when its next burst comes). Not when its owner moved: the new owner hears
/// from it at once (a rebuilt line waits for it). A key refused per key has no
/// owner recorded and waits.
pub(super) fn asked_in_vain_this_interval(
    key: &mut ActiveKey,
    owner: &MemberAddr,
    round: Round,
) -> bool {
    waits_for_the_interval(
        &mut key.asked_in_vain,
        key.owner.as_deref(),
        &owner.id,
        round,
    )
}

/// [`asked_in_vain_this_interval`] on the key's flag and its recorded owner.
pub(super) fn waits_for_the_interval(
    asked_in_vain: &mut bool,
    recorded_owner: Option<&str>,
    owner: &str,
    round: Round,
) -> bool {
    if round != Round::Woken {
        *asked_in_vain = false;
        return false;
    }
    let owner_moved = recorded_owner.is_some_and(|o| o != owner);
    *asked_in_vain && !owner_moved
}

/// Adds `item` to `owner`'s batch (its id and address copied once per batch, not
/// per key).
pub(super) fn add_to_batch(
    batches: &mut BTreeMap<String, (MemberAddr, Items)>,
    owner: &MemberAddr,
    item: (usize, Snapshot),
) {
    match batches.get_mut(&owner.id) {
        Some((_, items)) => items.push(item),
        None => {
            batches.insert(owner.id.clone(), (owner.clone(), vec![item]));
        }
    }
}

/// Most credit one holder holds for a key of capacity `capacity`.
pub(crate) fn max_credit(capacity: u64, fraction: f64) -> u64 {
    ((capacity as f64 * fraction).floor() as u64).clamp(1, capacity.max(1))
}
