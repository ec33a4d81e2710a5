//! etcd with TLS and client-certificate auth: the agent registers and is looked up through
//! `https://` with the CA and a client certificate; without the client certificate etcd
//! refuses the connection.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::*;
use gdx_cluster::test_support::EtcdServer;
use gdx_cluster::{ClusterAgent, ClusterError, ClusterView, EtcdOptions, EtcdTls};

#[test]
fn tls_with_client_certificates() {
    let etcd = EtcdServer::start_tls().unwrap_or_else(|e| {
        panic!("{e} (needs etcd-server and openssl: apt-get install etcd-server openssl)")
    });
    let mut cfg = cluster_config(&etcd.url(), "tls", 10);
    cfg.etcd = etcd.options();
    let agent = gdx_engine::Agent::new(agent_config("a")).expect("agent");
    let a = ClusterAgent::join(agent, cfg).expect("join over TLS");
    let view = ClusterView::connect(&etcd.options(), "tls").expect("view over TLS");
    assert_eq!(view.lookup("a").expect("lookup").instance, a.instance());

    // The CA alone is not enough: etcd runs with --client-cert-auth.
    let mut no_cert = EtcdOptions::new(etcd.url());
    no_cert.tls = Some(EtcdTls {
        ca_pem: etcd.client_tls().and_then(|t| t.ca_pem),
        identity: None,
    });
    match ClusterView::connect(&no_cert, "tls") {
        Err(ClusterError::Unreachable { .. }) | Err(ClusterError::Etcd { .. }) => {}
        r => panic!("expected a refusal without a client certificate, got {r:?}"),
    }
}
