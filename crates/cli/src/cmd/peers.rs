//! `gdx peers`: the agents of a cluster as etcd lists them (name, host, transports, GPUs and
//! NICs, regions, lease TTL left, instance id); `--watch` follows joins and leaves.

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use gdx_cluster::{AgentEvent, AgentListing, ClusterView};

use super::cluster::EtcdArgs;

/// List the agents of a cluster (registered in etcd by `gdx serve --etcd`).
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  gdx peers --etcd http://127.0.0.1:2379 --cluster demo
  gdx peers --etcd http://127.0.0.1:2379 --cluster demo --watch     joins and leaves as they happen
  gdx peers --etcd http://127.0.0.1:2379 --cluster demo --json

Region keys are never in etcd: the REGIONS column is what a peer can ask for over an
authenticated session.")]
pub struct PeersArgs {
    #[command(flatten)]
    etcd: EtcdArgs,

    /// The cluster (the `/gdx/<cluster>/` prefix in etcd).
    #[arg(long, value_name = "NAME")]
    cluster: String,

    /// One JSON document (with --watch: the listing, then one JSON object per event and line).
    #[arg(long)]
    json: bool,

    #[command(flatten)]
    out: super::output::OutputArgs,

    /// After the listing, print joins and leaves until interrupted.
    #[arg(long)]
    watch: bool,
}

fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

/// Every field of the table and the event lines came from etcd, which anyone who can write
/// the cluster's keys controls: escaped before it reaches the terminal.
fn esc(s: &str) -> String {
    gdx_topo::printable(s)
}

fn table(list: &[AgentListing]) -> String {
    let mut rows = vec![[
        "NAME".to_string(),
        "HOST".into(),
        "LISTEN".into(),
        "TRANSPORTS".into(),
        "GPUS".into(),
        "NICS".into(),
        "REGIONS".into(),
        "TTL".into(),
        "INSTANCE".into(),
    ]];
    for l in list {
        let a = &l.agent;
        let regions: Vec<String> = l
            .regions
            .iter()
            .map(|r| {
                format!(
                    "{}({} B, {})",
                    esc(&r.name),
                    r.len,
                    esc(&r.location.to_string())
                )
            })
            .collect();
        rows.push([
            esc(&a.name),
            format!("{} ({})", esc(&a.hostname), esc(short(&a.host_id))),
            esc(&a.listen),
            esc(&a.transports.join(",")),
            a.gpus.len().to_string(),
            a.nics.len().to_string(),
            if regions.is_empty() {
                "-".into()
            } else {
                regions.join(" ")
            },
            if l.ttl_left_s >= 0 {
                format!("{}s/{}s", l.ttl_left_s, a.ttl_s)
            } else {
                "expired".into()
            },
            esc(&a.instance),
        ]);
    }
    let mut widths = [0usize; 9];
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn event_line(e: &AgentEvent, json: bool) -> String {
    if json {
        let v = match e {
            AgentEvent::Joined(a) => serde_json::json!({"event": "joined", "agent": a}),
            AgentEvent::Left { name, instance } => {
                serde_json::json!({"event": "left", "name": name, "instance": instance})
            }
            AgentEvent::EtcdLost(why) => serde_json::json!({"event": "etcd_lost", "reason": why}),
            AgentEvent::EtcdBack => serde_json::json!({"event": "etcd_back"}),
        };
        return super::output::json_safe(&v.to_string());
    }
    match e {
        AgentEvent::Joined(a) => format!(
            "+ joined {} on {} ({}) instance {} transports {}",
            esc(&a.name),
            esc(&a.listen),
            esc(&a.hostname),
            esc(&a.instance),
            esc(&a.transports.join(","))
        ),
        AgentEvent::Left { name, instance } => format!(
            "- left   {} instance {} (lease expired or revoked)",
            esc(name),
            esc(instance.as_deref().unwrap_or("?"))
        ),
        AgentEvent::EtcdLost(why) => format!("! etcd lost: {} (retrying)", esc(why)),
        AgentEvent::EtcdBack => "! etcd back".to_string(),
    }
}

/// Run `gdx peers`.
pub fn run(args: &PeersArgs) -> Result<ExitCode> {
    let opts = args
        .etcd
        .options()?
        .context("gdx peers needs --etcd URL (where the cluster is registered)")?;
    let view = ClusterView::connect(&opts, &args.cluster)?;
    // Watch before listing, so nothing between the two is missed.
    let events = args.watch.then(|| view.watch());
    let list = view.agents()?;
    if args.json {
        println!(
            "{}",
            super::output::json_safe(
                &serde_json::json!({"cluster": args.cluster, "agents": list}).to_string()
            )
        );
    } else if args.out.quiet {
        // Quiet: the agent names alone, one per line (for scripts).
        for a in &list {
            println!("{}", esc(&a.agent.name));
        }
    } else if list.is_empty() {
        println!("no agents in cluster {:?}", esc(&args.cluster));
    } else {
        print!("{}", table(&list));
    }
    if let Some(rx) = events {
        use std::io::Write;
        for e in rx {
            let line = event_line(&e, args.json);
            let on = args.out.color.enabled() && !args.json;
            let code = if line.starts_with('+') { "32" } else { "31" };
            println!("{}", super::output::paint(on, code, &line));
            let _ = std::io::stdout().flush();
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gdx_cluster::{AgentRecord, RegionRecord};

    /// ESC, BEL, an OSC title, CSI as one C1 byte, NEL: what an etcd record may hold.
    const HOSTILE: &str = "a\u{1b}[2Jb\u{7}c\u{1b}]0;pwned\u{7}d\u{9b}31me\u{85}f";

    fn raw_controls(s: &str) -> Vec<char> {
        s.chars().filter(|&c| c.is_control() && c != '\n').collect()
    }

    #[test]
    fn every_field_from_etcd_is_escaped_in_the_table_and_the_events() {
        let agent = AgentRecord {
            name: HOSTILE.into(),
            instance: HOSTILE.into(),
            host_id: HOSTILE.into(),
            hostname: HOSTILE.into(),
            listen: HOSTILE.into(),
            transports: vec![HOSTILE.into()],
            gpus: vec![],
            nics: vec![],
            pid: 1,
            ttl_s: 10,
        };
        let l = AgentListing {
            agent: agent.clone(),
            regions: vec![RegionRecord {
                name: HOSTILE.into(),
                id: 1,
                len: 8,
                location: gdx_engine::Location::Host,
                access: gdx_engine::Access::READ_WRITE,
                shareable: false,
            }],
            ttl_left_s: 5,
            lease: 1,
        };
        let t = table(&[l]);
        assert!(raw_controls(&t).is_empty(), "{t:?}");
        assert!(t.contains("\\u{1b}]0;pwned\\u{7}"), "{t}");
        assert!(t.contains("\\u{9b}31m"), "{t}");
        for e in [
            AgentEvent::Joined(agent),
            AgentEvent::Left {
                name: HOSTILE.into(),
                instance: Some(HOSTILE.into()),
            },
            AgentEvent::EtcdLost(HOSTILE.into()),
        ] {
            for json in [false, true] {
                let line = event_line(&e, json);
                assert!(raw_controls(&line).is_empty(), "{line:?}");
                assert!(line.contains("pwned"), "{line}");
            }
        }
    }
}
