//! Reading the cluster each round: every member's published state decoded
//! once into the usage replica, demand, sightings, who left, who lost Redis
//! and who supersedes whom.

use super::archive::is_archive_key;
use super::*;

/// What one reading of the cluster found, member by member.
#[derive(Default)]
struct Reading {
    /// Values refused (undecodable, over a bound).
    refused: u64,
    /// Bytes of the values that changed something.
    received: u64,
    /// How old the stalest live peer's last round is here (ms).
    lag_ms: u64,
    /// Members that announced they cannot reach Redis.
    redis_lost: Vec<String>,
    /// Members that announced a graceful leave.
    left: BTreeSet<String>,
    /// Live members, this node included.
    live: HashSet<String>,
    /// `redis`: every member's word on Redis losses.
    announced: Vec<Announced>,
    /// Archive entries read from live peers (`super::archive`).
    archive: Vec<(String, String)>,
}

impl Engine {
    /// Applies every live member's published values; returns how many were refused,
    /// the bytes that changed something, and the convergence lag: how old the
    /// stalest live peer's last round is in this node's view (ms).
    pub(super) async fn read_cluster(&mut self, now_ms: u64) -> (u64, u64, u64) {
        self.cut.clear_heard();
        let values = self.membership.values("").await;
        let usage = Arc::clone(&self.usage);
        let mut usage = usage.lock();
        let mut reading = Reading::default();
        for (member, values) in values.live {
            self.read_live(&mut usage, &mut reading, member, &values, now_ms);
        }
        reading.live.insert(self.self_id.clone());
        // Departed members (dead, or a restarted node's previous incarnation): their
        // last values, as received. What they spent in the window still counts (a
        // rebuilt lease line, a dead member's charge); forgetting the old
        // incarnation's usage when a node restarts within one window of itself,
        // the jepsen harness measures 41-42 of L = 40.
        let mut known = reading.live.clone();
        for (member, values) in values.departed {
            known.insert(member.to_string());
            self.read_departed(&mut usage, &mut reading, member, &values, now_ms);
        }
        self.cut.drop_unmarked();
        // Departed members chitchat no longer holds, from the peers' archives
        // (known as of this read: their own values rule).
        self.archive.set_known(known.clone());
        reading.refused += self.adopt_archives(&mut usage, &reading.archive, now_ms);
        usage.retain_nodes(&reading.live);
        self.collect(&mut usage, &known, now_ms);
        drop(usage);
        let Reading {
            refused,
            received,
            lag_ms,
            mut redis_lost,
            left,
            announced,
            ..
        } = reading;
        redis_lost.sort();
        self.redis_lost = redis_lost;
        if self.redis_gate.is_some() {
            self.redis_losses = RedisLosses::read(self.membership.self_id(), &announced, &left);
        }
        self.left = left;
        (refused, received, lag_ms)
    }

    /// One live member's values.
    fn read_live(
        &mut self,
        usage: &mut ClusterUsage,
        reading: &mut Reading,
        member: MemberId,
        values: &[(String, String)],
        now_ms: u64,
    ) {
        let node = member.to_string();
        let mut redis = Announced {
            id: member,
            live: true,
            stale: false,
            lost: None,
            charging: None,
        };
        for (key, value) in values {
            match key.as_str() {
                REDIS_LOST_KEY => {
                    // `1` (`redis-lease`) or the loss's epoch (`redis`).
                    if value != "0" {
                        reading.redis_lost.push(node.clone());
                    }
                    redis.lost = Some(value.clone());
                }
                REDIS_CHARGING_KEY => redis.charging = Some(value.clone()),
                LEFT_KEY => {
                    if value == "1" {
                        reading.left.insert(node.clone());
                    }
                }
                _ if is_cut_key(key) => {
                    if node != self.self_id {
                        self.cut.hear(&node, key, value);
                    }
                }
                _ if is_archive_key(key) => {
                    if node != self.self_id {
                        reading.archive.push((key.clone(), value.clone()));
                    }
                }
                ROUND_AT_KEY => {
                    if node != self.self_id
                        && let Ok(at) = value.parse::<u64>()
                    {
                        reading.lag_ms = reading.lag_ms.max(now_ms.saturating_sub(at));
                        // Bounds how far its clock runs behind this one, so its
                        // buckets can be dated on this clock where it matters.
                        usage.observe_round(&node, at, now_ms, true);
                        // When this member was last heard from.
                        self.sightings.live_round(&node, at, now_ms);
                    }
                }
                _ => match usage.apply(&node, key, value) {
                    Ok(Applied::Updated) => reading.received += (key.len() + value.len()) as u64,
                    Ok(_) => {}
                    Err(e) => {
                        reading.refused += 1;
                        tracing::warn!(%node, %key, error = %e, "refused a gossip value");
                    }
                },
            }
        }
        reading.live.insert(node);
        if self.redis_gate.is_some() {
            reading.announced.push(redis);
        }
    }

