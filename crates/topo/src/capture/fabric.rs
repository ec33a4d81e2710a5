//! The capture's part for NVMe over Fabrics and RoCE QoS: the fabric controllers
//! (`sys/class/nvme/*` attributes and their namespace folders), the subsystems with their
//! controller links and namespaces, the block-device numbers (`sys/dev/block`), the IPv4 routes
//! (`proc/net/route`), nvme_core's `multipath`; and what is not in sysfs at all, recorded when
//! capturing the live machine: each netdev's DCB state (`gdx/dcb/<netdev>.json`, from netlink)
//! and the RDMA CM ids (`gdx/rdma-cm-id.json`, `rdma -j res show cm_id`). A capture of a
//! capture copies those two as they are.

use super::Copier;
use crate::{dcb, nvmeof, TopoError};
use std::path::Path;

/// Controller attributes `gdx_topo::nvmeof` reads.
const NVME_ATTRS: &[&str] = &[
    "transport",
    "address",
    "state",
    "subsysnqn",
    "ctrl_loss_tmo",
    "fast_io_fail_tmo",
    "reconnect_delay",
    "kato",
];

fn nvme_entry(name: &str) -> bool {
    name.strip_prefix("nvme")
        .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
}

impl Copier<'_> {
    pub(super) fn fabric(&mut self, live: bool) -> Result<(), TopoError> {
        for (_, real) in self.members(Path::new("sys/class/nvme"))? {
            let transport = self
                .fs
                .read_text(real.join("transport"))
                .unwrap_or_default();
            if transport.trim() == "pcie" {
                continue;
            }
            for a in NVME_ATTRS {
                self.copy_in(&real, a)?;
            }
            for e in self.list(&real) {
                if nvme_entry(&e) {
                    self.mkdir(&real.join(e))?;
                }
            }
        }
        for (_, real) in self.members(Path::new("sys/class/nvme-subsystem"))? {
            self.copy_in(&real, "iopolicy")?;
            self.copy_in(&real, "subsysnqn")?;
            for e in self.list(&real) {
                if !nvme_entry(&e) {
                    continue;
                }
                let at = real.join(&e);
                self.mirror_link(&at)?;
                self.copy_in(&at, "dev")?;
            }
        }
        for name in self.list(Path::new("sys/dev/block")) {
            let at = Path::new("sys/dev/block").join(name);
            let to_nvme = self
                .fs
                .resolve(&at)
                .is_some_and(|r| r.to_string_lossy().contains("nvme"));
            if to_nvme {
                self.mirror_link(&at)?;
                self.copy_in(&at, "partition")?;
            }
        }
        self.copy(Path::new("proc/net/route"), Path::new("proc/net/route"))?;
        let mp = Path::new("sys/module/nvme_core/parameters/multipath");
        self.copy(mp, mp)?;
        if live {
            for n in self.list(Path::new("sys/class/net")) {
                if n == "lo" {
                    continue;
                }
                let text = serde_json::to_string(&dcb::capture_live(&n)).unwrap_or_default();
                self.write(Path::new(&dcb::capture_path(&n)), text.as_bytes())?;
            }
            if let Some(t) = nvmeof::capture_cm_ids() {
                self.write(Path::new(nvmeof::CM_ID_PATH), t.as_bytes())?;
            }
        } else {
            for n in self.list(Path::new("gdx/dcb")) {
                let p = Path::new("gdx/dcb").join(n);
                self.copy(&p, &p)?;
            }
            let cm = Path::new(nvmeof::CM_ID_PATH);
            self.copy(cm, cm)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::fixture::{NvmeofCtrl, RdmaPort, SysfsFixture};
    use crate::nvmeof::{controllers, CM_ID_PATH};
    use crate::sysfs::RootFs;

    /// A capture of the NVMe-oF fixture gives the same controllers, carrier included.
    #[test]
    fn a_capture_keeps_the_fabric_controllers() {
        let src = tempfile::tempdir().unwrap();
        let mut f = SysfsFixture::new(src.path());
        let rp = f.root_port("0000:00", "0000:00:01.0", Some(0));
        f.gpu(&rp, "0000:01:00.0");
        f.virtual_netdev("eth0");
        f.software_rdma(
            "rxe0",
            "eth0",
            &[RdmaPort::roce(1, "eth0", [198, 51, 100, 1])],
        );
        f.nvmeof_controller(&NvmeofCtrl::rdma("198.51.100.2"));
        f.ipv4_routes(&[("eth0", [198, 51, 100, 0], 24)]);
        f.file(
            CM_ID_PATH,
            r#"[{"ifname":"rxe0","port":1,"comm":"nvme_rdma","dst-addr":"198.51.100.2:4420"}]"#,
        );
        f.file("gdx/dcb/eth0.json", "\"not_supported\"");
        let out = tempfile::tempdir().unwrap();
        let dst = out.path().join("cap");
        crate::capture(src.path(), &dst).unwrap();
        let before = controllers(&RootFs::new(src.path()));
        let after = controllers(&RootFs::new(&dst));
        assert_eq!(after.len(), 1, "{after:#?}");
        assert_eq!(after[0].namespaces, before[0].namespaces);
        assert_eq!(after[0].ctrl_loss_tmo, before[0].ctrl_loss_tmo);
        assert_eq!(after[0].carrier.rdma_device.as_deref(), Some("rxe0"));
        assert_eq!(after[0].carrier.netdev.as_deref(), Some("eth0"));
        assert_eq!(
            crate::nvmeof::disk_of(&RootFs::new(&dst), 259, 0).as_deref(),
            Some("nvme0n1")
        );
        assert!(dst.join("gdx/dcb/eth0.json").exists());
    }
}
