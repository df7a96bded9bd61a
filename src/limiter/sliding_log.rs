//! Placeholder: implemented by the limiter work (see limiter/mod.rs for the contract).
#![allow(missing_docs, clippy::todo, unused_variables)]
use super::{Ceiling, Denial, LimitSpec, Nanos, Reservation, Settlement, Snapshot, SpecError};

#[derive(Debug, Clone)]
pub struct SlidingLog {
    spec: LimitSpec,
}

impl SlidingLog {
    pub fn try_new(spec: LimitSpec) -> Result<Self, SpecError> {
        Ok(Self { spec })
    }
    pub fn spec(&self) -> &LimitSpec {
        &self.spec
    }
    pub fn check(&self, now: Nanos, cost: u64, ceiling: Ceiling) -> Result<(), Denial> {
        todo!()
    }
    pub fn reserve(&mut self, now: Nanos, cost: u64, ceiling: Ceiling) -> Result<Reservation, Denial> {
        todo!()
    }
    pub fn settle(&mut self, now: Nanos, reservation: Reservation, actual: u64) -> Settlement {
        todo!()
    }
    pub fn snapshot(&self, now: Nanos) -> Snapshot {
        todo!()
    }
    pub fn is_at_rest(&self, now: Nanos) -> bool {
        todo!()
    }
}
