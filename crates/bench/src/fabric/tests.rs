use super::*;
use std::time::Duration;

fn info(provider: &str, hmem: bool) -> ProviderInfo {
    ProviderInfo {
        provider: provider.into(),
        fabric: "127.0.0.1/32".into(),
        domain: "lo".into(),
        hmem,
        mr_mode: vec!["FI_MR_LOCAL"],
        mr_key_size: 8,
        manual_progress: true,
        max_msg_size: 1 << 30,
        tx_size: 1024,
        src_addr: "127.0.0.1:0".into(),
    }
}

fn floors() -> LatencyFloors {
    LatencyFloors {
        shm_flag_us: 0.5,
        unix_us: Some(5.0),
        tcp_us: Some(20.0),
        method: String::new(),
    }
}

#[test]
fn keys_ends_and_opt_in() {
    let ctx = Ctx::without_devices();
    let c = cases(&ctx);
    let keys: Vec<&str> = c.iter().map(|c| c.spec().key.as_str()).collect();
    assert_eq!(keys, ["host_to_host_fabric", "gpu0_to_host_fabric"]);
    assert!(c
        .iter()
        .all(|c| c.opt_in() && c.spec().path == PathKind::Fabric));
    let mut remote = Ctx::without_devices();
    remote.peer = Some(("10.0.0.2:7447".into(), "serve".into()));
    let r = cases(&remote);
    assert_eq!(r[0].spec().key, "host_to_remote_host_fabric");
    assert_eq!(r[0].spec().dst.name(), "remote:10.0.0.2:7447");
    assert!(r[0]
        .spec()
        .description
        .contains("GDX_TRANSPORTS=tcp,fabric"));
}

#[test]
fn without_a_provider_every_case_is_waived_with_the_reason() {
    let ctx = Ctx::without_devices();
    let w = cases(&ctx)[0].applicable(&ctx).unwrap_err();
    assert!(w.reason.contains("fabric cases disabled"), "{w}");
    assert_eq!(w.cause.map(|c| c.scope).as_deref(), Some("fabric cases"));
    // The GPU case names the GPU waiver first: no CUDA here.
    let g = cases(&ctx)[1].applicable(&ctx).unwrap_err();
    assert_eq!(g.cause.map(|c| c.scope).as_deref(), Some("GPU cases"));
}

#[test]
fn gpu_memory_is_waived_saying_which_part_is_missing() {
    let no = gpu_waiver(&info("tcp;ofi_rxm", false));
    assert!(no.reason.contains("does not offer FI_HMEM"), "{no}");
    assert!(no.reason.contains("domain lo"), "{no}");
    assert!(no.cause.is_none());
    let yes = gpu_waiver(&info("efa", true));
    assert!(yes.reason.contains("efa offers FI_HMEM"), "{yes}");
    assert!(yes.reason.contains("FI_HMEM_CUDA"), "{yes}");
    assert!(no.reason.contains("fabric-staged"), "{no}");
}

#[test]
fn small_loopback_rows_are_set_beside_their_floor() {
    let spec = cases(&Ctx::without_devices())[0].spec().clone();
    let mut row = Row::new(&spec, 8);
    row.lat_p50_us = Some(41.0);
    assert_eq!(
        floor_note(&info("tcp;ofi_rxm", false), &floors(), &row).as_deref(),
        Some("8 B fabric p50 41.00 µs = 2.05× the tcp loopback floor (20.00 µs, same run)")
    );
    let shm = floor_note(&info("shm", false), &floors(), &row).unwrap();
    assert!(shm.contains("82.00× the shm flag floor"), "{shm}");
    assert_eq!(floor_note(&info("efa", false), &floors(), &row), None);
    let mut big = row.clone();
    big.size_bytes = 1 << 30;
    assert_eq!(floor_note(&info("tcp", false), &floors(), &big), None);
    let mut remote = row.clone();
    remote.dst = "remote:10.0.0.2:7447".into();
    assert_eq!(floor_note(&info("tcp", false), &floors(), &remote), None);
    let mut windowed = row.clone();
    windowed.add_note(format!("p50 per {}", crate::host::WINDOW_NOTE));
    assert_eq!(floor_note(&info("tcp", false), &floors(), &windowed), None);
    let mut none = row;
    none.lat_p50_us = None;
    assert_eq!(floor_note(&info("tcp", false), &floors(), &none), None);
}

#[test]
fn a_fabric_selection_gets_the_tcp_comparison_once() {
    let ctx = Ctx::without_devices();
    let all = || crate::all_cases(&ctx);
    let sel = crate::select(all(), &["fabric".into()]).unwrap();
    assert!(sel.iter().all(|c| c.spec().path == PathKind::Fabric));
    let with = with_tcp_comparison(sel, all());
    let keys: Vec<&str> = with.iter().map(|c| c.spec().key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "host_to_host_fabric",
            "gpu0_to_host_fabric",
            "host_to_host_tcp"
        ]
    );
    // Already there, or no fabric case: unchanged.
    let both = crate::select(all(), &["fabric".into(), "host_to_host_tcp".into()]).unwrap();
    assert_eq!(with_tcp_comparison(both, all()).len(), 3);
    let shm = crate::select(all(), &["shm".into()]).unwrap();
    assert_eq!(with_tcp_comparison(shm, all()).len(), 1);
}

#[test]
fn the_judged_path_follows_the_provider() {
    assert_eq!(
        judged_as(&Ctx::without_devices(), PathKind::Shm),
        PathKind::Shm
    );
    // No provider known: judged like tcp.
    assert_eq!(
        judged_as(&Ctx::without_devices(), PathKind::Fabric),
        PathKind::Tcp
    );
    assert!(is_loopback_provider(&info("tcp;ofi_rxm", false)));
    assert!(!is_loopback_provider(&info("efa", true)));
}

/// The host case over libfabric's tcp provider (127.0.0.1 only), loopback pair in this
/// process: every size measured and its bytes verified; the route is fabric (a tcp route
/// would fail the case with WrongPath).
#[test]
fn loopback_over_the_tcp_provider_measures_and_verifies() {
    let mut ctx = Ctx::default();
    ctx.fabric_provider = Some("tcp".into());
    let case = &cases(&ctx)[0];
    case.applicable(&ctx).unwrap();
    let params = Params {
        sizes: vec![8, 4096, 1 << 20],
        duration: Duration::from_millis(20),
        max_samples: 20,
        ..Params::default()
    };
    let mut rows = Vec::new();
    case.run(&ctx, &params, &mut |r| rows.push(r)).unwrap();
    assert_eq!(rows.len(), 3);
    for r in &rows {
        assert_eq!(r.verified, Some(true), "{} {:?}", r.key, r.note);
        assert!(r.bw_gbps.is_some_and(|b| b > 0.0));
        let note = r.note.as_deref().unwrap_or("");
        assert!(note.contains("tcp"), "{note}");
    }
    let small = rows[0].note.as_deref().unwrap();
    assert!(small.contains("the tcp loopback floor"), "{small}");
    let gpu = cases(&ctx)[1].applicable(&ctx).unwrap_err();
    assert!(
        gpu.reason.contains("FI_HMEM") || gpu.cause.is_some(),
        "{gpu}"
    );
}
