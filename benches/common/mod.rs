//! What the criterion benches share.

use std::time::Duration;

use criterion::Criterion;

/// Short runs: each bench stays around a minute on two cores.
pub(crate) fn short_runs() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
}
