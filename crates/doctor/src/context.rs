//! What every check sees: the root it reads files from, the topology, the environment (an
//! injected map, so tests control `NCCL_*`), the live library facts (absent for a captured
//! root), and the probe results. Built once per run; checks only read it.
//!
//! GPUs are the NVIDIA display/3D controllers of the PCI tree; their labels come from the
//! topology when it has them (so `GPU0` means the same in `gdx topo` and `gdx doctor`), else
//! from bus order. RDMA devices come from `sys/class/infiniband`.

use crate::facts::Gathered;
use crate::probe::ProbeState;
use crate::DoctorError;
use gdx_topo::ceiling::{self, Ceiling};
use gdx_topo::sysfs::devices::{self as pci, PciFn, RdmaDev};
use gdx_topo::sysfs::RootFs;
use gdx_topo::{Device, PathClass, PciAddr, Topology};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// A GPU as the checks name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuRef {
    /// `GPU0`.
    pub label: String,
    /// PCI address.
    pub bdf: PciAddr,
}

/// The checks' view of the machine. See the module docs.
#[derive(Debug)]
pub struct Context {
    /// Files under the root.
    pub fs: RootFs,
    env: BTreeMap<String, String>,
    topo: Result<Topology, DoctorError>,
    live: Result<Gathered, DoctorError>,
    probes: ProbeState,
    fabric_probe: crate::probe_fabric::FabricProbeState,
    rdma_probe: crate::probe_rdma::RdmaProbeState,
    pci: Result<Vec<PciFn>, DoctorError>,
    gpus: Vec<GpuRef>,
    rdma: Vec<RdmaDev>,
    nic_labels: BTreeMap<String, String>,
    env_origin: String,
}

impl Context {
    /// Build the context. `topo` is `Err(why)` when no topology could be built; `live` is
    /// `Err(why)` when live facts are not consulted (captured root, no source).
    pub fn new(
        root: impl Into<PathBuf>,
        env: BTreeMap<String, String>,
        topo: Result<Topology, DoctorError>,
        live: Result<Gathered, DoctorError>,
    ) -> Self {
        Context::with_fs(RootFs::new(root.into()), env, topo, live)
    }

    /// [`Context::new`] over a prepared [`RootFs`] (one that shows its paths as
    /// `capture:...`, for an unpacked archive).
    pub fn with_fs(
        fs: RootFs,
        env: BTreeMap<String, String>,
        topo: Result<Topology, DoctorError>,
        live: Result<Gathered, DoctorError>,
    ) -> Self {
        let pci = pci::scan(&fs).map_err(DoctorError::File);
        let rdma = pci::rdma_devices(&fs);
        let mut ctx = Context {
            fs,
            env,
            topo,
            live,
            probes: ProbeState::NotRun("probes not requested".into()),
            fabric_probe: crate::probe_fabric::FabricProbeState::NotRun(
                "probes not requested".into(),
            ),
            rdma_probe: crate::probe_rdma::RdmaProbeState::NotRun("probes not requested".into()),
            pci,
            gpus: Vec::new(),
            rdma,
            nic_labels: BTreeMap::new(),
            env_origin: "environment".into(),
        };
        ctx.gpus = ctx.find_gpus();
        ctx.nic_labels = ctx.find_nic_labels();
        ctx
    }

    fn find_gpus(&self) -> Vec<GpuRef> {
        let bdfs: Vec<PciAddr> = match (&self.pci, &self.topo) {
            (Ok(fns), _) => fns
                .iter()
                .filter(|f| f.is_nvidia_gpu())
                .map(|f| f.bdf)
                .collect(),
            // No PCI tree to read: trust the topology's GPUs (NVIDIA or of unknown vendor).
            (Err(_), Ok(t)) => t
                .gpus()
                .filter(|d| d.vendor.is_none_or(|v| v == pci::VENDOR_NVIDIA))
                .filter_map(|d| d.bdf)
                .collect(),
            (Err(_), Err(_)) => Vec::new(),
        };
        let mut gpus: Vec<GpuRef> = bdfs
            .iter()
            .enumerate()
            .map(|(i, &bdf)| GpuRef {
                label: self
                    .topo_device(bdf)
                    .map(|d| d.label.clone())
                    .unwrap_or_else(|| format!("GPU{i}")),
                bdf,
            })
            .collect();
        gpus.sort_by(|a, b| gdx_topo::natural_cmp(&a.label, &b.label));
        gpus
    }

