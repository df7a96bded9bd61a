//! Limits on the state one node publishes through `Membership::set_many`.
//!
//! A chitchat message is one UDP datagram (at most 65,507 bytes) carrying a digest of
//! every node plus deltas. A node's state may be larger: chitchat 0.13 cuts a delta
//! to the datagram (`compute_partial_delta_respecting_mtu`, oldest versions first)
//! and a peer catches up over the next exchanges. The caps bound what every peer
//! holds for this node (memory) and how long a newcomer's catch-up takes, not the
//! datagram. Each node refuses a batch that would cross either cap, before anything
//! is written. Pure.

use super::error::MembershipError;
use super::metadata::RESERVED_PREFIX;

/// Per-entry overhead chitchat adds on the wire (two length prefixes, a u64 version,
/// a status byte); counted so the byte cap tracks what peers hold and ship.
pub const ENTRY_OVERHEAD_BYTES: usize = 16;
/// Highest `max_bytes` a config may ask for: 8 MiB, about 130 datagrams a
/// newcomer takes over some tens of gossip rounds. (One datagram's worth, 48 KiB,
/// is too small: with the counters' ring of 61 keys per limit key at the default
/// 60 buckets, about 16 limit keys, seven tenants with a request and a token
/// limit, fill it, and every publish after that is refused.)
pub const MAX_STATE_BYTES_CEILING: usize = 8 * 1024 * 1024;

/// Caps on what this node publishes (metadata keys excluded: they are validated and
/// small).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateLimits {
    /// Most keys this node may publish.
    pub max_keys: usize,
    /// Most bytes (keys + values + [`ENTRY_OVERHEAD_BYTES`] each) it may publish; at
    /// most [`MAX_STATE_BYTES_CEILING`].
    pub max_bytes: usize,
}

impl Default for StateLimits {
    fn default() -> Self {
        StateLimits {
            max_keys: 1_024,
            max_bytes: 32 * 1024,
        }
    }
}

/// Weight of one entry against [`StateLimits::max_bytes`].
pub(crate) fn entry_bytes(key: &str, value: &str) -> usize {
    key.len() + value.len() + ENTRY_OVERHEAD_BYTES
}

/// How much of its caps this node's published state takes (metadata excluded).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateSize {
    /// Keys published.
    pub keys: usize,
    /// Their weight against [`StateLimits::max_bytes`].
    pub bytes: usize,
}

/// Checks that deleting `deletes`, then writing `batch`, over `current` (this node's
/// non-metadata entries) stays within `limits`, and returns the size it leaves.
/// Later entries of `batch` overwrite earlier ones, as chitchat does.
pub(crate) fn check_batch<'a>(
    current: impl Iterator<Item = (&'a str, &'a str)>,
    deletes: &[String],
    batch: &[(String, String)],
    limits: StateLimits,
) -> Result<StateSize, MembershipError> {
    let mut state: std::collections::HashMap<&str, &str> = current
        .filter(|(key, _)| !key.starts_with(RESERVED_PREFIX))
        .collect();
    for key in deletes {
        if key.starts_with(RESERVED_PREFIX) {
            return Err(MembershipError::ReservedKey { key: key.clone() });
        }
        state.remove(key.as_str());
    }
    for (key, value) in batch {
        if key.is_empty() {
            return Err(MembershipError::EmptyKey);
        }
        if key.starts_with(RESERVED_PREFIX) {
            return Err(MembershipError::ReservedKey { key: key.clone() });
        }
        state.insert(key, value);
    }
    if state.len() > limits.max_keys {
        return Err(MembershipError::TooManyKeys {
            keys: state.len(),
            max: limits.max_keys,
        });
    }
    let bytes: usize = state.iter().map(|(k, v)| entry_bytes(k, v)).sum();
    if bytes > limits.max_bytes {
        return Err(MembershipError::TooManyBytes {
            bytes,
            max: limits.max_bytes,
        });
    }
    Ok(StateSize {
        keys: state.len(),
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: &str) -> (String, String) {
        (key.to_string(), value.to_string())
    }

    const LIMITS: StateLimits = StateLimits {
        max_keys: 3,
        max_bytes: 3 * (ENTRY_OVERHEAD_BYTES + 4),
    };

    #[test]
    fn overwrites_do_not_count_twice() {
        let current = [("c:1", "a"), ("m:v", "1")];
        let batch = [kv("c:1", "b"), kv("c:2", "c"), kv("c:2", "d")];
        assert_eq!(
            check_batch(current.into_iter(), &[], &batch, LIMITS).map(|_| ()),
            Ok(())
        );
    }

    #[test]
    fn deletes_make_room_and_the_size_left_is_returned() {
        let current = [("c:1", "a"), ("c:2", "b"), ("c:3", "c"), ("m:v", "1")];
        let full = [kv("c:4", "d")];
        assert!(check_batch(current.into_iter(), &[], &full, LIMITS).is_err());
        let deletes = ["c:1".to_string(), "c:9".to_string()];
        assert_eq!(
            check_batch(current.into_iter(), &deletes, &full, LIMITS),
            Ok(StateSize {
                keys: 3,
                bytes: 3 * (ENTRY_OVERHEAD_BYTES + 4)
            })
        );
        assert_eq!(
            check_batch(current.into_iter(), &["m:v".to_string()], &[], LIMITS),
            Err(MembershipError::ReservedKey {
                key: "m:v".to_string()
            })
        );
    }

    #[test]
    fn too_many_keys_is_refused() {
        let batch = [kv("a", ""), kv("b", ""), kv("c", ""), kv("d", "")];
        assert_eq!(
            check_batch(std::iter::empty(), &[], &batch, LIMITS),
            Err(MembershipError::TooManyKeys { keys: 4, max: 3 })
        );
    }

    #[test]
    fn too_many_bytes_is_refused() {
        let batch = [kv("k", "x".repeat(100).as_str())];
        assert!(matches!(
            check_batch(std::iter::empty(), &[], &batch, LIMITS),
            Err(MembershipError::TooManyBytes { .. })
        ));
    }

    #[test]
    fn reserved_and_empty_keys_are_refused() {
        assert_eq!(
            check_batch(std::iter::empty(), &[], &[kv("m:proxy_addr", "x")], LIMITS),
            Err(MembershipError::ReservedKey {
                key: "m:proxy_addr".to_string()
            })
        );
        assert_eq!(
            check_batch(std::iter::empty(), &[], &[kv("", "x")], LIMITS),
            Err(MembershipError::EmptyKey)
        );
    }
}
