//! The owner side on this node: a credit line per key this node owns, answering
//! statements from holders (over the internal RPC, or this node's own holder
//! directly). Ownership is rendezvous hashing over the live members in the
//! engine's latest [`View`]; a key that moves away is dropped at once (fencing), a
//! key that arrives is rebuilt conservatively from the gossiped counters.

use super::View;
use crate::actor::clock::Clock;
use crate::ops::metrics::Metrics;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use tollgate_cluster::counter::ClusterUsage;
use tollgate_cluster::lease::Refusal;
use tollgate_cluster::lease::line::{Line, LineConfig, SyncReply, SyncRequest};
use tollgate_cluster::lease::rendezvous;

/// The lines of the keys this node owns.
pub struct OwnerBook {
    configs: HashMap<String, LineConfig>,
    lines: Mutex<HashMap<String, Line<String>>>,
    view: Arc<RwLock<Arc<View>>>,
    usage: Arc<Mutex<ClusterUsage>>,
    clock: Clock,
    metrics: Arc<Metrics>,
    rebuilt: std::sync::atomic::AtomicU64,
}

/// One owned key, for `/admin/cluster`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct OwnedKey {
    /// The limit key.
    pub key: String,
    /// Everything counted against L now.
    pub committed: u64,
    /// The capacity L.
    pub capacity: u64,
    /// Holders with an account.
    pub holders: usize,
    /// Still conservative after a rebuild.
    pub recovering: bool,
}

impl OwnerBook {
    /// A book for the configured keys (`configs`), reading membership from `view`
    /// and rebuilding from `usage`.
    pub fn new(
        configs: HashMap<String, LineConfig>,
        view: Arc<RwLock<Arc<View>>>,
        usage: Arc<Mutex<ClusterUsage>>,
        clock: Clock,
        metrics: Arc<Metrics>,
    ) -> OwnerBook {
        OwnerBook {
            configs,
            lines: Mutex::new(HashMap::new()),
            view,
            usage,
            clock,
            metrics,
            rebuilt: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn lines(&self) -> MutexGuard<'_, HashMap<String, Line<String>>> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn view(&self) -> Arc<View> {
        self.view.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ns() / 1_000_000
    }

    /// Answers `from`'s statement for `key`. Bad input is refused and changes nothing.
    pub fn sync(&self, from: &str, key: &str, request: &SyncRequest) -> Result<SyncReply, Refusal> {
        let result = self.sync_inner(from, key, request);
        let outcome = match &result {
            Ok(r) if r.granted > 0 => "granted",
            Ok(_) => "nothing_granted",
            Err(e) => super::wire::refusal_code(e),
        };
        self.metrics.lease_statement("owner", outcome);
        if let Ok(r) = &result {
            self.metrics.lease_owner(r.granted, 0);
        }
        result
    }

    fn sync_inner(
        &self,
        from: &str,
        key: &str,
        request: &SyncRequest,
    ) -> Result<SyncReply, Refusal> {
        let config = self.configs.get(key).ok_or(Refusal::UnknownKey)?;
        let view = self.view();
        if !view.members.iter().any(|m| m.id == from) {
            return Err(Refusal::NotMember);
        }
        // Not before this node's view of the members settled: it could believe it
        // owns a key whose holders still spend a previous owner's credit.
        if !view.owns(key) || !view.settled {
            return Err(Refusal::NotOwner);
        }
        let now_ms = self.now_ms();
        let mut lines = self.lines();
        let line = match lines.get_mut(key) {
            Some(line) => line,
            None => {
                let rebuilt = self.rebuild(*config, key, &view, now_ms);
                lines.entry(key.to_owned()).or_insert(rebuilt)
            }
        };
        let reply = line.sync(&from.to_owned(), request, now_ms)?;
        if super::audit::enabled()
            && line.config().kind() != tollgate_cluster::lease::line::Kind::Slots
        {
            super::audit::record(&super::audit::Event::Grant {
                key,
                holder: from,
                seq: request.seq,
                credit: reply.credit,
                until_ms: now_ms.saturating_add(reply.ttl_ms),
            });
        }
        Ok(reply)
    }

    /// A line for a key this node just came to own: consumption from the counters,
    /// and nothing granted until every live member stated (or one ttl passed).
    fn rebuild(&self, config: LineConfig, key: &str, view: &View, now_ms: u64) -> Line<String> {
        let counters =
            (self.usage.lock().unwrap_or_else(|p| p.into_inner())).buckets_by_node(key, now_ms);
        let holders: Vec<String> = view.members.iter().map(|m| m.id.clone()).collect();
        tracing::debug!(%key, holders = holders.len(), "now owning a lease key: rebuilt from the counters, conservative until every holder stated");
        self.rebuilt
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut line = Line::rebuild(config, &counters, &holders, now_ms);
        if let Some(terms) = view.terms_for(key, config.capacity()) {
            line.set_terms(Arc::clone(terms));
        }
        line
    }

    /// Each round: drops keys this node no longer owns (fencing), applies the new
    /// terms, settles expiries.
    pub fn on_round(&self) {
        let view = self.view();
        let now_ms = self.now_ms();
        let mut expired = 0;
        let mut lines = self.lines();
        let before = lines.len();
        lines.retain(|key, _| {
            let owned = view.owns(key);
            if !owned {
                tracing::debug!(%key, "lease key moved to another owner: dropped here");
            }
            owned
        });
        let dropped = before - lines.len();
        let rebuilt = self.rebuilt.swap(0, std::sync::atomic::Ordering::Relaxed);
        if dropped > 0 || rebuilt > 0 {
            tracing::info!(
                rebuilt,
                dropped,
                owned = lines.len(),
                "lease ownership changed: new keys rebuilt from the counters (conservative until every holder stated), moved keys dropped"
            );
        }
        for (key, line) in lines.iter_mut() {
            if let Some(terms) = view.terms_for(key, line.config().capacity()) {
                line.set_terms(Arc::clone(terms));
            }
            expired += line.settle(now_ms) as u64;
        }
        self.metrics.lease_owner(0, expired);
    }

    /// The keys owned here, for `/admin/cluster?keys=true`.
    pub fn owned(&self) -> Vec<OwnedKey> {
        let now_ms = self.now_ms();
        let mut out: Vec<OwnedKey> = (self.lines().iter())
            .map(|(key, line)| OwnedKey {
                key: key.clone(),
                committed: line.committed(now_ms),
                capacity: line.config().capacity(),
                holders: line.holders(),
                recovering: line.recovering(now_ms),
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// The owner of `key` in the current view.
    pub fn owner_of(&self, key: &str) -> Option<String> {
        let view = self.view();
        let ids: Vec<&str> = view.members.iter().map(|m| m.id.as_str()).collect();
        rendezvous::owner(key, &ids).map(|s| s.to_string())
    }
}
