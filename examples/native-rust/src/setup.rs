//! What the worker learns before it touches the GPU: its arguments, its environment (from
//! `meshd spawn`), its channels, and the `mesh_ctx` its kernel gets. None of it needs a GPU.

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail};
use mesh_shm::layout::MAX_BINDINGS;
use mesh_shm::{ChannelInfo, Mailbox, MeshBinding, MeshCtx};

/// The mailbox's path.
pub const ENV_MAILBOX: &str = "MESH_MAILBOX";
/// The worker's channels, comma-separated, in `--bind` order.
pub const ENV_CHANNELS: &str = "MESH_CHANNELS";
/// The descriptor to write `ready\n` to.
pub const ENV_READY_FD: &str = "MESH_READY_FD";
/// Bytes per message of both channels (the kernel's four 32-bit words).
pub const MSG_SIZE: u32 = 16;
/// Messages exchanged when no count is given.
pub const DEFAULT_COUNT: u64 = 100_000;
/// `slot` of a native worker's `mesh_ctx`: it has no program slot.
pub const NO_SLOT: u32 = u32::MAX;

/// The command line: `mesh-native-rust [COUNT [RESULT]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// Messages to send and receive back.
    pub count: u64,
    /// Where to write the result line too, if anywhere.
    pub result: Option<PathBuf>,
}

impl Args {
    /// Parses the arguments after the program's name.
    pub fn parse(mut args: impl Iterator<Item = OsString>) -> Result<Self> {
        let count = match args.next() {
            None => DEFAULT_COUNT,
            Some(a) => {
                let s = a.to_str().ok_or_else(|| anyhow!("COUNT {a:?}: not a number"))?;
                s.parse::<u64>().ok().filter(|&n| n > 0).ok_or_else(|| anyhow!("COUNT {s:?}: not a positive number"))?
            }
        };
        let result = args.next().map(PathBuf::from);
        if let Some(extra) = args.next() {
            bail!("unexpected argument {extra:?} (usage: mesh-native-rust [COUNT [RESULT]])");
        }
        Ok(Self { count, result })
    }
}

/// What `meshd spawn` put in the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerEnv {
    /// `MESH_MAILBOX`.
    pub mailbox: PathBuf,
    /// `MESH_CHANNELS`, split: at least two, at most [`MAX_BINDINGS`].
    pub channels: Vec<String>,
    /// `MESH_READY_FD`.
    pub ready_fd: i32,
}

impl WorkerEnv {
    /// Reads the variables through `var` (the process's: `std::env::var_os`).
    pub fn from_lookup(var: impl Fn(&str) -> Option<OsString>) -> Result<Self> {
        let get = |name: &str| {
            var(name)
                .ok_or_else(|| anyhow!("{name} is not set (is this process a native worker started by `meshd spawn`?)"))
        };
        let mailbox = PathBuf::from(get(ENV_MAILBOX)?);
        let channels = get(ENV_CHANNELS)?;
        let channels = channels.to_str().ok_or_else(|| anyhow!("{ENV_CHANNELS} {channels:?}: not UTF-8"))?;
        let channels: Vec<String> = channels.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect();
        if channels.len() < 2 {
            bail!(
                "needs two channels (meshd spawn NAME --bind TO --bind FROM -- ...), {ENV_CHANNELS} names {}",
                channels.len()
            );
        }
        if channels.len() > MAX_BINDINGS {
            bail!("{ENV_CHANNELS} names {} channels: a mesh_ctx holds {MAX_BINDINGS}", channels.len());
        }
        let fd = get(ENV_READY_FD)?;
        let ready_fd = fd
            .to_str()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .filter(|&fd| fd >= 0)
            .ok_or_else(|| anyhow!("{ENV_READY_FD} {fd:?}: not a descriptor number"))?;
        Ok(Self { mailbox, channels, ready_fd })
    }
}

/// Looks up channel `name`, which must carry [`MSG_SIZE`]-byte messages.
pub fn channel(mailbox: &Mailbox, name: &str) -> Result<ChannelInfo> {
    let info = mailbox.channel(name).with_context(|| format!("{ENV_CHANNELS} names {name:?}"))?;
    if info.msg_size != MSG_SIZE {
        bail!("channel {name:?} carries {}-byte messages, the kernel sends and receives {MSG_SIZE}", info.msg_size);
    }
    Ok(info)
}

