//! The progress bar on stderr, redrawn [`TICK`] from the [`Live`] atomics.
//!
//! Off with `--no-progress` or when stderr is not a terminal; then no task runs at all.
//! The bar's length is the run's duration (in ms) or, with only `--requests`, the
//! request count.

use std::io::IsTerminal as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::record::Live;

/// How often the bar is redrawn.
pub(super) const TICK: Duration = Duration::from_millis(250);

/// A running progress bar; [`Progress::finish`] clears it.
#[derive(Debug)]
pub(super) struct Progress {
    bar: ProgressBar,
    task: Option<JoinHandle<()>>,
}

/// What the bar measures against.
#[derive(Debug, Clone, Copy)]
pub(super) enum Goal {
    /// A run of this long.
    Duration(Duration),
    /// A run of this many requests.
    Requests(u64),
}

impl Progress {
    /// Starts the bar if `enabled` and stderr is a terminal.
    pub(super) fn start(enabled: bool, goal: Goal, live: Arc<Live>, start: Instant) -> Progress {
        if !enabled || !std::io::stderr().is_terminal() {
            return Progress {
                bar: ProgressBar::hidden(),
                task: None,
            };
        }
        let len = match goal {
            Goal::Duration(d) => u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            Goal::Requests(n) => n,
        };
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{spinner} [{bar:30}] {msg}") {
            bar.set_style(style.progress_chars("=> "));
        }
        let task = tokio::spawn(redraw(bar.clone(), goal, live, start));
        Progress {
            bar,
            task: Some(task),
        }
    }

    /// Stops redrawing and clears the bar.
    pub(super) fn finish(self) {
        if let Some(task) = self.task {
            task.abort();
        }
        self.bar.finish_and_clear();
    }
}

async fn redraw(bar: ProgressBar, goal: Goal, live: Arc<Live>, start: Instant) {
    let mut tick = tokio::time::interval(TICK);
    let (mut last_done, mut last_at) = (0u64, start);
    loop {
        tick.tick().await;
        let now = Instant::now();
        let done = live.done.load(Ordering::Relaxed);
        let dropped = live.dropped.load(Ordering::Relaxed);
        let dt = now.saturating_duration_since(last_at).as_secs_f64();
        let rate = if dt > 0.0 {
            done.saturating_sub(last_done) as f64 / dt
        } else {
            0.0
        };
        (last_done, last_at) = (done, now);
        let elapsed = now.saturating_duration_since(start);
        let position = match goal {
            Goal::Duration(_) => u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
            Goal::Requests(_) => done + dropped,
        };
        bar.set_position(position);
        let of = match goal {
            Goal::Duration(d) => format!("/{:.0}s", d.as_secs_f64()),
            Goal::Requests(_) => String::new(),
        };
        bar.set_message(format!(
            "{:.1}s{of}  ok {}  429 {}  err {}  dropped {}  {:.0} req/s",
            elapsed.as_secs_f64(),
            live.ok.load(Ordering::Relaxed),
            live.rate_limited.load(Ordering::Relaxed),
            live.errors.load(Ordering::Relaxed),
            dropped,
            rate,
        ));
    }
}