    /// One departed member's last values.
    fn read_departed(
        &mut self,
        usage: &mut ClusterUsage,
        reading: &mut Reading,
        member: MemberId,
        values: &[(String, String)],
        now_ms: u64,
    ) {
        let node = member.to_string();
        let heard_ms = self.sightings.last_fresh(&node).unwrap_or(0);
        let mut redis = Announced {
            id: member,
            live: false,
            stale: now_ms.saturating_sub(heard_ms) >= self.dead_node_grace_ms / 2,
            lost: None,
            charging: None,
        };
        for (key, value) in values {
            match key.as_str() {
                // A departed member's last word on Redis stands until it is
                // collected: it may be cut off and still spending locally.
                REDIS_LOST_KEY => redis.lost = Some(value.clone()),
                REDIS_CHARGING_KEY => redis.charging = Some(value.clone()),
                // Its last round's stamp bounds its clock's lag even if this node
                // never saw it live (a restarted node's previous incarnation, read
                // by the new one): it ran no later than now.
                ROUND_AT_KEY => {
                    if let Ok(at) = value.parse::<u64>() {
                        usage.observe_round(&node, at, now_ms, false);
                        // Its last round, for `unwitnessed_cut` (not a sign of life:
                        // `last_fresh` is not touched).
                        self.sightings.departed_round(&node, at);
                    }
                }
                LEFT_KEY => {
                    if value == "1" {
                        reading.left.insert(node.clone());
                    }
                }
                _ if is_cut_key(key) => {}
                // What it republished of others holds as long as it did: the
                // last member that knew them may be the one that died.
                _ if is_archive_key(key) => reading.archive.push((key.clone(), value.clone())),
                // Errors were logged while it was live; stale values are ignored.
                _ => {
                    let _ = usage.apply(&node, key, value);
                }
            }
        }
        if self.redis_gate.is_some() {
            reading.announced.push(redis);
        }
    }

    /// Forgets what nothing counts any more: zero registers, members chitchat
    /// collected, sightings of members it no longer holds.
    fn collect(&mut self, usage: &mut ClusterUsage, known: &HashSet<String>, now_ms: u64) {
        // Registers that read 0 carry nothing (a ring its owner deleted keeps its
        // last, zero, values here until collected); one still published comes
        // back with the next read, so collect seldom.
        if now_ms >= self.next_gc_ms {
            usage.gc(now_ms);
            self.next_gc_ms = now_ms + GC_EVERY_MS;
        }
        // Members chitchat collected (after the dead-node grace) are forgotten here
        // too once nothing of theirs counts any more: bounded memory however many
        // restarts, and never before their usage has left the window (the grace
        // may be shorter than a window).
        for node in usage.nodes() {
            if !known.contains(&node) && usage.is_idle(&node, now_ms) {
                usage.forget_node(&node);
            }
        }
        // Bounded: members chitchat still holds (live, dead or superseded). A
        // member that just went silent keeps its last fresh round: the cut's time
        // for `freeze`, and what tells a witness of the cut (`unwitnessed_cut`).
        self.sightings.retain(known);
    }
}
