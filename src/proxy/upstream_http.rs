//! The client upstream requests go out through: hyper's pooled client, driven
//! directly, with reqwest kept for upstreams the environment sends through a proxy.
//!
//! Until the thirty-fourth session every upstream request went through reqwest,
//! and 9% of the node's instructions per request were reqwest turning URLs into
//! URIs and back (docs/BENCHMARKS.md, "Thirty-third session: instructions per
//! request"): its redirect layer, installed even with `Policy::none()`, formats
//! each request's URI and parses it into a `Url` twice, and the `Url` the request
//! carries becomes a `Uri` once more on the way to hyper. Here the URI is parsed
//! once at start and cloned per request (a reference count). What reqwest gave
//! the node is kept, each the same way:
//!
//! - TLS by rustls with the platform's verifier (`rustls-platform-verifier`, the
//!   OS trust store and its revocation checks) on the default provider, ALPN
//!   `http/1.1`;
//! - HTTP/1.1 with `TCP_NODELAY`, a 10 s connect timeout, and the idle pool of
//!   `server.upstream_idle_timeout`;
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
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// Any error of either client, with its causes.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An upstream's answer: hyper's body, or reqwest's for a proxied endpoint.
pub type UpstreamResponse = http::Response<UpstreamBody>;

/// How long a connection may take to open (reqwest's setting before).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// One endpoint of an upstream (`base_url` + an API's path), parsed at start.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The URL as configured, normalised (punycode hosts, escapes).
    pub url: reqwest::Url,
    /// The same URL as hyper takes it.
    uri: http::Uri,
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
        Ok(Endpoint {
            url,
            uri,
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
    direct: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
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
        Self::build(idle, max_idle, CONNECT_TIMEOUT, Matcher::from_system())
    }

    /// A client that never uses a proxy, keeping up to `max_idle` connections
    /// per host (`tollgate load`: it measures the target, never a proxy the
    /// environment names).
    pub fn without_proxies(
        max_idle: usize,
        connect_timeout: Duration,
    ) -> Result<UpstreamHttp, String> {
        let idle = Duration::from_secs(90);
        Self::build(idle, max_idle, connect_timeout, Matcher::builder().build())
    }

    fn build(
        idle: Duration,
        max_idle: usize,
        connect_timeout: Duration,
        proxies: Matcher,
    ) -> Result<UpstreamHttp, String> {
        let tls = tls_config()?;
        // No redirects (a provider's 3xx is a 502 to the client, dispatch.rs;
        // following it would send the body and the key somewhere the config never
        // named) and no hidden retries (the attempt loop in dispatch.rs is the only
        // one, so every send is charged and bounded by `retry.max_attempts`).
        let proxied = reqwest::Client::builder()
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
        tcp.set_connect_timeout(Some(connect_timeout));
        // Schemes are the TLS layer's to check: it wraps this connector.
        tcp.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp);
        let direct = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(idle)
            .pool_max_idle_per_host(max_idle)
            .build(connector);
        Ok(UpstreamHttp {
            direct,
            proxied,
            proxies,
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
        if endpoint.via_reqwest {
            let response = (self.proxied.post(endpoint.url.clone()))
                .headers(headers)
                .body(body)
                .send()
                .await?;
            return Ok(http::Response::from(response).map(UpstreamBody::Proxied));
        }
        let mut request = http::Request::new(Full::new(body));
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = endpoint.uri.clone();
        *request.headers_mut() = headers;
        let response = self.direct.request(request).await?;
        Ok(response.map(UpstreamBody::Direct))
    }
}

/// rustls with the platform's verifier on the default provider, as reqwest
/// built it for the node.
fn tls_config() -> Result<rustls::ClientConfig, String> {
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
    let verifier = rustls_platform_verifier::Verifier::new(provider.clone())
        .map_err(|e| format!("cannot load the platform's certificate verifier: {e}"))?;
    // No ALPN here: hyper-rustls offers `http/1.1` (`enable_http1`), and reqwest,
    // taking the configuration as it is, offers none, which servers read as 1.1.
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("cannot set up TLS: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth())
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
        UpstreamHttp::build(Duration::from_secs(90), 1024, CONNECT_TIMEOUT, proxies).unwrap()
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
