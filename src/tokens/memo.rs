//! Token counts of long texts counted lately, so a text a client sends again is
//! counted once. Chat clients resend a lot: the same system prompt and few-shot
//! examples on every request, and the whole conversation so far on every turn,
//! which makes counting a conversation's prompts quadratic in its length
//! without a memo. Counting is the largest single part of a node's CPU at real
//! prompt sizes: ~50 µs for a 1,200-token prompt (111 µs through tiktoken-rs),
//! against ~45 µs for everything else a proxied request costs the node
//! (docs/BENCHMARKS.md).
//!
//! The memo is a fixed table of `estimation.count_memo_slots` slots (65,536 by
//! default: 512 KB per node), each one `AtomicU64` holding a 40-bit tag of a
//! key and the count (24 bits), indexed by the key hash's low bits: no lock, no
//! allocation, and a new text evicts whatever was in its slot. An entry lasts
//! about slots / (new long texts per second): 11 minutes at 100 a second with
//! the default. Texts under [`MIN_MEMO_BYTES`] are counted every time (a short
//! text costs about what hashing and the miss would, and would push long ones
//! out).
//!
//! - **Keyed per process.** The hash is std's `RandomState` (currently
//!   SipHash-1-3 with random keys), so a client cannot craft a text whose key
//!   collides with another's and plant a wrong count for it. An accidental
//!   collision, a lookup of a text not in the memo meeting another text's tag
//!   in its slot, happens once in 2^40 such lookups: that request's
//!   reservation is off, and its settlement charges what the provider reports,
//!   as for any estimate.
//! - **Scoped per tenant.** The scope (the tenant's id) is part of the key, so
//!   one tenant's texts never answer another's, and a tenant cannot learn by
//!   timing whether another sent a given text lately (a hit is faster than a
//!   miss by the count's cost; such probes were published against providers'
//!   prompt caches). What the shared table still shows: a tenant that fills
//!   slots with its own texts and times them again can tell that *some* long
//!   texts arrived meanwhile (the volume, not which), and it can evict others'
//!   entries, which costs them a count, never a wrong one. API keys of one
//!   tenant share its scope.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::metrics::counter::Counter;

use super::Encoding;

/// Texts shorter than this (bytes) are not memoized.
pub const MIN_MEMO_BYTES: usize = 256;
pub use crate::config::bounds::COUNT_MEMO_SLOTS_RANGE;
/// Bits of a slot holding the count; the rest hold the tag.
const COUNT_BITS: u32 = 24;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

/// A node's memo of token counts (see the module docs).
pub struct CountMemo {
    slots: Box<[AtomicU64]>,
    keys: std::hash::RandomState,
    /// Counts answered from the memo, and counts it had to make (texts long
    /// enough to be memoized only): `tollgate_prompt_count_memo_total`.
    hits: Counter,
    misses: Counter,
}

impl CountMemo {
    /// An empty memo of `slots` slots (0: off, every text counted; otherwise a
    /// power of two, `estimation.count_memo_slots`), counting its hits and
    /// misses on these counters.
    pub fn new(slots: usize, hits: Counter, misses: Counter) -> Self {
        debug_assert!(slots == 0 || slots.is_power_of_two());
        CountMemo {
            slots: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            keys: std::hash::RandomState::new(),
            hits,
            misses,
        }
    }

    /// Tokens in `text` under `encoding`, for a request of `scope` (a tenant).
    pub fn count(&self, scope: &str, encoding: Encoding, text: &str) -> u64 {
        let tag_of_encoding = match encoding {
            Encoding::Cl100kBase => 1u8,
            Encoding::O200kBase => 2,
            // Counting characters costs less than hashing them.
            Encoding::CharsPerToken(_) => return encoding.count_text(text),
        };
        if text.len() < MIN_MEMO_BYTES || self.slots.is_empty() {
            return encoding.count_text(text);
        }
        let hash = self.keys.hash_one((scope, tag_of_encoding, text));
        let slot = &self.slots[hash as usize & (self.slots.len() - 1)];
        // The top 40 bits, disjoint from the index's low 22 at most.
        let tag = hash >> COUNT_BITS << COUNT_BITS;
        let held = slot.load(Ordering::Relaxed);
        // 0 is an empty slot: a stored count is at least 1 (a long text has tokens).
        if held != 0 && held & !COUNT_MASK == tag {
            self.hits.inc();
            return held & COUNT_MASK;
        }
        self.misses.inc();
        let count = encoding.count_text(text);
        if (1..=COUNT_MASK).contains(&count) {
            slot.store(tag | count, Ordering::Relaxed);
        }
        count
    }

