//! Registered memory: [`Region`], the registry peers reach it through, and the per-region lease
//! protocol.
//!
//! Invariants:
//! - A peer reaches a region only through the registry, which checks id, the 128-bit key (in constant
//!   time), the access right and `offset + len <= len` *before* any byte is touched.
//! - Every access to region memory, by the user or by a transport thread, holds a [`Lease`]. Local
//!   shared views exclude incoming remote writes; a local mutable view excludes everything. Dropping a
//!   region (or ending a [`RegionScope`]) first refuses new leases, then waits for the running ones, so
//!   a borrowed buffer is never touched after its borrow ends.

//!
//! `lease` holds the protocol and each region's shared state, `registry` the table and the
//! remote check, `handle` the user's [`Region`], its views and [`RegionScope`].

mod handle;
mod lease;
mod registry;

pub use crate::desc::{Access, Location, RegionDesc, RegionKey};
pub use handle::{Region, RegionMut, RegionRef, RegionScope};
pub(crate) use lease::{Lease, LeaseKind, RegionInner, Revocable};
pub(crate) use registry::{NicRegistrations, RegionCache, Registry};

use crate::error::{Error, Result};

/// Checks `offset + len` against a region length (a value check, below the registry, so GPU
/// memory and files check their bounds without reaching the registry).
pub(crate) fn check_bounds(offset: u64, len: u64, region_len: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= region_len => Ok(()),
        _ => Err(Error::OutOfBounds {
            offset,
            len,
            region_len,
        }),
    }
}

#[cfg(test)]
mod tests;
