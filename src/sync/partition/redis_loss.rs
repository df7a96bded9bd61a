//! `redis` mode: who charges whom while a node cannot reach Redis.
//!
//! A node that loses Redis may spend locally only what the nodes still using Redis
//! charge it there (they lower the capacity they ask of Redis by its share). A peer
//! can charge only a loss it has heard of, and a partition or a crash can keep the
//! announcement from it: a node cut from its peers *and* from Redis that spends
//! its share anyway overshoots L by that share (without what follows, the jepsen
//! harness measures 41 of L = 40 when a node's Redis calls time out during a
//! partition). So:
//!
//! - a lost node announces its loss with an **epoch** and a **divisor**
//!   (`redis:lost` = `"<epoch> <divisor>"`; `0` when healthy): the epoch (the unix
//!   ms the loss began) keeps a confirmation of an earlier loss from counting for
//!   this one; the divisor D, fixed for the loss, is the largest member count it
//!   knew of when the loss began. It spends at most `capacity / D` per key, and
//!   every peer charges it exactly that, so the figure cannot shrink under it;
//! - every node publishes the losses it charges (`redis:charging`: its member
//!   count, then one `epoch member` line per loss), and keeps charging a loss until
//!   the member announces it is over or is collected (a dead member may be a
//!   partitioned one still spending locally);
//! - a lost node spends locally only once **every member it knows** lists its
//!   current loss, and at least one does unless it is alone by design. A departed
//!   member's last list counts only while it was heard from within half the
//!   dead-node grace: it forgets this node (and stops charging it) a grace after
//!   declaring it dead. Until then the node admits nothing locally: a node that
//!   can neither reach Redis nor confirm that its peers charge it fails closed,
//!   the safe side of a double fault.
//!
//! Members counted are every member known: live, and departed until collected,
//! except those that left gracefully. Members whose confirmation is needed are
//! those, minus this node and older incarnations of live nodes (a restarted
//! node's old process spends nothing).

use std::collections::{BTreeMap, BTreeSet};
use tollgate_cluster::membership::MemberId;

/// The key a node publishes the losses it charges under.
pub(crate) const REDIS_CHARGING_KEY: &str = "redis:charging";

/// One member's `redis:*` values as read this round.
#[derive(Debug, Clone)]
pub(crate) struct Announced {
    /// The member.
    pub id: MemberId,
    /// Whether it is live (else departed: dead, or a superseded incarnation).
    pub live: bool,
    /// Departed and not heard from for half the dead-node grace or more: its last
    /// list no longer confirms anything.
    pub stale: bool,
    /// Its `redis:lost` value, if published.
    pub lost: Option<String>,
    /// Its `redis:charging` value, if published.
    pub charging: Option<String>,
}

/// A loss as announced: when it began, and what the lost node divides by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loss {
    /// The unix ms the loss began (never 0).
    pub epoch: u64,
    /// The lost node spends at most `capacity / divisor` per key (never 0).
    pub divisor: u64,
}

impl Loss {
    /// Its `redis:lost` value.
    pub(crate) fn value(&self) -> String {
        format!("{} {}", self.epoch, self.divisor)
    }

    /// A `redis:lost` value: `None` when healthy (`0`) or unreadable.
    fn parse(value: &str) -> Option<Loss> {
        let (epoch, divisor) = value.split_once(' ')?;
        let epoch = epoch.parse::<u64>().ok().filter(|e| *e > 0)?;
        let divisor = divisor.parse::<u64>().ok().filter(|d| *d > 0)?;
        Some(Loss { epoch, divisor })
    }

    /// What this loss is charged (and may spend) of `capacity`.
    pub(crate) fn share_of(&self, capacity: u64) -> u64 {
        capacity / self.divisor
    }
}

/// What a member's list says: its member count and the epoch it lists for us.
#[derive(Debug, Clone, Copy, Default)]
struct Confirmation {
    members: u64,
    listed: Option<u64>,
}

