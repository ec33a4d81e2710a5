//! gdx-nccl: what NCCL did, whether it was the best this machine allows, and what to tell it.
//!
//! - [`parse`] reads `NCCL_DEBUG=INFO` logs (one file or one per rank, hosts interleaved,
//!   NCCL 2.10 – 2.28 wordings) into an [`NcclLog`]: version, ranks, NICs, GPU Direct RDMA
//!   per HCA, the transport of every channel, NVLS/CollNet, the topology file, warnings.
//! - [`judge`] compares it with gdx-topo's model and gdx-doctor's findings and says, for every
//!   class of rank pairs, whether NCCL took the most direct path and, when not, why.
//! - [`env`] recommends the `NCCL_*` environment for a machine, each variable with its reason.
//! - [`run`] drives every local GPU from one process (`ncclCommInitAll`), times all-reduce,
//!   all-gather, reduce-scatter and send/recv like nccl-tests, and captures NCCL's own log.
//!
//! The library returns data; [`render`] turns it into the text `gdx nccl` prints. No `unsafe`
//! here: libnccl and libcuda are reached through gdx-sys.
#![deny(missing_docs)]
#![forbid(unsafe_code)]
// Lints: [workspace.lints] in the root Cargo.toml (unsafe contracts, no unwrap/expect/panic).

pub mod env;
pub mod error;
pub mod judge;
pub mod line;
pub mod model;
pub mod parse;
pub mod render;
pub mod run;

pub use error::NcclError;
pub use model::NcclLog;
pub use parse::{parse_files, parse_text};
