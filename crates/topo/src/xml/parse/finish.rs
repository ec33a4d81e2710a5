//! The last pass over a parsed file: links resolved once every GPU is known, and the notes
//! that sum up what was left out.

use super::{Parser, NO_NVLINK_FACTS};
use crate::model::{DeviceKind, NvLinkTarget, PciAddr, Source, Topology};
use std::collections::{HashMap, HashSet};
use std::path::Path;

impl Parser<'_, '_> {
    pub(super) fn finish(mut self, path: &Path, nvlink_elements: bool) -> Topology {
        // A GPU-class link given without tclass: NCCL would read the target's class from
        // sysfs and take an unreadable one for an NVSwitch; in a file, a GPU listed in the
        // same file is the best evidence there is.
        let gpu_bdfs: HashSet<PciAddr> = self
            .devices
            .iter()
            .filter(|d| d.kind == DeviceKind::Gpu)
            .filter_map(|d| d.bdf)
            .collect();
        // One pass over each GPU's bundles with a set of the targets to retype, so a file
        // with many untyped links costs linear time.
        let mut retype: HashMap<PciAddr, HashSet<PciAddr>> = HashMap::new();
        for u in &self.untyped {
            if !gpu_bdfs.contains(&u.target) {
                retype.entry(u.owner).or_default().insert(u.target);
            }
        }
        for d in &mut self.devices {
            let (Some(bdf), Some(info)) = (d.bdf, d.gpu.as_mut()) else {
                continue;
            };
            let Some(targets) = retype.get(&bdf) else {
                continue;
            };
            for l in &mut info.nvlinks {
                if matches!(l.target, NvLinkTarget::Gpu(t) if targets.contains(&t)) {
                    l.target = NvLinkTarget::NvSwitch;
                }
            }
        }
        if !self.unknown_kind.is_empty() {
            let n = self.unknown_kind.len();
            let ids = some_of(self.unknown_kind.iter().map(ToString::to_string));
            self.notes.push(format!(
                "{n} PCI device{} without class or <gpu>/<nic> child: kind unknown (bus ids: {ids}); \
                 NCCL fills these in from sysfs on the machine itself",
                if n == 1 { "" } else { "s" },
            ));
        }
        if !self.untracked.is_empty() {
            let ids = some_of(
                self.untracked
                    .iter()
                    .map(|(b, c)| format!("{b} class {c:#08x}")),
            );
            self.notes.push(format!(
                "PCI devices of classes gdx does not track left out: {ids}"
            ));
        }
        if !self.ignored.is_empty() {
            let ids = some_of(self.ignored.drain(..));
            self.notes
                .push(format!("elements NCCL does not define, ignored: {ids}"));
        }
        if self.dropped_notes > 0 {
            self.notes.push(format!(
                "... and {} more notes like these",
                self.dropped_notes
            ));
        }
        let gpus = self
            .devices
            .iter()
            .filter(|d| d.kind == DeviceKind::Gpu)
            .count();
        if gpus >= 2 && !nvlink_elements {
            self.notes.push(format!(
                "this file has no <nvlink> elements: the GPU↔GPU classes are {NO_NVLINK_FACTS}; \
                 GPUs joined by NVLink or NVSwitch (Azure NDv5, for one) show PHB/SYS here, \
                 while NCCL on the machine finds their NVLinks through NVML"
            ));
        }
        let mut topo = Topology {
            source: Source::NcclXml(path.display().to_string()),
            devices: self.devices,
            switches: self.switches,
            host_bridges: self.host_bridges,
            numa_nodes: self.numa_nodes,
            nvml_enriched: false,
            notes: self.notes,
        };
        topo.assign_labels();
        // Worded after labelling so the note names the GPU as every other view does.
        let mut quirk = self.self_targets;
        quirk.dedup();
        for bdf in quirk {
            let label = topo
                .by_bdf(bdf)
                .map_or_else(|| bdf.to_string(), |d| format!("{} ({bdf})", d.label));
            topo.notes.push(format!(
                "{label}: <nvlink target> is its own bus id (known quirk of Azure NC A100 v4 \
                 files); NVLink peer unknown"
            ));
        }
        topo
    }
}

/// The first 64 items joined by commas, then how many more: a note stays readable (and
/// small) whatever the file holds.
fn some_of(items: impl Iterator<Item = String>) -> String {
    const SHOWN: usize = 64;
    let mut shown = Vec::new();
    let mut more = 0usize;
    for i in items {
        if shown.len() < SHOWN {
            shown.push(i);
        } else {
            more += 1;
        }
    }
    let mut s = shown.join(", ");
    if more > 0 {
        s.push_str(&format!(" and {more} more"));
    }
    s
}
