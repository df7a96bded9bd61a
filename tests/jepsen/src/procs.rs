//! Real processes inside the hosts' namespaces: `ip netns exec NS <harness> node|mock`,
//! output to a log file per process. kill -9, SIGSTOP/SIGCONT and restart are the
//! process nemeses.

use crate::hosts::Host;
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::process::{Child, Command};

/// One running process.
pub struct Proc {
    /// A name for logs and reports.
    pub name: String,
    args: Vec<String>,
    ns: String,
    bin: PathBuf,
    log: PathBuf,
    env: Vec<(String, String)>,
    child: Option<Child>,
}

impl Proc {
    /// Starts `bin args...` in `host`'s namespace, logging to `log`.
    pub fn start(
        name: &str,
        host: &Host,
        bin: &Path,
        args: Vec<String>,
        log: PathBuf,
    ) -> anyhow::Result<Proc> {
        let mut p = Proc {
            name: name.to_owned(),
            args,
            ns: host.ns.clone(),
            bin: bin.to_owned(),
            log,
            env: Vec::new(),
            child: None,
        };
        p.spawn()?;
        Ok(p)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let err = out.try_clone()?;
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(&self.bin)
            .args(&self.args)
            // No backtrace captured for every error a dependency logs (chitchat
            // logs each failed gossip during a partition; with RUST_BACKTRACE=1
            // that is megabytes of logs and CPU time that skews the run).
            .env("RUST_LIB_BACKTRACE", "0")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", self.name))?;
        self.child = Some(child);
        Ok(())
    }

    fn signal(&self, signal: &str) {
        if let Some(pid) = self.child.as_ref().and_then(Child::id) {
            let _ = std::process::Command::new("kill")
                .args([signal, &pid.to_string()])
                .status();
        }
    }

    /// kill -9: gone at once, no goodbye.
    pub async fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// SIGSTOP (true) or SIGCONT (false).
    pub fn pause(&self, paused: bool) {
        self.signal(if paused { "-STOP" } else { "-CONT" });
    }

    /// Starts it again after a kill.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.spawn()
    }

    /// Starts it again after a stop with `env` (e.g. libfaketime's) instead of
    /// the environment it had.
    pub fn restart_with(&mut self, env: Vec<(String, String)>) -> anyhow::Result<()> {
        self.env = env;
        self.spawn()
    }

    /// SIGTERM, then waits up to `grace` (the mock flushes its log on the way out).
    pub async fn stop(&mut self, grace: std::time::Duration) {
        self.pause(false);
        self.signal("-TERM");
        if let Some(mut child) = self.child.take()
            && tokio::time::timeout(grace, child.wait()).await.is_err()
        {
            let _ = child.kill().await;
        }
    }
}
