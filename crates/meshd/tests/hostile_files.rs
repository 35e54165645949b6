//! What meshd does with the files it reads besides the mailbox: a damaged or hostile state directory (`state.json` mutated, stored images that are FIFOs, devices, links or huge) restored into a fresh mailbox through the stand-in backend, and `meshd run` given hostile `--shm`, `--state-dir` and `--socket` paths. Never a panic, a hang, a read outside the directory or an absurd allocation; always an error naming the path or entry and why, and the rest of the record still restored.

mod common;

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{ListBackend, PTX, ask, load_req, small_mailbox, within};
use meshd::protocol::Request;
use meshd::server::{Limits, Server};
use meshd::start::bind_socket;
use meshd::state::StateStore;
use proptest::prelude::*;
use serde_json::{Value, json};

/// Each case's watchdog: far beyond what a case takes, short of a hung CI job.
const WATCHDOG: Duration = Duration::from_secs(30);

/// The programs of the template record and the channels each binds.
const PROGRAMS: [(&str, &[&str]); 3] = [("a", &["in"]), ("b", &[]), ("c", &["out"])];

/// A state directory written by the real recording code: channels `in` and `out`, programs `a`
/// (binds `in`), `b` and `c` (binds `out`), each with its own image. Made once, copied per case.
fn template() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let run = tempfile::tempdir().unwrap();
        let mailbox = small_mailbox(run.path());
        mailbox.create_channel("in", 64, 8).unwrap();
        mailbox.create_channel("out", 64, 8).unwrap();
        let mut store = StateStore::open(&state).unwrap();
        store.record_channels(&mailbox).unwrap();
        let server =
            Server::start(mailbox, Limits::default(), Some(store), |mb| ListBackend::new(mb).opened()).unwrap();
        let socket = run.path().join("sock");
        let listener = bind_socket(&socket).unwrap();
        let h = std::thread::spawn(move || server.run(listener).unwrap());
        for (name, bind) in PROGRAMS {
            let image = [PTX, format!("// {name}\n").as_bytes()].concat();
            let mut req = load_req(name, bind);
            if let Request::Load { image_len, .. } = &mut req {
                *image_len = image.len();
            }
            let r = ask(&socket, &req, &image);
            assert!(r.ok, "{r:?}");
        }
        assert!(ask(&socket, &Request::Shutdown, &[]).ok);
        within(WATCHDOG, move || h.join().unwrap()).expect("the template's server stops");
        let recorded = StateStore::open(&state).unwrap().recorded().clone();
        assert_eq!((recorded.channels.len(), recorded.programs.len()), (2, 3), "{recorded:?}");
        dir
    })
    .path()
}

/// A copy of the template's state directory at `to`.
fn copy_template(to: &Path) {
    let from = template().join("state");
    for sub in ["images", "linked"] {
        std::fs::create_dir_all(to.join(sub)).unwrap();
        for e in std::fs::read_dir(from.join(sub)).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(sub).join(e.file_name())).unwrap();
        }
    }
    std::fs::copy(from.join("state.json"), to.join("state.json")).unwrap();
}

fn template_json() -> Value {
    serde_json::from_slice(&std::fs::read(template().join("state/state.json")).unwrap()).unwrap()
}

/// Every JSON pointer into `v` (the root left out).
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => m.iter().for_each(|(k, x)| {
            let p = format!("{at}/{k}");
            out.push(p.clone());
            pointers(x, p, out);
        }),
        Value::Array(a) => a.iter().enumerate().for_each(|(i, x)| {
            let p = format!("{at}/{i}");
            out.push(p.clone());
            pointers(x, p, out);
        }),
        _ => {}
    }
}

