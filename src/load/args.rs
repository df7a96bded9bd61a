//! Command-line flags of `tollgate load` and their validation into a [`Plan`].
//!
//! Flags are parsed by clap ([`LoadArgs`]); rules that span flags or need bounds are
//! checked once in [`LoadArgs::validate`], which returns the [`Plan`] the run executes.
//! Every number that sizes memory or time has an upper bound here.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Most closed-loop workers a run may start.
pub const MAX_CONCURRENCY: usize = 65_536;
/// Most requests an open-loop run may have outstanding.
pub const MAX_IN_FLIGHT: usize = 65_536;
/// Highest open-loop target rate, in requests per second.
pub const MAX_RATE_PER_S: f64 = 1_000_000.0;
/// Largest prompt the generator builds, in tokens (about 6 bytes each on the wire).
pub const MAX_PROMPT_TOKENS: usize = 1_000_000;
/// Longest per-request timeout; also the top of the latency histograms.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// Longest run.
pub const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Duration of a run when neither `--duration` nor `--requests` is given.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(10);
/// Closed-loop workers when `--rate` is not given and `--concurrency` is not either.
pub const DEFAULT_CONCURRENCY: usize = 8;

/// Which API shape the generator speaks.
#[derive(clap::ValueEnum, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// OpenAI `POST {url}/chat/completions`.
    Chat,
    /// OpenAI legacy `POST {url}/completions`.
    Completions,
    /// OpenAI `POST {url}/embeddings` (never streams).
    Embeddings,
    /// Anthropic `POST {url}/messages`, authenticated with `x-api-key`.
    Messages,
    /// OpenAI Responses API `POST {url}/responses`.
    Responses,
}

/// Lane requested from the gateway with the `x-tollgate-priority` header.
#[derive(clap::ValueEnum, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// May use the whole capacity of a key.
    Interactive,
    /// Capped at the key's batch share.
    Batch,
}

impl Api {
    /// The flag value, as the CLI spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Completions => "completions",
            Api::Embeddings => "embeddings",
            Api::Messages => "messages",
            Api::Responses => "responses",
        }
    }
}

impl Priority {
    /// The header value, as the gateway spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Interactive => "interactive",
            Priority::Batch => "batch",
        }
    }
}

/// Flags of `tollgate load`: an LLM-aware HTTP load generator.
#[derive(clap::Args, Debug, Clone)]
pub struct LoadArgs {
    /// Base URL of the OpenAI/Anthropic-compatible API; the endpoint path is appended.
    #[arg(long, default_value = "http://127.0.0.1:8080/v1")]
    pub url: String,
    /// API key, sent as `Authorization: Bearer` (OpenAI) or `x-api-key` (Anthropic).
    #[arg(
        long,
        env = "TOLLGATE_API_KEY",
        default_value = "sk-demo",
        hide_env_values = true
    )]
    pub api_key: String,
    /// Model name put in every request body.
    #[arg(long, default_value = "gpt-4o-mini")]
    pub model: String,
    /// API to exercise: chat, completions, embeddings, or messages (Anthropic).
    #[arg(long, value_enum, default_value_t = Api::Chat)]
    pub api: Api,
    /// Closed loop: N workers, each sending its next request when the last one ends
    /// [default: 8].
    #[arg(long, conflicts_with = "rate")]
    pub concurrency: Option<usize>,
    /// Open loop: target requests per second, independent of response times. Slots
    /// that cannot be sent in time are counted as `dropped`.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Open loop: most requests outstanding at once; a slot finding none free is dropped.
    #[arg(long, default_value_t = 1024)]
    pub max_in_flight: usize,
    /// How long to send, e.g. `30s`, `2m` [default: 10s, or unlimited with --requests].
    #[arg(long)]
    pub duration: Option<humantime::Duration>,
    /// Stop after N requests (closed loop: exactly N sent; open loop: N slots).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Approximate prompt size in tokens (a one-token word repeated).
    #[arg(long, default_value_t = 16)]
    pub prompt_tokens: usize,
    /// `max_tokens` sent with chat, completions and messages requests.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: u32,
    /// Ask for a streamed (SSE) response and measure time to first byte.
    #[arg(long)]
    pub stream: bool,
    /// Lane to ask the gateway for, sent as `x-tollgate-priority`.
    #[arg(long, value_enum)]
    pub priority: Option<Priority>,
    /// Longest the gateway may queue each request, in ms (`x-tollgate-max-wait-ms`).
    #[arg(long)]
    pub max_wait_ms: Option<u64>,
    /// Keep sending after a 429/503 instead of waiting out its retry-after.
    #[arg(long)]
    pub ignore_retry_after: bool,
    /// Also write the summary as JSON to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Do not draw the progress bar (it is also off when stderr is not a terminal).
    #[arg(long)]
    pub no_progress: bool,
    /// Seed for the prompt variants each worker picks, so runs are reproducible.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Per-request timeout covering connect, headers and the whole body.
    #[arg(long, default_value = "60s")]
    pub timeout: humantime::Duration,
}

