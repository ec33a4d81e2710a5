//! Planner rules, without a GPU.

use super::*;
use crate::routing::calibration::Crossover;

fn link(class: &str, expects: bool, peer: PeerStatus) -> Option<GpuLink> {
    Some(GpuLink {
        class: Some(class.to_string()),
        class_expects_p2p: expects,
        peer,
    })
}

fn gpus(a: u32, b: u32, len: u64, l: Option<GpuLink>) -> OpFacts {
    OpFacts {
        src: EndFacts::at(Location::Gpu(a)),
        dst: EndFacts::at(Location::Gpu(b)),
        len,
        link: l,
    }
}

#[test]
fn nvlink_peers_take_p2p_and_say_so() {
    let f = gpus(0, 1, 1 << 30, link("NV18", true, PeerStatus::Enabled));
    let p = plan_local(&f, &Policy::default(), &Calibration::default()).unwrap();
    assert_eq!(p.path, Path::P2p);
    assert_eq!(&*p.reason, "p2p: GPU0→GPU1 NV18");
}

#[test]
fn no_p2p_means_staged_with_the_topology_in_the_reason() {
    let f = gpus(0, 2, 1 << 20, link("SYS", false, PeerStatus::NotSupported));
    let p = plan_local(&f, &Policy::default(), &Calibration::default()).unwrap();
    assert_eq!(p.path, Path::Staged);
    assert_eq!(
        &*p.reason,
        "staged: P2P not supported between GPU0 and GPU2 (SYS)"
    );
    // Strict mode accepts it: the topology says no direct path exists.
    let p = plan_local(&f, &Policy::strict(), &Calibration::default()).unwrap();
    assert_eq!(p.path, Path::Staged);
}

#[test]
fn strict_mode_refuses_a_forced_staged_copy_with_the_reason() {
    let f = gpus(0, 1, 1 << 20, link("NV18", true, PeerStatus::Enabled));
    let policy = Policy {
        strict: true,
        force: Some(Path::Staged),
        ..Policy::default()
    };
    let e = plan_local(&f, &policy, &Calibration::default()).unwrap_err();
    let Error::Strict { reason: msg, .. } = &e else {
        panic!("{e:?}")
    };
    assert!(
        msg.starts_with("staged: forced by policy (GDX_FORCE_PATH=staged)"),
        "{msg}"
    );
    assert!(msg.contains("strict mode refuses to leave the direct path (p2p GPU0→GPU1 NV18)"));
    let p = plan_local(
        &f,
        &Policy {
            strict: false,
            ..policy
        },
        &Calibration::default(),
    )
    .unwrap();
    assert_eq!(p.path, Path::Staged);
}

#[test]
fn a_topology_that_promises_p2p_the_driver_refuses_fails_in_strict_mode() {
    let f = gpus(0, 1, 64, link("PIX", true, PeerStatus::NotSupported));
    assert_eq!(
        plan_local(&f, &Policy::default(), &Calibration::default())
            .unwrap()
            .path,
        Path::Staged
    );
    assert!(matches!(
        plan_local(&f, &Policy::strict(), &Calibration::default()),
        Err(Error::Strict { .. })
    ));
}

#[test]
fn pool_memory_without_access_is_staged_and_named() {
    let mut f = gpus(0, 1, 1 << 20, link("NV18", true, PeerStatus::Enabled));
    f.dst.not_peer_mapped =
        Some("is stream-ordered pool memory of GPU1 without access for GPU0".to_string());
    let p = plan_local(&f, &Policy::default(), &Calibration::default()).unwrap();
    assert_eq!(p.path, Path::Staged);
    assert_eq!(
        &*p.reason,
        "staged: destination region is stream-ordered pool memory of GPU1 without access for GPU0"
    );
    assert!(plan_local(&f, &Policy::strict(), &Calibration::default()).is_err());
}