/// A change to a valid record.
#[derive(Debug, Clone)]
enum Mutation {
    /// The value at the `n`th pointer (modulo their count) replaced.
    Replace(usize, Value),
    /// The value at the `n`th pointer replaced by one of its own type (the record still parses):
    /// the `k`th of the hostile numbers, strings or arrays.
    Typed(usize, usize),
    /// The field or element at the `n`th pointer removed.
    Remove(usize),
    /// The value at the `n`th pointer replaced by an array of `len` copies of it.
    Huge(usize, usize),
    /// Program or channel `i` recorded twice.
    Duplicate(&'static str, usize),
    /// A top-level field added: what a replacement of the process leaves (carried marks, a search).
    Insert(&'static str, Value),
}

fn hostile_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        prop::sample::select(vec![
            json!(0),
            json!(1),
            json!(-1),
            json!(i64::MIN),
            json!(u32::MAX),
            json!(u64::from(u32::MAX) + 1),
            json!(u64::MAX),
            json!(1e300),
            json!(0.5),
            json!(null),
            json!(true),
            json!([]),
            json!({}),
            json!(""),
            json!("a\0b"),
            json!("../../../../etc/passwd"),
            json!("a/b"),
            json!(".."),
            json!("/dev/zero"),
            json!("\u{1}\u{7f}\n\t"),
            json!("in"),
            json!("b"),
            json!("fanin"),
            json!("group"),
            json!("device"),
            json!("bulk"),
            json!([u32::MAX, u32::MAX, u32::MAX]),
            json!([1 << 22, 1 << 21, 1 << 21]),
            json!([0, 0, 0]),
            json!([1, 1]),
            json!(["in", "in", "out"]),
        ]),
        Just(json!("x".repeat(100_000))),
        any::<u64>().prop_map(|n| json!(n)),
        any::<u32>().prop_map(|n| json!(n)),
        "\\PC{0,24}".prop_map(|s| json!(s)),
    ]
}

fn inserted() -> impl Strategy<Value = Mutation> {
    (hostile_value(), "[a-c]", any::<bool>(), prop::collection::vec(any::<bool>(), 0..40)).prop_flat_map(
        |(v, name, culprit, answers)| {
            prop::sample::select(vec![
                Mutation::Insert(
                    "carried",
                    json!({ name.clone(): { "restarts": u32::MAX, "held": { "why": v.clone(), "culprit": culprit } } }),
                ),
                Mutation::Insert("carried", json!({ name.clone(): v.clone() })),
                Mutation::Insert(
                    "recovery",
                    json!({ "search": { "error": "E", "suspects": ["a", "b", "c", "a", "zz"], "likely": v.clone(),
                        "answers": answers.clone(), "noticed_mono_ns": u64::MAX } }),
                ),
                Mutation::Insert(
                    "recovery",
                    json!({ "reexecs_unix_ms": [u64::MAX, 0], "pending": { "from_pid": 0, "error": v.clone(),
                        "noticed_mono_ns": u64::MAX, "exec_mono_ns": 0, "culprit": name.clone() } }),
                ),
                Mutation::Insert("recovery", v.clone()),
                Mutation::Insert("natives", v),
            ])
        },
    )
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        2 => (any::<usize>(), hostile_value()).prop_map(|(n, v)| Mutation::Replace(n, v)),
        6 => (any::<usize>(), any::<usize>()).prop_map(|(n, k)| Mutation::Typed(n, k)),
        1 => any::<usize>().prop_map(Mutation::Remove),
        1 => (any::<usize>(), prop::sample::select(vec![2usize, 1000, 20_000])).prop_map(|(n, l)| Mutation::Huge(n, l)),
        1 => (prop::sample::select(vec!["programs", "channels"]), 0..3usize).prop_map(|(w, i)| Mutation::Duplicate(w, i)),
        1 => inserted(),
    ]
}

