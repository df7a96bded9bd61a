//! The live view: which of the nodes chitchat considers alive are members.
//!
//! chitchat keys nodes by the whole `(node_id, generation, gossip address)` triple, so
//! two processes claiming one `node_id` are two distinct, equally live nodes to it. The
//! gateway needs one member per `node_id` (rendezvous hashing, counters keyed by node),
//! so [`Arbiter`] picks, per `node_id`, the incarnation to trust. It is a pure state
//! machine: it takes the live candidates of one liveness update and returns the view
//! plus events to log; it never reads a clock or touches a socket.
//!
//! Rules (docs/design/membership.md, "Duplicate ids"), per `node_id`:
//! - the highest generation wins: a restarted node (newer generation) replaces its
//!   previous incarnation at once, without waiting for the failure detector;
//! - on a generation tie the incumbent (the incarnation this observer already trusted)
//!   keeps the seat; with no incumbent the lowest gossip address wins, so fresh
//!   observers agree with each other;
//! - a loser is *superseded* (an old incarnation: same gossip address as the winner,
//!   or the previous incumbent beaten by a newer generation, or a lower generation seen
//!   by an observer with no incumbent), otherwise it is a *duplicate*: refused, logged,
//!   counted once per incarnation while it stays live;
//! - every node is the incumbent of its own `node_id` from the start.
//!
//! Invariant: `LiveView::members` holds at most one entry per `node_id`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;

use chitchat::ChitchatId;
use serde::Serialize;

use super::metadata::{MetadataError, NodeMetadata};

/// One incarnation of a node: chitchat's identity triple.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct MemberId {
    /// Stable node name, e.g. `node-1`; at most one live member carries it.
    pub node_id: String,
    /// Incarnation number (unix ms at start); a restart must raise it.
    pub generation: u64,
    /// UDP address peers gossip with.
    pub gossip_addr: SocketAddr,
}

impl fmt::Display for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}@{}",
            self.node_id, self.generation, self.gossip_addr
        )
    }
}

impl From<&ChitchatId> for MemberId {
    fn from(id: &ChitchatId) -> Self {
        MemberId {
            node_id: id.node_id.to_string(),
            generation: id.generation_id,
            gossip_addr: id.gossip_advertise_addr,
        }
    }
}

impl MemberId {
    pub(crate) fn to_chitchat_id(&self) -> ChitchatId {
        ChitchatId::new(self.node_id.as_str(), self.generation, self.gossip_addr)
    }

    /// The `node_id` part of a member id's text (`{node_id}/{generation}@{addr}`,
    /// as [`MemberId`] displays it): what the incarnations of one node share.
    /// Text of another shape is its own node id.
    pub fn node_id_of(member: &str) -> &str {
        let Some((incarnation, _addr)) = member.rsplit_once('@') else {
            return member;
        };
        match incarnation.rsplit_once('/') {
            Some((node_id, generation))
                if !node_id.is_empty()
                    && !generation.is_empty()
                    && generation.bytes().all(|b| b.is_ascii_digit()) =>
            {
                node_id
            }
            _ => member,
        }
    }
}

/// A trusted live member: alive per the failure detector, winner for its `node_id`,
/// with metadata that parses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Member {
    /// Which incarnation.
    pub id: MemberId,
    /// Its published metadata.
    pub metadata: NodeMetadata,
    /// Whether this is the local node.
    pub is_self: bool,
}

/// A live node that won its `node_id` but whose metadata is missing or invalid: it is
/// reported here and left out of members and values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UntrustedMember {
    /// Which incarnation.
    pub id: MemberId,
    /// Why its metadata was refused.
    pub reason: MetadataError,
}

/// A snapshot of the live set, as published by `Membership::watch_live`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveView {
    /// Trusted live members (self included unless superseded), sorted by `node_id`.
    pub members: Vec<Member>,
    /// Live winners whose metadata cannot be trusted.
    pub untrusted: Vec<UntrustedMember>,
    /// Live incarnations refused as duplicates of a member's `node_id`.
    pub refused: Vec<MemberId>,
    /// True when a live incarnation of our own `node_id` with a higher generation
    /// exists: peers follow it, not us, and this process should stop.
    pub self_superseded: bool,
}

/// One node chitchat reports alive, with its parsed metadata.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    pub(crate) id: MemberId,
    pub(crate) metadata: Result<NodeMetadata, MetadataError>,
}

/// Something worth a log line, returned by [`Arbiter::update`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    /// A newly seen duplicate incarnation was refused (counted).
    DuplicateRefused { refused: MemberId, kept: MemberId },
    /// A newer incarnation replaced an older one.
    Superseded { old: MemberId, new: MemberId },
    /// A newer incarnation of our own `node_id` is live: we are the stale one.
    SelfSuperseded { by: MemberId },
    /// A winner's metadata was refused (reported once per incarnation and reason).
    Untrusted { id: MemberId, reason: MetadataError },
}

/// Decides, update after update, which live incarnation holds each `node_id`.
#[derive(Debug)]
pub(crate) struct Arbiter {
    self_id: MemberId,
    /// `node_id` -> the incarnation trusted at the previous update.
    incumbents: HashMap<String, MemberId>,
    /// Duplicates refused and still live (counted once while they stay live).
    refused: HashSet<MemberId>,
    /// Incarnations already reported untrusted, so the log is not flooded.
    reported_untrusted: HashSet<MemberId>,
    duplicates_seen: u64,
}

