//! The docs' code blocks, built or run: every fenced block in README.md and docs/**/*.md is an include of a file that must match it, a shell snippet run here against meshd over a stand-in backend, or a Python snippet that crates/mesh-py/tests/test_docs.py runs; an unmarked block fails.
//!
//! The convention, written where a block opens (the nearest line above it that is not blank):
//!
//! - `<!-- include: PATH -->`: the block is the whole file PATH (relative to the repository root);
//! - `<!-- include: PATH#NAME -->`: the block is the lines of PATH between the lines that carry
//!   `doc:begin NAME` and `doc:end NAME` (in a comment of the file's language; those two lines left out);
//! - `<!-- run: sh -->`: a shell snippet, run here with `bash -euo pipefail` in the repository root,
//!   with this build's `meshd` first on PATH and `MESHD_SOCKET` naming a meshd of its own that serves the
//!   real control socket and mailbox over the stand-in backend (no GPU: a loaded program runs no kernel);
//! - `<!-- run: python -->`: a Python snippet, run by pytest (crates/mesh-py/tests/test_docs.py).
//!
//! Shell that needs a GPU (building and loading a real program) is a script under examples/ that the
//! GPU run executes (tests/gpu-run.sh, `examples`); here every such script is checked with `bash -n`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mesh_shm::{CreateMode, Mailbox, MailboxConfig};
use meshd::server::{Limits, Opened, Server};
use meshd::stand_in::StandInBackend;

/// How long one shell snippet may run (they take milliseconds; this only catches a hang).
const SNIPPET_DEADLINE: Duration = Duration::from_secs(60);

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// What a block says it is.
#[derive(Debug, Clone, PartialEq)]
enum Marker {
    Include { path: String, name: Option<String> },
    RunSh,
    RunPython,
}

/// One fenced block of a page.
#[derive(Debug)]
struct Block {
    /// The line of the opening fence, from 1.
    line: usize,
    marker: Result<Marker, String>,
    body: String,
}

/// The marker on `line`, if it is one; Err for a comment that looks like one but is not well formed.
fn parse_marker(line: &str) -> Option<Result<Marker, String>> {
    let inner = line.trim().strip_prefix("<!--")?.strip_suffix("-->")?.trim();
    let (kind, arg) = inner.split_once(':')?;
    let arg = arg.trim();
    Some(match (kind.trim(), arg) {
        ("run", "sh") => Ok(Marker::RunSh),
        ("run", "python") => Ok(Marker::RunPython),
        ("run", other) => Err(format!("`run: {other}`: only `run: sh` and `run: python` are run")),
        ("include", "") => Err("`include:` names no file".into()),
        ("include", arg) => Ok(match arg.split_once('#') {
            Some((path, name)) => Marker::Include { path: path.into(), name: Some(name.into()) },
            None => Marker::Include { path: arg.into(), name: None },
        }),
        _ => return None,
    })
}

/// Every fenced block of a page's `text`, with the marker above it (Err when there is none).
fn blocks_of(text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let fence = lines[i].trim_start();
        if !fence.starts_with("```") {
            i += 1;
            continue;
        }
        let open = i;
        let above = lines[..open].iter().rev().find(|l| !l.trim().is_empty());
        let marker = match above.and_then(|l| parse_marker(l)) {
            Some(m) => m,
            None => Err("no marker above it (`<!-- include: PATH -->`, `<!-- include: PATH#NAME -->`, \
                         `<!-- run: sh -->` or `<!-- run: python -->`)"
                .into()),
        };
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && !lines[i].trim_start().starts_with("```") {
            body.push(lines[i]);
            i += 1;
        }
        let body = if body.is_empty() { String::new() } else { format!("{}\n", body.join("\n")) };
        out.push(Block { line: open + 1, marker, body });
        i += 1;
    }
    out
}

