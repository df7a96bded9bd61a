//! The cut-off shares a holder may still hold: the one its statement says it
//! adopted and every one told since (a reply may be lost, leaving it an
//! earlier, larger one), at most a few.

/// The cut-off shares told to one holder that it may still hold: `(share, seq)`,
/// `seq` the statement whose reply told it. The holder holds the figure of the
/// reply it adopted last, or of one told since whose reply it got later; a reply
/// may be lost, so each counts until a statement says a later one was adopted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Reserves(pub(super) Vec<(u64, u64)>);

/// Most figures kept per holder (a run of lost replies); beyond, the two oldest
/// merge into the larger share until the later of the two is replaced.
pub(super) const MAX_RESERVES: usize = 8;

impl Reserves {
    /// A statement says the holder adopted the reply to `adopted`: figures told
    /// before it are replaced. `returning`: it gave everything back and dropped
    /// its figure when it sent the statement: none binds it.
    pub(super) fn confirm(&mut self, adopted: u64, returning: bool) {
        if returning {
            self.0.clear();
        } else {
            self.0.retain(|&(_, seq)| seq >= adopted);
        }
    }

    /// The holder says it holds `share`, told in reply to statement `seq`: kept
    /// as if told here (an owner that rebuilt the line forgot what it told; one
    /// that did not already keeps it, merged upward at worst).
    pub(super) fn keep(&mut self, share: u64, seq: u64) {
        // Covered by a figure that binds at least as long (told since, or merged
        // into a later one) and is at least as large.
        if share == 0 || self.0.iter().any(|&(s, q)| q >= seq && s >= share) {
            return;
        }
        let at = self.0.partition_point(|&(_, q)| q < seq);
        self.0.insert(at, (share, seq));
        self.bound();
    }

    /// Records `share` told in reply to statement `seq`.
    pub(super) fn tell(&mut self, share: u64, seq: u64) {
        if share > 0 {
            self.0.push((share, seq));
        }
        self.bound();
    }

    /// At most [`MAX_RESERVES`]: the two oldest merge into the larger share, kept
    /// until the later of the two is replaced.
    pub(super) fn bound(&mut self) {
        if self.0.len() > MAX_RESERVES {
            let (s, _) = self.0.remove(0);
            self.0[0].0 = self.0[0].0.max(s);
        }
    }

    /// The largest figure the holder may hold.
    pub(super) fn max(&self) -> u64 {
        self.0.iter().map(|(s, _)| *s).max().unwrap_or(0)
    }
}
