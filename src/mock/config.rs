//! Configuration of the mock upstream: [`MockConfig`] (embeddable, defaults in one
//! place, checked by [`MockConfig::validate`]) and [`MockArgs`], the clap flags of
//! `tollgate mock-upstream`.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Upper bound on the configurable completion length, so one request cannot ask the
/// mock to build an unbounded body.
pub const MAX_COMPLETION_TOKENS: u64 = 1_000_000;
/// Upper bound on the sliding window (one day), so the limit log stays bounded.
pub const MAX_WINDOW_MS: u64 = 86_400_000;

/// Everything the mock upstream needs besides its listener.
///
/// Limits of `0` mean unlimited. All limits share one sliding window of
/// [`window_ms`](Self::window_ms).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MockConfig {
    /// Requests admitted per sliding window (`0` = unlimited).
    pub rpm: u64,
    /// Tokens (prompt + completion) admitted per sliding window (`0` = unlimited).
    pub tpm: u64,
    /// Input (prompt) tokens admitted per sliding window, Anthropic's ITPM (`0` =
    /// unlimited).
    pub itpm: u64,
    /// Output tokens admitted per sliding window, Anthropic's OTPM (`0` =
    /// unlimited): a request is charged its `max_tokens` at admission (its
    /// completion when it sets none), corrected to its real output when its answer
    /// ends.
    pub otpm: u64,
    /// Requests in flight at once, streams included until their last byte (`0` =
    /// unlimited).
    pub concurrency: u64,
    /// Length of the sliding window in milliseconds (default 60 000, the "per minute").
    pub window_ms: u64,
    /// Delay before the response starts (time to first byte), in milliseconds.
    pub latency_ms: u64,
    /// Delay per completion token, in milliseconds: between stream chunks, and added
    /// in full before a non-streamed response.
    pub inter_token_ms: u64,
    /// Smallest completion length drawn, in tokens (inclusive).
    pub completion_min_tokens: u64,
    /// Largest completion length drawn, in tokens (inclusive); a request's
    /// `max_tokens` caps it further.
    pub completion_max_tokens: u64,
    /// Seed of the completion-length draws; the same seed and the same request order
    /// give the same lengths.
    pub seed: u64,
    /// When set, every API request must carry it as `Authorization: Bearer <key>` or
    /// `x-api-key: <key>`, else 401.
    pub api_key: Option<String>,
    /// When non-empty, the only model names accepted (others get 404
    /// `model_not_found`); empty accepts any model.
    pub models: Vec<String>,
    /// JSONL decision log, appended to (created if missing); `None` disables it.
    pub log_path: Option<PathBuf>,
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            rpm: 0,
            tpm: 0,
            itpm: 0,
            otpm: 0,
            concurrency: 0,
            window_ms: 60_000,
            latency_ms: 0,
            inter_token_ms: 0,
            completion_min_tokens: 16,
            completion_max_tokens: 256,
            seed: 0,
            api_key: None,
            models: Vec::new(),
            log_path: None,
        }
    }
}

/// A configuration the mock refuses to run with; the message names the field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// `window_ms` is zero or above [`MAX_WINDOW_MS`].
    #[error("window_ms must be in 1..={MAX_WINDOW_MS}, got {0}")]
    Window(u64),
    /// The completion range is empty or too large.
    #[error(
        "completion tokens must satisfy min <= max <= {MAX_COMPLETION_TOKENS}, got {min}..={max}"
    )]
    CompletionRange {
        /// Configured minimum.
        min: u64,
        /// Configured maximum.
        max: u64,
    },
}

impl MockConfig {
    /// Checks the rules that span fields.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.window_ms == 0 || self.window_ms > MAX_WINDOW_MS {
            return Err(ConfigError::Window(self.window_ms));
        }
        let (min, max) = (self.completion_min_tokens, self.completion_max_tokens);
        if min > max || max > MAX_COMPLETION_TOKENS {
            return Err(ConfigError::CompletionRange { min, max });
        }
        Ok(())
    }
}

/// An inclusive range of completion lengths, written `MIN..MAX` or `MIN..=MAX`
/// (both inclusive) or a single `N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenRange {
    /// Smallest length, in tokens.
    pub min: u64,
    /// Largest length, in tokens.
    pub max: u64,
}

impl std::str::FromStr for TokenRange {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let parse = |s: &str| {
            s.trim()
                .parse::<u64>()
                .map_err(|e| format!("bad token count {s:?} in {text:?}: {e}"))
        };
        let (min, max) = match text.split_once("..") {
            Some((lo, hi)) => (parse(lo)?, parse(hi.strip_prefix('=').unwrap_or(hi))?),
            None => (parse(text)?, parse(text)?),
        };
        if min > max {
            return Err(format!("empty range {text:?}: MIN must be <= MAX"));
        }
        Ok(TokenRange { min, max })
    }
}

