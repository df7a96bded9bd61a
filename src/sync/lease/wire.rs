//! The internal RPC's messages (JSON over HTTP on `cluster.rpc_listen`): one batch
//! of statements from a holder to one owner, one answer per statement.

use serde::{Deserialize, Serialize};
use tollgate_cluster::lease::Refusal;
use tollgate_cluster::lease::line::{SyncReply, SyncRequest};
use tollgate_cluster::membership::HELD_SINCE_RPC_VERSION;

/// The path statements are posted to.
pub(crate) const SYNC_PATH: &str = "/internal/v1/lease/sync";

/// The path an owner asks a holder to state keys on (a rebuilt line waiting
/// for it, docs/design/lease.md).
pub(crate) const NUDGE_PATH: &str = "/internal/v1/lease/nudge";

/// Largest statement batch body accepted, in bytes.
pub(crate) const MAX_BODY_BYTES: usize = 4 << 20;

/// Most statements in one batch (a node has at most this many limit keys bound).
pub(crate) const MAX_ENTRIES: usize = 100_000;

/// What a holder puts in one batch at most: a round with more statements for one
/// owner sends several (an owner refuses a body above [`MAX_BODY_BYTES`], and a
/// refused batch reads as an unreachable owner: ~43,000 idle statements in one
/// batch would exceed it, and a node with that many keys on one owner would stay
/// cut off from it for good).
pub(crate) const SEND_BODY_BYTES: usize = 1 << 20;

/// A holder's statements for the keys one owner owns.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Batch {
    /// The sender's cluster id (a node of another cluster is refused).
    pub cluster_id: String,
    /// The sender's member id (`node/generation@gossip-addr`).
    pub from: String,
    /// One statement per key.
    pub entries: Vec<Entry>,
}

/// An owner's request that a holder state `keys` (to whichever owner its own
/// view gives them) at its next round.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Nudge {
    /// The sender's cluster id.
    pub cluster_id: String,
    /// The sender's member id.
    pub from: String,
    /// The keys.
    pub keys: Vec<String>,
}

/// One key's statement.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Entry {
    /// The limit key, e.g. `tenant:acme:tokens`.
    pub key: String,
    /// Orders statements of one holder for one key.
    pub seq: u64,
    /// `(bucket, cost)` pairs over the holder's window.
    pub usage: Vec<(u64, u64)>,
    /// Credit left (windowed) or slots in use.
    pub remaining: u64,
    /// How much more is wanted.
    pub want: u64,
    /// The statement whose reply the holder adopted last (0: none). Absent (an
    /// older holder): 0, every figure told it keeps binding until it gives back.
    #[serde(default)]
    pub adopted: u64,
    /// The cut-off share that reply told it, still held (0: none; absent when 0,
    /// and from an older holder).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub held: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Entry {
    /// The statement for `key`.
    pub(crate) fn new(key: &str, request: &SyncRequest) -> Entry {
        Entry {
            key: key.to_owned(),
            seq: request.seq,
            usage: request.usage.clone(),
            remaining: request.remaining,
            want: request.want,
            adopted: request.adopted,
            held: request.held,
        }
    }

    /// The statement as an owner speaking wire `rpc_version` reads it
    /// (`tollgate_cluster::membership::RPC_VERSION`). Before
    /// [`HELD_SINCE_RPC_VERSION`] an owner parses no `held`: its strict parsing
    /// would refuse the whole batch, so the figure is left out. Such an owner
    /// never keeps a held figure anyway (`Reserves::keep` came with it), so it
    /// loses nothing it had; without this, an upgraded busy holder would read it
    /// as unreachable until it was upgraded too.
    pub(crate) fn readable_by(mut self, rpc_version: u32) -> Entry {
        if rpc_version < HELD_SINCE_RPC_VERSION {
            self.held = 0;
        }
        self
    }

    /// At least the length of this entry in JSON: every character of the key
    /// escaped at worst (`\u00XX`), every number at 20 digits.
    fn json_bound(&self) -> usize {
        const FIELDS: usize = 80; // names, quotes, braces, brackets
        const NUMBER: usize = 20;
        const PAIR: usize = 2 * NUMBER + 4; // `[b,c],`
        FIELDS + 6 * self.key.len() + 5 * NUMBER + PAIR * self.usage.len()
    }

    /// The statement as the ledger takes it.
    pub(crate) fn request(&self) -> SyncRequest {
        SyncRequest {
            seq: self.seq,
            usage: self.usage.clone(),
            remaining: self.remaining,
            want: self.want,
            adopted: self.adopted,
            held: self.held,
        }
    }
}

