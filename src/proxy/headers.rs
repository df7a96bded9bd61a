//! Rate-limit headers from a scope's figures: OpenAI's
//! `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, with resets written the
//! way OpenAI writes them (`"1s"`, `"6m0s"`, `"120ms"`), which SDKs parse; and for
//! Anthropic's clients `anthropic-ratelimit-*`, its input and output windows
//! included, resets as RFC 3339 instants.

use crate::actor::ScopeStatus;
use crate::actor::scope::WindowStatus;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;

/// `x-ratelimit-{limit,remaining,reset}-requests`: names made at compile time
/// (`from_static` in a const; a `&str` name is parsed on every use).
pub const REQUESTS: [HeaderName; 3] = [
    HeaderName::from_static("x-ratelimit-limit-requests"),
    HeaderName::from_static("x-ratelimit-remaining-requests"),
    HeaderName::from_static("x-ratelimit-reset-requests"),
];
/// `x-ratelimit-{limit,remaining,reset}-tokens`.
pub const TOKENS: [HeaderName; 3] = [
    HeaderName::from_static("x-ratelimit-limit-tokens"),
    HeaderName::from_static("x-ratelimit-remaining-tokens"),
    HeaderName::from_static("x-ratelimit-reset-tokens"),
];

/// Anthropic's names, `anthropic-ratelimit-<limit>-{limit,remaining,reset}`,
/// for requests, tokens, input tokens and output tokens.
const ANTHROPIC: [[HeaderName; 3]; 4] = [
    [
        HeaderName::from_static("anthropic-ratelimit-requests-limit"),
        HeaderName::from_static("anthropic-ratelimit-requests-remaining"),
        HeaderName::from_static("anthropic-ratelimit-requests-reset"),
    ],
    [
        HeaderName::from_static("anthropic-ratelimit-tokens-limit"),
        HeaderName::from_static("anthropic-ratelimit-tokens-remaining"),
        HeaderName::from_static("anthropic-ratelimit-tokens-reset"),
    ],
    [
        HeaderName::from_static("anthropic-ratelimit-input-tokens-limit"),
        HeaderName::from_static("anthropic-ratelimit-input-tokens-remaining"),
        HeaderName::from_static("anthropic-ratelimit-input-tokens-reset"),
    ],
    [
        HeaderName::from_static("anthropic-ratelimit-output-tokens-limit"),
        HeaderName::from_static("anthropic-ratelimit-output-tokens-remaining"),
        HeaderName::from_static("anthropic-ratelimit-output-tokens-reset"),
    ],
];

/// The rate-limit header values of one response.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RateHeaders {
    requests: Option<WindowStatus>,
    tokens: Option<WindowStatus>,
    input_tokens: Option<WindowStatus>,
    output_tokens: Option<WindowStatus>,
}

impl RateHeaders {
    /// From the tenant scope's figures.
    pub fn from_status(status: &ScopeStatus) -> RateHeaders {
        RateHeaders {
            requests: status.requests,
            tokens: status.tokens,
            input_tokens: status.input_tokens,
            output_tokens: status.output_tokens,
        }
    }

    /// Writes the headers of `flavor`'s clients: OpenAI's always (SDKs of
    /// either read them), and for Anthropic's clients Anthropic's too, which
    /// also say the input and output windows (resets as RFC 3339 instants from
    /// `now`).
    pub fn apply_for(&self, flavor: super::error::Flavor, headers: &mut HeaderMap) {
        self.apply(headers);
        if flavor == super::error::Flavor::Anthropic {
            self.apply_anthropic(headers, std::time::SystemTime::now());
        }
    }

    /// Anthropic's `anthropic-ratelimit-*` headers of every limited window.
    pub fn apply_anthropic(&self, headers: &mut HeaderMap, now: std::time::SystemTime) {
        let windows = [
            self.requests,
            self.tokens,
            self.input_tokens,
            self.output_tokens,
        ];
        for (window, [limit, remaining, reset]) in windows.into_iter().zip(ANTHROPIC) {
            let Some(w) = window else { continue };
            headers.insert(limit, HeaderValue::from(w.limit));
            headers.insert(remaining, HeaderValue::from(w.remaining));
            // Whole seconds, rounded up: the window is whole again by then.
            let at = now + std::time::Duration::from_secs(w.reset_ns.div_ceil(1_000_000_000));
            let text = humantime::format_rfc3339_seconds(at).to_string();
            if let Ok(value) = HeaderValue::from_str(&text) {
                headers.insert(reset, value);
            }
        }
    }

