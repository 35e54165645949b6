//! What a program is (its spec) and how it stands (its status), with the checks a spec must pass before any GPU work.

use std::fmt;
use std::str::FromStr;

use crate::error::BackendError;

/// How programs are isolated from each other's loads. Chosen at start; there is no fallback between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IsolationMode {
    /// All programs in one context; a load stops and relaunches them all.
    #[default]
    Blink,
    /// One MPS client process per program; a load halts no other program.
    Mps,
}

impl fmt::Display for IsolationMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IsolationMode::Blink => "blink",
            IsolationMode::Mps => "mps",
        })
    }
}

impl FromStr for IsolationMode {
    type Err = BackendError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "blink" => Ok(Self::Blink),
            "mps" => Ok(Self::Mps),
            other => Err(BackendError::Invalid {
                what: "isolation mode".into(),
                reason: format!("{other:?}: expected blink or mps"),
            }),
        }
    }
}

/// The format of a GPU image, told from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    /// PTX assembly text.
    Ptx,
    /// An ELF file: an executable cubin (`nvcc -cubin`) or a relocatable one (`-cubin -dc`). A host
    /// object is ELF too; the JIT reads the header and refuses it, with any other unusable ELF.
    Cubin,
    /// A fat binary holding cubins and/or PTX.
    Fatbin,
    /// LTO intermediate representation (NVVM bitcode).
    LtoIr,
}

impl ImageKind {
    /// Recognises an image by its magic; `None` for anything else.
    pub fn detect(image: &[u8]) -> Option<Self> {
        const FATBIN_MAGIC: [u8; 4] = 0xBA55_ED50u32.to_le_bytes();
        const LTOIR_MAGIC: [u8; 4] = 0x7F4E_43EDu32.to_le_bytes();
        match image {
            [0x7f, b'E', b'L', b'F', ..] => Some(Self::Cubin),
            [a, b, c, d, ..] if [*a, *b, *c, *d] == FATBIN_MAGIC => Some(Self::Fatbin),
            [a, b, c, d, ..] if [*a, *b, *c, *d] == LTOIR_MAGIC => Some(Self::LtoIr),
            [b'B', b'C', 0xC0, 0xDE, ..] => Some(Self::LtoIr),
            _ => {
                let head = &image[..image.len().min(4096)];
                let text = std::str::from_utf8(head).ok()?;
                (text.contains(".version") && text.contains(".target")).then_some(Self::Ptx)
            }
        }
    }
}

impl ImageKind {
    /// Recognises program `program`'s image, or refuses it with a message that names the program.
    pub fn detect_for(program: &str, image: &[u8]) -> Result<Self, BackendError> {
        Self::detect(image).ok_or_else(|| BackendError::Invalid {
            what: format!("program {program:?} image"),
            reason: format!("{} bytes that are neither PTX, cubin, fatbin nor LTO-IR", image.len()),
        })
    }
}

impl fmt::Display for ImageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ImageKind::Ptx => "ptx",
            ImageKind::Cubin => "cubin",
            ImageKind::Fatbin => "fatbin",
            ImageKind::LtoIr => "ltoir",
        })
    }
}

/// How `mesh_main` is launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaunchShape {
    /// Grid dimensions in blocks.
    pub grid: [u32; 3],
    /// Block dimensions in threads.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem: u32,
}

impl Default for LaunchShape {
    fn default() -> Self {
        Self { grid: [1, 1, 1], block: [32, 1, 1], shared_mem: 0 }
    }
}

impl LaunchShape {
    /// Blocks in the grid.
    pub fn blocks(&self) -> u64 {
        // Saturating, as [`Self::threads_per_block`].
        self.grid.iter().fold(1u64, |n, &d| n.saturating_mul(u64::from(d)))
    }

    /// Threads per block.
    pub fn threads_per_block(&self) -> u64 {
        // Saturating: three u32 overflow a u64 (a block of `[u32::MAX; 3]`, from a request or a
        // damaged state file), and a wrapped product could pass for a small block.
        self.block.iter().fold(1u64, |n, &d| n.saturating_mul(u64::from(d)))
    }
}

/// Longest program name (the mailbox's name field).
pub const MAX_NAME: usize = 48;
/// Most channels a program binds (the mailbox's binding table).
pub const MAX_BINDINGS: usize = 8;

