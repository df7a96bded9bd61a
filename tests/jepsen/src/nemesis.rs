//! Nemeses: faults scheduled from the seed on one timeline, applied to the hosts
//! (iptables in each namespace) and the processes (signals).
//!
//! Each nemesis becomes a start and an end action at seeded times (start in the
//! first third of the run, end in the last third, the victim drawn from the
//! seed), so `--nemesis partition,kill` overlaps them and the same seed replays
//! the same schedule. Faults undo only their own rules.

use crate::hosts::{Host, Net};
use crate::procs::Proc;
use anyhow::bail;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::path::Path;

/// Packet loss of the `loss` nemesis between nodes, in percent.
pub const LOSS_PERCENT: u8 = 30;

/// The `slow` nemesis's shaping of every node's egress (tbf: these kernels have
/// no `netem`, so no fixed delay; a token bucket delays whatever exceeds its rate
/// by up to its latency, then drops): gossip, lease RPC and responses queue.
pub const SLOW_TBF: [&str; 6] = ["rate", "96kbit", "burst", "4kb", "latency", "400ms"];

/// How far behind the `skew` nemesis sets a node's clock, in seconds.
pub const SKEW_SECONDS: i64 = -2;

/// How far the `wall-step` nemesis steps the machine's wall clock forward (and
/// back at its end), in ms: just under the bucket shift's `SKEW_TOLERANCE_MS`
/// (100), the largest skew a `redis-lease` holder running behind Redis `TIME`
/// is not corrected for. A step moves `CLOCK_REALTIME` and not `CLOCK_MONOTONIC`
/// (a suspend, a frozen VM, a VM's time sync): a node clock that ignores it runs 90 ms
/// behind Redis for the rest of the run (41 of L = 40 sent in 2 of 4 seeds).
pub const WALL_STEP_MS: u64 = 90;

/// libfaketime's preload library (Debian's `faketime` package).
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The nemeses the harness knows, as named on the command line.
pub const NAMES: &[&str] = &[
    "none",
    "partition",
    "isolate",
    "island",
    "bridge",
    "kill",
    "pause",
    "restart",
    "loss",
    "slow",
    "skew",
    "wall-step",
    "redis-kill",
    "intruder",
];

/// One thing done to the cluster at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Drop all traffic between each pair (both directions).
    Cut(Vec<(usize, usize)>),
    /// Undo those cuts.
    Uncut(Vec<(usize, usize)>),
    /// Cut a node from every other node and from Redis (it still reaches its
    /// clients and the upstream): in `redis` mode, a node that loses Redis where
    /// no peer can hear it say so.
    Island(usize),
    /// Undo that.
    Unisland(usize),
    /// Drop [`LOSS_PERCENT`] of the packets between each pair.
    Lossy(Vec<(usize, usize)>),
    /// Undo that loss.
    Unlossy(Vec<(usize, usize)>),
    /// kill -9 of a node.
    Kill(usize),
    /// Start a killed node again (same config, same address).
    Start(usize),
    /// SIGSTOP of a node.
    Stop(usize),
    /// SIGCONT of a node.
    Cont(usize),
    /// Shape every node's egress with [`SLOW_TBF`].
    Slow,
    /// Remove the shaping.
    Unslow,
    /// Stop a node (SIGTERM) and start it with its clock [`SKEW_SECONDS`] off.
    Skew(usize),
    /// Stop it and start it with the true clock.
    Unskew(usize),
    /// Step the machine's wall clock (every process's) [`WALL_STEP_MS`] forward.
    WallStep,
    /// Step it back by as much.
    WallUnstep,
    /// kill -9 of Redis.
    KillRedis,
    /// Start Redis again (its AOF brings the windows back).
    StartRedis,
    /// Start the intruders on a node's host (`crate::intruder`).
    Intrude(usize),
    /// Check what they achieved, and stop them.
    Unintrude(usize),
}

