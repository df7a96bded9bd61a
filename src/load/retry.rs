//! Reading how long a limiter asked us to wait.
//!
//! A 429 (or a 503 carrying a hint) may say `retry-after-ms: <ms>` (OpenAI and
//! tollgate, preferred: finer) and/or `retry-after: <seconds>` (RFC 9110). The HTTP-date
//! form of `retry-after` is not understood and gives no wait. Every wait is capped at
//! [`RETRY_AFTER_CAP`] so a bogus header cannot stall a run.

use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::HeaderMap;

/// Longest wait a single retry-after can impose.
pub const RETRY_AFTER_CAP: Duration = Duration::from_secs(60);

/// The wait a response asks for, if its status is one that asks (429 or 503).
pub fn retry_after(status: StatusCode, headers: &HeaderMap) -> Option<Duration> {
    if status != StatusCode::TOO_MANY_REQUESTS && status != StatusCode::SERVICE_UNAVAILABLE {
        return None;
    }
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    parse(text("retry-after-ms"), text("retry-after"))
}

/// The wait from the two header values: milliseconds win when they parse, then
/// seconds; both may be fractional; negative, non-finite or unparsable values are ignored.
pub fn parse(retry_after_ms: Option<&str>, retry_after_s: Option<&str>) -> Option<Duration> {
    let number = |s: &str| {
        s.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
    };
    let millis = retry_after_ms.and_then(number).map(|ms| ms / 1000.0);
    let secs = millis.or_else(|| retry_after_s.and_then(number))?;
    let capped = secs.min(RETRY_AFTER_CAP.as_secs_f64());
    Some(Duration::from_secs_f64(capped))
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::*;

    #[test]
    fn milliseconds_are_preferred_over_seconds() {
        assert_eq!(
            parse(Some("250"), Some("1")),
            Some(Duration::from_millis(250))
        );
        assert_eq!(parse(None, Some("2")), Some(Duration::from_secs(2)));
        assert_eq!(
            parse(Some(" 1.5 "), None),
            Some(Duration::from_micros(1500))
        );
        assert_eq!(parse(None, Some("0.25")), Some(Duration::from_millis(250)));
        assert_eq!(parse(Some("0"), None), Some(Duration::ZERO));
    }

    #[test]
    fn garbage_falls_back_or_gives_nothing() {
        assert_eq!(parse(Some("soon"), Some("3")), Some(Duration::from_secs(3)));
        assert_eq!(parse(Some("-5"), None), None);
        assert_eq!(parse(Some("NaN"), Some("inf")), None);
        assert_eq!(parse(None, Some("Wed, 21 Oct 2015 07:28:00 GMT")), None);
        assert_eq!(parse(None, None), None);
    }

    #[test]
    fn waits_are_capped() {
        assert_eq!(parse(None, Some("86400")), Some(RETRY_AFTER_CAP));
        assert_eq!(parse(Some("1e300"), None), Some(RETRY_AFTER_CAP));
    }

    #[test]
    fn only_429_and_503_ask_for_a_wait() {
        let mut headers = HeaderMap::new();
        headers.insert("retry-after-ms", HeaderValue::from_static("40"));
        let wait = Some(Duration::from_millis(40));
        assert_eq!(retry_after(StatusCode::TOO_MANY_REQUESTS, &headers), wait);
        assert_eq!(retry_after(StatusCode::SERVICE_UNAVAILABLE, &headers), wait);
        assert_eq!(retry_after(StatusCode::OK, &headers), None);
        assert_eq!(
            retry_after(StatusCode::INTERNAL_SERVER_ERROR, &headers),
            None
        );
        assert_eq!(
            retry_after(StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new()),
            None
        );
    }
}
