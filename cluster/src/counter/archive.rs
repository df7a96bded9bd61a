//! Departed members' usage, republished by the members that still hold it.
//!
//! chitchat forgets a departed member `dead_node_grace` after it died (or was
//! superseded by a restart). What it spent may count longer than that: a day
//! window's keys count for a day. A node that held the member's registers
//! keeps them until they have left their window ([`super::ClusterUsage`]), but
//! a node started after the member was forgotten never saw them. So every node
//! publishes, per member chitchat no longer holds, the buckets of each of its
//! keys that still count, and a node that reads them for a member it does not
//! know adopts them ([`super::ClusterUsage::adopt`]), and publishes them in
//! turn. The usage outlives its node while one member that knows it runs.
//!
//! | key | value |
//! |---|---|
//! | `a:{member} {limit_key}` | `{bucket}:{count},{bucket}:{count},...` (ascending buckets) |
//!
//! `member` is the departed incarnation's id as the replica names it
//! (`node-1/1733000000000@10.0.0.1:7946`: printable ASCII, no space); the
//! space ends it, as no member id or limit key holds one. Buckets are dated on
//! the publisher's clock, already moved later by the member's clock lag as the
//! publisher bounded it, and at most [`MAX_ARCHIVED_BUCKETS`] of them: a longer
//! list is merged into groups whose cost is dated at the group's last bucket,
//! which keeps it counting at least as long as the provider counts it (never
//! less: a bucket only moves later). Decoding untrusted gossip never panics.

use super::codec::{DecodeError, base36, parse_base36, validate_limit_key};
use super::{MAX_COUNT, Windows};

/// The prefix of archive keys in a node's key-value state.
pub const ARCHIVE_PREFIX: &str = "a:";

/// Most buckets one archived key carries (a day of hourly buckets fits).
pub const MAX_ARCHIVED_BUCKETS: usize = 32;

/// Longest member id accepted in an archive key, in bytes (a node id of 128
/// bytes, a generation and an IPv6 socket address).
pub const MAX_MEMBER_BYTES: usize = 200;

/// Longest archive value written or accepted: [`MAX_ARCHIVED_BUCKETS`] pairs of
/// two 13-digit numbers, with separators.
pub const MAX_ARCHIVE_VALUE_BYTES: usize = MAX_ARCHIVED_BUCKETS * 28;

/// One archived key: a departed member's usage of `limit_key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archived<'a> {
    /// The departed member's id.
    pub member: &'a str,
    /// The limit key it spent on.
    pub limit_key: &'a str,
    /// `(bucket, count)`, ascending by bucket, each bucket once.
    pub buckets: Vec<(u64, u64)>,
}

/// The key archiving `member`'s usage of `limit_key`.
pub fn archive_key(member: &str, limit_key: &str) -> String {
    format!("{ARCHIVE_PREFIX}{member} {limit_key}")
}

/// The value of an archived key: `buckets` (ascending) merged down to
/// [`MAX_ARCHIVED_BUCKETS`] if longer, each group's cost dated at its last
/// bucket.
pub fn archive_value(buckets: &[(u64, u64)]) -> String {
    let group = buckets.len().div_ceil(MAX_ARCHIVED_BUCKETS).max(1);
    let merged = buckets.chunks(group).map(|chunk| {
        let last = chunk[chunk.len() - 1].0;
        let cost = (chunk.iter()).fold(0u64, |sum, &(_, c)| sum.saturating_add(c));
        (last, cost.min(MAX_COUNT))
    });
    let pairs: Vec<String> = merged
        .map(|(bucket, count)| format!("{}:{}", base36(bucket), base36(count)))
        .collect();
    pairs.join(",")
}

