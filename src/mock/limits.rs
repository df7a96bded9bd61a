//! The mock's own limits: an exact sliding log over integer milliseconds, written
//! independently of `crate::limiter` so the oracle shares no code with the gateway it
//! judges.
//!
//! Time is the mock's clock in whole milliseconds (the same `ts_ms` the JSONL log
//! records, minus a constant). An admission at `t` stays in the window for every
//! `now` with `now - t < window_ms`: the window is `(now - window_ms, now]`.
//!
//! A request is admitted iff, with it, the window holds at most `rpm` requests, `tpm`
//! tokens (prompt + completion), `itpm` input tokens and `otpm` output tokens, and
//! fewer than `concurrency` requests are in flight. Nothing is charged on refusal.
//! A decision is two steps, [`SlidingLog::check`] then [`SlidingLog::commit`], so
//! several logs (`super::quotas`: the account's, its day, a model group's) can each
//! be checked before any of them is charged.
//!
//! Output tokens are charged as Anthropic charges OTPM: the request's `max_tokens`
//! at admission (the answer is not written yet), then corrected down to the real
//! output when the answer ends ([`SlidingLog::correct_output`]). A correction only
//! matters while its admission is still in the window.
//!
//! Admissions in the same millisecond share one entry, so the log holds at most
//! `window_ms` entries. Requests, tokens and input tokens are never corrected:
//! entries keep running totals of them, so their retry times are binary searches.
//! Output tokens are kept per entry (corrections change them after the fact), so an
//! OTPM retry time is a scan; refusals are rare.

use std::collections::VecDeque;

/// The limits, `0` meaning unlimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    /// Requests per window.
    pub rpm: u64,
    /// Tokens (prompt + completion) per window.
    pub tpm: u64,
    /// Input (prompt) tokens per window, Anthropic's ITPM.
    #[serde(default)]
    pub itpm: u64,
    /// Output tokens per window, Anthropic's OTPM: `max_tokens` at admission,
    /// corrected to the real output when the answer ends.
    #[serde(default)]
    pub otpm: u64,
    /// Requests in flight.
    pub concurrency: u64,
    /// Window length, in milliseconds.
    pub window_ms: u64,
}

/// Which limit refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LimitKind {
    /// Requests per window.
    Requests,
    /// Tokens per window.
    Tokens,
    /// Input tokens per window.
    InputTokens,
    /// Output tokens per window.
    OutputTokens,
    /// Requests in flight.
    Concurrency,
}

/// What one request is charged at admission.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Cost {
    /// Prompt + completion: the TPM charge.
    pub(super) tokens: u64,
    /// Prompt: the ITPM charge.
    pub(super) input: u64,
    /// Output as estimated at admission (`max_tokens`, or the completion when the
    /// request set none): the OTPM charge until the answer ends.
    pub(super) output: u64,
}

/// What the window holds at a decision (after the admission, if admitted).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct WindowUsage {
    /// Requests in the window.
    pub(super) requests: u64,
    /// Tokens (prompt + completion) in the window.
    pub(super) tokens: u64,
    /// Input tokens in the window.
    pub(super) input_tokens: u64,
    /// Output tokens in the window, corrections included.
    pub(super) output_tokens: u64,
    /// Milliseconds until the window is empty again (the newest entry expires); also
    /// when the requests are back at their full limit.
    pub(super) reset_ms: u64,
    /// Milliseconds until the tokens are back at their full limit, as reported: the
    /// same as `reset_ms` in one log, apart once a model group's figures replace the
    /// account's for one of the two (`super::quotas::View`).
    pub(super) tokens_reset_ms: u64,
    /// Milliseconds until the window holds no input tokens again.
    pub(super) input_reset_ms: u64,
    /// Milliseconds until the window holds no output tokens again.
    pub(super) output_reset_ms: u64,
}

/// The largest window usage seen right after an admission, per dimension.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Peaks {
    /// Requests.
    pub(crate) requests: u64,
    /// Tokens (prompt + completion).
    pub(crate) tokens: u64,
    /// Input tokens.
    pub(crate) input_tokens: u64,
    /// Output tokens, as charged (estimates not yet corrected included).
    pub(crate) output_tokens: u64,
}

