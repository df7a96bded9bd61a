//! The sealed gossip datagram:
//!
//! ```text
//! "tg" | version 1 | key id (4) | sender (8) | number (8) | unix ms (8) | part (1) | tag (32) | payload
//! ```
//!
//! all integers big-endian, the tag HMAC-SHA256 over everything before it and
//! the payload. `part` is reserved (always 1). chitchat (patched,
//! vendor/chitchat/PATCH.md) leaves [`OVERHEAD`] bytes of every datagram to
//! the transport, so a sealed datagram never exceeds the largest UDP payload.

use super::keys::{ClusterKeys, Key, TAG_LEN};
use super::replay::{Replay, ReplayGuard};
use super::{Refusal, fresh};
use hmac::Mac;
use std::sync::Arc;

/// The largest UDP payload over IPv4.
pub const MAX_DATAGRAM: usize = 65_507;

const MAGIC: [u8; 2] = *b"tg";
const PART_WHOLE: u8 = 1;
const VERSION: u8 = 1;

/// Bytes before the tag.
pub const HEADER_LEN: usize = 32;

/// Bytes a seal adds to a payload.
pub const OVERHEAD: usize = HEADER_LEN + TAG_LEN;

// chitchat (patched) leaves this much of each datagram to the transport.
const _: () = assert!(OVERHEAD <= chitchat::TRANSPORT_RESERVED_BYTES);

/// Seals this node's datagrams: one sender id per process, numbers from 1.
#[derive(Debug)]
pub struct Sealer {
    keys: Arc<ClusterKeys>,
    sender: u64,
    next: u64,
}

impl Sealer {
    /// A sealer sending as `sender` (random per process start).
    pub fn new(keys: Arc<ClusterKeys>, sender: u64) -> Sealer {
        Sealer {
            keys,
            sender,
            next: 1,
        }
    }

    /// The datagram that carries `payload`, or `None` when it would be larger
    /// than [`MAX_DATAGRAM`] (chitchat leaves room for the seal: never).
    pub fn seal(&mut self, payload: &[u8], now_ms: u64) -> Option<Vec<u8>> {
        if payload.len() + OVERHEAD > MAX_DATAGRAM {
            return None;
        }
        let number = self.next;
        self.next += 1;
        Some(seal_part(
            self.keys.sending(),
            self.sender,
            number,
            now_ms,
            payload,
        ))
    }
}

fn seal_part(key: &Key, sender: u64, number: u64, now_ms: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(OVERHEAD + payload.len());
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&key.id());
    out.extend_from_slice(&sender.to_be_bytes());
    out.extend_from_slice(&number.to_be_bytes());
    out.extend_from_slice(&now_ms.to_be_bytes());
    out.push(PART_WHOLE);
    let mut tag = key.tagger();
    tag.update(&out);
    tag.update(payload);
    out.extend_from_slice(&tag.finalize().into_bytes());
    out.extend_from_slice(payload);
    out
}

/// A sealed datagram's header, read.
struct Header {
    key_id: [u8; 4],
    sender: u64,
    number: u64,
    stamp_ms: u64,
}

fn be_u64(bytes: &[u8]) -> u64 {
    let mut word = [0; 8];
    word.copy_from_slice(&bytes[..8]);
    u64::from_be_bytes(word)
}

fn header(datagram: &[u8]) -> Result<Header, Refusal> {
    if datagram.len() < OVERHEAD || datagram[..2] != MAGIC || datagram[2] != VERSION {
        return Err(Refusal::Malformed);
    }
    if datagram[31] != PART_WHOLE {
        return Err(Refusal::Malformed);
    }
    Ok(Header {
        key_id: [datagram[3], datagram[4], datagram[5], datagram[6]],
        sender: be_u64(&datagram[7..]),
        number: be_u64(&datagram[15..]),
        stamp_ms: be_u64(&datagram[23..]),
    })
}

/// Opens datagrams sealed by the cluster's nodes, each once.
#[derive(Debug)]
pub struct Opener {
    keys: Arc<ClusterKeys>,
    guard: ReplayGuard,
}

impl Opener {
    /// An opener accepting `keys`.
    pub fn new(keys: Arc<ClusterKeys>) -> Opener {
        Opener {
            keys,
            guard: ReplayGuard::default(),
        }
    }

