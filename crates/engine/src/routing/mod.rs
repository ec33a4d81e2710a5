//! Routing: which path each op takes, and why, in one place.
//!
//! - [`path`]: the path vocabulary ([`path::Path`]) and a [`path::Plan`] (a path and its
//!   reason), values below everything that plans.
//! - [`plan`]: the peer-level choice ([`plan::PeerRoute`]: shm or tcp, rails) and the per-op rules for a
//!   remote region.
//! - [`planner`]: the same-process planner (GPU ↔ GPU, host ↔ GPU, imported regions) and the
//!   [`planner::Policy`] (forced paths, strict mode).
//! - [`calibration`]: measured thresholds the planners consult.
//! - [`cache`]: a peer's recent plans, so a stream of transfers between the same regions pays
//!   the planner once.

pub(crate) mod cache;
pub(crate) mod calibration;
pub(crate) mod path;
pub(crate) mod plan;
pub mod planner;
