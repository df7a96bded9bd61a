//! The process's open-file limit: raised to the hard limit at start, so a node
//! can hold as many connections as the host allows it, and reported.

/// The open-file limit after [`raise_to_hard`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nofile {
    /// The soft limit now (what `accept` and `connect` run into).
    pub soft: u64,
    /// The hard limit.
    pub hard: u64,
    /// The soft limit before, when it was raised.
    pub raised_from: Option<u64>,
}

/// Raises the soft open-file limit to the hard limit (an unlimited hard limit
/// is left alone: the kernel's `nr_open` bounds it anyway, and the soft limit
/// is kept). An error leaves the limit as it was, and says so.
pub fn raise_to_hard() -> std::io::Result<Nofile> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let soft = limit.current.unwrap_or(u64::MAX);
    let Some(hard) = limit.maximum else {
        return Ok(Nofile {
            soft,
            hard: u64::MAX,
            raised_from: None,
        });
    };
    if soft >= hard {
        return Ok(Nofile {
            soft,
            hard,
            raised_from: None,
        });
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(hard),
            maximum: Some(hard),
        },
    )?;
    Ok(Nofile {
        soft: hard,
        hard,
        raised_from: Some(soft),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_ends_at_the_hard_one() {
        let first = raise_to_hard().unwrap();
        assert!(
            first.soft == first.hard || first.hard == u64::MAX,
            "{first:?}"
        );
        // Raised once, nothing left to raise.
        let again = raise_to_hard().unwrap();
        assert_eq!(again.raised_from, None);
        assert_eq!(again.soft, first.soft);
    }
}
