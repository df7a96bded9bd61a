//! What a round knows about the cluster beyond the counters: how late each
//! member's figures are, who is unreachable and since when, what was frozen at a
//! cut, and who lost Redis. Every part is a pure state machine the engine feeds
//! and reads each round; the modes' arithmetic (`super::mode`) takes what they
//! conclude as plain inputs.
//!
//! - [`demand`]: demand over the last window from the actors' cumulative counters.
//! - [`echo`]: this node's usage as its peers have surely seen it (`gossip`).
//! - [`sightings`]: when each member was last heard from, and last seen live.
//! - [`history`]: each key's demand vectors, frozen when a member becomes unreachable.
//! - [`cut`]: what a node that joined during a cut adopts from those that saw it.
//! - [`successor`]: when a crashed member's floor ends after it restarted.
//! - [`redis_loss`]: `redis` mode: who charges whom while a node cannot reach Redis.

pub(crate) mod cut;
pub(crate) mod demand;
pub(crate) mod echo;
pub(crate) mod history;
pub(crate) mod redis_loss;
pub(crate) mod sightings;
pub(crate) mod successor;
