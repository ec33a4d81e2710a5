//! One module per subcommand.
pub mod args;
pub mod bench;
pub mod calibrate;
pub mod cluster;
pub mod cp;
pub mod cp_safetensors;
pub mod cp_watch;
pub mod doctor;
pub mod logger;
pub mod nccl;
pub mod output;
pub mod peers;
pub mod secret;
pub mod serve;
pub mod stream;
pub mod topo;
