//! Per-op values stored once per run of consecutive ops that share them: each op's plan in a
//! transfer, each op's result in a report.
//!
//! A batch mostly joins the same two regions with ops of one size, so its thousand ops share
//! one plan and end with one outcome. Stored per op, that is a thousand reference-count
//! increments (a `Plan`'s reason is an `Arc<str>`) at submit, a thousand more for the report
//! and as many decrements when they drop, and tens of KiB allocated and freed per transfer
//! (which glibc may hand back to the kernel and fault in again on the next one). Stored per
//! run, it is one of each.

use std::sync::Arc;

use smallvec::SmallVec;

use super::{OpKind, OpStatus};
use crate::routing::plan::{Path, Plan};

/// Values for ops `0..len`, one entry per run of equal consecutive values (the first inline:
/// a one-op transfer's plan, or its report's result, costs no allocation).
#[derive(Debug, Clone)]
struct Runs<T> {
    /// (end of the run, exclusive; its value), ends ascending.
    runs: SmallVec<[(u32, T); 1]>,
}

impl<T> Default for Runs<T> {
    fn default() -> Self {
        Runs {
            runs: SmallVec::new(),
        }
    }
}

impl<T> Runs<T> {
    /// One op's value: built in place, with none of a push's capacity checks (a one-op
    /// transfer's plan, or its report's result).
    fn one(v: T) -> Self {
        Runs {
            runs: SmallVec::from_buf([(1, v)]),
        }
    }

    fn len(&self) -> usize {
        self.runs.last().map_or(0, |r| r.0 as usize)
    }

    /// Appends one op to the last run (none yet: nothing to extend).
    fn extend_last(&mut self) {
        if let Some(last) = self.runs.last_mut() {
            last.0 += 1;
        }
    }

    /// Appends one op with its own run of `v`.
    fn push_run(&mut self, v: T) {
        let end = self.len() as u32 + 1;
        self.runs.push((end, v));
    }

    /// Appends one op: to the last run when `same` says its value is the op's, else as a new
    /// run of `make()`.
    fn push_with(&mut self, same: impl FnOnce(&T) -> bool, make: impl FnOnce() -> T) {
        if self.runs.last().is_some_and(|last| same(&last.1)) {
            self.extend_last();
        } else {
            self.push_run(make());
        }
    }

    /// The value of op `i`.
    fn get(&self, i: usize) -> Option<&T> {
        if let [(end, v)] = &self.runs[..] {
            return (i < *end as usize).then_some(v);
        }
        let k = self.runs.partition_point(|r| r.0 as usize <= i);
        self.runs.get(k).map(|r| &r.1)
    }

    /// The value of op `i`, which must be one of the ops (as a slice's index, past the end it
    /// panics).
    fn at(&self, i: usize) -> &T {
        &self.runs[self.runs.partition_point(|r| r.0 as usize <= i)].1
    }

    /// Each op's value, in op order.
    fn iter(&self) -> PerOp<'_, T> {
        PerOp {
            runs: &self.runs,
            run: 0,
            at: 0,
            len: self.len(),
        }
    }
}

/// `Runs::iter`.
struct PerOp<'a, T> {
    runs: &'a [(u32, T)],
    run: usize,
    at: usize,
    len: usize,
}

impl<'a, T> Iterator for PerOp<'a, T> {
    type Item = &'a T;

    fn next(&mut self) -> Option<&'a T> {
        if self.at >= self.len {
            return None;
        }
        while self
            .runs
            .get(self.run)
            .is_some_and(|r| r.0 as usize <= self.at)
        {
            self.run += 1;
        }
        self.at += 1;
        self.runs.get(self.run).map(|r| &r.1)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.len - self.at.min(self.len);
        (n, Some(n))
    }
}

impl<T> ExactSizeIterator for PerOp<'_, T> {}

impl<T> Clone for PerOp<'_, T> {
    fn clone(&self) -> Self {
        PerOp { ..*self }
    }
}

/// Whether two plans are the one plan (same path, the same shared reason): what a run of a
/// transfer's plans is made of. Plans of one region pair come from one cache entry, so this is
/// a pointer comparison, not a string comparison.
fn same_plan(a: &Plan, b: &Plan) -> bool {
    a.path == b.path && Arc::ptr_eq(&a.reason, &b.reason)
}

/// Each op's plan, as made at submit.
#[derive(Debug, Clone, Default)]
pub(crate) struct Plans(Runs<Plan>);

impl Plans {
    /// The plans of a one-op transfer.
    pub(crate) fn one(plan: Plan) -> Plans {
        Plans(Runs::one(plan))
    }

    /// Appends the plan of the next op (taken, not cloned: its reason's reference moves in).
    pub(crate) fn push(&mut self, plan: Plan) {
        if self.last().is_some_and(|last| same_plan(last, &plan)) {
            self.0.extend_last();
        } else {
            self.0.push_run(plan);
        }
    }

