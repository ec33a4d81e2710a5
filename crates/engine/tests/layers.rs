#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The engine's modules import each other in no cycle larger than [`MAX_CYCLE`] modules: a new
//! cycle (a module below the façade reaching back up, docs/architecture.md) fails here, naming
//! the modules and the references that close it.
//!
//! A module's imports are the paths in its code (comments, `#[cfg(test)] mod tests` blocks and
//! `tests.rs` files left out): `crate::…`, `super::…` and `self::…` paths, bare paths that start
//! at a child module (`use handshake::…`) or at a name the module imported, in `use` trees and in
//! expressions alike. Each resolves through modules and through `use` re-exports (`crate::Error`
//! is `error`, `crate::transport::Serving` is `transport::serving`) to the module that defines
//! the item.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The largest strongly connected set of modules allowed: a parent and a child that name each
/// other (the parent re-exports the child's types, the child reads the parent's).
const MAX_CYCLE: usize = 2;

/// Cycles of more than [`MAX_CYCLE`] that remain, each named by one of its modules, with its
/// largest size and why it is not yet cut. A cycle not listed, or grown past its size, fails.
const REMAINING: &[(&str, usize, &str)] = &[];

fn modules(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            modules(root, &p, out);
        } else if p.extension().is_some_and(|x| x == "rs") && !p.ends_with("tests.rs") {
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

/// The code of a file without comments, string and char literals, and its unit-test module:
/// what is left holds only the paths the code names.
fn code(src: &str) -> String {
    let src = src
        .split("#[cfg(test)]\nmod tests")
        .next()
        .unwrap_or_default();
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        match c[i] {
            '/' if next == Some('/') => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            }
            '/' if next == Some('*') => {
                let mut depth = 0;
                while i < c.len() {
                    if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                        depth += 1;
                        i += 1;
                    } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                        depth -= 1;
                        i += 1;
                        if depth == 0 {
                            i += 1;
                            break;
                        }
                    }
                    i += 1;
                }
            }
            // A raw string: r"..." or r#"..."#, closed by the same number of #.
            'r' if (next == Some('"') || next == Some('#')) && (i == 0 || !is_ident(c[i - 1])) => {
                let mut j = i + 1;
                while c.get(j) == Some(&'#') {
                    j += 1;
                }
                let hashes = j - i - 1;
                if c.get(j) != Some(&'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                j += 1;
                while j < c.len() {
                    if c[j] == '"' && (0..hashes).all(|k| c.get(j + 1 + k) == Some(&'#')) {
                        j += 1 + hashes;
                        break;
                    }
                    j += 1;
                }
                out.push_str("\"\"");
                i = j;
            }
            '"' => {
                i += 1;
                while i < c.len() && c[i] != '"' {
                    i += if c[i] == '\\' { 2 } else { 1 };
                }
                out.push_str("\"\"");
                i += 1;
            }
            // A char literal ('x', '\n', '\''), not a lifetime ('a).
            '\'' if next == Some('\\') || c.get(i + 2) == Some(&'\'') => {
                i += 1;
                while i < c.len() && c[i] != '\'' {
                    i += if c[i] == '\\' { 2 } else { 1 };
                }
                out.push_str("' '");
                i += 1;
            }
            ch => {
                out.push(ch);
                i += 1;
            }
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// A `use` tree expanded: `a::{b, c::d as e, self}` → (`b`, `a::b`), (`e`, `a::c::d`), (`a`, `a`).
fn use_tree(prefix: &str, tree: &str, out: &mut Vec<(String, String)>) {
    let tree = tree.trim();
    let join = |p: &str| -> String {
        match (prefix.is_empty(), p.is_empty()) {
            (true, _) => p.to_string(),
            (_, true) => prefix.to_string(),
            _ => format!("{prefix}::{p}"),
        }
    };
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim().trim_end_matches("::");
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    use_tree(&join(head), &inner[start..i], out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        use_tree(&join(head), &inner[start..], out);
        return;
    }
    if tree.is_empty() || tree.ends_with('*') {
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((p, a)) => (p.trim(), a.trim().to_string()),
        None => (tree, String::new()),
    };
    let (path, alias) = if path == "self" {
        (prefix.to_string(), alias)
    } else {
        (join(path), alias)
    };
    let alias = if alias.is_empty() {
        path.rsplit("::").next().unwrap_or_default().to_string()
    } else {
        alias
    };
    out.push((alias, path));
}

/// The `use` items of a module's code: (name in scope, path as written, whether it is a
/// re-export: `pub use`).
fn uses(src: &str) -> Vec<(String, String, bool)> {
    let mut out = Vec::new();
    for (i, _) in src.match_indices("use ") {
        if i > 0 && !src[..i].ends_with(|c: char| c.is_whitespace() || c == ')' || c == ';') {
            continue;
        }
        let line_start = src[..i].rfind('\n').map_or(0, |k| k + 1);
        let export = src[line_start..i].trim_start().starts_with("pub");
        let rest = &src[i + 4..];
        let tree = rest.split(';').next().unwrap_or_default();
        let mut items = Vec::new();
        use_tree("", &tree.replace('\n', " "), &mut items);
        out.extend(items.into_iter().map(|(n, p)| (n, p, export)));
    }
    out
}

/// Paths written in expressions and types (outside `use` items): every `a::b::c` whose first
/// segment is not preceded by `::` or an identifier character.
fn expr_paths(src: &str) -> Vec<String> {
    let mut rest = src;
    let mut code = String::new();
    while let Some(i) = rest.find("use ") {
        let item = i == 0 || rest[..i].ends_with(|c: char| c.is_whitespace() || c == ')');
        let end = if item {
            rest[i..].find(';').map_or(rest.len(), |e| i + e)
        } else {
            i + 4
        };
        code.push_str(&rest[..if item { i } else { end }]);
        rest = &rest[end..];
    }
    code.push_str(rest);
    let src = code.as_str();
    let mut out = Vec::new();
    for (i, _) in src.match_indices("::") {
        let head_start = src[..i].rfind(|c: char| !is_ident(c)).map_or(0, |k| k + 1);
        if head_start == i || src[..head_start].ends_with(':') {
            continue;
        }
        let rest = &src[head_start..];
        let path: String = rest
            .chars()
            .take_while(|&c| is_ident(c) || c == ':')
            .collect();
        out.push(path.trim_end_matches(':').to_string());
    }
    out
}

/// The engine's modules, each with its code and its `use` names (name → absolute path).
struct Crate {
    code: BTreeMap<String, String>,
    names: BTreeMap<String, BTreeMap<String, String>>,
}

fn parent(m: &str) -> &str {
    m.rsplit_once("::").map_or("", |(p, _)| p)
}

fn child(m: &str, c: &str) -> String {
    if m.is_empty() {
        c.to_string()
    } else {
        format!("{m}::{c}")
    }
}

impl Crate {
    fn load() -> Crate {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = BTreeMap::new();
        modules(&root, &root, &mut files);
        let code: BTreeMap<String, String> =
            files.into_iter().map(|(m, s)| (m, code(&s))).collect();
        let mut krate = Crate {
            code,
            names: BTreeMap::new(),
        };
        let mut names = BTreeMap::new();
        for (m, src) in &krate.code {
            let mut map = BTreeMap::new();
            for (alias, path, _) in uses(src) {
                if let Some(abs) = krate.absolute(m, &path, &BTreeMap::new()) {
                    map.insert(alias, abs);
                }
            }
            names.insert(m.clone(), map);
        }
        krate.names = names;
        krate
    }

    /// `path` as written in module `m`, made absolute; `None` when it leaves the crate
    /// (another crate, std) or starts at a local name.
    fn absolute(&self, m: &str, path: &str, imported: &BTreeMap<String, String>) -> Option<String> {
        let mut segs = path.split("::").filter(|s| !s.is_empty());
        let first = segs.next()?;
        let rest: Vec<&str> = segs.collect();
        let mut base = match first {
            "crate" => String::new(),
            "self" => m.to_string(),
            "super" => parent(m).to_string(),
            c if self.code.contains_key(&child(m, c)) => child(m, c),
            c => imported.get(c)?.clone(),
        };
        let mut rest = rest.as_slice();
        while let Some((&"super", tail)) = rest.split_first() {
            base = parent(&base).to_string();
            rest = tail;
        }
        Some(rest.iter().fold(base, |b, s| child(&b, s)))
    }

    /// The module that defines what absolute `path` names, through modules and re-exports.
    fn resolve(&self, path: &str, depth: usize) -> Option<String> {
        let segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
        let mut cur = String::new();
        for (i, s) in segs.iter().enumerate() {
            let next = child(&cur, s);
            if self.code.contains_key(&next) {
                cur = next;
                continue;
            }
            if let Some(target) = self.names.get(&cur).and_then(|n| n.get(*s)) {
                if depth < 16 && target != path {
                    let full = segs[i + 1..]
                        .iter()
                        .fold(target.clone(), |b, s| child(&b, s));
                    return self.resolve(&full, depth + 1);
                }
            }
            break;
        }
        Some(cur)
    }
}

/// Every module's imports: module → (imported module → the first path, as written, that
/// imports it).
fn graph() -> BTreeMap<String, BTreeMap<String, String>> {
    let krate = Crate::load();
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (m, src) in &krate.code {
        let imported = &krate.names[m];
        // A re-export (`pub use`) is resolved through, not counted: its users import the
        // module that defines the item. A module imported as a namespace (`use crate::region;`)
        // counts where a path through it names an item.
        let mut paths: Vec<String> = uses(src)
            .into_iter()
            .filter(|(_, _, export)| !export)
            .filter(|(_, p, _)| {
                let abs = krate.absolute(m, p, imported);
                !abs.is_some_and(|a| krate.code.contains_key(&a) || a.is_empty())
            })
            .map(|(_, p, _)| p)
            .collect();
        paths.extend(expr_paths(src));
        let out = edges.entry(m.clone()).or_default();
        for p in paths {
            let target = krate
                .absolute(m, &p, imported)
                .and_then(|abs| krate.resolve(&abs, 0));
            if let Some(t) = target {
                if &t != m && !t.is_empty() {
                    out.entry(t).or_insert(p);
                }
            }
        }
    }
    edges
}

/// Strongly connected components (Tarjan), largest first.
fn cycles<V>(edges: &BTreeMap<String, BTreeMap<String, V>>) -> Vec<Vec<String>> {
    struct T<'a, V> {
        e: &'a BTreeMap<String, BTreeMap<String, V>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a, V>(t: &mut T<'a, V>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.e.get(v).into_iter().flat_map(|m| m.keys()) {
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
fn no_import_cycle_among_engine_modules_exceeds_a_parent_and_child() {
    let edges = graph();
    assert!(
        edges.len() > 40,
        "found only {} engine modules",
        edges.len()
    );
    let mut unknown = Vec::new();
    let mut seen = BTreeSet::new();
    for c in cycles(&edges).iter().filter(|c| c.len() > MAX_CYCLE) {
        let links: Vec<String> = c
            .iter()
            .flat_map(|m| {
                edges[m]
                    .iter()
                    .filter(|(t, _)| c.contains(t))
                    .map(move |(t, why)| format!("{m} -> {t} ({why})"))
            })
            .collect();
        let text = format!("a cycle of {}:\n  {}", c.len(), links.join("\n  "));
        match REMAINING.iter().find(|(m, _, _)| c.iter().any(|x| x == m)) {
            Some((m, size, why)) if c.len() <= *size => {
                seen.insert(*m);
                println!("{text}\nremains ({why})");
            }
            _ => unknown.push(text),
        }
    }
    assert!(
        unknown.is_empty(),
        "engine modules importing each other in a cycle of more than {MAX_CYCLE}:\n{}",
        unknown.join("\n")
    );
    let stale: Vec<&str> = REMAINING
        .iter()
        .map(|(m, _, _)| *m)
        .filter(|m| !seen.contains(m))
        .collect();
    assert!(
        stale.is_empty(),
        "REMAINING names cycles that are gone (remove them): {stale:?}"
    );
}

#[test]
fn the_cycle_finder_sees_a_cycle() {
    let mut e: BTreeMap<String, BTreeMap<String, ()>> = BTreeMap::new();
    for (a, b) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")] {
        e.entry(a.into()).or_default().insert(b.into(), ());
        e.entry(b.into()).or_default();
    }
    let c = cycles(&e);
    assert_eq!(c[0].len(), 3);
    let mut t = Vec::new();
    use_tree("", "crate::{a::{b, c as d}, e::{self, f}}", &mut t);
    let t: Vec<String> = t.iter().map(|(n, p)| format!("{n}={p}")).collect();
    assert_eq!(
        t,
        [
            "b=crate::a::b",
            "d=crate::a::c",
            "e=crate::e",
            "f=crate::e::f"
        ]
    );
    let stripped = code(
        "let u = \"http://x\"; crate::a::B; // crate::c::D\n'\\''; r#\"crate::e\"#; crate::f::G",
    );
    assert_eq!(expr_paths(&stripped), ["crate::a::B", "crate::f::G"]);
    assert_eq!(
        expr_paths("x = crate::d::e(); y: gdx_base::stats::M; handshake::run()"),
        ["crate::d::e", "gdx_base::stats::M", "handshake::run"]
    );
}

/// Paths resolve from where they are written, through child modules and re-exports.
#[test]
fn paths_resolve_through_children_ancestors_and_re_exports() {
    let mut code = BTreeMap::new();
    for m in [
        "",
        "server",
        "server::handshake",
        "agent_state",
        "error",
        "region",
    ] {
        code.insert(m.to_string(), String::new());
    }
    let mut krate = Crate {
        code,
        names: BTreeMap::new(),
    };
    // region/mod.rs: `pub use crate::error::Error;`
    let reexport = [("Error".to_string(), "error::Error".to_string())];
    krate
        .names
        .insert("region".into(), reexport.into_iter().collect());
    let none = BTreeMap::new();
    let abs = |m: &str, p: &str| krate.absolute(m, p, &none);
    // A bare path from a child module (`use handshake::check_name;` in server/mod.rs).
    assert_eq!(
        abs("server", "handshake::check_name").unwrap(),
        "server::handshake::check_name"
    );
    assert_eq!(
        abs("server::handshake", "super::super::agent_state::X").unwrap(),
        "agent_state::X"
    );
    assert_eq!(
        abs("server", "self::handshake").unwrap(),
        "server::handshake"
    );
    // Another crate, or a name the module did not import: not an engine path.
    assert_eq!(abs("server", "gdx_rdma::Qp"), None);
    assert_eq!(
        krate.resolve("server::handshake::check_name", 0).unwrap(),
        "server::handshake"
    );
    assert_eq!(
        krate.resolve("region::Error::PeerLost", 0).unwrap(),
        "error"
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
