//! The shape of mesh-shm's source: its modules import one another in one direction only (no file
//! reaches itself through a chain of `crate::`, `super::`, `self::` or child-module paths), and no
//! source file outside tests is over 800 lines.
//!
//! A circle between modules means neither can be read, tested or moved without the other; the layout
//! (sizes and offsets) sits at the bottom, the ring protocols above it, the fan-in and group formats
//! above those, the mailbox and the host ends on top. Each file's code is scanned as text, comments
//! left out, so a doc link does not count as an import.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path inside the crate: `[]` is the crate root, `["fanin", "memory"]` is `fanin::memory`.
type Module = Vec<String>;

/// Longest a source file may be, tests aside.
const MAX_LINES: usize = 800;

/// Every `.rs` file under `dir`, by the module it defines (`lib.rs` and `mod.rs` name their directory's).
fn modules(dir: &Path, prefix: &Module, out: &mut BTreeMap<Module, PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).expect("UTF-8 file names").to_string();
        if path.is_dir() {
            let mut sub = prefix.clone();
            sub.push(name);
            modules(&path, &sub, out);
        } else if let Some(stem) = name.strip_suffix(".rs") {
            let mut module = prefix.clone();
            if stem != "mod" && !(prefix.is_empty() && stem == "lib") {
                module.push(stem.to_string());
            }
            out.insert(module, path);
        }
    }
}

/// `text` without its comments (`//` to the end of the line, outside string literals) and without
/// the contents of its string literals (a path in a message is not an import).
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_str = false;
        let mut escaped = false;
        let mut prev = '\0';
        for c in line.chars() {
            if in_str {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == '"' {
                    in_str = false;
                    out.push('"');
                }
                prev = c;
                continue;
            }
            if c == '/' && prev == '/' {
                out.pop();
                break;
            }
            if c == '"' && prev != '\'' {
                in_str = true;
            }
            out.push(c);
            prev = c;
        }
        out.push('\n');
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths that start at `start` (just past a `crate::`, `super::`, `self::` or `child::`): each a
/// list of identifiers, one per `use` group member where the path opens a `{...}` group.
fn path_at(code: &str, start: usize) -> Vec<Vec<String>> {
    let rest = &code[start..];
    let mut segs = Vec::new();
    let mut i = 0;
    loop {
        let ident: String = rest[i..].chars().take_while(|&c| is_ident(c)).collect();
        if ident.is_empty() {
            break;
        }
        i += ident.len();
        segs.push(ident);
        if rest[i..].starts_with("::") {
            i += 2;
        } else {
            break;
        }
    }
    if !rest[i..].starts_with('{') {
        return vec![segs];
    }
    // A group: `a::{b, c::d, self}`, one level deep is all this crate writes.
    let end = rest[i..].find('}').map_or(rest.len(), |e| i + e);
    rest[i + 1..end]
        .split(',')
        .map(|item| {
            let mut path = segs.clone();
            path.extend(
                item.trim()
                    .split("::")
                    .map(str::trim)
                    .filter(|s| !s.is_empty() && *s != "self")
                    .map(|s| s.chars().take_while(|&c| is_ident(c)).collect::<String>()),
            );
            path
        })
        .collect()
}

/// The modules `module`'s code refers to, among `known`. Paths inside an inline module (`mod tests
/// { use super::*; }`) are resolved from it, so its `super` is the file's own module.
fn imports(module: &Module, code: &str, known: &BTreeMap<Module, PathBuf>) -> BTreeSet<Module> {
    let children: BTreeSet<&str> = known
        .keys()
        .filter(|m| m.len() == module.len() + 1 && m.starts_with(module))
        .map(|m| m[m.len() - 1].as_str())
        .collect();
    let mut found = BTreeSet::new();
    let bytes = code.as_bytes();
    // The inline modules open at this point, with the brace depth each opened at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut at = 0;
    while at < code.len() {
        let word: String = code[at..].chars().take_while(|&c| is_ident(c)).collect();
        if word.is_empty() {
            let c = code[at..].chars().next().expect("inside the text");
            match c {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if inline.last().is_some_and(|&(_, d)| d == depth) {
                        inline.pop();
                    }
                }
                _ => {}
            }
            at += c.len_utf8();
            continue;
        }
        let after = at + word.len();
        if word == "mod" {
            let rest = code[after..].trim_start();
            let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
            if !name.is_empty() && rest[name.len()..].trim_start().starts_with('{') {
                inline.push((name, depth));
            }
        }
        let here: Module = module.iter().cloned().chain(inline.iter().map(|(n, _)| n.clone())).collect();
        let starts_path =
            (at == 0 || !(is_ident(bytes[at - 1] as char) || bytes[at - 1] == b':')) && code[after..].starts_with("::");
        let base: Option<Module> = match word.as_str() {
            _ if !starts_path => None,
            "crate" => Some(Vec::new()),
            "self" => Some(here.clone()),
            "super" => Some(here[..here.len().saturating_sub(1)].to_vec()),
            w if inline.is_empty() && children.contains(w) => {
                let mut m = module.clone();
                m.push(w.to_string());
                Some(m)
            }
            _ => None,
        };
        if let Some(mut base) = base {
            let mut from = after + 2;
            // `super::super::x`: climb once more for each further `super`.
            while word == "super" && code[from..].starts_with("super::") {
                base.pop();
                from += "super::".len();
            }
            for path in path_at(code, from) {
                let full: Module = base.iter().cloned().chain(path).collect();
                let target = (0..=full.len()).rev().map(|n| full[..n].to_vec()).find(|m| known.contains_key(m));
                if let Some(target) = target.filter(|t| t != module) {
                    found.insert(target);
                }
            }
        }
        at = after;
    }
    found
}

