//! Every image kind nvcc makes, through the blink backend and the MPS backend: each loads and its heartbeat rises, or is refused with the right reason.
//!
//! The forms are built from `programs/heartbeat.cu` into `programs/images/` by the bundle's `run`
//! script (tests/gpu-run.sh); a form whose file is missing (no nvcc) is skipped with a `SKIPPED`
//! line naming the file. The expectations are for an sm_90 GPU (the H200), the architecture the
//! script builds for. The MPS half runs in a child (this test binary re-run), before this process
//! makes any CUDA context of its own, so the MPS server never shares the GPU with a non-MPS context.
//! One line per form: `image-kind <form> blink=<loaded|refused: reason> mps=<…>`.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mesh_backend::{Backend, ProgramSpec};
use mesh_gpu_tests::{programs_dir, require_gpu, wait_until};

/// What a form must do: load and beat, or be refused with every one of these words in the reason.
type Expect = Option<&'static [&'static str]>;

/// (form, file under programs/images, expectation on an sm_90 GPU).
const FORMS: &[(&str, &str, Expect)] = &[
    ("cubin-sm90", "heartbeat.sm_90.cubin", None),
    ("cubin-sm80", "heartbeat.sm_80.cubin", Some(&["built for sm_80", "this GPU is sm_90"])),
    ("cubin-dc-sm90", "heartbeat.dc.sm_90.cubin", None),
    ("fatbin-sass-sm90", "heartbeat.sm_90.fatbin", None),
    ("fatbin-ptx-compute90", "heartbeat.compute_90.fatbin", None),
    ("fatbin-lto90", "heartbeat.lto_90.fatbin", None),
    // Compressed SASS, whose ELF type is not read: linked (relocatable), else used as it is.
    ("fatbin-dc-sm90", "heartbeat.dc.sm_90.fatbin", None),
    ("fatbin-sass-sm90-compressed", "heartbeat.sm_90.size.fatbin", None),
    ("host-object", "heartbeat.host.o", Some(&["a host object", "not a GPU image"])),
    ("cubin-truncated", "heartbeat.sm_90.truncated.cubin", Some(&["truncated"])),
];

const TEST: &str = "every_image_kind_loads_or_is_refused_in_both_modes";
/// Set in the child that runs the MPS half.
const CHILD: &str = "MESH_IMAGES_MPS_CHILD";
/// How the child reports one form's outcome on its stdout.
const REPORT: &str = "mps-outcome\t";
/// The suffix of a form's report when MPS mode tried it with no idle worker.
const EMPTY_POOL: &str = "+empty-pool";

/// The forms whose files exist, with their bytes; a `SKIPPED` line for each missing one.
fn present_forms(say_skipped: bool) -> Vec<(&'static str, Vec<u8>, Expect)> {
    let dir = programs_dir().join("images");
    let mut forms = Vec::new();
    for &(form, file, expect) in FORMS {
        let path = dir.join(file);
        match std::fs::read(&path) {
            Ok(bytes) => forms.push((form, bytes, expect)),
            Err(e) if say_skipped => eprintln!(
                "SKIPPED (no image) {TEST} form {form}: {} ({e}): nvcc was not there or failed; the bundle's run script builds it",
                path.display()
            ),
            Err(_) => {}
        }
    }
    forms
}

/// A reason on one line, short enough for the table.
fn one_line(s: &str) -> String {
    let joined = s.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" | ");
    joined.chars().take(240).collect()
}

/// Loads `image` as program `name`: `loaded` once its heartbeat rises (then unloads it), or the refusal.
fn outcome(backend: &mut dyn Backend, name: &str, image: Vec<u8>) -> String {
    let loaded = ProgramSpec::new(name, image).and_then(|spec| backend.load(spec));
    if let Err(e) = loaded {
        return format!("refused: {}", one_line(&e.to_string()));
    }
    let beat = |b: &dyn Backend| b.status().iter().find(|p| p.name == name).map_or(0, |p| p.heartbeat);
    let started = wait_until(Duration::from_secs(10), || beat(&*backend) > 0);
    let first = beat(&*backend);
    let rose = started && wait_until(Duration::from_secs(5), || beat(&*backend) > first);
    let state = backend.status().iter().find(|p| p.name == name).map(|p| p.state.to_string()).unwrap_or_default();
    let unloaded = backend.unload(name);
    match (rose, unloaded) {
        (true, Ok(())) => "loaded".into(),
        (true, Err(e)) => format!("loaded, but its unload failed: {}", one_line(&e.to_string())),
        (false, _) => format!("loaded, but its heartbeat did not rise (heartbeat {first}, {state})"),
    }
}

/// Whether `got` is what `expect` asks for.
fn matches(got: &str, expect: Expect) -> bool {
    match expect {
        None => got == "loaded",
        Some(words) => got.starts_with("refused: ") && words.iter().all(|w| got.contains(w)),
    }
}

