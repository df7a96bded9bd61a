//! Placeholder: being written (see lib.rs).
