//! The Lua scripts in `lua/`, compiled in with `include_str!`. Each entry script is
//! run as `lib.lua` + itself, so the algorithms are written once; redis-rs runs
//! them by EVALSHA and reloads them on NOSCRIPT (e.g. after `SCRIPT FLUSH` or a
//! restart).

use redis::Script;
use std::sync::LazyLock;

/// The shared algorithms (not run alone).
pub const LIB: &str = include_str!("../../lua/lib.lua");

fn with_lib(entry: &str) -> Script {
    Script::new(&format!("{LIB}\n{entry}"))
}

/// `reserve.lua`: n reservations of one scope (1 alone, more batched), each all
/// dimensions or none, decided in order.
pub static RESERVE: LazyLock<Script> =
    LazyLock::new(|| with_lib(include_str!("../../lua/reserve.lua")));

/// `settle.lua`: refund or debt into the reservation's bucket, free its slot.
pub static SETTLE: LazyLock<Script> =
    LazyLock::new(|| with_lib(include_str!("../../lua/settle.lua")));

/// `semaphore.lua`: acquire / heartbeat / release with a ttl per slot.
pub static SEMAPHORE: LazyLock<Script> =
    LazyLock::new(|| with_lib(include_str!("../../lua/semaphore.lua")));

/// `lease.lua`: `redis-lease` mode's credit line per holder.
pub static LEASE: LazyLock<Script> =
    LazyLock::new(|| with_lib(include_str!("../../lua/lease.lua")));

/// `charge.lua`: reconciles spending made while Redis was lost into its buckets.
pub static CHARGE: LazyLock<Script> =
    LazyLock::new(|| with_lib(include_str!("../../lua/charge.lua")));
