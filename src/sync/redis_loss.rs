//! `redis` mode: who charges whom while a node cannot reach Redis.
//!
//! A node that loses Redis may spend locally only what the nodes still using Redis
//! charge it there (they lower the capacity they ask of Redis by its equal share).
//! A peer can charge only a loss it has heard of, and a partition or a crash can
//! keep the announcement from it: a node cut from its peers *and* from Redis that
//! spent its share anyway overshot L by that share (the jepsen harness measured
//! 41 of L = 40 when a node's Redis calls timed out during a partition). So:
//!
//! - a lost node announces its loss with an **epoch** (`redis:lost` = the unix ms
//!   the loss began; `0` when healthy), so an acknowledgement of an earlier loss
//!   never counts for this one;
//! - every node publishes the losses it charges (`redis:charging`: the number of
//!   members it divides L by, then one `epoch member` line per loss), and keeps
//!   charging a loss until the member announces it is over or is collected (a dead
//!   member may be a partitioned one still spending locally);
//! - a lost node spends locally only once **every member it knows** lists its
//!   current loss, and then at most `capacity / n` per key, `n` the largest member
//!   count any of them divides by (each charges at least that). Until then it
//!   admits nothing locally: a node that cannot reach Redis nor confirm that its
//!   peers charge it fails closed, the safe side of a double fault.
//!
//! Members counted (for the equal share) are every member known: live, and
//! departed until collected, except those that left gracefully. Members whose
//! confirmation is needed are those, minus this node and the previous incarnations
//! of live nodes (a restarted node's old process spends nothing).

use std::collections::{BTreeMap, BTreeSet};
use tollgate_cluster::membership::MemberId;

/// The key a node publishes the losses it charges under.
pub const REDIS_CHARGING_KEY: &str = "redis:charging";

/// One member's `redis:*` values as read this round.
#[derive(Debug, Clone)]
pub struct Announced {
    /// The member.
    pub id: MemberId,
    /// Whether it is live (else departed: dead, or a superseded incarnation).
    pub live: bool,
    /// Its `redis:lost` value, if published.
    pub lost: Option<String>,
    /// Its `redis:charging` value, if published.
    pub charging: Option<String>,
}

/// One round's reading of who lost Redis and who charges it.
#[derive(Debug, Clone, Default)]
pub struct RedisLosses {
    self_id: String,
    /// Every member counted for the equal shares, this one included (sorted).
    counted: Vec<String>,
    /// Members (this one included) that announced a loss, with its epoch.
    lost: BTreeMap<String, u64>,
    /// Members whose confirmation a loss here needs: their member count and the
    /// epoch they list for this node, if any.
    confirmers: BTreeMap<String, (u64, Option<u64>)>,
}

/// A `redis:lost` value: the loss's epoch, `None` when healthy or unreadable.
fn epoch(value: &str) -> Option<u64> {
    value.parse::<u64>().ok().filter(|e| *e > 0)
}

/// A `redis:charging` value: the member count, and the epoch listed for `member`.
fn parse_charging(value: &str, member: &str) -> (u64, Option<u64>) {
    let mut lines = value.lines();
    let count = lines.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    let listed = lines.find_map(|line| {
        let (epoch, id) = line.split_once(' ')?;
        (id == member).then(|| epoch.parse().ok()).flatten()
    });
    (count, listed)
}

impl RedisLosses {
    /// Reads `announced` (live and departed members, this one included) from
    /// `me`'s point of view; `left`: members that left gracefully.
    pub fn read(me: &MemberId, announced: &[Announced], left: &BTreeSet<String>) -> RedisLosses {
        let self_id = me.to_string();
        let mut live_nodes: BTreeSet<&str> = (announced.iter())
            .filter(|a| a.live)
            .map(|a| a.id.node_id.as_str())
            .collect();
        live_nodes.insert(&me.node_id);
        let mut out = RedisLosses {
            self_id: self_id.clone(),
            counted: vec![self_id.clone()],
            ..RedisLosses::default()
        };
        for member in announced {
            let id = member.id.to_string();
            if left.contains(&id) {
                continue;
            }
            if let Some(e) = member.lost.as_deref().and_then(epoch) {
                out.lost.insert(id.clone(), e);
            }
            if id == self_id {
                continue;
            }
            out.counted.push(id.clone());
            let superseded = !member.live && live_nodes.contains(member.id.node_id.as_str());
            if !superseded {
                let charging = member.charging.as_deref().unwrap_or("");
                out.confirmers
                    .insert(id, parse_charging(charging, &self_id));
            }
        }
        out.counted.sort();
        out.counted.dedup();
        out
    }

