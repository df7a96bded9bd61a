//! Rendezvous (highest-random-weight) ownership: which live member owns a lease key.
//!
//! Every member scores `weight(key, member)` and the highest score owns the key. The
//! hash is **stable** (FNV-1a 64 with its published offset basis and prime, then the
//! splitmix64 finalizer for avalanche), never `std`'s randomly seeded `SipHash`, so
//! every node, every build and every restart computes the same owner from the same
//! member list. A member's score for a key does not depend on the other members, so
//! removing a member moves only the keys it owned, and adding one takes only the keys
//! it now wins (docs/design/lease.md, "Ownership").

/// FNV-1a 64-bit offset basis (FNV spec, <http://www.isthe.com/chongo/tech/comp/fnv/>).
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a 64-bit prime.
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a over `bytes`, continuing from `state`.
fn fnv1a(mut state: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        state ^= u64::from(b);
        state = state.wrapping_mul(FNV_PRIME);
    }
    state
}

/// splitmix64's finalizer: FNV alone mixes the last bytes poorly, which would bias
/// members whose ids differ only in their last character.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The stable score of `member` for `key`. The length of the member id is hashed
/// first so that ("ab", "c") and ("a", "bc") differ.
pub fn weight(key: &str, member: &str) -> u64 {
    let len = (member.len() as u64).to_le_bytes();
    let state = fnv1a(
        fnv1a(fnv1a(FNV_OFFSET, &len), member.as_bytes()),
        key.as_bytes(),
    );
    mix(state)
}

/// The owner of `key` among `members`: the highest [`weight`], ties (a 2^-64 event)
/// to the smaller member id, so the answer never depends on the slice's order.
/// `None` when there are no members.
pub fn owner<'m, M: AsRef<str>>(key: &str, members: &'m [M]) -> Option<&'m M> {
    members.iter().max_by(|a, b| {
        let (a, b) = (a.as_ref(), b.as_ref());
        weight(key, a).cmp(&weight(key, b)).then(b.cmp(a))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn stable_across_builds() {
        // Pinned values: a change here changes every cluster's ownership at upgrade.
        assert_eq!(fnv1a(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(weight("k", "node-1"), weight("k", "node-1"));
        assert_ne!(weight("k", "ab"), weight("bk", "a"));
        let members = ["n1", "n2", "n3"];
        let first = owner("tenant:acme:tokens", &members);
        let mut reversed = members;
        reversed.reverse();
        assert_eq!(first, owner("tenant:acme:tokens", &reversed));
        assert_eq!(owner::<&str>("k", &[]), None);
    }

    fn member_set() -> impl Strategy<Value = Vec<String>> {
        prop::collection::btree_set("[a-z0-9-]{1,12}", 2..12).prop_map(|s| s.into_iter().collect())
    }

    proptest! {
        #[test]
        fn removing_a_non_owner_never_moves_a_key(
            members in member_set(),
            keys in prop::collection::vec("[ -~]{0,40}", 1..40),
            victim in any::<prop::sample::Index>(),
        ) {
            let gone = victim.index(members.len());
            let rest: Vec<String> = members.iter().enumerate()
                .filter(|&(i, _)| i != gone).map(|(_, m)| m.clone()).collect();
            for key in &keys {
                let before = owner(key, &members);
                let after = owner(key, &rest);
                if before != Some(&members[gone]) {
                    prop_assert_eq!(before, after, "key {:?} moved", key);
                } else {
                    prop_assert!(after.is_some());
                }
            }
        }

        #[test]
        fn ownership_is_balanced(members in member_set(), salt in any::<u32>()) {
            let keys = 4_000usize;
            let mut owned = vec![0usize; members.len()];
            for k in 0..keys {
                let key = format!("tenant:{salt}:{k}:tokens");
                let o = owner(&key, &members);
                let i = members.iter().position(|m| Some(m) == o);
                prop_assert!(i.is_some());
                owned[i.unwrap_or(0)] += 1;
            }
            let fair = keys / members.len();
            for (m, n) in members.iter().zip(&owned) {
                // Loose: within [fair/2, 2*fair] (binomial sd is ~sqrt(fair), < 10%).
                prop_assert!(*n >= fair / 2 && *n <= 2 * fair, "{} owns {} of {}", m, n, keys);
            }
        }
    }
}
