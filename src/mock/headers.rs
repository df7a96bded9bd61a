//! The providers' rate-limit headers. OpenAI's:
//! `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, durations formatted the
//! way OpenAI formats them (`"120ms"`, `"1.5s"`, `"6m0s"`). Anthropic's:
//! `anthropic-ratelimit-{requests,input-tokens,output-tokens,tokens}-{limit,remaining,reset}`,
//! resets as RFC 3339 timestamps (`2026-12-07T12:00:01Z`).

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use super::limits::{Limits, WindowUsage};
use super::log::Api;

/// Anthropic's trios of `limit`, `remaining` and `reset` names.
const ANTHROPIC_REQUESTS: [&str; 3] = [
    "anthropic-ratelimit-requests-limit",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
];
const ANTHROPIC_INPUT: [&str; 3] = [
    "anthropic-ratelimit-input-tokens-limit",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-input-tokens-reset",
];
const ANTHROPIC_OUTPUT: [&str; 3] = [
    "anthropic-ratelimit-output-tokens-limit",
    "anthropic-ratelimit-output-tokens-remaining",
    "anthropic-ratelimit-output-tokens-reset",
];
const ANTHROPIC_TOKENS: [&str; 3] = [
    "anthropic-ratelimit-tokens-limit",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-tokens-reset",
];

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
/// state"). OpenAI's figures are per model: given a model group's view
/// (`super::quotas::View`), each trio is the group's where the group limits it.
/// OpenAI sends no standard per-day headers, so the day quota has none.
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
        usage.tokens_reset_ms,
    );
    headers
}

/// The rate-limit headers of `api`'s provider for a window holding `usage`, at Unix
/// time `now_unix_ms`.
pub(crate) fn window_headers(
    api: Api,
    limits: Limits,
    usage: WindowUsage,
    now_unix_ms: u64,
) -> HeaderMap {
    match api {
        Api::Messages => anthropic_headers(limits, usage, now_unix_ms),
        Api::Chat | Api::Completions | Api::Embeddings | Api::Responses => {
            rate_limit_headers(limits, usage)
        }
    }
}

/// One limit as Anthropic reports it.
#[derive(Clone, Copy, Debug)]
struct Gauge {
    limit: u64,
    used: u64,
    /// Milliseconds until the window holds none of it again.
    reset_ms: u64,
}

impl Gauge {
    fn remaining(self) -> u64 {
        self.limit.saturating_sub(self.used)
    }
}

/// Anthropic's `anthropic-ratelimit-*` headers for a window holding `usage` at Unix
/// time `now_unix_ms`, each trio only when its limit is set. The `tokens` trio
/// repeats the most restrictive of the input and output limits in effect: the one
/// with the fewest tokens remaining. (The mock's combined TPM has no Anthropic
/// header: Anthropic limits input and output separately.)
pub(crate) fn anthropic_headers(limits: Limits, usage: WindowUsage, now_unix_ms: u64) -> HeaderMap {
    let requests = Gauge {
        limit: limits.rpm,
        used: usage.requests,
        reset_ms: usage.reset_ms,
    };
    let input = Gauge {
        limit: limits.itpm,
        used: usage.input_tokens,
        reset_ms: usage.input_reset_ms,
    };
    let output = Gauge {
        limit: limits.otpm,
        used: usage.output_tokens,
        reset_ms: usage.output_reset_ms,
    };
    let mut headers = HeaderMap::new();
    add_anthropic_trio(&mut headers, ANTHROPIC_REQUESTS, requests, now_unix_ms);
    add_anthropic_trio(&mut headers, ANTHROPIC_INPUT, input, now_unix_ms);
    add_anthropic_trio(&mut headers, ANTHROPIC_OUTPUT, output, now_unix_ms);
    // Of equals, input wins.
    let tightest = [input, output]
        .into_iter()
        .filter(|gauge| gauge.limit > 0)
        .min_by_key(|gauge| gauge.remaining());
    if let Some(gauge) = tightest {
        add_anthropic_trio(&mut headers, ANTHROPIC_TOKENS, gauge, now_unix_ms);
    }
    headers
}