/// An action at a fraction of the run's duration.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// When, as a fraction of the duration.
    pub at: f64,
    /// What.
    pub action: Action,
    /// The nemesis it belongs to (for the report and the timeline's bands).
    pub nemesis: String,
}

/// Every pair (a, b) with a in `left` and b in `right`.
fn pairs(left: &[usize], right: &[usize]) -> Vec<(usize, usize)> {
    (left.iter())
        .flat_map(|a| right.iter().map(move |b| (*a, *b)))
        .collect()
}

/// The schedule of `nemeses` over `nodes` nodes, from `seed`, sorted by time.
pub fn schedule(nemeses: &[String], nodes: usize, seed: u64) -> anyhow::Result<Vec<Step>> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x006e_656d_6573_6973);
    let mut steps = Vec::new();
    let all: Vec<usize> = (0..nodes).collect();
    let mut victims: Vec<usize> = Vec::new();
    for name in nemeses {
        let start = rng.random_range(0.2..0.34);
        let end = rng.random_range(0.62..0.75);
        // Each nemesis its own victim while there are nodes left: two faults that
        // stop and start the same process would interleave its restarts.
        let free: Vec<usize> = all
            .iter()
            .copied()
            .filter(|n| !victims.contains(n))
            .collect();
        let victim = match free.len() {
            0 => rng.random_range(0..nodes.max(1)),
            k => free[rng.random_range(0..k)],
        };
        victims.push(victim);
        let (on, off) = match name.as_str() {
            "none" => continue,
            // Halves: the first half of the nodes against the rest.
            "partition" => {
                let cut = pairs(&all[..nodes / 2], &all[nodes / 2..]);
                (Action::Cut(cut.clone()), Action::Uncut(cut))
            }
            // One node alone against the rest.
            "isolate" => {
                let rest: Vec<usize> = all.iter().copied().filter(|n| *n != victim).collect();
                let cut = pairs(&[victim], &rest);
                (Action::Cut(cut.clone()), Action::Uncut(cut))
            }
            "island" => (Action::Island(victim), Action::Unisland(victim)),
            // Two sides that cannot talk, and one node (the bridge) that sees both:
            // each side believes a different majority is up.
            "bridge" => {
                if nodes < 3 {
                    bail!("nemesis bridge needs at least 3 nodes");
                }
                let bridge = victim;
                let others: Vec<usize> = all.iter().copied().filter(|n| *n != bridge).collect();
                let (left, right) = others.split_at(others.len() / 2);
                let cut = pairs(left, right);
                (Action::Cut(cut.clone()), Action::Uncut(cut))
            }
            "loss" => {
                let links: Vec<(usize, usize)> = (all.iter())
                    .flat_map(|a| all.iter().filter(move |b| *b > a).map(move |b| (*a, *b)))
                    .collect();
                (Action::Lossy(links.clone()), Action::Unlossy(links))
            }
            // kill -9, never back.
            "kill" => {
                steps.push(Step {
                    at: start,
                    action: Action::Kill(victim),
                    nemesis: name.clone(),
                });
                continue;
            }
            "restart" => (Action::Kill(victim), Action::Start(victim)),
            "pause" => (Action::Stop(victim), Action::Cont(victim)),
            "skew" => (Action::Skew(victim), Action::Unskew(victim)),
            "wall-step" => (Action::WallStep, Action::WallUnstep),
            "slow" => (Action::Slow, Action::Unslow),
            "redis-kill" => (Action::KillRedis, Action::StartRedis),
            "intruder" => (Action::Intrude(victim), Action::Unintrude(victim)),
            other => bail!("unknown nemesis {other:?} (one of {})", NAMES.join(", ")),
        };
        steps.push(Step {
            at: start,
            action: on,
            nemesis: name.clone(),
        });
        steps.push(Step {
            at: end,
            action: off,
            nemesis: name.clone(),
        });
    }
    steps.sort_by(|a, b| a.at.total_cmp(&b.at));
    Ok(steps)
}