/// `entries` in order, cut into batches whose bodies are at most `max_bytes`
/// (one entry alone may exceed it: it goes alone) and [`MAX_ENTRIES`] entries.
pub(crate) fn batches(
    cluster_id: &str,
    from: &str,
    entries: Vec<Entry>,
    max_bytes: usize,
) -> Vec<Batch> {
    let batch = |entries| Batch {
        cluster_id: cluster_id.to_owned(),
        from: from.to_owned(),
        entries,
    };
    // `{"cluster_id":"..","from":"..","entries":[]}`, the strings escaped at worst.
    let overhead = 40 + 6 * (cluster_id.len() + from.len());
    let mut out = Vec::new();
    let mut current = Vec::new();
    let mut size = overhead;
    for entry in entries {
        let cost = entry.json_bound() + 1; // and its comma
        if !current.is_empty() && (size + cost > max_bytes || current.len() >= MAX_ENTRIES) {
            out.push(batch(std::mem::take(&mut current)));
            size = overhead;
        }
        size += cost;
        current.push(entry);
    }
    if !current.is_empty() {
        out.push(batch(current));
    }
    out
}

/// The owner's answers, in the batch's order.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Answers {
    /// One per entry.
    pub entries: Vec<Answer>,
}

/// One key's answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Answer {
    /// The holder's credit.
    Credit {
        /// Whole credit (or slots) as of the statement.
        credit: u64,
        /// Of which new.
        granted: u64,
        /// Valid this long from the holder's send time.
        ttl_ms: u64,
        /// What the holder may use in the window, credit included, while it cannot
        /// reach this owner; charged to it until its next statement. Absent (an
        /// older owner): 0, nothing beyond the credit.
        #[serde(default)]
        cut_off_share: u64,
    },
    /// Refused; nothing changed.
    Refused {
        /// Machine-readable reason (`not_owner`, `unknown_key`, `absurd`, ...).
        code: String,
        /// Human-readable detail.
        message: String,
    },
}

impl Answer {
    /// The answer for a ledger result.
    pub(crate) fn from_result(result: &Result<SyncReply, Refusal>) -> Answer {
        match result {
            Ok(r) => Answer::Credit {
                credit: r.credit,
                granted: r.granted,
                ttl_ms: r.ttl_ms,
                cut_off_share: r.cut_off_share,
            },
            Err(e) => Answer::Refused {
                code: refusal_code(e).to_owned(),
                message: e.to_string(),
            },
        }
    }

    /// The reply, or the refusal's code.
    pub(crate) fn into_result(self) -> Result<SyncReply, String> {
        match self {
            Answer::Credit {
                credit,
                granted,
                ttl_ms,
                cut_off_share,
            } => Ok(SyncReply {
                credit,
                granted,
                ttl_ms,
                cut_off_share,
            }),
            Answer::Refused { code, .. } => Err(code),
        }
    }
}

