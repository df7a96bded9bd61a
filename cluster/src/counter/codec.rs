//! The text encoding of counter keys and values in chitchat's key-value state.
//!
//! | what | key | value |
//! |---|---|---|
//! | bucket count | `c:{limit_key}:{slot}` | `{bucket}:{count}` |
//! | demand (cost asked for in the last window, admitted or not) | `d:{limit_key}` | `{demand}` |
//! | in-flight (concurrency held now) | `f:{limit_key}` | `{in_flight}` |
//!
//! Numbers are lowercase base36 without leading zeros (canonical: one text per
//! number). The limit key is 1..=128 ASCII graphic bytes and may contain `:`; the slot
//! is parsed from after the *last* `:`, so keys never collide. The prefixes `c:`, `d:`
//! and `f:` are reserved in a node's key-value state (`a:` is [`super::archive`]'s); any other key is not ours and
//! decodes to `Ok(None)`. Decoding untrusted gossip never panics: garbage, a slot that
//! does not match its bucket (`slot != bucket mod R`), an absurd count or an oversize
//! key or value is a [`DecodeError`].

use super::{MAX_COUNT, MAX_LIMIT_KEY_BYTES, Windows};

/// Longest key we write or accept, in bytes: `c:` + limit key + `:` + slot (<= 3
/// base36 digits since R <= 8193, 4 allowed).
pub const MAX_KEY_BYTES: usize = 2 + MAX_LIMIT_KEY_BYTES + 1 + 4;

/// Longest value we write or accept, in bytes: two u64 in base36 (13 digits each) and
/// a separator, rounded up.
pub const MAX_VALUE_BYTES: usize = 32;

/// Longest base36 text of a u64.
const MAX_DIGITS: usize = 13;

/// Why a limit key cannot be gossiped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The limit key is empty.
    #[error("limit key is empty")]
    Empty,
    /// The limit key is longer than `MAX_LIMIT_KEY_BYTES`.
    #[error("limit key is {len} bytes, more than {MAX_LIMIT_KEY_BYTES}")]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The limit key holds a byte that is not ASCII graphic (`!`..=`~`).
    #[error("limit key has a byte that is not ASCII graphic at {index}")]
    BadByte {
        /// Byte offset of the first offending byte.
        index: usize,
    },
}

/// Why a gossiped key-value pair was rejected. Never a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The whole key is longer than `MAX_KEY_BYTES`.
    #[error("key is {len} bytes, more than {MAX_KEY_BYTES}")]
    KeyTooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The value is longer than `MAX_VALUE_BYTES`.
    #[error("value is {len} bytes, more than {MAX_VALUE_BYTES}")]
    ValueTooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The limit key inside the key is invalid.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A part is missing (e.g. no `:` before the slot or inside a bucket value).
    #[error("malformed: {0}")]
    Malformed(&'static str),
    /// A number is not canonical lowercase base36 or overflows a u64.
    #[error("{0} is not a canonical base36 u64")]
    Number(&'static str),
    /// The slot is not below the ring size R (the writer uses another window?).
    #[error("slot {slot} is not below the ring size {ring_slots}")]
    SlotOutOfRange {
        /// The slot read.
        slot: u64,
        /// R of our window.
        ring_slots: u32,
    },
    /// The bucket does not live in this slot (`slot != bucket mod R`).
    #[error("bucket {bucket} does not belong in slot {slot}")]
    SlotMismatch {
        /// The slot from the key.
        slot: u32,
        /// The bucket from the value.
        bucket: u64,
    },
    /// A count, demand or in-flight value above `MAX_COUNT`.
    #[error("{field} {value} is above {MAX_COUNT}")]
    Absurd {
        /// Which number.
        field: &'static str,
        /// The value read.
        value: u64,
    },
}

/// One decoded counter entry; borrows the limit key from the gossiped key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A node's count for one bucket of a limit key, published in ring slot `slot`.
    Slot {
        /// The limit key, e.g. `tenant:acme:tokens`.
        limit_key: &'a str,
        /// Ring slot, `bucket mod R`.
        slot: u32,
        /// Absolute bucket index (`unix_ms / bucket_ms`).
        bucket: u64,
        /// Cost charged to that bucket by that node (reservations + debts - refunds).
        count: u64,
    },
    /// A node's demand: cost asked for in the last window, admitted or not.
    Demand {
        /// The limit key.
        limit_key: &'a str,
        /// Cost units per window.
        demand: u64,
    },
    /// A node's in-flight count (concurrency limits).
    InFlight {
        /// The limit key.
        limit_key: &'a str,
        /// Requests (or cost units) held right now.
        in_flight: u64,
    },
    /// `lease`: the cut-off share the node's owner for this key told it and it
    /// still holds (what it may spend per window cut off from that owner),
    /// rounded up; so that an owner that forgot it can charge it.
    Held {
        /// The limit key.
        limit_key: &'a str,
        /// Cost units per window (slots for concurrency).
        held: u64,
    },
}

