//! The run's [`Summary`]: built once from the merged [`Recorder`], printed as an aligned
//! table ([`render_table`]) and written as JSON ([`write_json`]). Latencies are in
//! milliseconds, rates per second over the measured (wall-clock) duration.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::args::{Api, LoadArgs, Mode, Plan, Priority};
use super::record::{Outcome, Recorder};

/// Everything a run measured, plus the settings that produced it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Summary {
    /// What was run.
    pub run: RunInfo,
    /// Wall-clock seconds from the first send to the end of the last response.
    pub elapsed_s: f64,
    /// The run was stopped early (Ctrl-C) before its duration or request count.
    pub interrupted: bool,
    /// Requests (and dropped slots) per outcome.
    pub outcomes: Outcomes,
    /// Latency of `ok` requests to the end of the body, from the send (closed loop)
    /// or the slot's due time (open loop); `None` if there were none.
    pub latency_ms: Option<Percentiles>,
    /// Time to first body byte of `ok` streamed requests; `None` without `--stream`.
    pub ttfb_ms: Option<Percentiles>,
    /// Latency of `rate_limited` answers (how long a gateway held them before refusing).
    pub rate_limited_latency_ms: Option<Percentiles>,
    /// Rates over `elapsed_s`.
    pub throughput: Throughput,
    /// Token sums from the responses' `usage`.
    pub tokens: Tokens,
    /// Time spent waiting out retry-after.
    pub backoff: Backoff,
}

/// Pacing of a run.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LoopKind {
    /// Workers send back to back (`--concurrency`).
    Closed,
    /// A schedule at a target rate (`--rate`).
    Open,
}

/// The settings of a run, echoed so a JSON file stands on its own.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct RunInfo {
    /// API exercised.
    pub api: Api,
    /// Base URL.
    pub url: String,
    /// Model requested.
    pub model: String,
    /// Closed or open loop.
    pub mode: LoopKind,
    /// Closed loop: number of workers.
    pub concurrency: Option<usize>,
    /// Open loop: target requests per second.
    pub rate_per_s: Option<f64>,
    /// Open loop: most requests outstanding.
    pub max_in_flight: Option<usize>,
    /// Sending time limit in seconds, if any.
    pub duration_s: Option<f64>,
    /// Request (or slot) limit, if any.
    pub requests: Option<u64>,
    /// Whether responses were streamed.
    pub stream: bool,
    /// Approximate prompt tokens per request.
    pub prompt_tokens: usize,
    /// `max_tokens` per request.
    pub max_tokens: u32,
    /// Lane asked for.
    pub priority: Option<Priority>,
    /// Queueing limit asked for, in ms.
    pub max_wait_ms: Option<u64>,
    /// Whether retry-after was waited out.
    pub honour_retry_after: bool,
    /// RNG seed.
    pub seed: u64,
    /// Per-request timeout in seconds.
    pub timeout_s: f64,
}

/// Counts per outcome.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outcomes {
    /// 2xx.
    pub ok: u64,
    /// 429.
    pub rate_limited: u64,
    /// Other 4xx (and 1xx/3xx).
    pub client_error: u64,
    /// 5xx.
    pub server_error: u64,
    /// Connect, timeout, reset.
    pub transport_error: u64,
    /// Open-loop slots not sent.
    pub dropped: u64,
    /// Sum of the above.
    pub total: u64,
}

impl Outcomes {
    /// The count for `outcome`.
    pub fn get(&self, outcome: Outcome) -> u64 {
        match outcome {
            Outcome::Ok => self.ok,
            Outcome::RateLimited => self.rate_limited,
            Outcome::ClientError => self.client_error,
            Outcome::ServerError => self.server_error,
            Outcome::TransportError => self.transport_error,
            Outcome::Dropped => self.dropped,
        }
    }

    /// Requests actually sent (everything but dropped).
    pub fn sent(&self) -> u64 {
        self.total - self.dropped
    }
}

/// Latency distribution, in milliseconds.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct Percentiles {
    /// Samples.
    pub count: u64,
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest sample.
    pub max: f64,
}

