//! A peer's plans: the planner runs once per pair of regions, not once per submit. The peer
//! keeps its last few plans ([`PlanCache`]), and each thread its very last one (`LAST_PLAN`),
//! which a latency loop finds without taking a lock.

use std::sync::{Arc, Weak};

use super::{Peer, PeerInner};
use crate::error::Result;
use crate::plan::plan_op;
use crate::transfer::Transfer;

/// The last few plans this peer made, so a stream of transfers between the same regions costs
/// the planner (and the formatting of its reason) once, not once per submit. A plan depends
/// only on the two regions and strict mode, which the key holds; the local region is held
/// weakly (a cached plan never keeps freed memory alive, and its address is not reused while
/// the entry lives).
#[derive(Debug, Default)]
pub(super) struct PlanCache {
    entries: Vec<(PlanKey, crate::plan::Plan)>,
    next: usize,
}

/// What a plan was made for: the two regions (the local one held weakly) and strict mode.
#[derive(Debug)]
struct PlanKey {
    local: Weak<crate::region::RegionInner>,
    remote: Arc<crate::region::RegionDesc>,
    strict: bool,
}

impl PlanKey {
    fn of(op: crate::transfer::OpRef<'_>, strict: bool) -> PlanKey {
        PlanKey {
            local: Arc::downgrade(op.local),
            remote: Arc::clone(op.remote),
            strict,
        }
    }

    fn matches(&self, op: crate::transfer::OpRef<'_>, strict: bool) -> bool {
        self.strict == strict
            && std::ptr::eq(self.local.as_ptr(), Arc::as_ptr(op.local))
            && (Arc::ptr_eq(&self.remote, op.remote) || *self.remote == **op.remote)
    }
}

impl PlanCache {
    const SIZE: usize = 8;

    fn get(&self, op: crate::transfer::OpRef<'_>, strict: bool) -> Option<crate::plan::Plan> {
        self.entries
            .iter()
            .find(|(k, _)| k.matches(op, strict))
            .map(|e| e.1.clone())
    }

    fn put(&mut self, op: crate::transfer::OpRef<'_>, strict: bool, plan: &crate::plan::Plan) {
        let e = (PlanKey::of(op, strict), plan.clone());
        if self.entries.len() < Self::SIZE {
            self.entries.push(e);
        } else {
            self.entries[self.next % Self::SIZE] = e;
            self.next = self.next.wrapping_add(1);
        }
    }
}

/// This thread's last plan and what it was made for.
#[derive(Debug)]
struct LastPlan {
    peer: Weak<PeerInner>,
    key: PlanKey,
    plan: crate::plan::Plan,
}

thread_local! {
    /// A thread submitting a stream of transfers between the same two regions finds their
    /// plan here, without taking the peer's cache lock. Weak references, as in `PlanCache`:
    /// nothing is kept alive, and no address is reused while the entry lives.
    static LAST_PLAN: std::cell::RefCell<Option<LastPlan>> = const { std::cell::RefCell::new(None) };
}

fn last_plan(
    peer: &Arc<PeerInner>,
    op: crate::transfer::OpRef<'_>,
    strict: bool,
) -> Option<crate::plan::Plan> {
    LAST_PLAN.with(|l| {
        let l = l.borrow();
        let e = l.as_ref()?;
        (std::ptr::eq(e.peer.as_ptr(), Arc::as_ptr(peer)) && e.key.matches(op, strict))
            .then(|| e.plan.clone())
    })
}

fn remember_plan(
    peer: &Arc<PeerInner>,
    op: crate::transfer::OpRef<'_>,
    strict: bool,
    plan: &crate::plan::Plan,
) {
    LAST_PLAN.with(|l| {
        *l.borrow_mut() = Some(LastPlan {
            peer: Arc::downgrade(peer),
            key: PlanKey::of(op, strict),
            plan: plan.clone(),
        });
    });
}

impl Peer {
    /// Checks `t` and makes each op's plan (what `submit` and `prepare` share).
    pub(super) fn plan(&self, t: &Transfer) -> Result<crate::transfer::Plans> {
        t.validate()?;
        self.check_alive()?;
        let strict = self
            .inner
            .agent
            .strict
            .load(std::sync::atomic::Ordering::Relaxed);
        // A one-op transfer on this thread's last pair of regions (a latency loop): its plan is
        // the last one, with no list to build.
        if t.ops.len() == 1 {
            let last = t
                .op_refs()
                .next()
                .and_then(|op| last_plan(&self.inner, op, strict));
            if let Some(p) = last {
                return Ok(crate::transfer::Plans::one(p));
            }
        }
        // A batch's ops mostly join the same two regions: the plan (and its reason, a formatted
        // string) is made once per run of such ops, not once per op.
        let mut plans = crate::transfer::Plans::default();
        // The peer's cache is locked only when this thread's last plan does not fit.
        let mut cache = None;
        for (i, op) in t.op_refs().enumerate() {
            if i > 0 && t.ops[i - 1].same_regions(&op) {
                plans.push_same();
                continue;
            }
            let plan = match last_plan(&self.inner, op, strict) {
                Some(p) => p,
                None => {
                    let cache = cache.get_or_insert_with(|| {
                        self.inner.plans.lock().unwrap_or_else(|p| p.into_inner())
                    });
                    let p = match cache.get(op, strict) {
                        Some(p) => p,
                        None => {
                            let p = plan_op(
                                &self.inner.route,
                                op.local,
                                op.remote,
                                &self.inner.tcp_detail,
                                &self.inner.fabric,
                                strict,
                                self.inner.agent.cuda.get().is_some(),
                            )?;
                            cache.put(op, strict, &p);
                            p
                        }
                    };
                    remember_plan(&self.inner, op, strict, &p);
                    p
                }
            };
            plans.push(plan);
        }
        Ok(plans)
    }
}
