//! Node metadata: what a peer needs to reach a node (proxy and internal RPC addresses)
//! and to decide whether to trust it (software version, sync mode).
//!
//! Published as reserved chitchat keys under [`RESERVED_PREFIX`] next to the node's
//! other replicated state, and parsed back on every observer. A peer whose metadata is
//! missing or does not parse is reported as untrusted (see `view.rs`), never guessed at.

use serde::Serialize;
use thiserror::Error;

/// Prefix of the keys reserved for metadata; `set_many` refuses keys under it.
pub const RESERVED_PREFIX: &str = "m:";
/// Key holding the metadata schema version ([`SCHEMA_VERSION`]).
pub(super) const KEY_SCHEMA: &str = "m:v";
/// Key holding [`NodeMetadata::proxy_addr`].
pub(super) const KEY_PROXY_ADDR: &str = "m:proxy_addr";
/// Key holding [`NodeMetadata::rpc_addr`].
pub(super) const KEY_RPC_ADDR: &str = "m:rpc_addr";
/// Key holding [`NodeMetadata::version`].
pub(super) const KEY_VERSION: &str = "m:version";
/// Key holding [`NodeMetadata::sync_mode`].
pub(super) const KEY_SYNC_MODE: &str = "m:sync_mode";
/// Key holding [`NodeMetadata::rpc_version`], a decimal number; absent on older
/// builds (read as 1), so it needs no new [`SCHEMA_VERSION`]. A value
/// this build cannot read is read as 1 too, never as an untrusted member: a later
/// build that wrote, say, `3.1` would otherwise drop out of this build's
/// membership altogether, where reading it as 1 only sends it the least.
pub(super) const KEY_RPC_VERSION: &str = "m:rpc_version";
/// Key present (`1`) on a node that accepts spilled requests on its internal RPC
/// (`lease` spillover on); absent elsewhere and on older builds, so it needs no
/// new [`SCHEMA_VERSION`]. Peers spill only to nodes that publish it.
pub(super) const KEY_SPILLS: &str = "m:spills";
/// Metadata schema this build writes and accepts. Bump it when a key changes meaning.
pub(super) const SCHEMA_VERSION: &str = "1";
/// The internal RPC's wire version this build speaks. An owner parses statements
/// strictly (a field it does not know is a malformed batch), so a holder sends a
/// field only to owners whose version reads it:
/// - 1: statements with `adopted`, without `held`, and what any build that
///   publishes no key is read as. Builds without `adopted` cannot be told apart
///   from it and refuse `adopted` (docs/design/lease.md, "Versions");
/// - 2 ([`HELD_SINCE_RPC_VERSION`]): a statement may carry `held`, the cut-off
///   figure the holder holds.
pub const RPC_VERSION: u32 = 2;
/// The first wire version whose owners parse a statement's `held`.
pub const HELD_SINCE_RPC_VERSION: u32 = 2;
/// What a node that publishes no [`KEY_RPC_VERSION`], or one this build cannot
/// read, is taken to speak: the least.
const RPC_VERSION_LEAST: u32 = 1;

/// Longest accepted address value in bytes (a DNS name plus a port fits).
const MAX_ADDR_LEN_BYTES: usize = 255;
/// Longest accepted `version` / `sync_mode` value in bytes.
const MAX_LABEL_LEN_BYTES: usize = 64;

/// What a node tells its peers about itself.
///
/// Strings rather than typed values so a newer node with, say, a sync mode this build
/// does not know still parses; the gateway maps `sync_mode` to its own enum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeMetadata {
    /// Public proxy address clients use (`host:port`).
    pub proxy_addr: String,
    /// Internal RPC address for lease traffic (`host:port`), never the proxy port.
    pub rpc_addr: String,
    /// Software version, e.g. `0.1.0`.
    pub version: String,
    /// Sync mode the node runs, e.g. `lease` (docs/design/cluster.md).
    pub sync_mode: String,
    /// The internal RPC's wire version it speaks ([`RPC_VERSION`] for this build).
    pub rpc_version: u32,
    /// Whether it accepts spilled requests ([`KEY_SPILLS`]).
    pub spills: bool,
}

