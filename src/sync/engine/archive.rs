//! Departed members' usage kept alive past chitchat's memory
//! (`tollgate_cluster::counter::archive`): each round this node republishes
//! what it holds of members chitchat has collected, and adopts what its
//! peers republish of members it never knew, so a node started after a
//! member was collected still charges what that member spent in a window
//! that has not ended (a day's quota; docs/design/quotas.md, "A day outlives
//! its node").

use super::*;
use tollgate_cluster::counter::archive::{
    ARCHIVE_PREFIX, Archived, archive_key, archive_value, decode_archive,
};

/// Most archive entries this node republishes (one per departed member and
/// key that still counts). Beyond it the lowest (member, key) pairs go out,
/// the same on every node, and the rest is logged.
pub(super) const MAX_ARCHIVE_ENTRIES: usize = 2_048;

/// Most departed members this node adopts from archives (members chitchat
/// holds do not count): a hostile or broken peer cannot grow the replica
/// without bound.
pub(super) const MAX_ADOPTED_MEMBERS: usize = 256;

/// What this node republishes, as last written.
#[derive(Debug, Default)]
pub(super) struct ArchiveState {
    /// Key -> value, as published.
    published: BTreeMap<String, String>,
    /// Members chitchat holds (live or departed), as of the last read: their
    /// own values rule, so they are neither republished nor adopted.
    known: HashSet<String>,
    /// Whether the last write failed (logged once per failure streak).
    failing: bool,
}

impl ArchiveState {
    /// Records the members chitchat held at this round's read.
    pub(super) fn set_known(&mut self, known: HashSet<String>) {
        self.known = known;
    }

    /// Whether chitchat held `member` at the last read.
    pub(super) fn is_known(&self, member: &str) -> bool {
        self.known.contains(member)
    }

    /// Entries published now.
    pub(super) fn published(&self) -> usize {
        self.published.len()
    }
}

impl Engine {
    /// Republishes what this node holds of members chitchat no longer does:
    /// the changed entries written, the ones whose usage left the window
    /// deleted. A write the state caps refuse leaves the previous archive in
    /// place and is retried next round; the node's own figures went out
    /// already, in their own write.
    pub(super) async fn publish_archive(&mut self, now_ms: u64) {
        let wanted = self.archive_entries(now_ms);
        let published = &self.archive.published;
        let deletes: Vec<String> = (published.keys())
            .filter(|key| !wanted.contains_key(*key))
            .cloned()
            .collect();
        let writes: Vec<(String, String)> = (wanted.iter())
            .filter(|(key, value)| published.get(*key) != Some(*value))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        if deletes.is_empty() && writes.is_empty() {
            return;
        }
        match self.membership.publish(&deletes, writes).await {
            Ok(size) => {
                self.wrote(size, 0);
                self.archive.published = wanted;
                self.archive.failing = false;
            }
            Err(e) => {
                if !self.archive.failing {
                    tracing::warn!(error = %e, entries = wanted.len(), "cannot republish departed members' usage: nodes started later will not charge it (raise [cluster] max_state_keys / max_state_bytes)");
                }
                self.archive.failing = true;
            }
        }
    }

    /// The archive this node should publish now, bounded.
    fn archive_entries(&self, now_ms: u64) -> BTreeMap<String, String> {
        let usage = self.usage.lock();
        let mut wanted = BTreeMap::new();
        let departed = usage.departed_nodes();
        let collected =
            (departed.iter()).filter(|m| !self.archive.is_known(m) && **m != self.self_id);
        'members: for member in collected {
            for (limit_key, buckets) in usage.archive_of(member, now_ms) {
                if wanted.len() == MAX_ARCHIVE_ENTRIES {
                    tracing::warn!(
                        max = MAX_ARCHIVE_ENTRIES,
                        "departed members' usage exceeds what one node republishes: the rest is not carried to nodes started later"
                    );
                    break 'members;
                }
                wanted.insert(archive_key(member, &limit_key), archive_value(&buckets));
            }
        }
        wanted
    }

    /// Adopts `entries` (archive keys read from live peers this round) for
    /// members chitchat does not hold here; returns how many were refused
    /// (undecodable, or past the adoption cap).
    pub(super) fn adopt_archives(
        &self,
        usage: &mut ClusterUsage,
        entries: &[(String, String)],
        now_ms: u64,
    ) -> u64 {
        let windows = *usage.windows();
        let mut adopted: HashSet<String> = (usage.departed_nodes().into_iter())
            .filter(|m| !self.archive.is_known(m))
            .collect();
        let mut refused = 0;
        for (key, value) in entries {
            let archived: Archived<'_> = match decode_archive(key, value, &windows) {
                Ok(Some(archived)) => archived,
                Ok(None) => continue,
                Err(e) => {
                    refused += 1;
                    tracing::debug!(%key, error = %e, "refused an archived usage value");
                    continue;
                }
            };
            let member = archived.member;
            if self.archive.is_known(member) || member == self.self_id {
                continue;
            }
            if !adopted.contains(member) {
                if adopted.len() >= MAX_ADOPTED_MEMBERS {
                    refused += 1;
                    continue;
                }
                adopted.insert(member.to_owned());
            }
            usage.adopt(&archived, now_ms);
        }
        refused
    }
}

/// Whether `key` is an archive key (read apart from the counters).
pub(super) fn is_archive_key(key: &str) -> bool {
    key.starts_with(ARCHIVE_PREFIX)
}
