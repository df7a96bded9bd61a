//! Micro-batching of reservations.
//!
//! A reservation for a scope with no call in flight goes out at once, alone
//! (`reserve.lua` with n = 1): an idle scope waits for nothing. Reservations that
//! arrive while one is in flight for the same scope wait, and go out together in
//! one `reserve.lua` call as soon as it returns, in arrival order, at most
//! [`MAX_BATCH`] per call. So a hot scope pays the per-call cost (the EVALSHA
//! round trip, `TIME`, reading its windows) once per batch instead of once per
//! request, with no timer and no added latency beyond the wait for the call in
//! flight, which a request would have spent queued in the connection anyway.
//! Decisions are the ones the same requests would get one call at a time, in the
//! same order (`reserve.lua` decides them in sequence).
//!
//! Bounded: one waiting list per scope with a call in flight, each entry a
//! request that is itself waiting (the actors bound those); each call has the
//! store's timeout, and a request waits behind at most ceil(queued / 64) calls
//! while Redis answers; when a call fails, every request queued behind it fails
//! with it, so none waits more than two timeouts on a Redis that stopped
//! answering.
//! Waiters whose caller is gone are dropped before their batch goes out. (The
//! gate's reservations wait here from a task of their own, which stays until the
//! answer, so that an admission whose client left can be cancelled: theirs go
//! out, and are cancelled right after, `RedisGate::reserve_to_the_end`.) The
//! exact log (O(entries) per decision) is never batched.

use super::ScopeKeys;
use super::store::{Algorithm, RedisStore, Reservation, Reserved, StoreError};
use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::oneshot;

/// Most reservations in one `reserve.lua` call (its ARGV grows by three per
/// reservation; 64 keeps a call well under a millisecond of Redis time).
pub const MAX_BATCH: usize = 64;

type Answer = Result<Reserved, StoreError>;

struct Waiter {
    reservation: Reservation,
    reply: oneshot::Sender<Answer>,
}

/// Scopes with a call in flight, and what waits behind it (keyed by the
/// scope's requests key, which names the scope).
#[derive(Default)]
pub(super) struct Batches {
    in_flight: Mutex<HashMap<String, Vec<Waiter>>>,
}

impl Batches {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<Waiter>>> {
        self.in_flight.lock()
    }

    /// Takes the next batch waiting for `scope`: the oldest reservation and those
    /// with the same limits after it, up to [`MAX_BATCH`]; if none waits, the
    /// scope has no call in flight any more.
    fn next(&self, scope: &str) -> Vec<Waiter> {
        let mut map = self.lock();
        let Some(waiting) = map.get_mut(scope) else {
            return Vec::new();
        };
        // A waiter whose caller is gone (client disconnected): reserving for it
        // would charge what nobody settles. Dropped before choosing the batch, so
        // that a batch is empty only when nobody live waits, and the scope is then
        // idle again: left in the map, it would queue every later reservation
        // behind a call that never comes.
        waiting.retain(|w| !w.reply.is_closed());
        if waiting.is_empty() {
            map.remove(scope);
            return Vec::new();
        }
        let first = &waiting[0].reservation;
        let (windows, concurrency) = (first.windows, first.concurrency);
        let mut batch = Vec::new();
        let mut rest = Vec::new();
        for w in waiting.drain(..) {
            let r = &w.reservation;
            let same = r.windows == windows && r.concurrency == concurrency;
            if same && batch.len() < MAX_BATCH {
                batch.push(w);
            } else {
                rest.push(w);
            }
        }
        *waiting = rest;
        batch
    }
}

impl Batches {
    /// Everything waiting for `scope`, which has no call in flight any more:
    /// the next reservation for it goes out at once, alone.
    fn take_all(&self, scope: &str) -> Vec<Waiter> {
        self.lock().remove(scope).unwrap_or_default()
    }
}

/// [`RedisStore::reserve`]: alone if the scope is idle, else batched behind the
/// call in flight.
pub(super) async fn reserve(store: &RedisStore, keys: &ScopeKeys, r: &Reservation) -> Answer {
    // The exact log costs O(entries) per decision: a batch of them could outlast
    // the timeout and fail every waiter at once. Sent alone.
    if r.windows.iter().any(|w| w.algorithm == Algorithm::Log) {
        return store.reserve_one(keys, r).await;
    }
    let batches = store.batches();
    let waiting = {
        let mut map = batches.lock();
        match map.get_mut(keys.requests()) {
            Some(waiting) => {
                let (reply, answer) = oneshot::channel();
                waiting.push(Waiter {
                    reservation: r.clone(),
                    reply,
                });
                Some(answer)
            }
            None => {
                map.insert(keys.requests().to_owned(), Vec::new());
                None
            }
        }
    };
    if let Some(answer) = waiting {
        return answer.await.unwrap_or_else(|_| {
            Err(StoreError::Unexpected {
                script: "reserve_many",
                detail: "the batch was dropped unanswered".to_owned(),
            })
        });
    }
    let _lead = Lead { store, keys };
    store.reserve_one(keys, r).await
}

/// The call in flight for a scope. When it ends (answered, or its caller gone:
/// a dropped future), whatever queued meanwhile goes out from a task of its own,
/// so the leader's answer is not held back by the batches behind it and no
/// waiter is stranded by a cancelled leader.
struct Lead<'a> {
    store: &'a RedisStore,
    keys: &'a ScopeKeys,
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        let batch = self.store.batches().next(self.keys.requests());
        if batch.is_empty() {
            return;
        }
        // Dropped outside a runtime (only while one shuts down): the waiters'
        // senders drop with the batch and each sees its call fail.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(drain(self.store.clone(), self.keys.clone(), batch));
        }
    }
}

