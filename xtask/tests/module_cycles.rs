//! No module circles in any crate of the workspace: the files under each crate's `src/` never import
//! each other through a loop; and no source file outside tests is over 800 lines.
//!
//! An edge `a.rs -> b.rs` is any path in `a.rs` that names a module of `b.rs` or an item in it:
//! `use crate::…`, `use super::…`, `use self::…`, a child module's name, and the same paths written
//! inline (`super::services::create(…)`). Declaring a child (`mod x;`) is not an edge: only using it
//! is. Comments and string literals are skipped, so a doc link is not an import. A loop found is
//! printed file by file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One token of Rust source, as far as paths need: an identifier, `::`, or one punctuation character.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
}

/// `src`'s tokens, without comments, string and character literals, or lifetimes.
fn tokens(src: &str) -> Vec<Tok> {
    let s: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let ident_start = |c: char| c.is_alphabetic() || c == '_';
    let ident_char = |c: char| c.is_alphanumeric() || c == '_';
    while i < s.len() {
        let c = s[i];
        let next = s.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            // Block comments nest in Rust.
            let mut depth = 0;
            while i < s.len() {
                if s[i] == '/' && s.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if s[i] == '*' && s.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == '"' {
            i = skip_string(&s, i + 1);
        } else if (c == 'r' || c == 'b') && raw_string_start(&s, i).is_some() {
            let (hashes, body) = raw_string_start(&s, i).unwrap_or_default();
            i = skip_raw_string(&s, body, hashes);
        } else if c == 'b' && next == Some('"') {
            i = skip_string(&s, i + 2);
        } else if c == 'b' && next == Some('\'') {
            i = skip_char(&s, i + 1);
        } else if c == '\'' {
            i = skip_char(&s, i);
        } else if ident_start(c) {
            let start = i;
            while i < s.len() && ident_char(s[i]) {
                i += 1;
            }
            let mut word: String = s[start..i].iter().collect();
            if word == "r" && s.get(i) == Some(&'#') {
                // A raw identifier, `r#type`.
                let from = i + 1;
                i = from;
                while i < s.len() && ident_char(s[i]) {
                    i += 1;
                }
                word = s[from..i].iter().collect();
            }
            out.push(Tok::Ident(word));
        } else if c == ':' && next == Some(':') {
            out.push(Tok::PathSep);
            i += 2;
        } else {
            if !c.is_whitespace() {
                out.push(Tok::Punct(c));
            }
            i += 1;
        }
    }
    out
}

/// Past a string literal whose body starts at `i` (escapes honoured).
fn skip_string(s: &[char], mut i: usize) -> usize {
    while i < s.len() {
        match s[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// At `r"`, `r#"`, `br"`…: the number of `#` and where the body starts.
fn raw_string_start(s: &[char], i: usize) -> Option<(usize, usize)> {
    if i > 0 && (s[i - 1].is_alphanumeric() || s[i - 1] == '_') {
        return None;
    }
    let mut j = i;
    if s[j] == 'b' {
        j += 1;
    }
    if s.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while s.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    (s.get(j) == Some(&'"')).then_some((hashes, j + 1))
}

fn skip_raw_string(s: &[char], mut i: usize, hashes: usize) -> usize {
    while i < s.len() {
        if s[i] == '"' && (1..=hashes).all(|k| s.get(i + k) == Some(&'#')) {
            return i + 1 + hashes;
        }
        i += 1;
    }
    i
}

/// Past a character literal at `i` (`'a'`, `'\n'`, `'\''`), or past the quote of a lifetime (`'a`).
fn skip_char(s: &[char], i: usize) -> usize {
    match (s.get(i + 1), s.get(i + 2)) {
        (Some('\\'), _) => {
            let mut j = i + 3;
            while j < s.len() && s[j] != '\'' {
                j += 1;
            }
            j + 1
        }
        (Some(_), Some('\'')) => i + 3,
        _ => i + 1,
    }
}

/// A module of the crate: the file it is written in and its children by name.
#[derive(Debug, Default)]
struct Module {
    file: PathBuf,
    children: BTreeSet<String>,
}

/// Every module of the crates rooted at `src/lib.rs` and `src/main.rs`, by its path from its crate
/// root (the root's first segment names the root file, so that the two crates never mix).
struct Tree {
    modules: BTreeMap<Vec<String>, Module>,
    /// Each file's token stream and the module path it starts in.
    files: Vec<(PathBuf, Vec<String>, Vec<Tok>)>,
}

impl Tree {
    fn load(src: &Path) -> Result<Self, String> {
        let mut tree = Tree { modules: BTreeMap::new(), files: Vec::new() };
        for root in ["lib.rs", "main.rs"] {
            let file = src.join(root);
            if file.exists() {
                tree.add_file(&file, vec![root.to_string()], true)?;
            }
        }
        if tree.files.is_empty() {
            return Err(format!("{}: neither lib.rs nor main.rs", src.display()));
        }
        Ok(tree)
    }

    /// Reads `file` as module `path`, and every child module it declares, recursively.
    fn add_file(&mut self, file: &Path, path: Vec<String>, owns_dir: bool) -> Result<(), String> {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let toks = tokens(&text);
        // The directory a file's `mod x;` children live in: its own for lib.rs, main.rs and mod.rs,
        // else the one named after it.
        let dir =
            if owns_dir { file.parent().map(Path::to_path_buf).unwrap_or_default() } else { file.with_extension("") };
        self.modules.insert(path.clone(), Module { file: file.to_path_buf(), children: BTreeSet::new() });
        let mut inline: Vec<(String, usize)> = Vec::new();
        let mut depth = 0usize;
        let mut declared: Vec<(Vec<String>, String)> = Vec::new();
        let mut i = 0;
        while i < toks.len() {
            match &toks[i] {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => {
                    depth = depth.saturating_sub(1);
                    if inline.last().is_some_and(|(_, d)| *d == depth) {
                        inline.pop();
                    }
                }
                Tok::Ident(m) if m == "mod" => {
                    if let (Some(Tok::Ident(name)), Some(after)) = (toks.get(i + 1), toks.get(i + 2)) {
                        let mut here = path.clone();
                        here.extend(inline.iter().map(|(n, _)| n.clone()));
                        self.modules.entry(here.clone()).or_default().children.insert(name.clone());
                        let mut child = here.clone();
                        child.push(name.clone());
                        match after {
                            Tok::Punct(';') => declared.push((child, name.clone())),
                            Tok::Punct('{') => {
                                self.modules
                                    .insert(child, Module { file: file.to_path_buf(), children: BTreeSet::new() });
                                inline.push((name.clone(), depth));
                                depth += 1;
                                i += 3;
                                continue;
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
            i += 1;
        }
        let depth_of_children = path.len() + 1;
        self.files.push((file.to_path_buf(), path, toks));
        for (child, name) in declared {
            // A `mod x;` inside an inline module would live in a deeper directory: not followed.
            if child.len() != depth_of_children {
                return Err(format!("{}: `mod {name};` inside an inline module is not followed", file.display()));
            }
            let flat = dir.join(format!("{name}.rs"));
            let nested = dir.join(&name).join("mod.rs");
            if flat.exists() {
                self.add_file(&flat, child, false)?;
            } else if nested.exists() {
                self.add_file(&nested, child, true)?;
            } else {
                return Err(format!("{}: `mod {name};` has no file {}", file.display(), flat.display()));
            }
        }
        Ok(())
    }

    /// The file that holds what `segments` name, seen from module `here`; `None` for a path that
    /// leaves the crate (another crate, a type, a local item).
    fn resolve(&self, here: &[String], segments: &[String]) -> Option<&Path> {
        let first = segments.first()?;
        let (mut at, rest): (Vec<String>, &[String]) = match first.as_str() {
            "crate" => (here[..1].to_vec(), &segments[1..]),
            "self" => (here.to_vec(), &segments[1..]),
            "super" => {
                let mut at = here.to_vec();
                let mut k = 0;
                while segments.get(k).is_some_and(|s| s == "super") {
                    if at.len() <= 1 {
                        return None;
                    }
                    at.pop();
                    k += 1;
                }
                (at, &segments[k..])
            }
            name if self.modules.get(here).is_some_and(|m| m.children.contains(name)) => (here.to_vec(), segments),
            _ => return None,
        };
        for seg in rest {
            match self.modules.get(&at) {
                Some(m) if m.children.contains(seg) => at.push(seg.clone()),
                _ => break,
            }
        }
        self.modules.get(&at).map(|m| m.file.as_path())
    }

    /// Every file's imports of the crate's other files.
    fn edges(&self) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
        let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
        for (file, path, toks) in &self.files {
            edges.entry(file.clone()).or_default();
            let mut inline: Vec<(String, usize)> = Vec::new();
            let mut depth = 0usize;
            let mut i = 0;
            while i < toks.len() {
                let mut here = path.clone();
                here.extend(inline.iter().map(|(n, _)| n.clone()));
                let mut found: Vec<Vec<String>> = Vec::new();
                match &toks[i] {
                    Tok::Punct('{') => depth += 1,
                    Tok::Punct('}') => {
                        depth = depth.saturating_sub(1);
                        if inline.last().is_some_and(|(_, d)| *d == depth) {
                            inline.pop();
                        }
                    }
                    Tok::Ident(m) if m == "mod" => {
                        if let (Some(Tok::Ident(name)), Some(Tok::Punct('{'))) = (toks.get(i + 1), toks.get(i + 2)) {
                            inline.push((name.clone(), depth));
                            depth += 1;
                            i += 3;
                            continue;
                        }
                        // `mod x;`: a declaration, not a use.
                        i += 2;
                        continue;
                    }
                    Tok::Ident(u) if u == "use" => {
                        let end = toks[i..].iter().position(|t| *t == Tok::Punct(';')).map_or(toks.len(), |p| i + p);
                        use_tree(&toks[i + 1..end], &[], &mut found);
                        i = end;
                    }
                    Tok::Ident(_)
                        if (i == 0 || toks[i - 1] != Tok::PathSep) && toks.get(i + 1) == Some(&Tok::PathSep) =>
                    {
                        let mut segs = Vec::new();
                        let mut j = i;
                        while let Some(Tok::Ident(s)) = toks.get(j) {
                            segs.push(s.clone());
                            if toks.get(j + 1) != Some(&Tok::PathSep) {
                                break;
                            }
                            j += 2;
                        }
                        found.push(segs);
                    }
                    _ => {}
                }
                for segs in found {
                    if let Some(target) = self.resolve(&here, &segs)
                        && target != file.as_path()
                    {
                        edges.entry(file.clone()).or_default().insert(target.to_path_buf());
                    }
                }
                i += 1;
            }
        }
        edges
    }
}

/// The paths of a `use` tree (`a::{b, c::{d as e, *}}`), each from the tree's root.
fn use_tree(toks: &[Tok], prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut segs: Vec<String> = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Ident(a) if a == "as" => i += 1,
            Tok::Ident(s) if s == "pub" || s == "use" => {}
            Tok::Ident(s) => segs.push(s.clone()),
            Tok::PathSep => {}
            Tok::Punct('{') => {
                // The group's body up to its matching brace, split at its top-level commas.
                let mut depth = 0;
                let mut j = i;
                while j < toks.len() {
                    match toks[j] {
                        Tok::Punct('{') => depth += 1,
                        Tok::Punct('}') => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
                let body = &toks[i + 1..j.min(toks.len())];
                let mut base = prefix.to_vec();
                base.extend(segs.iter().cloned());
                let mut start = 0;
                let mut d = 0;
                for (k, t) in body.iter().enumerate() {
                    match t {
                        Tok::Punct('{') => d += 1,
                        Tok::Punct('}') => d -= 1,
                        Tok::Punct(',') if d == 0 => {
                            use_tree(&body[start..k], &base, out);
                            start = k + 1;
                        }
                        _ => {}
                    }
                }
                use_tree(&body[start..], &base, out);
                return;
            }
            Tok::Punct(',') | Tok::Punct('*') | Tok::Punct('(') | Tok::Punct(')') => {}
            Tok::Punct(_) => {}
        }
        i += 1;
    }
    // `a::{self}` names `a`.
    if segs.last().is_some_and(|s| s == "self") && !(prefix.is_empty() && segs.len() == 1) {
        segs.pop();
    }
    let mut path = prefix.to_vec();
    path.extend(segs);
    if !path.is_empty() {
        out.push(path);
    }
}

/// One loop for every group of files that import each other: the files in order, the first
/// repeated at its end; and every file of that group.
fn cycles(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<(Vec<PathBuf>, Vec<PathBuf>)> {
    let reaches = |from: &PathBuf| -> BTreeMap<PathBuf, PathBuf> {
        // Breadth first: each file reached, with the file it was reached from.
        let mut parent = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([from.clone()]);
        while let Some(f) = queue.pop_front() {
            for t in edges.get(&f).into_iter().flatten() {
                if !parent.contains_key(t) {
                    parent.insert(t.clone(), f.clone());
                    queue.push_back(t.clone());
                }
            }
        }
        parent
    };
    let mut seen: BTreeSet<PathBuf> = BTreeSet::new();
    let mut loops = Vec::new();
    for start in edges.keys() {
        if seen.contains(start) {
            continue;
        }
        let parent = reaches(start);
        if !parent.contains_key(start) {
            continue;
        }
        // The shortest way back to `start`, walked backwards.
        let mut path = vec![start.clone()];
        let mut at = parent[start].clone();
        while at != *start {
            path.push(at.clone());
            at = parent[&at].clone();
        }
        path.push(start.clone());
        path.reverse();
        // Every file on a loop with `start` is reported with it, once.
        let group: Vec<PathBuf> = edges
            .keys()
            .filter(|f| *f == start || parent.contains_key(*f) && reaches(f).contains_key(start))
            .cloned()
            .collect();
        seen.extend(group.iter().cloned());
        loops.push((path, group));
    }
    loops
}

/// `files` relative to `src`, joined by `sep`.
fn show(files: &[PathBuf], src: &Path, sep: &str) -> String {
    files.iter().map(|p| p.strip_prefix(src).unwrap_or(p).display().to_string()).collect::<Vec<_>>().join(sep)
}

/// Every workspace member's `src/`: the crates, the GPU test crate, xtask and the native Rust example.
fn workspace_sources() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace root").to_path_buf();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("the crates folder")
        .filter_map(|e| e.ok().map(|e| e.path().join("src")))
        .filter(|p| p.is_dir())
        .collect();
    dirs.extend(["tests/src", "xtask/src", "examples/native-rust/src"].map(|d| root.join(d)));
    dirs.sort();
    dirs
}

#[test]
fn no_two_files_of_a_crate_import_each_other_through_any_path() {
    let mut shown = Vec::new();
    let dirs = workspace_sources();
    assert!(dirs.len() >= 10, "found only {} crates: {dirs:?}", dirs.len());
    for src in &dirs {
        let tree = Tree::load(src).unwrap_or_else(|e| panic!("reading the modules under {}: {e}", src.display()));
        let edges = tree.edges();
        assert!(!edges.is_empty(), "found no file under {}", src.display());
        for (l, group) in cycles(&edges) {
            shown.push(format!(
                "{}: {}  (the circle's files: {})",
                src.display(),
                show(&l, src, " -> "),
                show(&group, src, ", ")
            ));
        }
    }
    assert!(shown.is_empty(), "module circles:\n  {}", shown.join("\n  "));
}

/// Rust files under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_source_file_outside_tests_is_over_800_lines() {
    let mut long = Vec::new();
    for src in workspace_sources() {
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for f in files {
            // A `tests.rs` holds one crate's `#[cfg(test)]` module: tests, which may be long.
            if f.file_name().is_some_and(|n| n == "tests.rs") {
                continue;
            }
            let lines = std::fs::read_to_string(&f).map(|t| t.lines().count()).unwrap_or(0);
            if lines > 800 {
                long.push(format!("{} ({lines} lines)", f.display()));
            }
        }
    }
    assert!(long.is_empty(), "split these by job: {long:?}");
}

#[test]
fn the_finder_sees_a_planted_circle_and_ignores_comments_and_strings() {
    let dir = std::env::temp_dir().join(format!("module-cycles-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("outer")).expect("a temp dir");
    let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).expect("writing a planted file");
    write("lib.rs", "mod outer;\nmod low;\npub use outer::Thing;\n");
    write("outer.rs", "mod inner;\npub struct Thing;\nfn f() { inner::g(); }\n");
    write("outer/inner.rs", "use super::super::low::{self, Low as L};\npub fn g() {}\n");
    write(
        "low.rs",
        "//! see crate::outer::Thing\npub struct Low;\nconst S: &str = \"crate::outer::Thing\";\n\
         const R: &str = r#\"super::outer\"#;\nfn h<'a>(_: &'a str) -> char { '\"' }\n",
    );
    let tree = Tree::load(&dir).expect("the planted tree loads");
    let edges = tree.edges();
    let low = dir.join("low.rs");
    assert!(edges[&low].is_empty(), "comments, strings and a char literal are not imports: {:?}", edges[&low]);
    assert!(edges[&dir.join("outer/inner.rs")].contains(&low), "`super::super::low` reaches low.rs");
    assert!(cycles(&edges).is_empty(), "no loop yet: {:?}", cycles(&edges));

    // Now low.rs names the outer module: lib.rs is out of it, outer -> inner -> low -> outer is a loop.
    write("low.rs", "pub struct Low;\nfn k() -> crate::outer::Thing { crate::outer::Thing }\n");
    let edges = Tree::load(&dir).expect("the planted tree loads").edges();
    let loops = cycles(&edges);
    assert_eq!(loops.len(), 1, "one loop: {loops:?}");
    assert_eq!(show(&loops[0].0, &dir, " -> "), "low.rs -> outer.rs -> outer/inner.rs -> low.rs");
    assert_eq!(show(&loops[0].1, &dir, ", "), "low.rs, outer/inner.rs, outer.rs", "lib.rs is outside the loop");
    let _ = std::fs::remove_dir_all(&dir);
}
