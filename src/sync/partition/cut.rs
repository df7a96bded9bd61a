//! What a node that joined during a cut learns of it from the nodes that saw it.
//!
//! A cut's floors are computed from every member's demand **frozen at the cut**:
//! both sides froze (nearly) the same figures, so the shares they charge each
//! other sum to L without talking (docs/design/cluster.md). A node that joins
//! while a member is unreachable (a new node, or a crashed node's successor) saw
//! no such moment: its records start after the cut, and frozen from them, the
//! unreachable member's share comes out smaller. Left at that, the in-process
//! test of a node cut off, crashed and restarted measures 137-149 of L = 120.
//!
//! So every node that knows a cut publishes what it charges the unreachable: per
//! limit key, the total of their floors (`sync:cut:<key>`), and the members at the
//! cut (`sync:cut`). A node that did not witness every unreachable member's last
//! rounds charges, per key, the most any peer publishes, or its own figure if
//! more, and all of L while no peer has told it anything (the safe side). It
//! publishes what it charges in turn, so a rolling restart passes the knowledge
//! on. `local split` divides the side's part of L, `L x (at-cut members not
//! unreachable) / (at-cut members)`, equally among the members live now.
//!
//! The marker is written after the charges in one batch and whenever any of them
//! changes (its sequence number moves), and chitchat ships a node's values oldest
//! version first: a peer that has the marker has every charge written with it.

use std::collections::{BTreeMap, HashMap};

/// Marker: `"<seq> <member> <member> ..."`, the members at the cut; present while
/// this node charges anyone as unreachable.
pub(crate) const CUT_KEY: &str = "sync:cut";
/// Prefix of one key's charge: `sync:cut:<limit key>` = the total floor charged.
pub(crate) const CUT_CHARGE_PREFIX: &str = "sync:cut:";

/// What one peer told of the cut.
#[derive(Debug, Default)]
struct Told {
    /// Whether its marker came: without it its charges may be partial.
    marked: bool,
    members: Vec<String>,
    charges: HashMap<String, u64>,
}

/// Whether `key` is one of the cut's keys (the marker or a charge).
pub(crate) fn is_cut_key(key: &str) -> bool {
    key == CUT_KEY || key.starts_with(CUT_CHARGE_PREFIX)
}

/// Charges heard from peers, and this node's own for publishing.
#[derive(Debug, Default)]
pub(crate) struct CutKnowledge {
    /// Live peers that published a marker this round, with what they told.
    heard: HashMap<String, Told>,
    /// This round's own figures, published next round.
    charges: BTreeMap<String, u64>,
    members: Vec<String>,
    /// What is published now (key -> value), to write changes and delete the rest.
    published: BTreeMap<String, String>,
    /// Moves whenever a published charge or the member list changes.
    seq: u64,
}

impl CutKnowledge {
    /// Forgets what peers told (called before reading them again each round).
    pub(crate) fn clear_heard(&mut self) {
        self.heard.clear();
    }

    /// Takes `key = value` from live peer `node` if it is one of the cut's keys
    /// (returns whether it was); malformed values are ignored (the peer counts as
    /// having told nothing for that key).
    pub(crate) fn hear(&mut self, node: &str, key: &str, value: &str) -> bool {
        if key == CUT_KEY {
            let told = self.heard.entry(node.to_owned()).or_default();
            told.marked = true;
            told.members = value.split(' ').skip(1).map(str::to_owned).collect();
            return true;
        }
        let Some(limit_key) = key.strip_prefix(CUT_CHARGE_PREFIX) else {
            return false;
        };
        if let Ok(charge) = value.parse::<u64>() {
            let told = self.heard.entry(node.to_owned()).or_default();
            told.charges.insert(limit_key.to_owned(), charge);
        }
        true
    }

    /// Drops what came from peers that published no marker (once every peer's
    /// values of the round were heard).
    pub(crate) fn drop_unmarked(&mut self) {
        self.heard.retain(|_, told| told.marked);
    }

    /// The most any peer charges for `limit_key` (0 from a peer that published
    /// a marker and no charge for it), or `None` when no peer told anything.
    pub(crate) fn adopted_charge(&self, limit_key: &str) -> Option<u64> {
        (self.heard.values())
            .map(|told| told.charges.get(limit_key).copied().unwrap_or(0))
            .max()
    }

    /// Every peer's members at the cut (each a candidate; the caller takes the
    /// most conservative).
    pub(crate) fn adopted_members(&self) -> impl Iterator<Item = &[String]> {
        (self.heard.values())
            .map(|told| told.members.as_slice())
            .filter(|m| !m.is_empty())
    }

    /// Records this round's charge for `limit_key`, published next round.
    pub(crate) fn record(&mut self, limit_key: &str, charge: u64) {
        self.charges.insert(limit_key.to_owned(), charge);
    }

    /// This round's charges so far (before [`Self::publish`] takes them).
    pub(crate) fn recorded(&self) -> &BTreeMap<String, u64> {
        &self.charges
    }