/// Checks that `limit_key` can be gossiped: 1..=128 ASCII graphic bytes.
pub fn validate_limit_key(limit_key: &str) -> Result<(), KeyError> {
    if limit_key.is_empty() {
        return Err(KeyError::Empty);
    }
    if limit_key.len() > MAX_LIMIT_KEY_BYTES {
        return Err(KeyError::TooLong {
            len: limit_key.len(),
        });
    }
    match limit_key.bytes().position(|c| !c.is_ascii_graphic()) {
        Some(index) => Err(KeyError::BadByte { index }),
        None => Ok(()),
    }
}

/// The key of ring slot `slot` of `limit_key` (which the caller validated).
pub fn slot_key(limit_key: &str, slot: u32) -> String {
    format!("c:{limit_key}:{}", base36(u64::from(slot)))
}

/// The key of `limit_key`'s demand value.
pub fn demand_key(limit_key: &str) -> String {
    format!("d:{limit_key}")
}

/// The key of `limit_key`'s in-flight value.
pub fn in_flight_key(limit_key: &str) -> String {
    format!("f:{limit_key}")
}

/// The key of `limit_key`'s held cut-off share.
pub fn held_key(limit_key: &str) -> String {
    format!("h:{limit_key}")
}

/// Every key a node may hold for `limit_key` under `windows` (its R slots, demand,
/// in-flight, held), e.g. to delete a retired key's ring once, after it went idle.
pub fn all_keys(limit_key: &str, windows: &Windows) -> Vec<String> {
    let mut keys: Vec<String> = (0..windows.of(limit_key).ring_slots())
        .map(|slot| slot_key(limit_key, slot))
        .collect();
    keys.push(demand_key(limit_key));
    keys.push(in_flight_key(limit_key));
    keys.push(held_key(limit_key));
    keys
}

/// The value of a bucket slot.
pub fn slot_value(bucket: u64, count: u64) -> String {
    debug_assert!(count <= MAX_COUNT);
    format!("{}:{}", base36(bucket), base36(count))
}

/// The value of a demand, in-flight or held entry.
pub fn scalar_value(n: u64) -> String {
    debug_assert!(n <= MAX_COUNT);
    base36(n)
}

/// Decodes one gossiped key-value pair. `Ok(None)`: the key is not a counter key (no
/// reserved prefix), e.g. membership metadata. Never panics.
pub fn decode<'a>(
    key: &'a str,
    value: &str,
    windows: &Windows,
) -> Result<Option<Decoded<'a>>, DecodeError> {
    let Some((kind, rest)) = key.split_at_checked(2) else {
        return Ok(None);
    };
    if !matches!(kind, "c:" | "d:" | "f:" | "h:") {
        return Ok(None);
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(DecodeError::KeyTooLong { len: key.len() });
    }
    if value.len() > MAX_VALUE_BYTES {
        return Err(DecodeError::ValueTooLong { len: value.len() });
    }
    let decoded = match kind {
        "c:" => decode_slot(rest, value, windows)?,
        "d:" => Decoded::Demand {
            limit_key: rest,
            demand: decode_scalar(rest, value, "demand")?,
        },
        "f:" => Decoded::InFlight {
            limit_key: rest,
            in_flight: decode_scalar(rest, value, "in_flight")?,
        },
        _ => Decoded::Held {
            limit_key: rest,
            held: decode_scalar(rest, value, "held")?,
        },
    };
    Ok(Some(decoded))
}

