//! A captured `--root` whose sysfs links are absolute (`/sys/devices/...`, as a careless copy
//! leaves them) is read inside the capture: the link is re-rooted by topo's sysfs layer, never
//! followed on the machine running the test. The netdev name is one no host has, so a read that
//! leaks to the host finds nothing and the test fails.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_rdma::doctor::netdev_mtu;
use gdx_rdma::gid::{NetdevState, NetdevView, SysfsNetdevs};
use std::os::unix::fs::symlink;

const NETDEV: &str = "gdxcap9";

fn captured_root() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    let real = r.join("sys/devices/virtual/net").join(NETDEV);
    std::fs::create_dir_all(&real).unwrap();
    std::fs::write(real.join("mtu"), "9000\n").unwrap();
    std::fs::write(real.join("operstate"), "up\n").unwrap();
    std::fs::create_dir_all(r.join("sys/class/net")).unwrap();
    symlink(
        format!("/sys/devices/virtual/net/{NETDEV}"),
        r.join("sys/class/net").join(NETDEV),
    )
    .unwrap();
    dir
}

#[test]
fn netdev_mtu_follows_an_absolute_link_inside_the_root() {
    let dir = captured_root();
    assert_eq!(netdev_mtu(dir.path(), NETDEV), Some(9000));
}

#[test]
fn netdev_state_follows_an_absolute_link_inside_the_root() {
    let dir = captured_root();
    let view = SysfsNetdevs::at_root(dir.path());
    assert_eq!(view.state(NETDEV), NetdevState::Up);
}

#[test]
fn a_link_out_of_the_root_is_not_followed_on_the_host() {
    // `/proc/self` exists on every Linux host; inside the capture it does not.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("sys/class/net")).unwrap();
    symlink("/proc/self", dir.path().join("sys/class/net/leak")).unwrap();
    assert_eq!(netdev_mtu(dir.path(), "leak"), None);
    let view = SysfsNetdevs::at_root(dir.path());
    assert_eq!(view.state("leak"), NetdevState::Unknown);
}
