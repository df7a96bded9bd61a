//! Bounds and vocabularies that the config checks at the edge and the parts of the
//! node build on. They live here, in the leaf every module reads, so that
//! `validate()` checks a file against the very figures the limiter, the estimator
//! and the token counter use, without the config reaching up into them.

use serde::{Deserialize, Serialize};

/// Which algorithm a limit uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Algorithm {
    /// Bucketed sliding window; promise: any window of length W admits <= ceiling.
    #[default]
    SlidingWindow,
    /// GCRA token bucket; promise: any interval d admits <= burst + capacity * d / W.
    TokenBucket,
    /// Exact sliding log; promise as sliding-window, without the bucket rounding.
    SlidingLog,
}

/// Upper bound on a sliding window's `buckets`, so its ring (at most
/// `2 * buckets + 1` slots of 16 bytes) stays small.
pub const MAX_BUCKETS: u32 = 4096;

/// Largest `max_tokens` a request may ask; anything above is a mistake, not a
/// request.
pub const MAX_TOKENS_CAP: i64 = 1 << 20;

/// Completion lengths remembered per model by the `adaptive` estimate: its p95
/// is read from the last this many completions.
pub const ADAPTIVE_SAMPLES: usize = 128;

/// The sizes `estimation.count_memo_slots` may take besides 0 (powers of two,
/// 8 KB to 32 MB): an index of at most 22 bits stays within the 24 low bits of
/// the hash that the memo's tag leaves out.
pub const COUNT_MEMO_SLOTS_RANGE: (usize, usize) = (1 << 10, 1 << 22);

/// A configured token encoding, by name.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EncodingName {
    /// `cl100k_base`.
    Cl100kBase,
    /// `o200k_base`.
    O200kBase,
    /// `chars-per-token:<ratio>`, a positive finite ratio.
    CharsPerToken(f32),
}

impl EncodingName {
    /// Parses `cl100k_base`, `o200k_base` or `chars-per-token:<ratio>`.
    pub fn parse(name: &str) -> Result<EncodingName, String> {
        match name {
            "cl100k_base" => Ok(EncodingName::Cl100kBase),
            "o200k_base" => Ok(EncodingName::O200kBase),
            other => other
                .strip_prefix("chars-per-token:")
                .and_then(|r| r.parse::<f32>().ok())
                .filter(|r| r.is_finite() && *r > 0.0)
                .map(EncodingName::CharsPerToken)
                .ok_or_else(|| {
                    format!(
                        "unknown encoding {other:?}: expected cl100k_base, o200k_base or chars-per-token:<positive number>"
                    )
                }),
        }
    }
}
