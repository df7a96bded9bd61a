//! Errors of the membership layer.
//!
//! chitchat reports its own failures as `anyhow::Error`; they are kept here by message
//! (`Start`, `Shutdown`) so this crate does not depend on anyhow.

use thiserror::Error;

use super::metadata::MetadataError;

/// Why a membership call failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum MembershipError {
    /// A [`MembershipConfig`](super::MembershipConfig) field breaks a rule; `field` names
    /// it as written in the config struct.
    #[error("invalid membership config `{field}`: {reason}")]
    InvalidConfig {
        /// The offending field, e.g. `gossip_interval` or `metadata.rpc_addr`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// This node's own metadata does not parse (see [`NodeMetadata`](super::NodeMetadata)).
    #[error("invalid node metadata: {0}")]
    Metadata(#[from] MetadataError),
    /// chitchat could not start (usually: the gossip address could not be bound).
    #[error("chitchat failed to start: {0}")]
    Start(String),
    /// chitchat's server task ended with an error or panicked.
    #[error("chitchat failed to shut down cleanly: {0}")]
    Shutdown(String),
    /// `set_many` was given a key under the reserved metadata prefix `m:`.
    #[error("key `{key}` is reserved for node metadata (prefix `m:`)")]
    ReservedKey {
        /// The rejected key.
        key: String,
    },
    /// `set_many` was given an empty key.
    #[error("empty key")]
    EmptyKey,
    /// Applying the batch would leave this node publishing more keys than allowed.
    #[error("state would hold {keys} keys, more than the limit of {max}")]
    TooManyKeys {
        /// Keys this node would publish after the batch.
        keys: usize,
        /// The limit ([`StateLimits::max_keys`](super::StateLimits)).
        max: usize,
    },
    /// Applying the batch would leave this node publishing more bytes than allowed.
    #[error("state would weigh {bytes} bytes, more than the limit of {max}")]
    TooManyBytes {
        /// Estimated bytes this node would publish after the batch.
        bytes: usize,
        /// The limit ([`StateLimits::max_bytes`](super::StateLimits)).
        max: usize,
    },
}
