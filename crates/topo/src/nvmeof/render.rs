//! How `gdx topo` shows NVMe-oF controllers: one text line each, and the JSON list.

use super::Controller;
use crate::model::Topology;

/// The controllers as `gdx topo` lists them: one line each with the target, the state, the
/// namespaces, the carrying NIC and its class to each GPU; empty when there are none.
pub fn render_text(ctrls: &[Controller], topo: &Topology) -> String {
    if ctrls.is_empty() {
        return String::new();
    }
    let mut out = String::from("\nNVMe over Fabrics:\n");
    for c in ctrls {
        let classes: Vec<String> = c
            .gpu_classes(topo)
            .into_iter()
            .map(|(g, k)| format!("{g} {}", k.map(|k| k.to_string()).unwrap_or("-".into())))
            .collect();
        out.push_str(&format!(
            "  {}  {}  {}  namespaces {}  {}{}\n",
            c.name,
            c.target(),
            c.state.as_deref().unwrap_or("?"),
            if c.namespaces.is_empty() {
                "none".to_string()
            } else {
                c.namespaces.join(",")
            },
            c.fabric_path()
                .split_once(" via ")
                .map(|(_, v)| format!("via {v}"))
                .unwrap_or_default(),
            if classes.is_empty() {
                String::new()
            } else {
                format!("  [{}]", classes.join(", "))
            }
        ));
    }
    out
}

/// The controllers as JSON for `gdx topo --json` (`"nvmeof"`), each with `gpu_classes`.
pub fn json(ctrls: &[Controller], topo: &Topology) -> serde_json::Value {
    serde_json::Value::Array(
        ctrls
            .iter()
            .map(|c| {
                let mut v = serde_json::to_value(c).unwrap_or_default();
                let classes: serde_json::Map<String, serde_json::Value> = c
                    .gpu_classes(topo)
                    .into_iter()
                    .map(|(g, k)| (g, k.map(|k| k.to_string().into()).unwrap_or_default()))
                    .collect();
                v["gpu_classes"] = classes.into();
                v["fabric_path"] = c.fabric_path().into();
                v
            })
            .collect(),
    )
}