    /// Writes the headers of every limited dimension. Every response passes here:
    /// the names are constants; a count is one allocation, a reset string two
    /// (the string, then the shared bytes the header value keeps).
    pub fn apply(&self, headers: &mut HeaderMap) {
        headers.reserve(6);
        for (window, [limit, remaining, reset]) in
            [(self.requests, REQUESTS), (self.tokens, TOKENS)]
        {
            let Some(w) = window else { continue };
            headers.insert(limit, HeaderValue::from(w.limit));
            headers.insert(remaining, HeaderValue::from(w.remaining));
            // Digits, letters and a dot: always a valid header value.
            if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(format_reset(w.reset_ns)))
            {
                headers.insert(reset, value);
            }
        }
    }
}

/// Formats nanoseconds as OpenAI does: `"20ms"`, `"1s"`, `"1.5s"`, `"6m0s"`,
/// `"1h2m3s"`; milliseconds rounded up. Every response writes two: integers
/// pushed into one string (`itoa`), no float and no `fmt` machinery, which cost
/// the node ~1,000 instructions a header (callgrind).
pub fn format_reset(ns: u64) -> String {
    let mut digits = itoa::Buffer::new();
    let ms = ns.div_ceil(1_000_000);
    let mut out = String::with_capacity(24);
    if ms < 1000 {
        out.push_str(digits.format(ms));
        out.push_str("ms");
        return out;
    }
    let (h, rest_ms) = (ms / 3_600_000, ms % 3_600_000);
    let (m, rest_ms) = (rest_ms / 60_000, rest_ms % 60_000);
    if h > 0 {
        out.push_str(digits.format(h));
        out.push('h');
    }
    if h > 0 || m > 0 {
        out.push_str(digits.format(m));
        out.push('m');
    }
    out.push_str(digits.format(rest_ms / 1000));
    let millis = rest_ms % 1000;
    if millis > 0 {
        // Three places, trailing zeros dropped: 500 -> ".5", 50 -> ".05", 5 -> ".005".
        let places = [millis / 100, millis / 10 % 10, millis % 10];
        let last = places.iter().rposition(|d| *d != 0).unwrap_or(0);
        out.push('.');
        for digit in &places[..=last] {
            out.push(char::from(b'0' + *digit as u8));
        }
    }
    out.push('s');
    out
}

/// Parses a reset duration as OpenAI writes it (`"20ms"`, `"1.5s"`, `"6m0s"`,
/// `"1h2m3s"`); `None` for anything else.
pub fn parse_reset(text: &str) -> Option<std::time::Duration> {
    let mut rest = text.trim();
    let mut total_ms = 0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let split = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let (number, tail) = rest.split_at(split);
        let value: f64 = number.parse().ok()?;
        let (unit_ms, tail) = if let Some(t) = tail.strip_prefix("ms") {
            (1.0, t)
        } else if let Some(t) = tail.strip_prefix('h') {
            (3_600_000.0, t)
        } else if let Some(t) = tail.strip_prefix('m') {
            (60_000.0, t)
        } else if let Some(t) = tail.strip_prefix('s') {
            (1000.0, t)
        } else {
            return None;
        };
        total_ms += value * unit_ms;
        rest = tail;
    }
    // Finite is not enough: 300 digits of seconds overflow a Duration, and
    // `from_secs_f64` panics on that (an upstream's header is input).
    std::time::Duration::try_from_secs_f64(total_ms / 1000.0).ok()
}

#[cfg(test)]
mod tests {
    use super::{RateHeaders, format_reset, parse_reset};

    #[test]
    fn anthropic_clients_are_told_each_window_with_its_reset_instant() {
        let window = |limit, used, reset_ns| {
            Some(WindowStatus {
                limit,
                used,
                remaining: limit - used,
                reset_ns,
            })
        };
        let rate = RateHeaders {
            requests: window(50, 1, 59_000_000_000),
            input_tokens: window(30_000, 500, 1_500_000_000),
            output_tokens: window(8_000, 8_000, 60_000_000_000),
            ..RateHeaders::default()
        };
        let mut headers = HeaderMap::new();
        let now = humantime::parse_rfc3339("2026-12-07T12:00:00Z").unwrap();
        rate.apply_anthropic(&mut headers, now);
        assert_eq!(headers["anthropic-ratelimit-requests-remaining"], "49");
        assert_eq!(headers["anthropic-ratelimit-input-tokens-limit"], "30000");
        assert_eq!(
            headers["anthropic-ratelimit-input-tokens-reset"],
            "2026-12-07T12:00:02Z"
        );
        assert_eq!(headers["anthropic-ratelimit-output-tokens-remaining"], "0");
        assert!(headers.get("anthropic-ratelimit-tokens-limit").is_none());
    }
    use crate::actor::scope::WindowStatus;
    use axum::http::HeaderMap;
    use std::time::Duration;

