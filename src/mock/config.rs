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
/// Default length of the day window: a day.
pub const DEFAULT_DAY_WINDOW_MS: u64 = 86_400_000;
/// Most model groups [`MockConfig::model_limits`] may hold: each has a log of its
/// own, and every request is matched against their patterns.
pub const MAX_MODEL_GROUPS: usize = 64;
/// Most patterns one model group may list.
pub const MAX_GROUP_PATTERNS: usize = 64;

/// Everything the mock upstream needs besides its listener.
///
/// Limits of `0` mean unlimited. The account's limits and the model groups' share
/// one sliding window of [`window_ms`](Self::window_ms); the daily quotas have their
/// own of [`day_window_ms`](Self::day_window_ms). A request is admitted only if it
/// fits all of them.
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
    /// Requests admitted per day window, OpenAI's RPD (`0` = unlimited).
    pub rpd: u64,
    /// Tokens (prompt + completion, charged at admission) admitted per day window,
    /// OpenAI's TPD (`0` = unlimited).
    pub tpd: u64,
    /// Length of the day window in milliseconds (default 86 400 000, a day; tests
    /// shorten it).
    pub day_window_ms: u64,
    /// Per-model limits beside the account's, over the same window: a request
    /// belongs to the first group with a pattern matching its model (to none when
    /// none matches) and must fit that group's limits too. At most
    /// [`MAX_MODEL_GROUPS`].
    pub model_limits: Vec<ModelLimits>,
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
    /// A broken or hostile provider, for tests of what the gateway trusts:
    /// added to both figures of every chat completion's reported usage. The
    /// mock's own counting, limits and log are not affected (0: honest).
    pub misreported_usage: u64,
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
            rpd: 0,
            tpd: 0,
            day_window_ms: DEFAULT_DAY_WINDOW_MS,
            model_limits: Vec::new(),
            latency_ms: 0,
            inter_token_ms: 0,
            completion_min_tokens: 16,
            completion_max_tokens: 256,
            seed: 0,
            api_key: None,
            models: Vec::new(),
            log_path: None,
            misreported_usage: 0,
        }
    }
}

/// The limits of one model group (OpenAI limits each model, or model family, on
/// its own beside the organisation's limits), `0` meaning unlimited.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelLimits {
    /// The models of the group: each an exact name, `prefix*`, or `*` alone (any
    /// model).
    pub models: Vec<String>,
    /// Requests per window.
    #[serde(default)]
    pub rpm: u64,
    /// Tokens (prompt + completion) per window.
    #[serde(default)]
    pub tpm: u64,
    /// Input tokens per window.
    #[serde(default)]
    pub itpm: u64,
    /// Output tokens per window, charged and corrected as the account's OTPM.
    #[serde(default)]
    pub otpm: u64,
}

impl ModelLimits {
    /// Whether `model` matches one of the group's patterns.
    pub fn matches(&self, model: &str) -> bool {
        self.models
            .iter()
            .any(|pattern| pattern_matches(pattern, model))
    }

    /// Why the group is malformed, if it is.
    fn check(&self) -> Result<(), String> {
        if self.models.is_empty() {
            return Err("no model pattern".to_owned());
        }
        if self.models.len() > MAX_GROUP_PATTERNS {
            return Err(format!(
                "at most {MAX_GROUP_PATTERNS} model patterns, got {}",
                self.models.len()
            ));
        }
        for pattern in &self.models {
            check_pattern(pattern)?;
        }
        Ok(())
    }
}

/// Whether `model` matches `pattern`: `prefix*` by prefix (`*` alone: any model),
/// anything else exactly.
fn pattern_matches(pattern: &str, model: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => model.starts_with(prefix),
        None => pattern == model,
    }
}

/// Why `pattern` is not a model pattern (an exact name, `prefix*`, or `*`).
fn check_pattern(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() {
        return Err("empty model pattern".to_owned());
    }
    // Only a trailing `*` has a meaning; one elsewhere would silently match nothing.
    if pattern.find('*').is_some_and(|at| at + 1 != pattern.len()) {
        return Err(format!(
            "model pattern {pattern:?}: `*` may only end a pattern"
        ));
    }
    Ok(())
}

impl std::str::FromStr for ModelLimits {
    type Err = String;

