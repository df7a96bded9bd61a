//! OpenAI's rate-limit headers (`x-ratelimit-{limit,remaining,reset}-{requests,tokens}`)
//! with durations formatted the way OpenAI formats them (`"120ms"`, `"1.5s"`,
//! `"6m0s"`).

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use super::limits::{Limits, WindowUsage};

/// Formats `ms` like Go's `time.Duration` at millisecond precision, as OpenAI does.
pub(crate) fn format_duration(ms: u64) -> String {
    if ms < 1000 {
        return if ms == 0 {
            "0s".to_owned()
        } else {
            format!("{ms}ms")
        };
    }
    let (hours, minutes) = (ms / 3_600_000, ms / 60_000 % 60);
    let (seconds, millis) = (ms / 1000 % 60, ms % 1000);
    let mut out = String::new();
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if hours > 0 || minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    out.push_str(&seconds.to_string());
    if millis > 0 {
        let fraction = format!("{millis:03}");
        out.push('.');
        out.push_str(fraction.trim_end_matches('0'));
    }
    out.push('s');
    out
}

/// Adds the three headers of one limit (skipped when the limit is unlimited).
fn add_trio(
    headers: &mut HeaderMap,
    names: [&'static str; 3],
    limit: u64,
    used: u64,
    reset_ms: u64,
) {
    if limit == 0 {
        return;
    }
    let [limit_name, remaining_name, reset_name] = names.map(HeaderName::from_static);
    headers.insert(limit_name, HeaderValue::from(limit));
    headers.insert(
        remaining_name,
        HeaderValue::from(limit.saturating_sub(used)),
    );
    if let Ok(reset) = HeaderValue::from_str(&format_duration(reset_ms)) {
        headers.insert(reset_name, reset);
    }
}

/// The `x-ratelimit-*` headers for a window holding `usage`. `reset` is the time until
/// the window is empty again (OpenAI: "until the rate limit resets to its initial
/// state").
pub(crate) fn rate_limit_headers(limits: Limits, usage: WindowUsage) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let requests = [
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
    ];
    let tokens = [
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    ];
    add_trio(
        &mut headers,
        requests,
        limits.rpm,
        usage.requests,
        usage.reset_ms,
    );
    add_trio(
        &mut headers,
        tokens,
        limits.tpm,
        usage.tokens,
        usage.reset_ms,
    );
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_look_like_openai() {
        let cases = [
            (0, "0s"),
            (120, "120ms"),
            (999, "999ms"),
            (1000, "1s"),
            (1500, "1.5s"),
            (8640, "8.64s"),
            (60_000, "1m0s"),
            (360_000, "6m0s"),
            (3_723_004, "1h2m3.004s"),
        ];
        for (ms, text) in cases {
            assert_eq!(format_duration(ms), text, "{ms} ms");
        }
    }

    #[test]
    fn unlimited_limits_have_no_headers() {
        let limits = Limits {
            rpm: 10,
            tpm: 0,
            concurrency: 0,
            window_ms: 60_000,
        };
        let usage = WindowUsage {
            requests: 4,
            tokens: 99,
            reset_ms: 59_000,
        };
        let headers = rate_limit_headers(limits, usage);
        assert_eq!(headers.len(), 3);
        assert_eq!(headers["x-ratelimit-remaining-requests"], "6");
        assert_eq!(headers["x-ratelimit-reset-requests"], "59s");
        assert!(headers.get("x-ratelimit-limit-tokens").is_none());
    }
}
