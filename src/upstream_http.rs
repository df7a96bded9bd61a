//! The client upstream requests go out through: hyper's pooled client, driven
//! directly, with reqwest kept for upstreams the environment sends through a proxy.
//!
//! hyper, not reqwest, carries the common case because reqwest's redirect
//! layer (installed even with `Policy::none()`) formats each request's URI and
//! parses it into a `Url` twice, and the request's `Url` becomes a `Uri` again on
//! the way to hyper: about 9% of a node's instructions per request
//! (docs/BENCHMARKS.md, "Measured choices on the request path"). Here the URI
//! is parsed once at start and cloned per request (a reference count). What
//! reqwest gives a client is kept, each the same way:
//!
//! - TLS by rustls with the platform's verifier (`rustls-platform-verifier`: on
//!   Linux the system's CA bundle, or `SSL_CERT_FILE`/`SSL_CERT_DIR`, through
//!   webpki) on the default provider, ALPN `http/1.1`;
//! - HTTP/1.1 with `TCP_NODELAY`, reqwest's TCP keepalive (15 s, every 15 s, 3
//!   probes) and, on Linux, its 30 s `TCP_USER_TIMEOUT`, so a silent path through
//!   a NAT stays open while a provider works and a dead one is noticed; a 10 s
//!   connect timeout covering the TLS handshake as well as TCP (a stalled
//!   handshake is a connect error, refunded and retried, not a 504); the idle
//!   pool of `server.upstream_idle_timeout`; `Accept: */*` as reqwest sent it;
//! - proxies from the environment (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`,
//!   `NO_PROXY`): an endpoint they send through a proxy goes through reqwest,
//!   which speaks to proxies, decided once at start by the matcher reqwest itself
//!   uses; so does an endpoint with credentials in its URL (reqwest turns them
//!   into basic auth);
//! - no redirect followed (a 3xx is answered as a 502 by `dispatch`) and no
//!   retry of a request the upstream may have seen. The pool sends again only a
//!   request whose connection closed before any byte of it was written (hyper's
//!   `retry_canceled_requests`, on in reqwest's client as here): the provider
//!   never saw it.

use bytes::Bytes;
use http::header::HeaderMap;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// Any error of either client, with its causes.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An upstream's answer: hyper's body, or reqwest's for a proxied endpoint.
pub type UpstreamResponse = http::Response<UpstreamBody>;

/// How long a connection may take to open, TLS included (reqwest's setting before).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// TCP keepalive: idle time before the first probe, and between probes
/// (reqwest's defaults).
const KEEPALIVE: Duration = Duration::from_secs(15);
/// Unanswered keepalive probes before the connection is dropped.
const KEEPALIVE_PROBES: u32 = 3;
/// Longest unacknowledged data may wait before the kernel drops the connection
/// (reqwest's default, Linux).
#[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
const USER_TIMEOUT: Duration = Duration::from_secs(30);

/// One endpoint of an upstream (`base_url` + an API's path), parsed at start.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The URL as configured, normalised (punycode hosts, escapes).
    pub url: reqwest::Url,
    /// The same URL as hyper takes it.
    uri: http::Uri,
    /// Its `Host` header, made once: hyper-util's client would format it
    /// from the URI on every request (`host[:port]`, the port only when it
    /// is not the scheme's default).
    host: http::HeaderValue,
    /// Sent through reqwest: the environment names a proxy for it, or its URL
    /// carries credentials.
    via_reqwest: bool,
}

impl Endpoint {
    /// Parses `url` (an absolute http(s) URL) into an endpoint hyper's client
    /// sends to directly, unless its URL carries credentials.
    pub fn direct(url: &str) -> Result<Endpoint, String> {
        let url = reqwest::Url::parse(url).map_err(|e| format!("bad URL {url:?}: {e}"))?;
        let uri: http::Uri =
            (url.as_str().parse()).map_err(|e| format!("bad URL {:?}: {e}", url.as_str()))?;
        let via_reqwest = !url.username().is_empty() || url.password().is_some();
        let host = host_header(&uri).map_err(|e| format!("bad URL {:?}: {e}", url.as_str()))?;
        Ok(Endpoint {
            url,
            uri,
            host,
            via_reqwest,
        })
    }

    /// Whether requests to this endpoint go through reqwest (a proxy, or
    /// credentials in the URL) rather than hyper's client directly.
    pub fn via_reqwest(&self) -> bool {
        self.via_reqwest
    }
}