#[test]
fn imported_regions_take_ipc() {
    let mut f = gpus(0, 1, 1 << 20, link("NV18", true, PeerStatus::Enabled));
    f.dst.imported = true;
    let p = plan_local(&f, &Policy::default(), &Calibration::default()).unwrap();
    assert_eq!(p.path, Path::Ipc);
    assert!(p.reason.starts_with("ipc: GPU0→GPU1 NV18"), "{}", p.reason);
}

#[test]
fn host_and_same_gpu_copies() {
    let f = OpFacts {
        src: EndFacts::at(Location::PinnedHost),
        dst: EndFacts::at(Location::Gpu(1)),
        len: 8,
        link: None,
    };
    let p = plan_local(&f, &Policy::strict(), &Calibration::default()).unwrap();
    assert_eq!(p.path, Path::HostToGpu);
    assert_eq!(
        &*p.reason,
        "host-to-gpu: pinned host → GPU1 on GPU1's copy engine"
    );
    let f = OpFacts {
        src: EndFacts::at(Location::Gpu(1)),
        dst: EndFacts::at(Location::PinnedHost),
        len: 8,
        link: None,
    };
    assert_eq!(
        plan_local(&f, &Policy::default(), &Calibration::default())
            .unwrap()
            .path,
        Path::GpuToHost
    );
    let f = gpus(1, 1, 8, None);
    assert_eq!(
        plan_local(&f, &Policy::default(), &Calibration::default())
            .unwrap()
            .path,
        Path::DeviceLocal
    );
    let f = OpFacts {
        src: EndFacts::at(Location::PinnedHost),
        dst: EndFacts::at(Location::PinnedHost),
        len: 8,
        link: None,
    };
    assert!(matches!(
        plan_local(&f, &Policy::default(), &Calibration::default()),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn the_planner_reads_a_calibration_file_and_chooses_accordingly() {
    let dir = std::env::temp_dir().join(format!("gdx-planner-cal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("calibration.json");
    std::fs::write(
        &file,
        r#"{ "schema_version": 1, "source": "bench on test-box",
             "crossovers": [ { "below_bytes": 65536, "prefer": "staged", "over": "p2p" } ] }"#,
    )
    .unwrap();
    let cal = Calibration::load(&file).unwrap();
    assert_eq!(
        cal.crossovers,
        vec![Crossover {
            below_bytes: 65536,
            prefer: Path::Staged,
            over: Path::P2p
        }]
    );
    let l = link("NV18", true, PeerStatus::Enabled);
    let small = plan_local(&gpus(0, 1, 4096, l.clone()), &Policy::default(), &cal).unwrap();
    assert_eq!(small.path, Path::Staged);
    assert_eq!(
        &*small.reason,
        "staged: 4096 bytes < 65536 where staged beat p2p (bench on test-box)"
    );
    let large = plan_local(&gpus(0, 1, 1 << 20, l.clone()), &Policy::default(), &cal).unwrap();
    assert_eq!(large.path, Path::P2p);
    // Strict mode still wins over the calibration.
    assert!(plan_local(&gpus(0, 1, 4096, l), &Policy::strict(), &cal).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn policy_reads_the_environment() {
    // Only this test touches these variables.
    std::env::set_var(STRICT_ENV, "1");
    std::env::set_var(FORCE_PATH_ENV, "staged");
    let p = Policy::default().with_env().unwrap();
    assert!(p.strict);
    assert_eq!(p.force, Some(Path::Staged));
    std::env::set_var(FORCE_PATH_ENV, "p2p");
    assert!(Policy::default().with_env().is_err());
    std::env::remove_var(STRICT_ENV);
    std::env::remove_var(FORCE_PATH_ENV);
}

fn host_gpu(len: u64, to_gpu: bool) -> OpFacts {
    let (h, g) = (
        EndFacts::at(Location::PinnedHost),
        EndFacts::at(Location::Gpu(0)),
    );
    let (src, dst) = if to_gpu { (h, g) } else { (g, h) };
    OpFacts {
        src,
        dst,
        len,
        link: None,
    }
}

fn running(stream_ordered: bool) -> MailboxFacts {
    MailboxFacts {
        gpu: 0,
        sms: 1,
        max_payload: 8192,
        stream_ordered,
    }
}

#[test]
fn small_host_gpu_ops_take_a_running_mailbox_and_say_why() {
    let cal = Calibration::default();
    let m = running(false);
    let p = plan_local_with(&host_gpu(8, true), &Policy::default(), &cal, Some(&m)).unwrap();
    assert_eq!(p.path, Path::Mailbox);
    assert!(
        p.reason
            .starts_with("mailbox: 8 B ≤ 2 KiB crossover (default), 1 SM reserved"),
        "{}",
        p.reason
    );
    let p = plan_local_with(&host_gpu(2048, false), &Policy::strict(), &cal, Some(&m)).unwrap();
    assert_eq!(p.path, Path::Mailbox);
    assert!(p.reason.contains("GPU0 → pinned host"), "{}", p.reason);
    // Above the crossover: the copy engine, saying the mailbox was considered.
    let p = plan_local_with(&host_gpu(2049, true), &Policy::default(), &cal, Some(&m)).unwrap();
    assert_eq!(p.path, Path::HostToGpu);
    assert!(
        p.reason.contains("2049 B > 2 KiB crossover"),
        "{}",
        p.reason
    );
    // No mailbox, or one on another GPU: the copy engine, no mention.
    let p = plan_local(&host_gpu(8, true), &Policy::default(), &cal).unwrap();
    assert_eq!(p.path, Path::HostToGpu);
    assert!(!p.reason.contains("mailbox"));
    let other = MailboxFacts {
        gpu: 1,
        ..running(false)
    };
    let p = plan_local_with(&host_gpu(8, true), &Policy::default(), &cal, Some(&other)).unwrap();
    assert_eq!(p.path, Path::HostToGpu);
}

#[test]
fn the_calibrated_crossover_and_the_payload_limit_bound_the_mailbox() {
    let cal = Calibration {
        source: Some("cal.json".into()),
        crossovers: vec![Crossover {
            below_bytes: 65,
            prefer: Path::Mailbox,
            over: Path::HostToGpu,
        }],
        ..Calibration::default()
    };
    let m = running(false);
    let p = plan_local_with(&host_gpu(64, true), &Policy::default(), &cal, Some(&m)).unwrap();
    assert_eq!(p.path, Path::Mailbox);
    assert!(
        p.reason.contains("64 B ≤ 64 B crossover (cal.json)"),
        "{}",
        p.reason
    );
    let p = plan_local_with(&host_gpu(65, true), &Policy::default(), &cal, Some(&m)).unwrap();
    assert_eq!(p.path, Path::HostToGpu);
    // The other direction keeps the default.
    let p = plan_local_with(&host_gpu(1024, false), &Policy::default(), &cal, Some(&m)).unwrap();
    assert_eq!(p.path, Path::Mailbox);
    // A crossover past what one op carries is capped at the payload limit.
    let big = Calibration {
        crossovers: vec![Crossover {
            below_bytes: 1 << 20,
            prefer: Path::Mailbox,
            over: Path::HostToGpu,
        }],
        ..Calibration::default()
    };
    let p = plan_local_with(&host_gpu(8193, true), &Policy::default(), &big, Some(&m)).unwrap();
    assert_eq!(p.path, Path::HostToGpu);
    assert!(p.reason.contains("8 KiB crossover"), "{}", p.reason);
}

#[test]
fn stream_ordered_ops_leave_the_mailbox_and_strict_mode_refuses() {
    let cal = Calibration::default();
    let m = running(true);
    let p = plan_local_with(&host_gpu(8, true), &Policy::default(), &cal, Some(&m)).unwrap();
    assert_eq!(p.path, Path::HostToGpu);
    assert!(p.reason.contains("ordered with a stream"), "{}", p.reason);
    let e = plan_local_with(&host_gpu(8, true), &Policy::strict(), &cal, Some(&m)).unwrap_err();
    assert!(matches!(e, Error::Strict { .. }), "{e}");
}
