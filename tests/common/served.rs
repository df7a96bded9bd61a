//! `tollgate serve` as a real process, for tests whose node needs an
//! environment of its own (worker threads, certificates, proxies).

use std::time::Duration;

/// A served node, killed when dropped; its config file lives as long as it.
pub(crate) struct Served {
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
/// with `RUST_LOG=warn` and `env` applied to the command, and waits until it
/// listens.
pub(crate) async fn serve(toml: &str, env: impl FnOnce(&mut std::process::Command)) -> Served {
    serve_under(toml, None, env).await
}

/// As [`serve`], with its open-file limit (soft and hard) set to `nofile`.
pub(crate) async fn serve_with_nofile(toml: &str, nofile: u32) -> Served {
    serve_under(toml, Some(nofile), |_| {}).await
}

async fn serve_under(
    toml: &str,
    nofile: Option<u32>,
    env: impl FnOnce(&mut std::process::Command),
) -> Served {
    let port = super::cluster::free_tcp_port();
    let toml = format!("[server]\nlisten = \"127.0.0.1:{port}\"\n{toml}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.toml");
    std::fs::write(&path, toml).unwrap();
    let bin = env!("CARGO_BIN_EXE_tollgate");
    let mut command = match nofile {
        // The shell's `ulimit -n` sets both limits, so the node cannot raise it.
        Some(n) => {
            let mut sh = std::process::Command::new("sh");
            sh.arg("-c")
                .arg(format!(
                    "ulimit -n {n} && exec \"$0\" serve --config \"$1\""
                ))
                .arg(bin)
                .arg(&path);
            sh
        }
        None => {
            let mut direct = std::process::Command::new(bin);
            direct.args(["serve", "--config"]).arg(&path);
            direct
        }
    };
    command.env("RUST_LOG", "warn");
    env(&mut command);
    let served = Served {
        child: command.spawn().unwrap(),
        port,
        _dir: dir,
    };
    // Listening (over TLS or not): requests sent from here are served.
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return served;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the node never answered on port {port}");
}

/// `tollgate mock-upstream` with its default config as a real process, killed
/// when dropped: for tests that measure this process's heap as the nodes'. A
/// mock in the process counts with tiktoken-rs, whose regex match caches (up to
/// one per pool stack in each of 128 thread slots) fill as new threads count
/// and stay for the process: filling one per slot takes 41 MB here.
pub(crate) struct MockProcess {
    child: std::process::Child,
    base_url: String,
    /// Kept open: a write to a closed pipe would fail the mock.
    _stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl MockProcess {
    /// Starts one on a free port and waits for it to say where it listens.
    pub(crate) fn start() -> MockProcess {
        use std::io::BufRead;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["mock-upstream", "--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        stdout.read_line(&mut line).unwrap();
        // "mock upstream on http://127.0.0.1:PORT/v1 (stats at /stats)"
        let base_url = line
            .split_whitespace()
            .find(|word| word.starts_with("http://"))
            .unwrap_or_else(|| panic!("the mock did not say where it listens: {line:?}"))
            .to_owned();
        MockProcess {
            child,
            base_url,
            _stdout: stdout,
        }
    }
}

impl super::Upstream for MockProcess {
    fn base_url(&self) -> String {
        self.base_url.clone()
    }
}

impl Drop for MockProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