/// Why a member's metadata cannot be trusted.
#[derive(Debug, Error, Clone, PartialEq, Eq, Serialize)]
pub enum MetadataError {
    /// A required key is absent (normal for a few gossip rounds while a node joins).
    #[error("metadata key `{key}` is missing")]
    Missing {
        /// The absent key.
        key: &'static str,
    },
    /// A key is present but its value is malformed.
    #[error("metadata key `{key}` is invalid: {reason}")]
    Invalid {
        /// The offending key.
        key: &'static str,
        /// What is wrong with the value.
        reason: String,
    },
    /// The node writes a metadata schema this build does not read.
    #[error("metadata schema `{found}` is not supported (expected `{SCHEMA_VERSION}`)")]
    UnsupportedSchema {
        /// The schema the node announced.
        found: String,
    },
}

impl NodeMetadata {
    /// The reserved key-value pairs announcing this metadata.
    pub fn to_key_values(&self) -> Vec<(String, String)> {
        vec![
            (KEY_SCHEMA.to_string(), SCHEMA_VERSION.to_string()),
            (KEY_PROXY_ADDR.to_string(), self.proxy_addr.clone()),
            (KEY_RPC_ADDR.to_string(), self.rpc_addr.clone()),
            (KEY_VERSION.to_string(), self.version.clone()),
            (KEY_SYNC_MODE.to_string(), self.sync_mode.clone()),
            (KEY_RPC_VERSION.to_string(), self.rpc_version.to_string()),
        ]
        .into_iter()
        .chain(
            self.spills
                .then(|| (KEY_SPILLS.to_string(), "1".to_string())),
        )
        .collect()
    }

    /// Parses metadata from a node's key-values (`get` looks a key up).
    pub fn parse<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Result<Self, MetadataError> {
        let field = |key: &'static str| get(key).ok_or(MetadataError::Missing { key });
        let schema = field(KEY_SCHEMA)?;
        if schema != SCHEMA_VERSION {
            return Err(MetadataError::UnsupportedSchema {
                found: schema.chars().take(MAX_LABEL_LEN_BYTES).collect(),
            });
        }
        let metadata = NodeMetadata {
            proxy_addr: field(KEY_PROXY_ADDR)?.to_string(),
            rpc_addr: field(KEY_RPC_ADDR)?.to_string(),
            version: field(KEY_VERSION)?.to_string(),
            sync_mode: field(KEY_SYNC_MODE)?.to_string(),
            rpc_version: (get(KEY_RPC_VERSION).and_then(|v| v.parse::<u32>().ok()))
                .filter(|v| *v >= RPC_VERSION_LEAST)
                .unwrap_or(RPC_VERSION_LEAST),
            spills: get(KEY_SPILLS) == Some("1"),
        };
        metadata.validate()?;
        Ok(metadata)
    }

    /// Checks every field: addresses are `host:port` with a non-zero port, labels are
    /// short printable ASCII.
    pub fn validate(&self) -> Result<(), MetadataError> {
        check_host_port(KEY_PROXY_ADDR, &self.proxy_addr)?;
        check_host_port(KEY_RPC_ADDR, &self.rpc_addr)?;
        check_label(KEY_VERSION, &self.version)?;
        check_label(KEY_SYNC_MODE, &self.sync_mode)
    }
}

fn invalid(key: &'static str, reason: impl Into<String>) -> MetadataError {
    MetadataError::Invalid {
        key,
        reason: reason.into(),
    }
}

/// Accepts `host:port`, `[v6]:port` and `a.b.c.d:port`; the host is not resolved here.
pub(crate) fn check_host_port(key: &'static str, value: &str) -> Result<(), MetadataError> {
    if value.len() > MAX_ADDR_LEN_BYTES {
        return Err(invalid(
            key,
            format!("longer than {MAX_ADDR_LEN_BYTES} bytes"),
        ));
    }
    let Some((host, port)) = value.rsplit_once(':') else {
        return Err(invalid(key, "expected host:port"));
    };
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid(key, "empty or malformed host"));
    }
    match port.parse::<u16>() {
        Ok(port) if port != 0 => Ok(()),
        _ => Err(invalid(key, "port must be 1-65535")),
    }
}