/// A scalar entry (demand, in-flight, held): `limit_key` checked, `value` one
/// bounded number.
fn decode_scalar(limit_key: &str, value: &str, what: &'static str) -> Result<u64, DecodeError> {
    validate_limit_key(limit_key)?;
    bounded(parse_base36(value, what)?, what)
}

/// `rest` is `{limit_key}:{slot}`, `value` is `{bucket}:{count}`.
fn decode_slot<'a>(
    rest: &'a str,
    value: &str,
    windows: &Windows,
) -> Result<Decoded<'a>, DecodeError> {
    let (limit_key, slot) = rest
        .rsplit_once(':')
        .ok_or(DecodeError::Malformed("no ':' before the slot"))?;
    validate_limit_key(limit_key)?;
    let window = windows.of(limit_key);
    let slot = parse_base36(slot, "slot")?;
    let ring_slots = window.ring_slots();
    let slot = u32::try_from(slot)
        .ok()
        .filter(|&s| s < ring_slots)
        .ok_or(DecodeError::SlotOutOfRange { slot, ring_slots })?;
    let (bucket, count) = value
        .split_once(':')
        .ok_or(DecodeError::Malformed("no ':' in the bucket value"))?;
    let bucket = parse_base36(bucket, "bucket")?;
    let count = bounded(parse_base36(count, "count")?, "count")?;
    if window.slot(bucket) != slot {
        return Err(DecodeError::SlotMismatch { slot, bucket });
    }
    Ok(Decoded::Slot {
        limit_key,
        slot,
        bucket,
        count,
    })
}

fn bounded(value: u64, field: &'static str) -> Result<u64, DecodeError> {
    if value > MAX_COUNT {
        return Err(DecodeError::Absurd { field, value });
    }
    Ok(value)
}

/// Lowercase base36 of `n`, no leading zeros (`0` is "0").
pub fn base36(mut n: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut buf = [0u8; MAX_DIGITS];
    let mut at = MAX_DIGITS;
    loop {
        at -= 1;
        buf[at] = DIGITS[(n % 36) as usize];
        n /= 36;
        if n == 0 {
            break;
        }
    }
    buf[at..].iter().map(|&c| char::from(c)).collect()
}

