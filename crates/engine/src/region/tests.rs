//! Lease and remote-check tests of the region registry.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::error::Error;

#[test]
fn lease_compatibility_and_retire() {
    let reg = Arc::new(Registry::default());
    let r = reg.alloc(64, Access::READ_WRITE, Some("t".into())).unwrap();
    let short = Duration::from_millis(20);
    let read = r.lease(LeaseKind::UserRead, short).unwrap();
    // A local shared view holds off incoming writes but lets data leave.
    assert_eq!(
        r.lease(LeaseKind::Sink, short).unwrap_err(),
        Error::Timeout(short)
    );
    drop(r.lease(LeaseKind::Source, short).unwrap());
    drop(read);
    let sink = r.lease(LeaseKind::Sink, short).unwrap();
    let sink2 = r.lease(LeaseKind::Sink, short).unwrap(); // concurrent streams into one region
    assert!(r.lease(LeaseKind::UserWrite, short).is_err());
    drop((sink, sink2));
    let w = r.lease(LeaseKind::UserWrite, short).unwrap();
    assert!(r.lease(LeaseKind::Source, short).is_err());
    drop(w);
    // Retire waits for a running lease, then refuses new ones.
    let l = r.lease(LeaseKind::Source, short).unwrap();
    let r2 = Arc::clone(&r);
    let t = std::thread::spawn(move || r2.retire());
    std::thread::sleep(Duration::from_millis(30));
    assert!(!t.is_finished());
    drop(l);
    t.join().unwrap();
    assert_eq!(
        r.lease(LeaseKind::Source, short).unwrap_err(),
        Error::RegionGone { region: r.id }
    );
}

#[test]
fn remote_checks_in_order() {
    let reg = Registry::default();
    let r = reg.alloc(100, Access::READ, None).unwrap();
    let t = Duration::from_millis(10);
    let bad = RegionKey(r.key.0.wrapping_add(1));
    assert_eq!(
        reg.check_remote(77, r.key, 0, 1, false, t).unwrap_err(),
        Error::NoSuchRegion { region: 77 }
    );
    assert_eq!(
        reg.check_remote(r.id, bad, 0, 1, false, t).unwrap_err(),
        Error::BadKey { region: r.id }
    );
    assert_eq!(
        reg.check_remote(r.id, r.key, 0, 1, true, t).unwrap_err(),
        Error::ReadOnly { region: r.id }
    );
    assert!(matches!(
        reg.check_remote(r.id, r.key, u64::MAX, 2, false, t)
            .unwrap_err(),
        Error::OutOfBounds { .. }
    ));
    assert!(reg.check_remote(r.id, r.key, 99, 1, false, t).is_ok());
}
