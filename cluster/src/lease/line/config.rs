//! A line's configuration: what it limits, its capacity, the most credit one
//! holder may hold, and the credit's ttl, checked once when the line is made.

use crate::counter::Window;
use crate::lease::{MAX_AMOUNT, MAX_HOLDERS, MAX_TTL_MS};

/// What a line limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Cost per sliding window (requests, tokens), in the counters' buckets.
    Windowed(Window),
    /// Units held at once (requests in flight).
    Slots,
}

/// Why a [`LineConfig`] cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `capacity` must be in `1..=MAX_AMOUNT`.
    #[error("capacity must be in 1..={MAX_AMOUNT}, got {0}")]
    Capacity(u64),
    /// `max_credit` must be in `1..=capacity`.
    #[error("max_credit must be in 1..=capacity ({capacity}), got {max_credit}")]
    MaxCredit {
        /// The capacity.
        capacity: u64,
        /// What was asked.
        max_credit: u64,
    },
    /// `max_holders` must be in `1..=MAX_HOLDERS`.
    #[error("max_holders must be in 1..={MAX_HOLDERS}, got {0}")]
    MaxHolders(usize),
    /// `ttl_ms` must be in `1..=MAX_TTL_MS`.
    #[error("ttl must be in 1..={MAX_TTL_MS} ms, got {0}")]
    Ttl(u64),
}

/// One key's limit as its owner enforces it. The same on every node (it decides what
/// a rebuilt owner assumes of holders it has not heard from).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineConfig {
    pub(super) capacity: u64,
    pub(super) kind: Kind,
    pub(super) max_credit: u64,
    pub(super) max_holders: usize,
    pub(super) ttl_ms: u64,
}

impl LineConfig {
    /// `capacity` L of `kind`; `max_credit` caps one holder's credit (slots: what it
    /// holds); `max_holders` bounds the holders tracked; `ttl_ms` is a credit's life.
    pub fn try_new(
        capacity: u64,
        kind: Kind,
        max_credit: u64,
        max_holders: usize,
        ttl_ms: u64,
    ) -> Result<Self, ConfigError> {
        if capacity == 0 || capacity > MAX_AMOUNT {
            return Err(ConfigError::Capacity(capacity));
        }
        if max_credit == 0 || max_credit > capacity {
            return Err(ConfigError::MaxCredit {
                capacity,
                max_credit,
            });
        }
        if max_holders == 0 || max_holders > MAX_HOLDERS {
            return Err(ConfigError::MaxHolders(max_holders));
        }
        if ttl_ms == 0 || ttl_ms > MAX_TTL_MS {
            return Err(ConfigError::Ttl(ttl_ms));
        }
        Ok(Self {
            capacity,
            kind,
            max_credit,
            max_holders,
            ttl_ms,
        })
    }

    /// The capacity L.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// What the line limits.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The most credit one holder holds.
    pub fn max_credit(&self) -> u64 {
        self.max_credit
    }

    /// A credit's life.
    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }
}
