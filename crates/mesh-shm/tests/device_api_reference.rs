//! docs/reference/device-api.md is generated from mesh.cuh's public parts (`include/mesh/*.cuh`): each build option, type, constant and call with the comment at its declaration, grouped by part. This test fails when the committed page differs from what the header makes now (`MESH_BLESS=1 cargo test -p mesh-shm --test device_api_reference` rewrites it), when a public call has no comment, when a function without one is outside `mesh/detail/`, or when an internal function's name lacks the `mesh_detail_` prefix.
//!
//! The generator is this file: a line scanner over the header's own layout (a comment block directly
//! above the declaration it documents), not a C++ parser.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// The public parts, in the page's order.
const PUBLIC: [&str; 4] = ["mesh/core.cuh", "mesh/channel.cuh", "mesh/bulk.cuh", "mesh/service.cuh"];
/// The most lines a file of the header may have.
const MAX_LINES: usize = 1000;
const REGENERATE: &str = "MESH_BLESS=1 cargo test -p mesh-shm --test device_api_reference";

fn include() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("include")
}

fn page_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/reference/device-api.md")
}

fn read(part: &str) -> String {
    std::fs::read_to_string(include().join(part)).unwrap_or_else(|e| panic!("read {part}: {e}"))
}

/// One documented declaration of a part.
#[derive(Debug)]
enum Item {
    Option { name: String, default: String, doc: Vec<String> },
    Constants { defines: Vec<(String, String, String)>, doc: Vec<String> },
    Type { name: String, doc: Vec<String> },
    Call { name: String, signature: String, doc: Vec<String> },
}

/// A part's opening paragraph (its first comment line up to the first empty comment line) and its items.
struct Part {
    intro: Vec<String>,
    items: Vec<Item>,
}

/// The text of a comment line without its `//` and one space.
fn comment_text(line: &str) -> Option<String> {
    let rest = line.strip_prefix("//")?;
    Some(rest.strip_prefix(' ').unwrap_or(rest).to_string())
}

/// The function named in a declaration that starts at `line`, if it is one.
fn function_name(line: &str) -> Option<String> {
    if !line.starts_with("static __device__ ") {
        return None;
    }
    let open = line.find('(')?;
    let name = line[..open].rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).next()?;
    name.starts_with("mesh_").then(|| name.to_string())
}

/// A `#define NAME VALUE // comment` line, split.
fn define(line: &str) -> Option<(String, String, String)> {
    let rest = line.strip_prefix("#define ")?;
    let (code, comment) = match rest.find("//") {
        Some(i) => (&rest[..i], rest[i + 2..].trim().to_string()),
        None => (rest, String::new()),
    };
    let mut words = code.split_whitespace();
    let name = words.next()?.to_string();
    Some((name, words.collect::<Vec<_>>().join(" "), comment))
}

fn parse(text: &str) -> Part {
    let lines: Vec<&str> = text.lines().collect();
    let mut intro = Vec::new();
    for line in &lines {
        match comment_text(line) {
            Some(t) if t.is_empty() => break,
            Some(t) => intro.push(t),
            None => break,
        }
    }
    // The part's own name ("mesh/core.cuh: ...") starts its first line; the page has it as a heading.
    if let Some(first) = intro.first_mut()
        && let Some(i) = first.find(".cuh: ")
    {
        let rest = &first[i + 6..];
        let mut chars = rest.chars();
        *first = chars.next().map_or(String::new(), |c| c.to_uppercase().chain(chars).collect());
    }
    let mut items = Vec::new();
    let mut doc: Vec<String> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if let Some(t) = comment_text(line) {
            doc.push(t);
            i += 1;
            continue;
        }
        let taken = std::mem::take(&mut doc);
        if let Some(name) = line.strip_prefix("#ifndef ").map(str::trim)
            && let Some((defined, default, _)) = lines.get(i + 1).and_then(|l| define(l))
            && defined == name
            && name.starts_with("MESH_")
            && !taken.is_empty()
        {
            items.push(Item::Option { name: name.to_string(), default, doc: taken });
            i += 2;
            continue;
        }
        if define(line).is_some() && !taken.is_empty() {
            let mut defines = Vec::new();
            while let Some(d) = lines.get(i).and_then(|l| define(l)) {
                let mut d = d;
                // A comment continued on the next lines, aligned under the first.
                while let Some(more) = lines.get(i + 1).map(|l| l.trim_start()).and_then(comment_text) {
                    if !lines[i + 1].starts_with(' ') {
                        break;
                    }
                    d.2.push(' ');
                    d.2.push_str(more.trim());
                    i += 1;
                }
                defines.push(d);
                i += 1;
            }
            items.push(Item::Constants { defines, doc: taken });
            continue;
        }
        if line.starts_with("typedef struct") {
            let mut j = i;
            while !lines[j].starts_with('}') {
                j += 1;
            }
            let name = lines[j].trim_start_matches('}').trim().trim_end_matches(';').to_string();
            items.push(Item::Type { name, doc: taken });
            i = j + 1;
            continue;
        }
        if let Some(name) = function_name(line) {
            let mut j = i;
            let mut signature = String::new();
            loop {
                signature.push_str(lines[j].trim());
                signature.push(' ');
                if lines[j].trim_end().ends_with(';') || lines[j].trim_end().ends_with('{') {
                    break;
                }
                j += 1;
            }
            let signature = signature
                .trim()
                .trim_end_matches(['{', ';'])
                .trim()
                .replace("static __device__ __forceinline__ ", "")
                .replace("static __device__ ", "");
            items.push(Item::Call { name, signature, doc: taken });
            i = j + 1;
            continue;
        }
        i += 1;
    }
    Part { intro, items }
}