    /// `PATTERNS:KEY=N,...`: comma-separated model patterns, a colon, then
    /// comma-separated `rpm`, `tpm`, `itpm`, `otpm` figures, e.g.
    /// `gpt-4o,gpt-4o-2024-*:rpm=500,tpm=30000`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        // The last colon: fine-tuned model names (`ft:gpt-4o:org::id`) hold colons,
        // the figures never do.
        let Some((patterns, figures)) = text.rsplit_once(':') else {
            return Err(format!(
                "expected PATTERNS:KEY=N[,KEY=N...] in {text:?}, found no ':'"
            ));
        };
        let mut limits = ModelLimits {
            models: patterns.split(',').map(|p| p.trim().to_owned()).collect(),
            ..ModelLimits::default()
        };
        limits
            .check()
            .map_err(|reason| format!("{reason} in {text:?}"))?;
        if figures.trim().is_empty() {
            return Err(format!("no limits after ':' in {text:?}"));
        }
        let mut seen: Vec<&str> = Vec::new();
        for pair in figures.split(',') {
            let key = set_figure(&mut limits, pair).map_err(|e| format!("{e} in {text:?}"))?;
            if seen.contains(&key) {
                return Err(format!("{key} given twice in {text:?}"));
            }
            seen.push(key);
        }
        Ok(limits)
    }
}

/// Sets the figure `pair` (`KEY=N`) names; returns its key.
fn set_figure(limits: &mut ModelLimits, pair: &str) -> Result<&'static str, String> {
    let Some((key, value)) = pair.split_once('=') else {
        return Err(format!("expected KEY=N, got {pair:?}"));
    };
    let (key, figure) = match key.trim() {
        "rpm" => ("rpm", &mut limits.rpm),
        "tpm" => ("tpm", &mut limits.tpm),
        "itpm" => ("itpm", &mut limits.itpm),
        "otpm" => ("otpm", &mut limits.otpm),
        other => {
            return Err(format!(
                "unknown limit {other:?} (expected rpm, tpm, itpm or otpm)"
            ));
        }
    };
    *figure = (value.trim().parse::<u64>())
        .map_err(|e| format!("bad number {:?} for {key}: {e}", value.trim()))?;
    Ok(key)
}

