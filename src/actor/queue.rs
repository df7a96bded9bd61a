//! Waiting queues, one per lane. Within a lane: FIFO. Across lanes: the head with
//! the earliest *effective* arrival goes first, where a batch waiter's effective
//! arrival is its real arrival plus `aging`. So interactive traffic overtakes batch
//! traffic that arrived less than `aging` before it, and a batch waiter older than
//! that is served before newer interactive ones: batch is deprioritised, never
//! starved. Pure and bounded.

use super::Lane;
use crate::limiter::Nanos;
use std::collections::VecDeque;

/// One queued request.
#[derive(Debug)]
pub struct Waiter<T> {
    /// Lane it waits in.
    pub lane: Lane,
    /// Arrival time.
    pub enqueued_ns: Nanos,
    /// Give up (429) at this time.
    pub deadline_ns: Nanos,
    /// What it costs the scope.
    pub cost: super::scope::Cost,
    /// The actor's reply channel and request details.
    pub payload: T,
}

/// The two lanes' queues.
#[derive(Debug)]
pub struct WaitQueue<T> {
    interactive: VecDeque<Waiter<T>>,
    batch: VecDeque<Waiter<T>>,
    aging_ns: Nanos,
    max_len: usize,
}

impl<T> WaitQueue<T> {
    /// Empty queues holding at most `max_len` waiters in total.
    pub fn new(aging_ns: Nanos, max_len: usize) -> WaitQueue<T> {
        WaitQueue {
            interactive: VecDeque::new(),
            batch: VecDeque::new(),
            aging_ns,
            max_len,
        }
    }

    fn lane_mut(&mut self, lane: Lane) -> &mut VecDeque<Waiter<T>> {
        match lane {
            Lane::Interactive => &mut self.interactive,
            Lane::Batch => &mut self.batch,
        }
    }

    /// Total waiters.
    pub fn len(&self) -> usize {
        self.interactive.len() + self.batch.len()
    }

    /// No waiters at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waiters per lane `[interactive, batch]`.
    pub fn depths(&self) -> [usize; 2] {
        [self.interactive.len(), self.batch.len()]
    }

    /// Appends a waiter, or hands it back when the queue is full.
    pub fn push(&mut self, waiter: Waiter<T>) -> Result<(), Waiter<T>> {
        if self.len() >= self.max_len {
            return Err(waiter);
        }
        self.lane_mut(waiter.lane).push_back(waiter);
        Ok(())
    }

    /// Lanes in the order their heads should be served: the head with the earliest
    /// effective arrival first. Ties go to interactive.
    pub fn order(&self) -> [Option<Lane>; 2] {
        match (self.interactive.front(), self.batch.front()) {
            (None, None) => [None, None],
            (Some(_), None) => [Some(Lane::Interactive), None],
            (None, Some(_)) => [Some(Lane::Batch), None],
            (Some(i), Some(b)) => {
                if b.enqueued_ns.saturating_add(self.aging_ns) < i.enqueued_ns {
                    [Some(Lane::Batch), Some(Lane::Interactive)]
                } else {
                    [Some(Lane::Interactive), Some(Lane::Batch)]
                }
            }
        }
    }

    /// The head of `lane`.
    pub fn head(&self, lane: Lane) -> Option<&Waiter<T>> {
        match lane {
            Lane::Interactive => self.interactive.front(),
            Lane::Batch => self.batch.front(),
        }
    }

    /// Removes and returns the head of `lane`.
    pub fn pop(&mut self, lane: Lane) -> Option<Waiter<T>> {
        self.lane_mut(lane).pop_front()
    }

    /// Removes every waiter for which `drop_it` says true, keeping order, and returns
    /// them (expired deadlines, callers that went away).
    pub fn remove_where(&mut self, mut drop_it: impl FnMut(&Waiter<T>) -> bool) -> Vec<Waiter<T>> {
        let mut removed = Vec::new();
        for lane in [Lane::Interactive, Lane::Batch] {
            let queue = self.lane_mut(lane);
            if queue.iter().any(&mut drop_it) {
                let (gone, kept): (VecDeque<_>, VecDeque<_>) =
                    queue.drain(..).partition(|w| drop_it(w));
                *queue = kept;
                removed.extend(gone);
            }
        }
        removed
    }

    /// The earliest deadline of any waiter.
    pub fn earliest_deadline(&self) -> Option<Nanos> {
        self.interactive
            .iter()
            .chain(self.batch.iter())
            .map(|w| w.deadline_ns)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(lane: Lane, at: Nanos, id: u32) -> Waiter<u32> {
        Waiter {
            lane,
            enqueued_ns: at,
            deadline_ns: at + 1_000,
            cost: Default::default(),
            payload: id,
        }
    }

    #[test]
    fn interactive_overtakes_recent_batch_but_old_batch_ages_ahead() {
        let mut q = WaitQueue::new(100, 10);
        q.push(waiter(Lane::Batch, 0, 1)).unwrap();
        q.push(waiter(Lane::Interactive, 50, 2)).unwrap();
        assert_eq!(q.order(), [Some(Lane::Interactive), Some(Lane::Batch)]);
        q.pop(Lane::Interactive);
        q.push(waiter(Lane::Interactive, 150, 3)).unwrap();
        // The batch waiter (arrived 0) is older than aging (100) relative to 150.
        assert_eq!(q.order(), [Some(Lane::Batch), Some(Lane::Interactive)]);
    }

    #[test]
    fn fifo_within_a_lane_and_bounded() {
        let mut q = WaitQueue::new(0, 2);
        q.push(waiter(Lane::Interactive, 0, 1)).unwrap();
        q.push(waiter(Lane::Interactive, 1, 2)).unwrap();
        assert!(q.push(waiter(Lane::Batch, 2, 3)).is_err());
        assert_eq!(q.pop(Lane::Interactive).map(|w| w.payload), Some(1));
        assert_eq!(q.pop(Lane::Interactive).map(|w| w.payload), Some(2));
    }

    #[test]
    fn remove_where_keeps_order_of_the_rest() {
        let mut q = WaitQueue::new(0, 10);
        for i in 0..5 {
            q.push(waiter(Lane::Interactive, i, i as u32)).unwrap();
        }
        let gone = q.remove_where(|w| w.payload % 2 == 1);
        assert_eq!(
            gone.iter().map(|w| w.payload).collect::<Vec<_>>(),
            vec![1, 3]
        );
        assert_eq!(q.pop(Lane::Interactive).map(|w| w.payload), Some(0));
        assert_eq!(q.pop(Lane::Interactive).map(|w| w.payload), Some(2));
        assert_eq!(q.earliest_deadline(), Some(1_004));
    }
}