/// What the nemeses act on.
pub struct Targets<'a> {
    /// The network.
    pub net: &'a Net,
    /// The node hosts, by node index.
    pub hosts: &'a [Host],
    /// The node processes, by node index.
    pub nodes: &'a mut [Proc],
    /// Redis, in the Redis modes.
    pub redis: Option<&'a mut Proc>,
    /// Redis's host, in the Redis modes.
    pub redis_host: Option<&'a Host>,
    /// The run's directory (configs, logs) and the harness binary.
    pub dir: &'a Path,
    /// The harness binary (the intruders' too).
    pub bin: &'a Path,
    /// The cluster's ports.
    pub ports: crate::intruder::Ports,
    /// The intruders while the `intruder` nemesis is on.
    pub intrusion: Option<crate::intruder::Intrusion>,
    /// Checks the nemeses made (the intruders').
    pub checks: Vec<crate::checker::Check>,
}

impl Targets<'_> {
    /// Applies `action`; returns how the report describes it.
    pub async fn apply(&mut self, action: &Action) -> anyhow::Result<String> {
        let names = |links: &[(usize, usize)]| {
            (links.iter())
                .map(|(a, b)| format!("n{a}-n{b}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        Ok(match action {
            Action::Cut(links) => {
                for (a, b) in links {
                    self.net.cut(&self.hosts[*a], &self.hosts[*b])?;
                }
                format!("cut {}", names(links))
            }
            Action::Uncut(links) => {
                for (a, b) in links {
                    self.net.uncut(&self.hosts[*a], &self.hosts[*b])?;
                }
                format!("heal {}", names(links))
            }
            Action::Island(n) | Action::Unisland(n) => {
                self.island(*n, matches!(action, Action::Island(_)))?
            }
            Action::Lossy(links) => {
                for (a, b) in links {
                    (self.net).lossy(&self.hosts[*a], &self.hosts[*b], LOSS_PERCENT)?;
                }
                format!("loss {LOSS_PERCENT}% {}", names(links))
            }
            Action::Unlossy(links) => {
                for (a, b) in links {
                    (self.net).unlossy(&self.hosts[*a], &self.hosts[*b], LOSS_PERCENT)?;
                }
                format!("no loss {}", names(links))
            }
            Action::Kill(n) => {
                self.nodes[*n].kill9().await;
                format!("kill -9 n{n}")
            }
            Action::Start(n) => {
                self.nodes[*n].restart()?;
                format!("restart n{n}")
            }
            Action::Stop(n) => {
                self.nodes[*n].pause(true);
                format!("SIGSTOP n{n}")
            }
            Action::Cont(n) => {
                self.nodes[*n].pause(false);
                format!("SIGCONT n{n}")
            }
            Action::Slow | Action::Unslow => self.slow(*action == Action::Slow)?,
            Action::Skew(n) => self.skew(*n).await?,
            Action::Unskew(n) => {
                let node = &mut self.nodes[*n];
                node.stop(std::time::Duration::from_secs(3)).await;
                node.restart_with(Vec::new())?;
                format!("n{n} restarted with the true clock")
            }
            Action::WallStep | Action::WallUnstep => {
                let forward = *action == Action::WallStep;
                step_wall_clock(forward)?;
                let by = if forward { "forward" } else { "back" };
                format!("wall clock stepped {by} {WALL_STEP_MS} ms")
            }
            Action::KillRedis | Action::StartRedis => {
                self.redis(*action == Action::KillRedis).await?
            }
            Action::Intrude(n) => self.intrude(*n)?,
            Action::Unintrude(n) => self.unintrude(*n).await,
        })
    }

    /// Starts the intruders on node `n`'s host.
    fn intrude(&mut self, n: usize) -> anyhow::Result<String> {
        let ips: Vec<String> = self.hosts.iter().map(|h| h.ip.clone()).collect();
        let host = &self.hosts[n];
        let intrusion =
            crate::intruder::Intrusion::start(self.dir, self.bin, host, n, &ips, self.ports)?;
        self.intrusion = Some(intrusion);
        Ok(format!(
            "intruders on n{n}'s host: a stranger, an impostor of n{n}, an interceptor"
        ))
    }

    /// Checks what the intruders achieved (into `checks`), and stops them.
    async fn unintrude(&mut self, n: usize) -> String {
        let ips: Vec<String> = self.hosts.iter().map(|h| h.ip.clone()).collect();
        let Some(intrusion) = self.intrusion.take() else {
            return format!("no intruders on n{n}'s host");
        };
        let check = intrusion.end(&ips, self.ports).await;
        let verdict = if check.ok { "kept out" } else { "GOT IN" };
        self.checks.push(check);
        format!("intruders on n{n}'s host stopped: {verdict}")
    }

    /// Cuts node `n` off from every other node and from Redis (`on`), or heals it.
    fn island(&mut self, n: usize, on: bool) -> anyhow::Result<String> {
        let victim = &self.hosts[n];
        let mut cut = Vec::new();
        for (i, other) in self.hosts.iter().enumerate().filter(|(i, _)| *i != n) {
            cut.push(format!("n{i}"));
            match on {
                true => self.net.cut(victim, other)?,
                false => self.net.uncut(victim, other)?,
            }
        }
        if let Some(redis) = self.redis_host {
            cut.push("redis".to_owned());
            match on {
                true => self.net.cut(victim, redis)?,
                false => self.net.uncut(victim, redis)?,
            }
        }
        let verb = if on { "island" } else { "heal island" };
        Ok(format!("{verb} n{n} from {}", cut.join(" ")))
    }

    /// Slows every node's link (`on`: a token bucket filter), or restores it.
    fn slow(&mut self, on: bool) -> anyhow::Result<String> {
        for host in self.hosts {
            if on {
                let mut args = vec!["tc", "qdisc", "add", "dev", "eth0", "root", "tbf"];
                args.extend_from_slice(&SLOW_TBF);
                self.net.exec(host, &args)?;
            } else {
                self.net
                    .exec(host, &["tc", "qdisc", "del", "dev", "eth0", "root"])?;
            }
        }
        Ok(if on {
            format!("slow links: tbf {}", SLOW_TBF.join(" "))
        } else {
            "links back to full speed".to_owned()
        })
    }

    /// Restarts node `n` with its wall clock [`SKEW_SECONDS`] off.
    async fn skew(&mut self, n: usize) -> anyhow::Result<String> {
        if !std::path::Path::new(LIBFAKETIME).exists() {
            bail!("nemesis skew needs libfaketime ({LIBFAKETIME}): apt-get install faketime");
        }
        let node = &mut self.nodes[n];
        node.stop(std::time::Duration::from_secs(3)).await;
        node.restart_with(vec![
            ("LD_PRELOAD".into(), LIBFAKETIME.into()),
            ("FAKETIME".into(), format!("{SKEW_SECONDS:+}s")),
            // Only the wall clock: monotonic time is what tokio's timers use.
            ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ])?;
        Ok(format!(
            "n{n} restarted with its clock {SKEW_SECONDS:+} s off"
        ))
    }

    /// Kills Redis (`kill`) or restarts it from its AOF.
    async fn redis(&mut self, kill: bool) -> anyhow::Result<String> {
        let Some(redis) = self.redis.as_deref_mut() else {
            bail!("nemesis redis-kill needs a Redis mode");
        };
        Ok(if kill {
            redis.kill9().await;
            "kill -9 redis".to_owned()
        } else {
            redis.restart()?;
            "restart redis (AOF)".to_owned()
        })
    }
}

