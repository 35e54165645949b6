//! Every refusal a backend can give, each with what was refused and the numbers or log that explain why.

/// A backend's refusal.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs, reason = "a field whose name says what it is (program, pid, reason) needs no line of its own")]
pub enum BackendError {
    /// A request or option is malformed.
    #[error("{what}: {reason}")]
    Invalid {
        /// What was refused.
        what: String,
        reason: String,
    },
    /// No CUDA driver library could be loaded, or it lacks an entry point.
    #[error("CUDA driver unavailable: {0}")]
    NoDriver(String),
    /// The driver loaded but there is no usable GPU.
    #[error("no usable GPU: {0}")]
    NoDevice(String),
    /// A driver call failed.
    #[error("{call} failed: {message} ({code})")]
    Cuda {
        /// The driver entry point.
        call: &'static str,
        /// The CUresult.
        code: u32,
        /// The driver's own message.
        message: String,
    },
    /// libnvJitLink could not be loaded.
    #[error("nvJitLink unavailable: {0}")]
    NoJitLink(String),
    /// nvJitLink refused the image; its error log.
    #[error("program {program:?}: linking for {arch} failed:\n{log}")]
    Link {
        program: String,
        /// The target (`sm_90`).
        arch: String,
        /// nvJitLink's error log.
        log: String,
    },
    /// The image cannot run on this GPU, whatever the linker would say: not a GPU image (a host
    /// object), built for another architecture, holding nothing for this one, or truncated or corrupt.
    #[error("program {program:?}: image refused: {reason}")]
    Image {
        program: String,
        /// Why, with what to build instead where that helps.
        reason: String,
    },
    /// The image has no `mesh_main`.
    #[error("program {program:?}: the image has no entry point mesh_main ({detail})")]
    NoEntry {
        program: String,
        /// What the driver said.
        detail: String,
    },
    /// The launch cannot be resident beside the running programs (kcheck).
    #[error("program {program:?}: cannot be resident: {detail}")]
    NotResident {
        program: String,
        /// The occupancy figures.
        detail: String,
    },
    /// A green context of that many SMs cannot be made on this device.
    #[error("green context of {asked} SMs refused: {detail}")]
    SmPartition {
        /// SMs asked for.
        asked: u32,
        /// The device's minimum, alignment and count.
        detail: String,
    },
    /// No program has that name.
    #[error("program {0:?}: not loaded")]
    NoSuchProgram(String),
    /// A program of that name is already loaded.
    #[error("program {0:?}: already loaded (use upgrade to replace it)")]
    AlreadyLoaded(String),
    /// Programs did not stop within the deadline, so a blink could not complete.
    #[error("blink abandoned: program(s) {} did not stop within {waited_ms} ms", programs.join(", "))]
    StopTimeout {
        /// The programs still running.
        programs: Vec<String>,
        /// How long meshd waited.
        waited_ms: u64,
    },
    /// The backend is in a half-done state and accepts only status and shutdown.
    #[error("refused: the backend is degraded ({0}); only status and shutdown are accepted")]
    Degraded(String),
    /// The mailbox refused something (binding a channel, a slot).
    #[error("mailbox: {0}")]
    Mailbox(String),
    /// A program's kernel failed.
    #[error("program {program:?} faulted: {detail}")]
    Fault {
        program: String,
        /// The driver's error.
        detail: String,
    },
    /// The private MPS control daemon is missing, did not start, or did not answer.
    #[error("MPS control daemon: {0}")]
    MpsDaemon(String),
    /// A worker is not a client of meshd's MPS server.
    #[error("process {pid} is not a client of meshd's MPS server: {detail}")]
    NotOurClient {
        pid: u32,
        /// What the server lists said.
        detail: String,
    },
    /// A worker failed to start, register the mailbox, load, probe or launch.
    #[error("MPS worker {pid}: {detail}")]
    Worker {
        /// The worker's pid (0 before it started).
        pid: u32,
        /// What failed.
        detail: String,
    },
    /// Too many MPS clients for one device.
    #[error("{asked} MPS clients asked for, the device takes at most {limit}")]
    ClientLimit {
        /// Clients that would exist.
        asked: u32,
        limit: u32,
    },
    /// A sticky GPU fault left this process unable to use the GPU: meshd replaces its process (the
    /// new one takes the mailbox over and relaunches the programs), and refuses changes meanwhile.
    #[error("refused: {0}; meshd is replacing its process, try again in a moment")]
    Replacing(String),
    /// The backend was shut down.
    #[error("the backend is shut down")]
    ShutDown,
}

impl BackendError {
    /// The mailbox's refusal (`mesh_shm::ShmError`, which this crate cannot name), as a backend error.
    pub fn mailbox(e: impl std::fmt::Display) -> Self {
        Self::Mailbox(e.to_string())
    }
}

/// The backend's result type.
pub type Result<T, E = BackendError> = std::result::Result<T, E>;