    /// Every member counted for the equal shares, this one included.
    pub fn counted(&self) -> &[String] {
        &self.counted
    }

    /// The other members this node charges (they announced a loss).
    pub fn charged(&self) -> impl Iterator<Item = &String> {
        (self.lost.keys()).filter(move |m| **m != self.self_id)
    }

    /// This node's `redis:charging` value: its member count, then each loss it
    /// charges.
    pub fn charging_value(&self) -> String {
        let mut value = self.counted.len().to_string();
        for (member, epoch) in &self.lost {
            if *member != self.self_id {
                value.push_str(&format!("\n{epoch} {member}"));
            }
        }
        value
    }

    /// Whether every member whose confirmation is needed charges this node's loss
    /// of `epoch` (vacuously, a node alone).
    pub fn confirmed(&self, epoch: u64) -> bool {
        epoch > 0 && (self.confirmers.values()).all(|(_, listed)| *listed == Some(epoch))
    }

    /// What a lost node divides each capacity by: the largest member count among
    /// it and its confirmers (each charges it at least `capacity / that`).
    pub fn divisor(&self) -> u64 {
        (self.confirmers.values().map(|(n, _)| *n))
            .chain([self.counted.len() as u64])
            .max()
            .unwrap_or(1)
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

    fn member(id: MemberId, live: bool, lost: &str, charging: &str) -> Announced {
        Announced {
            id,
            live,
            lost: Some(lost.to_owned()),
            charging: Some(charging.to_owned()),
        }
    }

    #[test]
    fn a_loss_is_confirmed_only_when_every_known_member_lists_its_epoch() {
        let (a, b, c) = (id("a", 1), id("b", 1), id("c", 1));
        let me = a.to_string();
        let both = format!("3\n77 {me}");
        let read = |b_charging: &str, c_charging: &str, c_live: bool| {
            let announced = vec![
                member(a.clone(), true, "77", "3"),
                member(b.clone(), true, "0", b_charging),
                member(c.clone(), c_live, "0", c_charging),
            ];
            RedisLosses::read(&a, &announced, &BTreeSet::new())
        };
        assert!(read(&both, &both, true).confirmed(77));
        // One peer has not heard of the loss yet.
        assert!(!read(&both, "3", true).confirmed(77));
        // A dead peer (maybe partitioned, spending through Redis) that never
        // listed it: not confirmed either.
        assert!(!read(&both, "3", false).confirmed(77));
        // It listed an earlier loss only.
        assert!(!read(&both, &format!("3\n12 {me}"), true).confirmed(77));
        // Healthy: nothing to confirm.
        assert!(!read(&both, &both, true).confirmed(0));
    }

    #[test]
    fn graceful_leavers_and_old_incarnations_need_not_confirm_but_count() {
        let (a, b, old_b, c) = (id("a", 1), id("b", 2), id("b", 1), id("c", 1));
        let me = a.to_string();
        let ack = format!("4\n77 {me}");
        let announced = vec![
            member(a.clone(), true, "77", "4"),
            member(b.clone(), true, "0", &ack),
            member(old_b.clone(), false, "0", "2"),
            member(c.clone(), false, "0", "3"),
        ];
        let left: BTreeSet<String> = [c.to_string()].into();
        let losses = RedisLosses::read(&a, &announced, &left);
        assert!(losses.confirmed(77));
        // a, b and b's previous incarnation (until collected); c left.
        assert_eq!(losses.counted().len(), 3);
        // b divides by 4: a spends at most capacity / 4.
        assert_eq!(losses.divisor(), 4);
    }

    #[test]
    fn a_node_charges_every_announced_loss_live_or_departed_until_it_ends() {
        let (a, b, c) = (id("a", 1), id("b", 1), id("c", 1));
        let announced = vec![
            member(a.clone(), true, "0", "3"),
            member(b.clone(), true, "40", "3"),
            // Dead after announcing its loss: it may still be spending locally.
            member(c.clone(), false, "55", "3"),
        ];
        let losses = RedisLosses::read(&a, &announced, &BTreeSet::new());
        let charged: Vec<&String> = losses.charged().collect();
        assert_eq!(charged, [&b.to_string(), &c.to_string()]);
        assert_eq!(
            losses.charging_value(),
            format!("3\n40 {b}\n55 {c}"),
            "the count, then one line per loss"
        );
        // Its own loss is not in what it charges.
        let own = vec![member(a.clone(), true, "9", "1")];
        let alone = RedisLosses::read(&a, &own, &BTreeSet::new());
        assert_eq!(alone.charged().count(), 0);
        assert!(alone.confirmed(9), "a node alone has nobody to wait for");
        assert_eq!(alone.divisor(), 1);
    }
}