/// Applies `m` to `v`; the pointer it changed, if one.
fn apply(v: &mut Value, m: &Mutation) -> Option<String> {
    let mut all = Vec::new();
    pointers(v, String::new(), &mut all);
    let pick = |n: usize| all[n % all.len()].clone();
    match m {
        Mutation::Replace(n, with) => {
            let at = pick(*n);
            *v.pointer_mut(&at).unwrap() = with.clone();
            Some(at)
        }
        Mutation::Typed(n, k) => {
            let at = pick(*n);
            let x = v.pointer_mut(&at).unwrap();
            let numbers = [json!(0), json!(1), json!(u32::MAX), json!(u64::MAX), json!(1 << 20)];
            let strings = [
                json!(""),
                json!("x".repeat(10_000)),
                json!("a\0b"),
                json!("../../../../etc/passwd"),
                json!("a/b"),
                json!(".."),
                json!("\u{1}\u{1b}[2J\n"),
                json!("in"),
                json!("out"),
                json!("a"),
                json!("group"),
                json!("fanin"),
                json!("device"),
                json!("bulk"),
                json!("ll"),
            ];
            *x = match &*x {
                Value::Number(_) => numbers[k % numbers.len()].clone(),
                Value::String(_) => strings[k % strings.len()].clone(),
                Value::Array(a) if a.len() == 3 && a.iter().all(Value::is_number) => {
                    let d = numbers[k % numbers.len()].clone();
                    json!([d.clone(), d.clone(), d])
                }
                Value::Array(a) => Value::Array(if k % 2 == 0 {
                    Vec::new()
                } else {
                    a.iter().cycle().take(a.len() * (k % 3 + 2)).cloned().collect()
                }),
                Value::Bool(b) => Value::Bool(!b),
                other => other.clone(),
            };
            Some(at)
        }
        Mutation::Huge(n, len) => {
            let at = pick(*n);
            let x = v.pointer_mut(&at).unwrap();
            *x = Value::Array(vec![x.clone(); *len]);
            Some(at)
        }
        Mutation::Remove(n) => {
            let at = pick(*n);
            let (parent, last) = at.rsplit_once('/').unwrap();
            match v.pointer_mut(parent).unwrap() {
                Value::Object(m) => drop(m.remove(last)),
                Value::Array(a) => drop(a.remove(last.parse::<usize>().unwrap())),
                _ => unreachable!("a pointer's parent holds it"),
            }
            Some(at)
        }
        Mutation::Duplicate(what, i) => {
            let list = v[*what].as_array_mut().unwrap();
            let copy = list[*i % list.len()].clone();
            list.push(copy);
            None
        }
        Mutation::Insert(key, with) => {
            v[*key] = with.clone();
            Some(format!("/{key}"))
        }
    }
}

/// The programs a damaged entry at `at` may keep from relaunching: the one it is in, or those
/// binding the channel it is in (by their names in the template); `None`: any of them.
fn may_fail(at: Option<&str>) -> Option<Vec<&'static str>> {
    let at = at?;
    let index = |prefix: &str| at.strip_prefix(prefix)?.split('/').next()?.parse::<usize>().ok();
    if let Some(i) = index("/programs/") {
        return Some(vec![PROGRAMS.get(i)?.0]);
    }
    if let Some(i) = index("/channels/") {
        let channel = ["in", "out"].get(i)?;
        return Some(PROGRAMS.iter().filter(|(_, bind)| bind.contains(channel)).map(|(p, _)| *p).collect());
    }
    None
}