impl Arbiter {
    pub(crate) fn new(self_id: MemberId) -> Self {
        let incumbents = HashMap::from([(self_id.node_id.clone(), self_id.clone())]);
        Arbiter {
            self_id,
            incumbents,
            refused: HashSet::new(),
            reported_untrusted: HashSet::new(),
            duplicates_seen: 0,
        }
    }

    /// Total duplicate incarnations refused since start (a counter, never decreases).
    pub(crate) fn duplicates_seen(&self) -> u64 {
        self.duplicates_seen
    }

    /// Computes the view for the live `candidates` (self need not be among them: it is
    /// always alive to itself).
    pub(crate) fn update(&mut self, candidates: Vec<Candidate>) -> (LiveView, Vec<Event>) {
        let mut groups: BTreeMap<String, Vec<Candidate>> = BTreeMap::new();
        for candidate in candidates {
            groups
                .entry(candidate.id.node_id.clone())
                .or_default()
                .push(candidate);
        }
        let mut view = LiveView::default();
        let mut events = Vec::new();
        let mut still_refused = HashSet::new();
        let mut incumbents = HashMap::new();
        for (node_id, group) in groups {
            let Some(winner) = self.settle(&node_id, group, &mut view, &mut events) else {
                continue;
            };
            still_refused.extend(
                view.refused
                    .iter()
                    .filter(|id| id.node_id == node_id)
                    .cloned(),
            );
            incumbents.insert(node_id, winner);
        }
        self.refused = still_refused;
        self.incumbents = incumbents;
        // Self is always alive to itself; if it vanished from the candidates, keep its seat.
        self.incumbents
            .entry(self.self_id.node_id.clone())
            .or_insert_with(|| self.self_id.clone());
        let live: HashSet<&MemberId> = view
            .members
            .iter()
            .map(|m| &m.id)
            .chain(view.untrusted.iter().map(|u| &u.id))
            .collect();
        self.reported_untrusted.retain(|id| live.contains(id));
        (view, events)
    }

    /// Settles one `node_id` group; returns the winner.
    fn settle(
        &mut self,
        node_id: &str,
        group: Vec<Candidate>,
        view: &mut LiveView,
        events: &mut Vec<Event>,
    ) -> Option<MemberId> {
        let incumbent = self
            .incumbents
            .get(node_id)
            .filter(|inc| group.iter().any(|c| &c.id == *inc))
            .cloned();
        let winner = pick_winner(&group, incumbent.as_ref())?;
        for candidate in &group {
            if candidate.id == winner.id {
                continue;
            }
            self.classify_loser(&candidate.id, &winner.id, incumbent.as_ref(), view, events);
        }
        if winner.id.node_id == self.self_id.node_id && winner.id != self.self_id {
            view.self_superseded = true;
            events.push(Event::SelfSuperseded {
                by: winner.id.clone(),
            });
        }
        let is_self = winner.id == self.self_id;
        match &winner.metadata {
            Ok(metadata) => view.members.push(Member {
                id: winner.id.clone(),
                metadata: metadata.clone(),
                is_self,
            }),
            Err(reason) => {
                if self.reported_untrusted.insert(winner.id.clone()) {
                    events.push(Event::Untrusted {
                        id: winner.id.clone(),
                        reason: reason.clone(),
                    });
                }
                view.untrusted.push(UntrustedMember {
                    id: winner.id.clone(),
                    reason: reason.clone(),
                });
            }
        }
        Some(winner.id.clone())
    }

    fn classify_loser(
        &mut self,
        loser: &MemberId,
        winner: &MemberId,
        incumbent: Option<&MemberId>,
        view: &mut LiveView,
        events: &mut Vec<Event>,
    ) {
        let old_incarnation = loser.gossip_addr == winner.gossip_addr
            || incumbent == Some(loser)
            || (incumbent.is_none() && loser.generation < winner.generation);
        if old_incarnation {
            if incumbent == Some(loser) {
                events.push(Event::Superseded {
                    old: loser.clone(),
                    new: winner.clone(),
                });
            }
            return;
        }
        view.refused.push(loser.clone());
        if !self.refused.contains(loser) {
            self.duplicates_seen += 1;
            events.push(Event::DuplicateRefused {
                refused: loser.clone(),
                kept: winner.clone(),
            });
        }
    }
}

/// Highest generation wins; on a tie the incumbent, else the lowest gossip address.
fn pick_winner<'a>(group: &'a [Candidate], incumbent: Option<&MemberId>) -> Option<&'a Candidate> {
    let top_generation = group.iter().map(|c| c.id.generation).max()?;
    let mut tied = group.iter().filter(|c| c.id.generation == top_generation);
    let incumbent = incumbent.filter(|inc| inc.generation == top_generation);
    if let Some(found) = incumbent.and_then(|inc| group.iter().find(|c| &c.id == inc)) {
        return Some(found);
    }
    let first = tied.next()?;
    Some(tied.fold(first, |best, c| {
        if c.id.gossip_addr < best.id.gossip_addr {
            c
        } else {
            best
        }
    }))
}

#[cfg(test)]
mod tests;