/// A `redis:charging` value, read for `member`.
fn parse_charging(value: &str, member: &str) -> Confirmation {
    let mut lines = value.lines();
    let members = lines.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    let listed = lines.find_map(|line| {
        let (epoch, id) = line.split_once(' ')?;
        (id == member).then(|| epoch.parse().ok()).flatten()
    });
    Confirmation { members, listed }
}

/// One round's reading of who lost Redis and who charges it.
#[derive(Debug, Clone, Default)]
pub(crate) struct RedisLosses {
    /// How many members are counted, this one included (0: not read yet).
    members: u64,
    /// Other members' losses this node charges.
    lost: BTreeMap<String, Loss>,
    /// Members whose confirmation a loss here needs (a stale one confirms nothing).
    confirmers: BTreeMap<String, Confirmation>,
}

impl RedisLosses {
    /// Reads `announced` (live and departed members, this one included) from
    /// `me`'s point of view; `left`: members that left gracefully.
    pub(crate) fn read(
        me: &MemberId,
        announced: &[Announced],
        left: &BTreeSet<String>,
    ) -> RedisLosses {
        let self_id = me.to_string();
        // The newest live generation of each node id: older ones are superseded.
        let mut newest: BTreeMap<&str, u64> = BTreeMap::new();
        for id in (announced.iter().filter(|a| a.live).map(|a| &a.id)).chain([me]) {
            let entry = newest.entry(id.node_id.as_str()).or_insert(id.generation);
            *entry = (*entry).max(id.generation);
        }
        let mut out = RedisLosses {
            members: 1,
            ..RedisLosses::default()
        };
        for member in announced {
            let id = member.id.to_string();
            if id == self_id || left.contains(&id) {
                continue;
            }
            if let Some(loss) = member.lost.as_deref().and_then(Loss::parse) {
                out.lost.insert(id.clone(), loss);
            }
            out.members += 1;
            let superseded =
                (newest.get(member.id.node_id.as_str())).is_some_and(|g| *g > member.id.generation);
            if !superseded {
                let confirmation = match member.stale {
                    true => Confirmation::default(),
                    false => parse_charging(member.charging.as_deref().unwrap_or(""), &self_id),
                };
                out.confirmers.insert(id, confirmation);
            }
        }
        out
    }

    /// Whether the members were read at all (a node lost before its first round
    /// knows no divisor yet).
    pub(crate) fn is_read(&self) -> bool {
        self.members > 0
    }

    /// The other members' losses this node charges.
    pub(crate) fn charged(&self) -> impl Iterator<Item = &Loss> {
        self.lost.values()
    }

    /// This node's `redis:charging` value: its member count, then each loss it
    /// charges.
    pub(crate) fn charging_value(&self) -> String {
        let mut value = self.members.to_string();
        for (member, loss) in &self.lost {
            value.push_str(&format!("\n{} {member}", loss.epoch));
        }
        value
    }

    /// Whether every member whose confirmation is needed charges this node's loss
    /// of `epoch`; with nobody to ask, only a node alone by design.
    pub(crate) fn confirmed(&self, epoch: u64, alone_by_design: bool) -> bool {
        epoch > 0
            && (alone_by_design || !self.confirmers.is_empty())
            && (self.confirmers.values()).all(|c| c.listed == Some(epoch))
    }

