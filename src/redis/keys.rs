//! Redis key names. Every key of one limit scope carries the scope as its
//! `{hash tag}`, so one script's keys live in one Redis Cluster slot.

/// The keys of one scope (`tenant:acme`, `upstream:openai`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeKeys {
    /// Window keys (HASH, ZSET or STRING by algorithm): requests, tokens, input
    /// tokens, output tokens, requests and tokens per day
    /// (`crate::actor::Dimension::WINDOWED` order).
    pub windows: [String; crate::actor::WINDOWS],
    /// Concurrency semaphore (ZSET).
    pub concurrency: String,
}

impl ScopeKeys {
    /// Keys of `scope` under `prefix` (e.g. `tg`).
    pub fn new(prefix: &str, scope: &str) -> ScopeKeys {
        let at = |suffix: &str| format!("{prefix}:{{{scope}}}:{suffix}");
        ScopeKeys {
            // The day windows' names end as their limit keys' do, so a
            // Redis key too says which window it is counted over.
            windows: ["r", "t", "ti", "to", "r_per_day", "t_per_day"].map(at),
            concurrency: at("c"),
        }
    }

    /// The requests window's key: the scope's name among reservation batches.
    pub fn requests(&self) -> &str {
        &self.windows[0]
    }

    /// The credit-line HASH of one dimension (`redis-lease` mode).
    pub fn lease(prefix: &str, scope: &str, dimension: &str) -> String {
        format!("{prefix}:{{{scope}}}:lease:{dimension}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_a_scope_shares_its_hash_tag() {
        let k = ScopeKeys::new("tg", "tenant:acme");
        assert_eq!(k.requests(), "tg:{tenant:acme}:r");
        assert_eq!(k.windows[3], "tg:{tenant:acme}:to");
        assert_eq!(k.concurrency, "tg:{tenant:acme}:c");
        assert_eq!(
            ScopeKeys::lease("tg", "tenant:acme", "tokens"),
            "tg:{tenant:acme}:lease:tokens"
        );
    }
}
