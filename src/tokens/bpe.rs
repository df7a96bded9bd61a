//! Counting an OpenAI BPE encoding's tokens without tiktoken-rs's regex engine.
//!
//! tiktoken splits a text into pieces with a pattern, then merges each piece's
//! bytes by the vocabulary's ranks. tiktoken-rs runs the pattern through
//! `fancy-regex`, a backtracking engine, because each encoding's pattern has one
//! branch the `regex` crate cannot run: `\s+(?!\S)`, a look-ahead. Through
//! tiktoken-rs, that pass is 90% of a short prompt's count and a fifth of all
//! the instructions a node spends on a request (docs/BENCHMARKS.md).
//!
//! Here the pattern runs on `regex-automata`'s meta engine (which picks its
//! lazy DFA for these patterns), once per piece and
//! anchored at the piece's start (no reverse pass to find where it began), with
//! the look-ahead branch replaced by `\s+` and its effect applied after the
//! match ([`leave_last_space`]). The merge is tiktoken's own for pieces under
//! 100 bytes (`byte_pair_split`) and a heap-based count here for longer ones,
//! as tiktoken does, so a long run of spaces costs `n log n`, not `n²`.
//!
//! Counts equal tiktoken-rs's `count_ordinary` for every input: the tests
//! compare both on generated texts built to reach every branch of both
//! patterns, and on long pieces.

use std::collections::BinaryHeap;

use regex_automata::{Anchored, Input, meta::Regex};
use rustc_hash::FxHashMap;
use tiktoken_rs::{CoreBPE, Rank};

/// `o200k_base`'s pattern (tiktoken-rs's `O200K_BASE_PAT_STR`) with its last
/// two branches, `\s+(?!\S)|\s+`, folded into `\s+`: [`leave_last_space`]
/// gives back what the look-ahead would have left for the next piece.
const O200K_PIECES: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"|\s*[\r\n]+",
    r"|\s+",
);

/// `cl100k_base`'s pattern as tiktoken-rs writes it, with its possessive
/// quantifiers made greedy (no branch here can give back what a possessive
/// one kept: each is followed by the end of its branch, a class it cannot
/// match, or `$`) and its last two branches, `\s+(?!\S)|\s`, folded into
/// `\s+` as in [`O200K_PIECES`].
const CL100K_PIECES: &str = concat!(
    r"'(?i:[sdmt]|ll|ve|re)",
    r"|[^\r\n\p{L}\p{N}]?\p{L}+",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"|\s+$",
    r"|\s*[\r\n]",
    r"|\s+",
);

/// Pieces at least this long merge through the heap ([`count_long_piece`]),
/// as in tiktoken.
const LONG_PIECE_BYTES: usize = 100;

/// One encoding's pattern and vocabulary, for counting.
pub(super) struct BpeCounter {
    pieces: Regex,
    ranks: FxHashMap<Vec<u8>, Rank>,
    /// The longest token's bytes: a text of `n` bytes has at least
    /// `n / longest` tokens.
    longest: usize,
}

impl BpeCounter {
    /// `o200k_base`, its vocabulary read out of tiktoken-rs's tables.
    pub(super) fn o200k_base() -> BpeCounter {
        let bpe = tiktoken_rs::o200k_base().expect("tiktoken-rs's embedded o200k_base loads");
        BpeCounter::new(&bpe, O200K_PIECES)
    }

    /// `cl100k_base`, its vocabulary read out of tiktoken-rs's tables.
    pub(super) fn cl100k_base() -> BpeCounter {
        let bpe = tiktoken_rs::cl100k_base().expect("tiktoken-rs's embedded cl100k_base loads");
        BpeCounter::new(&bpe, CL100K_PIECES)
    }

    /// Reads `bpe`'s ordinary tokens, ranks 0, 1, ... up to the first rank it
    /// cannot decode (both encodings number them without a gap; the special
    /// tokens come after a gap and are never counted as text). Not for an
    /// encoding whose special tokens follow its ordinary ones without a gap
    /// (`o200k_harmony`'s `<|startoftext|>` is rank 199998): they would be
    /// read as text.
    ///
    /// The `CoreBPE` read here is a temporary one, dropped after: the node keeps
    /// one copy of each vocabulary, not this and tiktoken-rs's singleton too.
    fn new(bpe: &CoreBPE, pattern: &str) -> BpeCounter {
        let ranks: FxHashMap<Vec<u8>, Rank> = (0..)
            .map_while(|rank| Some((bpe.decode_bytes(&[rank]).ok()?, rank)))
            .collect();
        let pieces = Regex::new(pattern).expect("the piece patterns compile");
        let longest = ranks.keys().map(Vec::len).max().unwrap_or(1);
        BpeCounter {
            pieces,
            ranks,
            longest,
        }
    }

    /// The longest token's length in bytes.
    pub(super) fn longest_token_bytes(&self) -> usize {
        self.longest
    }