/// A flag value or combination the run refuses, naming the flag.
#[derive(thiserror::Error, Debug, PartialEq)]
pub enum ArgsError {
    /// A number outside its allowed range.
    #[error("--{flag} must be in {range}, got {got}")]
    OutOfRange {
        /// The flag, without dashes.
        flag: &'static str,
        /// The allowed range, for humans.
        range: String,
        /// The value given.
        got: String,
    },
    /// `--url` is not an absolute http(s) URL.
    #[error("--url must be an absolute http:// or https:// URL, got {0:?}")]
    Url(String),
    /// A value that cannot go into an HTTP header.
    #[error("--{0} contains characters not allowed in an HTTP header")]
    Header(&'static str),
    /// Flags that cannot be combined.
    #[error("{0}")]
    Conflict(&'static str),
}

/// How requests are paced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// `workers` tasks, each sending back to back.
    Closed {
        /// Number of workers.
        workers: usize,
    },
    /// A schedule of `rate_per_s` slots per second, at most `max_in_flight` outstanding.
    Open {
        /// Target requests per second.
        rate_per_s: f64,
        /// Most outstanding requests.
        max_in_flight: usize,
    },
}

/// A validated run: pacing, when to stop, and per-request bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Closed or open loop.
    pub mode: Mode,
    /// Stop sending after this long; `None` when only `--requests` bounds the run.
    pub duration: Option<Duration>,
    /// Stop after this many requests (closed loop) or slots (open loop).
    pub requests: Option<u64>,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Wait out retry-after on 429/503.
    pub honour_retry_after: bool,
}

impl LoadArgs {
    /// Checks every flag and cross-flag rule, returning the plan to run.
    pub fn validate(&self) -> Result<Plan, ArgsError> {
        check_url(&self.url)?;
        if reqwest::header::HeaderValue::from_str(&self.api_key).is_err() {
            return Err(ArgsError::Header("api-key"));
        }
        if reqwest::header::HeaderValue::from_str(&self.model).is_err() || self.model.is_empty() {
            return Err(ArgsError::Header("model"));
        }
        if self.stream && self.api == Api::Embeddings {
            return Err(ArgsError::Conflict(
                "--stream cannot be used with --api embeddings",
            ));
        }
        range("prompt-tokens", self.prompt_tokens, 1, MAX_PROMPT_TOKENS)?;
        range("max-tokens", self.max_tokens, 1, u32::MAX)?;
        let timeout: Duration = self.timeout.into();
        range("timeout", timeout, Duration::from_millis(1), MAX_TIMEOUT)?;
        let mode = self.mode()?;
        let duration = match (self.duration, self.requests) {
            (Some(d), _) => Some(range(
                "duration",
                d.into(),
                Duration::from_millis(1),
                MAX_DURATION,
            )?),
            (None, Some(_)) => None,
            (None, None) => Some(DEFAULT_DURATION),
        };
        if let Some(n) = self.requests {
            range("requests", n, 1, u64::MAX)?;
        }
        Ok(Plan {
            mode,
            duration,
            requests: self.requests,
            timeout,
            honour_retry_after: !self.ignore_retry_after,
        })
    }

    fn mode(&self) -> Result<Mode, ArgsError> {
        match self.rate {
            Some(rate) => {
                if !(rate > 0.0 && rate <= MAX_RATE_PER_S) {
                    return Err(out_of_range("rate", format!("(0, {MAX_RATE_PER_S}]"), rate));
                }
                let max_in_flight = range("max-in-flight", self.max_in_flight, 1, MAX_IN_FLIGHT)?;
                Ok(Mode::Open {
                    rate_per_s: rate,
                    max_in_flight,
                })
            }
            None => {
                let workers = self.concurrency.unwrap_or(DEFAULT_CONCURRENCY);
                let workers = range("concurrency", workers, 1, MAX_CONCURRENCY)?;
                Ok(Mode::Closed { workers })
            }
        }
    }
}

