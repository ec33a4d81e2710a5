//! On a machine with GPUs: the live facts and probes through gdx-sys.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_doctor::{run, DataPath, Options, Status};

#[test]
#[ignore = "requires NVIDIA GPUs; run with cargo test -- --ignored"]
fn live_p2p_is_proved_by_the_probe() {
    let facts = gdx_doctor::live::SystemFacts;
    let probe = gdx_doctor::live::SystemProbe;
    let mut o = Options::new("/");
    o.live = Some(&facts);
    o.probe = Some(&probe);
    o.env = std::env::vars().collect();
    let r = run(&o).unwrap();
    assert!(
        !r.header.gpus.is_empty(),
        "no GPU found: {:?}",
        r.header.notes
    );
    assert_eq!(r.by_id("cuda").next().unwrap().status, Status::Pass);
    for c in r.by_id("probe-copy") {
        assert_eq!(c.status, Status::Pass, "{c:#?}");
    }
    if r.header.gpus.len() >= 2 {
        let p2p = r
            .findings
            .iter()
            .find(|f| f.id == "p2p" && f.subject == "GPU0-GPU1")
            .unwrap();
        assert_eq!(p2p.status, Status::Pass, "{p2p:#?}");
        assert!(p2p.message.contains("GB/s"), "{}", p2p.message);
        let v = r.verdict("GPU0-GPU1").unwrap();
        assert_eq!(v.path, DataPath::P2p);
        assert!(v.measured_gbps.is_some_and(|g| g > 0.0));
    }
}
