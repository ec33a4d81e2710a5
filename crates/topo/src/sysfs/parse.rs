//! Parsers for the text the kernel writes in sysfs/proc files. Each returns `None` for text it
//! does not understand, so the caller can note the file and carry on.

use crate::model::PciAddr;

/// `0x030200` (or `030200`) → 0x030200.
pub(crate) fn hex_u32(s: &str) -> Option<u32> {
    let t = s.trim();
    let t = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    if t.is_empty() || t.len() > 8 {
        return None;
    }
    u32::from_str_radix(t, 16).ok()
}

/// `0x10de` → 0x10de.
pub(crate) fn hex_u16(s: &str) -> Option<u16> {
    hex_u32(s).and_then(|v| u16::try_from(v).ok())
}

/// `numa_node`: `-1` means the platform does not say. Outer `None`: not a number.
pub(crate) fn numa(s: &str) -> Option<Option<u32>> {
    let v: i64 = s.trim().parse().ok()?;
    if v < 0 {
        Some(None)
    } else {
        u32::try_from(v).ok().map(Some)
    }
}

/// `current_link_speed`: `16.0 GT/s PCIe`, `2.5 GT/s`, `8 GT/s`, or `Unknown` (→ `Some(None)`).
/// Outer `None`: text we do not understand.
pub(crate) fn link_speed(s: &str) -> Option<Option<f64>> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("unknown") {
        return Some(None);
    }
    let mut it = t.split_whitespace();
    let num: f64 = it.next()?.parse().ok()?;
    match it.next() {
        Some(u) if u.eq_ignore_ascii_case("GT/s") => {}
        _ => return None,
    }
    (num.is_finite() && num >= 0.0).then_some(Some(num))
}

/// `current_link_width`: a decimal lane count (`16`; virtual bridges may say `0`).
pub(crate) fn link_width(s: &str) -> Option<u32> {
    s.trim().parse().ok()
}

/// RDMA port `rate`: `400 Gb/sec (4X NDR)` → 400.0.
pub(crate) fn ib_rate_gbps(s: &str) -> Option<f64> {
    let mut it = s.split_whitespace();
    let num: f64 = it.next()?.parse().ok()?;
    let unit = it.next()?;
    (unit.starts_with("Gb/s") && num.is_finite() && num >= 0.0).then_some(num)
}

/// Net `speed` in Mb/s; `-1` (link down / unknown) → `Some(None)`. Outer `None`: garbage.
pub(crate) fn net_speed(s: &str) -> Option<Option<u64>> {
    let v: i64 = s.trim().parse().ok()?;
    Some(u64::try_from(v).ok().filter(|&x| x > 0))
}

/// True for a sysfs host-bridge folder name: `pci0000:00`, `pci10000:e0` (VMD domains).
pub(crate) fn is_host_bridge_name(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("pci") else {
        return false;
    };
    let Some((dom, bus)) = rest.split_once(':') else {
        return false;
    };
    let hex = |x: &str| x.chars().all(|c| c.is_ascii_hexdigit());
    (4..=8).contains(&dom.len()) && bus.len() == 2 && hex(dom) && hex(bus)
}

/// A folder name that is a PCI function address (`0000:3b:00.0`); sysfs never pads it
/// differently, but the parser also accepts upper case.
pub(crate) fn pci_name(s: &str) -> Option<PciAddr> {
    // Cheap shape check first: `parse` would also accept odd widths.
    if s.len() < 12 || s.matches(':').count() != 2 || !s.contains('.') {
        return None;
    }
    s.parse().ok()
}

/// True when a GID is all zeros (an unused table slot).
pub(crate) fn gid_is_zero(gid: &str) -> bool {
    gid.chars().all(|c| c == '0' || c == ':')
}

/// `Model:` line of `/proc/driver/nvidia/gpus/<bdf>/information`.
pub(crate) fn nvidia_model(info: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.trim_start().strip_prefix("Model:"))
        .map(|m| m.trim().to_string())
        .filter(|m| !m.is_empty())
}

/// `node12` → 12.
pub(crate) fn node_id(name: &str) -> Option<u32> {
    let n = name.strip_prefix("node")?;
    if n.is_empty() || !n.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_and_numa() {
        assert_eq!(hex_u32("0x030200\n"), Some(0x030200));
        assert_eq!(hex_u32("0xzz"), None);
        assert_eq!(hex_u32(""), None);
        assert_eq!(hex_u16("0x10de"), Some(0x10de));
        assert_eq!(hex_u16("0x110de"), None);
        assert_eq!(numa("-1"), Some(None));
        assert_eq!(numa("3\n"), Some(Some(3)));
        assert_eq!(numa("x"), None);
    }

    #[test]
    fn link_figures() {
        assert_eq!(link_speed("16.0 GT/s PCIe"), Some(Some(16.0)));
        assert_eq!(link_speed("2.5 GT/s"), Some(Some(2.5)));
        assert_eq!(link_speed("8 GT/s"), Some(Some(8.0)));
        assert_eq!(link_speed("Unknown"), Some(None));
        assert_eq!(link_speed("fast"), None);
        assert_eq!(link_speed("16.0 Mb/s"), None);
        assert_eq!(link_width("16\n"), Some(16));
        assert_eq!(link_width("x16"), None);
    }

    #[test]
    fn rates_and_speeds() {
        assert_eq!(ib_rate_gbps("400 Gb/sec (4X NDR)"), Some(400.0));
        assert_eq!(ib_rate_gbps("2.5 Gb/sec (1X SDR)"), Some(2.5));
        assert_eq!(ib_rate_gbps("fast"), None);
        assert_eq!(net_speed("-1"), Some(None));
        assert_eq!(net_speed("100000"), Some(Some(100_000)));
        assert_eq!(net_speed("?"), None);
    }

    #[test]
    fn names() {
        assert!(is_host_bridge_name("pci0000:00"));
        assert!(is_host_bridge_name("pci10000:e0"));
        assert!(!is_host_bridge_name("pci_bus"));
        assert!(!is_host_bridge_name("0000:00:01.0"));
        assert_eq!(
            pci_name("0000:3b:00.1").map(|a| a.to_string()),
            Some("0000:3b:00.1".into())
        );
        assert_eq!(pci_name("virtio2"), None);
        assert_eq!(pci_name("pci0000:00"), None);
        assert!(gid_is_zero("0000:0000:0000:0000:0000:0000:0000:0000"));
        assert!(!gid_is_zero("fe80:0000:0000:0000:0000:0000:0000:0001"));
        assert_eq!(
            nvidia_model("Model: \t\t NVIDIA H200\nIRQ: 1\n").as_deref(),
            Some("NVIDIA H200")
        );
        assert_eq!(node_id("node12"), Some(12));
        assert_eq!(node_id("node"), None);
        assert_eq!(node_id("nodes"), None);
    }
}
