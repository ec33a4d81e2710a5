//! The network lines: `NET/IB : Using ...`, `NET/Socket : Using ...`, `Using network X`, the
//! no-RDMA reasons, and GPU Direct RDMA per HCA (both the 2.12+ and the older per-GPU wording).

use super::Cx;
use crate::model::{GdrStatus, IbDevice, SocketIf};

impl Cx<'_> {
    /// `NET/IB : Using ...`, `NET/Socket : Using ...`, `Using network X`, no-device lines.
    pub(super) fn net_using(&mut self, m: &str) -> bool {
        if let Some(n) = m.strip_prefix("Using network ") {
            let s = self.seen(n.trim());
            if !self.log.networks.contains(&s) {
                self.log.networks.push(s);
            }
            return true;
        }
        if m.starts_with("NET/IB : No device found") || m.starts_with("Failed to open libibverbs") {
            let s = self.seen(m.trim_end_matches('.'));
            if !self.log.ib_unavailable.contains(&s) {
                self.log.ib_unavailable.push(s);
            }
            return true;
        }
        let Some((net, rest)) = m.split_once(" : Using ") else {
            return false;
        };
        if !net.starts_with("NET/") {
            return false;
        }
        if net == "NET/Socket" {
            self.sockets(rest);
        } else {
            self.ib_list(rest);
        }
        true
    }

    /// `[0]eth0:10.0.0.1<0> [1]ib0:192.168.0.1<0>`.
    pub(super) fn sockets(&mut self, rest: &str) {
        for tok in rest.split_whitespace() {
            let Some((idx, body)) = tok.strip_prefix('[').and_then(|t| t.split_once(']')) else {
                continue;
            };
            let (Ok(index), Some((name, addr))) = (idx.parse::<u32>(), body.split_once(':')) else {
                continue;
            };
            let s = SocketIf {
                index,
                name: name.to_string(),
                addr: addr.to_string(),
                host: self.host.clone(),
            };
            if !self.log.sockets.contains(&s) {
                self.log.sockets.push(s);
            }
        }
    }

    /// `[0]mlx5_0:1/RoCE [1]mlx5_1:1/IB/SHARP [RO]; OOB ...`, and 2.24+'s merged
    /// `[0]={[0] mlx5_2:1/RoCE, [1] mlx5_3:1/RoCE} ...` (the outer index is the NET device).
    pub(super) fn ib_list(&mut self, rest: &str) {
        let (devs, _oob) = rest.split_once("; OOB").unwrap_or((rest, ""));
        let ro = devs.contains("[RO]");
        let mut outer: Option<u32> = None;
        let mut inner_index: Option<u32> = None;
        for tok in devs.split(|c: char| c.is_whitespace() || c == ',') {
            let tok = tok.trim_matches(|c| c == '{' || c == '}');
            if tok.is_empty() || tok == "[RO]" {
                continue;
            }
            // `[0]={[0]` -> an outer (merged) index; `[3]` alone -> the next device's index.
            if let Some(o) = tok.split_once("]=").and_then(|(a, _)| a.strip_prefix('[')) {
                outer = o.parse().ok();
                continue;
            }
            let (idx, body) = match tok.strip_prefix('[').and_then(|t| t.split_once(']')) {
                Some((i, b)) => (i.parse::<u32>().ok(), b),
                None => (None, tok),
            };
            if body.is_empty() {
                inner_index = idx;
                continue;
            }
            let Some((name, portlink)) = body.split_once(':') else {
                continue;
            };
            let mut parts = portlink.split('/');
            let port = parts.next().and_then(|p| p.parse::<u32>().ok());
            let link = parts.next().map(str::to_string);
            let (Some(port), Some(link)) = (port, link) else {
                self.warn(format!("unreadable RDMA device {tok:?} in NET/IB list"));
                continue;
            };
            let index = outer.or(idx).or(inner_index).unwrap_or(0);
            inner_index = None;
            let d = IbDevice {
                index,
                name: name.to_string(),
                port,
                link,
                tags: parts.map(str::to_string).collect(),
                host: self.host.clone(),
                relaxed_ordering: ro,
            };
            if d.tags.iter().any(|t| t == "SHARP") {
                self.log.collnet.sharp_devices = true;
            }
            if !self.log.ib_devices.contains(&d) {
                self.log.ib_devices.push(d);
            }
        }
    }

    /// `NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)` and the pre-2.12
    /// `GPU Direct RDMA Enabled for GPU 86000 / HCA 0 (distance 4 <= 4), read 0`.
    pub(super) fn gdr(&mut self, m: &str) -> bool {
        let Some(at) = m.find("GPU Direct RDMA ") else {
            return false;
        };
        let net = m[..at]
            .trim()
            .trim_end_matches(':')
            .trim()
            .strip_prefix("NET/")
            .unwrap_or("IB")
            .to_string();
        let mut rest = &m[at + "GPU Direct RDMA ".len()..];
        // Tolerate a mechanism before the verdict (`GPU Direct RDMA (DMABUF) Enabled ...`)
        // and either capitalisation.
        let mut mechanism = None;
        if let Some((mech, after)) = rest.strip_prefix('(').and_then(|r| r.split_once(") ")) {
            mechanism = Some(mech.to_string());
            rest = after;
        }
        let verdict = rest
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_ascii_lowercase();
        let enabled = match verdict.as_str() {
            "enabled" => true,
            "disabled" => false,
            _ => return false,
        };
        let gpu_bus_id = rest
            .split_once("for GPU ")
            .and_then(|(_, r)| r.split_whitespace().next())
            .map(str::to_string);
        let hca = rest
            .split_once("HCA ")
            .and_then(|(_, r)| r.split_whitespace().next())
            .and_then(|n| n.parse::<u32>().ok());
        let Some(hca) = hca else {
            self.warn(format!("GPU Direct RDMA line without an HCA number: {m:?}"));
            return true;
        };
        let name = rest
            .split_once('\'')
            .and_then(|(_, r)| r.split_once('\''))
            .map(|(n, _)| n.to_string());
        let reason = rest
            .rfind('(')
            .and_then(|o| rest[o + 1..].split_once(')').map(|(r, _)| r.to_string()))
            .or(mechanism);
        let g = GdrStatus {
            net,
            hca,
            name,
            enabled,
            reason,
            gpu_bus_id,
            host: self.host.clone(),
        };
        if !self.log.gdr.contains(&g) {
            self.log.gdr.push(g);
        }
        true
    }
}
