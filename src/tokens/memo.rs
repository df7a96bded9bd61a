//! Token counts of long texts counted lately, so a text a client sends again is
//! counted once. Chat clients resend a lot: the same system prompt and few-shot
//! examples on every request, and the whole conversation so far on every turn,
//! which makes counting a conversation's prompts quadratic in its length
//! without a memo. Counting is most of a node's CPU at real prompt sizes: 111 µs
//! for a 1,200-token prompt, against ~45 µs for everything else a proxied request
//! costs the node (docs/BENCHMARKS.md, thirty-second session).
//!
//! The memo is a fixed table of 4,096 slots (32 KB per node), each one
//! `AtomicU64` holding a 40-bit tag of a key and the count (24 bits), indexed by
//! 12 other bits of the key's hash: no lock, no allocation, and a full table
//! evicts by overwriting. Texts under [`MIN_MEMO_BYTES`] are counted every time
//! (a short text costs about what hashing and the miss would, and would push
//! long ones out).
//!
//! - **Keyed per process.** The hash is SipHash with random keys
//!   (`std::hash::RandomState`), so a client cannot craft a text whose key
//!   collides with another's and plant a wrong count for it. An accidental
//!   collision (tag and index equal, one in 2^52 per pair of texts) answers
//!   another text's count: that request's reservation is off, and its
//!   settlement charges what the provider reports, as for any estimate.
//! - **Scoped per tenant.** The scope (the tenant's id) is part of the key, so
//!   one tenant's texts never answer another's. A hit is faster than a miss (by
//!   the count's cost, up to milliseconds for long texts): without the scope, a
//!   tenant could time whether another had sent a given text lately, the side
//!   channel published against providers' prompt caches.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::metrics::counter::Counter;

use super::Encoding;

/// Texts shorter than this (bytes) are not memoized.
pub const MIN_MEMO_BYTES: usize = 256;
/// Slots in the table (a power of two).
const SLOTS: usize = 4096;
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

impl Default for CountMemo {
    fn default() -> Self {
        CountMemo::new(Counter::default(), Counter::default())
    }
}

impl CountMemo {
    /// An empty memo counting its hits and misses on these counters.
    pub fn new(hits: Counter, misses: Counter) -> Self {
        CountMemo {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
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
        if text.len() < MIN_MEMO_BYTES {
            return encoding.count_text(text);
        }
        let hash = self.keys.hash_one((scope, tag_of_encoding, text));
        let slot = &self.slots[hash as usize & (SLOTS - 1)];
        // The top 40 bits, disjoint from the index's low 12.
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

    fn long(word: &str) -> String {
        format!("{word}{}", " and again".repeat(40))
    }

    #[test]
    fn a_long_text_is_counted_once_per_scope_and_encoding() {
        let memo = CountMemo::default();
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
    fn short_texts_and_character_ratios_are_counted_every_time() {
        let memo = CountMemo::default();
        let short = "x".repeat(MIN_MEMO_BYTES - 1);
        let ratio = Encoding::CharsPerToken(4.0);
        for _ in 0..2 {
            let o200k = Encoding::O200kBase;
            assert_eq!(memo.count("t", o200k, &short), o200k.count_text(&short));
            assert_eq!(
                memo.count("t", ratio, &long("a")),
                ratio.count_text(&long("a"))
            );
        }
        assert_eq!(memo.hits_and_misses(), (0, 0));
    }

    #[test]
    fn a_slot_keeps_only_the_last_text_stored_in_it() {
        let memo = CountMemo::default();
        let o200k = Encoding::O200kBase;
        // More texts than slots: every one still counts exactly, hit or not.
        let texts: Vec<String> = (0..SLOTS + 100).map(|i| long(&format!("w{i}"))).collect();
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
        /// Whatever the texts and their order, the memo answers the exact count.
        #[test]
        fn the_memo_always_answers_the_exact_count(
            texts in prop::collection::vec("[a-z ,.'\n]{200,400}|\\PC{100,300}", 1..6),
            order in prop::collection::vec(0usize..6, 1..20),
        ) {
            let memo = CountMemo::default();
            for i in order {
                let text = &texts[i % texts.len()];
                for encoding in [Encoding::Cl100kBase, Encoding::O200kBase] {
                    prop_assert_eq!(memo.count("t", encoding, text), encoding.count_text(text));
                }
            }
        }
    }
}