impl Percentiles {
    /// From a histogram in microseconds; `None` when it is empty.
    pub fn from_micros(h: &Histogram<u64>) -> Option<Percentiles> {
        if h.is_empty() {
            return None;
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Some(Percentiles {
            count: h.len(),
            mean: h.mean() / 1000.0,
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
        })
    }
}

/// Rates over the measured duration.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct Throughput {
    /// Requests that got an answer or failed (all but dropped), per second.
    pub requests_per_s: f64,
    /// `ok` requests per second.
    pub ok_per_s: f64,
    /// Prompt plus completion tokens per second.
    pub tokens_per_s: f64,
    /// Completion tokens per second.
    pub completion_tokens_per_s: f64,
}

/// Token sums over `ok` responses.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tokens {
    /// Prompt (input) tokens.
    pub prompt: u64,
    /// Completion (output) tokens.
    pub completion: u64,
    /// Both.
    pub total: u64,
    /// `ok` responses that reported no usage (not counted above).
    pub ok_without_usage: u64,
}

/// Retry-after waits.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Waits taken (closed loop: per worker; open loop: schedule pauses).
    pub waits: u64,
    /// Their total length in seconds (summed over workers in a closed loop).
    pub total_s: f64,
}

impl Summary {
    /// Builds the summary of a run of `elapsed` that recorded `rec`.
    pub fn new(args: &LoadArgs, plan: &Plan, rec: &Recorder, elapsed: Duration) -> Summary {
        let c = |o| rec.count(o);
        let outcomes = Outcomes {
            ok: c(Outcome::Ok),
            rate_limited: c(Outcome::RateLimited),
            client_error: c(Outcome::ClientError),
            server_error: c(Outcome::ServerError),
            transport_error: c(Outcome::TransportError),
            dropped: c(Outcome::Dropped),
            total: rec.counts.iter().sum(),
        };
        let secs = elapsed.as_secs_f64();
        let per_s = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        let total_tokens = rec.prompt_tokens + rec.completion_tokens;
        Summary {
            run: run_info(args, plan),
            elapsed_s: secs,
            interrupted: false,
            outcomes,
            latency_ms: Percentiles::from_micros(&rec.latency_us),
            ttfb_ms: Percentiles::from_micros(&rec.ttfb_us),
            rate_limited_latency_ms: Percentiles::from_micros(&rec.rate_limited_us),
            throughput: Throughput {
                requests_per_s: per_s(outcomes.sent()),
                ok_per_s: per_s(outcomes.ok),
                tokens_per_s: per_s(total_tokens),
                completion_tokens_per_s: per_s(rec.completion_tokens),
            },
            tokens: Tokens {
                prompt: rec.prompt_tokens,
                completion: rec.completion_tokens,
                total: total_tokens,
                ok_without_usage: rec.ok_without_usage,
            },
            backoff: Backoff {
                waits: rec.backoff_waits,
                total_s: rec.backoff.as_secs_f64(),
            },
        }
    }
}

fn run_info(args: &LoadArgs, plan: &Plan) -> RunInfo {
    let (mode, concurrency, rate_per_s, max_in_flight) = match plan.mode {
        Mode::Closed { workers } => (LoopKind::Closed, Some(workers), None, None),
        Mode::Open {
            rate_per_s,
            max_in_flight,
        } => (LoopKind::Open, None, Some(rate_per_s), Some(max_in_flight)),
    };
    RunInfo {
        api: args.api,
        url: args.url.clone(),
        model: args.model.clone(),
        mode,
        concurrency,
        rate_per_s,
        max_in_flight,
        duration_s: plan.duration.map(|d| d.as_secs_f64()),
        requests: plan.requests,
        stream: args.stream,
        prompt_tokens: args.prompt_tokens,
        max_tokens: args.max_tokens,
        priority: args.priority,
        max_wait_ms: args.max_wait_ms,
        honour_retry_after: plan.honour_retry_after,
        seed: args.seed,
        timeout_s: plan.timeout.as_secs_f64(),
    }
}

/// The summary as an aligned, human-readable table (ends with a newline).
pub fn render_table(s: &Summary) -> String {
    let mut out = String::new();
    header(&mut out, s);
    outcomes(&mut out, &s.outcomes);
    latencies(&mut out, s);
    rates(&mut out, s);
    out
}