/// One case: `state.json` mutated by `m` in a copy of the template, then opened, its channels
/// restored into a fresh mailbox and its programs relaunched through the stand-in backend.
fn restore_mutated(m: &Mutation) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    copy_template(&state);
    let mut v = template_json();
    let at = apply(&mut v, m);
    std::fs::write(state.join("state.json"), serde_json::to_vec(&v).unwrap()).unwrap();
    let store = match StateStore::open(&state) {
        Ok(s) => s,
        Err(e) => {
            let e = format!("{e:#}");
            prop_assert!(e.contains("state.json") && e.contains("--fresh"), "an unclear refusal: {e}");
            return Ok(());
        }
    };
    let mut store = store;
    let run = tempfile::tempdir().unwrap();
    let mailbox = small_mailbox(run.path());
    let restored = store.restore_channels(&mailbox);
    prop_assert!(restored.is_ok(), "{restored:?}");
    let recorded = store.recorded().clone();
    // A panic on the backend thread (during the relaunch) would end it: the start fails.
    let (log, loaded) = std::sync::mpsc::channel();
    let server =
        Server::start(mailbox, Limits::default(), Some(store), move |mb| ListBackend::new(mb).with_log(log).opened());
    prop_assert!(server.is_ok(), "{server:?}");
    let server = server.unwrap();
    let running: Vec<String> = loaded.try_iter().collect();
    // The rest is restored: every template program the damage cannot reach relaunched.
    if let Some(spared) = may_fail(at.as_deref()).filter(|_| recorded.recovery.search.is_none()) {
        for (p, _) in PROGRAMS.iter().filter(|(p, _)| !spared.contains(p)) {
            if recorded.carried.get(*p).is_some_and(|c| c.held.is_some()) {
                continue;
            }
            prop_assert!(running.iter().any(|r| r == p), "{p} not relaunched ({running:?}); damage at {at:?}");
        }
    }
    let socket = run.path().join("sock");
    let listener = bind_socket(&socket).unwrap();
    let stop = server.stop_handle();
    let h = std::thread::spawn(move || server.run(listener).unwrap());
    stop.stop();
    prop_assert!(within(WATCHDOG, move || h.join().is_ok()) == Some(true), "the server did not stop");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn a_mutated_state_record_is_refused_clearly_or_restored_without_panic_or_hang(m in mutation()) {
        let case = m.clone();
        match within(WATCHDOG, move || restore_mutated(&case)) {
            Some(r) => r?,
            None => prop_assert!(false, "{m:?}: no answer within {WATCHDOG:?} (a hang, or a panic on its thread)"),
        }
    }
}

/// What a case does to a file of the state directory (it is not there before).
type Damage = Box<dyn Fn(&Path)>;

/// What a file the state directory reads can be instead of a plain file of at most `max` bytes, each
/// with the words its refusal must give.
fn not_plain_files(max: u64) -> Vec<(&'static str, Damage)> {
    vec![
        ("a FIFO", Box::new(mkfifo)),
        ("a symbolic link", Box::new(|p: &Path| std::os::unix::fs::symlink("/dev/zero", p).unwrap())),
        ("a directory", Box::new(|p: &Path| std::fs::create_dir(p).unwrap())),
        (
            "at most",
            Box::new(move |p: &Path| {
                let f = std::fs::File::create(p).unwrap();
                f.set_len(max + 1).unwrap();
            }),
        ),
    ]
}

fn mkfifo(path: &Path) {
    rustix::fs::mkfifoat(rustix::fs::CWD, path, rustix::fs::Mode::from_raw_mode(0o600)).unwrap();
}

/// What `f` answers, within the watchdog.
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    within(WATCHDOG, f).unwrap_or_else(|| panic!("{what}: no answer within {WATCHDOG:?}"))
}

#[test]
fn a_stored_image_that_is_no_plain_file_of_the_directory_is_refused_by_path_and_the_others_relaunched() {
    let outside = tempfile::tempdir().unwrap();
    let hash = |name: &str| {
        let v = template_json();
        let p = v["programs"].as_array().unwrap().iter().find(|p| p["name"] == name).unwrap().clone();
        p["image_sha256"].as_str().unwrap().to_string()
    };
    let a = hash("a");
    // Each damage of `images/<a's hash>`, and the reason the refusal must give.
    let mut cases = not_plain_files(meshd::protocol::MAX_IMAGE as u64);
    cases.push(("a symbolic link", {
        // The very image, but outside the directory: not read through the link.
        let copy = outside.path().join("a-image");
        std::fs::copy(template().join("state/images").join(&a), &copy).unwrap();
        Box::new(move |p: &Path| std::os::unix::fs::symlink(&copy, p).unwrap())
    }));
    for (why, damage) in cases {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        copy_template(&state);
        let image = state.join("images").join(&a);
        std::fs::remove_file(&image).unwrap();
        damage(&image);
        let store = StateStore::open(&state).unwrap();
        let rec = store.program("a").unwrap().clone();
        let (store, err) = bounded(why, move || {
            let err = format!("{:#}", store.spec_of(&rec).unwrap_err());
            (store, err)
        });
        assert!(err.contains("program \"a\"") && err.contains(&a) && err.contains(why), "{why}: {err}");
        // The relaunch: `a` refused, `b` and `c` relaunched.
        let run = tempfile::tempdir().unwrap();
        let mailbox = small_mailbox(run.path());
        let mut store = store;
        assert_eq!(store.restore_channels(&mailbox).unwrap(), 2);
        let server = bounded(why, move || {
            Server::start(mailbox, Limits::default(), Some(store), |mb| ListBackend::new(mb).opened()).unwrap()
        });
        assert_eq!(server.relaunched, (2, 1), "{why}");
        server.stop_handle().stop();
    }
}

