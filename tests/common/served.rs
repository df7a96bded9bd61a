//! `tollgate serve` as a real process, for tests whose node needs an
//! environment of its own (worker threads, certificates, proxies).

use std::time::Duration;

/// A served node, killed when dropped; its config file lives as long as it.
pub struct Served {
    child: std::process::Child,
    /// The port it listens on.
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Serves `toml` (everything after `[server]`'s `listen` line, which is added)
/// with `RUST_LOG=warn` and `env` applied to the command, and waits until its
/// `/healthz` answers.
pub async fn serve(toml: &str, env: impl FnOnce(&mut std::process::Command)) -> Served {
    let port = super::cluster::free_tcp_port();
    let toml = format!("[server]\nlisten = \"127.0.0.1:{port}\"\n{toml}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.toml");
    std::fs::write(&path, toml).unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"));
    command
        .args(["serve", "--config"])
        .arg(&path)
        .env("RUST_LOG", "warn");
    env(&mut command);
    let served = Served {
        child: command.spawn().unwrap(),
        port,
        _dir: dir,
    };
    for _ in 0..200 {
        if reqwest::get(format!("http://127.0.0.1:{port}/healthz"))
            .await
            .is_ok()
        {
            return served;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the node never answered on port {port}");
}