    /// Appends the next op, whose plan is the last op's (no op yet: nothing to repeat).
    pub(crate) fn push_same(&mut self) {
        self.0.extend_last();
    }

    /// The last op's plan, if any.
    pub(crate) fn last(&self) -> Option<&Plan> {
        self.0.runs.last().map(|r| &r.1)
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The plan of op `i` (`None` past the end).
    #[cfg(test)]
    fn get(&self, i: usize) -> Option<&Plan> {
        self.0.get(i)
    }

    /// The plan of op `i`, which must be one of the ops (past the end it panics, as a slice's
    /// index does).
    pub(crate) fn at(&self, i: usize) -> &Plan {
        self.0.at(i)
    }

    /// Each op's plan, in op order.
    pub(crate) fn iter(&self) -> impl ExactSizeIterator<Item = &Plan> + Clone + '_ {
        self.0.iter()
    }

    /// The one plan of a one-op transfer.
    pub(crate) fn only(&self) -> Option<&Plan> {
        match &self.0.runs[..] {
            [(1, p)] => Some(p),
            _ => None,
        }
    }

    /// Each op's path.
    pub(crate) fn paths(&self) -> impl ExactSizeIterator<Item = Path> + '_ {
        self.iter().map(|p| p.path)
    }
}

/// Per-op result: the path taken, why, and the outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpResult {
    /// Write or read.
    pub kind: OpKind,
    /// Length in bytes.
    pub len: u64,
    /// Path and reason.
    pub plan: Plan,
    /// Outcome.
    pub status: OpStatus,
}

/// One [`OpResult`] per op of a transfer, in submission order: indexed (`ops[i]`), iterated
/// (`ops.iter()`, `for o in &ops`) and counted (`ops.len()`) as a list is. Consecutive ops with
/// the same result (same direction, length, plan and outcome, as most of a batch's are) share
/// one stored entry, so a report of a thousand-op batch costs one entry, not a thousand.
#[derive(Debug, Clone, Default)]
pub struct OpResults(Runs<OpResult>);

impl OpResults {
    /// The result of a one-op transfer.
    pub(crate) fn one(r: OpResult) -> OpResults {
        OpResults(Runs::one(r))
    }

    /// Appends op results one by one (each stored once per run of equal results).
    pub(crate) fn push_with(
        &mut self,
        kind: OpKind,
        len: u64,
        plan: &Plan,
        status: impl FnOnce() -> OpStatus,
        same_status: impl FnOnce(&OpStatus) -> bool,
    ) {
        self.0.push_with(
            |r| {
                r.kind == kind && r.len == len && same_plan(&r.plan, plan) && same_status(&r.status)
            },
            || OpResult {
                kind,
                len,
                plan: plan.clone(),
                status: status(),
            },
        );
    }

    /// Number of ops.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True for no ops.
    pub fn is_empty(&self) -> bool {
        self.0.runs.is_empty()
    }

    /// The result of op `i`.
    pub fn get(&self, i: usize) -> Option<&OpResult> {
        self.0.get(i)
    }

    /// The first op's result.
    pub fn first(&self) -> Option<&OpResult> {
        self.0.runs.first().map(|r| &r.1)
    }

    /// The last op's result.
    pub fn last(&self) -> Option<&OpResult> {
        self.0.runs.last().map(|r| &r.1)
    }

    /// Each op's result, in submission order.
    pub fn iter(&self) -> OpResultsIter<'_> {
        OpResultsIter(self.0.iter())
    }

    /// The results as a list, one entry per op.
    pub fn to_vec(&self) -> Vec<OpResult> {
        self.iter().cloned().collect()
    }
}

impl std::ops::Index<usize> for OpResults {
    type Output = OpResult;

    /// # Panics
    /// When `i` is not an op of the transfer (as a slice's index does).
    // `Index` has no way to fail but a panic; `get` is the fallible form.
    #[allow(clippy::panic)]
    fn index(&self, i: usize) -> &OpResult {
        match self.get(i) {
            Some(r) => r,
            None => panic!("op {i} of a transfer of {} op(s)", self.len()),
        }
    }
}

impl PartialEq for OpResults {
    fn eq(&self, other: &OpResults) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for OpResults {}

/// [`OpResults::iter`]: each op's result, in submission order.
#[derive(Clone)]
pub struct OpResultsIter<'a>(PerOp<'a, OpResult>);

impl<'a> Iterator for OpResultsIter<'a> {
    type Item = &'a OpResult;

    fn next(&mut self) -> Option<&'a OpResult> {
        self.0.next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

impl ExactSizeIterator for OpResultsIter<'_> {}

impl<'a> IntoIterator for &'a OpResults {
    type Item = &'a OpResult;
    type IntoIter = OpResultsIter<'a>;