fn check_url(url: &str) -> Result<(), ArgsError> {
    match reqwest::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => Ok(()),
        _ => Err(ArgsError::Url(url.to_owned())),
    }
}

fn range<T: PartialOrd + std::fmt::Debug>(
    flag: &'static str,
    value: T,
    lo: T,
    hi: T,
) -> Result<T, ArgsError> {
    if value < lo || value > hi {
        return Err(out_of_range(flag, format!("[{lo:?}, {hi:?}]"), value));
    }
    Ok(value)
}

fn out_of_range(flag: &'static str, range: String, got: impl std::fmt::Debug) -> ArgsError {
    ArgsError::OutOfRange {
        flag,
        range,
        got: format!("{got:?}"),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        load: LoadArgs,
    }

    fn parse(args: &[&str]) -> Result<LoadArgs, clap::Error> {
        let argv = std::iter::once("load").chain(args.iter().copied());
        Cli::try_parse_from(argv).map(|c| c.load)
    }

    #[test]
    fn defaults_are_a_ten_second_closed_loop_of_eight() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.url, "http://127.0.0.1:8080/v1");
        assert_eq!(args.model, "gpt-4o-mini");
        assert_eq!(args.api, Api::Chat);
        let plan = args.validate().unwrap();
        assert_eq!(plan.mode, Mode::Closed { workers: 8 });
        assert_eq!(plan.duration, Some(Duration::from_secs(10)));
        assert_eq!(plan.requests, None);
        assert_eq!(plan.timeout, Duration::from_secs(60));
        assert!(plan.honour_retry_after);
    }

    #[test]
    fn requests_alone_has_no_time_limit_but_both_keep_both() {
        let plan = parse(&["--requests", "5"]).unwrap().validate().unwrap();
        assert_eq!((plan.duration, plan.requests), (None, Some(5)));
        let plan = parse(&["--requests", "5", "--duration", "2s"])
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(
            (plan.duration, plan.requests),
            (Some(Duration::from_secs(2)), Some(5))
        );
    }

    #[test]
    fn rate_selects_open_loop_and_conflicts_with_concurrency() {
        let plan = parse(&["--rate", "250", "--max-in-flight", "3"])
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(
            plan.mode,
            Mode::Open {
                rate_per_s: 250.0,
                max_in_flight: 3
            }
        );
        assert!(parse(&["--rate", "1", "--concurrency", "2"]).is_err());
    }

    #[test]
    fn out_of_range_values_name_their_flag() {
        let cases: &[(&[&str], &str)] = &[
            (&["--concurrency", "0"], "concurrency"),
            (&["--rate", "0"], "rate"),
            (&["--rate", "NaN"], "rate"),
            (&["--rate", "5", "--max-in-flight", "0"], "max-in-flight"),
            (&["--requests", "0"], "requests"),
            (&["--duration", "0s"], "duration"),
            (&["--timeout", "2h"], "timeout"),
            (&["--prompt-tokens", "0"], "prompt-tokens"),
            (&["--max-tokens", "0"], "max-tokens"),
        ];
        for (argv, flag) in cases {
            let err = parse(argv).unwrap().validate().unwrap_err();
            assert!(err.to_string().contains(flag), "{argv:?}: {err}");
        }
    }

    #[test]
    fn bad_url_key_and_stream_embeddings_are_refused() {
        let err = parse(&["--url", "ftp://x/v1"])
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(matches!(err, ArgsError::Url(_)));
        let err = parse(&["--url", "not a url"])
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(matches!(err, ArgsError::Url(_)));
        let err = parse(&["--api-key", "a\nb"])
            .unwrap()
            .validate()
            .unwrap_err();
        assert_eq!(err, ArgsError::Header("api-key"));
        let err = parse(&["--api", "embeddings", "--stream"])
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(matches!(err, ArgsError::Conflict(_)));
        assert!(parse(&["--api", "nope"]).is_err());
        assert!(parse(&["--priority", "urgent"]).is_err());
    }

    #[test]
    fn every_flag_has_help_text() {
        use clap::CommandFactory;
        let cmd = Cli::command();
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" {
                continue;
            }
            assert!(arg.get_help().is_some(), "--{id} has no help");
        }
    }
}