/// A configuration the mock refuses to run with; the message names the field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// `window_ms` is zero or above [`MAX_WINDOW_MS`].
    #[error("window_ms must be in 1..={MAX_WINDOW_MS}, got {0}")]
    Window(u64),
    /// `day_window_ms` is zero or above [`MAX_WINDOW_MS`].
    #[error("day_window_ms must be in 1..={MAX_WINDOW_MS}, got {0}")]
    DayWindow(u64),
    /// More model groups than [`MAX_MODEL_GROUPS`].
    #[error("model_limits (--model-limit): at most {MAX_MODEL_GROUPS} model groups, got {0}")]
    TooManyModelGroups(usize),
    /// A model group is malformed.
    #[error("model_limits[{index}] (--model-limit): {reason}")]
    ModelGroup {
        /// Its position in `model_limits`.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
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
    /// The mock a node's `[builtin_mock]` asks for (validated with the config).
    pub fn from_builtin(builtin: &crate::config::BuiltinMockConfig) -> MockConfig {
        let group = |g: &crate::config::ModelLimitConfig| ModelLimits {
            models: g.models.clone(),
            rpm: g.quota.rpm.unwrap_or(0),
            tpm: g.quota.tpm.unwrap_or(0),
            itpm: g.quota.itpm.unwrap_or(0),
            otpm: g.quota.otpm.unwrap_or(0),
        };
        MockConfig {
            rpm: builtin.rpm.unwrap_or(0),
            tpm: builtin.tpm.unwrap_or(0),
            itpm: builtin.itpm.unwrap_or(0),
            otpm: builtin.otpm.unwrap_or(0),
            rpd: builtin.rpd.unwrap_or(0),
            tpd: builtin.tpd.unwrap_or(0),
            concurrency: builtin.concurrency.unwrap_or(0),
            latency_ms: builtin.latency_ms,
            model_limits: builtin.model_limits.iter().map(group).collect(),
            ..MockConfig::default()
        }
    }

    /// Checks the rules that span fields.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.window_ms == 0 || self.window_ms > MAX_WINDOW_MS {
            return Err(ConfigError::Window(self.window_ms));
        }
        if self.day_window_ms == 0 || self.day_window_ms > MAX_WINDOW_MS {
            return Err(ConfigError::DayWindow(self.day_window_ms));
        }
        if self.model_limits.len() > MAX_MODEL_GROUPS {
            return Err(ConfigError::TooManyModelGroups(self.model_limits.len()));
        }
        for (index, group) in self.model_limits.iter().enumerate() {
            group
                .check()
                .map_err(|reason| ConfigError::ModelGroup { index, reason })?;
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
    /// Requests per day window, OpenAI's RPD (0 = unlimited).
    #[arg(long, default_value_t = 0)]
    pub rpd: u64,
    /// Tokens (prompt + completion) per day window, OpenAI's TPD (0 = unlimited).
    #[arg(long, default_value_t = 0)]
    pub tpd: u64,
    /// Day window length, in milliseconds.
    #[arg(long, default_value_t = DEFAULT_DAY_WINDOW_MS)]
    pub day_window_ms: u64,
    /// Limits of one model group beside the account's, over the same window:
    /// comma-separated model patterns (exact, `prefix*` or `*`), a colon, then
    /// comma-separated rpm, tpm, itpm, otpm figures. Repeatable; a request belongs
    /// to the first group that matches its model.
    #[arg(long = "model-limit", value_name = "PATTERNS:KEY=N,...")]
    pub model_limits: Vec<ModelLimits>,
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
            rpd: self.rpd,
            tpd: self.tpd,
            day_window_ms: self.day_window_ms,
            model_limits: self.model_limits,
            latency_ms: self.latency_ms,
            inter_token_ms: self.inter_token_ms,
            completion_min_tokens: self.completion_min.unwrap_or(range.min),
            completion_max_tokens: self.completion_max.unwrap_or(range.max),
            seed: self.seed,
            api_key: self.api_key,
            models: self.models.into_iter().filter(|m| !m.is_empty()).collect(),
            log_path: self.log,
            misreported_usage: 0,
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
    fn model_limit_and_day_flags_parse() {
        let config = parse(&[
            "--model-limit",
            "gpt-4o,gpt-4o-2024-*:rpm=500,tpm=30000",
            "--model-limit=ft:gpt-4o:org::id:otpm=7, itpm=9",
            "--model-limit=*:rpm=1",
            "--rpd=100",
            "--tpd=5000",
            "--day-window-ms=3000",
        ])
        .unwrap();
        let group = |models: &[&str]| ModelLimits {
            models: models.iter().map(|m| (*m).to_owned()).collect(),
            ..ModelLimits::default()
        };
        assert_eq!(
            config.model_limits,
            [
                ModelLimits {
                    rpm: 500,
                    tpm: 30_000,
                    ..group(&["gpt-4o", "gpt-4o-2024-*"])
                },
                ModelLimits {
                    itpm: 9,
                    otpm: 7,
                    ..group(&["ft:gpt-4o:org::id"])
                },
                ModelLimits {
                    rpm: 1,
                    ..group(&["*"])
                },
            ]
        );
        assert_eq!(
            (config.rpd, config.tpd, config.day_window_ms),
            (100, 5000, 3000)
        );
    }

    #[test]
    fn malformed_model_limits_name_the_flag_and_the_reason() {
        let cases = [
            ("gpt-4o", "found no ':'"),
            ("gpt-4o:", "no limits after ':'"),
            (":rpm=1", "empty model pattern"),
            ("a,,b:rpm=1", "empty model pattern"),
            ("gpt-*-mini:rpm=1", "may only end a pattern"),
            ("gpt-4o:rpm", "expected KEY=N"),
            ("gpt-4o:rpd=5", "unknown limit \"rpd\""),
            ("gpt-4o:rpm=x", "bad number \"x\" for rpm"),
            ("gpt-4o:rpm=1,rpm=2", "rpm given twice"),
        ];
        for (flag, reason) in cases {
            let err = parse(&["--model-limit", flag]).unwrap_err();
            assert!(
                err.contains("--model-limit") && err.contains(reason),
                "{flag}: {err}"
            );
        }
        let one = ModelLimits {
            models: vec!["m".to_owned()],
            ..ModelLimits::default()
        };
        let many = MockConfig {
            model_limits: vec![one; MAX_MODEL_GROUPS + 1],
            ..MockConfig::default()
        };
        let err = many.validate().unwrap_err();
        assert_eq!(err, ConfigError::TooManyModelGroups(MAX_MODEL_GROUPS + 1));
        assert!(err.to_string().contains("--model-limit"), "{err}");
        let empty = MockConfig {
            model_limits: vec![ModelLimits::default()],
            ..MockConfig::default()
        };
        assert!(matches!(
            empty.validate(),
            Err(ConfigError::ModelGroup { index: 0, .. })
        ));
        assert!(parse(&["--day-window-ms=0"]).is_err());
    }

    #[test]
    fn patterns_match_exactly_by_prefix_or_all() {
        let group = ModelLimits {
            models: vec!["gpt-4o".to_owned(), "o1-*".to_owned()],
            ..ModelLimits::default()
        };
        assert!(group.matches("gpt-4o") && group.matches("o1-mini"));
        assert!(!group.matches("gpt-4o-mini") && !group.matches("o1"));
        let all = ModelLimits {
            models: vec!["*".to_owned()],
            ..ModelLimits::default()
        };
        assert!(all.matches("anything") && all.matches(""));
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
