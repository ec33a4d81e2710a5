//! Print what gdx-rdma sees on this machine, as JSON: libibverbs, devices (or why none),
//! the dma-buf probe per device, port MTUs, the GID gdx would use per port, and the NICs it
//! would pick for each GPU and for host memory.
//!
//! ```text
//! cargo run -p gdx-rdma --example rdma_info
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // an example, not library code

use gdx_rdma::doctor;
use gdx_rdma::gid::SysfsNetdevs;
use gdx_rdma::nic::{choose_nics, GpuRef, MemPlace};
use serde_json::json;
use std::path::Path;

fn main() {
    let lib = gdx_sys::verbs::probe();
    let devices = doctor::rdma_devices();
    let names: Vec<String> = devices
        .as_ref()
        .map(|d| d.iter().map(|d| d.name.clone()).collect())
        .unwrap_or_default();
    let dmabuf: Vec<_> = names
        .iter()
        .map(|n| json!({ "device": n, "dmabuf": doctor::dmabuf_kernel_support(n).to_string() }))
        .collect();
    let mtus = doctor::port_mtus(devices.as_deref().unwrap_or(&[]), Path::new("/"));
    let topo = gdx_topo::discover();
    let (gids, choices) = match &topo {
        Ok(t) => {
            let gids = doctor::roce_gids(t, &SysfsNetdevs::live());
            let mut places: Vec<(String, MemPlace)> = t
                .gpus()
                .map(|g| {
                    (
                        g.label.clone(),
                        MemPlace::Gpu(GpuRef::Label(g.label.clone())),
                    )
                })
                .collect();
            places.push(("host".into(), MemPlace::Host { numa: None }));
            let choices: Vec<_> = places
                .into_iter()
                .map(|(who, p)| match choose_nics(t, &p) {
                    Ok(c) => json!({ "memory": who, "choice": c }),
                    Err(e) => json!({ "memory": who, "error": e.to_string() }),
                })
                .collect();
            (json!(gids), json!(choices))
        }
        Err(e) => (json!(null), json!({ "error": e.to_string() })),
    };
    let out = json!({
        "libibverbs": match &lib {
            Ok(l) => json!({
                "path": l.path,
                "rdma_core": l.rdma_core_version,
                "has_reg_dmabuf_mr": l.has_reg_dmabuf_mr,
            }),
            Err(u) => json!({ "unavailable": u.reason }),
        },
        "devices": match &devices {
            Ok(d) => json!(d.iter().map(|d| json!({
                "name": d.name,
                "ports": d.ports.iter().map(|p| json!({
                    "port": p.number,
                    "state": p.state.to_string(),
                    "link_layer": p.link_layer.to_string(),
                    "active_mtu": p.active_mtu_bytes,
                    "rate_gbps": p.rate_gbps,
                    "gids": p.gids.len(),
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>()),
            Err(e) => json!({ "unavailable": e }),
        },
        "dmabuf": dmabuf,
        "mtu": mtus,
        "roce_gid": gids,
        "nic_choice": choices,
    });
    match serde_json::to_string_pretty(&out) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("rdma_info: {e}"),
    }
}