/// Escapes what Markdown would read as emphasis or a heading, outside code spans.
fn escape(text: &str) -> String {
    let mut out = String::new();
    for (k, piece) in text.split('`').enumerate() {
        if k > 0 {
            out.push('`');
        }
        if k % 2 == 1 {
            out.push_str(piece);
        } else {
            out.push_str(&piece.replace('*', "\\*").replace("__", "\\_\\_").replace('<', "&lt;"));
        }
    }
    out
}

/// A comment block as Markdown: its sentences as paragraphs, its indented lists as lists.
fn prose(doc: &[String]) -> String {
    let mut blocks: Vec<(bool, String)> = Vec::new(); // (a list item, text)
    for line in doc {
        let text = line.trim_start();
        let indent = line.len() - text.len();
        if text.is_empty() {
            blocks.push((false, String::new()));
            continue;
        }
        let marker = text.strip_prefix("* ").or_else(|| {
            let digits = text.chars().take_while(char::is_ascii_digit).count();
            (digits > 0 && text[digits..].starts_with(". ")).then(|| &text[digits + 2..])
        });
        match (marker, indent, blocks.last_mut()) {
            (Some(item), _, _) => blocks.push((true, item.to_string())),
            (None, 1..=3, _) => blocks.push((true, text.to_string())),
            (None, 0, Some((true, _))) => blocks.push((false, text.to_string())),
            (None, _, Some((_, last))) if !last.is_empty() => {
                last.push(' ');
                last.push_str(text);
            }
            _ => blocks.push((false, text.to_string())),
        }
    }
    let mut out = String::new();
    let mut was_list = false;
    for (list, text) in blocks.iter().filter(|(_, t)| !t.is_empty()) {
        if !out.is_empty() {
            out.push_str(if *list && was_list { "\n" } else { "\n\n" });
        }
        if *list {
            out.push_str("- ");
        }
        out.push_str(&escape(text));
        was_list = *list;
    }
    out
}

/// The page, generated from the header as it stands.
fn generate() -> String {
    let mut out = String::new();
    out.push_str("# Device API reference: mesh.cuh\n\n");
    let _ = writeln!(
        out,
        "Generated from the comments of the CUDA header's public parts (`crates/mesh-shm/include/mesh/*.cuh`) by \
         `{REGENERATE}`: edit the header, not this page.\n"
    );
    out.push_str(
        "A program includes `mesh.cuh` for everything, or only the parts it uses (each part includes what it \
         needs). Names starting with `mesh_detail_` (in `mesh/detail/`) are internal and may change. Build options \
         are defined before the include, e.g. `#define MESH_PUBLISH_ON_DRAIN 0`.\n",
    );
    for part in PUBLIC {
        let parsed = parse(&read(part));
        let _ = writeln!(out, "\n## {part}\n\n{}", prose(&parsed.intro));
        let section = |out: &mut String, title: &str, want: fn(&Item) -> bool| {
            let chosen: Vec<&Item> = parsed.items.iter().filter(|i| want(i)).collect();
            if chosen.is_empty() {
                return;
            }
            let _ = writeln!(out, "\n### {title}");
            for item in chosen {
                match item {
                    Item::Option { name, default, doc } => {
                        let _ =
                            writeln!(out, "\n- `{name}` (default `{default}`): {}", prose(doc).replace('\n', "\n  "));
                    }
                    Item::Constants { defines, doc } => {
                        let _ = writeln!(out, "\n{}\n", prose(doc));
                        for (name, value, comment) in defines {
                            let what =
                                if comment.is_empty() { String::new() } else { format!(": {}", escape(comment)) };
                            let _ = writeln!(out, "- `{name}` = `{value}`{what}");
                        }
                    }
                    Item::Type { name, doc } => {
                        let _ = writeln!(out, "\n#### `{name}`\n\n{}", prose(doc));
                    }
                    Item::Call { name, signature, doc } => {
                        let _ = writeln!(out, "\n#### `{name}`\n\n`{signature}`\n\n{}", prose(doc));
                    }
                }
            }
        };
        section(&mut out, "Build options", |i| matches!(i, Item::Option { .. }));
        section(&mut out, "Constants", |i| matches!(i, Item::Constants { .. }));
        section(&mut out, "Types", |i| matches!(i, Item::Type { .. }));
        section(&mut out, "Calls", |i| matches!(i, Item::Call { .. }));
    }
    out
}

