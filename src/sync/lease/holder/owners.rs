//! Who owns the keys a holder states to, behind one trait: peers in `lease`
//! (`super::peers`), Redis in `redis-lease` (`super::redis_owner`). The holder's
//! round (what is due, what to aim for, what to adopt) is the same for both;
//! only where a statement goes, and what a node cut off from its owner may
//! spend, differ.

use super::{Answered, HolderSettings, Items, Round};
use crate::actor::credit::Credit;
use crate::sync::lease::{MemberAddr, View};
use crate::sync::parts::NodeParts;
use futures_util::future::BoxFuture;

/// What a statement travels with: the node's bindings and clock, the RPC
/// client, the holder's settings.
#[derive(Clone, Copy)]
pub(crate) struct Sender<'a> {
    /// The node's parts (bindings, clock).
    pub node: &'a NodeParts,
    /// The internal RPC's client.
    pub client: &'a reqwest::Client,
    /// The holder's settings.
    pub settings: &'a HolderSettings,
}

impl Sender<'_> {
    /// The node's clock (unix ms).
    pub(crate) fn now_ms(&self) -> u64 {
        self.node.registry.clock().now_ns() / 1_000_000
    }
}

/// The owners of a leased mode's keys.
pub(crate) trait Owners: Send + Sync {
    /// `key`'s owner in `view`.
    fn owner_of<'v>(&self, view: &'v View, key: &str) -> Option<&'v MemberAddr>;

    /// Whether the owners are the members, each owning the keys rendezvous
    /// hashing gives it (`lease`): an owner gone from the members owns nothing
    /// any more, and one that moved kept nothing for this node.
    fn are_members(&self) -> bool;

    /// The keys, by binding index, whose owner asked to hear from this node
    /// again (a rebuilt line waits for them, or room came back for an ask it
    /// refused).
    fn take_restates(&self) -> Vec<usize> {
        Vec::new()
    }

    /// What the owner keeps reserved for this node on `key` at `now_ms`,
    /// spent if the owner is lost (`redis-lease`; 0 otherwise).
    fn reservation(&self, _key: &str, _now_ms: u64) -> u64 {
        0
    }

    /// How many keys the owner still keeps a reservation of this node's for,
    /// lapsed ones dropped first.
    fn reservations_kept(&self, _now_ms: u64) -> usize {
        0
    }

    /// Marks `credit` cut off from its owner: what it may then use per window,
    /// credit included (policy `share`).
    fn cut_off(&self, credit: &Credit, key: &str, now_ms: u64);

    /// States `items` to `owner`: each part with its answers (one part, unless
    /// the statements fill more than one batch).
    fn send<'a>(
        &'a self,
        sender: Sender<'a>,
        owner: &'a MemberAddr,
        items: Items,
        view: &'a View,
        round: Round,
    ) -> BoxFuture<'a, Vec<(Items, Answered)>>;
}