    fn into_iter(self) -> OpResultsIter<'a> {
        self.iter()
    }
}

impl IntoIterator for OpResults {
    type Item = OpResult;
    type IntoIter = std::vec::IntoIter<OpResult>;

    fn into_iter(self) -> Self::IntoIter {
        self.to_vec().into_iter()
    }
}

impl From<OpResults> for Vec<OpResult> {
    fn from(r: OpResults) -> Vec<OpResult> {
        r.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(path: Path, why: &str) -> Plan {
        Plan {
            path,
            reason: why.into(),
        }
    }

    #[test]
    fn plans_of_one_pair_are_one_run_and_every_op_reads_its_own() {
        let (a, b) = (plan(Path::Shm, "a"), plan(Path::Tcp, "b"));
        let mut p = Plans::default();
        for _ in 0..1000 {
            p.push(a.clone());
        }
        p.push(b.clone());
        p.push(a.clone());
        assert_eq!(p.len(), 1002);
        assert_eq!(p.0.runs.len(), 3, "1000 equal plans, then two changes");
        assert_eq!(p.get(999).map(|p| p.path), Some(Path::Shm));
        assert_eq!(p.get(1000).map(|p| p.path), Some(Path::Tcp));
        assert_eq!(p.get(1001).map(|p| p.path), Some(Path::Shm));
        assert!(p.get(1002).is_none());
        let paths: Vec<Path> = p.paths().collect();
        assert_eq!(paths.len(), 1002);
        assert_eq!(paths[1000], Path::Tcp);
        assert!(p.only().is_none());
    }

    #[test]
    fn one_op_built_in_place_reads_as_one_pushed() {
        let a = plan(Path::Shm, "a");
        let mut pushed = Plans::default();
        pushed.push(a.clone());
        let one = Plans::one(a.clone());
        assert_eq!(one.len(), 1);
        assert!(one.only().is_some_and(|p| same_plan(p, &a)));
        assert_eq!(
            one.paths().collect::<Vec<_>>(),
            pushed.paths().collect::<Vec<_>>()
        );
        let r = OpResult {
            kind: OpKind::Write,
            len: 8,
            plan: a.clone(),
            status: OpStatus::Completed,
        };
        let mut pushed = OpResults::default();
        pushed.push_with(
            r.kind,
            r.len,
            &a,
            || OpStatus::Completed,
            |s| *s == OpStatus::Completed,
        );
        let one = OpResults::one(r);
        assert_eq!(one.len(), 1);
        assert_eq!(
            one.iter().collect::<Vec<_>>(),
            pushed.iter().collect::<Vec<_>>()
        );
        assert!(one.get(1).is_none());
    }

    #[test]
    fn equal_text_from_two_plans_is_two_runs_still_read_right() {
        // Not the same shared reason: stored apart (correct either way).
        let mut p = Plans::default();
        p.push(plan(Path::Shm, "x"));
        p.push(plan(Path::Shm, "x"));
        assert_eq!(p.0.runs.len(), 2);
        assert_eq!(p.iter().count(), 2);
        let mut one = Plans::default();
        one.push(plan(Path::Tcp, "t"));
        assert_eq!(one.only().map(|p| p.path), Some(Path::Tcp));
    }

    #[test]
    fn results_index_iterate_and_compare_per_op() {
        let a = plan(Path::Shm, "a");
        let mut r = OpResults::default();
        let err = crate::Error::RegionGone { region: 7 };
        for i in 0..10u64 {
            let st = if i == 4 {
                OpStatus::Failed(err.clone())
            } else {
                OpStatus::Completed
            };
            let s2 = st.clone();
            r.push_with(OpKind::Write, 8, &a, || st, |s| *s == s2);
        }
        assert_eq!(r.len(), 10);
        assert_eq!(r.0.runs.len(), 3);
        assert_eq!(r[4].status, OpStatus::Failed(err));
        assert_eq!(r[9].status, OpStatus::Completed);
        assert_eq!(
            r.iter().filter(|o| o.status == OpStatus::Completed).count(),
            9
        );
        assert_eq!((&r).into_iter().count(), 10);
        let v: Vec<OpResult> = r.clone().into();
        assert_eq!(v.len(), 10);
        assert_eq!(v[4], r[4]);
        assert_eq!(r, r.clone());
        assert!(r.get(10).is_none());
    }

    #[test]
    #[should_panic(expected = "op 3 of a transfer of 3 op(s)")]
    fn indexing_past_the_ops_panics_as_a_slice_does() {
        let mut r = OpResults::default();
        for _ in 0..3 {
            r.push_with(
                OpKind::Read,
                1,
                &plan(Path::Tcp, "t"),
                || OpStatus::Completed,
                |_| true,
            );
        }
        let _ = &r[3];
    }
}
