//! The listeners' connection figures and the descriptor limit, as metrics:
//! read from each listener's [`Stats`] when `/metrics` is rendered.

use crate::listen::Stats;
use crate::listen::nofile::Nofile;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::sync::atomic::Ordering;

type ByListener = [(&'static str, &'static str); 1];
type ByListenerReason = [(&'static str, &'static str); 2];

/// Connection metrics of every listener of a node.
#[derive(Default)]
pub struct ConnectionMetrics {
    listeners: Mutex<Vec<(&'static str, Arc<Stats>)>>,
    open: Family<ByListener, Gauge>,
    accepted: Family<ByListener, Counter>,
    refused: Family<ByListenerReason, Counter>,
    open_files_limit: Gauge,
    open_files: Gauge,
}

impl ConnectionMetrics {
    /// Registers the families in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "connections_open",
            "Connections open now, by listener (proxy, rpc)",
            self.open.clone(),
        );
        registry.register(
            "connections_accepted",
            "Connections accepted, by listener",
            self.accepted.clone(),
        );
        registry.register(
            "connections_refused",
            "Connections refused with a 503 (or closed, when refusals pile up), by listener and reason: at_cap (server.max_connections), per_ip (server.max_connections_per_ip)",
            self.refused.clone(),
        );
        registry.register(
            "open_files_limit",
            "The process's soft open-file limit after start raised it to the hard limit",
            self.open_files_limit.clone(),
        );
        registry.register(
            "open_files",
            "Descriptors the process holds now (Linux: /proc/self/fd)",
            self.open_files.clone(),
        );
    }

    /// Reports `stats` as listener `name`'s.
    pub fn watch(&self, name: &'static str, stats: Arc<Stats>) {
        self.listeners.lock().push((name, stats));
    }

    /// The descriptor limit the node runs with.
    pub fn nofile(&self, limit: Nofile) {
        self.open_files_limit
            .set(i64::try_from(limit.soft).unwrap_or(i64::MAX));
    }

    /// Brings the families up to the listeners' figures (before rendering).
    pub fn refresh(&self) {
        for (name, stats) in self.listeners.lock().iter() {
            let label = [("listener", *name)];
            let open = stats.open.load(Ordering::Relaxed);
            self.open
                .get_or_create(&label)
                .set(i64::try_from(open).unwrap_or(i64::MAX));
            catch_up(&self.accepted.get_or_create(&label), &stats.accepted);
            for (reason, figure) in [
                ("at_cap", &stats.refused_at_cap),
                ("per_ip", &stats.refused_per_ip),
            ] {
                let counter = self
                    .refused
                    .get_or_create(&[("listener", *name), ("reason", reason)]);
                catch_up(&counter, figure);
            }
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            self.open_files
                .set(i64::try_from(fds.count()).unwrap_or(i64::MAX));
        }
    }
}

/// Raises `counter` to `figure` (both only grow).
fn catch_up(counter: &Counter, figure: &std::sync::atomic::AtomicU64) {
    let now = figure.load(Ordering::Relaxed);
    counter.inc_by(now.saturating_sub(counter.get()));
}