/// README.md and every page under docs/, sorted.
fn pages(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    let mut out = vec![root.join("README.md")];
    walk(&root.join("docs"), &mut out);
    out.sort();
    out
}

/// The text an include names: the whole file, or its region NAME. Err names what is wrong.
fn included(root: &Path, path: &str, name: Option<&str>) -> Result<String, String> {
    let file = root.join(path);
    let text = std::fs::read_to_string(&file).map_err(|e| format!("{path}: {e}"))?;
    let Some(name) = name else { return Ok(text) };
    let is = |line: &str, what: &str| {
        line.split_whitespace().collect::<Vec<_>>().windows(2).any(|w| w[0] == what && w[1] == name)
    };
    let lines: Vec<&str> = text.lines().collect();
    let begin = lines
        .iter()
        .position(|l| is(l, "doc:begin"))
        .ok_or_else(|| format!("{path} has no `doc:begin {name}` line"))?;
    let end = lines[begin..]
        .iter()
        .position(|l| is(l, "doc:end"))
        .map(|n| begin + n)
        .ok_or_else(|| format!("{path} has `doc:begin {name}` but no `doc:end {name}` after it"))?;
    let region = &lines[begin + 1..end];
    Ok(if region.is_empty() { String::new() } else { format!("{}\n", region.join("\n")) })
}

/// Where `body` and `want` first differ, for the failure message.
fn first_difference(body: &str, want: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (body.lines().collect(), want.lines().collect());
    for i in 0..a.len().max(b.len()) {
        if a.get(i) != b.get(i) {
            return format!(
                "line {} of the block: the doc has {:?}, the file {:?}",
                i + 1,
                a.get(i).copied().unwrap_or("<end>"),
                b.get(i).copied().unwrap_or("<end>")
            );
        }
    }
    "they differ only in trailing blank lines".into()
}

/// What kind of code an include shows, for the count.
fn kind_of(path: &str) -> &'static str {
    match Path::new(path).extension().and_then(|x| x.to_str()) {
        Some("cu" | "cuh") => "CUDA",
        Some("py") => "Python",
        Some("sh") => "shell",
        Some("rs") => "Rust",
        Some("c" | "h") => "C",
        Some("service" | "yaml" | "yml" | "json" | "env") => "configuration",
        _ => "other",
    }
}

