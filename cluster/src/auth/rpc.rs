//! The internal RPC's tags. A request carries, in [`AUTH_HEADER`],
//!
//! ```text
//! v1 <key id hex> <sender hex> <number> <unix ms> <tag hex>
//! ```
//!
//! the tag an HMAC-SHA256 over those fields, the address the request is for
//! (the receiver's announced RPC address: a request captured on its way to
//! one node is refused by every other), the path, the headers that carry
//! meaning ([`is_signed`]: the tenant's credentials and every `x-` header) and
//! the body. The answer carries the HMAC, under the same key, of the request's
//! tag, its status and (for answers read whole) its body: an answer cannot be
//! forged, altered or given to another request. No secret travels.

use super::keys::{ClusterKeys, Key, TAG_LEN, Tagger, hex, unhex};
use super::replay::{Replay, ReplayGuard};
use super::{Refusal, fresh};
use hmac::Mac;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The header carrying a request's or an answer's tag.
pub const AUTH_HEADER: &str = "x-tollgate-auth";

/// Whether a header's value is covered by a request's tag (names in lower
/// case, as HTTP libraries give them): what the receiver reads to decide, not
/// what a connection or a client library adds on the way.
pub fn is_signed(name: &str) -> bool {
    name != AUTH_HEADER
        && (name == "authorization"
            || name.starts_with("x-")
            || name.starts_with("anthropic-")
            || name.starts_with("openai-"))
}

/// A request's tag and the key it was made with, which its answer's tag uses.
#[derive(Debug, Clone)]
pub struct RequestTag {
    key: Key,
    tag: [u8; TAG_LEN],
}

/// The fields of a request's auth header.
struct Stamp {
    key_id: [u8; 4],
    sender: u64,
    number: u64,
    unix_ms: u64,
}

impl Stamp {
    fn header(&self, tag: &[u8]) -> String {
        format!(
            "v1 {} {:016x} {} {} {}",
            hex(&self.key_id),
            self.sender,
            self.number,
            self.unix_ms,
            hex(tag)
        )
    }

    fn parse(value: &[u8]) -> Option<(Stamp, [u8; TAG_LEN])> {
        let text = std::str::from_utf8(value).ok()?;
        let mut fields = text.split(' ');
        if fields.next()? != "v1" {
            return None;
        }
        let key_id = unhex::<4>(fields.next()?)?;
        let sender = u64::from_str_radix(fields.next()?, 16).ok()?;
        let number = fields.next()?.parse().ok()?;
        let unix_ms = fields.next()?.parse().ok()?;
        let tag = unhex::<TAG_LEN>(fields.next()?)?;
        if fields.next().is_some() {
            return None;
        }
        let stamp = Stamp {
            key_id,
            sender,
            number,
            unix_ms,
        };
        Some((stamp, tag))
    }
}

/// What a request's tag covers besides its stamp.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The receiver's announced RPC address (`host:port`).
    pub to: &'a str,
    /// The path.
    pub path: &'a str,
    /// Every header as (lower-case name, value); [`is_signed`] picks.
    pub headers: &'a [(&'a str, &'a [u8])],
    /// The body.
    pub body: &'a [u8],
}

/// The tag of a request: its stamp, destination, path, signed headers (sorted
/// by name, each name's values in order) and body.
fn request_tag(key: &Key, stamp: &Stamp, request: &Request<'_>) -> Tagger {
    let Request {
        to,
        path,
        headers,
        body,
    } = *request;
    let mut tag = key.tagger();
    tag.update(b"tollgate rpc request v1\n");
    tag.update(&stamp.key_id);
    tag.update(&stamp.sender.to_be_bytes());
    tag.update(&stamp.number.to_be_bytes());
    tag.update(&stamp.unix_ms.to_be_bytes());
    tag.update(to.as_bytes());
    tag.update(b"\n");
    tag.update(path.as_bytes());
    tag.update(b"\n");
    let mut signed: Vec<&(&str, &[u8])> = headers.iter().filter(|(n, _)| is_signed(n)).collect();
    signed.sort_by_key(|(name, _)| *name);
    for (name, value) in signed {
        tag.update(name.as_bytes());
        tag.update(b":");
        tag.update(value);
        tag.update(b"\n");
    }
    tag.update(b"\n");
    tag.update(body);
    tag
}

/// The tag of an answer to `request`.
fn answer_tag(request: &RequestTag, status: u16, body: Option<&[u8]>) -> Tagger {
    let mut tag = request.key.tagger();
    tag.update(b"tollgate rpc answer v1\n");
    tag.update(&request.tag);
    tag.update(&status.to_be_bytes());
    match body {
        Some(body) => {
            tag.update(&[1]);
            tag.update(body);
        }
        None => tag.update(&[0]),
    }
    tag
}

/// Signs this node's requests: one sender id per process, numbers from 1.
#[derive(Debug)]
pub struct RpcSigner {
    keys: ClusterKeys,
    sender: u64,
    next: AtomicU64,
}

impl RpcSigner {
    /// A signer with the RPC channel's `keys`.
    pub fn new(keys: ClusterKeys) -> RpcSigner {
        RpcSigner {
            keys,
            sender: rand::random(),
            next: AtomicU64::new(1),
        }
    }

