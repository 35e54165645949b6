//! Shared pieces of the GPU tests and benchmarks: the gate, the test programs, and a device fixture.
//!
//! GPU tests run only with `MESH_GPU_TESTS=1` (set by `cargo xtask gpu-test` and by a bundle's
//! `run` script); without it each prints that it was skipped and how to run it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub mod chaos;
pub mod harness;
pub mod service;
pub mod stress;

use mesh_backend::ImageKind;
use mesh_cuda::{Context, Device, Jit, Module, RegisteredMailbox};
use mesh_shm::{CreateMode, Mailbox, MailboxConfig};

/// The variable that un-gates GPU tests.
pub const GATE: &str = "MESH_GPU_TESTS";

/// Whether GPU tests run; prints a skip notice naming `test` when they do not.
pub fn gpu_enabled(test: &str) -> bool {
    if std::env::var_os(GATE).is_some_and(|v| v == "1") {
        return true;
    }
    eprintln!("SKIPPED (no GPU requested) {test}: run `cargo xtask gpu-test`, or set {GATE}=1 on a machine with a GPU");
    false
}

/// Returns from the test, printing the skip notice, unless GPU tests are enabled.
#[macro_export]
macro_rules! require_gpu {
    ($name:expr) => {
        if !$crate::gpu_enabled($name) {
            return;
        }
    };
}

/// Where the test programs' PTX is: `MESH_PROGRAMS`, else `target/programs` of the workspace, where
/// `cargo xtask ptx` (and `gpu-test`, `bench`) compile `tests/programs/*.cu` with nvcc. A bundle's `run`
/// script points it at the bundle's `programs/`, which holds the sources and the PTX built beside them.
pub fn programs_dir() -> PathBuf {
    std::env::var_os("MESH_PROGRAMS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/programs")))
}

/// Where the test programs' CUDA sources are: [`programs_dir`] when it holds them (a bundle's
/// `programs/`), else the crate's `programs/`.
pub fn sources_dir() -> PathBuf {
    sources_in(&programs_dir(), Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/programs")))
}

fn sources_in(built: &Path, crate_sources: &Path) -> PathBuf {
    let has_sources = std::fs::read_dir(built)
        .map(|entries| entries.filter_map(Result::ok).any(|e| e.path().extension().is_some_and(|x| x == "cu")))
        .unwrap_or(false);
    if has_sources { built.to_path_buf() } else { crate_sources.to_path_buf() }
}

/// The PTX of test program `name`.
pub fn program(name: &str) -> Vec<u8> {
    let path = programs_dir().join(format!("{name}.ptx"));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!("test program {}: {e} (`cargo xtask ptx` builds the programs' PTX where nvcc exists)", path.display())
    })
}

/// Every test program's name (each `.cu` source), bar benchmark variants (`*_x_*`) that have no `.ptx`
/// built: one that nvcc refuses must not fail the tests of every other program (nvcc's own step says
/// it failed).
pub fn program_names() -> Vec<String> {
    names_in(&sources_dir(), &programs_dir())
}

fn names_in(sources: &Path, built: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(sources)
        .unwrap_or_else(|e| panic!("test programs' sources {}: {e}", sources.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .filter(|name| !name.contains("_x_") || built.join(format!("{name}.ptx")).exists())
        .collect();
    names.sort();
    names
}

/// Polls `cond` until it holds or `timeout` passes; returns whether it held.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    cond()
}

/// A device, its primary context, a mailbox in /dev/shm registered there, and a JIT for the device.
#[derive(Debug)]
pub struct Fixture {
    /// The GPU.
    pub device: Device,
    /// Its primary context (current on the creating thread).
    pub ctx: Context,
    /// The mailbox.
    pub mailbox: Mailbox,
    /// The mailbox's registration in `ctx`.
    pub registered: RegisteredMailbox,
    /// The JIT.
    pub jit: Jit,
    _dir: tempfile::TempDir,
}

impl Default for Fixture {
    fn default() -> Self {
        Self::new()
    }
}

impl Fixture {
    /// Sets everything up on device 0.
    pub fn new() -> Self {
        let device = Device::get(0).expect("device 0");
        let ctx = Context::primary(&device).expect("primary context");
        let shm = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" };
        let dir = tempfile::tempdir_in(shm).expect("temp dir");
        let mailbox = Mailbox::create(
            dir.path().join("mailbox"),
            &MailboxConfig { size: 128 << 20, slots: 64, channels: 256 },
            CreateMode::Exclusive,
        )
        .expect("mailbox");
        let registered = RegisteredMailbox::register(&ctx, &mailbox).expect("register the mailbox");
        let jit = Jit::start(&device.arch()).expect("JIT");
        Self { device, ctx, mailbox, registered, jit, _dir: dir }
    }

    /// Links test program `name` and loads it in `ctx`.
    pub fn load_in(&self, ctx: &Context, name: &str) -> Module {
        let linked = self.jit.link(name, program(name), ImageKind::Ptx).unwrap_or_else(|e| panic!("{name}: {e}"));
        Module::load(ctx, &linked.cubin).unwrap_or_else(|e| panic!("{name}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Programs are listed by their sources, not by PTX (none is committed): a program is listed
    /// before nvcc has built it, a variant only once it has its PTX.
    #[test]
    fn programs_are_listed_by_their_sources() {
        let sources = tempfile::tempdir().unwrap();
        let built = tempfile::tempdir().unwrap();
        for f in ["echo.cu", "echo_x_lean.cu", "ping_x_lean.cu", "stress.cuh"] {
            std::fs::write(sources.path().join(f), "").unwrap();
        }
        std::fs::write(built.path().join("ping_x_lean.ptx"), "").unwrap();
        assert_eq!(names_in(sources.path(), built.path()), ["echo", "ping_x_lean"]);
    }

    /// A bundle's `programs/` (sources and PTX together) is its own source directory; a directory
    /// of PTX alone (`target/programs`) or a missing one falls back to the crate's sources.
    #[test]
    fn sources_are_found_beside_the_ptx_or_in_the_crate() {
        let krate = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/programs"));
        assert!(krate.join("echo.cu").is_file(), "the crate's programs/ holds echo.cu");
        let built = tempfile::tempdir().unwrap();
        assert_eq!(sources_in(&built.path().join("missing"), krate), krate);
        std::fs::write(built.path().join("echo.ptx"), "").unwrap();
        assert_eq!(sources_in(built.path(), krate), krate);
        std::fs::write(built.path().join("echo.cu"), "").unwrap();
        assert_eq!(sources_in(built.path(), krate), built.path());
    }
}
