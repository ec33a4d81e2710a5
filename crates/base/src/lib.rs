//! gdx-base: what every gdx crate shares and that needs no vendor library. Each helper exists
//! once here, so that a size, a pattern or a median means the same thing in every command,
//! probe, benchmark and test. It depends on no other crate of the workspace, and loads nothing:
//! the vendor libraries are gdx-sys's.
//!
//! | module | the one … |
//! |---|---|
//! | [`clock`] | host wall clock: a closure's time, spans joined across threads |
//! | [`bytesize`] | byte-count parser and formatter (`1GB` = 10^9, `1GiB` = 2^30) |
//! | [`pattern`] | seeded test pattern, its check and the poison byte |
//! | [`shed`] | choice of whom to shed from a full table of unfinished connections (network prefixes, fairness) |
//! | [`stats`] | median / quantile / min / max / σ of a run's samples |
//! | [`testenv`] | test precondition (`GDX_REQUIRE_HW`), the GPU tests run on, the replay seed |

#![deny(missing_docs)]
// Lints: [workspace.lints] in the root Cargo.toml (unsafe contracts, no unwrap/expect/panic).
#![forbid(unsafe_code)]

pub mod bytesize;
pub mod clock;
pub mod pattern;
pub mod shed;
pub mod stats;
pub mod testenv;