/// A program to load.
#[derive(Clone, PartialEq, Eq)]
pub struct ProgramSpec {
    /// Unique name.
    pub name: String,
    /// The image's bytes.
    pub image: Vec<u8>,
    /// The image's format.
    pub kind: ImageKind,
    /// The launch of `mesh_main`.
    pub shape: LaunchShape,
    /// Channel names, in the order `mesh_main` sees them (binding 0, 1, …).
    pub bindings: Vec<String>,
    /// SMs asked for this program (MPS mode: its worker's green context).
    pub sms: Option<u32>,
}

impl fmt::Debug for ProgramSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProgramSpec")
            .field("name", &self.name)
            .field("image", &format_args!("{} bytes", self.image.len()))
            .field("kind", &self.kind)
            .field("shape", &self.shape)
            .field("bindings", &self.bindings)
            .field("sms", &self.sms)
            .finish()
    }
}

impl ProgramSpec {
    /// A spec for `image`, its kind detected; refused when the bytes are no GPU image.
    pub fn new(name: impl Into<String>, image: Vec<u8>) -> Result<Self, BackendError> {
        let name = name.into();
        let kind = ImageKind::detect_for(&name, &image)?;
        Ok(Self { name, image, kind, shape: LaunchShape::default(), bindings: Vec::new(), sms: None })
    }

    /// Checks everything that needs no GPU: name, shape, bindings.
    pub fn validate(&self) -> Result<(), BackendError> {
        let bad = |reason: String| Err(BackendError::Invalid { what: format!("program {:?}", self.name), reason });
        if self.name.is_empty() || self.name.len() > MAX_NAME || !self.name.chars().all(|c| c.is_ascii_graphic()) {
            return bad(format!("name must be 1 to {MAX_NAME} printable ASCII characters"));
        }
        if self.shape.grid.contains(&0) || self.shape.block.contains(&0) {
            return bad(format!(
                "launch shape grid {:?} block {:?}: no dimension may be 0",
                self.shape.grid, self.shape.block
            ));
        }
        if self.shape.threads_per_block() > 1024 {
            return bad(format!("{} threads per block, the GPU allows at most 1024", self.shape.threads_per_block()));
        }
        if self.bindings.len() > MAX_BINDINGS {
            return bad(format!("{} channel bindings, at most {MAX_BINDINGS}", self.bindings.len()));
        }
        if self.image.is_empty() {
            return bad("empty image".into());
        }
        if self.sms == Some(0) {
            return bad("0 SMs asked for".into());
        }
        Ok(())
    }
}

/// Where a program stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProgramState {
    /// Launched, kernel running.
    Running,
    /// Stopped by meshd (during a blink, or left stopped after an error).
    Stopped,
    /// The kernel returned by itself with a code (mesh_exit).
    Exited(i32),
    /// The kernel or its worker failed; the reason.
    Faulted(String),
}

/// How a program's kernel stands, as its backend sees it (a stream's state, a worker's answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelRun {
    /// Still on the GPU.
    Running,
    /// Returned: stopped at meshd's request, or exited by itself.
    Returned,
    /// Failed; the driver's error.
    Failed(String),
}

impl ProgramState {
    /// The state every backend reports for a kernel: a failed one is faulted with the driver's error;
    /// a running one runs; a returned one is faulted with `left_stopped` when meshd left it stopped
    /// after an error, else exited with the code it gave `mesh_exit` (`exit_code`), else stopped.
    pub fn of_kernel(run: KernelRun, left_stopped: Option<&str>, exit_code: Option<i32>) -> Self {
        match (run, left_stopped) {
            (KernelRun::Failed(why), _) => Self::Faulted(why),
            (KernelRun::Running, _) => Self::Running,
            (KernelRun::Returned, Some(why)) => Self::Faulted(why.to_string()),
            (KernelRun::Returned, None) => exit_code.map_or(Self::Stopped, Self::Exited),
        }
    }
}

impl fmt::Display for ProgramState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProgramState::Running => f.write_str("running"),
            ProgramState::Stopped => f.write_str("stopped"),
            ProgramState::Exited(code) => write!(f, "exited({code})"),
            ProgramState::Faulted(why) => write!(f, "faulted: {why}"),
        }
    }
}