    fn find_nic_labels(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for (i, d) in self.rdma.iter().enumerate() {
            let label = match (&self.topo, d.bdf) {
                (Ok(_), Some(bdf)) => self.topo_device(bdf).map(|t| t.label.clone()),
                _ => None,
            };
            let label = match (&self.topo, label) {
                (_, Some(l)) => l,
                // Same rule as the topology's own labels: RDMA name order.
                (Err(_), None) => format!("NIC{i}"),
                (Ok(_), None) => d.name.clone(),
            };
            out.insert(d.name.clone(), label);
        }
        out
    }

    /// Replace the fabric probe's state (the runner sets it after probing).
    pub fn set_fabric_probe(&mut self, p: crate::probe_fabric::FabricProbeState) {
        self.fabric_probe = p;
    }

    /// The fabric probe's state.
    pub fn fabric_probe(&self) -> &crate::probe_fabric::FabricProbeState {
        &self.fabric_probe
    }

    /// Record the verbs probe's result.
    pub fn set_rdma_probe(&mut self, p: crate::probe_rdma::RdmaProbeState) {
        self.rdma_probe = p;
    }

    /// The verbs probe's result.
    pub fn rdma_probe(&self) -> &crate::probe_rdma::RdmaProbeState {
        &self.rdma_probe
    }

    /// Replace the probe state (the runner sets it after probing).
    pub fn set_probes(&mut self, p: ProbeState) {
        self.probes = p;
    }

    /// An environment variable from the injected environment.
    pub fn env(&self, name: &str) -> Option<&str> {
        self.env.get(name).map(String::as_str)
    }

    /// The whole injected environment.
    pub fn env_all(&self) -> &BTreeMap<String, String> {
        &self.env
    }

    /// Where the environment came from, as evidence names it: `environment` (the shell doctor
    /// runs in) or `capture:gdx/env.json` (what the captured machine's shell had).
    pub fn env_origin(&self) -> &str {
        &self.env_origin
    }

    /// Say where the environment came from (see [`Context::env_origin`]).
    pub fn set_env_origin(&mut self, origin: impl Into<String>) {
        self.env_origin = origin.into();
    }

    /// The topology, or why there is none.
    pub fn topology(&self) -> Result<&Topology, &DoctorError> {
        self.topo.as_ref()
    }

