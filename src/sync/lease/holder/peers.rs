//! Peers as the keys' owners (`lease`): each key's owner among the live
//! members (rendezvous hashing), this node's own book directly, the others in
//! batches over the internal RPC.

use super::owners::{Owners, Sender};
use super::{Items, Round};
use crate::actor::credit::Credit;
use crate::sync::lease::owner::OwnerBook;
use crate::sync::lease::rpc;
use crate::sync::lease::wire::{self, Entry};
use crate::sync::lease::{MemberAddr, View};
use futures_util::future::BoxFuture;
use std::sync::Arc;

/// `lease`: the members own the keys; this node's share of them is its book.
pub(crate) struct PeerOwners {
    book: Arc<OwnerBook>,
}

impl PeerOwners {
    /// Owners over this node's book.
    pub(crate) fn new(book: Arc<OwnerBook>) -> PeerOwners {
        PeerOwners { book }
    }
}

impl Owners for PeerOwners {
    fn owner_of<'v>(&self, view: &'v View, key: &str) -> Option<&'v MemberAddr> {
        view.owner(key)
    }

    fn are_members(&self) -> bool {
        true
    }

    fn take_restates(&self) -> Vec<usize> {
        self.book.take_restates()
    }

    /// The share the owner told it with the last reply it adopted (the owner
    /// charges it until a statement says a later reply was adopted, whatever
    /// either side's view of demand).
    fn cut_off(&self, credit: &Credit, _key: &str, _now_ms: u64) {
        credit.with(|b| b.cut_off_by_owner());
    }

    fn send<'a>(
        &'a self,
        sender: Sender<'a>,
        owner: &'a MemberAddr,
        items: Items,
        view: &'a View,
        _round: Round,
    ) -> BoxFuture<'a, Vec<(Items, super::Answered)>> {
        Box::pin(async move {
            let bindings = &sender.node.bindings;
            let book = &self.book;
            if owner.id == view.self_id {
                let answers = (items.iter())
                    .map(|(i, s)| {
                        let key = &bindings[*i].key;
                        (book.sync(&view.self_id, key, &s.request))
                            .map_err(|e| wire::refusal_code(&e).to_owned())
                    })
                    .collect();
                book.send_asks_again();
                return vec![(items, Ok(answers))];
            }
            let entries = (items.iter())
                .map(|(i, s)| {
                    Entry::new(&bindings[*i].key, &s.request).readable_by(owner.rpc_version)
                })
                .collect();
            let batches = wire::batches(
                &sender.settings.cluster_id,
                &view.self_id,
                entries,
                wire::SEND_BODY_BYTES,
            );
            // Usually one; all at once when more, each answered in order.
            let calls = (batches.iter())
                .map(|batch| rpc::call(sender.client, &owner.rpc, &sender.settings.auth, batch));
            let answered = futures_util::future::join_all(calls).await;
            let mut rest = items;
            let mut parts = Vec::with_capacity(batches.len());
            for (batch, answers) in batches.iter().zip(answered) {
                let after = rest.split_off(batch.entries.len().min(rest.len()));
                let part = std::mem::replace(&mut rest, after);
                let answers = answers.map(|a| a.into_iter().map(|a| a.into_result()).collect());
                parts.push((part, answers));
            }
            parts
        })
    }
}
