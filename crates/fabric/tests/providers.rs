//! Provider discovery and choice through the real libfabric (tcp must be present; CI installs
//! libfabric1 through scripts/bootstrap.sh).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_fabric::{Endpoint, FabricConfig, FabricError};

#[test]
fn providers_list_tcp_with_a_loopback_entry() {
    let list = gdx_fabric::providers().expect("libfabric loads");
    assert!(
        list.iter()
            .any(|p| p.core() == "tcp" && p.src_addr.starts_with("127.0.0.1:")),
        "{list:#?}"
    );
    let (path, version) = gdx_fabric::library().expect("library");
    assert!(path.contains("libfabric"), "{path}");
    assert!(version.starts_with("1."), "{version}");
}

#[test]
fn a_named_provider_that_is_absent_is_an_error_naming_what_exists() {
    let cfg = FabricConfig {
        provider: Some("nosuchprov".into()),
    };
    let e = Endpoint::open(&cfg).expect_err("no such provider");
    match e {
        FabricError::NoProvider {
            wanted,
            offered,
            why,
        } => {
            assert!(why.contains("nosuchprov") && why.contains("tcp"), "{why}");
            assert_eq!(wanted.as_deref(), Some("nosuchprov"));
            assert!(offered.iter().any(|p| p == "tcp"), "{offered:?}");
        }
        other => panic!("{other}"),
    }
}

#[test]
fn automatic_choice_says_why_and_binds_tcp_to_loopback() {
    let ep = Endpoint::open(&FabricConfig::default()).expect("open");
    let p = ep.provider();
    if p.core() == "tcp" {
        assert!(p.src_addr.starts_with("127.0.0.1:"), "{p:?}");
        assert!(
            ep.reason().contains("no efa, verbs or cxi"),
            "{}",
            ep.reason()
        );
    } else {
        assert!(ep.reason().contains(p.core()), "{}", ep.reason());
    }
    // The address a peer would insert is the bound loopback socket.
    let a = ep.address().expect("address");
    if p.core() == "tcp" {
        assert_eq!(&a[4..8], &[127, 0, 0, 1], "{a:?}");
    }
}

#[test]
fn a_peer_address_of_the_wrong_length_is_refused() {
    let ep = Endpoint::open(&FabricConfig {
        provider: Some("tcp".into()),
    })
    .expect("open");
    let e = ep.insert_peer(&[1, 2, 3]).expect_err("3-byte address");
    assert!(matches!(e, FabricError::BadAddress { len: 3, .. }), "{e}");
}

/// FI_HMEM is reported only when asked for: every entry `fi_info` lists with FI_HMEM and
/// FI_RMA (libfabric-bin; Debian's shm here) must be marked `hmem` in gdx's listing too.
#[test]
fn hmem_is_asked_for_not_read_from_the_plain_listing() {
    let out = std::process::Command::new("fi_info")
        .args(["-c", "FI_HMEM|FI_RMA", "-t", "FI_EP_RDM"])
        .output()
        .expect("fi_info (libfabric-bin) runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |l: &str, k: &str| l.trim().strip_prefix(k).map(|v| v.trim().to_string());
    let mut listed: Vec<(String, String)> = Vec::new();
    let mut prov = None;
    for l in text.lines() {
        if let Some(p) = field(l, "provider:") {
            prov = Some(p);
        } else if let (Some(d), Some(p)) = (field(l, "domain:"), &prov) {
            listed.push((p.clone(), d));
        }
    }
    // Once in about twenty runs under parallel load, one FI_HMEM query missed an entry fi_info
    // listed (not reproduced since); a listing that never marks it still fails after three.
    let misses = |list: &[gdx_fabric::ProviderInfo]| -> Vec<String> {
        listed
            .iter()
            .filter_map(|(p, d)| {
                let e = list.iter().find(|e| &e.provider == p && &e.domain == d)?;
                (!e.hmem).then(|| format!("{e:?}"))
            })
            .collect()
    };
    let mut list = gdx_fabric::providers().expect("libfabric loads");
    for _ in 0..2 {
        if misses(&list).is_empty() {
            break;
        }
        list = gdx_fabric::providers().expect("libfabric loads");
    }
    assert_eq!(
        misses(&list),
        Vec::<String>::new(),
        "fi_info lists these with FI_HMEM"
    );
    // And nothing fi_info leaves out is claimed.
    for e in list.iter().filter(|e| e.hmem) {
        assert!(
            listed
                .iter()
                .any(|(p, d)| *p == e.provider && *d == e.domain),
            "{e:?} not in {listed:?}"
        );
    }
}

/// An endpoint is opened with FI_HMEM exactly when its entry offers it (the reason says so),
/// and GPU memory is refused before the provider sees it where the entry does not. Debian's
/// libfabric 1.17: shm lists FI_HMEM (built without CUDA, so a CUDA registration there would
/// be refused by the provider; no GPU here to try), tcp does not.
#[test]
fn endpoints_open_with_fi_hmem_when_their_entry_offers_it() {
    let listed = gdx_fabric::providers().expect("libfabric loads");
    for name in ["tcp", "shm"] {
        let cfg = FabricConfig {
            provider: Some(name.into()),
        };
        let Ok(ep) = Endpoint::open(&cfg) else {
            assert_ne!(name, "tcp", "tcp must open");
            continue;
        };
        let offers = listed
            .iter()
            .any(|p| p.core() == name && p.hmem && p.domain == ep.provider().domain);
        eprintln!("{name}: FI_HMEM {offers}: {}", ep.reason());
        assert_eq!(ep.registers_hmem(), offers, "{name}: {}", ep.reason());
        assert_eq!(
            ep.reason().contains("opened with FI_HMEM"),
            offers,
            "{name}: {}",
            ep.reason()
        );
        if !offers {
            // SAFETY: never dereferenced or registered: the endpoint refuses it first.
            let gpu = unsafe { gdx_fabric::Memory::from_cuda(0x7f00_0000_0000, 4096, 0) };
            match ep.register(gpu) {
                Err(FabricError::NoHmem { provider, device }) => {
                    assert_eq!(
                        (provider.as_str(), device),
                        (ep.provider().provider.as_str(), 0)
                    )
                }
                other => panic!("{name}: GPU memory without FI_HMEM: {other:?}"),
            }
        }
    }
}
