//! The upstream client end to end over TLS and through a proxy: a served node (a
//! real process, so its environment is its own) in front of the mock behind a
//! TLS terminator whose certificate a test CA signed (made with the `openssl`
//! CLI).
//!
//! - trusted through `SSL_CERT_FILE` (the platform verifier reads it), the
//!   request goes straight to the TLS upstream with the provider key;
//! - trusting another CA instead, the certificate is refused, and the mock sees
//!   nothing (`SSL_CERT_FILE` replaces the trust store, it does not extend it);
//! - both clients offer HTTP/1.1 by ALPN;
//! - with `HTTPS_PROXY` set, the request goes through the proxy (a CONNECT
//!   tunnel, counted), unless `NO_PROXY` names the upstream's host.
#![allow(clippy::unwrap_used)]

use crate::common::certs::{Certs, make_certs};
use crate::common::served::Served;
use crate::common::{KEY, chat_body, key_hash, mock};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

const UPSTREAM_KEY: &str = "sk-upstream-secret";

/// Terminates TLS on a free port and relays each connection to `target`;
/// records each completed handshake's ALPN protocol (empty: none offered).
async fn tls_terminator(
    certs: &Certs,
    target: SocketAddr,
) -> (SocketAddr, Arc<std::sync::Mutex<Vec<String>>>) {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&certs.cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(&certs.key).unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handshakes = Arc::new(std::sync::Mutex::new(Vec::new()));
    let counted = handshakes.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let (acceptor, counted) = (acceptor.clone(), counted.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(client).await else {
                    return;
                };
                let alpn = tls.get_ref().1.alpn_protocol().unwrap_or_default();
                counted
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(alpn).into_owned());
                if let Ok(mut upstream) = TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut upstream).await;
                }
            });
        }
    });
    (addr, handshakes)
}

/// An HTTP proxy that only tunnels (`CONNECT host:port`); records each target.
async fn connect_proxy() -> (SocketAddr, Arc<std::sync::Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let targets = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = targets.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                let mut client = BufReader::new(client);
                let mut line = String::new();
                client.read_line(&mut line).await.unwrap();
                let target = match line.split(' ').collect::<Vec<_>>()[..] {
                    ["CONNECT", target, _] => target.to_owned(),
                    _ => return,
                };
                loop {
                    let mut header = String::new();
                    client.read_line(&mut header).await.unwrap();
                    if header == "\r\n" || header.is_empty() {
                        break;
                    }
                }
                record.lock().unwrap().push(target.clone());
                let Ok(mut upstream) = TcpStream::connect(&target).await else {
                    return;
                };
                let mut client = client.into_inner();
                client
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await
                    .unwrap();
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            });
        }
    });
    (addr, targets)
}

/// A served node (its own process) in front of `upstream`, with `env` set and
/// every proxy and certificate variable of this process's environment removed.
async fn serve(upstream: &str, env: &[(&str, &str)]) -> Served {
    let toml = format!(
        r#"
[[upstreams]]
id = "tls"
kind = "openai"
base_url = "{upstream}"
api_key = "{UPSTREAM_KEY}"
timeout = "5s"

[[routes]]
models = ["*"]
upstreams = ["tls"]

[[tenants]]
id = "t"
api_key_hashes = ["{hash}"]
rpm = 100

[retry]
max_attempts = 1
"#,
        hash = key_hash()
    );
    crate::common::served::serve(&toml, |command| {
        for name in [
            "SSL_CERT_FILE",
            "SSL_CERT_DIR",
            "HTTPS_PROXY",
            "https_proxy",
            "HTTP_PROXY",
            "http_proxy",
            "ALL_PROXY",
            "all_proxy",
            "NO_PROXY",
            "no_proxy",
        ] {
            command.env_remove(name);
        }
        command.envs(env.iter().copied());
    })
    .await
}

async fn chat(node: &Served) -> (u16, serde_json::Value) {
    let response = reqwest::Client::new()
        .post(format!(
            "http://127.0.0.1:{}/v1/chat/completions",
            node.port
        ))
        .bearer_auth(KEY)
        .json(&chat_body("hello", 5))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

#[tokio::test]
async fn an_upstream_over_tls_is_reached_directly_or_through_a_proxy_and_verified() {
    let mock = mock(|c| c.api_key = Some(UPSTREAM_KEY.to_owned())).await;
    let certs = make_certs();
    let (tls, handshakes) = tls_terminator(&certs, mock.addr()).await;
    let upstream = format!("https://localhost:{}/v1", tls.port());
    let ca = certs.ca.to_str().unwrap();

    // Trusted through SSL_CERT_FILE: straight to the upstream, key and all (the
    // mock refuses a request without it).
    let node = serve(&upstream, &[("SSL_CERT_FILE", ca)]).await;
    let (status, body) = chat(&node).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(mock.stats().admitted, 1);
    // HTTP/1.1 offered by ALPN, as reqwest does (the terminator also offers h2).
    assert_eq!(*handshakes.lock().unwrap(), ["http/1.1"]);
    drop(node);

    // Another CA's trust does not cover this certificate: refused, nothing
    // sent (not the system's roots: a machine without a CA bundle could not
    // start the node at all).
    let other = certs.other_ca.to_str().unwrap();
    let node = serve(&upstream, &[("SSL_CERT_FILE", other)]).await;
    let (status, body) = chat(&node).await;
    assert_eq!(status, 502, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("certificate"), "{message}");
    assert_eq!(
        mock.stats().admitted,
        1,
        "an unverified upstream got nothing"
    );
    assert_eq!(
        handshakes.lock().unwrap().len(),
        1,
        "no handshake completed"
    );
    drop(node);

    // HTTPS_PROXY: through the proxy's tunnel, still verified end to end.
    let (proxy, tunnels) = connect_proxy().await;
    let proxy_url = format!("http://{proxy}");
    let node = serve(
        &upstream,
        &[("SSL_CERT_FILE", ca), ("HTTPS_PROXY", &proxy_url)],
    )
    .await;
    let (status, body) = chat(&node).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(mock.stats().admitted, 2);
    assert_eq!(
        *tunnels.lock().unwrap(),
        vec![format!("localhost:{}", tls.port())]
    );
    drop(node);

    // NO_PROXY names the upstream's host: straight there again.
    let node = serve(
        &upstream,
        &[
            ("SSL_CERT_FILE", ca),
            ("HTTPS_PROXY", &proxy_url),
            ("NO_PROXY", "localhost"),
        ],
    )
    .await;
    let (status, body) = chat(&node).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(mock.stats().admitted, 3);
    assert_eq!(tunnels.lock().unwrap().len(), 1, "no new tunnel");
    // Through reqwest (proxied) and hyper (direct) alike.
    assert_eq!(*handshakes.lock().unwrap(), ["http/1.1"; 3]);
    drop(node);
    mock.shutdown().await.unwrap();
}
