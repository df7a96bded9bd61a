//! `redis-lease`: `lease`'s terms, with Redis as the owner of every key. Holders
//! reserve credit in Redis by Lua scripts within the same terms every node
//! computes here; a node cut from Redis spends what it holds, then its cut-off
//! share, which its peers keep reserved for it (`View::redis_held`).

use super::lease::leased_key;
use super::{KeyInput, Mode, Output, Round};

/// `redis-lease` mode.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RedisLease;

impl Mode for RedisLease {
    fn promise(&self) -> &'static str {
        "redis-lease: cluster total <= L, Redis lost by some nodes or all"
    }

    fn key(&self, round: &Round<'_>, key: &KeyInput<'_>, out: &mut Output) {
        leased_key(round, key, out);
    }
}
