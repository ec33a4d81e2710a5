#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The engine's modules import each other in no cycle larger than [`MAX_CYCLE`] files: a new
//! cycle (a module below the façade reaching back up, docs/architecture.md) fails here, naming
//! the files and the references that close it.
//!
//! A file's imports are the `crate::…` and `super::…` paths in its code (comments and
//! `#[cfg(test)] mod tests` blocks left out), each resolved to the longest module path that is a
//! file of the crate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The largest strongly connected set of files allowed. Today's is the façade itself (agent,
/// peer, server and the notification queue they share).
const MAX_CYCLE: usize = 4;

fn modules(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            modules(root, &p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let rel = p.strip_prefix(root).unwrap().with_extension("");
            let mut name = rel.to_string_lossy().replace('/', "::");
            if name == "lib" {
                name.clear();
            }
            if let Some(n) = name.strip_suffix("::mod") {
                name = n.to_string();
            }
            out.insert(name, std::fs::read_to_string(&p).unwrap());
        }
    }
}

/// The code of a file without comments and without its unit-test module.
fn code(src: &str) -> String {
    let src = src
        .split("#[cfg(test)]\nmod tests")
        .next()
        .unwrap_or_default();
    src.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Paths that follow `prefix` in `src`: `crate::a::b` → `a::b`; `crate::{a, b::c}` → `a`, `b`.
fn paths_after(src: &str, prefix: &str) -> Vec<String> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut out = Vec::new();
    for (i, _) in src.match_indices(prefix) {
        if i > 0 && src[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &src[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or_default();
            for item in group.split(',') {
                let item = item.trim();
                let name: String = item.chars().take_while(|&c| ident(c)).collect();
                if !name.is_empty() {
                    out.push(name.trim_end_matches(':').to_string());
                }
            }
        } else {
            let name: String = rest.chars().take_while(|&c| ident(c)).collect();
            out.push(name.trim_end_matches(':').to_string());
        }
    }
    out
}

fn resolve(mods: &BTreeMap<String, String>, path: &str) -> Option<String> {
    let parts: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    (1..=parts.len())
        .rev()
        .map(|k| parts[..k].join("::"))
        .find(|m| mods.contains_key(m))
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut mods = BTreeMap::new();
    modules(&root, &root, &mut mods);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, src) in &mods {
        let src = code(src);
        let parent = m.rsplit_once("::").map_or("", |(p, _)| p);
        let mut targets: Vec<String> = paths_after(&src, "crate::");
        targets.extend(paths_after(&src, "super::").into_iter().map(|p| {
            if parent.is_empty() {
                p
            } else {
                format!("{parent}::{p}")
            }
        }));
        let set = edges.entry(m.clone()).or_default();
        for t in targets {
            if let Some(t) = resolve(&mods, &t) {
                if &t != m && !t.is_empty() {
                    set.insert(t);
                }
            }
        }
    }
    edges
}

/// Strongly connected components (Tarjan), largest first.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        e: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.e.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let l = t.low[v].min(t.low[w]);
                t.low.insert(v, l);
            } else if t.on.contains(w) {
                let l = t.low[v].min(t.index[w]);
                t.low.insert(v, l);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            t.out.push(comp);
        }
    }
    let mut t = T {
        e: edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    let mut out = t.out;
    out.sort_by_key(|c| std::cmp::Reverse(c.len()));
    out
}

#[test]
fn no_import_cycle_among_engine_modules_exceeds_the_facade() {
    let edges = graph();
    assert!(edges.len() > 40, "found only {} engine files", edges.len());
    let all = cycles(&edges);
    let big = &all[0];
    println!("largest cycle: {big:?}");
    let inside: BTreeSet<&String> = big.iter().collect();
    let links: Vec<String> = big
        .iter()
        .flat_map(|m| {
            edges[m]
                .iter()
                .filter(|t| inside.contains(t))
                .map(move |t| format!("{m} -> {t}"))
        })
        .collect();
    assert!(
        big.len() <= MAX_CYCLE,
        "engine files importing each other in a cycle of {} (at most {MAX_CYCLE}): {}",
        big.len(),
        links.join(", ")
    );
}

#[test]
fn the_cycle_finder_sees_a_cycle() {
    let mut e: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, b) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")] {
        e.entry(a.into()).or_default().insert(b.into());
        e.entry(b.into()).or_default();
    }
    let c = cycles(&e);
    assert_eq!(c[0].len(), 3);
    assert_eq!(
        paths_after("use crate::{a::b, c};\nlet x = crate::d::e;", "crate::"),
        ["a::b", "c", "d::e"]
    );
}

/// docs/architecture.md names every crate of the workspace and every engine folder, and
/// nothing that is not there.
#[test]
fn the_architecture_page_matches_the_tree() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let crates: BTreeSet<String> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for c in &crates {
        assert!(
            doc.contains(&format!("`crates/{c}`")),
            "docs/architecture.md does not name crates/{c}"
        );
    }
    for (i, _) in doc.match_indices("`crates/") {
        let name: String = doc[i + 8..]
            .chars()
            .take_while(|&c| c != '`' && c != '/')
            .collect();
        assert!(
            crates.contains(&name),
            "docs/architecture.md names crates/{name}, which is not a crate"
        );
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let shown = if p.is_dir() {
            format!("`{name}/")
        } else {
            format!("`{name}`")
        };
        if name == "lib.rs" {
            continue;
        }
        assert!(
            doc.contains(&shown) || (p.is_dir() && doc.contains(&format!("`{name}/"))),
            "docs/architecture.md does not place crates/engine/src/{name}"
        );
    }
}
