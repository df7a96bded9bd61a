//! Real Redis for tests: `redis-server` processes on free ports, started and killed
//! by the tests. CI installs redis-server; when it is missing the tests fail loudly
//! and say so (never a silent skip).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio::time::Instant;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn ping(port: u16) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buf = [0u8; 64];
    s.write_all(b"PING\r\n").is_ok()
        && s.read(&mut buf)
            .is_ok_and(|n| buf[..n].starts_with(b"+PONG"))
}

/// One redis-server.
pub(crate) struct RedisServer {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a server without persistence on a free port.
    pub(crate) fn start() -> RedisServer {
        Self::start_with(free_port(), Vec::new())
    }

    fn start_with(port: u16, extra: Vec<String>) -> RedisServer {
        let dir = std::env::temp_dir().join(format!("tollgate-redis-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut server = RedisServer {
            port,
            dir,
            child: None,
            extra,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let mut args = vec![
            "--port".to_owned(),
            self.port.to_string(),
            "--bind".to_owned(),
            "127.0.0.1".to_owned(),
            "--save".to_owned(),
            String::new(),
            "--appendonly".to_owned(),
            "no".to_owned(),
            "--dir".to_owned(),
            self.dir.display().to_string(),
        ];
        args.extend(self.extra.iter().cloned());
        let child = Command::new("redis-server")
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server ({e}): install it (CI runs `apt-get install redis-server`)")
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ping(self.port) {
            assert!(
                Instant::now() < deadline,
                "redis-server on {} never answered PING",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// SIGKILL: gone at once, no goodbye.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port (empty: no persistence).
    pub(crate) fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// SIGSTOP / SIGCONT: alive but silent (a stalled Redis).
    pub(crate) fn pause(&self, paused: bool) {
        if let Some(child) = &self.child {
            let signal = if paused { "-STOP" } else { "-CONT" };
            let status = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status()
                .unwrap();
            assert!(status.success());
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.pause(false);
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A real Redis Cluster of `n` masters (no replicas), created with
/// `redis-cli --cluster create`.
pub(crate) struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub(crate) fn start(n: usize) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..n)
            .map(|_| {
                let port = free_port();
                let extra = vec![
                    "--cluster-enabled".to_owned(),
                    "yes".to_owned(),
                    "--cluster-config-file".to_owned(),
                    format!("nodes-{port}.conf"),
                    "--cluster-node-timeout".to_owned(),
                    "2000".to_owned(),
                ];
                RedisServer::start_with(port, extra)
            })
            .collect();
        let mut args = vec!["--cluster".to_owned(), "create".to_owned()];
        args.extend(nodes.iter().map(|s| format!("127.0.0.1:{}", s.port)));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
        let out = Command::new("redis-cli")
            .args(&args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}): install redis-tools"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        // Wait until every node agrees the cluster is up.
        let deadline = Instant::now() + Duration::from_secs(20);
        for node in &nodes {
            loop {
                let info = Command::new("redis-cli")
                    .args(["-p", &node.port.to_string(), "cluster", "info"])
                    .output()
                    .unwrap();
                if String::from_utf8_lossy(&info.stdout).contains("cluster_state:ok") {
                    break;
                }
                assert!(Instant::now() < deadline, "the cluster never became ok");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        RedisCluster { nodes }
    }

    pub(crate) fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }
}

/// A TCP relay in front of a Redis, to cut one node off it while the others still
/// reach it (a partial Redis loss): `cut` drops every connection and refuses new
/// ones until `heal`. It also counts the connections it accepted.
pub(crate) struct TcpRelay {
    pub port: u16,
    pub accepted: std::sync::Arc<std::sync::atomic::AtomicU64>,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    generation: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl TcpRelay {
    pub(crate) async fn start(target_port: u16) -> TcpRelay {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let generation = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (c, g) = (cut.clone(), generation.clone());
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                counted.fetch_add(1, Ordering::SeqCst);
                if c.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let (c, g) = (c.clone(), g.clone());
                let born = g.load(Ordering::SeqCst);
                tokio::spawn(async move {
                    let Ok(mut outbound) =
                        tokio::net::TcpStream::connect(("127.0.0.1", target_port)).await
                    else {
                        return;
                    };
                    let copy = tokio::io::copy_bidirectional(&mut inbound, &mut outbound);
                    let watch = async {
                        while !c.load(Ordering::SeqCst) && g.load(Ordering::SeqCst) == born {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    };
                    tokio::select! {
                        _ = copy => {}
                        () = watch => {}
                    }
                });
            }
        });
        TcpRelay {
            port,
            accepted,
            cut,
            generation,
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Drops every connection and refuses new ones.
    pub(crate) fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    pub(crate) fn heal(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}