    /// This round's members at the cut, as recorded (`local split` only).
    pub(crate) fn members(&self) -> &[String] {
        &self.members
    }

    /// Records this round's members at the cut.
    pub(crate) fn record_members(&mut self, members: &[String]) {
        self.members = members.to_vec();
    }

    /// A publish failed: nothing of this round's was written, so every figure
    /// goes out again next round (and the marker moves).
    pub(crate) fn unpublish(&mut self) {
        for value in self.published.values_mut() {
            value.clear();
        }
    }

    /// What to delete and write this round: the charges recorded since the last
    /// call and the marker, written after them, while `cut` (anyone unreachable);
    /// deletions of everything once not. Clears the recorded figures.
    pub(crate) fn publish(&mut self, cut: bool) -> (Vec<String>, Vec<(String, String)>) {
        let mut wanted: BTreeMap<String, String> = BTreeMap::new();
        if cut {
            for (limit_key, charge) in &self.charges {
                wanted.insert(
                    format!("{CUT_CHARGE_PREFIX}{limit_key}"),
                    charge.to_string(),
                );
            }
        }
        self.charges.clear();
        let members = std::mem::take(&mut self.members);
        let changed = (wanted.iter()).any(|(k, v)| self.published.get(k) != Some(v))
            || (self.published.keys()).any(|k| k != CUT_KEY && !wanted.contains_key(k))
            || self
                .published
                .get(CUT_KEY)
                .is_none_or(|m| m.split(' ').skip(1).ne(members.iter().map(String::as_str)));
        let deletes: Vec<String> = (self.published.keys())
            .filter(|k| !wanted.contains_key(*k) && (!cut || *k != CUT_KEY))
            .cloned()
            .collect();
        let mut writes: Vec<(String, String)> = (wanted.iter())
            .filter(|(k, v)| self.published.get(*k) != Some(v))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if cut && changed {
            self.seq += 1;
            let mut marker = self.seq.to_string();
            for m in &members {
                marker.push(' ');
                marker.push_str(m);
            }
            wanted.insert(CUT_KEY.to_owned(), marker.clone());
            writes.push((CUT_KEY.to_owned(), marker));
        } else if cut && let Some(marker) = self.published.get(CUT_KEY) {
            wanted.insert(CUT_KEY.to_owned(), marker.clone());
        }
        self.published = wanted;
        (deletes, writes)
    }
}

/// The members `local split` divides L by during a cut ([`side_budget`]): those
/// at the cut as this node froze them (`own`), or, where it froze none (it did
/// not see the cut begin, or never saw an unreachable member live), the list of
/// the peers that saw it (`told`) that leaves this side the least, and none
/// while nobody has told anything: a budget of 0, the safe side. This node
/// publishes the members used in turn. The choice does not depend on L: a
/// side's budget is L times the same fraction for every key.
///
/// An empty freeze is not read as "no members", which would give 0: a node that
/// saw an unreachable member live only with a round it already held freezes
/// nothing, and would refuse everything on its side of the cut
/// (`super::sightings`).
pub(crate) fn split_members<'a>(
    own: &[String],
    told: impl Iterator<Item = &'a [String]>,
    dead: &[String],
) -> Vec<String> {
    if !own.is_empty() {
        return own.to_vec();
    }
    // A list naming none of the unreachable describes another cut (a stale
    // marker whose deletion has not arrived, or a peer's other view): it would
    // read as all of L.
    let here = |at_cut: &[String]| at_cut.iter().filter(|m| !dead.contains(m)).count() as u64;
    told.filter(|at_cut| at_cut.iter().any(|m| dead.contains(m)))
        // The least fraction here/len, compared without division.
        .min_by(|a, b| (here(a) * b.len() as u64).cmp(&(here(b) * a.len() as u64)))
        .map_or_else(Vec::new, <[String]>::to_vec)
}