/// A program's status as meshd reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramStatus {
    /// The name.
    pub name: String,
    /// The mailbox slot.
    pub slot: u32,
    /// The state.
    pub state: ProgramState,
    /// Launches so far (bumped at every relaunch).
    pub generation: u32,
    /// The kernel's heartbeat counter.
    pub heartbeat: u64,
    /// The worker process, in MPS mode.
    pub worker_pid: Option<u32>,
    /// SMs the program's context holds (None: the whole GPU).
    pub sms: Option<u32>,
    /// The launch shape.
    pub shape: LaunchShape,
    /// The image format it was loaded from.
    pub kind: ImageKind,
    /// Relaunches by the watchdog after faults (blinks and upgrades not counted).
    pub restarts: u32,
    /// The last fault that stopped it: the driver's error, and the culprit where known.
    pub last_fault: Option<String>,
    /// When meshd noticed that fault, in milliseconds since the Unix epoch.
    pub last_fault_unix_ms: Option<u64>,
    /// Why it is not running, when it is not: left stopped after a fault (and why it was named),
    /// or ended by itself (`mesh_exit`), which the watchdog reports and does not relaunch.
    pub stopped_why: Option<String>,
    /// Its kernel runs as a previous meshd launched it, adopted by this one without a launch (MPS
    /// mode under `--orphan-grace-ms`); false once this meshd launched it itself (an upgrade, a
    /// recovery).
    pub adopted: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_recognised_by_magic() {
        assert_eq!(ImageKind::detect(b"\x7fELF\x02\x01"), Some(ImageKind::Cubin));
        assert_eq!(ImageKind::detect(&0xBA55_ED50u32.to_le_bytes()), Some(ImageKind::Fatbin));
        assert_eq!(ImageKind::detect(b"BC\xC0\xDE\x35"), Some(ImageKind::LtoIr));
        assert_eq!(ImageKind::detect(b"//\n.version 8.8\n.target sm_90\n"), Some(ImageKind::Ptx));
        assert_eq!(ImageKind::detect(b"garbage"), None);
        assert_eq!(ImageKind::detect(&[0xff; 3]), None);
        assert!(ProgramSpec::new("x", b"garbage".to_vec()).unwrap_err().to_string().contains("neither PTX"));
    }

    #[test]
    fn specs_are_checked_before_any_gpu_work() {
        let ok = ProgramSpec::new("echo", b".version 8.8\n.target sm_90\n".to_vec()).unwrap();
        ok.validate().unwrap();
        let cases: Vec<(ProgramSpec, &str)> = vec![
            (ProgramSpec { name: String::new(), ..ok.clone() }, "name"),
            (ProgramSpec { name: "a b".into(), ..ok.clone() }, "name"),
            (
                ProgramSpec { shape: LaunchShape { grid: [0, 1, 1], ..LaunchShape::default() }, ..ok.clone() },
                "may be 0",
            ),
            (
                ProgramSpec { shape: LaunchShape { block: [1024, 2, 1], ..LaunchShape::default() }, ..ok.clone() },
                "2048 threads",
            ),
            (ProgramSpec { bindings: vec!["c".into(); 9], ..ok.clone() }, "9 channel bindings"),
            (ProgramSpec { sms: Some(0), ..ok.clone() }, "0 SMs"),
        ];
        for (spec, why) in cases {
            let err = spec.validate().unwrap_err().to_string();
            assert!(err.contains(why), "{err} lacks {why}");
        }
    }

    #[test]
    fn a_kernels_run_maps_to_one_state() {
        use KernelRun::*;
        let of = ProgramState::of_kernel;
        assert_eq!(of(Failed("bad".into()), Some("parked"), Some(3)), ProgramState::Faulted("bad".into()));
        assert_eq!(of(Running, Some("parked"), None), ProgramState::Running);
        assert_eq!(of(Returned, Some("parked"), Some(3)), ProgramState::Faulted("parked".into()));
        assert_eq!(of(Returned, None, Some(3)), ProgramState::Exited(3));
        assert_eq!(of(Returned, None, None), ProgramState::Stopped);
    }

    #[test]
    fn isolation_mode_parses_and_refuses() {
        assert_eq!("mps".parse::<IsolationMode>().unwrap(), IsolationMode::Mps);
        assert_eq!(IsolationMode::default().to_string(), "blink");
        assert!("fast".parse::<IsolationMode>().unwrap_err().to_string().contains("blink or mps"));
    }
}