    /// The payload `datagram` carries, or the refusal for anything not sealed
    /// by a holder of an accepted secret, stale or seen before (nothing is
    /// kept for a refused datagram: the tag is checked first).
    pub fn open<'a>(&mut self, datagram: &'a [u8], now_ms: u64) -> Result<&'a [u8], Refusal> {
        let head = header(datagram)?;
        let key = (self.keys.accepted(head.key_id)).ok_or(Refusal::UnknownKey)?;
        let (sealed, rest) = datagram.split_at(HEADER_LEN);
        let (tag, payload) = rest.split_at(TAG_LEN);
        let mut check = key.tagger();
        check.update(sealed);
        check.update(payload);
        check.verify_slice(tag).map_err(|_| Refusal::BadTag)?;
        if !fresh(head.stamp_ms, now_ms) {
            return Err(Refusal::Stale);
        }
        (self.guard)
            .accept(head.sender, head.number, now_ms)
            .map_err(refusal)?;
        Ok(payload)
    }
}

fn refusal(replay: Replay) -> Refusal {
    match replay {
        Replay::Seen => Refusal::Replayed,
        Replay::Full => Refusal::TooManySenders,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::keys::Channel;

    const NOW: u64 = 1_700_000_000_000;

    fn keys(secret: &str, accepted: &[&str]) -> Arc<ClusterKeys> {
        let accepted: Vec<String> = accepted.iter().map(|s| s.to_string()).collect();
        Arc::new(ClusterKeys::new("c", secret, &accepted, Channel::Gossip).unwrap())
    }

    const SECRET: &str = "cluster-secret-0123456789";

    #[test]
    fn a_sealed_datagram_opens_once() {
        let mut sealer = Sealer::new(keys(SECRET, &[]), 42);
        let mut opener = Opener::new(keys(SECRET, &[]));
        let sealed = sealer.seal(b"hello", NOW).unwrap();
        assert_eq!(opener.open(&sealed, NOW), Ok(&b"hello"[..]));
        assert_eq!(opener.open(&sealed, NOW), Err(Refusal::Replayed));
        let next = sealer.seal(b"again", NOW).unwrap();
        assert_eq!(opener.open(&next, NOW), Ok(&b"again"[..]));
    }

    #[test]
    fn forged_altered_foreign_and_stale_datagrams_are_refused() {
        let mut opener = Opener::new(keys(SECRET, &[]));
        let mut ours = Sealer::new(keys(SECRET, &[]), 1);
        let mut theirs = Sealer::new(keys("another-secret-0123456789", &[]), 2);
        let foreign = theirs.seal(b"join me", NOW).unwrap();
        assert_eq!(opener.open(&foreign, NOW), Err(Refusal::UnknownKey));
        let mut altered = ours.seal(b"usage 1", NOW).unwrap();
        *altered.last_mut().unwrap() = b'9';
        assert_eq!(opener.open(&altered, NOW), Err(Refusal::BadTag));
        let mut renamed = ours.seal(b"usage 1", NOW).unwrap();
        renamed[8] ^= 1; // another sender id under the same tag
        assert_eq!(opener.open(&renamed, NOW), Err(Refusal::BadTag));
        let old = ours.seal(b"usage 1", NOW - 31_000).unwrap();
        assert_eq!(opener.open(&old, NOW), Err(Refusal::Stale));
        let ahead = ours.seal(b"usage 1", NOW + 31_000).unwrap();
        assert_eq!(opener.open(&ahead, NOW), Err(Refusal::Stale));
        assert_eq!(opener.open(b"junk", NOW), Err(Refusal::Malformed));
        // chitchat's own, unsealed wire format.
        let mut plain = vec![0u8; 200];
        plain[..3].copy_from_slice(&[0x53, 0xb0, 1]);
        assert_eq!(opener.open(&plain, NOW), Err(Refusal::Malformed));
        // None of the refused ones used up a number.
        let good = ours.seal(b"usage 2", NOW).unwrap();
        assert_eq!(opener.open(&good, NOW), Ok(&b"usage 2"[..]));
    }

    #[test]
    fn rotation_accepts_the_listed_secret() {
        let new = "the-next-secret-0123456789";
        let mut rotated = Sealer::new(keys(new, &[SECRET]), 9);
        let mut old_node = Opener::new(keys(SECRET, &[new]));
        let sealed = rotated.seal(b"hi", NOW).unwrap();
        assert_eq!(old_node.open(&sealed, NOW), Ok(&b"hi"[..]));
    }

    #[test]
    fn the_largest_delta_chitchat_sends_still_fits_sealed() {
        let mut sealer = Sealer::new(keys(SECRET, &[]), 3);
        let full = vec![0u8; MAX_DATAGRAM - chitchat::TRANSPORT_RESERVED_BYTES];
        assert!(
            sealer
                .seal(&full, NOW)
                .is_some_and(|d| d.len() <= MAX_DATAGRAM)
        );
        assert!(sealer.seal(&vec![0u8; MAX_DATAGRAM], NOW).is_none());
    }
}
