//! The desired state: what meshd runs (channels; programs with their image, shape, bindings, SMs), recorded in a state directory so that a start after a crash relaunches it.
//!
//! Layout of the directory (mode 0700): `state.json`, written atomically (a temporary file, fsync,
//! rename) on every change, `images/<sha256>`, each image stored once by content hash, and
//! `linked/<sha256>.<arch>`, the image as the backend linked it for that GPU architecture (stored
//! when meshd replaces its process after a sticky GPU fault, so that the new process loads it
//! without linking again; a cache: checked by its own hash, ignored when unreadable). Beside the
//! programs, `state.json` carries what a replacement must not lose ([`Carried`]: restarts, the last
//! fault, a program left stopped; [`Recovery`]: recent replacements, a culprit search). It lives
//! as long as the mailbox: a clean shutdown that removes the mailbox forgets it too, `--fresh`
//! forgets it, a crash (or `--keep-shm`) leaves both for the next start.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use mesh_backend::watch::{Cause, fault_text};
use mesh_backend::{LaunchShape, ProgramSpec};

use crate::replace::Search;
use mesh_shm::{Mailbox, Protocol};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The version of `state.json` this build reads and writes.
pub const STATE_VERSION: u32 = 1;

/// A channel as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedChannel {
    /// Name.
    pub name: String,
    /// Bytes per message.
    pub msg_size: u32,
    /// Capacity.
    pub capacity: u32,
    /// Where its slots live (absent in older records: host).
    #[serde(default)]
    pub placement: String,
    /// The slots' format (absent in older records: by the message size, which made them LL).
    #[serde(default)]
    pub protocol: String,
    /// Parts each message is split into (absent in older records, and left out when 1: one part).
    #[serde(default = "crate::protocol::one_part", skip_serializing_if = "crate::protocol::is_one_part")]
    pub parts: u32,
}

/// A native worker as recorded (`meshd spawn`): what a restarted meshd starts again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedNative {
    /// Name.
    pub name: String,
    /// Its channels, in order.
    pub bind: Vec<String>,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// How long it may take to say `ready`, ms.
    pub ready_timeout_ms: u64,
    /// Its process and that process's start time (clock ticks after boot), while it runs outliving
    /// meshd (`--orphan-grace-ms`): what a restarted meshd checks before it adopts it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<(u32, u64)>,
}

impl RecordedNative {
    /// The record of `spec`.
    pub fn of(spec: &crate::native::NativeSpec) -> Self {
        Self {
            name: spec.name.clone(),
            bind: spec.bind.clone(),
            command: spec.command.clone(),
            ready_timeout_ms: u64::try_from(spec.ready_timeout.as_millis()).unwrap_or(u64::MAX),
            process: None,
        }
    }

    /// The record of `spec` running as `process` (pid, start time), if it is known.
    pub fn running(spec: &crate::native::NativeSpec, process: Option<(u32, u64)>) -> Self {
        Self { process, ..Self::of(spec) }
    }

    /// The spec to start it from.
    pub fn spec(&self) -> crate::native::NativeSpec {
        crate::native::NativeSpec {
            name: self.name.clone(),
            bind: self.bind.clone(),
            command: self.command.clone(),
            ready_timeout: std::time::Duration::from_millis(self.ready_timeout_ms),
        }
    }
}

/// A program as recorded: everything a load needs, the image by its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recorded {
    /// Name.
    pub name: String,
    /// SHA-256 of the image, hex: its file under `images/`.
    pub image_sha256: String,
    /// Grid.
    pub grid: [u32; 3],
    /// Block.
    pub block: [u32; 3],
    /// Dynamic shared memory per block.
    pub shared_mem: u32,
    /// Channels, binding 0, 1, …
    pub bindings: Vec<String>,
    /// SMs (MPS mode).
    pub sms: Option<u32>,
    /// `/readyz` leaves its heartbeat out (`meshd load --no-readiness`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_readiness: bool,
}

impl Recorded {
    /// The record of `spec`.
    pub fn of(spec: &ProgramSpec) -> Self {
        Self {
            name: spec.name.clone(),
            image_sha256: sha256_hex(&spec.image),
            grid: spec.shape.grid,
            block: spec.shape.block,
            shared_mem: spec.shape.shared_mem,
            bindings: spec.bindings.clone(),
            sms: spec.sms,
            no_readiness: false,
        }
    }
}

