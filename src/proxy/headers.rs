//! OpenAI-style rate-limit headers from a scope's figures:
//! `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, with resets written the
//! way OpenAI writes them (`"1s"`, `"6m0s"`, `"120ms"`), which SDKs parse.

use crate::actor::ScopeStatus;
use crate::actor::scope::WindowStatus;
use axum::http::{HeaderMap, HeaderName, HeaderValue};

/// The six header values of one response.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RateHeaders {
    requests: Option<WindowStatus>,
    tokens: Option<WindowStatus>,
}

impl RateHeaders {
    /// From the tenant scope's figures.
    pub fn from_status(status: &ScopeStatus) -> RateHeaders {
        RateHeaders {
            requests: status.requests,
            tokens: status.tokens,
        }
    }

    /// Writes the headers of every limited dimension.
    pub fn apply(&self, headers: &mut HeaderMap) {
        for (window, limit, remaining, reset) in [
            (
                self.requests,
                "x-ratelimit-limit-requests",
                "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests",
            ),
            (
                self.tokens,
                "x-ratelimit-limit-tokens",
                "x-ratelimit-remaining-tokens",
                "x-ratelimit-reset-tokens",
            ),
        ] {
            let Some(w) = window else { continue };
            headers.insert(HeaderName::from_static(limit), HeaderValue::from(w.limit));
            headers.insert(
                HeaderName::from_static(remaining),
                HeaderValue::from(w.remaining),
            );
            if let Ok(value) = HeaderValue::from_str(&format_reset(w.reset_ns)) {
                headers.insert(HeaderName::from_static(reset), value);
            }
        }
    }
}

/// Formats nanoseconds as OpenAI does: `"20ms"`, `"1s"`, `"1.5s"`, `"6m0s"`, `"1h2m3s"`.
pub fn format_reset(ns: u64) -> String {
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
    use super::{format_reset, parse_reset};
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
        // Too long for a Duration (panicked before), or not finite: no figure.
        let huge = format!("{}s", "9".repeat(300));
        assert_eq!(parse_reset(&huge), None);
        assert_eq!(parse_reset(&format!("{}s", "9".repeat(400))), None);
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
}