#[test]
fn a_state_file_that_is_no_plain_file_is_refused_naming_it_and_why() {
    for (why, damage) in not_plain_files(meshd::state::MAX_STATE_FILE) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("state.json");
        damage(&file);
        let at = dir.path().to_path_buf();
        let err = bounded(why, move || format!("{:#}", StateStore::open(&at).unwrap_err()));
        assert!(err.contains(&file.display().to_string()) && err.contains(why) && err.contains("--fresh"), "{err}");
    }
}

#[test]
fn a_stored_linked_image_that_is_no_plain_file_is_ignored_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    copy_template(&state);
    let hash = template_json()["programs"][0]["image_sha256"].as_str().unwrap().to_string();
    mkfifo(&state.join("linked").join(format!("{hash}.sm_90")));
    std::os::unix::fs::symlink("/dev/zero", state.join("linked").join(format!("{hash}.sm_80"))).unwrap();
    let store = StateStore::open(&state).unwrap();
    let found = bounded("linked", move || (store.linked(&hash, "sm_90"), store.linked(&hash, "sm_80")));
    assert_eq!(found, (None, None));
}

#[test]
fn a_state_dir_holding_other_files_is_refused_and_left_as_it_was() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, b"mine").unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let err = format!("{:#}", StateStore::open(dir.path()).unwrap_err());
    assert!(err.contains(&dir.path().display().to_string()) && err.contains("notes.txt"), "{err}");
    assert_eq!(std::fs::metadata(dir.path()).unwrap().permissions().mode() & 0o777, 0o755, "its mode kept");
    assert!(!dir.path().join("images").exists(), "nothing added");
    // An empty directory, and one meshd wrote, are opened.
    let empty = tempfile::tempdir().unwrap();
    StateStore::open(empty.path()).unwrap();
    StateStore::open(empty.path()).unwrap();
}

#[test]
fn absurd_recorded_channels_and_shapes_are_refused_one_by_one_and_the_rest_restored() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    copy_template(&state);
    let mut v = template_json();
    // `out` needs a vast ring, and a group of u32::MAX entries; `a`'s block overflows a u64 (and
    // wraps to 0 threads); `b`'s would wrap to 0 too. `c` (on `out`) goes with its channel.
    v["channels"][1]["capacity"] = json!(u32::MAX);
    v["channels"][1]["msg_size"] = json!(u32::MAX);
    let mut group = v["channels"][0].clone();
    group["name"] = json!("g");
    group["protocol"] = json!("group");
    group["parts"] = json!(u32::MAX);
    v["channels"].as_array_mut().unwrap().push(group);
    v["programs"][0]["block"] = json!([u32::MAX, u32::MAX, u32::MAX]);
    v["programs"][1]["block"] = json!([1 << 22, 1 << 21, 1 << 21]);
    let mut d = v["programs"][1].clone();
    d["name"] = json!("d");
    d["block"] = json!([32, 1, 1]);
    d["shared_mem"] = json!(u32::MAX);
    d["grid"] = json!([u32::MAX, u32::MAX, u32::MAX]);
    v["programs"].as_array_mut().unwrap().push(d);
    std::fs::write(state.join("state.json"), serde_json::to_vec(&v).unwrap()).unwrap();
    let run = tempfile::tempdir().unwrap();
    let mailbox = small_mailbox(run.path());
    let server = bounded("restore", move || {
        let mut store = StateStore::open(&state).unwrap();
        let restored = store.restore_channels(&mailbox).unwrap();
        let channels: Vec<String> = mailbox.channels().unwrap().into_iter().map(|c| c.name).collect();
        let server =
            Server::start(mailbox, Limits::default(), Some(store), |mb| ListBackend::new(mb).opened()).unwrap();
        (restored, channels, server)
    });
    let (restored, channels, server) = server;
    assert_eq!((restored, channels), (1, vec!["in".to_string()]), "only the sane channel");
    // `d`'s grid and shared memory are the GPU's to refuse at launch (the stand-in has none).
    assert_eq!(server.relaunched, (1, 3), "a, b refused by their block, c by its missing channel; d relaunched");
    server.stop_handle().stop();
}

