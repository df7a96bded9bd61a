//! Keys: one per channel, derived from the cluster secret and the cluster id,
//! so a gossip tag is never a valid RPC tag and two clusters sharing a secret
//! by mistake still cannot talk. A node seals with its sending secret and
//! accepts that one and up to [`MAX_ACCEPTED`] others: rotation adds the new
//! secret as accepted everywhere, then sends with it everywhere, then drops the
//! old one, with every pair of nodes agreeing on a key at each step.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// HMAC-SHA256.
pub type Tagger = Hmac<Sha256>;

/// Length of a tag in bytes.
pub const TAG_LEN: usize = 32;

/// Most secrets accepted besides the sending one.
pub const MAX_ACCEPTED: usize = 3;

/// Shortest secret accepted, in bytes.
pub const MIN_SECRET_LEN: usize = 16;

/// The two channels keys are derived for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// UDP gossip datagrams.
    Gossip,
    /// Internal RPC requests and answers.
    Rpc,
}

impl Channel {
    fn label(self) -> &'static str {
        match self {
            Channel::Gossip => "gossip",
            Channel::Rpc => "rpc",
        }
    }
}

/// Why keys could not be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    /// A secret shorter than [`MIN_SECRET_LEN`].
    #[error("a cluster secret must be at least {MIN_SECRET_LEN} bytes")]
    TooShort,
    /// More than [`MAX_ACCEPTED`] extra secrets.
    #[error("at most {MAX_ACCEPTED} accepted secrets besides the sending one")]
    TooMany,
}

/// One derived key: its id (which a sealed message names, so the receiver
/// tries one key, not all) and the keyed HMAC, cloned for each use.
#[derive(Clone)]
pub struct Key {
    id: [u8; 4],
    mac: Tagger,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({})", hex(&self.id))
    }
}

impl Key {
    /// HMAC-SHA256(secret, "tollgate cluster key v1" | channel | cluster id).
    fn derive(secret: &str, cluster_id: &str, channel: Channel) -> Key {
        let mut derive = tagger(secret.as_bytes());
        for part in ["tollgate cluster key v1", channel.label(), cluster_id] {
            derive.update(part.as_bytes());
            derive.update(&[0]);
        }
        let key = derive.finalize().into_bytes();
        let digest = Sha256::digest(key);
        Key {
            id: [digest[0], digest[1], digest[2], digest[3]],
            mac: tagger(&key),
        }
    }

    /// Its id.
    pub fn id(&self) -> [u8; 4] {
        self.id
    }

    /// A fresh HMAC under this key.
    pub fn tagger(&self) -> Tagger {
        self.mac.clone()
    }
}

fn tagger(key: &[u8]) -> Tagger {
    // HMAC takes a key of any length.
    match Tagger::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC accepts keys of every length"),
    }
}

/// The keys of one channel: the sending key, and every key accepted (the
/// sending one first).
#[derive(Debug, Clone)]
pub struct ClusterKeys {
    accepted: Vec<Key>,
}

impl ClusterKeys {
    /// Keys for `channel` of `cluster_id`, sending with `secret` and accepting
    /// it and each of `also_accepted`.
    pub fn new(
        cluster_id: &str,
        secret: &str,
        also_accepted: &[String],
        channel: Channel,
    ) -> Result<ClusterKeys, KeyError> {
        if also_accepted.len() > MAX_ACCEPTED {
            return Err(KeyError::TooMany);
        }
        let secrets = std::iter::once(secret).chain(also_accepted.iter().map(String::as_str));
        let mut accepted = Vec::new();
        for secret in secrets {
            if secret.len() < MIN_SECRET_LEN {
                return Err(KeyError::TooShort);
            }
            accepted.push(Key::derive(secret, cluster_id, channel));
        }
        Ok(ClusterKeys { accepted })
    }

    /// The key messages are sealed with.
    pub fn sending(&self) -> &Key {
        &self.accepted[0]
    }

    /// The accepted key named `id`.
    pub fn accepted(&self, id: [u8; 4]) -> Option<&Key> {
        self.accepted.iter().find(|k| k.id == id)
    }
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// `text` as hex bytes, exactly `N` of them.
pub(crate) fn unhex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let mut out = [0; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "first-secret-0123456789";
    const B: &str = "second-secret-0123456789";

    #[test]
    fn keys_differ_by_secret_cluster_and_channel() {
        let id = |secret, cluster, channel| {
            let keys = ClusterKeys::new(cluster, secret, &[], channel).unwrap();
            keys.sending().id()
        };
        let base = id(A, "c1", Channel::Gossip);
        assert_eq!(base, id(A, "c1", Channel::Gossip), "derivation is stable");
        assert_ne!(base, id(B, "c1", Channel::Gossip));
        assert_ne!(base, id(A, "c2", Channel::Gossip));
        assert_ne!(base, id(A, "c1", Channel::Rpc));
    }

    #[test]
    fn a_node_accepts_its_sending_key_and_the_listed_ones_only() {
        let keys = ClusterKeys::new("c", A, &[B.into()], Channel::Rpc).unwrap();
        let b = ClusterKeys::new("c", B, &[], Channel::Rpc).unwrap();
        let other = ClusterKeys::new("c", "a-third-secret-0123456", &[], Channel::Rpc).unwrap();
        assert!(keys.accepted(keys.sending().id()).is_some());
        assert!(keys.accepted(b.sending().id()).is_some());
        assert!(keys.accepted(other.sending().id()).is_none());
    }

    #[test]
    fn short_secrets_and_long_lists_are_refused() {
        let short = ClusterKeys::new("c", "short", &[], Channel::Gossip);
        assert_eq!(short.unwrap_err(), KeyError::TooShort);
        let many = vec![A.to_string(); MAX_ACCEPTED + 1];
        let refused = ClusterKeys::new("c", A, &many, Channel::Gossip);
        assert_eq!(refused.unwrap_err(), KeyError::TooMany);
    }

    #[test]
    fn hex_round_trips_and_refuses_bad_lengths() {
        assert_eq!(unhex::<2>(&hex(&[0xab, 0x01])), Some([0xab, 0x01]));
        assert_eq!(unhex::<2>("ab0"), None);
        assert_eq!(unhex::<2>("zz01"), None);
    }
}