/// The kernel's `mesh_ctx`: `base` (the mailbox's device address in this process's context) and
/// the channels `names` as bindings 0, 1, …; no program slot (what mesh-shm-c's `mesh_shm_ctx` builds).
pub fn mesh_ctx(mailbox: &Mailbox, base: u64, names: &[String]) -> Result<MeshCtx> {
    if names.len() > MAX_BINDINGS {
        bail!("{} channels: a mesh_ctx holds {MAX_BINDINGS}", names.len());
    }
    #[allow(clippy::cast_possible_truncation, reason = "at most MAX_BINDINGS (checked above)")]
    let binding_count = names.len() as u32;
    let mut ctx = MeshCtx { base, slot: NO_SLOT, binding_count, ..MeshCtx::default() };
    for (b, name) in ctx.bindings.iter_mut().zip(names) {
        let c = mailbox.channel(name).with_context(|| format!("{ENV_CHANNELS} names {name:?}"))?;
        if c.placement != mesh_shm::Placement::Host {
            bail!("channel {name:?}: its ring is in device memory; a native worker binds host channels only");
        }
        *b = MeshBinding {
            ring_offset: c.ring_offset,
            slots: base + c.slots_offset,
            msg_size: c.msg_size,
            capacity: c.capacity,
            placement: c.placement.code(),
            protocol: c.protocol.code(),
        };
    }
    Ok(ctx)
}

/// What the kernel wrote (`native_result` of examples/native-cuda/native_kernel.cuh: five 64-bit words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Messages received back.
    pub received: u64,
    /// Messages whose content was not the next in sequence (`u64::MAX`: the channels' sizes were refused).
    pub errors: u64,
    /// The first such message's index (`u64::MAX`: none).
    pub first_bad: u64,
    /// Messages sent.
    pub sent: u64,
    /// Whether the kernel gave up after its timeout.
    pub timed_out: bool,
}

/// Words of `native_result`.
pub const OUTCOME_WORDS: usize = 5;

impl Outcome {
    /// From the kernel's words, in `native_result` order.
    pub fn from_words(w: [u64; OUTCOME_WORDS]) -> Self {
        Self { received: w[0], errors: w[1], first_bad: w[2], sent: w[3], timed_out: w[4] != 0 }
    }

    /// Whether all `count` came back, in order, in time.
    pub fn ok(&self, count: u64) -> bool {
        self.received == count && self.errors == 0 && !self.timed_out
    }