/// A recorded restart count at its largest (`carried`), in a record a replacement of the process
/// left (`pending`): the relaunch counts one more restart, and a recovery in place adds the
/// backend's own to it. Both stay at the largest count instead of overflowing (a panic on the
/// backend thread in a debug build: the start, or meshd, ended; a wrap to 0 in a release build).
#[test]
fn a_recorded_restart_count_at_its_largest_saturates_at_the_relaunch_and_the_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    copy_template(&state);
    let mut v = template_json();
    v["carried"] = json!({ "a": { "restarts": u32::MAX } });
    v["recovery"] = json!({ "pending": { "from_pid": 0, "error": "E", "noticed_mono_ns": 0, "exec_mono_ns": 0 } });
    std::fs::write(state.join("state.json"), serde_json::to_vec(&v).unwrap()).unwrap();
    let run = tempfile::tempdir().unwrap();
    let mailbox = small_mailbox(run.path());
    let knob = meshd::stand_in::RecoveryKnob::new();
    let backend_knob = knob.clone();
    let started = bounded("restore", move || {
        let mut store = StateStore::open(&state).unwrap();
        store.restore_channels(&mailbox).unwrap();
        Server::start(mailbox, Limits::default(), Some(store), move |mb| {
            ListBackend::new(mb).with_knob(backend_knob).opened()
        })
    });
    let server = started.unwrap_or_else(|e| panic!("the start failed: {e:#}"));
    assert_eq!(server.relaunched, (3, 0));
    let socket = run.path().join("sock");
    let listener = bind_socket(&socket).unwrap();
    let stop = server.stop_handle();
    let h = std::thread::spawn(move || server.run(listener).unwrap());
    let restarts = |socket: &Path| {
        let r = ask(socket, &Request::Ps, &[]);
        r.programs.unwrap_or_default().into_iter().find(|p| p.name == "a").map(|p| p.restarts)
    };
    assert_eq!(restarts(&socket), Some(u32::MAX), "the relaunch's restart saturates");
    // A recovery in place: the backend counts a restart of its own, which `ps` adds to the carried count.
    knob.fault("a test fault", Duration::ZERO);
    let seen = common::wait_until(Duration::from_secs(10), || {
        let r = ask(&socket, &Request::Ps, &[]);
        r.programs.unwrap_or_default().iter().any(|p| p.generation > 1)
    });
    assert!(seen, "the recovery relaunched the programs");
    assert_eq!(restarts(&socket), Some(u32::MAX), "the recovery's restart saturates");
    stop.stop();
    assert!(within(WATCHDOG, move || h.join().is_ok()) == Some(true), "the backend thread ended well");
}

// ---- `meshd run` given hostile paths ----

fn has_gpu_driver() -> bool {
    mesh_cuda::Device::get(0).is_ok()
}