fn check_label(key: &'static str, value: &str) -> Result<(), MetadataError> {
    let printable = value.bytes().all(|b| b.is_ascii_graphic());
    if value.is_empty() || value.len() > MAX_LABEL_LEN_BYTES || !printable {
        return Err(invalid(
            key,
            format!("expected 1-{MAX_LABEL_LEN_BYTES} printable ASCII characters"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn sample() -> NodeMetadata {
        NodeMetadata {
            proxy_addr: "10.0.0.1:8080".to_string(),
            rpc_addr: "node-1.tollgate.svc:8081".to_string(),
            version: "0.1.0".to_string(),
            sync_mode: "lease".to_string(),
            rpc_version: RPC_VERSION,
            spills: false,
        }
    }

    fn parse_map(map: &HashMap<String, String>) -> Result<NodeMetadata, MetadataError> {
        NodeMetadata::parse(|key| map.get(key).map(String::as_str))
    }

    #[test]
    fn round_trips_through_key_values() {
        let map: HashMap<_, _> = sample().to_key_values().into_iter().collect();
        assert_eq!(parse_map(&map), Ok(sample()));
        assert!(map.keys().all(|key| key.starts_with(RESERVED_PREFIX)));
    }

    #[test]
    fn missing_key_is_reported() {
        let mut map: HashMap<_, _> = sample().to_key_values().into_iter().collect();
        map.remove(KEY_RPC_ADDR);
        assert_eq!(
            parse_map(&map),
            Err(MetadataError::Missing { key: KEY_RPC_ADDR })
        );
    }

    #[test]
    fn a_node_accepts_spilled_requests_only_when_it_says_so() {
        let mut on = sample();
        on.spills = true;
        let map: HashMap<String, String> = on.to_key_values().into_iter().collect();
        assert_eq!(map.get(KEY_SPILLS).map(String::as_str), Some("1"));
        assert_eq!(parse_map(&map).map(|m| m.spills), Ok(true));
        let map: HashMap<String, String> = sample().to_key_values().into_iter().collect();
        assert!(!map.contains_key(KEY_SPILLS), "nothing published when off");
        assert_eq!(parse_map(&map).map(|m| m.spills), Ok(false));
    }

    #[test]
    fn a_node_from_before_the_rpc_version_key_speaks_version_1() {
        let mut map: HashMap<_, _> = sample().to_key_values().into_iter().collect();
        map.remove(KEY_RPC_VERSION);
        assert_eq!(parse_map(&map).map(|m| m.rpc_version), Ok(1));
    }

    #[test]
    fn an_rpc_version_this_build_cannot_read_is_version_1_and_still_trusted() {
        for value in ["0", "two", "", "3.1", "99999999999"] {
            let mut map: HashMap<_, _> = sample().to_key_values().into_iter().collect();
            map.insert(KEY_RPC_VERSION.to_string(), value.to_string());
            assert_eq!(parse_map(&map).map(|m| m.rpc_version), Ok(1), "{value:?}");
        }
        let mut map: HashMap<_, _> = sample().to_key_values().into_iter().collect();
        map.insert(KEY_RPC_VERSION.to_string(), "7".to_string());
        assert_eq!(
            parse_map(&map).map(|m| m.rpc_version),
            Ok(7),
            "a later build"
        );
    }

    #[test]
    fn other_schema_is_refused() {
        let mut map: HashMap<_, _> = sample().to_key_values().into_iter().collect();
        map.insert(KEY_SCHEMA.to_string(), "2".to_string());
        assert!(matches!(
            parse_map(&map),
            Err(MetadataError::UnsupportedSchema { .. })
        ));
    }

    #[test]
    fn malformed_values_are_refused() {
        for (key, value) in [
            (KEY_PROXY_ADDR, "no-port"),
            (KEY_PROXY_ADDR, "host:0"),
            (KEY_RPC_ADDR, ":8080"),
            (KEY_RPC_ADDR, "host:99999"),
            (KEY_VERSION, ""),
            (KEY_SYNC_MODE, "has space"),
        ] {
            let mut map: HashMap<_, _> = sample().to_key_values().into_iter().collect();
            map.insert(key.to_string(), value.to_string());
            assert!(
                matches!(parse_map(&map), Err(MetadataError::Invalid { key: k, .. }) if k == key),
                "{key}={value:?} should be refused"
            );
        }
    }

    #[test]
    fn ipv6_addresses_parse() {
        let mut metadata = sample();
        metadata.rpc_addr = "[::1]:8081".to_string();
        assert_eq!(metadata.validate(), Ok(()));
    }
}