/// `local split`'s part of `capacity` for the members on this side of a cut:
/// the equal shares of `capacity` the at-cut members held before it (largest
/// remainder, as the healthy split gives them), summed over those not
/// unreachable. The two sides' parts sum to exactly L, and a member on a side
/// whose members are those at the cut keeps the unit its share was rounded up
/// by: with `L x here / members` rounded down, a member that had spent its
/// rounded-up share before the cut was given the same unit's room again on its
/// side, one unit over L per such member (the in-process conformance suite,
/// `sync::mode`, finds it at L = 802 over four members).
pub(crate) fn side_budget(capacity: u64, at_cut: &[String], dead: &[String]) -> u64 {
    let equal: Vec<(&String, u64)> = at_cut.iter().map(|m| (m, 1)).collect();
    (tollgate_cluster::share::shares(capacity, &equal).into_iter())
        .filter(|(m, _)| !dead.contains(m))
        .map(|(_, share)| share)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn split_members_come_from_the_own_freeze_else_the_least_a_peer_tells_else_none() {
        let dead = names(&["c"]);
        let three = names(&["a", "b", "c"]);
        let four = names(&["a", "b", "c", "d"]);
        let told = [four.as_slice(), three.as_slice()];
        let budget = |members: &[String]| side_budget(30, members, &dead);
        // Its own freeze wins: 30 x 2/3.
        let used = split_members(&three, told.iter().copied(), &dead);
        assert_eq!((budget(&used), &used), (20, &three));
        // Nothing frozen here (read as 0, it would leave this side nothing): the
        // least a peer gives, 30 x 2/3 rather than 30 x 3/4.
        let used = split_members(&[], told.iter().copied(), &dead);
        assert_eq!((budget(&used), &used), (20, &three));
        // Nobody told anything: nothing.
        let used = split_members(&[], std::iter::empty(), &dead);
        assert_eq!((budget(&used), used), (0, Vec::new()));
        // A list naming none of the unreachable is another cut's: not all of L.
        let other = names(&["a", "b", "e"]);
        let used = split_members(&[], [other.as_slice()].into_iter(), &dead);
        assert_eq!((budget(&used), used), (0, Vec::new()));
    }

    #[test]
    fn a_peers_charges_count_only_with_its_marker_and_the_largest_wins() {
        let mut k = CutKnowledge::default();
        assert_eq!(k.adopted_charge("t:requests"), None, "nobody told");
        assert!(k.hear("a", "sync:cut:t:requests", "41"));
        assert!(k.hear("b", "sync:cut:t:requests", "44"));
        assert!(k.hear("a", CUT_KEY, "3 a b c"));
        assert!(!k.hear("a", "d:t:requests", "7"), "not a cut key");
        // b's marker has not arrived: its charges may be partial.
        k.drop_unmarked();
        assert_eq!(k.adopted_charge("t:requests"), Some(41));
        assert_eq!(
            k.adopted_charge("t:tokens"),
            Some(0),
            "a marked peer's absent key is 0"
        );
        assert!(k.hear("b", "sync:cut:t:requests", "44"));
        assert!(k.hear("b", CUT_KEY, "1 a b c"));
        assert_eq!(k.adopted_charge("t:requests"), Some(44));
        let members: Vec<_> = k.adopted_members().collect();
        assert_eq!(members.len(), 2);
        assert!(
            members
                .iter()
                .all(|m| *m == names(&["a", "b", "c"]).as_slice())
        );
        k.clear_heard();
        assert_eq!(k.adopted_charge("t:requests"), None);
    }

    #[test]
    fn the_marker_follows_its_charges_and_moves_when_any_changes() {
        let mut k = CutKnowledge::default();
        k.record("t:requests", 41);
        k.record_members(&names(&["a", "b"]));
        let (deletes, writes) = k.publish(true);
        assert!(deletes.is_empty());
        assert_eq!(writes.len(), 2);
        assert_eq!(
            writes[0],
            ("sync:cut:t:requests".to_owned(), "41".to_owned())
        );
        assert_eq!(
            writes[1],
            (CUT_KEY.to_owned(), "1 a b".to_owned()),
            "after the charge"
        );
        // Unchanged: nothing written.
        k.record("t:requests", 41);
        k.record_members(&names(&["a", "b"]));
        assert_eq!(k.publish(true), (vec![], vec![]));
        // One charge changes: it and a new marker.
        k.record("t:requests", 45);
        k.record_members(&names(&["a", "b"]));
        let (_, writes) = k.publish(true);
        assert_eq!(
            writes.last().unwrap(),
            &(CUT_KEY.to_owned(), "2 a b".to_owned())
        );
        // A key no longer charged is deleted, and the marker moves.
        k.record_members(&names(&["a", "b"]));
        let (deletes, writes) = k.publish(true);
        assert_eq!(deletes, vec!["sync:cut:t:requests".to_owned()]);
        assert_eq!(writes, vec![(CUT_KEY.to_owned(), "3 a b".to_owned())]);
        // The cut ends: everything goes.
        let (deletes, writes) = k.publish(false);
        assert_eq!(deletes, vec![CUT_KEY.to_owned()]);
        assert!(writes.is_empty());
        assert_eq!(k.publish(false), (vec![], vec![]));
    }

    #[test]
    fn a_side_gets_the_shares_its_at_cut_members_held() {
        let at_cut = names(&["a", "b", "c"]);
        assert_eq!(side_budget(120, &at_cut, &names(&["c"])), 80);
        // 40 = 14 + 13 + 13: a holds the unit left over.
        assert_eq!(side_budget(40, &at_cut, &names(&["c"])), 27);
        assert_eq!(side_budget(40, &at_cut, &names(&["a", "b"])), 13);
        assert_eq!(side_budget(40, &at_cut, &[]), 40);
        assert_eq!(side_budget(40, &[], &[]), 0);
        // Two sides' parts sum to L exactly.
        for l in 1..200 {
            let a = side_budget(l, &at_cut, &names(&["c"]));
            let b = side_budget(l, &at_cut, &names(&["a", "b"]));
            assert_eq!(a + b, l);
        }
    }
}
