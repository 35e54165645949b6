//! `cargo xtask`: the project's orchestration: `test`, `gpu-test [--bundle DIR]`, `bench [--bundle DIR]`, `ptx`, `demo`.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

const USAGE: &str = "usage: cargo xtask <command>
  test                    every CPU test of the workspace (what CI runs); GPU tests report themselves skipped
  gpu-test                build and run the GPU tests here (needs a GPU, its driver and libnvJitLink)
  gpu-test --bundle DIR   build the GPU tests, meshd and the GPU benchmarks into DIR with a `run` script
                          for a GPU machine without a Rust toolchain
  bench                   build and run the GPU benchmarks here
  demo                    build meshd and run the main job (scripts/demo.sh): needs a GPU
  ptx                     regenerate tests/programs/*.ptx and the native example's PTX from their CUDA sources (needs nvcc)";

/// The GPU test programs, compiled to PTX by nvcc and committed beside their sources.
const PROGRAMS_DIR: &str = "tests/programs";
/// The environment variable that un-gates the GPU tests.
const GPU_GATE: &str = "MESH_GPU_TESTS";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = root();
    std::env::set_current_dir(&root)?;
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["test"] => test(),
        ["gpu-test"] => gpu_test_here(),
        ["gpu-test", "--bundle", dir] | ["bench", "--bundle", dir] => bundle(Path::new(dir)),
        ["bench"] => bench_here(),
        ["ptx"] => ptx(),
        ["demo"] => {
            run(cargo().args(["build", "--release", "-p", "meshd"]))?;
            run(Command::new("scripts/demo.sh").arg(root.join("target/release/meshd")).arg(PROGRAMS_DIR))
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

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("$ {cmd:?}");
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// CPU tests: the whole workspace (its doc examples too), then the GPU test crate again with its skip notices shown and
/// counted, the count said in one line at the end.
fn test() -> Result<()> {
    run(cargo().args(["test", "--workspace", "--all-targets"]).env_remove(GPU_GATE))?;
    // `--all-targets` leaves out the doc examples (a user copies them first): run them too.
    run(cargo().args(["test", "--workspace", "--doc"]).env_remove(GPU_GATE))?;
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
    // The end-to-end tests run these binaries (found beside the test executables' directory).
    run(cargo().args(["build", "--release", "-p", "meshd", "-p", "mesh-mps-worker"]))?;
    run(cargo()
        .args(["test", "--release", "-p", "mesh-gpu-tests", "--", "--nocapture", "--test-threads=1"])
        .env(GPU_GATE, "1"))
}

fn bench_here() -> Result<()> {
    run(cargo().args(["build", "--release", "-p", "mesh-mps-worker"]))?;
    run(cargo().args(["run", "--release", "-p", "mesh-gpu-tests", "--bin", "mesh-gpu-bench"]).env(GPU_GATE, "1"))?;
    // MPS mode in a process of its own (the first one holds a plain context).
    run(cargo()
        .args(["run", "--release", "-p", "mesh-gpu-tests", "--bin", "mesh-gpu-bench", "--", "mps"])
        .env(GPU_GATE, "1"))?;
    // Round trips through meshd's backends, host↔GPU (`rt-ab`: the header's loop and its raw limits in
    // turns) and GPU↔GPU, and bulk channels (large messages), each mode in a process of its own.
    for args in [
        ["rt", "blink"],
        ["rt", "mps"],
        ["rt-ab", "blink"],
        ["rt-ab", "mps"],
        ["g2g", "blink"],
        ["g2g", "mps"],
        ["bulk", "blink"],
        ["bulk", "mps"],
    ] {
        run(cargo()
            .args(["run", "--release", "-p", "mesh-gpu-tests", "--bin", "mesh-gpu-bench", "--"])
            .args(args)
            .env(GPU_GATE, "1"))?;
    }
    // The host round trip again over a client whose time between reply and request varies (0-1.5 µs,
    // drawn for each request): every path averaged over where its requests land between its polls, the
    // comparison that does not depend on one poll's luck (BENCHMARKS.md, session 19).
    for mode in ["blink", "mps"] {
        run(cargo()
            .args(["run", "--release", "-p", "mesh-gpu-tests", "--bin", "mesh-gpu-bench", "--", "rt-ab", mode])
            .env(GPU_GATE, "1")
            .env("MESH_RT_AB_HOST_DELAY_NS", "0-1500"))?;
    }
    // The control plane through the CLI (needs meshd beside the benchmark binary).
    run(cargo().args(["build", "--release", "-p", "meshd"]))?;
    run(cargo().args(["run", "--release", "-p", "mesh-gpu-tests", "--bin", "mesh-cli-bench"]).env(GPU_GATE, "1"))?;
    // A service of many clients (issue 26): meshd and the client processes beside the benchmark binary,
    // service.cu's PTX from `cargo xtask ptx`.
    run(cargo().args(["build", "--release", "-p", "mesh-gpu-tests", "--bin", "mesh-service-client"]))?;
    for mode in ["blink", "mps"] {
        run(cargo()
            .args(["run", "--release", "-p", "mesh-gpu-tests", "--bin", "mesh-gpu-bench", "--", "service", mode])
            .env(GPU_GATE, "1"))?;
    }
    Ok(())
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
fn strip(flag: &str, path: &Path) {
    if Command::new("strip").arg(flag).arg(path).status().is_ok_and(|s| s.success()) {
        eprintln!("strip {flag} {}", path.display());
    }
}

/// Everything a GPU machine without cargo needs: binaries, program sources and PTX, and a `run` script.
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
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from);
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
    for entry in std::fs::read_dir(PROGRAMS_DIR)? {
        let path = entry?.path();
        if path.is_file() {
            std::fs::copy(&path, dir.join("programs").join(path.file_name().context("program name")?))?;
        }
    }
    std::fs::copy("crates/mesh-shm/include/mesh.cuh", dir.join("programs/mesh.cuh"))?;
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

/// Regenerates the committed PTX of every test program (needs nvcc; the GPU machine has it).
fn ptx() -> Result<()> {
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
    for entry in std::fs::read_dir(PROGRAMS_DIR)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "cu") {
            run(Command::new(&nvcc).args(ptx_args(&path)))?;
        }
    }
    // The Rust native-worker example embeds the C example's kernel, also built on mesh.cuh.
    let mut native = ptx_args(Path::new("examples/native-cuda/native_kernel.cu"));
    let out = native.iter().position(|a| a == "-o").expect("ptx_args names an output") + 1;
    native[out] = "examples/native-rust/native_kernel.ptx".into();
    run(Command::new(&nvcc).args(native))?;
    Ok(())
}

/// nvcc's arguments for one program; `tests/gpu-run.sh` uses the same flags.
fn ptx_args(source: &Path) -> Vec<String> {
    vec![
        "-ptx".into(),
        "-arch=compute_80".into(),
        "-I".into(),
        "crates/mesh-shm/include".into(),
        "-o".into(),
        source.with_extension("ptx").display().to_string(),
        source.display().to_string(),
    ]
}
