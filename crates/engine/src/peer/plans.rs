//! A peer's plans for a transfer: each op's from the thread's last plan, the peer's plan cache
//! (`crate::routing::cache`) or, failing both, the planner.

use super::Peer;
use crate::error::Result;
use crate::routing::cache::{last_plan, remember_plan, Ends};
use crate::routing::plan::{plan_op, Here};
use crate::transfer::{OpRef, Transfer};

fn ends<'a>(op: OpRef<'a>) -> Ends<'a> {
    Ends {
        local: op.local,
        remote: op.remote,
    }
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
                .and_then(|op| last_plan(&self.inner, ends(op), strict));
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
            let plan = match last_plan(&self.inner, ends(op), strict) {
                Some(p) => p,
                None => {
                    let cache = cache.get_or_insert_with(|| {
                        self.inner.plans.lock().unwrap_or_else(|p| p.into_inner())
                    });
                    let p = match cache.get(ends(op), strict) {
                        Some(p) => p,
                        None => {
                            let p = plan_op(
                                &self.inner.route,
                                op.local,
                                op.remote,
                                &self.inner.tcp_detail,
                                &self.inner.fabric,
                                strict,
                                Here {
                                    cuda: self.inner.agent.cuda.get().is_some(),
                                    cma: &self.inner.cma,
                                },
                            )?;
                            cache.put(ends(op), strict, &p);
                            p
                        }
                    };
                    remember_plan(&self.inner, ends(op), strict, &p);
                    p
                }
            };
            plans.push(plan);
        }
        Ok(plans)
    }
}