    /// The [`AUTH_HEADER`] value for `request` at `unix_ms`, and the tag its
    /// answer is checked against.
    pub fn sign(&self, request: &Request<'_>, unix_ms: u64) -> (String, RequestTag) {
        let key = self.keys.sending();
        let stamp = Stamp {
            key_id: key.id(),
            sender: self.sender,
            number: self.next.fetch_add(1, Ordering::Relaxed),
            unix_ms,
        };
        let tag: [u8; TAG_LEN] = request_tag(key, &stamp, request)
            .finalize()
            .into_bytes()
            .into();
        let request = RequestTag {
            key: key.clone(),
            tag,
        };
        (stamp.header(&tag), request)
    }
}

impl RequestTag {
    /// Whether `header` (the answer's [`AUTH_HEADER`]) is the tag of an answer
    /// to this request with `status` and `body` (`None`: an answer streamed,
    /// tagged on its status alone).
    pub fn answered_by(&self, header: Option<&[u8]>, status: u16, body: Option<&[u8]>) -> bool {
        let Some(tag) = header
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(unhex::<TAG_LEN>)
        else {
            return false;
        };
        answer_tag(self, status, body).verify_slice(&tag).is_ok()
    }

    /// The [`AUTH_HEADER`] value of the answer to this request with `status`
    /// and `body` (`None`: streamed, tagged on its status alone).
    pub fn answer(&self, status: u16, body: Option<&[u8]>) -> String {
        hex(&answer_tag(self, status, body).finalize().into_bytes())
    }
}

/// Checks requests: tag, freshness, each once.
#[derive(Debug)]
pub struct RpcVerifier {
    keys: ClusterKeys,
    guard: Mutex<ReplayGuard>,
}

impl RpcVerifier {
    /// A verifier accepting the RPC channel's `keys`.
    pub fn new(keys: ClusterKeys) -> RpcVerifier {
        RpcVerifier {
            keys,
            guard: Mutex::new(ReplayGuard::default()),
        }
    }

    /// What can be refused from `auth` alone, before the body is read: a
    /// header of another format, another secret's key, a stamp outside the
    /// clock skew, a number already seen. A gate calls it first, so a request
    /// that fails it costs no body buffered; [`Self::verify`] decides.
    pub fn precheck(&self, auth: Option<&[u8]>, now_ms: u64) -> Result<(), Refusal> {
        let (stamp, _) = auth.and_then(Stamp::parse).ok_or(Refusal::Malformed)?;
        (self.keys.accepted(stamp.key_id)).ok_or(Refusal::UnknownKey)?;
        if !fresh(stamp.unix_ms, now_ms) {
            return Err(Refusal::Stale);
        }
        let guard = self
            .guard
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        (guard.check(stamp.sender, stamp.number)).map_err(|_| Refusal::Replayed)
    }

    /// The request's tag when `auth` (its [`AUTH_HEADER`]) is a valid tag of
    /// `request` under an accepted key, within the clock skew of `now_ms`, and
    /// not seen before; else why not.
    pub fn verify(
        &self,
        auth: Option<&[u8]>,
        request: &Request<'_>,
        now_ms: u64,
    ) -> Result<RequestTag, Refusal> {
        let (stamp, tag) = auth.and_then(Stamp::parse).ok_or(Refusal::Malformed)?;
        let key = (self.keys.accepted(stamp.key_id)).ok_or(Refusal::UnknownKey)?;
        (request_tag(key, &stamp, request))
            .verify_slice(&tag)
            .map_err(|_| Refusal::BadTag)?;
        if !fresh(stamp.unix_ms, now_ms) {
            return Err(Refusal::Stale);
        }
        let mut guard = self
            .guard
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        guard
            .accept(stamp.sender, stamp.number, now_ms)
            .map_err(|replay| match replay {
                Replay::Seen => Refusal::Replayed,
                Replay::Full => Refusal::TooManySenders,
            })?;
        Ok(RequestTag {
            key: key.clone(),
            tag,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::keys::Channel;

    const NOW: u64 = 1_700_000_000_000;
    const SECRET: &str = "cluster-secret-0123456789";
    const OWNER: &str = "10.0.0.1:7300";

    fn keys(secret: &str) -> ClusterKeys {
        ClusterKeys::new("c", secret, &[], Channel::Rpc).unwrap()
    }

    const HEADERS: &[(&str, &[u8])] = &[
        ("authorization", b"Bearer tenant-key"),
        ("x-tollgate-cluster-id", b"c"),
        ("user-agent", b"reqwest"),
    ];

    fn request<'a>(
        to: &'a str,
        path: &'a str,
        headers: &'a [(&'a str, &'a [u8])],
        body: &'a [u8],
    ) -> Request<'a> {
        Request {
            to,
            path,
            headers,
            body,
        }
    }

    /// A request to the owner on `/p` with [`HEADERS`].
    fn to_owner(body: &[u8]) -> Request<'_> {
        request(OWNER, "/p", HEADERS, body)
    }

