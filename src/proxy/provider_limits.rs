//! What a provider's answer says about its own limits, read as ground truth:
//! `retry-after` on a 429, and the rate-limit headers of every answer, OpenAI's
//! (`x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, resets as
//! durations) and Anthropic's (`anthropic-ratelimit-{requests,input-tokens,
//! output-tokens}-{limit,remaining,reset}`, resets as RFC 3339 instants).
//! When the provider says a window is used up, the upstream cools down, even if
//! the gateway's own figures disagree (another consumer on the same account).

use crate::actor::scope::Cost;
use axum::http::{HeaderMap, HeaderName};
use std::time::{Duration, SystemTime};

/// Longest cool-down an upstream's `retry-after` may impose.
pub(super) const MAX_COOLDOWN: Duration = Duration::from_secs(120);

/// Anthropic's limits as `(limit, remaining, reset)` header names, with what a
/// request costs each: `requests`, `input-tokens` (ITPM), `output-tokens`
/// (OTPM, charged `max_tokens` on arrival). Its `tokens` headers repeat
/// whichever of the two is tighter, without saying which: not read.
const ANTHROPIC: [([HeaderName; 3], Unit); 3] = [
    (names("requests"), Unit::Request),
    (names("input-tokens"), Unit::Input),
    (names("output-tokens"), Unit::Output),
];

/// What one request costs a limit.
#[derive(Clone, Copy)]
enum Unit {
    Request,
    Input,
    Output,
}

impl Unit {
    fn of(self, cost: Cost) -> u64 {
        match self {
            Unit::Request => 1,
            Unit::Input => cost.input,
            Unit::Output => cost.on(crate::actor::Dimension::OutputTokens),
        }
        .max(1)
    }
}

const fn names(dimension: &'static str) -> [HeaderName; 3] {
    // Literal names, checked at compile time (`from_static` panics in a const
    // on an invalid one).
    match dimension.as_bytes() {
        b"requests" => [
            HeaderName::from_static("anthropic-ratelimit-requests-limit"),
            HeaderName::from_static("anthropic-ratelimit-requests-remaining"),
            HeaderName::from_static("anthropic-ratelimit-requests-reset"),
        ],
        b"input-tokens" => [
            HeaderName::from_static("anthropic-ratelimit-input-tokens-limit"),
            HeaderName::from_static("anthropic-ratelimit-input-tokens-remaining"),
            HeaderName::from_static("anthropic-ratelimit-input-tokens-reset"),
        ],
        _ => [
            HeaderName::from_static("anthropic-ratelimit-output-tokens-limit"),
            HeaderName::from_static("anthropic-ratelimit-output-tokens-remaining"),
            HeaderName::from_static("anthropic-ratelimit-output-tokens-reset"),
        ],
    }
}

/// Seconds or milliseconds the upstream asked us to wait, at most
/// [`MAX_COOLDOWN`]. The figure is the upstream's input: `inf`, `NaN` or `1e30`
/// (`Duration::from_secs_f64` panics on those, in the request's task)
/// read as no figure.
pub(super) fn upstream_retry_after(headers: &HeaderMap) -> Option<Duration> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let number = |name: &str| get(name).and_then(|v| v.trim().parse::<f64>().ok());
    let seconds =
        (number("retry-after-ms").map(|ms| ms / 1000.0)).or_else(|| number("retry-after"))?;
    (seconds.is_finite())
        .then(|| Duration::from_secs_f64(seconds.clamp(0.0, MAX_COOLDOWN.as_secs_f64())))
}

/// If OpenAI's `x-ratelimit-remaining-*` says a window is exhausted, how
/// long to stop sending there: until one request's worth is back at the provider's
/// refill rate, `x-ratelimit-reset-*` (the time until the window is *empty* again)
/// times one request's cost (1 request; `request_tokens` tokens) over
/// `x-ratelimit-limit-*`; the whole reset when the limit is not given.
///
/// Waiting for the whole reset wastes up to a third of the limit: a node that sent
/// its L in a burst would stand still until the last of them left the window, long
/// after the first had (the jepsen benchmark measures 0.67 of L on one node). The
/// node's own limiter already holds it to L; this pause only matters when the
/// provider disagrees (another consumer on the same account), and then the
/// provider's 429 carries the exact `retry-after` the next pause uses.
fn openai_exhausted_for(headers: &HeaderMap, request_tokens: u64) -> Option<Duration> {
    // Every response passes here: header names are constants, nothing allocated.
    use super::headers::{REQUESTS, TOKENS};

    let get = |name: &HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    [(REQUESTS, 1), (TOKENS, request_tokens.max(1))]
        .into_iter()
        .filter(|([_, remaining, _], _)| get(remaining).is_some_and(|v| v.trim() == "0"))
        .filter_map(|([limit, _, reset], unit)| {
            let reset = get(&reset).and_then(super::headers::parse_reset)?;
            let share = get(&limit)
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|limit| *limit > 0)
                .map_or(1.0, |limit| (unit as f64 / limit as f64).min(1.0));
            Some(reset.mul_f64(share))
        })
        .max()
}