    /// The largest member count this node knows of: its own, or any confirmer's.
    /// A loss beginning now divides by it.
    pub(crate) fn known_members(&self) -> u64 {
        (self.confirmers.values().map(|c| c.members))
            .fold(self.members, u64::max)
            .max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(node: &str, generation: u64) -> MemberId {
        MemberId {
            node_id: node.to_owned(),
            generation,
            gossip_addr: "127.0.0.1:7000".parse().unwrap(),
        }
    }

    fn member(id: &MemberId, live: bool, lost: &str, charging: &str) -> Announced {
        Announced {
            id: id.clone(),
            live,
            stale: false,
            lost: Some(lost.to_owned()),
            charging: Some(charging.to_owned()),
        }
    }

    fn none() -> BTreeSet<String> {
        BTreeSet::new()
    }

    #[test]
    fn a_loss_is_confirmed_only_when_every_known_member_lists_its_epoch() {
        let (a, b, c) = (id("a", 1), id("b", 1), id("c", 1));
        let both = format!("3\n77 {a}");
        let read = |b_charging: &str, c: Announced| {
            let announced = vec![
                member(&a, true, "77 3", "3"),
                member(&b, true, "0", b_charging),
                c,
            ];
            RedisLosses::read(&a, &announced, &none())
        };
        assert!(read(&both, member(&c, true, "0", &both)).confirmed(77, false));
        // One peer has not heard of the loss yet.
        assert!(!read(&both, member(&c, true, "0", "3")).confirmed(77, false));
        // A dead peer (maybe partitioned, spending through Redis) that never
        // listed it: not confirmed either.
        assert!(!read(&both, member(&c, false, "0", "3")).confirmed(77, false));
        // A dead peer that did list it confirms, until it is stale (it forgets this
        // node a grace after declaring it dead).
        let mut dead = member(&c, false, "0", &both);
        assert!(read(&both, dead.clone()).confirmed(77, false));
        dead.stale = true;
        assert!(!read(&both, dead).confirmed(77, false));
        // It listed an earlier loss only.
        let earlier = member(&c, true, "0", &format!("3\n12 {a}"));
        assert!(!read(&both, earlier).confirmed(77, false));
        // Healthy: nothing to confirm.
        assert!(!read(&both, member(&c, true, "0", &both)).confirmed(0, false));
    }

    #[test]
    fn a_node_that_knows_nobody_confirms_only_when_alone_by_design() {
        // Started inside an island, or its peers collected while it was cut off:
        // nobody charges it, so it spends nothing.
        let a = id("a", 1);
        let alone = RedisLosses::read(&a, &[member(&a, true, "9 1", "1")], &none());
        assert!(!alone.confirmed(9, false));
        assert!(alone.confirmed(9, true), "a cluster of one by design");
        assert_eq!(alone.known_members(), 1);
        assert!(alone.is_read());
        assert!(!RedisLosses::default().is_read(), "before the first round");
    }

    #[test]
    fn graceful_leavers_and_old_incarnations_need_not_confirm_but_count() {
        let (a, b, old_b, c) = (id("a", 1), id("b", 2), id("b", 1), id("c", 1));
        let ack = format!("4\n77 {a}");
        let announced = vec![
            member(&a, true, "77 4", "4"),
            member(&b, true, "0", &ack),
            member(&old_b, false, "0", "2"),
            member(&c, false, "0", "3"),
        ];
        let left: BTreeSet<String> = [c.to_string()].into();
        let losses = RedisLosses::read(&a, &announced, &left);
        assert!(losses.confirmed(77, false));
        // a, b and b's previous incarnation (until collected); c left.
        assert_eq!(losses.charging_value(), "3");
        // b counts 4: a loss beginning now divides by 4.
        assert_eq!(losses.known_members(), 4);
        // A newer incarnation not yet live must still confirm.
        let new_b = id("b", 3);
        let mut announced = announced;
        announced.push(member(&new_b, false, "0", "4"));
        assert!(!RedisLosses::read(&a, &announced, &left).confirmed(77, false));
    }

    #[test]
    fn a_node_charges_every_announced_loss_live_or_departed_at_its_own_divisor() {
        let (a, b, c) = (id("a", 1), id("b", 1), id("c", 1));
        let announced = vec![
            member(&a, true, "0", "3"),
            member(&b, true, "40 3", "3"),
            // Dead after announcing its loss: it may still be spending locally.
            member(&c, false, "55 4", "3"),
            // Unreadable values charge nothing and break nothing.
            member(&id("d", 1), true, "1", "x"),
        ];
        let losses = RedisLosses::read(&a, &announced, &none());
        let charged: Vec<u64> = losses.charged().map(|l| l.share_of(120)).collect();
        assert_eq!(charged, [40, 30], "each at the divisor it announced");
        assert_eq!(
            losses.charging_value(),
            format!("4\n40 {b}\n55 {c}"),
            "the count, then one line per loss"
        );
        assert_eq!(
            Loss::parse("55 4").map(|l| l.value()).as_deref(),
            Some("55 4")
        );
        assert_eq!(Loss::parse("0"), None);
    }
}