/// What meshd carries about one program across a replacement of its process (and a crash): what
/// `ps` showed, which the new process's backend cannot know.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Carried {
    /// Relaunches after faults so far (the new backend counts from zero; `ps` adds this).
    #[serde(default)]
    pub restarts: u32,
    /// The last fault that stopped it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fault: Option<String>,
    /// When meshd noticed it, ms since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fault_unix_ms: Option<u64>,
    /// Left stopped: not relaunched until an upgrade or a new load of its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<HeldMark>,
    /// The last fault's driver error while its culprit is searched for, so that the fault's text can
    /// name the culprit once found ([`Carried::culprit_found`]); absent otherwise, and in a
    /// `state.json` written before this field existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub searching: Option<String>,
}

impl Carried {
    /// Records `error`, caused by `cause`, as the last fault, noticed at `unix_ms`.
    pub fn set_fault(&mut self, error: &str, cause: &Cause, unix_ms: u64) {
        self.last_fault = Some(fault_text(error, cause));
        self.last_fault_unix_ms = Some(unix_ms);
        self.searching = matches!(cause, Cause::Searching).then(|| error.to_string());
    }

    /// A search named `culprit`: a fault still waiting for its culprit now names it (its time stays).
    pub fn culprit_found(&mut self, culprit: &str) {
        if let Some(error) = self.searching.take() {
            self.last_fault = Some(fault_text(&error, &Cause::Other(culprit.to_string())));
        }
    }
}

/// Why a program is left stopped across replacements.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldMark {
    /// `ps`'s `stopped_why`.
    pub why: String,
    /// It caused a GPU fault (`ps` shows it faulted); else it is only not relaunched (the bound on
    /// replacements was reached).
    pub culprit: bool,
}

/// A replacement of the process under way, as the old process left it for the new one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    /// The pid that asked (an exec keeps it: a different pid means a crash came in between).
    pub from_pid: u32,
    /// The driver's error.
    pub error: String,
    /// When the fault was noticed, `CLOCK_MONOTONIC` ns (one clock for both images).
    pub noticed_mono_ns: u64,
    /// When the old process called exec, `CLOCK_MONOTONIC` ns.
    pub exec_mono_ns: u64,
    /// The culprit, where it was named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub culprit: Option<String>,
}

/// What the watchdog's replacements of the process record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recovery {
    /// When the recent replacements happened, ms since the Unix epoch (the bound counts them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reexecs_unix_ms: Vec<u64>,
    /// A search by halves for an unnamed culprit, across replacements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<Search>,
    /// The replacement under way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<Pending>,
}

impl Recovery {
    fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// The whole record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredState {
    /// [`STATE_VERSION`].
    pub version: u32,
    /// Channels, in creation order.
    pub channels: Vec<RecordedChannel>,
    /// Programs, in load order.
    pub programs: Vec<Recorded>,
    /// Native workers meshd keeps running, by name order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub natives: Vec<RecordedNative>,
    /// What each program carries across a replacement of the process, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub carried: BTreeMap<String, Carried>,
    /// The watchdog's replacements of the process.
    #[serde(default, skip_serializing_if = "Recovery::is_empty")]
    pub recovery: Recovery,
}

/// The most `state.json` may hold: a record of everything a mailbox can hold is far smaller, and a
/// file past it (or a link to `/dev/zero`) is refused rather than read whole.
pub const MAX_STATE_FILE: u64 = 16 << 20;

/// The most a stored image may hold: what a load may send ([`crate::protocol::MAX_IMAGE`]).
const MAX_IMAGE: u64 = crate::protocol::MAX_IMAGE as u64;

/// Reads `path`, which must be a regular file of at most `max` bytes, not a symbolic link: a FIFO
/// (which would block), a device (endless), a link (out of the directory) or a file too big is
/// refused, naming what it is, before anything is read.
fn read_bounded(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let refused = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
    let file = match OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path) {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(refused("a symbolic link, which the state directory does not follow".into()));
        }
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(refused(format!("not a regular file ({})", kind_of(&meta.file_type()))));
    }
    if meta.len() > max {
        return Err(refused(format!("{} bytes, at most {max}", meta.len())));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(refused(format!("more than {max} bytes")));
    }
    Ok(bytes)
}