/// The import graph of the crate's source: each module and the modules it refers to.
fn graph() -> (BTreeMap<Module, PathBuf>, BTreeMap<Module, BTreeSet<Module>>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut known = BTreeMap::new();
    modules(&src, &Vec::new(), &mut known);
    let edges = known
        .iter()
        .map(|(m, path)| {
            let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (m.clone(), imports(m, &code_of(&text), &known))
        })
        .collect();
    (known, edges)
}

/// A cycle of the graph, as the modules along it (first repeated last), if it has one.
fn find_cycle(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit(
        m: &Module,
        edges: &BTreeMap<Module, BTreeSet<Module>>,
        marks: &mut BTreeMap<Module, Mark>,
        stack: &mut Vec<Module>,
    ) -> Option<Vec<Module>> {
        marks.insert(m.clone(), Mark::Open);
        stack.push(m.clone());
        for next in edges.get(m).into_iter().flatten() {
            match marks.get(next).copied().unwrap_or(Mark::New) {
                Mark::Open => {
                    let from = stack.iter().position(|s| s == next).expect("an open module is on the stack");
                    let mut cycle = stack[from..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Mark::New => {
                    if let Some(c) = visit(next, edges, marks, stack) {
                        return Some(c);
                    }
                }
                Mark::Done => {}
            }
        }
        stack.pop();
        marks.insert(m.clone(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for m in edges.keys() {
        if marks.get(m).copied().unwrap_or(Mark::New) == Mark::New
            && let Some(c) = visit(m, edges, &mut marks, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

fn name(m: &Module) -> String {
    if m.is_empty() { "crate".into() } else { m.join("::") }
}

fn module(path: &str) -> Module {
    path.split("::").filter(|s| !s.is_empty()).map(str::to_string).collect()
}

#[test]
fn no_two_modules_import_each_other_through_any_path() {
    let (_, edges) = graph();
    if let Some(cycle) = find_cycle(&edges) {
        let names: Vec<String> = cycle.iter().map(name).collect();
        panic!("a circle of imports: {}", names.join(" -> "));
    }
}

#[test]
fn the_scan_sees_the_imports_the_source_writes() {
    let (known, edges) = graph();
    // A scan that found nothing would pass the test above for nothing: these edges are written in the
    // source (a `use crate::`, a `super::` from a submodule, a child module named from its parent).
    for (from, to) in [
        ("ring", "indices"),
        ("ring", "layout"),
        ("mailbox::table", "layout"),
        ("mailbox", "mailbox::slots"),
        ("", "mailbox"),
    ] {
        let (from, to) = (module(from), module(to));
        assert!(known.contains_key(&from) && known.contains_key(&to), "{} or {} moved", name(&from), name(&to));
        assert!(edges[&from].contains(&to), "{} -> {} not seen; it saw {:?}", name(&from), name(&to), edges[&from]);
    }
    assert!(!edges[&module("layout")].iter().any(|m| !m.is_empty()), "layout imports no module of the crate");
}

#[test]
fn the_scan_finds_a_circle_through_a_submodule_and_ignores_comments_and_strings() {
    let known: BTreeMap<Module, PathBuf> =
        ["", "a", "a::b", "c"].into_iter().map(|m| (module(m), PathBuf::new())).collect();
    let a = code_of("pub use b::Thing; // crate::c::X\nconst S: &str = \"crate::c::Y\";\n");
    let b = code_of("use super::super::c::{self, Z};\nmod tests {\n    use super::*;\n}\n");
    let c = code_of("use crate::a::{b::Thing, Other};\n");
    let edges: BTreeMap<Module, BTreeSet<Module>> = [("a", &a), ("a::b", &b), ("c", &c)]
        .into_iter()
        .map(|(m, code)| (module(m), imports(&module(m), code, &known)))
        .collect();
    assert_eq!(edges[&module("a")], BTreeSet::from([module("a::b")]), "the comment and the string are not imports");
    assert_eq!(edges[&module("a::b")], BTreeSet::from([module("c")]));
    assert_eq!(edges[&module("c")], BTreeSet::from([module("a::b"), module("a")]));
    let cycle = find_cycle(&edges).expect("a::b -> c -> a::b is a circle");
    assert!(cycle.contains(&module("a::b")) && cycle.contains(&module("c")), "{cycle:?}");
    let mut acyclic = edges.clone();
    acyclic.insert(module("a::b"), BTreeSet::new());
    assert_eq!(find_cycle(&acyclic), None);
}

#[test]
fn no_source_file_outside_tests_is_over_800_lines() {
    let (known, _) = graph();
    let long: Vec<String> = known
        .values()
        .filter(|p| p.file_name().and_then(|n| n.to_str()) != Some("tests.rs"))
        .filter_map(|p| {
            let lines = std::fs::read_to_string(p).expect("readable").lines().count();
            (lines > MAX_LINES).then(|| format!("{} ({lines} lines)", p.display()))
        })
        .collect();
    assert!(long.is_empty(), "over {MAX_LINES} lines: {long:?}");
}
