//! Every quota one request must fit, decided as one: the account's window (RPM, TPM,
//! ITPM, OTPM, concurrency), the account's day (RPD, TPD over `day_window_ms`) and
//! the window of the model group the request belongs to (OpenAI limits each model,
//! or model family, on its own beside the organisation's limits).
//!
//! Each quota is its own [`SlidingLog`], with the log's exact semantics. A request is
//! admitted iff every log it meets has room: all are checked before any is charged,
//! so a refusal charges nothing anywhere. The refusal reported is the one needing the
//! longest wait (of equals, the first of account, group, day), so its wait is exactly
//! when the same request would fit everywhere if nothing else happened.
//!
//! The day log is charged requests and tokens (prompt + completion, at admission, as
//! TPM); it limits no output, so the output corrections skip it. A request belongs
//! to the first group with a pattern matching its model, to none when none matches;
//! its output correction applies to the account's log and its group's.

use super::config::{MockConfig, ModelLimits};
use super::limits::{Cost, LimitKind, Limits, Shortfall, SlidingLog, WindowUsage};

/// Which quota refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The account's window, concurrency included.
    Account,
    /// The window of the request's model group.
    Group,
    /// The account's day window: RPD and TPD.
    Day,
}

/// What the rate-limit headers report: the account's window, with the model group's
/// figures for each dimension the group limits (OpenAI's headers are per model).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct View {
    pub(super) limits: Limits,
    pub(super) usage: WindowUsage,
}

impl View {
    /// The account's view, each dimension `group` limits replaced by the group's.
    fn merge(account: View, group: Option<View>) -> View {
        let Some(group) = group else {
            return account;
        };
        let (mut limits, mut usage) = (account.limits, account.usage);
        let (their, theirs) = (group.limits, group.usage);
        if their.rpm > 0 {
            limits.rpm = their.rpm;
            usage.requests = theirs.requests;
            usage.reset_ms = theirs.reset_ms;
        }
        if their.tpm > 0 {
            limits.tpm = their.tpm;
            usage.tokens = theirs.tokens;
            usage.tokens_reset_ms = theirs.tokens_reset_ms;
        }
        if their.itpm > 0 {
            limits.itpm = their.itpm;
            usage.input_tokens = theirs.input_tokens;
            usage.input_reset_ms = theirs.input_reset_ms;
        }
        if their.otpm > 0 {
            limits.otpm = their.otpm;
            usage.output_tokens = theirs.output_tokens;
            usage.output_reset_ms = theirs.output_reset_ms;
        }
        View { limits, usage }
    }
}

/// A refusal, with what its message quotes and its headers report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Refused {
    /// The quota that refused.
    pub(super) scope: Scope,
    /// Its limit that needs the longest wait.
    pub(super) kind: LimitKind,
    /// Milliseconds after which the same request would be admitted if nothing else
    /// happened; `None` when unknowable (concurrency) or never (a request larger
    /// than a limit by itself).
    pub(super) retry_after_ms: Option<u64>,
    /// The refusing quota's limits (RPD and TPD as `rpm` and `tpm` for the day).
    pub(super) limits: Limits,
    /// The refusing quota's window without the request.
    pub(super) usage: WindowUsage,
    /// What the headers report, without the request.
    pub(super) view: View,
}

/// The decision on one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Charged to every quota it met.
    Admitted {
        /// Its model group (index in `model_limits`), for its output correction.
        group: Option<usize>,
        /// What the headers report, with the request.
        view: View,
    },
    /// Charged nowhere.
    Refused(Refused),
}

/// One model group: its patterns and its log.
#[derive(Debug)]
struct Group {
    spec: ModelLimits,
    log: SlidingLog,
}

/// One log's finding on a request, before anything is charged.
#[derive(Clone, Copy, Debug)]
struct Checked {
    scope: Scope,
    limits: Limits,
    usage: WindowUsage,
    shortfall: Option<Shortfall>,
}

impl Checked {
    fn of(log: &mut SlidingLog, scope: Scope, now_ms: u64, cost: Cost, in_flight: u64) -> Self {
        let (usage, shortfall) = log.check(now_ms, cost, in_flight);
        Checked {
            scope,
            limits: log.limits(),
            usage,
            shortfall,
        }
    }

    fn view(self) -> View {
        View {
            limits: self.limits,
            usage: self.usage,
        }
    }
}

/// The account's log, its day log and the model groups' logs.
#[derive(Debug)]
pub(super) struct Quotas {
    account: SlidingLog,
    /// `None` when neither RPD nor TPD is limited: no log to keep.
    day: Option<SlidingLog>,
    groups: Vec<Group>,
}