    #[test]
    fn a_signed_request_verifies_once_and_its_answer_binds_to_it() {
        let signer = RpcSigner::new(keys(SECRET));
        let verifier = RpcVerifier::new(keys(SECRET));
        let (auth, sent) = signer.sign(&to_owner(b"{}"), NOW);
        let got = verifier.verify(Some(auth.as_bytes()), &to_owner(b"{}"), NOW);
        let got = got.unwrap();
        let again = verifier.verify(Some(auth.as_bytes()), &to_owner(b"{}"), NOW);
        assert_eq!(again.unwrap_err(), Refusal::Replayed);
        assert_eq!(
            verifier.precheck(Some(auth.as_bytes()), NOW),
            Err(Refusal::Replayed),
            "a replay is refused before its body is read"
        );
        let answer = got.answer(200, Some(b"[1]"));
        assert!(sent.answered_by(Some(answer.as_bytes()), 200, Some(b"[1]")));
        assert!(!sent.answered_by(Some(answer.as_bytes()), 200, Some(b"[2]")));
        assert!(!sent.answered_by(Some(answer.as_bytes()), 500, Some(b"[1]")));
        assert!(!sent.answered_by(None, 200, Some(b"[1]")));
        let (_, other) = signer.sign(&to_owner(b"{}"), NOW);
        assert!(
            !other.answered_by(Some(answer.as_bytes()), 200, Some(b"[1]")),
            "another request's answer"
        );
    }

    #[test]
    fn what_the_tag_covers_cannot_change() {
        let signer = RpcSigner::new(keys(SECRET));
        let verifier = RpcVerifier::new(keys(SECRET));
        let check = |received: Request<'_>| {
            let (auth, _) = signer.sign(&to_owner(b"{}"), NOW);
            (verifier.verify(Some(auth.as_bytes()), &received, NOW)).map(|_| ())
        };
        let bad = Err(Refusal::BadTag);
        assert_eq!(
            check(request("10.0.0.2:7300", "/p", HEADERS, b"{}")),
            bad,
            "another node"
        );
        assert_eq!(check(request(OWNER, "/q", HEADERS, b"{}")), bad);
        assert_eq!(check(to_owner(b"{ }")), bad);
        let other_tenant: &[(&str, &[u8])] =
            &[("authorization", b"Bearer another"), HEADERS[1], HEADERS[2]];
        assert_eq!(check(request(OWNER, "/p", other_tenant, b"{}")), bad);
        let added: &[(&str, &[u8])] = &[
            HEADERS[0],
            HEADERS[1],
            HEADERS[2],
            ("x-tollgate-priority", b"high"),
        ];
        assert_eq!(check(request(OWNER, "/p", added, b"{}")), bad);
        // What a connection adds is not covered, nor the order of headers.
        let agent: &[(&str, &[u8])] = &[HEADERS[0], HEADERS[1], ("user-agent", b"curl")];
        assert_eq!(check(request(OWNER, "/p", agent, b"{}")), Ok(()));
        let reordered: &[(&str, &[u8])] = &[HEADERS[2], HEADERS[1], HEADERS[0]];
        assert_eq!(check(request(OWNER, "/p", reordered, b"{}")), Ok(()));
    }

    #[test]
    fn wrong_missing_stale_and_foreign_tags_are_refused() {
        let verifier = RpcVerifier::new(keys(SECRET));
        let verify = |auth: Option<&str>, now: u64| {
            let auth = auth.map(str::as_bytes);
            (verifier.verify(auth, &to_owner(b""), now)).map(|_| ())
        };
        assert_eq!(verify(None, NOW), Err(Refusal::Malformed));
        assert_eq!(verifier.precheck(None, NOW), Err(Refusal::Malformed));
        assert_eq!(
            verify(Some(SECRET), NOW),
            Err(Refusal::Malformed),
            "the plain secret in the tag's place"
        );
        let stranger = RpcSigner::new(keys("not-the-secret-0123456789"));
        let (auth, _) = stranger.sign(&to_owner(b""), NOW);
        assert_eq!(verify(Some(&auth), NOW), Err(Refusal::UnknownKey));
        let precheck = verifier.precheck(Some(auth.as_bytes()), NOW);
        assert_eq!(precheck, Err(Refusal::UnknownKey), "before the body");
        let ours = RpcSigner::new(keys(SECRET));
        let (auth, _) = ours.sign(&to_owner(b""), NOW);
        assert_eq!(verify(Some(&auth), NOW + 31_000), Err(Refusal::Stale));
        let precheck = verifier.precheck(Some(auth.as_bytes()), NOW + 31_000);
        assert_eq!(precheck, Err(Refusal::Stale), "before the body");
        assert_eq!(verifier.precheck(Some(auth.as_bytes()), NOW), Ok(()));
        let mut forged = auth.clone();
        let other = if auth.ends_with("00") { "01" } else { "00" };
        forged.replace_range(forged.len() - 2.., other);
        assert_eq!(verify(Some(&forged), NOW), Err(Refusal::BadTag));
        assert_eq!(verify(Some(&auth), NOW), Ok(()), "refusals used up nothing");
    }
}
