//! The cluster's keys from the config, and the internal RPC's tags over HTTP
//! headers (`tollgate_cluster::auth` does the cryptography; docs/design/cluster-trust.md).

use crate::config::ClusterConfig;
use axum::http::{HeaderMap, HeaderValue};
use tollgate_cluster::auth::keys::Channel;
use tollgate_cluster::auth::rpc::{Request, RequestTag, RpcSigner, RpcVerifier};
use tollgate_cluster::auth::{ClusterKeys, Refusal, unix_ms};

pub(crate) use tollgate_cluster::auth::rpc::AUTH_HEADER;

/// The keys of `channel` from `[cluster]` (validated: the secret is set and long
/// enough, so an error here names a config the validation missed).
pub(crate) fn keys(config: &ClusterConfig, channel: Channel) -> Result<ClusterKeys, String> {
    let secret = config.secret.as_deref().unwrap_or_default();
    ClusterKeys::new(&config.cluster_id, secret, &config.accept_secrets, channel)
        .map_err(|e| format!("cluster.secret: {e}"))
}

/// A node's RPC signer and verifier.
#[derive(Debug)]
pub(crate) struct RpcAuth {
    signer: RpcSigner,
    verifier: RpcVerifier,
    /// The RPC address this node announces: what its requests are tagged for.
    own: String,
}

/// The RPC address a node announces to its peers (its metadata's `rpc_addr`).
pub(crate) fn announced_rpc(config: &ClusterConfig) -> String {
    (config.rpc_advertise.or(config.rpc_listen))
        .or(config.gossip_advertise)
        .unwrap_or(config.gossip_listen)
        .to_string()
}

/// `headers` as the (name, value) pairs a tag covers.
fn pairs(headers: &HeaderMap) -> Vec<(&str, &[u8])> {
    (headers.iter())
        .map(|(name, value)| (name.as_str(), value.as_bytes()))
        .collect()
}

impl RpcAuth {
    /// From `[cluster]`.
    pub(crate) fn new(config: &ClusterConfig) -> Result<RpcAuth, String> {
        let keys = keys(config, Channel::Rpc)?;
        Ok(RpcAuth {
            signer: RpcSigner::new(keys.clone()),
            verifier: RpcVerifier::new(keys),
            own: announced_rpc(config),
        })
    }

    /// Signs a request to the node at `to` (its announced RPC address) on
    /// `path` with `headers` and `body`: adds the tag to `headers`, returns
    /// what the answer is checked against.
    pub(crate) fn sign(
        &self,
        to: &str,
        path: &str,
        headers: &mut HeaderMap,
        body: &[u8],
    ) -> RequestTag {
        sign_with(&self.signer, to, path, headers, body)
    }

    /// What `headers` alone refuse (no tag, another secret, stale, seen
    /// before): checked before the body is read.
    pub(crate) fn precheck(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let auth = headers.get(AUTH_HEADER).map(HeaderValue::as_bytes);
        self.verifier.precheck(auth, unix_ms())
    }

    /// The request's tag if it is authentic, for this node, fresh and new.
    pub(crate) fn verify(
        &self,
        path: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<RequestTag, Refusal> {
        let auth = headers.get(AUTH_HEADER).map(HeaderValue::as_bytes);
        let headers = pairs(headers);
        let request = Request {
            to: &self.own,
            path,
            headers: &headers,
            body,
        };
        self.verifier.verify(auth, &request, unix_ms())
    }
}

/// [`RpcAuth::sign`] with a signer alone (a node that only sends).
pub(crate) fn sign_with(
    signer: &RpcSigner,
    to: &str,
    path: &str,
    headers: &mut HeaderMap,
    body: &[u8],
) -> RequestTag {
    let pairs = pairs(headers);
    let request = Request {
        to,
        path,
        headers: &pairs,
        body,
    };
    let (auth, tag) = signer.sign(&request, unix_ms());
    if let Ok(value) = HeaderValue::from_str(&auth) {
        headers.insert(AUTH_HEADER, value);
    }
    tag
}

/// Whether `tag` (an answer's [`AUTH_HEADER`]) is the tag of the answer to
/// `request` with `status` and `body` (`None`: a streamed answer, tagged on
/// its status alone).
pub(crate) fn answered(
    request: &RequestTag,
    tag: Option<&HeaderValue>,
    status: u16,
    body: Option<&[u8]>,
) -> bool {
    request.answered_by(tag.map(HeaderValue::as_bytes), status, body)
}

/// The reason label of an RPC refused for its tag
/// (`tollgate_internal_rpc_refused_total{reason}`).
pub(crate) fn refusal_label(refusal: Refusal) -> &'static str {
    match refusal {
        // No tag, or not one of this format: the old plain-secret header too.
        Refusal::Malformed => "unauthenticated",
        other => other.label(),
    }
}