/// If Anthropic's `anthropic-ratelimit-*-remaining` says a limit has less left
/// than this request needs, how long to stop sending there: until the request's
/// share of the limit is back, the reset (when the limit is whole again, an
/// RFC 3339 instant) times the request's cost over the limit; the whole reset
/// when the limit is not given. Anthropic replenishes continuously, so the
/// share is how long a request's worth takes to come back.
fn anthropic_exhausted_for(headers: &HeaderMap, cost: Cost, now: SystemTime) -> Option<Duration> {
    let get = |name: &HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    let number = |name: &HeaderName| get(name).and_then(|v| v.trim().parse::<u64>().ok());
    (ANTHROPIC.iter())
        .filter_map(|([limit, remaining, reset], unit)| {
            let unit = unit.of(cost);
            if number(remaining)? >= unit {
                return None;
            }
            let at = get(reset).and_then(|v| humantime::parse_rfc3339_weak(v.trim()).ok())?;
            let until = at.duration_since(now).unwrap_or(Duration::ZERO);
            let share = (number(limit).filter(|l| *l > 0))
                .map_or(1.0, |limit| (unit as f64 / limit as f64).min(1.0));
            Some(until.min(MAX_COOLDOWN).mul_f64(share))
        })
        .max()
}

/// How long the provider's own rate-limit headers say to stop sending to it,
/// if they say a limit is used up (OpenAI's or Anthropic's; the longer).
pub(super) fn provider_exhausted_for(
    headers: &HeaderMap,
    cost: Cost,
    now: SystemTime,
) -> Option<Duration> {
    let openai = openai_exhausted_for(headers, cost.tokens());
    openai
        .max(anthropic_exhausted_for(headers, cost, now))
        .filter(|wait| !wait.is_zero())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upstreams_retry_after_is_read_within_bounds() {
        let read = |pairs: &[(&'static str, &'static str)]| upstream_retry_after(&headers(pairs));
        assert_eq!(
            read(&[("retry-after", "2.5")]),
            Some(Duration::from_millis(2_500))
        );
        assert_eq!(
            read(&[("retry-after-ms", "250"), ("retry-after", "9")]),
            Some(Duration::from_millis(250)),
            "the milliseconds first"
        );
        assert_eq!(read(&[("retry-after", "-5")]), Some(Duration::ZERO));
        assert_eq!(read(&[("retry-after", "1e30")]), Some(MAX_COOLDOWN));
        for hostile in ["inf", "NaN", "-inf"] {
            assert_eq!(read(&[("retry-after", hostile)]), None, "{hostile}");
            assert_eq!(read(&[("retry-after-ms", hostile)]), None, "{hostile}");
        }
        assert_eq!(read(&[("retry-after", "soon")]), None);
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.insert(*name, value.parse().expect("header value"));
        }
        h
    }

    #[test]
    fn an_exhausted_window_pauses_for_one_unit_of_its_refill() {
        let exhausted = headers(&[
            ("x-ratelimit-limit-requests", "40"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "5s"),
        ]);
        assert_eq!(
            openai_exhausted_for(&exhausted, 2_000),
            Some(Duration::from_millis(125))
        );
        // Tokens: until one request's tokens are back (2,000 of 150,000 per 6 s).
        let tokens = headers(&[
            ("x-ratelimit-limit-tokens", "150000"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "6s"),
        ]);
        assert_eq!(
            openai_exhausted_for(&tokens, 2_000),
            Some(Duration::from_millis(80))
        );
        // Without the limit, the whole reset (the cautious reading).
        let no_limit = headers(&[
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "6s"),
        ]);
        assert_eq!(
            openai_exhausted_for(&no_limit, 2_000),
            Some(Duration::from_secs(6))
        );
        let room = headers(&[
            ("x-ratelimit-remaining-requests", "3"),
            ("x-ratelimit-reset-requests", "5s"),
        ]);
        assert_eq!(openai_exhausted_for(&room, 2_000), None);
    }

    #[test]
    fn anthropics_headers_pause_until_the_requests_share_is_back() {
        let now = humantime::parse_rfc3339("2026-12-07T12:00:00Z").unwrap();
        // 200 output tokens of 8,000 a minute left, the limit whole at 12:00:30:
        // a request asking for 1,000 waits for its share, 1,000/8,000 of 30 s.
        let output = headers(&[
            ("anthropic-ratelimit-output-tokens-limit", "8000"),
            ("anthropic-ratelimit-output-tokens-remaining", "200"),
            (
                "anthropic-ratelimit-output-tokens-reset",
                "2026-12-07T12:00:30Z",
            ),
            ("anthropic-ratelimit-input-tokens-limit", "30000"),
            ("anthropic-ratelimit-input-tokens-remaining", "29000"),
            (
                "anthropic-ratelimit-input-tokens-reset",
                "2026-12-07T12:00:02Z",
            ),
        ]);
        let cost = Cost {
            input: 500,
            output: 1_000,
            output_cap: 0,
        };
        assert_eq!(
            provider_exhausted_for(&output, cost, now),
            Some(Duration::from_millis(3_750))
        );
        // Room for this request: no pause.
        let small = Cost {
            input: 500,
            output: 100,
            output_cap: 0,
        };
        assert_eq!(provider_exhausted_for(&output, small, now), None);
        // A reset already past, or one that does not parse: no pause.
        let past = headers(&[
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2026-12-07T11:59:00Z"),
        ]);
        assert_eq!(provider_exhausted_for(&past, cost, now), None);
        let garbage = headers(&[
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "soon"),
        ]);
        assert_eq!(provider_exhausted_for(&garbage, cost, now), None);
        // A reset far ahead is held to the longest cool-down.
        let far = headers(&[
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2027-01-01T00:00:00Z"),
        ]);
        assert_eq!(provider_exhausted_for(&far, cost, now), Some(MAX_COOLDOWN));
    }
}
