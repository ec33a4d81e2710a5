//! Plans kept for reuse: the planner runs once per pair of regions, not once per submit. A peer
//! keeps its last few plans ([`PlanCache`]), and each thread its very last one (`LAST_PLAN`,
//! [`last_plan`], [`remember_plan`]), which a latency loop finds without taking a lock.
//!
//! A plan depends only on the two regions and strict mode, which the key holds; the local region
//! is held weakly (a cached plan never keeps freed memory alive, and its address is not reused
//! while the entry lives).

use std::any::Any;
use std::sync::{Arc, Weak};

use crate::region::{RegionDesc, RegionInner};
use crate::routing::plan::Plan;

/// The two regions an op joins: what a plan is made for, with strict mode.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ends<'a> {
    /// The local region.
    pub local: &'a Arc<RegionInner>,
    /// The remote region's descriptor.
    pub remote: &'a Arc<RegionDesc>,
}

/// What a plan was made for: the two regions (the local one held weakly) and strict mode.
#[derive(Debug)]
struct PlanKey {
    local: Weak<RegionInner>,
    remote: Arc<RegionDesc>,
    strict: bool,
}

impl PlanKey {
    fn of(ends: Ends<'_>, strict: bool) -> PlanKey {
        PlanKey {
            local: Arc::downgrade(ends.local),
            remote: Arc::clone(ends.remote),
            strict,
        }
    }

    fn matches(&self, ends: Ends<'_>, strict: bool) -> bool {
        self.strict == strict
            && std::ptr::eq(self.local.as_ptr(), Arc::as_ptr(ends.local))
            && (Arc::ptr_eq(&self.remote, ends.remote) || *self.remote == **ends.remote)
    }
}

/// The last few plans one peer made, so a stream of transfers between the same regions costs
/// the planner (and the formatting of its reason) once, not once per submit.
#[derive(Debug, Default)]
pub(crate) struct PlanCache {
    entries: Vec<(PlanKey, Plan)>,
    next: usize,
}

impl PlanCache {
    const SIZE: usize = 8;

    /// The plan kept for `ends` under `strict`, if any.
    pub(crate) fn get(&self, ends: Ends<'_>, strict: bool) -> Option<Plan> {
        self.entries
            .iter()
            .find(|(k, _)| k.matches(ends, strict))
            .map(|e| e.1.clone())
    }

    /// Keeps `plan` for `ends`, replacing the oldest entry once full.
    pub(crate) fn put(&mut self, ends: Ends<'_>, strict: bool, plan: &Plan) {
        let e = (PlanKey::of(ends, strict), plan.clone());
        if self.entries.len() < Self::SIZE {
            self.entries.push(e);
        } else {
            self.entries[self.next % Self::SIZE] = e;
            self.next = self.next.wrapping_add(1);
        }
    }
}

/// This thread's last plan, whose (the owner: a peer) and what it was made for.
struct LastPlan {
    owner: Weak<dyn Any + Send + Sync>,
    key: PlanKey,
    plan: Plan,
}

thread_local! {
    /// A thread submitting a stream of transfers between the same two regions finds their
    /// plan here, without taking the owner's cache lock. Weak references, as in `PlanCache`:
    /// nothing is kept alive, and no address is reused while the entry lives.
    static LAST_PLAN: std::cell::RefCell<Option<LastPlan>> = const { std::cell::RefCell::new(None) };
}

/// Whether `w` points at `owner`'s allocation (the data address; a `dyn` pointer's vtable part
/// may differ between codegen units).
fn same_owner<T: Any + Send + Sync>(w: &Weak<dyn Any + Send + Sync>, owner: &Arc<T>) -> bool {
    std::ptr::eq(w.as_ptr().cast::<()>(), Arc::as_ptr(owner).cast::<()>())
}

/// The plan this thread last made through `owner` for `ends` under `strict`, if that is what it
/// was made for.
pub(crate) fn last_plan<T: Any + Send + Sync>(
    owner: &Arc<T>,
    ends: Ends<'_>,
    strict: bool,
) -> Option<Plan> {
    LAST_PLAN.with(|l| {
        let l = l.borrow();
        let e = l.as_ref()?;
        (same_owner(&e.owner, owner) && e.key.matches(ends, strict)).then(|| e.plan.clone())
    })
}

/// Makes `plan` this thread's last plan, made through `owner` for `ends` under `strict`.
pub(crate) fn remember_plan<T: Any + Send + Sync>(
    owner: &Arc<T>,
    ends: Ends<'_>,
    strict: bool,
    plan: &Plan,
) {
    let weak: Weak<T> = Arc::downgrade(owner);
    LAST_PLAN.with(|l| {
        *l.borrow_mut() = Some(LastPlan {
            owner: weak,
            key: PlanKey::of(ends, strict),
            plan: plan.clone(),
        });
    });
}