/// Adds one Anthropic trio (skipped when the limit is unlimited). `reset` is when
/// the limit is back at its full value (Anthropic: "fully replenished"), the
/// window holding none of it: whole seconds rounded up, so it is never early.
fn add_anthropic_trio(
    headers: &mut HeaderMap,
    names: [&'static str; 3],
    gauge: Gauge,
    now_unix_ms: u64,
) {
    if gauge.limit == 0 {
        return;
    }
    let [limit_name, remaining_name, reset_name] = names.map(HeaderName::from_static);
    headers.insert(limit_name, HeaderValue::from(gauge.limit));
    headers.insert(remaining_name, HeaderValue::from(gauge.remaining()));
    let reset_secs = now_unix_ms.saturating_add(gauge.reset_ms).div_ceil(1000);
    if let Ok(reset) = HeaderValue::from_str(&rfc3339_seconds(reset_secs)) {
        headers.insert(reset_name, reset);
    }
}

/// Unix seconds as an RFC 3339 UTC timestamp, `2026-12-07T12:00:01Z`.
fn rfc3339_seconds(unix_secs: u64) -> String {
    let (days, secs) = (unix_secs / 86_400, unix_secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    let (hours, minutes, seconds) = (secs / 3600, secs / 60 % 60, secs % 60);
    format!("{year:04}-{month:02}-{day:02}T{hours:02}:{minutes:02}:{seconds:02}Z")
}

/// The Gregorian `(year, month, day)` `days` after 1970-01-01: Howard Hinnant's
/// `civil_from_days`, over unsigned days since the epoch.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Count from 0000-03-01, so each era's leap day is the last day of its years.
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    // Months from March: 0 is March, 11 is February.
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = era * 400 + year_of_era + u64::from(month <= 2);
    (year, month, day)
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
            itpm: 0,
            otpm: 0,
            concurrency: 0,
            window_ms: 60_000,
        };
        let usage = WindowUsage {
            requests: 4,
            tokens: 99,
            reset_ms: 59_000,
            ..WindowUsage::default()
        };
        let headers = rate_limit_headers(limits, usage);
        assert_eq!(headers.len(), 3);
        assert_eq!(headers["x-ratelimit-remaining-requests"], "6");
        assert_eq!(headers["x-ratelimit-reset-requests"], "59s");
        assert!(headers.get("x-ratelimit-limit-tokens").is_none());
    }

    #[test]
    fn rfc3339_timestamps_are_utc_whole_seconds() {
        let cases = [
            (0, "1970-01-01T00:00:00Z"),
            (951_782_400, "2000-02-29T00:00:00Z"),
            (1_796_644_801, "2026-12-07T12:00:01Z"),
            (4_102_444_799, "2099-12-31T23:59:59Z"),
        ];
        for (secs, text) in cases {
            assert_eq!(rfc3339_seconds(secs), text, "{secs} s");
        }
    }

    #[test]
    fn anthropic_headers_report_each_limit_and_the_tighter_token_limit() {
        let limits = Limits {
            rpm: 50,
            tpm: 0,
            itpm: 1000,
            otpm: 800,
            concurrency: 0,
            window_ms: 60_000,
        };
        let usage = WindowUsage {
            requests: 4,
            tokens: 0,
            input_tokens: 300,
            output_tokens: 500,
            reset_ms: 59_700,
            tokens_reset_ms: 59_700,
            input_reset_ms: 700,
            output_reset_ms: 701,
        };
        // 2026-12-07T12:00:00.300Z.
        let now_unix_ms = 1_796_644_800_300;
        let headers = window_headers(Api::Messages, limits, usage, now_unix_ms);
        let get = |name: &str| headers[name].to_str().unwrap().to_owned();
        assert_eq!(get("anthropic-ratelimit-requests-limit"), "50");
        assert_eq!(get("anthropic-ratelimit-requests-remaining"), "46");
        assert_eq!(
            get("anthropic-ratelimit-requests-reset"),
            "2026-12-07T12:01:00Z"
        );
        assert_eq!(get("anthropic-ratelimit-input-tokens-remaining"), "700");
        // On the second exactly: not rounded further.
        assert_eq!(
            get("anthropic-ratelimit-input-tokens-reset"),
            "2026-12-07T12:00:01Z"
        );
        assert_eq!(get("anthropic-ratelimit-output-tokens-remaining"), "300");
        // One millisecond past a second: rounded up, never early.
        assert_eq!(
            get("anthropic-ratelimit-output-tokens-reset"),
            "2026-12-07T12:00:02Z"
        );
        // Output has fewer remaining (300 < 700): it is the tokens-* trio.
        assert_eq!(get("anthropic-ratelimit-tokens-limit"), "800");
        assert_eq!(get("anthropic-ratelimit-tokens-remaining"), "300");
        assert_eq!(
            get("anthropic-ratelimit-tokens-reset"),
            "2026-12-07T12:00:02Z"
        );
        assert_eq!(headers.len(), 12);
        assert!(headers.get("x-ratelimit-limit-requests").is_none());
        // Without ITPM and OTPM: no input/output trios, no tokens trio.
        let plain = Limits {
            tpm: 5000,
            itpm: 0,
            otpm: 0,
            ..limits
        };
        let headers = anthropic_headers(plain, usage, now_unix_ms);
        assert_eq!(headers.len(), 3);
        // With ITPM alone, the tokens trio is ITPM's.
        let input_only = Limits { otpm: 0, ..limits };
        let headers = anthropic_headers(input_only, usage, now_unix_ms);
        assert_eq!(headers["anthropic-ratelimit-tokens-limit"], "1000");
        assert_eq!(headers.len(), 9);
    }
}