// Writing into a String cannot fail, so the fmt::Results below are ignored.
fn header(out: &mut String, s: &Summary) {
    let r = &s.run;
    let api = r.api.as_str();
    let stream = if r.stream { ", stream" } else { "" };
    let _ = writeln!(out, "tollgate load: {api} {} at {}{stream}", r.model, r.url);
    let pacing = match r.mode {
        LoopKind::Closed => format!("closed loop, {} workers", r.concurrency.unwrap_or(0)),
        LoopKind::Open => format!(
            "open loop, {} req/s target, at most {} in flight",
            r.rate_per_s.unwrap_or(0.0),
            r.max_in_flight.unwrap_or(0)
        ),
    };
    let mut limits = Vec::new();
    if let Some(d) = r.duration_s {
        limits.push(format!("{d}s"));
    }
    if let Some(n) = r.requests {
        limits.push(format!("{n} requests"));
    }
    let stopped = if s.interrupted { " (interrupted)" } else { "" };
    let _ = writeln!(
        out,
        "{pacing}, stop after {}; ran {:.2}s{stopped}\n",
        limits.join(" or "),
        s.elapsed_s
    );
}

fn outcomes(out: &mut String, o: &Outcomes) {
    let _ = writeln!(out, "{:<16} {:>10} {:>8}", "outcome", "count", "%");
    for outcome in Outcome::ALL {
        let n = o.get(outcome);
        let _ = writeln!(
            out,
            "{:<16} {:>10} {:>7.2}%",
            outcome.name(),
            n,
            percent(n, o.total)
        );
    }
    let _ = writeln!(
        out,
        "{:<16} {:>10} {:>7.2}%\n",
        "total",
        o.total,
        percent(o.total, o.total)
    );
}

fn percent(n: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        n as f64 * 100.0 / total as f64
    }
}

fn latencies(out: &mut String, s: &Summary) {
    let _ = writeln!(
        out,
        "{:<16} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "latency (ms)", "count", "p50", "p90", "p99", "p99.9", "max", "mean"
    );
    let rows = [
        ("ok", s.latency_ms),
        ("ttfb", s.ttfb_ms),
        ("rate_limited", s.rate_limited_latency_ms),
    ];
    for (name, p) in rows {
        match p {
            Some(p) => {
                let _ = writeln!(
                    out,
                    "{name:<16} {:>10} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
                    p.count, p.p50, p.p90, p.p99, p.p999, p.max, p.mean
                );
            }
            None if name == "ttfb" && !s.run.stream => {}
            None => {
                let _ = writeln!(out, "{name:<16} {:>10}", 0);
            }
        }
    }
    out.push('\n');
}

fn rates(out: &mut String, s: &Summary) {
    let (t, k, b) = (&s.throughput, &s.tokens, &s.backoff);
    let _ = writeln!(out, "{:<22} {:>12.1}", "requests/s", t.requests_per_s);
    let _ = writeln!(out, "{:<22} {:>12.1}", "ok/s", t.ok_per_s);
    let _ = writeln!(out, "{:<22} {:>12.1}", "tokens/s", t.tokens_per_s);
    let _ = writeln!(
        out,
        "{:<22} {:>12.1}",
        "completion tokens/s", t.completion_tokens_per_s
    );
    let _ = writeln!(out, "{:<22} {:>12}", "prompt tokens", k.prompt);
    let _ = writeln!(out, "{:<22} {:>12}", "completion tokens", k.completion);
    if k.ok_without_usage > 0 {
        let _ = writeln!(out, "{:<22} {:>12}", "ok without usage", k.ok_without_usage);
    }
    let honour = if s.run.honour_retry_after {
        ""
    } else {
        " (retry-after ignored)"
    };
    let _ = writeln!(
        out,
        "{:<22} {:>11.2}s in {} waits{honour}",
        "retry-after backoff", b.total_s, b.waits
    );
}

