//! Checks of what the nodes report of themselves: every permit settled
//! exactly once, and no lease credit spent after its owner let it lapse.

use super::*;

/// One node's permits at the end of a run, from its `/metrics`: every admission of
/// a limiter scope must have been settled once the workload is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settlements {
    /// `tollgate_decisions_total{outcome="admitted"}` over every scope.
    pub admitted: u64,
    /// `tollgate_settlements_total` over every scope and way.
    pub settled: u64,
    /// `tollgate_in_flight_requests`.
    pub in_flight: u64,
}

/// One line of a node's lease audit (`n{i}.lease.jsonl`, the gateway's
/// `tollgate::audit`): a grant it made as an owner, or a spend of owner credit
/// it made as a holder.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LeaseEvent {
    /// `grant` or `spend`.
    pub ev: String,
    /// The limit key.
    pub key: String,
    /// Grants: the holder's member id (`node/generation@address`).
    #[serde(default)]
    pub holder: Option<String>,
    /// The holder's statement the grant answered (spends: whose reply it spent).
    pub seq: u64,
    /// Grants: when the owner stops counting it as credit (its clock, Unix ms).
    #[serde(default)]
    pub until_ms: Option<u64>,
    /// Spends: when (the holder's clock, Unix ms).
    #[serde(default)]
    pub at_ms: Option<u64>,
}

/// Every node's lease audit, read back: the grants of all owners, and each
/// node's spends (with its index).
#[derive(Debug, Clone, Default)]
pub struct LeaseAudit {
    /// Grants, from every node's file.
    pub grants: Vec<LeaseEvent>,
    /// Spends, by node.
    pub spends: Vec<(usize, LeaseEvent)>,
}

/// Lease conservation: no owner credit spent after its owner let it lapse. Each
/// spend (`spends`: the node and its event) is matched to the grant answering the
/// statement it spent from (same node, key and statement); spends without one (an
/// owner killed before its audit was flushed, `redis-lease`'s owner is Redis) are
/// counted, not judged. `clock_slack_ms` forgives clocks set apart on purpose (the
/// `skew` nemesis): an owner running behind lets credit lapse early on paper.
pub fn conservation(audit: &LeaseAudit, clock_slack_ms: u64) -> Check {
    let LeaseAudit { grants, spends } = audit;
    let mut lapsed = Vec::new();
    let (mut matched, mut unmatched) = (0, 0);
    for (node, spend) in spends
        .iter()
        .filter(|(_, s)| !s.key.ends_with(":concurrency"))
    {
        let name = format!("n{node}");
        let grant = grants.iter().find(|g| {
            g.key == spend.key
                && g.seq == spend.seq
                && (g.holder.as_deref()).is_some_and(|h| h.split('/').next() == Some(name.as_str()))
        });
        match (grant.and_then(|g| g.until_ms), spend.at_ms) {
            (Some(until), Some(at)) => {
                matched += 1;
                if at >= until.saturating_add(clock_slack_ms) {
                    lapsed.push(format!(
                        "{name} spent {} credit of statement {} at {at}, {} ms after its owner let it lapse",
                        spend.key,
                        spend.seq,
                        at - until
                    ));
                }
            }
            _ => unmatched += 1,
        }
    }
    Check {
        name: "no lease credit spent after it lapsed".into(),
        ok: lapsed.is_empty(),
        detail: if !lapsed.is_empty() {
            format!("{} of {matched}: {}", lapsed.len(), lapsed.join("; "))
        } else if matched == 0 {
            format!("not judged: no spend matched to its grant ({unmatched} spends)")
        } else {
            format!(
                "{matched} spends of owner credit, each before its grant lapsed ({unmatched} without their grant's line, not judged)"
            )
        },
    }
}

/// Whether every node that answered at the end settled every permit it admitted
/// (its process's lifetime: a restarted node counts from its restart); nodes down
/// at the end are named, not judged.
pub fn settlement(nodes: &[Option<Settlements>]) -> Check {
    let mut unsettled = Vec::new();
    let mut down = Vec::new();
    let mut admitted = 0;
    for (n, figures) in nodes.iter().enumerate() {
        match figures {
            None => down.push(format!("n{n}")),
            Some(f) => {
                admitted += f.admitted;
                if f.settled != f.admitted || f.in_flight != 0 {
                    unsettled.push(format!(
                        "n{n}: {} admitted, {} settled, {} in flight",
                        f.admitted, f.settled, f.in_flight
                    ));
                }
            }
        }
    }
    let not_judged = if down.is_empty() {
        String::new()
    } else {
        format!(" ({} down at the end, not judged)", down.join(", "))
    };
    Check {
        name: "accepted requests are settled".into(),
        ok: unsettled.is_empty() && down.len() < nodes.len(),
        detail: if unsettled.is_empty() {
            format!(
                "every one of {admitted} scope admissions settled, nothing in flight{not_judged}"
            )
        } else {
            format!("{}{not_judged}", unsettled.join("; "))
        },
    }
}
