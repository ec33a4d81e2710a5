//! Names for devices that have no better one: a NIC with no RDMA device and no netdev is
//! shown by its vendor ("Red Hat virtio NIC (1af4:1041)"), never as bare ids a reader has to
//! look up.

/// PCI vendors of network controllers met in servers and clouds.
const NIC_VENDORS: &[(u16, &str)] = &[
    (0x15b3, "Mellanox/NVIDIA"),
    (0x10de, "NVIDIA"),
    (0x8086, "Intel"),
    (0x14e4, "Broadcom"),
    (0x1af4, "Red Hat virtio"),
    (0x1d0f, "Amazon"),
    (0x1414, "Microsoft"),
    (0x1ae0, "Google"),
    (0x1077, "QLogic"),
    (0x1924, "Solarflare"),
    (0x19ee, "Netronome"),
    (0x1dd8, "AMD Pensando"),
    (0x1022, "AMD"),
    (0x1137, "Cisco"),
    (0x177d, "Cavium"),
    (0x10ec, "Realtek"),
    (0x1fc1, "QLogic InfiniPath"),
    (0x8088, "Wangxun"),
    (0x19e5, "Huawei"),
    (0x1bd4, "Inspur"),
    (0x15ad, "VMware"),
];

/// A PCI vendor's name, when gdx knows it.
pub fn vendor_name(vendor: u16) -> Option<&'static str> {
    NIC_VENDORS
        .iter()
        .find(|(v, _)| *v == vendor)
        .map(|(_, n)| *n)
}

/// The fallback name of a NIC: vendor name and ids (`Red Hat virtio NIC (1af4:1041)`), or the
/// class in words when even the vendor is unknown; `None` when nothing is known.
pub fn nic_name(vendor: Option<u16>, device: Option<u16>, class: Option<u32>) -> Option<String> {
    let ids = match (vendor, device) {
        (Some(v), Some(d)) => Some(format!("{v:04x}:{d:04x}")),
        (Some(v), None) => Some(format!("{v:04x}")),
        _ => None,
    };
    let kind = match class.map(|c| c >> 8) {
        Some(0x0207) => "InfiniBand controller",
        Some(0x0200) => "Ethernet NIC",
        _ => "NIC",
    };
    match (vendor.and_then(vendor_name), ids) {
        (Some(name), Some(ids)) => Some(format!("{name} {kind} ({ids})")),
        (None, Some(ids)) => Some(format!("{kind} of unknown vendor ({ids})")),
        (_, None) if class.is_some() => Some(kind.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_never_bare_ids() {
        assert_eq!(
            nic_name(Some(0x1af4), Some(0x1041), Some(0x020000)).as_deref(),
            Some("Red Hat virtio Ethernet NIC (1af4:1041)")
        );
        assert_eq!(
            nic_name(Some(0xabcd), Some(0x1), None).as_deref(),
            Some("NIC of unknown vendor (abcd:0001)")
        );
        assert_eq!(
            nic_name(None, None, Some(0x020700)).as_deref(),
            Some("InfiniBand controller")
        );
        assert_eq!(nic_name(None, None, None), None);
    }
}
