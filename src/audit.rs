//! An optional JSONL log of lease events, for the jepsen harness's conservation
//! check (docs/jepsen.md): owners log each grant with the time it lapses for them,
//! holders each spend of owner credit with the statement whose reply it spends.
//! `redis-lease` holders, whose owner is Redis, log each statement and its answer
//! instead of the grant (for the analysis; the checker does not judge them).
//! The checker joins them: no credit may be spent after its owner let it lapse
//! (the owner then counts it as spent in the bucket it lapsed in, so a later spend
//! would land in a bucket nobody charged).
//!
//! Off unless [`install`]ed (the harness's `node --lease-audit PATH`): then one
//! atomic load per spend. On: lines go through a bounded channel to a writer
//! thread that flushes after every batch, so a kill -9 loses at most the last
//! batch. A full channel blocks the spender (backpressure, never a dropped line;
//! the spender holds its budget's lock meanwhile, and owners their lines' lock:
//! a test facility, not for production). Not recorded: credit re-spent by a
//! re-date whose bucket had left the window, and settlement debts.

use serde::Serialize;
use std::io::Write;
use std::path::Path;
use std::sync::OnceLock;
use std::sync::mpsc::{SyncSender, sync_channel};

/// Lines buffered between the node and the writer thread.
const CHANNEL_LINES: usize = 65_536;

static SINK: OnceLock<SyncSender<String>> = OnceLock::new();

/// One lease event.
#[derive(Debug, Serialize)]
#[serde(tag = "ev", rename_all = "lowercase")]
pub enum Event<'a> {
    /// An owner answered `holder`'s statement `seq` for `key` with `credit`, which
    /// lapses for the owner at `until_ms` (its clock, Unix ms).
    Grant {
        /// The limit key.
        key: &'a str,
        /// The holder's member id (`node/generation@address`).
        holder: &'a str,
        /// The statement answered.
        seq: u64,
        /// The holder's whole credit after the answer.
        credit: u64,
        /// When the owner stops counting it as credit.
        until_ms: u64,
        /// What the statement asked for beyond its credit.
        want: u64,
        /// What the answer added.
        granted: u64,
        /// The holder's share of L in the terms then (0: none).
        share: u64,
        /// How far beyond its share it may go.
        borrow: u64,
        /// The holder's charge after the answer.
        charge: u64,
        /// Everything counted against L after the answer.
        committed: u64,
        /// The holder's stated usage in the window, after the answer.
        usage: u64,
        /// Its credit that lapsed unstated, counted as spent in the window.
        lapsed: u64,
        /// The largest cut-off share it may hold.
        told: u64,
    },
    /// `redis-lease`: this node stated `usage` and `remaining` for `key` at
    /// `sent_ms` (its clock, Unix ms) in statement `seq`, and Redis answered, at
    /// `redis_ms` on Redis `TIME` and `answered_ms` on the node's clock, with
    /// `credit` (of which `granted` new) and the reservation `reserved` it keeps
    /// for the node. `redis_ms` against the two shows the clocks' skew.
    Stated {
        /// The limit key.
        key: &'a str,
        /// The statement.
        seq: u64,
        /// When it was sent.
        sent_ms: u64,
        /// When Redis's answer was read.
        answered_ms: u64,
        /// Redis `TIME` when it answered.
        redis_ms: u64,
        /// The node's stated usage: (bucket, cost) pairs.
        usage: &'a [(u64, u64)],
        /// Credit it stated it could still spend.
        remaining: u64,
        /// What it asked for beyond that.
        want: u64,
        /// Its whole credit after the answer.
        credit: u64,
        /// What the answer added.
        granted: u64,
        /// The reservation Redis keeps for the node.
        reserved: u64,
    },
    /// This node spent `cost` of owner credit for `key` at `at_ms` (its clock, Unix
    /// ms), out of the reply to its statement `seq`.
    Spend {
        /// The limit key.
        key: &'a str,
        /// The statement whose reply the credit came with.
        seq: u64,
        /// What was spent.
        cost: u64,
        /// When.
        at_ms: u64,
    },
}

/// Starts appending events to `path` (once per process; later calls fail). A
/// restarted node appends to its previous incarnation's lines.
pub fn install(path: &Path) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let (tx, rx) = sync_channel::<String>(CHANNEL_LINES);
    SINK.set(tx)
        .map_err(|_| std::io::Error::other("lease audit already installed"))?;
    std::thread::Builder::new()
        .name("lease-audit".into())
        .spawn(move || {
            let mut out = std::io::BufWriter::new(file);
            while let Ok(line) = rx.recv() {
                let mut batch = vec![line];
                batch.extend(rx.try_iter());
                for line in batch {
                    let _ = out.write_all(line.as_bytes());
                    let _ = out.write_all(b"\n");
                }
                let _ = out.flush();
            }
        })?;
    Ok(())
}

/// Whether events are being recorded.
pub fn enabled() -> bool {
    SINK.get().is_some()
}

/// Records `event` if the audit is on.
pub fn record(event: &Event<'_>) {
    if let Some(tx) = SINK.get()
        && let Ok(line) = serde_json::to_string(event)
    {
        let _ = tx.send(line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_line_names_every_figure_the_analysis_reads() {
        let line = serde_json::to_value(Event::Grant {
            key: "upstream:u:requests",
            holder: "n1/1@10.0.0.2:7200",
            seq: 7,
            credit: 3,
            until_ms: 3_007,
            want: 10,
            granted: 2,
            share: 13,
            borrow: 0,
            charge: 13,
            committed: 40,
            usage: 10,
            lapsed: 0,
            told: 13,
        })
        .expect("json");
        assert_eq!(line["ev"], "grant");
        for (field, value) in [
            ("seq", 7),
            ("credit", 3),
            ("until_ms", 3_007),
            ("want", 10),
            ("granted", 2),
            ("share", 13),
            ("borrow", 0),
            ("charge", 13),
            ("committed", 40),
            ("usage", 10),
            ("lapsed", 0),
            ("told", 13),
        ] {
            assert_eq!(line[field], value, "{field}");
        }
    }

    #[test]
    fn a_stated_line_names_both_clocks_and_the_answer() {
        let usage = [(456, 3), (457, 1)];
        let line = serde_json::to_value(Event::Stated {
            key: "upstream:u:requests",
            seq: 228_990,
            sent_ms: 228_990,
            answered_ms: 228_992,
            redis_ms: 229_090,
            usage: &usage,
            remaining: 2,
            want: 8,
            credit: 9,
            granted: 7,
            reserved: 13,
        })
        .expect("json");
        assert_eq!(line["ev"], "stated");
        assert_eq!(line["usage"], serde_json::json!([[456, 3], [457, 1]]));
        for (field, value) in [
            ("seq", 228_990),
            ("sent_ms", 228_990),
            ("answered_ms", 228_992),
            ("redis_ms", 229_090),
            ("remaining", 2),
            ("want", 8),
            ("credit", 9),
            ("granted", 7),
            ("reserved", 13),
        ] {
            assert_eq!(line[field], value, "{field}");
        }
    }
}
