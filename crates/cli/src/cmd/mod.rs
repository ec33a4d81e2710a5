pub mod topo;
