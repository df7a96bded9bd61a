//! # tollgate-jepsen
//!
//! Home of the partition-testing harness (a later issue): real tollgate processes in
//! their own network namespaces, a nemesis schedule, a history, and a checker for each
//! sync mode's promise judged against the mock upstream's log. Empty until then, on
//! purpose: nothing here pretends to test anything yet.