    /// The result line (the C example's): `messages=N errors=E ms=T sent=S first_bad=B timed_out=0|1`.
    pub fn line(&self, ms: f32) -> String {
        format!(
            "messages={} errors={} ms={ms:.3} sent={} first_bad={} timed_out={}",
            self.received,
            self.errors,
            self.sent,
            self.first_bad as i64,
            u8::from(self.timed_out)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh_shm::{CreateMode, MailboxConfig};
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<WorkerEnv> {
        let map: HashMap<String, OsString> = pairs.iter().map(|(k, v)| (k.to_string(), OsString::from(v))).collect();
        WorkerEnv::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn env_of_a_spawned_worker() {
        let e = env(&[(ENV_MAILBOX, "/dev/shm/m"), (ENV_CHANNELS, "to-echo,from-echo"), (ENV_READY_FD, "7")]).unwrap();
        assert_eq!(e.mailbox, PathBuf::from("/dev/shm/m"));
        assert_eq!(e.channels, ["to-echo", "from-echo"]);
        assert_eq!(e.ready_fd, 7);
    }

    #[test]
    fn env_errors_name_the_variable() {
        let e = env(&[]).unwrap_err().to_string();
        assert!(e.contains("MESH_MAILBOX is not set") && e.contains("meshd spawn"), "{e}");
        let e = env(&[(ENV_MAILBOX, "m")]).unwrap_err().to_string();
        assert!(e.contains("MESH_CHANNELS is not set"), "{e}");
        let e = env(&[(ENV_MAILBOX, "m"), (ENV_CHANNELS, "only")]).unwrap_err().to_string();
        assert!(e.contains("needs two channels") && e.contains("names 1"), "{e}");
        let e = env(&[(ENV_MAILBOX, "m"), (ENV_CHANNELS, "a,b,c,d,e,f,g,h,i")]).unwrap_err().to_string();
        assert!(e.contains("names 9 channels"), "{e}");
        let e = env(&[(ENV_MAILBOX, "m"), (ENV_CHANNELS, "a,b")]).unwrap_err().to_string();
        assert!(e.contains("MESH_READY_FD is not set"), "{e}");
        let e = env(&[(ENV_MAILBOX, "m"), (ENV_CHANNELS, "a,b"), (ENV_READY_FD, "x")]).unwrap_err().to_string();
        assert!(e.contains("not a descriptor number"), "{e}");
        let e = env(&[(ENV_MAILBOX, "m"), (ENV_CHANNELS, "a,b"), (ENV_READY_FD, "-1")]).unwrap_err().to_string();
        assert!(e.contains("not a descriptor number"), "{e}");
    }

    #[test]
    fn args() {
        let p = |v: &[&str]| Args::parse(v.iter().map(OsString::from));
        assert_eq!(p(&[]).unwrap(), Args { count: DEFAULT_COUNT, result: None });
        assert_eq!(p(&["10", "/tmp/r"]).unwrap(), Args { count: 10, result: Some("/tmp/r".into()) });
        assert!(p(&["ten"]).unwrap_err().to_string().contains("not a positive number"));
        assert!(p(&["0"]).is_err());
        assert!(p(&["1", "r", "x"]).unwrap_err().to_string().contains("unexpected argument"));
    }

    #[test]
    fn ctx_binds_the_named_channels_in_order_without_a_slot() {
        let dir = tempfile::tempdir().unwrap();
        let mb = Mailbox::create(dir.path().join("mb"), &MailboxConfig::default(), CreateMode::Replace).unwrap();
        let a = mb.create_channel("to-echo", 16, 1024).unwrap();
        let b = mb.create_channel("from-echo", 16, 512).unwrap();
        mb.create_channel("wide", 32, 64).unwrap();
        let names = vec!["to-echo".to_string(), "from-echo".to_string()];
        let ctx = mesh_ctx(&mb, 0x7000_0000, &names).unwrap();
        assert_eq!((ctx.base, ctx.slot, ctx.slot_offset, ctx.binding_count), (0x7000_0000, NO_SLOT, 0, 2));
        assert_eq!(
            ctx.bindings[0],
            MeshBinding {
                ring_offset: a.ring_offset,
                slots: 0x7000_0000 + a.slots_offset,
                msg_size: 16,
                capacity: 1024,
                placement: 0,
                protocol: 0
            }
        );
        assert_eq!(
            ctx.bindings[1],
            MeshBinding {
                ring_offset: b.ring_offset,
                slots: 0x7000_0000 + b.slots_offset,
                msg_size: 16,
                capacity: 512,
                placement: 0,
                protocol: 0
            }
        );
        assert_eq!(ctx.bindings[2], MeshBinding::default());
        let e = mesh_ctx(&mb, 0, &["nope".to_string()]).unwrap_err();
        assert!(format!("{e:#}").contains("no such channel"), "{e:#}");
        assert!(channel(&mb, "to-echo").is_ok());
        let e = channel(&mb, "wide").unwrap_err().to_string();
        assert!(e.contains("32-byte messages"), "{e}");
    }

    #[test]
    fn outcome_line_and_verdict() {
        let o = Outcome::from_words([100, 0, u64::MAX, 100, 0]);
        assert!(o.ok(100) && !o.ok(101));
        assert_eq!(o.line(1.5), "messages=100 errors=0 ms=1.500 sent=100 first_bad=-1 timed_out=0");
        assert!(!Outcome::from_words([100, 0, u64::MAX, 100, 1]).ok(100));
        assert!(!Outcome::from_words([100, 3, 7, 100, 0]).ok(100));
    }
}
