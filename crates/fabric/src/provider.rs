//! Which libfabric providers offer one-sided RMA on RDM endpoints, and which one gdx uses.
//!
//! - Automatic choice prefers real fabrics: efa > verbs > cxi > tcp. `GDX_FABRIC_PROVIDER`
//!   (or [`FabricConfig::provider`]) names one instead; a name that no entry offers is an error,
//!   never a quiet switch to another provider.
//! - The tcp provider is bound to the loopback domain only (node 127.0.0.1 with FI_SOURCE, and
//!   the returned source address checked): gdx's own tcp transport covers real networks, and
//!   the fabric tcp provider exists here to run the RMA logic for real in CI.
//! - shm offers FI_RMA on one host; it is used only when named.

use crate::error::{FabricError, Result};
use gdx_sys::fabric::{bindings as ffi, Entry, Hints, InfoList, Libfabric, OwnedInfo};

/// Automatic order.
pub const PREFERENCE: &[&str] = &["efa", "verbs", "cxi", "tcp"];

/// MR mode bits gdx handles (offered to the provider; it keeps those it needs).
pub(crate) const MR_MODES: i32 = (ffi::FI_MR_LOCAL
    | ffi::FI_MR_VIRT_ADDR
    | ffi::FI_MR_ALLOCATED
    | ffi::FI_MR_PROV_KEY
    | ffi::FI_MR_ENDPOINT) as i32;

/// What gdx asks the provider for.
#[derive(Debug, Clone, Default)]
pub struct FabricConfig {
    /// A provider name (`tcp`, `shm`, `efa`, ...); `None`: `GDX_FABRIC_PROVIDER`, then automatic.
    pub provider: Option<String>,
}

impl FabricConfig {
    /// The configured provider, or `GDX_FABRIC_PROVIDER`.
    pub fn wanted(&self) -> Option<String> {
        self.provider.clone().or_else(|| {
            std::env::var("GDX_FABRIC_PROVIDER")
                .ok()
                .filter(|v| !v.is_empty() && v != "auto")
        })
    }
}

/// One provider entry, as `fi_info` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderInfo {
    /// Provider name as libfabric gives it (`tcp;ofi_rxm`, `efa`, `shm`).
    pub provider: String,
    /// Fabric name (`127.0.0.1/32`, `efa`, `shm`).
    pub fabric: String,
    /// Domain name (`lo`, `rdmap0s6-rdm`).
    pub domain: String,
    /// Whether it offers FI_HMEM (device memory registration).
    pub hmem: bool,
    /// MR mode bits the provider needs, by name.
    pub mr_mode: Vec<&'static str>,
    /// MR key size in bytes.
    pub mr_key_size: usize,
    /// Data progress is manual (someone must poll for remote operations to be served).
    pub manual_progress: bool,
    /// Largest single message.
    pub max_msg_size: usize,
    /// Transmit queue depth.
    pub tx_size: usize,
    /// The source address libfabric chose, printed.
    pub src_addr: String,
}

impl ProviderInfo {
    /// The core provider (`tcp` of `tcp;ofi_rxm`).
    pub fn core(&self) -> &str {
        self.provider.split(';').next().unwrap_or(&self.provider)
    }

