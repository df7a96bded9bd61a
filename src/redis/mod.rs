//! # Redis strict modes
//!
//! Optional: nothing else needs Redis. The scripts in `lua/` do every decision
//! atomically in Redis, with Redis `TIME`:
//!
//! - [`scripts`]: the scripts, compiled in (`lib.lua` + each entry script).
//! - [`keys`]: key names; every key of a scope shares its `{hash tag}`.
//! - [`store`]: the client (multiplexed, reconnecting, timeouts, metrics) and the
//!   typed calls: reserve, settle, semaphore, lease, charge.
//! - [`batch`]: reservations of a hot scope batched behind the call in flight.
//! - [`gate`]: `redis` mode: reserve after local admission, settle with the
//!   permit, degrade to the local share when Redis is lost and reconcile after.

pub mod batch;
pub mod gate;
pub mod keys;
pub mod scripts;
pub mod store;

pub use keys::ScopeKeys;
pub use store::{
    Algorithm, DimSpec, LeaseAsk, LeaseLine, Leased, RedisStore, Reservation, Reserve, Reserved,
    Settled, StoreError,
};
