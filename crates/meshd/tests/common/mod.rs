//! Shared pieces of meshd's CPU tests: meshd's stand-in backend with test hooks, small socket clients, and writes into a mailbox's shared words (as a peer process can make them).

#![allow(dead_code)]

use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mesh_backend::{Backend, BackendError, IsolationMode, ProgramSpec, ProgramStatus, RecoveryBoard};
use mesh_shm::{CreateMode, Mailbox, MailboxConfig};
use meshd::protocol::{Request, Response, read_response, write_request};
use meshd::server::Opened;
use meshd::stand_in::{DeletedChannels, RecoveryKnob, StandInBackend};

/// meshd's [`StandInBackend`] with two hooks for the tests: a program whose name starts with `slow`
/// waits in `load` until the test sends on `gate`; one named `degraded` is refused as a degraded
/// backend would refuse it.
pub struct ListBackend {
    inner: StandInBackend,
    gate: Option<mpsc::Receiver<()>>,
    /// Every program loaded, in order (what the backend thread applied).
    pub log: Option<mpsc::Sender<String>>,
}

impl ListBackend {
    pub fn new(mailbox: &Mailbox) -> Self {
        Self { inner: StandInBackend::new(mailbox), gate: None, log: None }
    }

    /// Adopting the programs a killed meshd left running ([`StandInBackend::adopting`]).
    pub fn adopting(mailbox: &Mailbox) -> Self {
        Self { inner: StandInBackend::new(mailbox).adopting(), gate: None, log: None }
    }

    pub fn with_gate(mut self, gate: mpsc::Receiver<()>) -> Self {
        self.gate = Some(gate);
        self
    }

    pub fn with_log(mut self, log: mpsc::Sender<String>) -> Self {
        self.log = Some(log);
        self
    }

    /// With `knob`: the test arms a long recovery in place that the next watchdog tick acts out.
    pub fn with_knob(mut self, knob: RecoveryKnob) -> Self {
        self.inner = self.inner.with_recovery_knob(knob);
        self
    }

    /// With `deleted`: the test sees every channel meshd told the backend was deleted.
    pub fn with_deleted(mut self, deleted: DeletedChannels) -> Self {
        self.inner = self.inner.with_deleted_channels(deleted);
        self
    }

    /// Changes every program's status as a backend's recovery would (the watchdog tests).
    pub fn set_all(&mut self, f: impl FnMut(&mut ProgramStatus)) {
        self.inner.programs_mut().iter_mut().for_each(f);
    }

    /// What `Server::start` wants.
    pub fn opened(self) -> anyhow::Result<Opened> {
        Ok(Opened { backend: Box::new(self), device: "test double".into(), arch: None })
    }
}

impl Backend for ListBackend {
    fn mode(&self) -> IsolationMode {
        self.inner.mode()
    }
    fn load(&mut self, spec: ProgramSpec) -> mesh_backend::Result<ProgramStatus> {
        spec.validate()?;
        if spec.name.starts_with("slow")
            && let Some(gate) = &self.gate
        {
            if let Some(log) = &self.log {
                let _ = log.send(format!("waiting:{}", spec.name));
            }
            let _ = gate.recv();
        }
        if spec.name == "degraded" {
            return Err(BackendError::Degraded("a test said so".into()));
        }
        let name = spec.name.clone();
        let status = self.inner.load(spec)?;
        if let Some(log) = &self.log {
            let _ = log.send(name);
        }
        Ok(status)
    }
    fn upgrade(&mut self, name: &str, image: Vec<u8>) -> mesh_backend::Result<ProgramStatus> {
        self.inner.upgrade(name, image)
    }
    fn unload(&mut self, name: &str) -> mesh_backend::Result<()> {
        self.inner.unload(name)
    }
    fn status(&self) -> Vec<ProgramStatus> {
        self.inner.status()
    }
    fn watch(&mut self) -> Vec<String> {
        self.inner.watch()
    }
    fn take_events(&mut self) -> Vec<mesh_backend::BackendEvent> {
        self.inner.take_events()
    }
    fn set_recovery_board(&mut self, board: RecoveryBoard) {
        self.inner.set_recovery_board(board);
    }
    fn shutdown(&mut self) -> mesh_backend::Result<()> {
        self.inner.shutdown()
    }
    fn host_atomics(&self) -> bool {
        self.inner.host_atomics()
    }
    fn channel_deleted(&mut self, index: u32) {
        self.inner.channel_deleted(index);
    }
}

/// A tiny PTX image (enough for `ImageKind::detect`).
pub const PTX: &[u8] = b".version 8.0\n.target sm_90\n";

/// A load request for `name` with the PTX above.
pub fn load_req(name: &str, bind: &[&str]) -> Request {
    Request::Load {
        name: name.into(),
        image_len: PTX.len(),
        grid: [2, 1, 1],
        block: [64, 1, 1],
        shared_mem: 0,
        bind: bind.iter().map(|s| s.to_string()).collect(),
        sms: None,
        no_readiness: false,
    }
}

/// One request, one answer.
pub fn ask(socket: &Path, req: &Request, image: &[u8]) -> Response {
    let conn = UnixStream::connect(socket).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write_request(&mut conn.try_clone().unwrap(), req, image).unwrap();
    read_response(&mut BufReader::new(conn)).unwrap()
}

/// Waits for `f` to hold, up to `limit` (a deadline, not a measurement).
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    f()
}

/// Runs `f` on a thread; its result if it ends within `limit`, else None (the thread is left behind).
pub fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}

/// A small new mailbox (1 MiB, 8 slots, 8 channels) at `dir/mb`, what every server test starts from.
pub fn small_mailbox(dir: &Path) -> Mailbox {
    Mailbox::create(dir.join("mb"), &MailboxConfig { size: 1 << 20, slots: 8, channels: 8 }, CreateMode::Exclusive)
        .unwrap()
}

/// Stores `v` into the shared word at byte `at` of `mb`'s mapping, as another process of the uid can.
pub fn poke(mb: &Mailbox, at: u64, v: u64) {
    let (base, len) = mb.as_raw_parts();
    let at_usize = usize::try_from(at).expect("an offset of this machine's size");
    assert!(at.is_multiple_of(8) && at_usize + 8 <= len, "word {at} outside the mapping");
    // SAFETY: an 8-aligned offset inside the mapping (asserted), which `mb` keeps alive; the
    // mailbox's shared words are accessed atomically by every process.
    unsafe { std::sync::atomic::AtomicU64::from_ptr(base.add(at_usize).cast::<u64>()) }
        .store(v, std::sync::atomic::Ordering::Release);
}

/// Where entry `slot` of group `g` starts: its meshd line (binding word, then holder word), after
/// the group's header line; each entry is two lines.
pub fn group_entry(g: &mesh_shm::ChannelInfo, slot: u64) -> u64 {
    use mesh_shm::layout::LINE;
    g.slots_offset + LINE + 2 * LINE * slot
}
