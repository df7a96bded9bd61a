//! Placeholder for the mock upstream (design.md section 9).
