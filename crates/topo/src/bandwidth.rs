//! The one bandwidth model of gdx: what a PCIe link or an NVLink carries in one direction, in
//! GB/s (1e9 bytes per second), after line encoding and before protocol overhead. doctor's
//! ceilings, bench's ceilings, storage's copy ceiling and nccl's bus-bandwidth check all take
//! their figures from here, so one machine gets one answer.
//!
//! PCIe per lane: the transfer rate (GT/s) times the encoding's payload share, over 8 bits:
//!
//! | gen | GT/s | encoding | GB/s per lane | x16 |
//! |---|---|---|---|---|
//! | 1 | 2.5 | 8b/10b | 0.25 | 4.0 |
//! | 2 | 5 | 8b/10b | 0.5 | 8.0 |
//! | 3 | 8 | 128b/130b | 0.985 | 15.75 |
//! | 4 | 16 | 128b/130b | 1.969 | 31.51 |
//! | 5 | 32 | 128b/130b | 3.938 | 63.02 |
//! | 6 | 64 | FLIT (PAM4): 242 of every 256 bytes carry data (the rest is FEC and CRC) | 7.563 | 121.0 |
//!
//! NVLink per link, as nvidia-smi reports it: NVLink 2 (Volta) and 3 (Ampere) 25 GB/s,
//! NVLink 4 (Hopper) 26.5625 GB/s, NVLink 5 (Blackwell) twice that.

/// The PCIe generation (1..=6) of a lane rate in GT/s, if the rate is a known one.
pub fn pcie_generation(gts: f64) -> Option<u32> {
    [
        (2.5, 1),
        (5.0, 2),
        (8.0, 3),
        (16.0, 4),
        (32.0, 5),
        (64.0, 6),
    ]
    .iter()
    .find(|(r, _)| (gts - r).abs() < 0.05)
    .map(|&(_, g)| g)
}

/// The payload share of a lane's raw bits at `gts`: 8b/10b up to 5 GT/s (Gen1/2), 128b/130b
/// up to 32 GT/s (Gen3 to 5), FLIT mode's 242/256 from 64 GT/s (Gen6).
pub fn pcie_encoding(gts: f64) -> f64 {
    if gts <= 5.0 {
        8.0 / 10.0
    } else if gts < 64.0 {
        128.0 / 130.0
    } else {
        242.0 / 256.0
    }
}

/// One-direction GB/s of a PCIe link of `width` lanes at `gts` GT/s per lane.
pub fn pcie_gbps(gts: f64, width: u32) -> f64 {
    gts * pcie_encoding(gts) / 8.0 * f64::from(width)
}

/// The NVLink generation of a GPU of compute capability `cc` (`"9.0"`): 2 for Volta (7.x),
/// 3 for Ampere and Ada (8.x), 4 for Hopper (9.x), 5 for Blackwell (10.x, 12.x).
pub fn nvlink_generation(cc: &str) -> Option<u32> {
    match cc.split('.').next()? {
        "7" => Some(2),
        "8" => Some(3),
        "9" => Some(4),
        "10" | "12" => Some(5),
        _ => None,
    }
}

/// One-direction GB/s of one NVLink of generation `gen` (nvidia-smi's per-link figure).
pub fn nvlink_link_gbps(gen: u32) -> Option<f64> {
    match gen {
        2 | 3 => Some(25.0),
        4 => Some(26.5625),
        5 => Some(53.125),
        _ => None,
    }
}

/// One-direction GB/s of one NVLink for a GPU of compute capability `cc`, and whether it is
/// a guess (no or an unknown capability: NVLink 4's figure is assumed).
pub fn nvlink_gbps_per_link(cc: Option<&str>) -> (f64, bool) {
    match cc.and_then(nvlink_generation).and_then(nvlink_link_gbps) {
        Some(g) => (g, false),
        None => (26.5625, true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-3
    }

    #[test]
    fn gen1_is_8b10b() {
        assert_eq!(pcie_generation(2.5), Some(1));
        assert!(close(pcie_gbps(2.5, 1), 0.25));
        assert!(close(pcie_gbps(2.5, 16), 4.0));
    }

    #[test]
    fn gen2_is_8b10b() {
        assert_eq!(pcie_generation(5.0), Some(2));
        assert!(close(pcie_gbps(5.0, 16), 8.0));
    }

    #[test]
    fn gen3_is_128b130b() {
        assert_eq!(pcie_generation(8.0), Some(3));
        assert!(close(pcie_gbps(8.0, 16), 15.754));
    }

    #[test]
    fn gen4_is_128b130b() {
        assert_eq!(pcie_generation(16.0), Some(4));
        assert!(close(pcie_gbps(16.0, 16), 31.508));
    }

    #[test]
    fn gen5_is_128b130b() {
        assert_eq!(pcie_generation(32.0), Some(5));
        assert!(close(pcie_gbps(32.0, 16), 63.015));
    }

    #[test]
    fn gen6_is_flit_242_of_256() {
        assert_eq!(pcie_generation(64.0), Some(6));
        assert!(close(pcie_gbps(64.0, 1), 7.5625));
        assert!(close(pcie_gbps(64.0, 16), 121.0));
        // Not 128b/130b: that would claim 126 GB/s.
        assert!(pcie_gbps(64.0, 16) < 64.0 * 16.0 * 128.0 / 130.0 / 8.0 - 4.0);
    }

    #[test]
    fn unknown_rates_have_no_generation_but_a_figure() {
        assert_eq!(pcie_generation(20.0), None);
        assert!(close(pcie_gbps(20.0, 1), 20.0 * 128.0 / 130.0 / 8.0));
    }

    #[test]
    fn nvlink_per_link_by_generation() {
        assert_eq!(nvlink_gbps_per_link(Some("7.0")), (25.0, false)); // NVLink 2
        assert_eq!(nvlink_gbps_per_link(Some("8.0")), (25.0, false)); // NVLink 3
        assert_eq!(nvlink_gbps_per_link(Some("9.0")), (26.5625, false)); // NVLink 4
        assert_eq!(nvlink_gbps_per_link(Some("10.0")), (53.125, false)); // NVLink 5
        assert_eq!(nvlink_generation("12.0"), Some(5));
        assert_eq!(nvlink_gbps_per_link(None), (26.5625, true));
        assert_eq!(nvlink_gbps_per_link(Some("6.0")), (26.5625, true));
        assert_eq!(nvlink_link_gbps(1), None);
    }
}
