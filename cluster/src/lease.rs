//! Placeholder: the lease ledger (being written).