/// `meshd --socket <socket> run --shm <shm> [--state-dir <state>]`, which must end within the
/// watchdog; its exit code and stderr.
fn meshd_run(socket: &Path, shm: &Path, state: Option<&Path>, extra: &[&str]) -> (Option<i32>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_meshd"));
    cmd.arg("--socket").arg(socket).args(["run", "--shm"]).arg(shm).args(extra);
    if let Some(s) = state {
        cmd.arg("--state-dir").arg(s);
    }
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let end = Instant::now() + WATCHDOG;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("meshd run --shm {} --socket {}: still running after {WATCHDOG:?}", shm.display(), socket.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (status.code(), err)
}

/// A start with sane paths in `dir` reaches the GPU step (nothing a refused start left trips it).
fn next_start_reaches_the_gpu(dir: &Path, shm: &Path, state: Option<&Path>) {
    if has_gpu_driver() {
        return;
    }
    let (code, err) = meshd_run(&dir.join("ok.sock"), shm, state, &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("libcuda") || err.contains("no usable GPU"), "the next start trips: {err}");
    assert!(!shm.exists(), "a mailbox made by a refused start is removed");
}

#[test]
fn hostile_socket_paths_are_refused_naming_the_path_before_anything_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let shm = d.join("mb");
    let file = d.join("precious.txt");
    std::fs::write(&file, b"keep me").unwrap();
    let fifo = d.join("fifo");
    mkfifo(&fifo);
    let zero = d.join("zero");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let long = d.join("s".repeat(120));
    let cases: [(PathBuf, &str); 7] = [
        (d.to_path_buf(), "a directory is there, not a socket"),
        (file.clone(), "a regular file is there, not a socket"),
        (fifo, "a FIFO is there"),
        (zero, "a symbolic link is there"),
        (PathBuf::from("/dev/null"), "a character device is there"),
        (long, "a Unix socket's path holds at most 107"),
        (d.join("missing/sock"), "does not exist"),
    ];
    for (socket, why) in cases {
        let (code, err) = meshd_run(&socket, &shm, None, &[]);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains(&format!("control socket {}", socket.display())) && err.contains(why), "{why}: {err}");
        assert!(!shm.exists() && !d.join("mb.state").exists(), "{why}: nothing made");
    }
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me", "a file at the socket path is not removed");
    assert!(std::fs::metadata("/dev/null").unwrap().file_type().is_char_device());
    next_start_reaches_the_gpu(d, &shm, None);
}

#[test]
fn hostile_mailbox_paths_are_refused_naming_the_path_and_leave_nothing_that_trips_the_next_start() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fifo = d.join("fifo");
    mkfifo(&fifo);
    let zero = d.join("zero");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let null = d.join("null");
    std::os::unix::fs::symlink("/dev/null", &null).unwrap();
    let small = d.join("small");
    std::fs::write(&small, vec![7u8; 4096]).unwrap();
    // Another user's file, reached through a symbolic link: refused, and left as it was.
    let theirs = d.join("theirs");
    std::fs::write(&theirs, b"their data").unwrap();
    let _ = std::os::unix::fs::chown(&theirs, Some(65534), Some(65534));
    let link = d.join("link");
    std::os::unix::fs::symlink(&theirs, &link).unwrap();
    let sub = d.join("sub");
    std::fs::create_dir(&sub).unwrap();
    for shm in [sub.clone(), fifo, zero, null, small.clone(), link] {
        let socket = d.join("sock");
        let (code, err) = meshd_run(&socket, &shm, Some(&d.join("state")), &[]);
        assert_eq!(code, Some(1), "{}: {err}", shm.display());
        assert!(err.contains(&shm.display().to_string()), "{}: the path is named: {err}", shm.display());
        assert!(!socket.exists(), "no socket left");
    }
    assert_eq!(std::fs::read(&theirs).unwrap(), b"their data");
    assert_eq!(std::fs::read(&small).unwrap(), vec![7u8; 4096], "a file of the wrong size is not rewritten");
    assert!(std::fs::metadata(&sub).unwrap().is_dir());
    let _ = std::fs::metadata(&theirs).unwrap().uid();
    // A mailbox in a directory that is not there, or where nothing can be made.
    for shm in [d.join("missing/mb"), PathBuf::from("/proc/meshd-test-mb")] {
        let (code, err) = meshd_run(&d.join("sock"), &shm, Some(&d.join("state")), &[]);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains(&shm.display().to_string()), "{err}");
    }
    next_start_reaches_the_gpu(d, &d.join("mb"), Some(&d.join("state")));
}