/// The two clients and what decides between them.
pub struct UpstreamHttp {
    direct: Client<BoundedConnect<hyper_rustls::HttpsConnector<HttpConnector>>, Full<Bytes>>,
    /// Also the spillover client (`super::spill`), on the same TLS settings.
    proxied: reqwest::Client,
    proxies: Matcher,
}

impl std::fmt::Debug for UpstreamHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamHttp").finish_non_exhaustive()
    }
}

impl UpstreamHttp {
    /// Both clients, with idle connections kept for `idle` (zero: none), on one
    /// TLS configuration (the platform's trust store is read once).
    pub fn new(idle: Duration) -> Result<UpstreamHttp, String> {
        let max_idle = if idle.is_zero() { 0 } else { 1024 };
        Self::build(
            idle,
            max_idle,
            CONNECT_TIMEOUT,
            Some(Matcher::from_system()),
        )
    }

    /// A client that never uses a proxy, keeping up to `max_idle` connections
    /// per host (`tollgate load`: it measures the target, never a proxy the
    /// environment names).
    pub fn without_proxies(
        max_idle: usize,
        connect_timeout: Duration,
    ) -> Result<UpstreamHttp, String> {
        let idle = Duration::from_secs(90);
        Self::build(idle, max_idle, connect_timeout, None)
    }

    /// `proxies`: the environment's, or `None` for no proxy in either client.
    fn build(
        idle: Duration,
        max_idle: usize,
        connect_timeout: Duration,
        proxies: Option<Matcher>,
    ) -> Result<UpstreamHttp, String> {
        let tls = tls_config()?;
        // No redirects (a provider's 3xx is a 502 to the client, dispatch.rs;
        // following it would send the body and the key somewhere the config never
        // named) and no hidden retries (the attempt loop in dispatch.rs is the only
        // one, so every send is charged and bounded by `retry.max_attempts`).
        let mut proxied = reqwest::Client::builder();
        if proxies.is_none() {
            proxied = proxied.no_proxy();
        }
        let proxied = proxied
            .tls_backend_preconfigured(tls.clone())
            .redirect(reqwest::redirect::Policy::none())
            .retry(reqwest::retry::never())
            .referer(false)
            .tcp_nodelay(true)
            .pool_idle_timeout(idle)
            .pool_max_idle_per_host(max_idle)
            .connect_timeout(connect_timeout)
            .build()
            .map_err(|e| format!("cannot build HTTP client: {e}"))?;
        let mut tcp = HttpConnector::new();
        tcp.set_nodelay(true);
        tcp.set_keepalive(Some(KEEPALIVE));
        tcp.set_keepalive_interval(Some(KEEPALIVE));
        tcp.set_keepalive_retries(Some(KEEPALIVE_PROBES));
        #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
        tcp.set_tcp_user_timeout(Some(USER_TIMEOUT));
        // Schemes are the TLS layer's to check: it wraps this connector.
        tcp.enforce_http(false);
        // Built from the configuration as it is (`http/1.1` offered by ALPN):
        // hyper-rustls's builder refuses a configuration with ALPN set.
        let tls = hyper_rustls::HttpsConnector::from((tcp, Arc::new(tls)));
        let connector = BoundedConnect {
            inner: tls,
            timeout: connect_timeout,
        };
        let direct = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(idle)
            .pool_max_idle_per_host(max_idle)
            .build(connector);
        Ok(UpstreamHttp {
            direct,
            proxied,
            proxies: proxies.unwrap_or_else(|| Matcher::builder().build()),
        })
    }

    /// The reqwest client (spillover to peers uses it too).
    pub fn reqwest(&self) -> &reqwest::Client {
        &self.proxied
    }

    /// Parses `url` (already validated as an absolute http(s) URL) into an
    /// endpoint, and decides once which client sends to it.
    pub fn endpoint(&self, url: &str) -> Result<Endpoint, String> {
        let mut endpoint = Endpoint::direct(url)?;
        endpoint.via_reqwest |= self.proxies.intercept(&endpoint.uri).is_some();
        Ok(endpoint)
    }