/// Decodes one gossiped key-value pair. `Ok(None)`: not an archive key. Never
/// panics; a bucket beyond the key's ring (a window other than ours) is refused.
pub fn decode_archive<'a>(
    key: &'a str,
    value: &str,
    windows: &Windows,
) -> Result<Option<Archived<'a>>, DecodeError> {
    let Some(rest) = key.strip_prefix(ARCHIVE_PREFIX) else {
        return Ok(None);
    };
    let (member, limit_key) = rest
        .split_once(' ')
        .ok_or(DecodeError::Malformed("no space after the member"))?;
    let member_ok = !member.is_empty()
        && member.len() <= MAX_MEMBER_BYTES
        && member.bytes().all(|b| b.is_ascii_graphic());
    if !member_ok {
        return Err(DecodeError::Malformed("member id"));
    }
    validate_limit_key(limit_key)?;
    if value.len() > MAX_ARCHIVE_VALUE_BYTES {
        return Err(DecodeError::ValueTooLong { len: value.len() });
    }
    let ring = u64::from(windows.of(limit_key).ring_slots());
    let mut buckets: Vec<(u64, u64)> = Vec::new();
    for pair in value.split(',') {
        let (bucket, count) = pair
            .split_once(':')
            .ok_or(DecodeError::Malformed("no ':' in an archived bucket"))?;
        let bucket = parse_base36(bucket, "bucket")?;
        let count = parse_base36(count, "count")?;
        if count > MAX_COUNT {
            return Err(DecodeError::Absurd {
                field: "count",
                value: count,
            });
        }
        if buckets.last().is_some_and(|&(last, _)| last >= bucket) {
            return Err(DecodeError::Malformed("archived buckets not ascending"));
        }
        buckets.push((bucket, count));
    }
    let (first, last) = (buckets[0].0, buckets[buckets.len() - 1].0);
    if buckets.len() > MAX_ARCHIVED_BUCKETS || last - first >= ring {
        return Err(DecodeError::Malformed(
            "archived buckets span more than the ring",
        ));
    }
    Ok(Some(Archived {
        member,
        limit_key,
        buckets,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counter::Window;

    fn windows() -> Windows {
        Windows::new(
            Window::try_new(60_000, 60).unwrap(),
            Window::try_new(86_400_000, 24).unwrap(),
        )
    }

    const MEMBER: &str = "node-1/1733000000000@10.0.0.1:7946";
    const DAY_KEY: &str = "tenant:acme:requests_per_day";

    #[test]
    fn an_archived_key_round_trips() {
        let buckets = vec![(481_000, 3), (481_002, 40), (481_010, 1)];
        let key = archive_key(MEMBER, DAY_KEY);
        let value = archive_value(&buckets);
        let decoded = decode_archive(&key, &value, &windows()).unwrap().unwrap();
        assert_eq!(decoded.member, MEMBER);
        assert_eq!(decoded.limit_key, DAY_KEY);
        assert_eq!(decoded.buckets, buckets);
    }

    #[test]
    fn a_long_list_is_merged_later_never_earlier_and_keeps_its_total() {
        // A base-window key in 60 buckets of 1 s, all 61 slots counting.
        let buckets: Vec<(u64, u64)> = (0..61).map(|i| (1_000 + i, i + 1)).collect();
        let value = archive_value(&buckets);
        let key = archive_key(MEMBER, "tenant:acme:requests");
        let decoded = decode_archive(&key, &value, &windows()).unwrap().unwrap();
        assert!(decoded.buckets.len() <= MAX_ARCHIVED_BUCKETS);
        let total = |b: &[(u64, u64)]| b.iter().map(|&(_, c)| c).sum::<u64>();
        assert_eq!(total(&decoded.buckets), total(&buckets));
        // Each original bucket's cost sits at a bucket no earlier than its own.
        let mut merged = decoded.buckets.iter();
        let mut group = merged.next().unwrap();
        for &(bucket, _) in &buckets {
            while bucket > group.0 {
                group = merged.next().unwrap();
            }
        }
        assert_eq!(decoded.buckets.last().unwrap().0, 1_060);
    }

    #[test]
    fn hostile_archive_entries_are_refused_not_panicked_on() {
        let w = windows();
        let key = archive_key(MEMBER, DAY_KEY);
        let bad = [
            (key.as_str(), ""),
            (key.as_str(), "1:2,"),
            (key.as_str(), "2:1,1:1"),
            (key.as_str(), "1:1,1:1"),
            (key.as_str(), "1:zzzzzzzzzzzzzz"),
            (key.as_str(), "1:-1"),
            // Beyond the day ring (25 slots: buckets 1 and 26 cannot both count).
            (key.as_str(), "1:1,q:1"),
            ("a:nospace", "1:1"),
            ("a: tenant:acme:requests", "1:1"),
            ("a:node-1 ", "1:1"),
        ];
        for (key, value) in bad {
            assert!(decode_archive(key, value, &w).is_err(), "{key} = {value}");
        }
        // More buckets than an archive carries, within a minute key's ring.
        let long: Vec<String> = (1..=MAX_ARCHIVED_BUCKETS as u64 + 1)
            .map(|b| format!("{}:1", base36(b)))
            .collect();
        let minute = archive_key(MEMBER, "tenant:acme:requests");
        assert!(decode_archive(&minute, &long.join(","), &w).is_err());
        // The same list one shorter is accepted.
        let fits = long[1..].join(",");
        assert!(decode_archive(&minute, &fits, &w).unwrap().is_some());
        assert_eq!(
            decode_archive("c:tenant:acme:requests:1", "1:1", &w),
            Ok(None)
        );
    }
}