fn mailbox(dir: &tempfile::TempDir) -> mesh_shm::Mailbox {
    let config = mesh_shm::MailboxConfig { size: 4 << 20, slots: 64, channels: 4 };
    mesh_shm::Mailbox::create(dir.path().join("mailbox"), &config, mesh_shm::CreateMode::Exclusive).expect("mailbox")
}

/// The child's half: every form through an MPS backend, one report line each.
fn mps_half() {
    let dir = tempfile::tempdir_in("/dev/shm").expect("temp dir");
    let mb = mailbox(&dir);
    // No orphan grace: a failed test must not leave a program running into the next.
    let config =
        mesh_mps::MpsConfig { pool: 1, orphan_grace: std::time::Duration::ZERO, ..mesh_mps::MpsConfig::default() };
    let mut backend = match mesh_mps::MpsBackend::open(&mb, config) {
        Ok(b) => b,
        Err(e) => {
            for (form, _, _) in present_forms(false) {
                println!("{REPORT}{form}\tno MPS backend: {}", one_line(&e.to_string()));
            }
            return;
        }
    };
    for (form, image, _) in present_forms(false) {
        println!("{REPORT}{form}\t{}", outcome(&mut backend, form, image));
    }
    // The pool's only worker taken by a running program: a bad image must still be refused for its
    // own reason (it is checked before a worker is taken), not because the pool is empty.
    let holder = std::fs::read(programs_dir().join("heartbeat.ptx")).expect("heartbeat.ptx");
    match ProgramSpec::new("holder", holder).and_then(|spec| backend.load(spec)) {
        Ok(_) => {
            for (form, image, expect) in present_forms(false) {
                if expect.is_some() {
                    let got = ProgramSpec::new(form, image).and_then(|spec| backend.load(spec));
                    let got =
                        got.map_or_else(|e| format!("refused: {}", one_line(&e.to_string())), |_| "loaded".into());
                    println!("{REPORT}{form}{EMPTY_POOL}\t{got}");
                }
            }
        }
        Err(e) => println!("{REPORT}holder\tthe pool's one worker could not be taken: {}", one_line(&e.to_string())),
    }
    let _ = backend.shutdown();
}

/// Re-runs this test in a child with [`CHILD`] set; returns (form, outcome) from its report lines.
fn run_mps_child() -> Vec<(String, String)> {
    let exe = std::env::current_exe().expect("test binary");
    let mut child = Command::new(exe)
        .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .stdout(Stdio::piped())
        .spawn()
        .expect("re-run the test binary for the MPS half");
    let mut stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + Duration::from_secs(50);
    while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if child.try_wait().ok().flatten().is_none() {
        eprintln!("the MPS child ran past 50 s: killed");
        let _ = child.kill();
    }
    let _ = child.wait();
    let text = reader.join().unwrap_or_default();
    text.lines()
        // Anywhere in the line: libtest prints `test NAME ... ` before the child's first line.
        .filter_map(|l| l.split_once(REPORT).map(|(_, rest)| rest))
        .filter_map(|l| l.split_once('\t'))
        .map(|(form, got)| (form.to_string(), got.to_string()))
        .collect()
}

#[test]
fn every_image_kind_loads_or_is_refused_in_both_modes() {
    require_gpu!(TEST);
    if std::env::var_os(CHILD).is_some() {
        mps_half();
        return;
    }
    let forms = present_forms(true);
    if forms.is_empty() {
        return;
    }
    // Before any context exists in this process (Device::get only initialises the driver).
    let arch = mesh_cuda::Device::get(0).expect("device 0").arch();
    if arch != "sm_90" {
        eprintln!("SKIPPED (not sm_90) {TEST}: the images are built for sm_90 and this GPU is {arch}");
        return;
    }
    let mps = run_mps_child();

    let dir = tempfile::tempdir_in("/dev/shm").expect("temp dir");
    let mb = mailbox(&dir);
    let mut blink = mesh_cuda::BlinkBackend::open(&mb, mesh_cuda::BlinkConfig::default()).expect("blink backend");
    let mut failures = Vec::new();
    for (form, image, expect) in forms {
        let b = outcome(&mut blink, form, image);
        let m =
            mps.iter().find(|(f, _)| f == form).map_or("no report from the MPS child".to_string(), |(_, g)| g.clone());
        println!("image-kind {form} blink={b} mps={m}");
        let empty = format!("{form}{EMPTY_POOL}");
        let e = mps.iter().find(|(f, _)| *f == empty).map(|(_, g)| g.clone());
        if expect.is_some() {
            println!("image-kind {form} mps with the pool empty={}", e.as_deref().unwrap_or("no report"));
        }
        let e = e.unwrap_or_else(|| if expect.is_some() { "no report from the MPS child".into() } else { b.clone() });
        for (mode, got) in [("blink", &b), ("mps", &m), ("mps with no idle worker", &e)] {
            if !matches(got, expect) {
                failures.push(format!("{form} in {mode}: got {got:?}, wanted {expect:?} (None: loaded)"));
            }
        }
    }
    blink.shutdown().expect("shutdown");
    assert!(failures.is_empty(), "image kinds not handled as they should be:\n{}", failures.join("\n"));
}
