//! Completion lengths and texts: a seeded draw per request, capped by the request's
//! `max_tokens`, and a text that is exactly that many tokens long.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// The word the completion repeats: one token in both `cl100k_base` and `o200k_base`,
/// also when repeated (checked by the tests below).
pub(super) const WORD: &str = " hello";

/// Tokens per stream chunk when there is no per-token delay, to keep streams short.
pub(super) const TOKENS_PER_FAST_CHUNK: u64 = 16;

/// A drawn completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Completion {
    /// Length in tokens.
    pub tokens: u64,
    /// The length was cut by the request's `max_tokens` (`finish_reason: "length"`).
    pub hit_max_tokens: bool,
}

/// SplitMix64 finaliser: spreads `(seed, seq)` over the whole seed space.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Draws the completion of request number `seq`: uniform over `min..=max`, then capped
/// by `max_tokens`. The same inputs always give the same result.
pub(super) fn draw(seed: u64, seq: u64, min: u64, max: u64, max_tokens: Option<u64>) -> Completion {
    debug_assert!(min <= max);
    let mut rng = SmallRng::seed_from_u64(mix(seed ^ mix(seq)));
    let drawn = rng.random_range(min..=max);
    match max_tokens {
        Some(cap) if drawn >= cap => Completion {
            tokens: cap,
            hit_max_tokens: true,
        },
        _ => Completion {
            tokens: drawn,
            hit_max_tokens: false,
        },
    }
}

/// The completion text of `tokens` tokens.
pub(super) fn text(tokens: u64) -> String {
    WORD.repeat(usize::try_from(tokens).unwrap_or(usize::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::Encoding;

    #[test]
    fn text_has_exactly_the_drawn_token_count() {
        for encoding in [Encoding::Cl100kBase, Encoding::O200kBase] {
            for n in [0, 1, 2, 3, 16, 17, 255, 1000] {
                assert_eq!(
                    encoding.count_text_reference(&text(n)),
                    n,
                    "{encoding:?} n={n}"
                );
            }
        }
    }

    #[test]
    fn draws_are_deterministic_in_range_and_capped() {
        for seq in 0..2000 {
            let c = draw(42, seq, 16, 256, None);
            assert_eq!(c, draw(42, seq, 16, 256, None));
            assert!((16..=256).contains(&c.tokens) && !c.hit_max_tokens);
            for cap in [1, 20, 100] {
                let capped = draw(42, seq, 16, 256, Some(cap));
                assert!(capped.tokens <= cap, "seed=42 seq={seq} cap={cap}");
                assert_eq!(capped.hit_max_tokens, capped.tokens == cap);
                assert_eq!(capped.tokens, c.tokens.min(cap));
            }
        }
        let distinct: std::collections::HashSet<u64> =
            (0..100).map(|s| draw(1, s, 0, 1000, None).tokens).collect();
        assert!(distinct.len() > 50, "draws barely vary: {distinct:?}");
        assert_ne!(
            (0..20)
                .map(|s| draw(1, s, 0, 1000, None).tokens)
                .collect::<Vec<_>>(),
            (0..20)
                .map(|s| draw(2, s, 0, 1000, None).tokens)
                .collect::<Vec<_>>()
        );
    }
}