    #[test]
    fn resets_parse_back() {
        for ns in [
            1_000_000u64,
            20_000_000,
            1_000_000_000,
            1_500_000_000,
            360_000_000_000,
            3_723_000_000_000,
        ] {
            assert_eq!(
                parse_reset(&format_reset(ns)),
                Some(Duration::from_nanos(ns))
            );
        }
        assert_eq!(parse_reset("0s"), Some(Duration::ZERO));
        assert_eq!(parse_reset(""), None);
        assert_eq!(parse_reset("soon"), None);
        assert_eq!(parse_reset("5x"), None);
        // Too long for a Duration (converting would panic), or not finite: no
        // figure.
        let huge = format!("{}s", "9".repeat(300));
        assert_eq!(parse_reset(&huge), None);
        assert_eq!(parse_reset(&format!("{}s", "9".repeat(400))), None);
    }

    /// The reset as a float printed to three places, its trailing zeros
    /// trimmed: the reference `format_reset`'s integer-only formula must
    /// match.
    fn format_reset_by_float(ns: u64) -> String {
        let ms = ns.div_ceil(1_000_000);
        if ms < 1000 {
            return format!("{ms}ms");
        }
        let (h, rest_ms) = (ms / 3_600_000, ms % 3_600_000);
        let (m, rest_ms) = (rest_ms / 60_000, rest_ms % 60_000);
        let secs = if rest_ms % 1000 == 0 {
            format!("{}s", rest_ms / 1000)
        } else {
            let s = format!("{:.3}", rest_ms as f64 / 1000.0);
            format!("{}s", s.trim_end_matches('0').trim_end_matches('.'))
        };
        match (h, m) {
            (0, 0) => secs,
            (0, m) => format!("{m}m{secs}"),
            (h, m) => format!("{h}h{m}m{secs}"),
        }
    }

    #[test]
    fn resets_read_as_the_float_formula_wrote_them() {
        // Every millisecond of the first three minutes, the nanoseconds around
        // each, and a spread of hours.
        let ms = (0..180_000u64).chain((0..2_000).map(|i| i * 7_919_993));
        for ms in ms {
            for ns in [
                ms * 1_000_000,
                (ms * 1_000_000).saturating_sub(1),
                ms * 1_000_000 + 1,
            ] {
                assert_eq!(format_reset(ns), format_reset_by_float(ns), "{ns} ns");
            }
        }
    }

    #[test]
    fn resets_look_like_openai_s() {
        assert_eq!(format_reset(20_000_000), "20ms");
        assert_eq!(format_reset(1), "1ms");
        assert_eq!(format_reset(1_000_000_000), "1s");
        assert_eq!(format_reset(1_500_000_000), "1.5s");
        assert_eq!(format_reset(360_000_000_000), "6m0s");
        assert_eq!(format_reset(3_723_000_000_000), "1h2m3s");
    }

    #[test]
    fn every_limited_dimension_gets_its_three_headers() {
        let window = |limit, remaining, reset_ns| {
            Some(WindowStatus {
                limit,
                used: limit - remaining,
                remaining,
                reset_ns,
            })
        };
        let mut headers = HeaderMap::new();
        RateHeaders {
            requests: window(500, 498, 1_500_000_000),
            ..RateHeaders::default()
        }
        .apply(&mut headers);
        assert_eq!(headers.len(), 3, "no token headers without a token limit");
        RateHeaders {
            tokens: window(150_000, 149_000, 20_000_000),
            ..RateHeaders::default()
        }
        .apply(&mut headers);
        for (name, value) in [
            ("x-ratelimit-limit-requests", "500"),
            ("x-ratelimit-remaining-requests", "498"),
            ("x-ratelimit-reset-requests", "1.5s"),
            ("x-ratelimit-limit-tokens", "150000"),
            ("x-ratelimit-remaining-tokens", "149000"),
            ("x-ratelimit-reset-tokens", "20ms"),
        ] {
            let got = headers.get(name).map(|v| v.to_str().unwrap());
            assert_eq!(got, Some(value), "{name}");
        }
    }
}
