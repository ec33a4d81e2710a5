//! The admission limits' environment knobs (docs/security.md lists them): each variable lands
//! in its `Limits` field, and a bad value names the variable. One test in its own binary, so
//! setting the process environment races nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_engine::AgentConfig;
use std::time::Duration;

#[test]
fn admission_limits_come_from_their_variables_and_bad_values_are_named() {
    let vars = [
        ("GDX_MAX_CONNECTIONS_PER_ADDR", "12"),
        ("GDX_FIRST_FRAME_TIMEOUT_MS", "250"),
        ("GDX_MAX_PENDING", "40"),
        ("GDX_MAX_PENDING_PER_ADDR", "3"),
        ("GDX_MAX_PENDING_PER_NET", "5"),
    ];
    for (k, v) in vars {
        std::env::set_var(k, v);
    }
    let c = AgentConfig::from_env().unwrap();
    assert_eq!(c.limits.max_connections_per_addr, 12);
    assert_eq!(c.limits.first_frame_timeout, Duration::from_millis(250));
    assert_eq!(c.limits.max_pending, 40);
    assert_eq!(c.limits.max_pending_per_addr, 3);
    assert_eq!(c.limits.max_pending_per_net, 5);
    std::env::set_var("GDX_MAX_PENDING_PER_NET", "many");
    let e = AgentConfig::from_env().unwrap_err().to_string();
    assert!(e.contains("GDX_MAX_PENDING_PER_NET"), "{e}");
    for (k, _) in vars {
        std::env::remove_var(k);
    }
}