/// Sends batches for `keys`' scope until nothing waits.
async fn drain(store: RedisStore, keys: ScopeKeys, mut batch: Vec<Waiter>) {
    let batches = Arc::clone(store.batches());
    while !batch.is_empty() {
        let reservations: Vec<Reservation> = batch.iter().map(|w| w.reservation.clone()).collect();
        match store.reserve_many(&keys, &reservations).await {
            Ok(answers) => {
                for (w, a) in batch.drain(..).zip(answers) {
                    let _ = w.reply.send(Ok(a));
                }
            }
            Err(e) => {
                // Every waiter gets the failure (each then falls back on its
                // own), those queued behind this batch too: Redis just failed a
                // call, so each later batch would most likely wait out a timeout
                // of its own before failing the same way. Sent one batch after
                // another, the last of 640 waiters on a black-holed Redis
                // waited about ten timeouts, far past its own wait.
                let detail = e.to_string();
                let behind = batches.take_all(keys.requests());
                for w in batch.drain(..).chain(behind) {
                    let _ = w.reply.send(Err(copy_error(&e, &detail)));
                }
                return;
            }
        }
        // The callers just answered are often about to reserve again: let them
        // run first, so they join the next batch instead of one of them leading
        // a call of its own once this scope looks idle (without this yield, lone
        // and full calls alternate; measured: 25 decisions per call).
        tokio::task::yield_now().await;
        batch = batches.next(keys.requests());
    }
}

fn copy_error(e: &StoreError, detail: &str) -> StoreError {
    match e {
        StoreError::Timeout(d) => StoreError::Timeout(*d),
        _ => StoreError::Unexpected {
            script: "reserve_many",
            detail: detail.to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::store::DimSpec;

    fn reservation(capacity: u64) -> Reservation {
        let dim = DimSpec {
            algorithm: Algorithm::Window { bucket_ms: 1_000 },
            capacity,
            window_ms: 60_000,
        };
        Reservation {
            windows: [
                dim,
                dim,
                DimSpec::NONE,
                DimSpec::NONE,
                DimSpec::NONE,
                DimSpec::NONE,
            ],
            cost: crate::actor::scope::Cost {
                input: 1,
                output: 0,
                output_cap: 0,
            },
            concurrency: 0,
            permit_id: String::new(),
            slot_ttl_ms: 0,
        }
    }

    /// A waiter and the receiving end of its answer (dropped: its caller left).
    fn waiter(capacity: u64) -> (Waiter, oneshot::Receiver<Answer>) {
        let (reply, answer) = oneshot::channel();
        let reservation = reservation(capacity);
        (Waiter { reservation, reply }, answer)
    }

    /// Against a server that accepts connections and never answers (a Redis
    /// black-holed mid-call), 300 reservations on one scope, queued behind each
    /// other: each fails within two timeouts (the call in flight, then its
    /// batch's), not one timeout per batch ahead of it (five here).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reservations_queued_behind_a_failed_call_fail_with_it() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = silent.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = silent.accept().await {
                held.push(socket);
            }
        });
        let timeout = std::time::Duration::from_millis(200);
        let store = RedisStore::single(&format!("redis://{addr}/"), timeout, None).unwrap();
        let keys = ScopeKeys::new("tg", "tenant:t");
        let started = tokio::time::Instant::now();
        let calls: Vec<_> = (0..300)
            .map(|_| {
                let (store, keys) = (store.clone(), keys.clone());
                tokio::spawn(async move {
                    let answer = store.reserve(&keys, &reservation(10)).await;
                    (answer.is_err(), started.elapsed())
                })
            })
            .collect();
        let mut slowest = std::time::Duration::ZERO;
        for call in calls {
            let (failed, took) = call.await.unwrap();
            assert!(failed, "a silent server admitted a reservation");
            slowest = slowest.max(took);
        }
        // Two timeouts (plus the connection's own, up to the same again), well
        // under the five a batch at a time took.
        assert!(slowest < timeout * 7 / 2, "the slowest waited {slowest:?}");
    }

    #[test]
    fn a_scope_whose_waiters_all_left_is_idle_again() {
        let batches = Batches::default();
        let (w, answer) = waiter(10);
        drop(answer);
        batches.lock().insert("s".to_owned(), vec![w]);
        assert!(batches.next("s").is_empty());
        assert!(
            !batches.lock().contains_key("s"),
            "a scope left in the map queues every later reservation forever"
        );
    }

    #[test]
    fn a_first_waiter_that_left_does_not_hide_the_live_ones_behind_it() {
        let batches = Batches::default();
        let (gone, answer) = waiter(10);
        drop(answer);
        // Different limits from the first: a batch chosen by the first waiter's
        // limits would come back empty, and nothing would send the live one.
        let (live, _answer) = waiter(20);
        batches.lock().insert("s".to_owned(), vec![gone, live]);
        let batch = batches.next("s");
        assert_eq!(batch.len(), 1);
        assert_eq!(batch[0].reservation.windows[0].capacity, 20);
        assert!(batches.next("s").is_empty());
        assert!(!batches.lock().contains_key("s"));
    }
}
