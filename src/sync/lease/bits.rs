//! A growable set of small ids, one bit each: per-key flags that must cost next
//! to nothing for the many keys nobody uses (an owner's resting lines, a holder's
//! keys to state).

/// A set of `u32` ids, a bit per id up to the largest one set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Bits(Vec<u64>);

impl Bits {
    /// Whether `id` is in the set.
    pub(super) fn contains(&self, id: u32) -> bool {
        (self.0.get(id as usize / 64)).is_some_and(|w| w & (1 << (id % 64)) != 0)
    }

    /// Adds `id` (`on`) or removes it.
    pub(super) fn set(&mut self, id: u32, on: bool) {
        let word = id as usize / 64;
        if self.0.len() <= word {
            if !on {
                return;
            }
            self.0.resize(word + 1, 0);
        }
        if on {
            self.0[word] |= 1 << (id % 64);
        } else {
            self.0[word] &= !(1 << (id % 64));
        }
    }

    /// The ids in the set, ascending.
    pub(super) fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        (self.0.iter().enumerate()).flat_map(|(w, bits)| {
            (0..64u32)
                .filter(move |b| bits & (1 << b) != 0)
                .map(move |b| w as u32 * 64 + b)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_added_removed_and_listed_in_order() {
        let mut bits = Bits::default();
        bits.set(130, false);
        assert_eq!(bits, Bits::default(), "removing grows nothing");
        for id in [130, 0, 63, 64] {
            bits.set(id, true);
        }
        assert!(bits.contains(63) && !bits.contains(62) && !bits.contains(1_000));
        bits.set(63, false);
        assert_eq!(bits.ids().collect::<Vec<_>>(), vec![0, 64, 130]);
    }
}