    /// Ordinary tokens in `text`: what tiktoken-rs's `count_ordinary` returns.
    pub(super) fn count(&self, text: &str) -> usize {
        self.pieces(text)
            .map(|piece| self.count_piece(piece.as_bytes()))
            .sum()
    }

    /// The pieces the encoding's pattern splits `text` into, in order.
    fn pieces<'t>(&self, text: &'t str) -> impl Iterator<Item = &'t str> {
        let mut start = 0;
        std::iter::from_fn(move || {
            let (piece_start, end) = self.next_piece(text, start)?;
            start = end;
            Some(&text[piece_start..end])
        })
    }

    /// The piece at or after `start`. Every character begins a piece under
    /// both patterns, so the anchored search finds it; the unanchored one is
    /// there so that a pattern which skips text would skip it as tiktoken
    /// does. Neither pattern matches an empty piece; one would end the text.
    fn next_piece(&self, text: &str, start: usize) -> Option<(usize, usize)> {
        if start >= text.len() {
            return None;
        }
        let input = Input::new(text).range(start..);
        let (start, end) = match self
            .pieces
            .search_half(&input.clone().anchored(Anchored::Yes))
        {
            Some(end) if end.offset() > start => (start, end.offset()),
            _ => {
                let found = self.pieces.find(input).filter(|m| !m.is_empty())?;
                (found.start(), found.end())
            }
        };
        Some((start, leave_last_space(text, start, end)))
    }

    fn count_piece(&self, piece: &[u8]) -> usize {
        if self.ranks.contains_key(piece) {
            1
        } else if piece.len() < LONG_PIECE_BYTES {
            tiktoken_rs::byte_pair_split(piece, &self.ranks).len()
        } else {
            count_long_piece(piece, &self.ranks)
        }
    }
}

/// Where the piece `text[start..end]` ends once the look-ahead branch
/// `\s+(?!\S)` is applied: a run of two or more spaces followed by a
/// non-space leaves its last space to begin the next piece (" world" is one
/// token, the run before it another).
///
/// Only the folded `\s+` branch ends a piece on a space other than `\r` or
/// `\n`: every other branch ends on a letter, mark, digit, punctuation, a
/// line break, `/`, or the end of the text (`\s+$`). And a `\s+` match is the
/// whole run, so a match not at the end of the text is followed by a
/// non-space.
fn leave_last_space(text: &str, start: usize, end: usize) -> usize {
    if end == text.len() {
        return end;
    }
    match text[start..end].chars().next_back() {
        Some(last) if last.is_whitespace() && last != '\r' && last != '\n' => {
            let last_start = end - last.len_utf8();
            if last_start > start { last_start } else { end }
        }
        _ => end,
    }
}

/// Tokens of a long piece, by tiktoken's merge: merge the adjacent pair of
/// least rank (the leftmost of equals) until no adjacent pair is in the
/// vocabulary; the count is the bytes less the merges. The candidate merges
/// wait in a heap, each checked against the current neighbours when it comes
/// out (tiktoken's `_byte_pair_merge_large`, counting instead of collecting).
fn count_long_piece(piece: &[u8], ranks: &FxHashMap<Vec<u8>, Rank>) -> usize {
    let n = piece.len();
    // Parts are spans `[start, end[start])`; `prev[start]` is the part before.
    let mut end: Vec<usize> = (1..=n).collect();
    let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
    // The rank of merging the part at `start` with the next, if still current.
    let mut merge_rank: Vec<Option<Rank>> = vec![None; n];
    let mut heap = BinaryHeap::new();
    let rank_of = |from: usize, to: usize| ranks.get(&piece[from..to]).copied();
    let offer = |start: usize,
                 to: Option<usize>,
                 merge_rank: &mut Vec<Option<Rank>>,
                 heap: &mut BinaryHeap<_>| {
        merge_rank[start] = to.and_then(|to| rank_of(start, to));
        if let Some(rank) = merge_rank[start] {
            heap.push(std::cmp::Reverse((rank, start)));
        }
    };
    for start in 0..n - 1 {
        offer(start, Some(start + 2), &mut merge_rank, &mut heap);
    }
    let mut merges = 0;
    while let Some(std::cmp::Reverse((rank, left))) = heap.pop() {
        if merge_rank[left] != Some(rank) {
            continue; // stale: a neighbour changed since it was offered
        }
        let right = end[left];
        end[left] = end[right];
        merge_rank[right] = None;
        if end[left] < n {
            prev[end[left]] = left;
        }
        merges += 1;
        let after = (end[left] < n).then(|| end[end[left]]);
        offer(left, after, &mut merge_rank, &mut heap);
        if left > 0 {
            offer(prev[left], Some(end[left]), &mut merge_rank, &mut heap);
        }
    }
    n - merges
}

#[cfg(test)]
mod tests;