impl Quotas {
    /// The quotas `config` (validated) describes, all empty.
    pub(super) fn new(config: &MockConfig) -> Quotas {
        let minute = |rpm, tpm, itpm, otpm, concurrency| Limits {
            rpm,
            tpm,
            itpm,
            otpm,
            concurrency,
            window_ms: config.window_ms,
        };
        let c = config;
        let account = SlidingLog::new(minute(c.rpm, c.tpm, c.itpm, c.otpm, c.concurrency));
        let day = (c.rpd > 0 || c.tpd > 0).then(|| {
            SlidingLog::new(Limits {
                rpm: c.rpd,
                tpm: c.tpd,
                itpm: 0,
                otpm: 0,
                concurrency: 0,
                window_ms: c.day_window_ms,
            })
        });
        let groups = (c.model_limits.iter())
            .map(|spec| Group {
                log: SlidingLog::new(minute(spec.rpm, spec.tpm, spec.itpm, spec.otpm, 0)),
                spec: spec.clone(),
            })
            .collect();
        Quotas {
            account,
            day,
            groups,
        }
    }

    /// The account's log: the limits and peaks `/stats` reports.
    pub(super) fn account(&self) -> &SlidingLog {
        &self.account
    }

    /// The model group `model` belongs to: the first whose patterns match it.
    pub(super) fn group_of(&self, model: &str) -> Option<usize> {
        self.groups.iter().position(|g| g.spec.matches(model))
    }

    /// Decides a request for `model` costing `cost` at `now_ms` (never earlier than
    /// a previous call) with `in_flight` requests running, and charges every quota
    /// it meets if all have room.
    pub(super) fn try_admit(
        &mut self,
        now_ms: u64,
        model: &str,
        cost: Cost,
        in_flight: u64,
    ) -> Verdict {
        let group = self.group_of(model);
        let mut group_log = log_of(&mut self.groups, group);
        let account = Checked::of(&mut self.account, Scope::Account, now_ms, cost, in_flight);
        let in_group =
            (group_log.as_deref_mut()).map(|log| Checked::of(log, Scope::Group, now_ms, cost, 0));
        let day =
            (self.day.as_mut()).map(|log| Checked::of(log, Scope::Day, now_ms, day_cost(cost), 0));
        if let Some((refusing, shortfall)) = longest_wait([Some(account), in_group, day]) {
            return Verdict::Refused(Refused {
                scope: refusing.scope,
                kind: shortfall.kind,
                retry_after_ms: shortfall.retry_after_ms,
                limits: refusing.limits,
                usage: refusing.usage,
                view: View::merge(account.view(), in_group.map(Checked::view)),
            });
        }
        let account_view = View {
            limits: account.limits,
            usage: self.account.commit(now_ms, cost),
        };
        let group_view = group_log.map(|log| View {
            limits: log.limits(),
            usage: log.commit(now_ms, cost),
        });
        if let Some(log) = &mut self.day {
            log.commit(now_ms, day_cost(cost));
        }
        let view = View::merge(account_view, group_view);
        Verdict::Admitted { group, view }
    }

    /// Gives back `excess` output tokens charged by the admission at `admitted_ms`
    /// in `group`, now that its answer has ended: in the account's log and the
    /// group's (the day limits no output).
    pub(super) fn correct_output(&mut self, admitted_ms: u64, group: Option<usize>, excess: u64) {
        self.account.correct_output(admitted_ms, excess);
        if let Some(log) = log_of(&mut self.groups, group) {
            log.correct_output(admitted_ms, excess);
        }
    }
}

/// The log of `group`, if the request belongs to one. (A function of the field
/// alone, so the account's log can be borrowed beside it.)
fn log_of(groups: &mut [Group], group: Option<usize>) -> Option<&mut SlidingLog> {
    groups.get_mut(group?).map(|g| &mut g.log)
}

/// What the day log is charged: requests and tokens; no output, so no correction.
fn day_cost(cost: Cost) -> Cost {
    Cost { output: 0, ..cost }
}

/// The refusal to report: the one needing the longest wait, since the request fits
/// only once every quota has room (`None`, never, counts as the longest); of equals,
/// the first.
fn longest_wait(checked: [Option<Checked>; 3]) -> Option<(Checked, Shortfall)> {
    let wait = |s: Shortfall| s.retry_after_ms.unwrap_or(u64::MAX);
    let mut worst: Option<(Checked, Shortfall)> = None;
    for found in checked.into_iter().flatten() {
        let Some(shortfall) = found.shortfall else {
            continue;
        };
        if worst.is_none_or(|(_, w)| wait(shortfall) > wait(w)) {
            worst = Some((found, shortfall));
        }
    }
    worst
}

#[cfg(test)]
mod tests;