/// A stable code per refusal, for metrics and the wire.
pub(crate) fn refusal_code(refusal: &Refusal) -> &'static str {
    match refusal {
        Refusal::UnknownKey => "unknown_key",
        Refusal::Absurd { .. } => "absurd",
        Refusal::TooManyHolders { .. } => "too_many_holders",
        Refusal::Stale(_) => "stale",
        Refusal::NotOwner => "not_owner",
        Refusal::NotMember => "not_member",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_cluster::membership::RPC_VERSION;

    fn entry(key: &str, usage: usize) -> Entry {
        Entry {
            key: key.to_owned(),
            seq: u64::MAX,
            usage: (0..usage as u64)
                .map(|b| (u64::MAX - b, u64::MAX))
                .collect(),
            remaining: u64::MAX,
            want: u64::MAX,
            adopted: u64::MAX,
            held: u64::MAX,
        }
    }

    #[test]
    fn batches_stay_within_the_body_limit_in_order() {
        // Worst cases: keys that escape (quotes, control characters), numbers at
        // 20 digits, long usage lists, and one entry bigger than the limit.
        let keys = [
            "tenant:a:tokens",
            "tenant:\"q\":requests",
            "tenant:\u{1}:x",
            "t",
        ];
        let entries: Vec<Entry> = (0..3_000)
            .map(|i| entry(keys[i % keys.len()], (i * 7) % 130))
            .chain([entry("tenant:huge:tokens", 400)])
            .collect();
        let max = 64 << 10;
        let split = batches(
            "cluster-\"x\"",
            "node-1/7@10.0.0.1:7000",
            entries.clone(),
            max,
        );
        assert!(split.len() > 10, "{} batches", split.len());
        for b in &split {
            let len = serde_json::to_vec(b).expect("serializes").len();
            assert!(len <= max || b.entries.len() == 1, "{len} bytes");
            assert!(b.entries.len() <= MAX_ENTRIES);
        }
        let rejoined: Vec<String> = (split.iter())
            .flat_map(|b| b.entries.iter().map(|e| format!("{e:?}")))
            .collect();
        let original: Vec<String> = entries.iter().map(|e| format!("{e:?}")).collect();
        assert_eq!(rejoined, original, "nothing lost, nothing reordered");
    }

    #[test]
    fn a_node_with_50_000_idle_keys_on_one_owner_sends_bodies_the_owner_takes() {
        let entries: Vec<Entry> = (0..50_000)
            .map(|i| Entry {
                key: format!("tenant:t{i}:requests"),
                seq: 1_764_000_000_000 + i,
                usage: Vec::new(),
                remaining: 0,
                want: 0,
                adopted: 0,
                held: 0,
            })
            .collect();
        let whole = Batch {
            cluster_id: "prod".into(),
            from: "node-1/1764000000000@10.0.0.1:7946".into(),
            entries: entries.clone(),
        };
        let whole_len = serde_json::to_vec(&whole).expect("serializes").len();
        assert!(
            whole_len > MAX_BODY_BYTES,
            "one batch: {whole_len} bytes, refused"
        );
        for b in batches(&whole.cluster_id, &whole.from, entries, SEND_BODY_BYTES) {
            assert!(serde_json::to_vec(&b).expect("serializes").len() <= SEND_BODY_BYTES);
        }
    }

    #[test]
    fn answers_round_trip() {
        let ok = Answer::from_result(&Ok(SyncReply {
            credit: 5,
            granted: 2,
            ttl_ms: 3000,
            cut_off_share: 7,
        }));
        let json = serde_json::to_string(&ok).expect("serializes");
        let back: Answer = serde_json::from_str(&json).expect("parses");
        assert_eq!(back, ok);
        let refused = Answer::from_result(&Err(Refusal::NotOwner));
        assert_eq!(refused.into_result(), Err("not_owner".to_owned()));
    }

    #[test]
    fn an_owner_speaking_version_1_is_sent_what_it_parses() {
        let holding = Entry::new(
            "tenant:a:requests",
            &SyncRequest {
                seq: 9,
                usage: vec![(3, 4)],
                remaining: 2,
                want: 1,
                adopted: 8,
                held: 6,
            },
        );
        // The fields of wire version 1, the schema of a build without `held`,
        // which parses strictly: any other field refuses the batch
        // (tests/it/cluster_lease.rs runs such an owner over a real socket).
        const VERSION_1: [&str; 6] = ["adopted", "key", "remaining", "seq", "usage", "want"];
        let fields = |e: &Entry| -> Vec<String> {
            let json = serde_json::to_value(e).expect("serializes");
            json.as_object()
                .expect("an object")
                .keys()
                .cloned()
                .collect()
        };
        assert!(
            fields(&holding).contains(&"held".to_owned()),
            "what it refused"
        );
        assert_eq!(fields(&holding.clone().readable_by(1)), VERSION_1);
        let current = holding.clone().readable_by(RPC_VERSION);
        assert_eq!(
            current.request(),
            holding.request(),
            "version 2 keeps the figure"
        );
        assert_eq!(holding.readable_by(1).request().held, 0);
    }
}