    pub(crate) fn from_entry(e: &Entry) -> ProviderInfo {
        let names: [(i32, &'static str); 6] = [
            (ffi::FI_MR_LOCAL as i32, "FI_MR_LOCAL"),
            (ffi::FI_MR_VIRT_ADDR as i32, "FI_MR_VIRT_ADDR"),
            (ffi::FI_MR_ALLOCATED as i32, "FI_MR_ALLOCATED"),
            (ffi::FI_MR_PROV_KEY as i32, "FI_MR_PROV_KEY"),
            (ffi::FI_MR_ENDPOINT as i32, "FI_MR_ENDPOINT"),
            (ffi::FI_MR_HMEM as i32, "FI_MR_HMEM"),
        ];
        ProviderInfo {
            provider: e.provider.clone(),
            fabric: e.fabric.clone(),
            domain: e.domain.clone(),
            hmem: e.caps & ffi::FI_HMEM != 0,
            mr_mode: names
                .iter()
                .filter(|(b, _)| e.mr_mode & b != 0)
                .map(|(_, n)| *n)
                .collect(),
            mr_key_size: e.mr_key_size,
            manual_progress: e.manual_progress,
            max_msg_size: e.max_msg_size,
            tx_size: e.tx_size,
            src_addr: sockaddr_text(e.addr_format, &e.src_addr),
        }
    }
}

/// `127.0.0.1:0`, `[::1]:0`, or the bytes in hex for other formats.
pub(crate) fn sockaddr_text(format: u32, b: &[u8]) -> String {
    if format == ffi::FI_SOCKADDR_IN && b.len() >= 8 {
        let port = u16::from_be_bytes([b[2], b[3]]);
        return format!("{}.{}.{}.{}:{port}", b[4], b[5], b[6], b[7]);
    }
    if format == ffi::FI_SOCKADDR_IN6 && b.len() >= 24 {
        let port = u16::from_be_bytes([b[2], b[3]]);
        let mut a = [0u8; 16];
        a.copy_from_slice(&b[8..24]);
        return format!("[{}]:{port}", std::net::Ipv6Addr::from(a));
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Whether an entry's source address is IPv4 loopback.
fn is_loopback(e: &Entry) -> bool {
    e.addr_format == ffi::FI_SOCKADDR_IN && e.src_addr.len() >= 8 && e.src_addr[4] == 127
}

fn hints(node: Option<&str>) -> Hints {
    Hints {
        caps: (ffi::FI_RMA
            | ffi::FI_READ
            | ffi::FI_WRITE
            | ffi::FI_REMOTE_READ
            | ffi::FI_REMOTE_WRITE) as u64,
        provider: None,
        mr_mode: MR_MODES,
        node: node.map(str::to_string),
    }
}

/// `(provider, fabric, domain)` of the entries that also match with FI_HMEM (and
/// FI_MR_HMEM) asked for. FI_HMEM is a primary capability: a provider reports it only when
/// the hints request it, so the plain FI_RMA listing never shows it (shm lists it only so).
fn hmem_keys(api: &'static Libfabric, node: Option<&str>) -> Vec<(String, String, String)> {
    let mut h = hints(node);
    h.caps |= ffi::FI_HMEM;
    h.mr_mode |= ffi::FI_MR_HMEM as i32;
    // An error (a provider refusing the hints) counts as no entry: nothing claims FI_HMEM.
    InfoList::get(api, &h)
        .map(|l| {
            l.entries()
                .iter()
                .map(|e| (e.provider.clone(), e.fabric.clone(), e.domain.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// Marks `p` as offering FI_HMEM when it is among `keys`.
fn with_hmem(mut p: ProviderInfo, keys: &[(String, String, String)]) -> ProviderInfo {
    p.hmem |= keys
        .iter()
        .any(|(a, b, c)| *a == p.provider && *b == p.fabric && *c == p.domain);
    p
}

/// Every provider entry offering FI_RMA on an RDM endpoint (the listing doctor prints; tcp
/// appears once per interface here, but gdx only ever opens its loopback entry), each with
/// whether it also offers FI_HMEM.
pub fn providers() -> Result<Vec<ProviderInfo>> {
    let api = Libfabric::load()?;
    let list = InfoList::get(api, &hints(None))?;
    let keys = hmem_keys(api, None);
    Ok(list
        .entries()
        .iter()
        .map(|e| with_hmem(ProviderInfo::from_entry(e), &keys))
        .collect())
}

/// The libfabric that was loaded: path and version, or why none.
pub fn library() -> Result<(String, String)> {
    let api = Libfabric::load()?;
    let (maj, min) = api.runtime_version();
    Ok((api.path().to_string(), format!("{maj}.{min}")))
}

/// The provider [`crate::Endpoint::open`] would use with `cfg`, and why, without opening it.
pub fn would_choose(cfg: &FabricConfig) -> Result<(ProviderInfo, String)> {
    let (_, e, why) = choose(cfg)?;
    let api = Libfabric::load()?;
    let node = (e.provider.split(';').next() == Some("tcp")).then_some("127.0.0.1");
    Ok((
        with_hmem(ProviderInfo::from_entry(&e), &hmem_keys(api, node)),
        why,
    ))
}

/// The provider gdx would open, the `fi_info` to open it from, and why it was chosen. When
/// the chosen entry also matches with FI_HMEM asked for, that entry is opened instead, so
/// that GPU memory can be registered with it (`fi_mr_regattr`, FI_HMEM_CUDA); the reason says
/// so.
pub(crate) fn choose(cfg: &FabricConfig) -> Result<(OwnedInfo, Entry, String)> {
    let (info, e, why) = choose_rma(cfg)?;
    let api = Libfabric::load()?;
    match hmem_entry(api, &e) {
        Some((hinfo, he)) => Ok((
            hinfo,
            he,
            format!(
                "{why}; opened with FI_HMEM (GPU memory is registered through FI_HMEM_CUDA; a \
                 libfabric built without CUDA refuses that registration)"
            ),
        )),
        None => Ok((info, e, why)),
    }
}

/// The entry matching `chosen` (provider, fabric, domain, source address) when FI_HMEM and
/// FI_MR_HMEM are asked for as well; `None` when the provider does not offer FI_HMEM there.
fn hmem_entry(api: &'static Libfabric, chosen: &Entry) -> Option<(OwnedInfo, Entry)> {
    let node = is_loopback(chosen).then_some("127.0.0.1");
    let mut h = hints(node);
    h.caps |= ffi::FI_HMEM;
    h.mr_mode |= ffi::FI_MR_HMEM as i32;
    let list = InfoList::get(api, &h).ok()?;
    let entries = list.entries();
    let i = entries.iter().position(|e| {
        e.provider == chosen.provider
            && e.fabric == chosen.fabric
            && e.domain == chosen.domain
            && e.src_addr == chosen.src_addr
            && e.mr_key_size <= 8
            && e.thread_safe
    })?;
    Some((list.take(i).ok()?, entries[i].clone()))
}

fn choose_rma(cfg: &FabricConfig) -> Result<(OwnedInfo, Entry, String)> {
    let api = Libfabric::load()?;
    let wanted = cfg.wanted();
    // Who named it: the caller (`gdx bench --provider`, an agent's config) or the environment.
    let by = if cfg.provider.is_some() {
        "named by the caller"
    } else {
        "named by GDX_FABRIC_PROVIDER"
    };
    let core = |e: &Entry| e.provider.split(';').next().unwrap_or("").to_string();
    let usable = |e: &Entry| e.mr_key_size <= 8 && e.thread_safe;
    // tcp: only its loopback entry, asked for by source address so nothing else is bound.
    let pick_tcp = || -> Result<Option<(OwnedInfo, Entry)>> {
        let list = InfoList::get(api, &hints(Some("127.0.0.1")))?;
        for (i, e) in list.entries().iter().enumerate() {
            if core(e) == "tcp" && is_loopback(e) && usable(e) {
                return Ok(Some((list.take(i)?, e.clone())));
            }
        }
        Ok(None)
    };
    let all = InfoList::get(api, &hints(None))?;
    let entries = all.entries();
    let offered: Vec<String> = {
        let mut v: Vec<String> = Vec::new();
        for c in entries.iter().map(core) {
            if !v.contains(&c) {
                v.push(c);
            }
        }
        v
    };
    if let Some(w) = wanted {
        if w == "tcp" {
            return match pick_tcp()? {
                Some((info, e)) => Ok((info, e, format!("tcp: {by} (loopback domain only)"))),
                None => Err(FabricError::NoProvider {
                    wanted: Some(w.clone()),
                    why: format!(
                        "tcp offers no thread-safe FI_RMA RDM entry on 127.0.0.1 (offered: {})",
                        offered.join(", ")
                    ),
                    offered,
                }),
            };
        }
        for (i, e) in entries.iter().enumerate() {
            if core(e) == w {
                check_usable(e)?;
                return Ok((all.take(i)?, e.clone(), format!("{w}: {by}")));
            }
        }
        return Err(FabricError::NoProvider {
            why: format!(
                "GDX_FABRIC_PROVIDER={w}: no FI_RMA RDM entry from it (offered: {})",
                if offered.is_empty() {
                    "none".into()
                } else {
                    offered.join(", ")
                }
            ),
            wanted: Some(w),
            offered,
        });
    }
    for p in PREFERENCE {
        if *p == "tcp" {
            if let Some((info, e)) = pick_tcp()? {
                let why = format!(
                    "tcp: no efa, verbs or cxi provider offers FI_RMA here (offered: {}); tcp on loopback only",
                    offered.join(", ")
                );
                return Ok((info, e, why));
            }
            continue;
        }
        if let Some(i) = entries.iter().position(|e| core(e) == *p && usable(e)) {
            let e = &entries[i];
            return Ok((
                all.take(i)?,
                e.clone(),
                format!("{p}: first of efa > verbs > cxi > tcp offering FI_RMA"),
            ));
        }
    }
    Err(FabricError::NoProvider {
        wanted: None,
        why: format!(
            "none of efa, verbs, cxi, tcp offers FI_RMA on an RDM endpoint (offered: {})",
            if offered.is_empty() {
                "none".into()
            } else {
                offered.join(", ")
            }
        ),
        offered,
    })
}

fn check_usable(e: &Entry) -> Result<()> {
    if e.mr_key_size > 8 {
        return Err(FabricError::UnsupportedMrMode {
            provider: e.provider.clone(),
            what: format!("{}-byte MR keys (FI_MR_RAW)", e.mr_key_size),
        });
    }
    if !e.thread_safe {
        return Err(FabricError::NoProvider {
            wanted: Some(e.provider.clone()),
            offered: Vec::new(),
            why: format!("{} does not offer FI_THREAD_SAFE", e.provider),
        });
    }
    Ok(())
}
