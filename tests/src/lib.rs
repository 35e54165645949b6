//! Shared pieces of the GPU tests and benchmarks: the gate, the test programs, and a device fixture.
//!
//! GPU tests run only with `MESH_GPU_TESTS=1` (set by `cargo xtask gpu-test` and by a bundle's
//! `run` script); without it each prints that it was skipped and how to run it.

use std::path::PathBuf;
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

/// Where the test programs (`*.cu` and their `*.ptx`) are: `MESH_PROGRAMS`, else the crate's `programs/`.
pub fn programs_dir() -> PathBuf {
    std::env::var_os("MESH_PROGRAMS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/programs")))
}

/// The PTX of test program `name`.
pub fn program(name: &str) -> Vec<u8> {
    let path = programs_dir().join(format!("{name}.ptx"));
    std::fs::read(&path)
        .unwrap_or_else(|e| panic!("test program {}: {e} (run `cargo xtask ptx` where nvcc exists)", path.display()))
}

/// Every test program's name (each `.cu` file), bar benchmark variants (`*_x_*`) that have no `.ptx` beside
/// them: variants written without nvcc (issue 24's echo_x_pollers, echo_x_lean, ping_x_lean) get their PTX
/// from the bundle's nvcc step, and one that nvcc refuses must not fail the tests of every other program.
pub fn program_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(programs_dir())
        .expect("programs dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .filter(|p| {
            let variant = p.file_stem().is_some_and(|s| s.to_string_lossy().contains("_x_"));
            !variant || p.with_extension("ptx").exists()
        })
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
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
