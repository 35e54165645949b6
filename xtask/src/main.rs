//! `cargo xtask`: the project's orchestration: `test`, `gpu-test [--bundle DIR]`, `bench [--bundle DIR]`,
//! `bench-report`, `ptx`, `demo`.

mod bench;
mod cmd;
mod report;
mod results;

use std::io::BufRead;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result, bail};

use cmd::{cargo, run};

const USAGE: &str = "usage: cargo xtask <command>
  test                    every CPU test of the workspace (what CI runs); GPU tests report themselves skipped
  gpu-test                build and run the GPU tests here (needs a GPU, its driver, libnvJitLink and nvcc)
  gpu-test --bundle DIR   build the GPU tests, meshd and the GPU benchmarks into DIR with a `run` script
                          for a GPU machine without a Rust toolchain
  bench                   build and run the GPU benchmarks here; figures to target/bench-results/DATE-GPU.jsonl
  bench ARGS...           one benchmark run, e.g. `bench rt-ab blink --host-delay-ns 0-1500` (`mesh-gpu-bench --help`)
  bench-report [FILES]    BENCHMARKS.md's tables from results files (default bench/results/*.jsonl); --check: fail if stale
  bench-report --compare OLD NEW   each figure's change; fails when one got worse by more than its noise (else 10%)
  demo                    build meshd and run the main job (scripts/demo.sh): needs a GPU and nvcc
  ptx                     build the test programs (tests/programs/*.cu) into target/programs/*.ptx with nvcc
                          (gpu-test and bench do it first) and regenerate the native-rust example's embedded PTX";

/// The GPU test programs' CUDA sources. Their PTX is built (`cargo xtask ptx`), never committed.
const PROGRAMS_DIR: &str = "tests/programs";
/// The variable that tells the GPU tests and benchmarks where the programs' PTX is.
const PROGRAMS_GATE: &str = "MESH_PROGRAMS";
/// The environment variable that un-gates the GPU tests.
const GPU_GATE: &str = "MESH_GPU_TESTS";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = root();
    std::env::set_current_dir(&root)?;
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["test"] => test(),
        ["gpu-test"] => gpu_test_here().inspect(|()| bench::say_gpu_test_results()),
        ["gpu-test", "--bundle", dir] | ["bench", "--bundle", dir] => {
            bundle(Path::new(dir)).and_then(|()| bench::stamp_bundle(Path::new(dir)))
        }
        ["bench", rest @ ..] => build_programs().and_then(|programs| bench::bench(rest, &programs)),
        ["bench-report", "--compare", old, new] => report::compare_files(Path::new(old), Path::new(new)),
        ["bench-report", rest @ ..] => report::bench_report(rest),
        ["ptx"] => ptx(),
        ["demo"] => {
            // Before the build: without nvcc the demo cannot build its program, so say so at once.
            let nvcc = nvcc()?;
            run(cargo().args(["build", "--release", "-p", "meshd"]))?;
            run(Command::new("scripts/demo.sh")
                .arg(root.join(target_dir()).join("release/meshd"))
                .arg(PROGRAMS_DIR)
                .env("NVCC", nvcc))
        }
        _ => {
            eprintln!("{USAGE}");
            bail!("unknown arguments {args:?}")
        }
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace root").to_path_buf()
}

/// CPU tests: the whole workspace (its doc examples too), then the GPU test crate again with its skip notices shown and
/// counted, the count said in one line at the end.
fn test() -> Result<()> {
    run(cargo().args(["test", "--workspace", "--all-targets"]).env_remove(GPU_GATE))?;
    // `--all-targets` leaves out the doc examples (a user copies them first): run them too.
    run(cargo().args(["test", "--workspace", "--doc"]).env_remove(GPU_GATE))?;
    // The mailbox killed at every step of a channel's or a service's creation and deletion: its crash
    // points exist only in a build with the `crash-points` feature, which nothing shipped enables.
    run(cargo().args(["test", "-p", "mesh-shm", "--features", "crash-points", "--test", "crash_steps"]))?;
    let skipped = run_counting_skips(
        cargo().args(["test", "-p", "mesh-gpu-tests", "--", "--nocapture", "--test-threads=1"]).env_remove(GPU_GATE),
    )?;
    eprintln!("GPU tests: {skipped} skipped here (each said SKIPPED above); `cargo xtask gpu-test` runs them on a GPU");
    Ok(())
}

/// [`run`], passing the command's stderr through and counting its lines that start with `SKIPPED`
/// (where a GPU test says it did not run).
fn run_counting_skips(cmd: &mut Command) -> Result<usize> {
    eprintln!("$ {cmd:?}");
    let mut child = cmd.stderr(Stdio::piped()).spawn().with_context(|| format!("running {cmd:?}"))?;
    let stderr = child.stderr.take().context("the test's stderr")?;
    let mut skipped = 0;
    for line in std::io::BufReader::new(stderr).split(b'\n') {
        let line = line.context("reading the test's stderr")?;
        if line.trim_ascii_start().starts_with(b"SKIPPED") {
            skipped += 1;
        }
        eprintln!("{}", String::from_utf8_lossy(&line));
    }
    let status = child.wait().with_context(|| format!("waiting for {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(skipped)
}

fn gpu_test_here() -> Result<()> {
    let programs = build_programs()?;
    // The end-to-end tests run these binaries (found beside the test executables' directory).
    run(cargo().args(["build", "--release", "-p", "meshd", "-p", "mesh-mps-worker"]))?;
    run(cargo()
        .args(["test", "--release", "-p", "mesh-gpu-tests", "--", "--nocapture", "--test-threads=1"])
        .env(GPU_GATE, "1")
        .env(PROGRAMS_GATE, programs))
}

/// The build's target directory: `CARGO_TARGET_DIR`, else the workspace's `target`.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from)
}

/// nvcc: the one `NVCC` names, else `nvcc` on PATH, else the CUDA toolkit's default place.
fn nvcc() -> Result<PathBuf> {
    find_nvcc(std::env::var_os("NVCC"))
}

/// The nvcc `named`, else `nvcc` on PATH, else the CUDA toolkit's default place; an error naming
/// what was tried when none runs.
fn find_nvcc(named: Option<std::ffi::OsString>) -> Result<PathBuf> {
    let tried: Vec<PathBuf> = match named {
        Some(named) => vec![named.into()],
        None => vec!["nvcc".into(), "/usr/local/cuda/bin/nvcc".into()],
    };
    for candidate in &tried {
        if Command::new(candidate).arg("--version").output().is_ok_and(|o| o.status.success()) {
            return Ok(candidate.clone());
        }
    }
    let tried: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
    bail!(
        "nvcc not found (tried {}): the GPU programs are built from their CUDA sources with the CUDA toolkit's \
         nvcc (docs/prerequisites.md); put it on PATH or name it in NVCC",
        tried.join(", ")
    )
}

/// Compiles every test program (`tests/programs/*.cu`) to PTX in `target/programs`; returns that
/// directory, absolute, for `MESH_PROGRAMS`.
pub(crate) fn build_programs() -> Result<PathBuf> {
    let nvcc = nvcc()?;
    let out = root().join(target_dir()).join("programs");
    let built = compile_programs(&nvcc, Path::new(PROGRAMS_DIR), &out)?;
    eprintln!("built the PTX of {built} test programs into {}", out.display());
    Ok(out)
}

/// Compiles each `*.cu` of `sources` to `out/NAME.ptx` with `nvcc`, one nvcc a core. `out` is emptied
/// first, so no program deleted since lingers there. Fails naming each program nvcc refused, with its
/// messages; returns how many were built.
fn compile_programs(nvcc: &Path, sources: &Path, out: &Path) -> Result<usize> {
    match std::fs::remove_dir_all(out) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("emptying {}", out.display()));
        }
        _ => {}
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut programs = Vec::new();
    for entry in std::fs::read_dir(sources).with_context(|| format!("reading {}", sources.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "cu") {
            programs.push(path);
        }
    }
    programs.sort();
    if programs.is_empty() {
        bail!("no test programs (*.cu) in {}", sources.display());
    }
    eprintln!(
        "$ {} {} (each of {} programs)",
        nvcc.display(),
        ptx_args(&sources.join("PROGRAM.cu"), out).join(" "),
        programs.len()
    );
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism().map_or(4, NonZeroUsize::get).min(programs.len());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                while let Some(source) = programs.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let failed = match Command::new(nvcc).args(ptx_args(source, out)).output() {
                        Ok(o) if o.status.success() => continue,
                        Ok(o) => format!("{}: {}", o.status, String::from_utf8_lossy(&o.stderr).trim_end()),
                        Err(e) => format!("running {}: {e}", nvcc.display()),
                    };
                    let mut failures = failures.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    failures.push(format!("{}: {failed}", source.display()));
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    if !failures.is_empty() {
        failures.sort();
        bail!("nvcc refused {} of {} test programs:\n{}", failures.len(), programs.len(), failures.join("\n"));
    }
    Ok(programs.len())
}

/// Test executables built by `cargo test --no-run`, read off cargo's JSON messages.
fn test_executables(args: &[&str]) -> Result<Vec<PathBuf>> {
    let out = cargo()
        .args(["test", "--release", "--no-run", "--message-format=json"])
        .args(args)
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the GPU tests failed:\n{}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8(out.stdout)?;
    let mut found = Vec::new();
    for line in text.lines().filter(|l| l.contains("\"kind\":[\"test\"]") && l.contains("\"test\":true")) {
        if let Some(start) = line.find("\"executable\":\"") {
            let rest = &line[start + 14..];
            if let Some(end) = rest.find('"') {
                found.push(PathBuf::from(&rest[..end]));
            }
        }
    }
    Ok(found)
}

/// Runs `strip FLAG path`; best effort (without `strip` the file stays as it is).
/// Copies the tree `from` into `to`, leaving out the entries of `from` named in `skip`.
fn copy_tree(from: &Path, to: &Path, skip: &[&str]) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let path = entry?.path();
        let name = path.file_name().context("file name")?;
        if skip.iter().any(|s| name == *s) {
            continue;
        }
        if path.is_dir() {
            copy_tree(&path, &to.join(name), &[])?;
        } else {
            std::fs::copy(&path, to.join(name))?;
        }
    }
    Ok(())
}

fn strip(flag: &str, path: &Path) {
    if Command::new("strip").arg(flag).arg(path).status().is_ok_and(|s| s.success()) {
        eprintln!("strip {flag} {}", path.display());
    }
}

/// Everything a GPU machine without cargo needs: binaries, the programs' sources (its `run` script
/// compiles them with nvcc), and that script.
fn bundle(dir: &Path) -> Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir.join("bin"))?;
    std::fs::create_dir_all(dir.join("programs"))?;
    run(cargo().args(["build", "--release", "--workspace", "--bins"]))?;
    for exe in test_executables(&["-p", "mesh-gpu-tests"])? {
        let name = exe.file_name().context("test executable name")?.to_string_lossy().to_string();
        // Strip cargo's hash suffix: `blink-1a2b3c` becomes `test-blink`.
        let stem = name.rsplit_once('-').map_or(name.as_str(), |(s, _)| s);
        std::fs::copy(&exe, dir.join("bin").join(format!("test-{stem}")))?;
    }
    let target = target_dir();
    for entry in std::fs::read_dir(target.join("release"))? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy().to_string();
        let is_bin =
            ["meshd", "mesh-mps-worker", "mesh-gpu-bench", "mesh-cli-bench", "mesh-native-rust", "mesh-service-client"]
                .contains(&name.as_str());
        if is_bin && path.is_file() {
            std::fs::copy(&path, dir.join("bin").join(&name))?;
        }
    }
    // A second build of meshd from the same source, telling itself apart in `--version`
    // (`0.1.0+next`): what the GPU test of `meshd handoff` hands over to.
    run(cargo().args(["build", "--release", "-p", "meshd", "--bin", "meshd"]).env("MESHD_BUILD_TAG", "next"))?;
    std::fs::copy(target.join("release/meshd"), dir.join("bin/meshd-next"))?;
    for entry in std::fs::read_dir(PROGRAMS_DIR)? {
        let path = entry?.path();
        if path.is_file() {
            std::fs::copy(&path, dir.join("programs").join(path.file_name().context("program name")?))?;
        }
    }
    std::fs::copy("crates/mesh-shm/include/mesh.cuh", dir.join("programs/mesh.cuh"))?;
    // The umbrella includes its parts by relative path: mesh/*.cuh and mesh/detail/*.cuh beside it.
    copy_tree(Path::new("crates/mesh-shm/include/mesh"), &dir.join("programs/mesh"), &[])?;
    // The raw limits the channel benchmarks stand beside (CUDA runtime programs, built by `run` with nvcc).
    std::fs::create_dir_all(dir.join("probes"))?;
    for f in ["ll_roundtrip.cu", "g2g.cu"] {
        std::fs::copy(Path::new("tests/probes").join(f), dir.join("probes").join(f))?;
    }
    // The native worker example in C (examples/native-cuda), compiled by `run` with nvcc against mesh-shm-c.
    run(cargo().args(["build", "--release", "-p", "mesh-shm-c"]))?;
    std::fs::create_dir_all(dir.join("native"))?;
    let lib = dir.join("native/libmesh_shm_c.a");
    std::fs::copy(target.join("release/libmesh_shm_c.a"), &lib)?;
    // The static library carries std's debug info (24 MiB of it, 15 without): a bundle travels
    // with the working tree under a 64 MiB limit. Best effort: without `strip` it goes as it is.
    strip("--strip-debug", &lib);
    std::fs::copy("crates/mesh-shm-c/include/mesh_shm.h", dir.join("native/mesh_shm.h"))?;
    for f in ["native_echo.cu", "native_kernel.cuh"] {
        std::fs::copy(Path::new("examples/native-cuda").join(f), dir.join("native").join(f))?;
    }
    // The docs' examples (`run examples` builds each with nvcc and runs its run.sh) and the header they include.
    copy_tree(Path::new("examples"), &dir.join("examples"), &["native-cuda", "native-rust"])?;
    copy_tree(Path::new("crates/mesh-shm/include"), &dir.join("include"), &[])?;
    std::fs::copy("tests/gpu-run.sh", dir.join("run"))?;
    std::fs::copy("scripts/demo.sh", dir.join("demo"))?;
    std::fs::set_permissions(dir.join("demo"), std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    std::fs::set_permissions(dir.join("run"), std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    // The Python package's wheel, tests and Rust peer (the run script's pytest step), where maturin is here.
    if which_maturin() {
        run(Command::new("crates/mesh-py/bundle.sh").arg(dir))?;
    } else {
        eprintln!("SKIPPED the Python package in the bundle: no maturin here (python3 -m pip install maturin)");
    }
    // The executables' symbols and std's debug info are a third of their size (28 of them): without
    // them the bundle leaves room for the Python wheel. A panic still prints its message and location;
    // only a RUST_BACKTRACE loses its function names.
    for entry in std::fs::read_dir(dir.join("bin"))? {
        strip("--strip-all", &entry?.path());
    }
    let size: u64 = walk(dir)?.iter().map(|p| p.metadata().map(|m| m.len()).unwrap_or(0)).sum();
    eprintln!("bundle {}: {:.1} MiB", dir.display(), size as f64 / (1 << 20) as f64);
    Ok(())
}

fn which_maturin() -> bool {
    Command::new("maturin").arg("--version").output().is_ok_and(|o| o.status.success())
}

fn walk(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() { out.extend(walk(&path)?) } else { out.push(path) }
    }
    Ok(out)
}

/// `cargo xtask ptx`: the test programs' PTX into target/programs, and the native-rust example's
/// embedded PTX, which a CPU build includes and so stays committed.
fn ptx() -> Result<()> {
    build_programs()?;
    // The C example's kernel, also built on mesh.cuh: examples/native-rust/native_kernel.ptx.
    let native = Path::new("examples/native-cuda/native_kernel.cu");
    run(Command::new(nvcc()?).args(ptx_args(native, Path::new("examples/native-rust"))))
}

/// nvcc's arguments for one program, its PTX into `out_dir`; `tests/gpu-run.sh` uses the same flags.
fn ptx_args(source: &Path, out_dir: &Path) -> Vec<String> {
    let name = source.file_stem().map_or_else(|| "program".into(), |s| s.to_string_lossy().into_owned());
    vec![
        "-ptx".into(),
        "-arch=compute_80".into(),
        "-I".into(),
        "crates/mesh-shm/include".into(),
        "-o".into(),
        out_dir.join(format!("{name}.ptx")).display().to_string(),
        source.display().to_string(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory of this test's own under the system's temp dir, empty.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A stand-in nvcc: copies the source to the `-o` file, refusing any source named `bad*`.
    fn fake_nvcc(dir: &Path) -> PathBuf {
        let nvcc = dir.join("nvcc");
        std::fs::write(
            &nvcc,
            "#!/bin/sh\n[ \"$1\" = --version ] && exit 0\nwhile [ $# -gt 1 ]; do [ \"$1\" = -o ] && out=$2; shift; done\n\
             case $(basename \"$1\") in bad*) echo \"error: $1 refused\" >&2; exit 2;; esac\ncp \"$1\" \"$out\"\n",
        )
        .unwrap();
        std::fs::set_permissions(&nvcc, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        nvcc
    }

    #[test]
    fn every_program_is_built_into_the_output_and_nothing_else_stays_there() {
        let dir = scratch("build");
        let nvcc = fake_nvcc(&dir);
        let (src, out) = (dir.join("src"), dir.join("out"));
        std::fs::create_dir_all(&src).unwrap();
        std::fs::create_dir_all(&out).unwrap();
        for (f, text) in [("echo.cu", "echo"), ("ping.cu", "ping"), ("stress.cuh", "header")] {
            std::fs::write(src.join(f), text).unwrap();
        }
        std::fs::write(out.join("gone.ptx"), "a program deleted since").unwrap();
        assert_eq!(compile_programs(&nvcc, &src, &out).unwrap(), 2);
        let mut built: Vec<_> = std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name()).collect();
        built.sort();
        assert_eq!(built, ["echo.ptx", "ping.ptx"]);
        assert_eq!(std::fs::read_to_string(out.join("ping.ptx")).unwrap(), "ping");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_program_nvcc_refuses_is_named_with_its_messages() {
        let dir = scratch("refuse");
        let nvcc = fake_nvcc(&dir);
        let src = dir.join("src");
        std::fs::create_dir_all(&src).unwrap();
        for f in ["echo.cu", "bad_one.cu", "ping.cu"] {
            std::fs::write(src.join(f), f).unwrap();
        }
        let err = format!("{:#}", compile_programs(&nvcc, &src, &dir.join("out")).unwrap_err());
        assert!(err.contains("1 of 3") && err.contains("bad_one.cu") && err.contains("refused"), "{err}");
        assert!(!err.contains("echo.cu"), "{err}");
        let err = format!("{:#}", compile_programs(&nvcc, &dir.join("none"), &dir.join("out")).unwrap_err());
        assert!(err.contains("none"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_nvcc_is_named_with_where_to_get_it() {
        let err = find_nvcc(Some("/nonexistent/bin/nvcc".into())).unwrap_err().to_string();
        assert!(err.contains("nvcc not found") && err.contains("/nonexistent/bin/nvcc"), "{err}");
        assert!(err.contains("docs/prerequisites.md") && err.contains("NVCC"), "{err}");
    }

    /// The bundle's `run` script compiles with the same flags as `cargo xtask ptx`, and no test
    /// program's PTX sits beside its source (it is built, into target/programs).
    #[test]
    fn the_run_script_builds_as_xtask_does_and_no_ptx_is_kept_with_the_sources() {
        let root = root();
        let args = ptx_args(Path::new("p.cu"), Path::new("out"));
        let script = std::fs::read_to_string(root.join("tests/gpu-run.sh")).unwrap();
        assert!(script.contains(&format!("\"$NVCC\" {} {}", args[0], args[1])), "gpu-run.sh: nvcc {args:?}");
        let kept: Vec<_> = std::fs::read_dir(root.join(PROGRAMS_DIR))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "ptx"))
            .collect();
        assert!(kept.is_empty(), "PTX beside the sources (`cargo xtask ptx` builds into target/programs): {kept:?}");
        assert!(root.join(PROGRAMS_DIR).join("echo.cu").is_file());
    }
}