/// What kind of file `t` is, in words.
pub(crate) fn kind_of(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_file() {
        "a regular file"
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "an unknown kind of file"
    }
}

/// Refuses an existing directory that holds anything meshd does not write there: `--state-dir`
/// given a directory of other files would otherwise have its mode changed to 0700, and be removed
/// whole by a clean shutdown ([`StateStore::forget`]).
fn refuse_foreign(dir: &Path) -> Result<()> {
    // Not there yet, or not a directory: the creation that follows says why.
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
    for entry in entries {
        let name = entry.with_context(|| format!("state directory {}", dir.display()))?.file_name();
        let name = name.to_string_lossy();
        let ours = matches!(&*name, "state.json" | "images" | "linked") || name.starts_with("state.json.tmp.");
        if !ours {
            bail!(
                "state directory {}: it holds {name:?}, which meshd does not write there: not a meshd state \
                 directory (give --state-dir a new or empty directory)",
                dir.display()
            );
        }
    }
    Ok(())
}

/// The state directory and what it records.
#[derive(Debug)]
pub struct StateStore {
    dir: PathBuf,
    state: DesiredState,
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The state directory for `mailbox` when `--state-dir` is not given: under `/var/lib/meshd` where
/// that is writable (one directory per mailbox path), else `<mailbox>.state` beside the mailbox.
pub fn default_dir(mailbox: &Path) -> PathBuf {
    let system = Path::new("/var/lib/meshd");
    let usable = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(system).is_ok()
        && rustix::fs::access(system, rustix::fs::Access::WRITE_OK).is_ok();
    if usable {
        let flat: String =
            mailbox.to_string_lossy().trim_start_matches('/').chars().map(|c| if c == '/' { '_' } else { c }).collect();
        system.join(flat)
    } else {
        let mut beside = mailbox.as_os_str().to_owned();
        beside.push(".state");
        PathBuf::from(beside)
    }
}

impl StateStore {
    /// Opens (creating, mode 0700) the state directory and reads what it records; an empty record
    /// where there is none. A record this build cannot read is refused, naming `--fresh`.
    pub fn open(dir: &Path) -> Result<Self> {
        refuse_foreign(dir)?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir.join("images"))
            .with_context(|| format!("state directory {}", dir.display()))?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir.join("linked"))
            .with_context(|| format!("state directory {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("state directory {}", dir.display()))?;
        let file = dir.join("state.json");
        let state = match read_bounded(&file, MAX_STATE_FILE) {
            Ok(bytes) => {
                let state: DesiredState = serde_json::from_slice(&bytes).map_err(|e| {
                    // serde quotes the value it refused: a damaged record's 100 KB string is not
                    // worth a 100 KB error line.
                    let mut why = e.to_string();
                    if why.len() > 300 {
                        let cut = (0..=300).rev().find(|&i| why.is_char_boundary(i)).unwrap_or(0);
                        why = format!("{}… at line {} column {}", &why[..cut], e.line(), e.column());
                    }
                    anyhow::anyhow!(
                        "{}: not a meshd state record (start with --fresh to forget it): {why}",
                        file.display()
                    )
                })?;
                if state.version != STATE_VERSION {
                    bail!(
                        "{}: state version {}, this meshd reads version {STATE_VERSION} (start with --fresh to forget it)",
                        file.display(),
                        state.version
                    );
                }
                state
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                DesiredState { version: STATE_VERSION, ..DesiredState::default() }
            }
            Err(e) => bail!("reading {}: {e} (start with --fresh to forget it)", file.display()),
        };
        Ok(Self { dir: dir.to_path_buf(), state })
    }

    /// Refuses, before anything is made, a state directory holding anything meshd does not write
    /// there (what [`StateStore::open`] and [`StateStore::forget`] refuse too).
    pub fn check_dir(dir: &Path) -> Result<()> {
        refuse_foreign(dir)
    }

    /// Removes the directory and everything in it (`--fresh`, a clean shutdown); refused for a
    /// directory holding anything meshd does not write there (`--fresh --state-dir ~` must not
    /// remove a home directory).
    pub fn forget(dir: &Path) -> Result<()> {
        refuse_foreign(dir)?;
        match std::fs::remove_dir_all(dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e).with_context(|| format!("removing the state directory {}", dir.display())),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What is recorded.
    pub fn recorded(&self) -> &DesiredState {
        &self.state
    }

    /// Changes the record with `f` and writes it (the watchdog's marks and counts).
    pub fn update(&mut self, f: impl FnOnce(&mut DesiredState)) -> Result<()> {
        let before = self.state.clone();
        f(&mut self.state);
        if self.state == before { Ok(()) } else { self.write() }
    }

    /// The program recorded as `name`.
    pub fn program(&self, name: &str) -> Option<&Recorded> {
        self.state.programs.iter().find(|p| p.name == name)
    }

    /// Stores `linked`, the image of hash `image_sha256` as linked for `arch`, unless it is there
    /// (`linked/<hash>.<arch>`: its own SHA-256, then the bytes). A cache: not synced.
    pub fn store_linked(&self, image_sha256: &str, arch: &str, linked: &[u8]) -> Result<()> {
        let path = self.linked_path(image_sha256, arch)?;
        if path.exists() {
            return Ok(());
        }
        let mut bytes = Sha256::digest(linked).to_vec();
        bytes.extend_from_slice(linked);
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".tmp.{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let written = std::fs::write(&tmp, &bytes).and_then(|()| std::fs::rename(&tmp, &path));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written.with_context(|| format!("writing {}", path.display()))
    }

    /// The stored linked image of hash `image_sha256` for `arch`, when there is one and it is whole.
    pub fn linked(&self, image_sha256: &str, arch: &str) -> Option<Vec<u8>> {
        let bytes = read_bounded(&self.linked_path(image_sha256, arch).ok()?, MAX_IMAGE + 32).ok()?;
        let (sum, linked) = bytes.split_at_checked(32)?;
        (Sha256::digest(linked).as_slice() == sum && !linked.is_empty()).then(|| linked.to_vec())
    }

    fn linked_path(&self, image_sha256: &str, arch: &str) -> Result<PathBuf> {
        let plain = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !plain(image_sha256) || !plain(arch) {
            bail!("linked image {image_sha256:?} for {arch:?}: not a plain name");
        }
        Ok(self.dir.join("linked").join(format!("{image_sha256}.{arch}")))
    }

    /// The load that relaunches `p`: its stored image, shape, bindings and SMs.
    pub fn spec_of(&self, p: &Recorded) -> Result<ProgramSpec> {
        // A SHA-256 in hex and nothing else: a record naming `../../dev/zero` would be read for ever.
        if p.image_sha256.len() != 64 || !p.image_sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            bail!("program {:?}: its recorded image hash {:?} is not a SHA-256 in hex", p.name, p.image_sha256);
        }
        let path = self.dir.join("images").join(&p.image_sha256);
        let image = read_bounded(&path, MAX_IMAGE)
            .with_context(|| format!("program {:?}: its recorded image {}", p.name, path.display()))?;
        if sha256_hex(&image) != p.image_sha256 {
            bail!("image {}: its content no longer matches its hash", path.display());
        }
        let mut spec = ProgramSpec::new(&p.name, image)?;
        spec.shape = LaunchShape { grid: p.grid, block: p.block, shared_mem: p.shared_mem };
        spec.bindings = p.bindings.clone();
        spec.sms = p.sms;
        Ok(spec)
    }

    /// Creates every recorded channel the mailbox lacks (a mailbox lost at reboot while the state
    /// directory was kept); returns how many were created. A record the mailbox refuses (a damaged
    /// size, a name it cannot hold, no room left) is logged, naming the channel and why, and skipped:
    /// the others are still created.
    pub fn restore_channels(&mut self, mailbox: &Mailbox) -> Result<usize> {
        let mut created = 0;
        for c in &self.state.channels {
            if mailbox.channel(&c.name).is_err() {
                if let Err(e) = Self::restore_channel(mailbox, c) {
                    tracing::error!(
                        "recorded channel {:?} (message size {}, capacity {}, {} {}) not recreated: {e:#}",
                        c.name,
                        c.msg_size,
                        c.capacity,
                        c.protocol,
                        c.parts
                    );
                    continue;
                }
                created += 1;
            }
        }
        Ok(created)
    }

    /// Creates the recorded channel `c` in `mailbox`.
    fn restore_channel(mailbox: &Mailbox, c: &RecordedChannel) -> Result<()> {
        // A service's two channels are not channels of a protocol `channel create` names
        // (`Protocol`'s parse refuses them): each has its own constructor, and a group's `parts`
        // word is its entries.
        match c.protocol.as_str() {
            // A fan-in channel's `parts` word is its shards (0, from a state file before shards: one).
            "fanin" => drop(mailbox.create_fanin(&c.name, c.msg_size, c.capacity, c.parts.max(1))?),
            "group" => drop(mailbox.create_group(&c.name, c.parts, c.msg_size, c.capacity)?),
            other => {
                let placement = c.placement.parse().unwrap_or_default();
                let protocol = other.parse().unwrap_or_else(|_| Protocol::default_for(c.msg_size));
                mailbox.create_channel_parts(&c.name, c.msg_size, c.capacity, placement, protocol, c.parts.max(1))?;
            }
        }
        Ok(())
    }

    /// Records every channel of `mailbox` (after a takeover, or a channel or service created or
    /// deleted: a deleted one leaves the record, so that a restart does not make it again).
    pub fn record_channels(&mut self, mailbox: &Mailbox) -> Result<()> {
        let now: Vec<RecordedChannel> = mailbox
            .channels()?
            .into_iter()
            .map(|c| RecordedChannel {
                placement: c.placement.to_string(),
                protocol: c.protocol.to_string(),
                parts: c.parts,
                name: c.name,
                msg_size: c.msg_size,
                capacity: c.capacity,
            })
            .collect();
        if now != self.state.channels {
            self.state.channels = now;
            self.write()?;
        }
        Ok(())
    }

    /// Records a loaded program and stores its image.
    pub fn record_load(&mut self, p: Recorded, image: &[u8]) -> Result<()> {
        self.store_image(&p.image_sha256, image)?;
        self.state.programs.retain(|q| q.name != p.name);
        // A new program of that name: nothing carried over (a fault mark cleared).
        self.state.carried.remove(&p.name);
        self.state.programs.push(p);
        self.write()?;
        self.collect_images()
    }

    /// Records the native workers meshd wants running (written only when they changed).
    pub fn record_natives(&mut self, natives: Vec<RecordedNative>) -> Result<()> {
        if self.state.natives == natives {
            return Ok(());
        }
        self.update(|s| s.natives = natives)
    }

    /// Records a program's new image.
    pub fn record_upgrade(&mut self, name: &str, image: &[u8]) -> Result<()> {
        let hash = sha256_hex(image);
        self.store_image(&hash, image)?;
        if let Some(p) = self.state.programs.iter_mut().find(|p| p.name == name) {
            p.image_sha256 = hash;
        }
        // A new image may run again: its fault mark is cleared (restarts and the last fault stay).
        if let Some(c) = self.state.carried.get_mut(name) {
            c.held = None;
        }
        self.write()?;
        self.collect_images()
    }

    /// Forgets an unloaded program.
    pub fn record_unload(&mut self, name: &str) -> Result<()> {
        self.state.programs.retain(|p| p.name != name);
        self.state.carried.remove(name);
        self.write()?;
        self.collect_images()
    }

    fn store_image(&self, hash: &str, image: &[u8]) -> Result<()> {
        let path = self.dir.join("images").join(hash);
        if path.exists() {
            return Ok(());
        }
        write_atomically(&path, image)
    }

    /// Removes images (and linked images) no recorded program names.
    fn collect_images(&self) -> Result<()> {
        for sub in ["images", "linked"] {
            let dir = self.dir.join(sub);
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            for entry in entries {
                let entry = entry?;
                let name = entry.file_name().to_string_lossy().into_owned();
                let hash = name.split('.').next().unwrap_or_default();
                if !self.state.programs.iter().any(|p| p.image_sha256 == hash) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        Ok(())
    }

    fn write(&self) -> Result<()> {
        let mut bytes = serde_json::to_vec_pretty(&self.state)?;
        bytes.push(b'\n');
        write_atomically(&self.dir.join("state.json"), &bytes)
    }
}

/// Writes `bytes` to a temporary file beside `path`, syncs it, renames it over `path` and syncs the
/// directory: a crash at any point leaves either the old file or the new one, never a torn one.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().context("a file path without a directory")?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let written = (|| {
        let mut f = OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(|| format!("writing {}", path.display()))
}
