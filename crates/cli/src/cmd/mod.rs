//! One module per subcommand.
pub mod cp;
pub mod doctor;
pub mod serve;
pub mod topo;