/// Steps `CLOCK_REALTIME` by [`WALL_STEP_MS`] with GNU `date` (the harness is
/// root; the workspace forbids the unsafe `clock_settime` call): `date` reads the
/// time and sets it within a fraction of a millisecond.
fn step_wall_clock(forward: bool) -> anyhow::Result<()> {
    let sign = if forward { '+' } else { '-' };
    let to = format!("now {sign} {} seconds", WALL_STEP_MS as f64 / 1000.0);
    let out = std::process::Command::new("date")
        .args(["-s", &to])
        .output()?;
    if !out.status.success() {
        bail!(
            "nemesis wall-step: date -s {to:?} failed (needs root): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Which nodes can reach which while `action` (a cut) holds: the sides of a
/// partition, for the liveness check. Not a cut: `None`.
pub fn sides(action: &Action, nodes: usize) -> Option<Vec<Vec<usize>>> {
    let Action::Cut(links) = action else {
        return None;
    };
    // Nodes that can all reach each other form a side. A node cut from nobody
    // (the bridge) reaches both sides: it is its own side, so its service cannot
    // hide a side that got none.
    let cut = |a: usize, b: usize| links.contains(&(a, b)) || links.contains(&(b, a));
    let mut sides: Vec<Vec<usize>> = Vec::new();
    for n in 0..nodes {
        let bridge = (0..nodes).all(|m| !cut(m, n));
        let joined = (sides.iter_mut()).filter(|_| !bridge).find(|s| {
            s.iter()
                .all(|m| !cut(*m, n) && (0..nodes).any(|o| cut(*m, o)))
        });
        match joined {
            Some(side) => side.push(n),
            None => sides.push(vec![n]),
        }
    }
    Some(sides)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_combinations_overlap() {
        let a = schedule(&names(&["partition", "kill"]), 3, 7).unwrap();
        let b = schedule(&names(&["partition", "kill"]), 3, 7).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.len(), 3, "cut, kill, heal: {a:?}");
        assert!(matches!(a[0].action, Action::Cut(_) | Action::Kill(_)));
        assert!(matches!(a[2].action, Action::Uncut(_)), "{a:?}");
        assert!(a[0].at < 0.34 && a[2].at > 0.62);
        let other = schedule(&names(&["partition", "kill"]), 3, 8).unwrap();
        assert_ne!(a, other, "another seed, another schedule");
        // Two process faults never pick the same node while others are left.
        for seed in 0..20 {
            let steps = schedule(&names(&["restart", "skew"]), 3, seed).unwrap();
            let victim = |s: &Step| match s.action {
                Action::Kill(n) | Action::Skew(n) => Some(n),
                _ => None,
            };
            let picked: Vec<usize> = steps.iter().filter_map(victim).collect();
            assert_eq!(picked.len(), 2, "{steps:?}");
            assert_ne!(picked[0], picked[1], "seed {seed}: {steps:?}");
        }
    }

    #[test]
    fn partitions_cut_the_right_links() {
        let halves = schedule(&names(&["partition"]), 4, 1).unwrap();
        assert_eq!(
            halves[0].action,
            Action::Cut(vec![(0, 2), (0, 3), (1, 2), (1, 3)])
        );
        assert_eq!(
            sides(&halves[0].action, 4).unwrap(),
            vec![vec![0, 1], vec![2, 3]]
        );
        let bridge = schedule(&names(&["bridge"]), 3, 1).unwrap();
        let Action::Cut(links) = &bridge[0].action else {
            panic!("{bridge:?}");
        };
        assert_eq!(links.len(), 1, "only the two ends are cut: {links:?}");
        assert_eq!(
            sides(&bridge[0].action, 3).unwrap().len(),
            3,
            "the two ends and the bridge, each its own side"
        );
        let isolate = schedule(&names(&["isolate"]), 5, 3).unwrap();
        let Action::Cut(links) = &isolate[0].action else {
            panic!("{isolate:?}");
        };
        assert_eq!(links.len(), 4);
        assert!(schedule(&names(&["flood"]), 3, 1).is_err());
        assert!(schedule(&names(&["bridge"]), 2, 1).is_err());
    }
}