/// A meshd of its own for one snippet: the real control socket and mailbox over the stand-in backend.
struct StandIn {
    dir: tempfile::TempDir,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StandIn {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = MailboxConfig { size: 64 << 20, slots: 8, channels: 32 };
        let mailbox = Mailbox::create(dir.path().join("mailbox"), &config, CreateMode::Replace).unwrap();
        let server = Server::start(mailbox, Limits::default(), None, |mb| {
            Ok(Opened { backend: Box::new(StandInBackend::new(mb)), device: "stand-in (no GPU)".into(), arch: None })
        })
        .unwrap();
        let listener = meshd::start::bind_socket(&dir.path().join("meshd.sock")).unwrap();
        let thread = std::thread::spawn(move || {
            let _ = server.run(listener);
        });
        Self { dir, thread: Some(thread) }
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("meshd.sock")
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        // A snippet may have shut it down itself; then this finds no meshd, which is fine.
        let _ = Command::new(env!("CARGO_BIN_EXE_meshd"))
            .env("MESHD_SOCKET", self.socket())
            .arg("shutdown")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs one shell snippet against a stand-in meshd of its own; Err carries its output.
fn run_sh(root: &Path, body: &str) -> Result<(), String> {
    let meshd = StandIn::start();
    let bin = Path::new(env!("CARGO_BIN_EXE_meshd")).parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut child = Command::new("bash")
        .args(["-euo", "pipefail", "-c", body])
        .current_dir(root)
        .env("PATH", path)
        .env("MESHD_SOCKET", meshd.socket())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("bash: {e}"))?;
    let started = Instant::now();
    loop {
        if child.try_wait().map_err(|e| e.to_string())?.is_some() {
            break;
        }
        if started.elapsed() > SNIPPET_DEADLINE {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let said =
        format!("stdout:\n{}\nstderr:\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() { Ok(()) } else { Err(format!("exited with {}\n{said}", out.status)) }
}

/// Every shell script under examples/ (recursively).
fn example_scripts(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() && !p.ends_with("target") {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "sh") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root.join("examples"), &mut out);
    out.sort();
    out
}

#[test]
fn every_block_in_the_docs_is_an_include_that_matches_or_a_snippet_that_runs() {
    let root = root();
    let mut failures = Vec::new();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut scripts: Vec<PathBuf> = Vec::new();
    let mut total = 0;
    for page in pages(&root) {
        let text = std::fs::read_to_string(&page).unwrap();
        let shown = page.strip_prefix(&root).unwrap_or(&page).display().to_string();
        for block in blocks_of(&text) {
            total += 1;
            let at = format!("{shown}:{}", block.line);
            match &block.marker {
                Err(why) => failures.push(format!("{at}: {why}")),
                Ok(Marker::Include { path, name }) => {
                    match included(&root, path, name.as_deref()) {
                        Err(why) => failures.push(format!("{at}: {why}")),
                        Ok(want) if want.trim_end() != block.body.trim_end() => failures.push(format!(
                            "{at}: the block is not {path}{}: {}",
                            name.as_ref().map(|n| format!("#{n}")).unwrap_or_default(),
                            first_difference(&block.body, &want)
                        )),
                        Ok(_) => {}
                    }
                    if path.ends_with(".sh") {
                        scripts.push(root.join(path));
                    }
                    *counts.entry(format!("include ({})", kind_of(path))).or_default() += 1;
                }
                Ok(Marker::RunSh) => {
                    if let Err(why) = run_sh(&root, &block.body) {
                        failures.push(format!("{at}: the shell snippet failed against the stand-in meshd: {why}"));
                    }
                    *counts.entry("run: sh (run here)".into()).or_default() += 1;
                }
                Ok(Marker::RunPython) => {
                    *counts.entry("run: python (run by pytest, test_docs.py)".into()).or_default() += 1;
                }
            }
        }
    }
    scripts.extend(example_scripts(&root));
    scripts.sort();
    scripts.dedup();
    for script in &scripts {
        let out = Command::new("bash").arg("-n").arg(script).output().unwrap();
        if !out.status.success() {
            failures.push(format!("{}: bash -n: {}", script.display(), String::from_utf8_lossy(&out.stderr)));
        }
    }
    println!("{total} blocks checked:");
    for (kind, n) in &counts {
        println!("  {n:4} {kind}");
    }
    println!("{} example scripts syntax-checked with bash -n", scripts.len());
    assert!(failures.is_empty(), "{} of {total} blocks failed:\n{}", failures.len(), failures.join("\n\n"));
    assert!(total >= 20, "found only {total} blocks in README.md and docs/");
    assert!(counts.keys().any(|k| k.starts_with("run: sh")), "no shell snippet was run");
}

/// The checker itself: an unmarked block, a stale include and a bad region are each refused.
#[test]
fn the_checker_refuses_an_unmarked_block_and_a_stale_include() {
    let blocks = blocks_of("text\n\n```sh\nls\n```\n");
    assert!(blocks[0].marker.as_ref().unwrap_err().contains("no marker"));
    let blocks = blocks_of("<!-- run: ruby -->\n```\nputs 1\n```\n");
    assert!(blocks[0].marker.as_ref().unwrap_err().contains("run: ruby"));
    let blocks = blocks_of("<!-- include: a/b.cu#loop -->\n\n```cuda\nx\n```\n");
    assert_eq!(blocks[0].marker, Ok(Marker::Include { path: "a/b.cu".into(), name: Some("loop".into()) }));
    assert_eq!(blocks[0].body, "x\n");

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f.cu"), "a\n// doc:begin r\nb\nc\n// doc:end r\nd\n").unwrap();
    assert_eq!(included(dir.path(), "f.cu", Some("r")).unwrap(), "b\nc\n");
    assert_eq!(included(dir.path(), "f.cu", None).unwrap().lines().count(), 6);
    assert!(included(dir.path(), "f.cu", Some("rr")).unwrap_err().contains("no `doc:begin rr`"));
    assert!(included(dir.path(), "g.cu", None).unwrap_err().contains("g.cu"));
    assert!(first_difference("b\nx\n", "b\nc\n").contains("line 2"));

    // A snippet runs against a meshd of its own, and a failing one is reported with its output.
    assert!(run_sh(&root(), "meshd ps >/dev/null").is_ok());
    let err = run_sh(&root(), "meshd channel create c --msg-size 7").unwrap_err();
    assert!(err.contains("exited with") && err.contains("stderr"), "{err}");
}

/// The options the deploy files pass to `meshd run`, each one meshd knows; the unit file's sections.
#[test]
fn the_deploy_files_parse_and_pass_only_options_meshd_knows() {
    let root = root();
    let help = Command::new(env!("CARGO_BIN_EXE_meshd")).args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    let known = |flag: &str| help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n"));
    let unit = std::fs::read_to_string(root.join("deploy/meshd@.service")).unwrap();
    let mut section = String::new();
    let mut keys: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (n, line) in unit.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(s) = line.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            section = s.to_string();
            continue;
        }
        let (k, v) = line.split_once('=').unwrap_or_else(|| panic!("meshd@.service:{}: not KEY=VALUE: {line}", n + 1));
        assert!(!section.is_empty(), "meshd@.service:{}: a key before any section", n + 1);
        keys.entry(format!("{section}.{k}")).or_default().push(v.to_string());
    }
    assert_eq!(keys["Service.Type"], ["notify"]);
    assert!(keys.contains_key("Install.WantedBy"));
    let exec = &keys["Service.ExecStart"][0];
    assert!(exec.contains("meshd run"), "{exec}");
    let yaml = std::fs::read_to_string(root.join("deploy/k8s/meshd-daemonset.yaml")).unwrap();
    assert!(yaml.contains("kind: DaemonSet"));
    assert!(!yaml.contains('\t'), "YAML indents with spaces only");
    // What reaches `meshd run`: the unit's ExecStart and the MESHD_ARGS its comments suggest, the
    // DaemonSet's command (to the line that does not continue with a backslash) and its MESHD_ARGS.
    let mut args = vec![exec.clone()];
    args.extend(unit.lines().filter_map(|l| l.split_once("MESHD_ARGS=").map(|(_, v)| v.to_string())));
    let lines: Vec<&str> = yaml.lines().collect();
    let run = lines.iter().position(|l| l.contains("meshd run")).expect("the DaemonSet runs meshd");
    for l in &lines[run..] {
        args.push(l.to_string());
        if !l.trim_end().ends_with('\\') {
            break;
        }
    }
    args.extend(lines.iter().filter(|l| l.trim_start().starts_with("value: \"--")).map(|l| l.to_string()));
    let global = Command::new(env!("CARGO_BIN_EXE_meshd")).arg("--help").output().unwrap();
    let global = String::from_utf8_lossy(&global.stdout).into_owned();
    let mut flags: Vec<String> = args
        .iter()
        .flat_map(|a| a.split(|c: char| c.is_whitespace() || c == '"').map(str::to_string).collect::<Vec<_>>())
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .collect();
    flags.sort();
    flags.dedup();
    assert!(flags.len() >= 6, "{flags:?}");
    for flag in flags {
        assert!(
            known(&flag) || global.contains(&format!("{flag} ")),
            "the deploy files pass {flag}, which neither `meshd run --help` nor `meshd --help` lists"
        );
    }
}
