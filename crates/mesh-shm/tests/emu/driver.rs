//! What the emulation tests (warp_emulation.rs, bulk_emulation.rs, ll_emulation.rs) share: finding a C++ compiler, building a `tests/emu` program against the shipped header, and running it with a guard against hangs.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The host's C++ compiler: `$CXX`, else `c++`, else `g++`; None when none answers `--version`.
pub fn compiler() -> Option<String> {
    let candidates = std::env::var("CXX").into_iter().chain(["c++".to_string(), "g++".to_string()]);
    candidates.into_iter().find(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))
}

/// Builds `tests/emu/SOURCE` with `defines` (the header and tests/programs on the include path) into
/// the target's scratch folder as `name`; None (after saying SKIPPED) without a C++20 compiler.
pub fn built(source: &str, name: &str, defines: &[String]) -> Option<PathBuf> {
    built_from(&[(source, defines.to_vec())], name, &[])
}

/// Builds an executable `name` from several translation units of `tests/emu` (each a source and its
/// defines, the same source more than once if its defines differ), linked with `link` flags; None
/// (after saying SKIPPED) without a C++20 compiler.
pub fn built_from(units: &[(&str, Vec<String>)], name: &str, link: &[&str]) -> Option<PathBuf> {
    let Some(cxx) = compiler() else {
        println!("SKIPPED: no C++ compiler ($CXX, c++ or g++) for mesh.cuh's warp emulation");
        return None;
    };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let scratch = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let exe = scratch.join(name);
    let compile = |source: &str, defines: &[String], out: &Path, object: bool| {
        let mut cmd = Command::new(&cxx);
        cmd.args(["-std=c++20", "-O1", "-pthread", "-Wall", "-Wno-unknown-pragmas", "-Wno-unused-function"])
            .arg("-I")
            .arg(manifest.join("include"))
            .arg("-I")
            .arg(manifest.join("../../tests/programs"))
            .args(defines)
            .arg(manifest.join("tests/emu").join(source));
        if object {
            cmd.arg("-c");
        }
        cmd.arg("-o").arg(out).output().unwrap_or_else(|e| panic!("{cxx}: {e}"))
    };
    let failed = |source: &str, output: std::process::Output| -> Option<PathBuf> {
        let e = String::from_utf8_lossy(&output.stderr);
        if e.contains("c++20") || e.contains("<barrier>") {
            println!("SKIPPED: {cxx} cannot build C++20 (std::barrier): {}", e.lines().next().unwrap_or(""));
            return None;
        }
        panic!("building tests/emu/{source} ({name}) with {cxx} failed:\n{e}");
    };
    if let [(source, defines)] = units {
        let output = compile(source, defines, &exe, false);
        return if output.status.success() { Some(exe) } else { failed(source, output) };
    }
    let mut objects = Vec::new();
    for (i, (source, defines)) in units.iter().enumerate() {
        let object = scratch.join(format!("{name}.{i}.o"));
        let output = compile(source, defines, &object, true);
        if !output.status.success() {
            return failed(source, output);
        }
        objects.push(object);
    }
    let output = Command::new(&cxx)
        .arg("-pthread")
        .args(&objects)
        .args(link)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("{cxx}: {e}"));
    if !output.status.success() {
        panic!("linking {name} with {cxx} failed:\n{}", String::from_utf8_lossy(&output.stderr));
    }
    Some(exe)
}

/// Runs `exe` with `args`: its status, stdout and stderr (stdout also printed, with the time taken). A
/// child still running after `hung_after` is killed and the test fails: lanes that disagree meet at
/// different barriers and wait forever, which must fail the test, not stall CI.
pub fn run(exe: &Path, args: &[&str], hung_after: Duration) -> (ExitStatus, String, String) {
    let mut child =
        Command::new(exe).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("run the emulation");
    let started = Instant::now();
    // Pipes drained on their own threads: a child blocked on a full pipe would look hung.
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let out = std::thread::spawn(move || std::io::read_to_string(&mut out).unwrap_or_default());
    let err = std::thread::spawn(move || std::io::read_to_string(&mut err).unwrap_or_default());
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the emulation") {
            break status;
        }
        if started.elapsed() > hung_after {
            let _ = child.kill();
            let _ = child.wait();
            let (stdout, stderr) = (out.join().unwrap_or_default(), err.join().unwrap_or_default());
            panic!("{} {args:?} hung: killed after {hung_after:?}\n{stdout}\n{stderr}", exe.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (stdout, stderr) = (out.join().unwrap_or_default(), err.join().unwrap_or_default());
    println!("{stdout}");
    println!("{} {args:?} in {:.1} s", exe.display(), started.elapsed().as_secs_f64());
    (status, stdout, stderr)
}

/// Runs `exe` with `args` and asserts it succeeded saying `expect`.
pub fn passes(exe: &Path, args: &[&str], hung_after: Duration, expect: &str) {
    let (status, stdout, stderr) = run(exe, args, hung_after);
    assert!(
        status.success() && stdout.contains(expect),
        "the emulation failed ({} {args:?}, {status}; wanted {expect:?}):\n{stdout}\n{stderr}",
        exe.display()
    );
}
