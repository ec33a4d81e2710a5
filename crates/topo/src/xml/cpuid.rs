//! The CPU identity NCCL wants on every `<cpu>` element it does not fill itself.
//!
//! NCCL fills `arch`, `vendor`, `familyid` and `modelid` only on the CPUs it reaches while
//! filling in its own GPU and NICs; any other CPU left in the file must carry them or NCCL
//! stops with "Attribute arch of node cpu not found". That happens on ordinary VMs: a
//! virtio NIC has no PCI path, NCCL attaches it to the first `<cpu>` of the file, and that
//! CPU need not be the GPU's. The model does not record CPU identity, so it is read from the
//! machine the model describes (a captured root's `proc/cpuinfo`) or the one gdx runs on.

use crate::model::{Source, Topology};
use std::path::Path;

/// What NCCL records about the CPUs of a machine: `<cpu arch vendor familyid modelid>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuIdentity {
    /// NCCL's architecture name: `x86_64`, `arm64` or `ppc64`.
    pub arch: String,
    /// x86 vendor string (`GenuineIntel`, `AuthenticAMD`), when known.
    pub vendor: Option<String>,
    /// x86 family number (`cpu family` in `/proc/cpuinfo`), when known.
    pub family: Option<u32>,
    /// x86 model number (`model` in `/proc/cpuinfo`), when known.
    pub model: Option<u32>,
}

impl CpuIdentity {
    /// Identity from the text of `/proc/cpuinfo`; the architecture is told by the fields
    /// each one has (`vendor_id` on x86, `CPU implementer` on Arm, `POWER` on Power).
    pub fn from_cpuinfo(cpuinfo: &str) -> Option<CpuIdentity> {
        Self::parse(cpuinfo, None)
    }

    /// The CPU this process runs on (Linux `/proc/cpuinfo`, and the build target for the
    /// architecture when the text does not tell it).
    pub fn this_machine() -> Option<CpuIdentity> {
        let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let arch = match std::env::consts::ARCH {
            "x86_64" => Some("x86_64"),
            "aarch64" => Some("arm64"),
            "powerpc64" => Some("ppc64"),
            _ => None,
        };
        Self::parse(&text, arch)
    }

    /// The CPU of the machine a model describes: a captured root's `proc/cpuinfo` when the
    /// model was read from one that holds it, else [`CpuIdentity::this_machine`] (an NCCL
    /// file's own `<cpu>` identity is not kept in the model).
    pub fn for_topology(topo: &Topology) -> Option<CpuIdentity> {
        if let Source::Sysfs(root) = &topo.source {
            let path = Path::new(root).join("proc/cpuinfo");
            if let Some(id) = std::fs::read_to_string(path)
                .ok()
                .and_then(|t| Self::from_cpuinfo(&t))
            {
                return Some(id);
            }
        }
        Self::this_machine()
    }

    fn parse(text: &str, fallback_arch: Option<&str>) -> Option<CpuIdentity> {
        let field = |key: &str| {
            text.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == key).then(|| v.trim().to_string())
            })
        };
        let vendor = field("vendor_id").filter(|v| !v.is_empty());
        let arch = if vendor.is_some() {
            "x86_64"
        } else if field("CPU implementer").is_some() {
            "arm64"
        } else if field("cpu").is_some_and(|c| c.contains("POWER")) {
            "ppc64"
        } else {
            fallback_arch?
        };
        let number = |key: &str| field(key).and_then(|v| v.parse::<u32>().ok());
        let x86 = arch == "x86_64";
        Some(CpuIdentity {
            arch: arch.to_string(),
            vendor: vendor.filter(|_| x86),
            family: number("cpu family").filter(|_| x86),
            model: number("model").filter(|_| x86),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cpuinfo_of_each_architecture() {
        let intel = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\nmodel name\t: Intel(R) Xeon(R) Platinum 8480C\n";
        assert_eq!(
            CpuIdentity::from_cpuinfo(intel),
            Some(CpuIdentity {
                arch: "x86_64".into(),
                vendor: Some("GenuineIntel".into()),
                family: Some(6),
                model: Some(143),
            })
        );
        let arm =
            "processor\t: 0\nBogoMIPS\t: 2000.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd4f\n";
        let id = CpuIdentity::from_cpuinfo(arm).unwrap();
        assert_eq!(
            (id.arch.as_str(), id.vendor, id.model),
            ("arm64", None, None)
        );
        let power = "processor\t: 0\ncpu\t\t: POWER9, altivec supported\n";
        assert_eq!(CpuIdentity::from_cpuinfo(power).unwrap().arch, "ppc64");
        assert_eq!(CpuIdentity::from_cpuinfo(""), None);
        assert_eq!(CpuIdentity::parse("", Some("arm64")).unwrap().arch, "arm64");
    }
}