    /// POSTs `body` with `headers` to `endpoint`: the answer's head, its body
    /// still to read.
    pub async fn post(
        &self,
        endpoint: &Endpoint,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<UpstreamResponse, BoxError> {
        self.send(http::Method::POST, endpoint, headers, body).await
    }

    /// GETs `endpoint` with `headers`: the answer's head, its body still to read.
    pub async fn get(
        &self,
        endpoint: &Endpoint,
        headers: HeaderMap,
    ) -> Result<UpstreamResponse, BoxError> {
        self.send(http::Method::GET, endpoint, headers, Bytes::new())
            .await
    }

    async fn send(
        &self,
        method: http::Method,
        endpoint: &Endpoint,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<UpstreamResponse, BoxError> {
        if endpoint.via_reqwest {
            let response = (self.proxied.request(method, endpoint.url.clone()))
                .headers(headers)
                .body(body)
                .send()
                .await?;
            return Ok(http::Response::from(response).map(UpstreamBody::Proxied));
        }
        let mut request = http::Request::new(Full::new(body));
        *request.method_mut() = method;
        *request.uri_mut() = endpoint.uri.clone();
        *request.headers_mut() = headers;
        (request.headers_mut()).insert(http::header::HOST, endpoint.host.clone());
        let response = self.direct.request(request).await?;
        Ok(response.map(UpstreamBody::Direct))
    }
}

/// The `Host` header hyper-util's client sets for `uri`: its host, and its
/// port unless that is the scheme's default.
fn host_header(uri: &http::Uri) -> Result<http::HeaderValue, String> {
    let host = uri.host().ok_or("no host")?;
    let default_port = if matches!(uri.scheme_str(), Some("https" | "wss")) {
        443
    } else {
        80
    };
    let value = match uri.port_u16() {
        Some(port) if port != default_port => format!("{host}:{port}"),
        _ => host.to_owned(),
    };
    http::HeaderValue::try_from(value).map_err(|e| e.to_string())
}

/// rustls with the platform's verifier on the default provider, as reqwest
/// built it for the node.
fn tls_config() -> Result<rustls::ClientConfig, String> {
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
    let verifier = rustls_platform_verifier::Verifier::new(provider.clone())
        .map_err(|e| format!("cannot load the platform's certificate verifier: {e}"))?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("cannot set up TLS: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    // What reqwest offered (its `http2` feature is off); both clients use it.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A connector whose whole connect, TCP and then TLS, is bounded by `timeout`:
/// hyper's own connect timeout covers the TCP connect only, and reqwest bounds
/// both. A connect that fails is refunded and retried by `dispatch`; one that
/// hung in the handshake would otherwise have run into the headers deadline and
/// been kept as a request the provider may have seen.
#[derive(Clone)]
struct BoundedConnect<C> {
    inner: C,
    timeout: Duration,
}

impl<C> tower_service::Service<http::Uri> for BoundedConnect<C>
where
    C: tower_service::Service<http::Uri>,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: http::Uri) -> Self::Future {
        let connect = self.inner.call(dst);
        let timeout = self.timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, connect).await {
                Ok(connected) => connected.map_err(Into::into),
                Err(_) => Err(Box::new(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("connecting (TCP and TLS) took over {timeout:?}"),
                )) as BoxError),
            }
        })
    }
}

/// An upstream answer's body, from either client.
#[derive(Debug)]
pub enum UpstreamBody {
    /// Read straight from hyper's connection.
    Direct(hyper::body::Incoming),
    /// Through reqwest (a proxied endpoint).
    Proxied(reqwest::Body),
}

impl UpstreamBody {
    /// The next piece of data (trailers skipped), `None` at the end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, BoxError> {
        use http_body_util::BodyExt;
        while let Some(frame) = self.frame().await {
            if let Ok(data) = frame?.into_data() {
                return Ok(Some(data));
            }
        }
        Ok(None)
    }
}

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            UpstreamBody::Direct(body) => Pin::new(body)
                .poll_frame(cx)
                .map(|frame| frame.map(|f| f.map_err(BoxError::from))),
            UpstreamBody::Proxied(body) => Pin::new(body)
                .poll_frame(cx)
                .map(|frame| frame.map(|f| f.map_err(BoxError::from))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Direct(body) => body.is_end_stream(),
            UpstreamBody::Proxied(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            UpstreamBody::Direct(body) => body.size_hint(),
            UpstreamBody::Proxied(body) => body.size_hint(),
        }
    }
}