/// Why a log cannot take a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Shortfall {
    /// The limit that needs the longest wait.
    pub(super) kind: LimitKind,
    /// Milliseconds after which the same request would fit if nothing else happened;
    /// `None` when unknowable (concurrency) or never (a request larger than a limit
    /// by itself).
    pub(super) retry_after_ms: Option<u64>,
}

/// The outcome of [`SlidingLog::try_admit`].
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Decision {
    /// Charged; the usage includes this request.
    Admitted(WindowUsage),
    /// Not charged.
    Refused {
        /// The limit that needs the longest wait.
        kind: LimitKind,
        /// Milliseconds after which the same request would be admitted if nothing
        /// else happened; `None` when unknowable (concurrency) or never (a request
        /// larger than a limit by itself).
        retry_after_ms: Option<u64>,
        /// Usage of the window without this request.
        usage: WindowUsage,
    },
}

/// Running totals since start of the quantities never corrected.
#[derive(Clone, Copy, Debug, Default)]
struct Totals {
    requests: u64,
    tokens: u64,
    input: u64,
}

impl Totals {
    /// The running total of `kind`; output and concurrency have none (output is
    /// kept per entry, concurrency is not a window), so they read 0.
    fn get(self, kind: LimitKind) -> u64 {
        match kind {
            LimitKind::Requests => self.requests,
            LimitKind::Tokens => self.tokens,
            LimitKind::InputTokens => self.input,
            LimitKind::OutputTokens | LimitKind::Concurrency => 0,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    at_ms: u64,
    /// Totals admitted since start, up to and including this entry.
    total: Totals,
    /// Output tokens charged by this entry's admissions, corrections applied.
    output: u64,
}

/// The sliding log and the peaks it has seen.
#[derive(Debug)]
pub(super) struct SlidingLog {
    limits: Limits,
    entries: VecDeque<Entry>,
    total: Totals,
    /// The totals of the newest entry that has left the window.
    expired: Totals,
    /// Output tokens the entries in the log hold.
    window_output: u64,
    peaks: Peaks,
}

impl SlidingLog {
    /// An empty log enforcing `limits` (`limits.window_ms` must be positive).
    pub(super) fn new(limits: Limits) -> Self {
        debug_assert!(limits.window_ms > 0);
        SlidingLog {
            limits,
            entries: VecDeque::new(),
            total: Totals::default(),
            expired: Totals::default(),
            window_output: 0,
            peaks: Peaks::default(),
        }
    }

    /// The limits enforced.
    pub(super) fn limits(&self) -> Limits {
        self.limits
    }

    /// Largest window usage seen right after an admission, per dimension.
    pub(super) fn peaks(&self) -> Peaks {
        self.peaks
    }

    /// Decides one request costing `cost` at `now_ms` (never earlier than a previous
    /// call) with `in_flight` requests running, and charges it if admitted.
    #[cfg(test)]
    pub(super) fn try_admit(&mut self, now_ms: u64, cost: Cost, in_flight: u64) -> Decision {
        match self.check(now_ms, cost, in_flight) {
            (usage, Some(shortfall)) => Decision::Refused {
                kind: shortfall.kind,
                retry_after_ms: shortfall.retry_after_ms,
                usage,
            },
            (_, None) => Decision::Admitted(self.commit(now_ms, cost)),
        }
    }

    /// Whether a request costing `cost` fits at `now_ms` (never earlier than a
    /// previous call) with `in_flight` requests running, charging nothing: the
    /// window without it, and what keeps it out (`None`: it fits).
    pub(super) fn check(
        &mut self,
        now_ms: u64,
        cost: Cost,
        in_flight: u64,
    ) -> (WindowUsage, Option<Shortfall>) {
        self.expire(now_ms);
        let usage = self.usage(now_ms);
        let limits = self.limits;
        if limits.concurrency > 0 && in_flight >= limits.concurrency {
            let shortfall = Shortfall {
                kind: LimitKind::Concurrency,
                retry_after_ms: None,
            };
            return (usage, Some(shortfall));
        }
        (usage, self.refusal(now_ms, cost, usage))
    }

    /// Charges `cost` at `now_ms`, for which [`Self::check`] at the same `now_ms`
    /// found room, and returns the window with it.
    pub(super) fn commit(&mut self, now_ms: u64, cost: Cost) -> WindowUsage {
        self.charge(now_ms, cost);
        let usage = self.usage(now_ms);
        let peaks = &mut self.peaks;
        peaks.requests = peaks.requests.max(usage.requests);
        peaks.tokens = peaks.tokens.max(usage.tokens);
        peaks.input_tokens = peaks.input_tokens.max(usage.input_tokens);
        peaks.output_tokens = peaks.output_tokens.max(usage.output_tokens);
        debug_assert!(
            window_checks(self.limits, usage, Cost::default())
                .iter()
                .all(|&(_, limit, used, _)| limit == 0 || used <= limit)
        );
        usage
    }

    /// Gives back `excess` output tokens charged by the admission at `admitted_ms`
    /// (its estimate minus its real output), now that its answer has ended. Once the
    /// admission has left the window there is nothing to give back.
    pub(super) fn correct_output(&mut self, admitted_ms: u64, excess: u64) {
        let index = self.entries.partition_point(|e| e.at_ms < admitted_ms);
        let Some(entry) = self.entries.get_mut(index) else {
            return;
        };
        if entry.at_ms != admitted_ms {
            return;
        }
        // An entry holds at least the estimates of its own admissions.
        debug_assert!(entry.output >= excess);
        let excess = excess.min(entry.output);
        entry.output -= excess;
        self.window_output -= excess;
    }

    /// The limit `cost` would exceed that needs the longest wait, with that wait;
    /// `None` when every limit has room.
    fn refusal(&self, now_ms: u64, cost: Cost, usage: WindowUsage) -> Option<Shortfall> {
        let mut refusal: Option<Shortfall> = None;
        for (kind, limit, used, amount) in window_checks(self.limits, usage, cost) {
            let with = used.saturating_add(amount);
            if limit == 0 || with <= limit {
                continue;
            }
            let wait = if amount > limit {
                None
            } else {
                self.wait_ms(now_ms, kind, with - limit)
            };
            // Report the limit with the longest wait, so waiting it out suffices.
            let longer =
                |r: Shortfall| wait.unwrap_or(u64::MAX) > r.retry_after_ms.unwrap_or(u64::MAX);
            if refusal.is_none_or(longer) {
                refusal = Some(Shortfall {
                    kind,
                    retry_after_ms: wait,
                });
            }
        }
        refusal
    }

    fn expire(&mut self, now_ms: u64) {
        while let Some(front) = self.entries.front() {
            if now_ms - front.at_ms.min(now_ms) < self.limits.window_ms {
                break;
            }
            self.expired = front.total;
            self.window_output -= front.output;
            self.entries.pop_front();
        }
    }

    fn usage(&self, now_ms: u64) -> WindowUsage {
        let held = |kind| self.total.get(kind) - self.expired.get(kind);
        let reset_ms = (self.entries.back()).map_or(0, |e| self.expires_in(e, now_ms));
        WindowUsage {
            requests: held(LimitKind::Requests),
            tokens: held(LimitKind::Tokens),
            input_tokens: held(LimitKind::InputTokens),
            output_tokens: self.window_output,
            reset_ms,
            tokens_reset_ms: reset_ms,
            input_reset_ms: self.summed_reset_ms(now_ms, LimitKind::InputTokens),
            output_reset_ms: self.output_reset_ms(now_ms),
        }
    }

    /// Milliseconds until `entry` leaves the window.
    fn expires_in(&self, entry: &Entry, now_ms: u64) -> u64 {
        (entry.at_ms + self.limits.window_ms).saturating_sub(now_ms)
    }

    /// Milliseconds until the window holds none of `kind` (a running total): when
    /// the newest entry that added some leaves it.
    fn summed_reset_ms(&self, now_ms: u64, kind: LimitKind) -> u64 {
        let current = self.total.get(kind);
        if current == self.expired.get(kind) {
            return 0;
        }
        let index = self
            .entries
            .partition_point(|e| e.total.get(kind) < current);
        self.entries
            .get(index)
            .map_or(0, |e| self.expires_in(e, now_ms))
    }

    /// Milliseconds until the window holds no output tokens: a scan from the newest
    /// entry, which nearly always holds some (skipped when OTPM is not limited).
    fn output_reset_ms(&self, now_ms: u64) -> u64 {
        if self.limits.otpm == 0 || self.window_output == 0 {
            return 0;
        }
        (self.entries.iter().rev())
            .find(|e| e.output > 0)
            .map_or(0, |e| self.expires_in(e, now_ms))
    }

    /// Milliseconds until at least `amount` of `kind` has left the window, or `None`
    /// if the window does not hold that much.
    fn wait_ms(&self, now_ms: u64, kind: LimitKind, amount: u64) -> Option<u64> {
        let freeing = if kind == LimitKind::OutputTokens {
            let mut freed = 0u64;
            self.entries.iter().find(|e| {
                freed = freed.saturating_add(e.output);
                freed >= amount
            })
        } else {
            let expired = self.expired.get(kind);
            let index = self
                .entries
                .partition_point(|e| e.total.get(kind) - expired < amount);
            self.entries.get(index)
        };
        freeing.map(|e| e.at_ms + self.limits.window_ms - now_ms)
    }

    /// Charges `cost` at `now_ms`. Saturating: a request's `max_tokens` is the
    /// client's number, and an unlimited dimension admits any.
    fn charge(&mut self, now_ms: u64, cost: Cost) {
        self.total.requests = self.total.requests.saturating_add(1);
        self.total.tokens = self.total.tokens.saturating_add(cost.tokens);
        self.total.input = self.total.input.saturating_add(cost.input);
        self.window_output = self.window_output.saturating_add(cost.output);
        match self.entries.back_mut() {
            Some(back) if back.at_ms == now_ms => {
                back.total = self.total;
                back.output = back.output.saturating_add(cost.output);
            }
            _ => self.entries.push_back(Entry {
                at_ms: now_ms,
                total: self.total,
                output: cost.output,
            }),
        }
    }
}

/// Each windowed limit with what the window holds of it and what `cost` adds:
/// `(kind, limit, used, amount)`, in the order ties are reported.
fn window_checks(
    limits: Limits,
    usage: WindowUsage,
    cost: Cost,
) -> [(LimitKind, u64, u64, u64); 4] {
    [
        (LimitKind::Requests, limits.rpm, usage.requests, 1),
        (LimitKind::Tokens, limits.tpm, usage.tokens, cost.tokens),
        (
            LimitKind::InputTokens,
            limits.itpm,
            usage.input_tokens,
            cost.input,
        ),
        (
            LimitKind::OutputTokens,
            limits.otpm,
            usage.output_tokens,
            cost.output,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(rpm: u64, tpm: u64, concurrency: u64) -> SlidingLog {
        SlidingLog::new(Limits {
            rpm,
            tpm,
            concurrency,
            window_ms: 1000,
            ..limits_off()
        })
    }

    fn limits_off() -> Limits {
        Limits {
            rpm: 0,
            tpm: 0,
            itpm: 0,
            otpm: 0,
            concurrency: 0,
            window_ms: 1000,
        }
    }

    /// A request costing `n` tokens, no input or output limits involved.
    fn tokens(n: u64) -> Cost {
        Cost {
            tokens: n,
            ..Cost::default()
        }
    }

    fn input(n: u64) -> Cost {
        Cost {
            tokens: n,
            input: n,
            output: 0,
        }
    }

    fn output(n: u64) -> Cost {
        Cost {
            output: n,
            ..Cost::default()
        }
    }

    fn refused(d: Decision) -> (LimitKind, Option<u64>) {
        match d {
            Decision::Refused {
                kind,
                retry_after_ms,
                ..
            } => (kind, retry_after_ms),
            Decision::Admitted(u) => panic!("expected a refusal, got {u:?}"),
        }
    }

    fn admitted(d: Decision) -> WindowUsage {
        match d {
            Decision::Admitted(usage) => usage,
            Decision::Refused { kind, .. } => panic!("expected an admission, refused on {kind:?}"),
        }
    }

    #[test]
    fn rpm_admits_exactly_n_and_retry_is_exact() {
        let mut l = log(3, 0, 0);
        for t in [0, 10, 20] {
            admitted(l.try_admit(t, tokens(1), 0));
        }
        assert_eq!(
            refused(l.try_admit(500, tokens(1), 0)),
            (LimitKind::Requests, Some(500))
        );
        // One millisecond early is still refused; on time is admitted.
        assert_eq!(
            refused(l.try_admit(999, tokens(1), 0)),
            (LimitKind::Requests, Some(1))
        );
        let usage = admitted(l.try_admit(1000, tokens(1), 0));
        assert_eq!((usage.requests, usage.tokens, usage.reset_ms), (3, 3, 1000));
        assert_eq!((l.peaks().requests, l.peaks().tokens), (3, 3));
    }

    #[test]
    fn tpm_retry_waits_for_enough_tokens_to_expire() {
        let mut l = log(0, 100, 0);
        admitted(l.try_admit(0, tokens(30), 0));
        admitted(l.try_admit(100, tokens(30), 0));
        admitted(l.try_admit(200, tokens(30), 0));
        // 90 used; 50 more needs 40 freed: the first two entries, so until 100 + 1000.
        assert_eq!(
            refused(l.try_admit(300, tokens(50), 0)),
            (LimitKind::Tokens, Some(800))
        );
        assert!(matches!(
            l.try_admit(1099, tokens(50), 0),
            Decision::Refused { .. }
        ));
        admitted(l.try_admit(1100, tokens(50), 0));
        // Larger than the limit: never admitted, no retry time.
        assert_eq!(
            refused(l.try_admit(5000, tokens(101), 0)),
            (LimitKind::Tokens, None)
        );
        assert_eq!((l.peaks().requests, l.peaks().tokens), (3, 90));
    }

    #[test]
    fn longest_wait_is_reported_and_nothing_is_charged() {
        let mut l = log(2, 100, 0);
        admitted(l.try_admit(0, tokens(90), 0));
        admitted(l.try_admit(600, tokens(5), 0));
        // Requests free at 1000 (wait 300), tokens need the entry at 0 gone too; at
        // 700 both free at 1000, so: tokens 300 vs requests 300 -> requests kept.
        let (kind, wait) = refused(l.try_admit(700, tokens(50), 0));
        assert_eq!((kind, wait), (LimitKind::Requests, Some(300)));
        assert_eq!((l.peaks().requests, l.peaks().tokens), (2, 95));
        let mut l = log(3, 100, 0);
        admitted(l.try_admit(0, tokens(10), 0));
        admitted(l.try_admit(500, tokens(80), 0));
        admitted(l.try_admit(600, tokens(1), 0));
        // Requests free at 1000 (wait 300); 50 tokens need the 80 gone: 1500.
        assert_eq!(
            refused(l.try_admit(700, tokens(50), 0)),
            (LimitKind::Tokens, Some(800))
        );
    }

    #[test]
    fn concurrency_is_checked_first_and_same_ms_entries_merge() {
        let mut l = log(0, 0, 2);
        admitted(l.try_admit(5, tokens(1), 1));
        assert_eq!(
            refused(l.try_admit(5, tokens(1), 2)),
            (LimitKind::Concurrency, None)
        );
        admitted(l.try_admit(5, tokens(1), 0));
        assert_eq!(l.entries.len(), 1);
        assert_eq!((l.peaks().requests, l.peaks().tokens), (2, 2));
    }

    #[test]
    fn itpm_refuses_with_an_exact_retry() {
        let mut l = SlidingLog::new(Limits {
            itpm: 100,
            ..limits_off()
        });
        admitted(l.try_admit(0, input(60), 0));
        let usage = admitted(l.try_admit(300, input(30), 0));
        assert_eq!((usage.input_tokens, usage.input_reset_ms), (90, 1000));
        // 50 more needs 40 freed: the 60 at 0 leaves at 1000.
        assert_eq!(
            refused(l.try_admit(500, input(50), 0)),
            (LimitKind::InputTokens, Some(500))
        );
        assert_eq!(
            refused(l.try_admit(999, input(50), 0)),
            (LimitKind::InputTokens, Some(1))
        );
        let usage = admitted(l.try_admit(1000, input(50), 0));
        assert_eq!(usage.input_tokens, 80);
        assert_eq!(l.peaks().input_tokens, 90);
    }

    #[test]
    fn otpm_charges_max_tokens_then_the_correction_frees_the_rest() {
        let mut l = SlidingLog::new(Limits {
            otpm: 100,
            ..limits_off()
        });
        // max_tokens 80 at admission; the answer will be 10 tokens long.
        let usage = admitted(l.try_admit(0, output(80), 0));
        assert_eq!((usage.output_tokens, usage.output_reset_ms), (80, 1000));
        assert_eq!(
            refused(l.try_admit(10, output(30), 0)),
            (LimitKind::OutputTokens, Some(990))
        );
        // The answer ends: 70 of the 80 come back while the admission is in the window.
        l.correct_output(0, 70);
        let usage = admitted(l.try_admit(20, output(30), 0));
        assert_eq!(usage.output_tokens, 40);
        // 90 more needs 30 freed: the 10 left at 0 is not enough, the 30 at 20 leave at 1020.
        assert_eq!(
            refused(l.try_admit(30, output(90), 0)),
            (LimitKind::OutputTokens, Some(990))
        );
        assert_eq!(l.peaks().output_tokens, 80);
        // Once an admission has left the window its correction changes nothing.
        let usage = admitted(l.try_admit(1020, output(100), 0));
        assert_eq!(usage.output_tokens, 100);
        l.correct_output(20, 30);
        assert_eq!(l.window_output, 100);
        l.correct_output(1020, 60);
        assert_eq!(l.window_output, 40);
    }

    #[test]
    fn a_request_alone_above_otpm_is_refused_without_retry_and_not_charged() {
        let mut l = SlidingLog::new(Limits {
            otpm: 100,
            rpm: 5,
            ..limits_off()
        });
        assert_eq!(
            refused(l.try_admit(0, output(101), 0)),
            (LimitKind::OutputTokens, None)
        );
        let usage = admitted(l.try_admit(0, output(100), 0));
        assert_eq!((usage.requests, usage.output_tokens), (1, 100));
    }

    /// One admission of the naive model: when, what it cost, its real output and
    /// when its answer ends.
    #[derive(Clone, Copy, Debug)]
    struct Naive {
        at: u64,
        cost: Cost,
        real_output: u64,
        ends: u64,
        corrected: bool,
    }

    const TRACE: Limits = Limits {
        rpm: 20,
        tpm: 900,
        itpm: 500,
        otpm: 400,
        concurrency: 6,
        window_ms: 1000,
    };

    /// The naive window at `at` (`[requests, tokens, input, output]`), with the
    /// corrections of the answers ended by `known`.
    fn naive_usage(admitted: &[Naive], at: u64, known: u64) -> [u64; 4] {
        let mut sums = [0; 4];
        for a in admitted.iter().filter(|a| at - a.at < TRACE.window_ms) {
            let output = if a.ends <= known {
                a.real_output
            } else {
                a.cost.output
            };
            for (sum, add) in sums
                .iter_mut()
                .zip([1, a.cost.tokens, a.cost.input, output])
            {
                *sum += add;
            }
        }
        sums
    }

    fn naive_fits(sums: [u64; 4], cost: Cost) -> bool {
        let limits = [TRACE.rpm, TRACE.tpm, TRACE.itpm, TRACE.otpm];
        let amounts = [1, cost.tokens, cost.input, cost.output];
        (0..4).all(|i| sums[i] + amounts[i] <= limits[i])
    }

    fn dimension(kind: LimitKind) -> usize {
        match kind {
            LimitKind::Requests => 0,
            LimitKind::Tokens => 1,
            LimitKind::InputTokens => 2,
            LimitKind::OutputTokens => 3,
            LimitKind::Concurrency => unreachable!("concurrency is not a window"),
        }
    }

    /// A refusal is right: concurrency exactly when full; no retry exactly when the
    /// request alone is over the limit named; otherwise the retry is the first
    /// millisecond at which everything fits, corrections frozen as of now.
    fn check_refusal(
        admitted: &[Naive],
        now: u64,
        cost: Cost,
        kind: LimitKind,
        retry: Option<u64>,
    ) {
        let in_flight = admitted.iter().filter(|a| a.ends > now).count() as u64;
        let full = in_flight >= TRACE.concurrency;
        assert_eq!(kind == LimitKind::Concurrency, full, "now={now} {kind:?}");
        if full {
            assert_eq!(retry, None, "now={now}");
            return;
        }
        let limits = [TRACE.rpm, TRACE.tpm, TRACE.itpm, TRACE.otpm];
        let amounts = [1, cost.tokens, cost.input, cost.output];
        let Some(wait) = retry else {
            let i = dimension(kind);
            assert!(amounts[i] > limits[i], "now={now} {kind:?}");
            return;
        };
        assert!(
            naive_fits(naive_usage(admitted, now + wait, now), cost),
            "now={now}"
        );
        assert!(
            !naive_fits(naive_usage(admitted, now + wait - 1, now), cost),
            "now={now}"
        );
    }

    /// Brute-force replay: the log's decisions, usage, retry times and peaks equal a
    /// naive window sum over every dimension, output corrections included.
    #[test]
    fn matches_naive_window_over_a_seeded_trace() {
        use rand::{Rng, SeedableRng};
        let seed = 7;
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let mut l = SlidingLog::new(TRACE);
        let mut admitted: Vec<Naive> = Vec::new();
        let mut peaks = [0u64; 4];
        let mut now = 0;
        for _ in 0..5000 {
            now += rng.random_range(0..40);
            // Answers that ended by now give back what their estimate overcharged.
            for a in (admitted.iter_mut()).filter(|a| !a.corrected && a.ends <= now) {
                l.correct_output(a.at, a.cost.output - a.real_output);
                a.corrected = true;
            }
            let (prompt, real) = (rng.random_range(1..80), rng.random_range(0..60));
            let estimate = if rng.random_bool(0.5) {
                real + rng.random_range(0..420)
            } else {
                real
            };
            let cost = Cost {
                tokens: prompt + real,
                input: prompt,
                output: estimate,
            };
            let in_flight = admitted.iter().filter(|a| a.ends > now).count() as u64;
            let sums = naive_usage(&admitted, now, now);
            let expect = in_flight < TRACE.concurrency && naive_fits(sums, cost);
            match l.try_admit(now, cost, in_flight) {
                Decision::Admitted(usage) => {
                    assert!(expect, "seed={seed} now={now}: admitted");
                    // At least 1 ms: an answer ends after its admission.
                    let ends = now + rng.random_range(1..150);
                    admitted.push(Naive {
                        at: now,
                        cost,
                        real_output: real,
                        ends,
                        corrected: false,
                    });
                    let after = naive_usage(&admitted, now, now);
                    let got = [
                        usage.requests,
                        usage.tokens,
                        usage.input_tokens,
                        usage.output_tokens,
                    ];
                    assert_eq!(got, after, "seed={seed} now={now}");
                    for (peak, sum) in peaks.iter_mut().zip(after) {
                        *peak = (*peak).max(sum);
                    }
                }
                Decision::Refused {
                    kind,
                    retry_after_ms,
                    ..
                } => {
                    assert!(!expect, "seed={seed} now={now}: refused on {kind:?}");
                    check_refusal(&admitted, now, cost, kind, retry_after_ms);
                }
            }
        }
        let p = l.peaks();
        assert_eq!(
            [p.requests, p.tokens, p.input_tokens, p.output_tokens],
            peaks
        );
        assert!(
            admitted.len() > 200,
            "the trace barely admits: {}",
            admitted.len()
        );
    }
}
