//! One used key's statement: whether one is due this round, what the key
//! aims to hold, and the snapshot its owner reads.

use super::*;

impl Holder {
    /// Key `i`'s statement this round, if one is due.
    pub(super) fn statement(
        &self,
        i: u32,
        key: &mut ActiveKey,
        owner: &MemberAddr,
        due: &Due<'_>,
    ) -> Statement {
        let (round, now_ms) = (due.round, due.now_ms);
        let binding = &self.node.bindings[i as usize];
        let credit = &key.credit;
        let moved = key.owner.as_deref() != Some(owner.id.as_str());
        let (wanted, wanted_cost) = credit.take_wanted();
        key.asked = wanted.then_some(wanted_cost);
        if moved && self.owners.are_members() {
            // What the previous owner kept for this node went with it.
            credit.with(|b| b.owner_changed());
        }
        let (idle, held, used) =
            credit.with(|b| (b.is_idle(now_ms), b.credit(now_ms), b.used(now_ms)));
        let last = key.stated_ms;
        let heartbeat = now_ms.saturating_sub(last) >= self.ttl_ms() / 3;
        // Read under one lock:
        // - a key still cut off is stated every round (every interval's round
        //   once its owner failed twice in a row): when its owner answers
        //   again it must leave the cut-off (and report its spending) at once;
        // - a key gone idle still holding a told cut-off share states once
        //   more, giving it back: the owner charges that figure until it hears
        //   so (without this, an idle holder leaves it charged for good);
        // - a reply that lowered the told figure is confirmed by one more
        //   statement, or the owner keeps charging the old one for good.
        let (cut_off, holds_figure, owes) =
            credit.with(|b| (b.is_cut_off(), b.told_share() > 0, b.owes_statement()));
        // A graceful stop gives back credit, a figure it holds (the owner
        // charges it until told), and a `redis-lease` reservation (peers
        // would otherwise keep it for this node until it is collected).
        let returning = round == Round::ReturnAll
            && (held > 0 || holds_figure || self.owners.reservation(&binding.key, now_ms) > 0);
        // Its owner asked for a statement (a rebuilt line waits for it, or
        // room came back for an ask it refused).
        let restate_due = std::mem::take(&mut key.restate_due);
        if !(moved
            || restate_due
            || wanted
            || returning
            || cut_off
            || owes
            || ((!idle || holds_figure) && heartbeat))
        {
            return Statement::Nothing { idle };
        }
        // Nothing spent since the last statement: give unused credit back, so
        // nodes whose demand moved on do not hold capacity others need.
        let unused = (heartbeat || restate_due) && !wanted && key.used == Some(used);
        if returning || (unused && held > 0) {
            credit.with(|b| b.return_credit(now_ms));
        }
        let spent_since = key.used.map_or(0, |before| used.saturating_sub(before));
        key.used = Some(used);
        let target = match binding.dimension {
            _ if round == Round::ReturnAll || (unused && !moved) => 0,
            _ => self.target(binding, key, due, idle, (wanted, wanted_cost), spent_since),
        };
        key.target = target;
        let want = match binding.dimension {
            Dimension::Concurrency => target,
            _ => target.saturating_sub(held),
        };
        // Woken again once the credit falls below half of the target, so the
        // refill is a round away long before it runs out. (Half of `want` is
        // near 0 whenever a round finds the credit nearly full: the actor
        // would then run dry and its requests queue for the next round.)
        credit.set_low_water(target / 2);
        // After any statement of nothing held made before the credit was. A
        // stopping node gives its figures back too; a serving one keeps those
        // of keys in use (`Budget::snapshot`).
        let snapshot = credit.with(|b| {
            b.keep_seq_above(due.nothing_held_seq);
            match round {
                Round::ReturnAll => b.final_snapshot(now_ms),
                _ => b.snapshot(want, now_ms),
            }
        });
        key.stated_ms = now_ms;
        Statement::Send(snapshot)
    }

    /// What a key in use aims to hold: slots up to max_credit while in use;
    /// windowed credit for about four sync intervals at the recent rate.
    fn target(
        &self,
        binding: &Binding,
        key: &ActiveKey,
        due: &Due<'_>,
        idle: bool,
        (wanted, wanted_cost): (bool, u64),
        spent_since: u64,
    ) -> u64 {
        let max = max_credit(binding.capacity, self.settings.max_credit);
        let last = key.stated_ms;
        match binding.dimension {
            Dimension::Concurrency if wanted || !idle => max,
            Dimension::Concurrency => 0,
            _ => credit_target(&TargetInputs {
                demand: due.view.demand.get(&*binding.key).copied().unwrap_or(0),
                window_ms: self.settings.window_ms,
                horizon_ms: horizon_ms(self.settings.sync_interval, self.settings.window_ms),
                spent_since,
                elapsed_ms: (last > 0).then(|| due.now_ms.saturating_sub(last)),
                wanted,
                wanted_cost,
                last_target: key.target,
                // At most max_credit, or the one request that costs more.
                cap: max.max(wanted_cost).min(binding.capacity),
            }),
        }
    }
}