/// An error and its causes, outermost first: hyper's own display is terse
/// ("client error (Connect)"), the reason is in its sources.
pub fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(proxies: Matcher) -> UpstreamHttp {
        UpstreamHttp::build(
            Duration::from_secs(90),
            1024,
            CONNECT_TIMEOUT,
            Some(proxies),
        )
        .unwrap()
    }

    #[test]
    fn only_an_endpoint_behind_a_proxy_or_with_credentials_goes_through_reqwest() {
        let proxies = Matcher::builder()
            .https("http://proxy.internal:3128")
            .no("api.local")
            .build();
        let http = client(proxies);
        let via = |url: &str| http.endpoint(url).unwrap().via_reqwest();
        assert!(via("https://api.openai.com/v1/chat/completions"));
        assert!(!via("https://api.local/v1/chat/completions"), "NO_PROXY");
        assert!(
            !via("http://10.0.0.5:8080/v1/chat/completions"),
            "no HTTP proxy"
        );
        assert!(via("http://user:secret@10.0.0.5:8080/v1/chat/completions"));
        let none = client(Matcher::builder().build());
        assert!(
            !none
                .endpoint("https://api.openai.com/v1/x")
                .unwrap()
                .via_reqwest()
        );
    }

    #[test]
    fn an_endpoint_keeps_the_url_normalised_as_reqwest_would_send_it() {
        let http = client(Matcher::builder().build());
        let e = http.endpoint("https://bücher.example/v1/a b").unwrap();
        assert_eq!(e.url.as_str(), "https://xn--bcher-kva.example/v1/a%20b");
        assert_eq!(e.uri.to_string(), e.url.as_str());
    }

    #[test]
    fn an_endpoints_host_header_is_the_one_hyper_would_make() {
        let http = client(Matcher::builder().build());
        for (url, host) in [
            (
                "http://127.0.0.1:9190/v1/chat/completions",
                "127.0.0.1:9190",
            ),
            (
                "https://api.openai.com/v1/chat/completions",
                "api.openai.com",
            ),
            ("https://api.example:443/v1", "api.example"),
            ("http://h:80/v1", "h"),
            ("http://h:443/v1", "h:443"),
            ("https://h:8443/v1", "h:8443"),
            ("http://[::1]:8080/v1", "[::1]:8080"),
            ("https://bücher.example/v1", "xn--bcher-kva.example"),
        ] {
            assert_eq!(http.endpoint(url).unwrap().host, host, "{url}");
        }
    }

    #[tokio::test]
    async fn a_request_carries_one_host_header() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                let mut byte = [0; 1];
                socket.read_exact(&mut byte).await.unwrap();
                head.push(byte[0]);
            }
            let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
            socket.write_all(reply).await.unwrap();
            String::from_utf8(head).unwrap()
        });
        let http = client(Matcher::builder().build());
        let endpoint = http
            .endpoint(&format!("http://127.0.0.1:{port}/v1/x"))
            .unwrap();
        let response = http.post(&endpoint, HeaderMap::new(), Bytes::from_static(b"{}"));
        assert_eq!(response.await.unwrap().status(), 200);
        let head = server.await.unwrap().to_ascii_lowercase();
        let hosts: Vec<&str> = head.lines().filter(|l| l.starts_with("host:")).collect();
        assert_eq!(hosts, [format!("host: 127.0.0.1:{port}")], "{head}");
    }

    /// A connect that never finishes (a TLS handshake the server never answers).
    struct Hangs;

    impl tower_service::Service<http::Uri> for Hangs {
        type Response = ();
        type Error = BoxError;
        type Future = std::future::Pending<Result<(), BoxError>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Uri) -> Self::Future {
            std::future::pending()
        }
    }

    #[tokio::test]
    async fn a_connect_hanging_after_tcp_fails_at_the_connect_timeout() {
        use tower_service::Service as _;
        let mut connect = BoundedConnect {
            inner: Hangs,
            timeout: Duration::from_millis(50),
        };
        let started = tokio::time::Instant::now();
        let error = connect
            .call(http::Uri::from_static("https://example.com/"))
            .await
            .unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert!(
            describe(&*error).contains("connecting (TCP and TLS) took over 50ms"),
            "{error}"
        );
    }

    #[test]
    fn an_error_is_described_with_its_causes_once_each() {
        let inner = std::io::Error::other("connection refused");
        let outer = std::io::Error::other(Wrapped(inner));
        assert_eq!(describe(&outer), "connect failed: connection refused");

        #[derive(Debug)]
        struct Wrapped(std::io::Error);
        impl std::fmt::Display for Wrapped {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("connect failed")
            }
        }
        impl std::error::Error for Wrapped {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
    }
}