#[test]
fn the_committed_device_api_reference_is_what_the_header_generates() {
    let expected = generate();
    let path = page_path();
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current != expected {
        if std::env::var_os("MESH_BLESS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).expect("create docs/reference");
            std::fs::write(&path, &expected).expect("write docs/reference/device-api.md");
            return;
        }
        let first = current.lines().zip(expected.lines()).position(|(a, b)| a != b);
        panic!(
            "docs/reference/device-api.md differs from what mesh.cuh's comments generate (first differing line: {}); \
             regenerate it with `{REGENERATE}`",
            first.map_or("past the shorter one's end".to_string(), |n| (n + 1).to_string())
        );
    }
}

/// Every public call has its contract at its declaration, once; internals are outside the public parts.
#[test]
fn every_public_call_is_documented_once_and_every_internal_is_under_detail() {
    let mut documented: BTreeMap<String, usize> = BTreeMap::new(); // signature -> declarations with a comment
    let mut public_names = std::collections::BTreeSet::new();
    for part in PUBLIC {
        for item in parse(&read(part)).items {
            if let Item::Call { name, signature, doc } = item {
                assert!(!doc.is_empty(), "{part}: {name} is declared without a comment saying its contract");
                assert!(!name.starts_with("mesh_detail_"), "{part}: the internal {name} is declared in a public part");
                *documented.entry(signature).or_default() += 1;
                public_names.insert(name);
            }
        }
    }
    for (signature, count) in &documented {
        assert_eq!(*count, 1, "`{signature}` is documented {count} times in the public parts");
    }
    assert!(public_names.len() >= 50, "only {} public calls found: {public_names:?}", public_names.len());
    // The umbrella declares nothing; the detail files define the public calls and internals only.
    assert!(parse(&read("mesh.cuh")).items.iter().all(|i| !matches!(i, Item::Call { .. })), "mesh.cuh declares a call");
    let mut detail: Vec<_> = std::fs::read_dir(include().join("mesh/detail"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().to_string()))
        .collect();
    detail.sort();
    for file in detail {
        let text = read(&format!("mesh/detail/{file}"));
        for line in text.lines() {
            if let Some(name) = function_name(line) {
                assert!(
                    name.starts_with("mesh_detail_") || public_names.contains(&name),
                    "mesh/detail/{file}: {name} is neither a documented public call nor named mesh_detail_"
                );
            }
        }
    }
}

/// No file of the header passes MAX_LINES lines, and every one is listed in `device_header::PARTS` (what
/// the crate embeds).
#[test]
fn every_header_file_is_small_and_listed() {
    let mut files = vec!["mesh.cuh".to_string()];
    for dir in ["mesh", "mesh/detail"] {
        for e in std::fs::read_dir(include().join(dir)).unwrap().flatten() {
            if e.path().is_file() {
                files.push(format!("{dir}/{}", e.file_name().to_string_lossy()));
            }
        }
    }
    let listed: Vec<&str> = mesh_shm::device_header::PARTS.iter().map(|(name, _)| *name).collect();
    for file in &files {
        let lines = read(file).lines().count();
        assert!(lines <= MAX_LINES, "{file} has {lines} lines; a part has {MAX_LINES} at most");
        assert!(listed.contains(&file.as_str()), "{file} is missing from device_header::PARTS");
        let embedded = mesh_shm::device_header::PARTS.iter().find(|(name, _)| name == file).unwrap().1;
        assert_eq!(embedded, read(file), "{file}: the embedded copy is stale: rebuild");
    }
    assert_eq!(files.len(), listed.len(), "device_header::PARTS lists a file that is gone: {listed:?}");
}