#[test]
fn hostile_state_dirs_are_refused_naming_the_path_and_leave_nothing_that_trips_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fifo = d.join("fifo");
    mkfifo(&fifo);
    let file = d.join("file");
    std::fs::write(&file, b"x").unwrap();
    let mine = d.join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("notes.txt"), b"keep me").unwrap();
    let shm = d.join("mb");
    let cases: [(PathBuf, &str); 6] = [
        (fifo, "state directory"),
        (file, "state directory"),
        (PathBuf::from("/dev/null"), "state directory"),
        (PathBuf::from("/dev/zero"), "state directory"),
        (PathBuf::from("/proc/meshd-test-state"), "state directory"),
        (mine.clone(), "not a meshd state directory"),
    ];
    for (state, why) in cases {
        let (code, err) = meshd_run(&d.join("sock"), &shm, Some(&state), &[]);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains(&state.display().to_string()) && err.contains(why), "{}: {err}", state.display());
        assert!(!shm.exists(), "{}: the mailbox made for this start is removed", state.display());
    }
    assert_eq!(std::fs::read(mine.join("notes.txt")).unwrap(), b"keep me", "a directory of other files is kept");
    // `--fresh` removes the state directory: never one of other files (a home directory, say).
    let (code, err) = meshd_run(&d.join("sock"), &shm, Some(&mine), &["--fresh"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("not a meshd state directory"), "{err}");
    assert_eq!(std::fs::read(mine.join("notes.txt")).unwrap(), b"keep me", "--fresh removed nothing of it");
    assert!(std::fs::metadata("/dev/null").unwrap().file_type().is_char_device());
    // A state.json that is a FIFO: refused (not waited on), the path named.
    let state = d.join("state");
    std::fs::create_dir(&state).unwrap();
    mkfifo(&state.join("state.json"));
    let (code, err) = meshd_run(&d.join("sock"), &shm, Some(&state), &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("state.json") && err.contains("a FIFO"), "{err}");
    std::fs::remove_file(state.join("state.json")).unwrap();
    next_start_reaches_the_gpu(d, &shm, Some(&state));
}

// ---- A mailbox shrunk under meshd ----

/// The directory whose mailbox (`mb`) the child below maps and shrinks; set only in the child's environment.
const SHRUNK_CHILD_ENV: &str = "MESHD_TEST_SHRUNK_MAILBOX";

/// Run by the test below in a child process (re-executing this test binary), never on its own:
/// meshd's SIGBUS message registered, a mailbox created, its file shrunk to nothing by "another
/// process" (here a second handle), and the mailbox read: the read must fault.
#[test]
#[ignore = "a child process of a_mailbox_shrunk_under_meshd_ends_it_by_sigbus_naming_the_mailbox"]
fn shrunk_mailbox_child() {
    let dir = PathBuf::from(std::env::var_os(SHRUNK_CHILD_ENV).expect("run by its parent test only"));
    let mailbox = small_mailbox(&dir);
    meshd::start::explain_bus_errors(mailbox.path());
    std::fs::OpenOptions::new().write(true).open(mailbox.path()).unwrap().set_len(0).unwrap();
    let read = mailbox.channels();
    // Unreachable when the fault ends the process, as it must.
    println!("read a shrunk mailbox without a fault: {}", read.is_ok());
}

#[test]
fn a_mailbox_shrunk_under_meshd_ends_it_by_sigbus_naming_the_mailbox() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("mb");
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "shrunk_mailbox_child", "--nocapture", "--test-threads=1"])
        .env(SHRUNK_CHILD_ENV, dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "ends by SIGBUS, as before: {:?}\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stderr.contains("bus error (SIGBUS)")
            && stderr.contains(&*shm.to_string_lossy())
            && stderr.contains("must keep its size"),
        "the message names the signal, the mailbox and why: {stderr}"
    );
}