    /// Counts answered from the memo, and counts it had to make, so far.
    pub fn hits_and_misses(&self) -> (u64, u64) {
        (self.hits.get(), self.misses.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn memo(slots: usize) -> CountMemo {
        CountMemo::new(slots, Counter::default(), Counter::default())
    }

    fn long(word: &str) -> String {
        format!("{word}{}", " and again".repeat(40))
    }

    #[test]
    fn a_long_text_is_counted_once_per_scope_and_encoding() {
        let memo = memo(1024);
        let text = long("Hello");
        let o200k = Encoding::O200kBase;
        let exact = o200k.count_text(&text);
        assert_eq!(memo.count("t1", o200k, &text), exact);
        assert_eq!(memo.hits_and_misses(), (0, 1));
        assert_eq!(memo.count("t1", o200k, &text), exact);
        assert_eq!(memo.hits_and_misses(), (1, 1), "answered from the memo");
        // Another tenant, or another encoding, counts it again.
        assert_eq!(memo.count("t2", o200k, &text), exact);
        let cl100k = Encoding::Cl100kBase;
        assert_eq!(memo.count("t1", cl100k, &text), cl100k.count_text(&text));
        assert_eq!(memo.hits_and_misses(), (1, 3));
    }

    #[test]
    fn texts_from_256_bytes_are_memoized_shorter_ones_and_ratios_never() {
        let memo = memo(1024);
        let o200k = Encoding::O200kBase;
        let ratio = Encoding::CharsPerToken(4.0);
        let (short, enough) = ("x".repeat(MIN_MEMO_BYTES - 1), "x".repeat(MIN_MEMO_BYTES));
        for _ in 0..2 {
            assert_eq!(memo.count("t", o200k, &short), o200k.count_text(&short));
            assert_eq!(
                memo.count("t", ratio, &long("a")),
                ratio.count_text(&long("a"))
            );
        }
        assert_eq!(memo.hits_and_misses(), (0, 0));
        for _ in 0..2 {
            assert_eq!(memo.count("t", o200k, &enough), o200k.count_text(&enough));
        }
        assert_eq!(memo.hits_and_misses(), (1, 1));
    }

    #[test]
    fn a_memo_of_no_slots_counts_every_text() {
        let memo = memo(0);
        let text = long("off");
        for _ in 0..2 {
            let o200k = Encoding::O200kBase;
            assert_eq!(memo.count("t", o200k, &text), o200k.count_text(&text));
        }
        assert_eq!(memo.hits_and_misses(), (0, 0));
    }

    /// One slot: every text lands on it, and only the tag tells them apart.
    #[test]
    fn texts_sharing_a_slot_are_told_apart_by_their_tags() {
        let memo = memo(1);
        let o200k = Encoding::O200kBase;
        let (a, b) = (
            long("short"),
            long("a much longer text, with more tokens in it"),
        );
        assert_ne!(o200k.count_text(&a), o200k.count_text(&b));
        for text in [&a, &b, &a, &a, &b] {
            assert_eq!(memo.count("t", o200k, text), o200k.count_text(text));
        }
        // a, b and a again evict each other; the fourth is a hit, the last
        // evicts a.
        assert_eq!(memo.hits_and_misses(), (1, 4));
    }

    #[test]
    fn the_table_is_bounded_and_still_answers_exact_counts() {
        let memo = memo(1024);
        let o200k = Encoding::O200kBase;
        // More texts than slots: every one still counts exactly, hit or not.
        let texts: Vec<String> = (0..1124).map(|i| long(&format!("w{i}"))).collect();
        for text in texts.iter().chain(&texts) {
            assert_eq!(memo.count("t", o200k, text), o200k.count_text(text));
        }
        let (hits, misses) = memo.hits_and_misses();
        assert_eq!(hits + misses, 2 * texts.len() as u64);
        assert!(
            misses > texts.len() as u64,
            "{hits} hits: the table is bounded"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Whatever the texts, their order and the table's size (down to one
        /// slot, where every text evicts the last), the memo answers the exact
        /// count.
        #[test]
        fn the_memo_always_answers_the_exact_count(
            texts in prop::collection::vec("[a-z ,.'\n]{256,400}|\\PC{100,300}", 1..6),
            order in prop::collection::vec(0usize..6, 1..20),
            slots in prop::sample::select(vec![1usize, 2, 1024]),
        ) {
            let memo = memo(slots);
            for i in order {
                let text = &texts[i % texts.len()];
                for encoding in [Encoding::Cl100kBase, Encoding::O200kBase] {
                    prop_assert_eq!(memo.count("t", encoding, text), encoding.count_text(text));
                }
            }
        }
    }
}