/// Writes `summary` as pretty JSON to `path`, or to stdout when `path` is `-`.
pub fn write_json(summary: &Summary, path: &Path) -> anyhow::Result<()> {
    let mut json = serde_json::to_vec_pretty(summary)?;
    json.push(b'\n');
    if path == Path::new("-") {
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(&json)?;
        stdout.flush()?;
        return Ok(());
    }
    std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::load::record::Sample;
    use crate::load::usage::Usage;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        load: LoadArgs,
    }

    fn summary(argv: &[&str], rec: &Recorder, elapsed: Duration) -> Summary {
        let args = Cli::try_parse_from(std::iter::once("load").chain(argv.iter().copied()));
        let args = args.unwrap().load;
        Summary::new(&args, &args.validate().unwrap(), rec, elapsed)
    }

    /// 1000 ok requests of 1..=1000 ms, 1000 rate limited, 2000 dropped, 4 s.
    fn recorder() -> Recorder {
        let mut rec = Recorder::default();
        let usage = Usage {
            prompt: Some(3),
            completion: Some(2),
        };
        for ms in 1..=1000 {
            let latency = Duration::from_millis(ms);
            rec.record(&Sample {
                outcome: Outcome::Ok,
                latency,
                ttfb: None,
                usage,
            });
            let limited = Sample {
                outcome: Outcome::RateLimited,
                latency,
                ttfb: None,
                usage,
            };
            rec.record(&limited);
        }
        rec.record_dropped(2000);
        rec.record_backoff(Duration::from_millis(1500));
        rec
    }

    #[test]
    fn percentiles_rates_and_token_sums() {
        let s = summary(&["--rate", "1000"], &recorder(), Duration::from_secs(4));
        let p = s.latency_ms.unwrap();
        assert_eq!(p.count, 1000);
        // hdrhistogram keeps 3 significant figures: within 0.1 % of the exact rank.
        for (got, want) in [
            (p.p50, 500.0),
            (p.p90, 900.0),
            (p.p99, 990.0),
            (p.p999, 999.0),
        ] {
            assert!((got - want).abs() <= want * 0.001, "{got} vs {want}");
        }
        assert!(
            (p.max - 1000.0).abs() <= 1.0 && (p.mean - 500.5).abs() <= 1.0,
            "{p:?}"
        );
        assert_eq!(s.outcomes.total, 4000);
        assert_eq!(s.outcomes.sent(), 2000);
        assert_eq!(s.throughput.requests_per_s, 500.0);
        assert_eq!(s.throughput.ok_per_s, 250.0);
        assert_eq!(
            (s.tokens.prompt, s.tokens.completion, s.tokens.total),
            (3000, 2000, 5000)
        );
        assert_eq!(s.throughput.tokens_per_s, 1250.0);
        assert_eq!(s.throughput.completion_tokens_per_s, 500.0);
        assert_eq!((s.backoff.waits, s.backoff.total_s), (1, 1.5));
        assert!(s.ttfb_ms.is_none());
    }

    #[test]
    fn table_lists_every_outcome_with_aligned_columns() {
        let s = summary(&["--rate", "1000"], &recorder(), Duration::from_secs(4));
        let table = render_table(&s);
        assert!(
            table.contains("open loop, 1000 req/s target, at most 1024 in flight"),
            "{table}"
        );
        for outcome in Outcome::ALL {
            assert!(table.contains(outcome.name()), "{table}");
        }
        let line = |prefix: &str| {
            table
                .lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("{prefix}"))
        };
        assert!(line("ok ").ends_with("25.00%"), "{table}");
        assert!(line("dropped").ends_with("50.00%"), "{table}");
        assert!(line("total").ends_with("100.00%"), "{table}");
        // Numbers right-align: every outcome row has the same width.
        let widths: Vec<usize> = Outcome::ALL.iter().map(|o| line(o.name()).len()).collect();
        assert!(widths.windows(2).all(|w| w[0] == w[1]), "{table}");
        let header = line("latency (ms)");
        assert!(header.contains("p99.9"));
        let ok_row = table
            .lines()
            .skip_while(|l| !l.starts_with("latency"))
            .nth(1)
            .unwrap();
        assert!(ok_row.starts_with("ok "), "{table}");
        assert_eq!(ok_row.len(), header.len(), "{table}");
        assert!(
            line("retry-after backoff").contains("1.50s in 1 waits"),
            "{table}"
        );
        assert!(!table.contains("ttfb"), "no ttfb row without --stream");
    }

    #[test]
    fn empty_run_renders_without_dividing_by_zero() {
        let s = summary(
            &["--requests", "1", "--stream"],
            &Recorder::default(),
            Duration::ZERO,
        );
        assert_eq!(s.throughput.requests_per_s, 0.0);
        let table = render_table(&s);
        assert!(table.contains("ttfb"), "{table}");
        assert!(table.contains("stop after 1 requests"), "{table}");
        assert!(!table.contains("NaN"), "{table}");
    }
}
