//! Replay protection: each sender (a random instance id per process start)
//! numbers its messages; a receiver keeps, per sender, the highest number seen
//! and a window of [`WINDOW`] numbers below it (IPsec's anti-replay window), and
//! accepts a number once. Numbers below the window are refused: gossip
//! datagrams arrive nearly in order, and RPCs race by at most the requests one
//! node has in flight to one peer.
//!
//! Bounded: at most [`MAX_SENDERS`] senders are tracked; one not heard from for
//! [`super::MAX_CLOCK_SKEW`] is forgotten when room is needed (anything it sent
//! before is refused as stale by then). Only authenticated messages reach the
//! guard, so a process without the secret cannot fill it.

use std::collections::HashMap;

/// How many numbers below the highest one seen are remembered.
pub const WINDOW: u64 = 1024;

/// Most senders tracked at once.
pub const MAX_SENDERS: usize = 4096;

const WORDS: usize = (WINDOW / 64) as usize;

/// One sender's window.
#[derive(Debug, Clone)]
struct Window {
    /// The highest number accepted.
    top: u64,
    /// Bit `i` set: `top - i` was accepted.
    seen: [u64; WORDS],
    /// When it was last heard from (ms).
    last_ms: u64,
}

impl Window {
    fn new(number: u64, now_ms: u64) -> Window {
        let mut seen = [0; WORDS];
        seen[0] = 1;
        Window {
            top: number,
            seen,
            last_ms: now_ms,
        }
    }

    fn has(&self, number: u64) -> bool {
        if number > self.top {
            return false;
        }
        let back = self.top - number;
        back >= WINDOW || self.bit(back)
    }

    fn bit(&self, back: u64) -> bool {
        self.seen[(back / 64) as usize] & (1 << (back % 64)) != 0
    }

    fn mark(&mut self, number: u64, now_ms: u64) {
        self.last_ms = self.last_ms.max(now_ms);
        if number > self.top {
            self.shift(number - self.top);
            self.top = number;
        }
        let back = self.top - number;
        if back < WINDOW {
            self.seen[(back / 64) as usize] |= 1 << (back % 64);
        }
    }

    /// Moves every bit `by` places further back (dropping those past the window).
    fn shift(&mut self, by: u64) {
        if by >= WINDOW {
            self.seen = [0; WORDS];
            return;
        }
        let (words, bits) = ((by / 64) as usize, (by % 64) as u32);
        for i in (0..WORDS).rev() {
            let from = i.checked_sub(words);
            let low = from.map_or(0, |j| self.seen[j]);
            let carry = match from.and_then(|j| j.checked_sub(1)) {
                Some(j) if bits > 0 => self.seen[j] >> (64 - bits),
                _ => 0,
            };
            self.seen[i] = (low << bits) | carry;
        }
    }
}

/// Why a number was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// Seen before, or below the window.
    Seen,
    /// [`MAX_SENDERS`] senders heard from within the skew: no room.
    Full,
}

/// The numbers seen per sender.
#[derive(Debug, Default)]
pub struct ReplayGuard {
    senders: HashMap<u64, Window>,
}

impl ReplayGuard {
    /// Whether `number` from `sender` would be accepted (nothing recorded).
    pub fn check(&self, sender: u64, number: u64) -> Result<(), Replay> {
        match self.senders.get(&sender) {
            Some(window) if window.has(number) => Err(Replay::Seen),
            _ => Ok(()),
        }
    }

    /// Accepts `number` from `sender` once: the second time, [`Replay::Seen`].
    pub fn accept(&mut self, sender: u64, number: u64, now_ms: u64) -> Result<(), Replay> {
        self.check(sender, number)?;
        if let Some(window) = self.senders.get_mut(&sender) {
            window.mark(number, now_ms);
            return Ok(());
        }
        if self.senders.len() >= MAX_SENDERS {
            self.forget_quiet(now_ms);
            if self.senders.len() >= MAX_SENDERS {
                return Err(Replay::Full);
            }
        }
        self.senders.insert(sender, Window::new(number, now_ms));
        Ok(())
    }

    /// Drops senders not heard from for longer than the clock skew allows.
    fn forget_quiet(&mut self, now_ms: u64) {
        self.senders.retain(|_, w| super::fresh(w.last_ms, now_ms));
    }

    /// How many senders are tracked.
    pub fn senders(&self) -> usize {
        self.senders.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    #[test]
    fn a_number_is_accepted_once() {
        let mut guard = ReplayGuard::default();
        assert_eq!(guard.accept(7, 1, 0), Ok(()));
        assert_eq!(guard.accept(7, 1, 0), Err(Replay::Seen));
        assert_eq!(guard.accept(8, 1, 0), Ok(()), "another sender");
        assert_eq!(guard.accept(7, 3, 0), Ok(()));
        assert_eq!(guard.accept(7, 2, 0), Ok(()), "late but within the window");
        assert_eq!(guard.accept(7, 2, 0), Err(Replay::Seen));
    }

    #[test]
    fn numbers_below_the_window_are_refused() {
        let mut guard = ReplayGuard::default();
        guard.accept(1, 5_000, 0).unwrap();
        assert_eq!(guard.accept(1, 5_000 - WINDOW, 0), Err(Replay::Seen));
        assert_eq!(guard.accept(1, 5_001 - WINDOW, 0), Ok(()));
    }

    #[test]
    fn quiet_senders_make_room_and_live_ones_do_not() {
        let mut guard = ReplayGuard::default();
        for sender in 0..MAX_SENDERS as u64 {
            guard.accept(sender, 1, 0).unwrap();
        }
        assert_eq!(guard.accept(u64::MAX, 1, 1_000), Err(Replay::Full));
        let later = 31_000;
        assert_eq!(guard.accept(u64::MAX, 1, later), Ok(()));
        assert_eq!(guard.senders(), 1);
    }

    proptest! {
        /// Against a set of every number ever accepted: the guard accepts a
        /// number iff it is new and within the window of the highest seen.
        #[test]
        fn the_window_matches_a_set_of_numbers_seen(numbers in prop::collection::vec(0u64..3_000, 1..400)) {
            let mut guard = ReplayGuard::default();
            let mut seen: HashSet<u64> = HashSet::new();
            let mut top: Option<u64> = None;
            for n in numbers {
                let expected = !seen.contains(&n) && top.is_none_or(|t| n > t || t - n < WINDOW);
                prop_assert_eq!(guard.accept(1, n, 0).is_ok(), expected, "number {}", n);
                if expected {
                    seen.insert(n);
                    top = Some(top.map_or(n, |t| t.max(n)));
                }
            }
        }
    }
}
