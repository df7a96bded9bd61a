//! What the holder makes of its owners' answers: how each owner answered a
//! round's batches (reachable or not), and each statement's reply adopted.

use super::*;

impl Holder {
    /// Records how `owner` answered this round's batches: `failed`, the first
    /// failure, if any.
    pub(super) fn note_batches(&mut self, owner: &MemberAddr, failed: Option<&CallError>) {
        match failed {
            Some(e) => {
                let failures = self.unreachable.entry(owner.id.clone()).or_insert(0);
                *failures += 1;
                if *failures == 1 {
                    tracing::warn!(owner = %owner.id, error = %e, "lease owner unreachable: spending the credit held, then the cut-off policy");
                }
            }
            None => {
                if self.unreachable.remove(&owner.id).is_some() {
                    tracing::info!(owner = %owner.id, "lease owner reachable again");
                }
            }
        }
    }

    /// Whether statements to `owner` wait for the next `Normal` round: in a
    /// `Woken` round, an owner that failed its last [`FAILURES_BEFORE_BACKOFF`]
    /// batches. The skipped key keeps its ask (`take_wanted` is not called), so
    /// that round takes it; meanwhile its actor does not wake the loop again
    /// (`Credit::want` notifies once per ask), which also means a key whose
    /// owner moves meanwhile is stated to the new one at that round, up to an
    /// interval later.
    pub(super) fn retried_next_round(&self, owner: &MemberAddr, round: Round) -> bool {
        round == Round::Woken
            && (self.unreachable.get(&owner.id)).is_some_and(|n| *n >= FAILURES_BEFORE_BACKOFF)
    }

    /// Adopts `owner`'s answers to `items`.
    pub(super) fn adopt(&mut self, owner: &MemberAddr, items: Items, answered: Answered) {
        let now_ms = self.now_ms();
        let metrics = &self.node.metrics;
        let answers = match answered {
            Ok(answers) => answers,
            Err(_) => {
                // Policy `share`: the told share per window once the credit ends.
                // (A key never used here holds nothing, and stays unsettled.)
                for (i, _) in &items {
                    let binding = &self.node.bindings[*i];
                    if let Some(key) = self.active.get(&(*i as u32)) {
                        self.owners.cut_off(&key.credit, &binding.key, now_ms);
                    }
                    self.node.registry.wake(&binding.scope);
                    metrics.lease_statement("holder", "unreachable");
                }
                return;
            }
        };
        // One shared name for every key this owner answered.
        let owner_id: Arc<str> = owner.id.as_str().into();
        for ((i, snapshot), answer) in items.into_iter().zip(answers) {
            let binding = &self.node.bindings[i];
            let key = self.active.get_mut(&(i as u32));
            match answer {
                Ok(reply) => {
                    match key {
                        Some(key) => {
                            key.credit.with(|b| {
                                b.apply(&snapshot, &reply, now_ms);
                                b.set_cut_off(None);
                            });
                            key.owner = Some(owner_id.clone());
                            key.asked_in_vain = key.asked.is_some()
                                && snapshot.request.want > 0
                                && reply.granted == 0;
                        }
                        // Its owner heard "nothing held" (a credit made since
                        // starts from this owner: `take_new_credits`).
                        None => self.unsettled.set(i as u32, false),
                    }
                    let outcome = if reply.granted > 0 {
                        "granted"
                    } else {
                        "nothing_granted"
                    };
                    metrics.lease_statement("holder", outcome);
                    if reply.credit > 0 {
                        self.node.registry.wake(&binding.scope);
                    }
                }
                Err(code) => {
                    if code != "not_owner" && code != "stale" {
                        tracing::warn!(key = %binding.key, owner = %owner.id, %code, "lease statement refused");
                    }
                    metrics.lease_statement("holder", "refused");
                    // Stated again next round (views of the membership may differ
                    // for a moment).
                    match key {
                        Some(key) => {
                            key.owner = None;
                            key.asked_in_vain = true;
                            if code == "not_owner" && self.owners.are_members() {
                                // It no longer keeps anything for this node.
                                key.credit.with(|b| b.owner_changed());
                            }
                        }
                        None => self.unsettled.set(i as u32, true),
                    }
                }
            }
        }
    }
}