    /// The topology as sysfs under the root shows it, for checks that need what only sysfs
    /// holds (RDMA ports' GID tables): the context's own when it was read from sysfs, else
    /// one read from the root now (the context's came from NCCL XML, or there is none).
    ///
    /// # Errors
    /// Why no topology could be read from the root.
    pub fn sysfs_topology(&self) -> Result<Cow<'_, Topology>, DoctorError> {
        match &self.topo {
            Ok(t) if matches!(t.source, gdx_topo::Source::Sysfs(_)) => Ok(Cow::Borrowed(t)),
            _ => gdx_topo::from_root(self.fs.root())
                .map(Cow::Owned)
                .map_err(DoctorError::Topology),
        }
    }

    /// Live facts, or why they are not consulted.
    pub fn live(&self) -> Result<&Gathered, &DoctorError> {
        self.live.as_ref()
    }

    /// Probe results.
    pub fn probes(&self) -> &ProbeState {
        &self.probes
    }

    /// PCI functions, or why the PCI tree could not be read.
    pub fn pci(&self) -> Result<&[PciFn], &DoctorError> {
        self.pci.as_deref()
    }

    /// NVIDIA GPUs in label order.
    pub fn gpus(&self) -> &[GpuRef] {
        &self.gpus
    }

    /// RDMA devices.
    pub fn rdma(&self) -> &[RdmaDev] {
        &self.rdma
    }

    /// Why there is no GPU to check, for skip reasons.
    pub fn no_gpu_reason(&self) -> String {
        match &self.pci {
            Ok(_) => "no NVIDIA GPU in the PCI tree".to_string(),
            Err(e) => format!("PCI tree unreadable ({e})"),
        }
    }

    /// `NIC3` for an RDMA device (or its name when the topology does not know it).
    pub fn nic_label(&self, d: &RdmaDev) -> String {
        self.nic_labels
            .get(&d.name)
            .cloned()
            .unwrap_or_else(|| d.name.clone())
    }

    /// The topology device at an address.
    pub fn topo_device(&self, bdf: PciAddr) -> Option<&Device> {
        self.topo.as_ref().ok()?.by_bdf(bdf)
    }

    /// The label for any PCI address: a GPU/NIC label, else the address itself.
    pub fn label(&self, bdf: PciAddr) -> String {
        if let Some(g) = self.gpus.iter().find(|g| g.bdf == bdf) {
            return g.label.clone();
        }
        if let Some(d) = self.rdma.iter().find(|d| d.bdf == Some(bdf)) {
            return self.nic_label(d);
        }
        bdf.to_string()
    }

    /// The CUDA ordinal of a GPU, from live CUDA facts.
    pub fn cuda_ordinal(&self, bdf: PciAddr) -> Option<u32> {
        self.live.as_ref().ok()?.cuda_device(bdf).map(|d| d.ordinal)
    }

    /// The RDMA devices nearest to a GPU by PCIe path class. Without a topology every RDMA
    /// device is returned with `None` as class.
    pub fn nearest_rdma(&self, gpu: &GpuRef) -> Vec<(&RdmaDev, Option<PathClass>)> {
        let (Ok(topo), Some(g)) = (&self.topo, self.topo_device(gpu.bdf)) else {
            return self.rdma.iter().map(|d| (d, None)).collect();
        };
        let classed: Vec<(&RdmaDev, Option<PathClass>)> = self
            .rdma
            .iter()
            .map(|d| {
                let c = d
                    .bdf
                    .and_then(|b| topo.by_bdf(b))
                    .map(|n| topo.pcie_class(g, n));
                (d, c)
            })
            .collect();
        let best = classed
            .iter()
            .filter_map(|(_, c)| c.map(|c| c.rank()))
            .min();
        classed
            .into_iter()
            .filter(|(_, c)| c.map(|c| c.rank()) == best)
            .collect()
    }

    /// The class between a GPU and a device by address, when the topology knows both.
    pub fn class_between(&self, a: PciAddr, b: PciAddr) -> Option<PathClass> {
        let topo = self.topo.as_ref().ok()?;
        Some(topo.path_class(topo.by_bdf(a)?, topo.by_bdf(b)?))
    }

    /// NVLinks between two GPUs when known (topology enriched by NVML or NCCL XML).
    pub fn nvlinks_between(&self, a: PciAddr, b: PciAddr) -> Option<u32> {
        let topo = self.topo.as_ref().ok()?;
        let (da, db) = (topo.by_bdf(a)?, topo.by_bdf(b)?);
        let known = topo.nvml_enriched
            || [da, db]
                .iter()
                .any(|d| d.gpu.as_ref().is_some_and(|g| !g.nvlinks.is_empty()));
        known.then(|| topo.nvlinks_between(da, db))
    }

    /// The one-direction ceiling between two probe endpoints (GPU labels or `host`): topo's
    /// PCIe ceiling of the GPU, or topo's GPU-pair ceiling (NVLinks at NVML's per-link rate
    /// when NVML gives one).
    pub fn ceiling(&self, from: &str, to: &str) -> Option<Ceiling> {
        let topo = self.topo.as_ref().ok()?;
        let gpu = |l: &str| {
            let g = self.gpus.iter().find(|g| g.label == l)?;
            Some((g.bdf, topo.by_bdf(g.bdf)?))
        };
        match (gpu(from), gpu(to)) {
            (Some((_, g)), None) | (None, Some((_, g))) => ceiling::pcie(g),
            (Some((bdf, a)), Some((_, b))) => {
                let measured = self
                    .live
                    .as_ref()
                    .ok()
                    .and_then(|l| l.nvml_device(bdf))
                    .and_then(|d| d.nvlink_gbps_per_link);
                ceiling::gpu_pair(topo, a, b, measured)
            }
            (None, None) => None,
        }
    }
}

/// `GPU0-NIC3`: the subject of a pair.
pub fn pair(a: &str, b: &str) -> String {
    format!("{a}-{b}")
}