/// Parses canonical lowercase base36 (no sign, no leading zero, fits a u64).
pub(super) fn parse_base36(text: &str, field: &'static str) -> Result<u64, DecodeError> {
    let bad = DecodeError::Number(field);
    if text.is_empty() || text.len() > MAX_DIGITS || (text.len() > 1 && text.starts_with('0')) {
        return Err(bad);
    }
    text.bytes().try_fold(0u64, |acc, c| {
        let digit = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'z' => c - b'a' + 10,
            _ => return Err(bad.clone()),
        };
        acc.checked_mul(36)
            .and_then(|v| v.checked_add(u64::from(digit)))
            .ok_or_else(|| bad.clone())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counter::Window;

    fn window() -> Window {
        Window::try_new(60_000, 60).unwrap()
    }

    #[test]
    fn base36_round_trips_and_is_canonical() {
        for n in [0, 1, 35, 36, 1_700_000_000, MAX_COUNT, u64::MAX] {
            assert_eq!(parse_base36(&base36(n), "n"), Ok(n));
        }
        assert_eq!(base36(u64::MAX), "3w5e11264sgsf");
        for bad in ["", "01", "A", "-1", "3w5e11264sgsg", "zzzzzzzzzzzzzz", "1 "] {
            assert_eq!(
                parse_base36(bad, "n"),
                Err(DecodeError::Number("n")),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn keys_with_colons_do_not_collide() {
        let w = window();
        let k = slot_key("tenant:a:1", 2);
        assert_eq!(k, "c:tenant:a:1:2");
        let v = slot_value(124, 7);
        assert_eq!(v, "3g:7", "124 = 2 * 61 + 2 lives in slot 2");
        assert_eq!(
            decode(&k, &v, &w.into()),
            Ok(Some(Decoded::Slot {
                limit_key: "tenant:a:1",
                slot: 2,
                bucket: 124,
                count: 7
            }))
        );
        // "tenant:a" slot 1 * 36 + 2 would be "c:tenant:a:12", a different key.
        assert_ne!(slot_key("tenant:a", 38), k);
    }

    #[test]
    fn held_round_trips_and_rejects_garbage() {
        let w = window();
        assert_eq!(
            decode(&held_key("tenant:a:requests"), &scalar_value(14), &w.into()),
            Ok(Some(Decoded::Held {
                limit_key: "tenant:a:requests",
                held: 14
            }))
        );
        assert_eq!(
            decode("h:", "1", &w.into()),
            Err(DecodeError::Key(KeyError::Empty))
        );
        assert_eq!(
            decode("h:k", "01", &w.into()),
            Err(DecodeError::Number("held"))
        );
        assert!(all_keys("k", &w.into()).contains(&held_key("k")));
    }

    #[test]
    fn demand_and_in_flight_round_trip() {
        let w = window();
        assert_eq!(
            decode(&demand_key("k"), &scalar_value(500), &w.into()),
            Ok(Some(Decoded::Demand {
                limit_key: "k",
                demand: 500
            }))
        );
        assert_eq!(
            decode(&in_flight_key("k:x"), &scalar_value(3), &w.into()),
            Ok(Some(Decoded::InFlight {
                limit_key: "k:x",
                in_flight: 3
            }))
        );
    }

    #[test]
    fn foreign_keys_are_not_ours() {
        let w = window();
        for key in ["", "c", "proxy_addr", "x:y", "é"] {
            assert_eq!(decode(key, "anything", &w.into()), Ok(None), "{key:?}");
        }
    }

    #[test]
    fn garbage_is_rejected_with_a_reason() {
        let w = window();
        let long = "x".repeat(MAX_LIMIT_KEY_BYTES + 1);
        let absurd = format!("1:{}", base36(MAX_COUNT + 1));
        let cases: Vec<(String, &str, DecodeError)> = vec![
            (
                "c:k:1".into(),
                "2",
                DecodeError::Malformed("no ':' in the bucket value"),
            ),
            (
                "c:k".into(),
                "1:1",
                DecodeError::Malformed("no ':' before the slot"),
            ),
            ("c::1".into(), "1:1", DecodeError::Key(KeyError::Empty)),
            (
                "c:k:1".into(),
                "2:1",
                DecodeError::SlotMismatch { slot: 1, bucket: 2 },
            ),
            (
                "c:k:1p".into(),
                "1p:1",
                DecodeError::SlotOutOfRange {
                    slot: 61,
                    ring_slots: 61,
                },
            ),
            (
                "c:k:1".into(),
                &absurd,
                DecodeError::Absurd {
                    field: "count",
                    value: MAX_COUNT + 1,
                },
            ),
            ("d:".into(), "1", DecodeError::Key(KeyError::Empty)),
            (
                "d:a b".into(),
                "1",
                DecodeError::Key(KeyError::BadByte { index: 1 }),
            ),
            ("f:k".into(), "X1", DecodeError::Number("in_flight")),
            (
                format!("d:{long}"),
                "1",
                DecodeError::Key(KeyError::TooLong { len: 129 }),
            ),
            (
                format!("c:{long}{long}"),
                "1",
                DecodeError::KeyTooLong { len: 260 },
            ),
            (
                "d:k".into(),
                "1111111111111111111111111111111111",
                DecodeError::ValueTooLong { len: 34 },
            ),
        ];
        for (key, value, want) in cases {
            assert_eq!(
                decode(&key, value, &w.into()),
                Err(want),
                "{key:?} = {value:?}"
            );
        }
    }

    #[test]
    fn longest_key_and_value_fit_the_bounds() {
        let w = Window::try_new(8_191, 4_096).unwrap();
        let limit_key = "k".repeat(MAX_LIMIT_KEY_BYTES);
        let key = slot_key(&limit_key, w.ring_slots() - 1);
        assert!(key.len() <= MAX_KEY_BYTES);
        assert!(slot_value(u64::MAX, MAX_COUNT).len() <= MAX_VALUE_BYTES);
        // 61 slots, demand, in-flight, held.
        assert_eq!(all_keys("k", &window().into()).len(), 64);
    }
}
