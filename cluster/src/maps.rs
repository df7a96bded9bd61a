//! Hash maps that give memory back. A `HashMap`'s table never shrinks by itself:
//! one that held every key of a busy minute keeps that size after the keys leave,
//! and unshrunk tables would be most of what a tenant used once and now idle costs
//! per node (docs/BENCHMARKS.md, "Used once, now idle").

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};

/// Shrinks `map` to twice its length once at most a quarter of its table is used
/// (and the table is not tiny). Amortised O(1) per removal: after a shrink, the
/// next takes removing half of what is left.
pub fn shrink_if_sparse<K: Eq + Hash, V, S: BuildHasher>(map: &mut HashMap<K, V, S>) {
    let len = map.len();
    shrink_to_need(map, len);
}

/// Shrinks `map` to twice `need` once its table holds over four times that (and
/// is not tiny): for a map emptied every round, `need` is what a round put in.
pub fn shrink_to_need<K: Eq + Hash, V, S: BuildHasher>(map: &mut HashMap<K, V, S>, need: usize) {
    if map.capacity() > 4 * need.max(8) {
        map.shrink_to(need * 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_emptied_to_a_quarter_gives_its_table_back() {
        let mut map: HashMap<u32, [u8; 64]> = (0..4_096).map(|i| (i, [0; 64])).collect();
        let full = map.capacity();
        map.retain(|k, _| *k < 2_048);
        shrink_if_sparse(&mut map);
        assert!(
            map.capacity() > 3_000,
            "half full: kept ({} of {full})",
            map.capacity()
        );
        map.retain(|k, _| *k < 100);
        shrink_if_sparse(&mut map);
        assert!(map.capacity() < full / 8, "{} of {full}", map.capacity());
        assert_eq!(map.len(), 100);
        map.clear();
        shrink_if_sparse(&mut map);
        assert_eq!(map.capacity(), 0);
    }
}