/// Flags of `tollgate mock-upstream`.
#[derive(clap::Args, Clone, Debug)]
pub struct MockArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9090")]
    pub listen: SocketAddr,
    /// Requests per window (0 = unlimited).
    #[arg(long, default_value_t = 0)]
    pub rpm: u64,
    /// Tokens (prompt + completion) per window (0 = unlimited).
    #[arg(long, default_value_t = 0)]
    pub tpm: u64,
    /// Input tokens per window, Anthropic's ITPM (0 = unlimited).
    #[arg(long, default_value_t = 0)]
    pub itpm: u64,
    /// Output tokens per window, Anthropic's OTPM: `max_tokens` at admission,
    /// corrected to the real output when the answer ends (0 = unlimited).
    #[arg(long, default_value_t = 0)]
    pub otpm: u64,
    /// Concurrent requests (0 = unlimited).
    #[arg(long, default_value_t = 0)]
    pub concurrency: u64,
    /// JSONL decision log (appended to).
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// Time to first byte, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub latency_ms: u64,
    /// Delay per completion token, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub inter_token_ms: u64,
    /// Completion length distribution, uniform over `MIN..MAX` (inclusive).
    #[arg(long, value_name = "MIN..MAX")]
    pub completion_tokens: Option<TokenRange>,
    /// Smallest completion length (overrides `--completion-tokens`).
    #[arg(long)]
    pub completion_min: Option<u64>,
    /// Largest completion length (overrides `--completion-tokens`).
    #[arg(long)]
    pub completion_max: Option<u64>,
    /// Seed of the completion-length draws.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Sliding window length, in seconds.
    #[arg(long, default_value_t = 60)]
    pub window_secs: u64,
    /// Required API key (Bearer or x-api-key); none = no auth.
    #[arg(long, env = "TOLLGATE_MOCK_API_KEY")]
    pub api_key: Option<String>,
    /// Comma-separated list of accepted models; none = any model.
    #[arg(long, value_delimiter = ',')]
    pub models: Vec<String>,
}

impl MockArgs {
    /// Builds and validates the [`MockConfig`] these flags describe.
    pub fn into_config(self) -> Result<MockConfig, ConfigError> {
        let defaults = MockConfig::default();
        let range = self.completion_tokens.unwrap_or(TokenRange {
            min: defaults.completion_min_tokens,
            max: defaults.completion_max_tokens,
        });
        let config = MockConfig {
            rpm: self.rpm,
            tpm: self.tpm,
            itpm: self.itpm,
            otpm: self.otpm,
            concurrency: self.concurrency,
            window_ms: self.window_secs.saturating_mul(1000),
            latency_ms: self.latency_ms,
            inter_token_ms: self.inter_token_ms,
            completion_min_tokens: self.completion_min.unwrap_or(range.min),
            completion_max_tokens: self.completion_max.unwrap_or(range.max),
            seed: self.seed,
            api_key: self.api_key,
            models: self.models.into_iter().filter(|m| !m.is_empty()).collect(),
            log_path: self.log,
        };
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: MockArgs,
    }

    fn parse(args: &[&str]) -> Result<MockConfig, String> {
        let cli = Cli::try_parse_from(std::iter::once("mock").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.args.into_config().map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_match_mock_config_default() {
        assert_eq!(parse(&[]).unwrap(), MockConfig::default());
    }

    #[test]
    fn flags_map_to_fields() {
        let config = parse(&[
            "--rpm=10",
            "--tpm=1000",
            "--itpm=600",
            "--otpm=400",
            "--concurrency=3",
            "--window-secs=2",
            "--completion-tokens=5..=9",
            "--completion-max=8",
            "--models=a,b",
            "--api-key=k",
        ])
        .unwrap();
        assert_eq!((config.rpm, config.tpm, config.concurrency), (10, 1000, 3));
        assert_eq!((config.itpm, config.otpm), (600, 400));
        assert_eq!(config.window_ms, 2000);
        assert_eq!(
            (config.completion_min_tokens, config.completion_max_tokens),
            (5, 8)
        );
        assert_eq!(config.models, ["a", "b"]);
        assert_eq!(config.api_key.as_deref(), Some("k"));
    }

    #[test]
    fn bad_ranges_are_refused() {
        assert!(parse(&["--completion-tokens=9..5"]).is_err());
        assert!(parse(&["--completion-min=9", "--completion-max=5"]).is_err());
        assert!(parse(&["--window-secs=0"]).is_err());
        assert_eq!("7".parse::<TokenRange>(), Ok(TokenRange { min: 7, max: 7 }));
        assert_eq!(
            "1..4".parse::<TokenRange>(),
            Ok(TokenRange { min: 1, max: 4 })
        );
    }
}
