//! The JIT: nvJitLink on its own thread, PTX / cubin / fatbin / LTO-IR in, one loadable image for the device out, cached by content.
//!
//! What each image needs is read off its headers first ([`crate::image`]): an executable cubin
//! for this architecture, or a fatbin holding SASS for it, is used as it is (an executable cubin
//! is no link input: the "linked" result of one holds no kernel); PTX, LTO-IR, a relocatable cubin
//! and a fatbin holding only PTX or LTO-IR go through nvJitLink; a fatbin whose SASS for this
//! architecture is compressed (of unknown ELF type) is linked, and used as it is when the link
//! yields no code (executable SASS); anything else is refused with the reason, before any GPU work.
//!
//! The thread loads libnvJitLink and links a one-instruction PTX before it
//! reports ready, so that the library's start-up (about 30 ms on the H200)
//! is paid at start, never on a user's load. Requests arrive through a
//! crossbeam channel; each gets its answer on its own one-shot channel, so
//! the control path can keep serving while a link runs.

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use mesh_backend::{BackendError, ImageKind};
use nvjitlink_sys::{InputType, NvJitLink};
use sha2::{Digest, Sha256};

use crate::image::{self, Plan};

/// A linked image.
#[derive(Debug, Clone)]
pub struct Linked {
    /// What to load (`cuModuleLoadData`): a cubin for the device's architecture, or a fatbin
    /// holding SASS for it (used as it is; the driver picks that entry).
    pub cubin: Arc<Vec<u8>>,
    /// Whether the image was used as it is, neither compiled nor linked.
    pub as_is: bool,
    /// nvJitLink's info log (may be empty).
    pub info_log: String,
    /// Whether it came from the cache.
    pub cached: bool,
    /// Time spent linking (zero when cached).
    pub link_time: Duration,
}

struct Request {
    name: String,
    image: Vec<u8>,
    kind: ImageKind,
    reply: Sender<Result<Linked, BackendError>>,
}

type Cache = Arc<Mutex<HashMap<[u8; 32], Linked>>>;

/// The JIT thread's handle. Dropping it stops the thread.
#[derive(Debug)]
pub struct Jit {
    tx: Option<Sender<Request>>,
    arch: String,
    cache: Cache,
    thread: Option<std::thread::JoinHandle<()>>,
    /// How long the start-up link took (the cost nobody pays later).
    pub warmup: Duration,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Request({}, {} bytes of {})", self.name, self.image.len(), self.kind)
    }
}

/// A pending link: wait on it when the cubin is needed.
#[derive(Debug)]
pub struct Pending(Receiver<Result<Linked, BackendError>>);

impl Pending {
    /// Waits for the result.
    pub fn wait(self) -> Result<Linked, BackendError> {
        self.0.recv().unwrap_or_else(|_| Err(BackendError::NoJitLink("the JIT thread ended".into())))
    }
}

fn key(arch: &str, kind: ImageKind, image: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(arch.as_bytes());
    h.update([0, kind as u8]);
    h.update(image);
    h.finalize().into()
}

impl Jit {
    /// Starts the JIT thread for `arch` (`sm_90`), loading and warming up nvJitLink before returning.
    pub fn start(arch: &str) -> Result<Self, BackendError> {
        let (tx, rx) = unbounded::<Request>();
        let (ready_tx, ready_rx) = bounded(1);
        let cache: Cache = Arc::default();
        let arch_owned = arch.to_string();
        let thread_cache = cache.clone();
        let thread = std::thread::Builder::new()
            .name("mesh-jit".into())
            .spawn(move || {
                let warm = warm_up(&arch_owned);
                let ok = warm.is_ok();
                let _ = ready_tx.send(warm);
                if !ok {
                    return;
                }
                for req in rx {
                    let result = link(&arch_owned, &req.name, &req.image, req.kind);
                    if let Ok(linked) = &result {
                        thread_cache.lock().insert(key(&arch_owned, req.kind, &req.image), linked.clone());
                    }
                    let _ = req.reply.send(result);
                }
            })
            .map_err(|e| BackendError::NoJitLink(format!("cannot start the JIT thread: {e}")))?;
        let warmup = ready_rx.recv().map_err(|_| BackendError::NoJitLink("the JIT thread died at start".into()))??;
        Ok(Self { tx: Some(tx), arch: arch.to_string(), cache, thread: Some(thread), warmup })
    }

    /// The target architecture.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Queues a link; a cached image is answered at once without touching the thread.
    pub fn submit(&self, name: &str, image: Vec<u8>, kind: ImageKind) -> Pending {
        let (reply, rx) = bounded(1);
        let hit = self.cache.lock().get(&key(&self.arch, kind, &image)).cloned();
        if let Some(mut linked) = hit {
            linked.cached = true;
            linked.link_time = Duration::ZERO;
            let _ = reply.send(Ok(linked));
        } else if let Some(tx) = &self.tx {
            let _ = tx.send(Request { name: name.to_string(), image, kind, reply });
        }
        Pending(rx)
    }

    /// Links and waits.
    pub fn link(&self, name: &str, image: Vec<u8>, kind: ImageKind) -> Result<Linked, BackendError> {
        self.submit(name, image, kind).wait()
    }

    /// Cached images.
    pub fn cache_len(&self) -> usize {
        self.cache.lock().len()
    }
}

impl Drop for Jit {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Loads the library and links a trivial kernel, so that the first real link is warm.
fn warm_up(arch: &str) -> Result<Duration, BackendError> {
    let start = Instant::now();
    let ptx = format!(".version 8.0\n.target {arch}\n.address_size 64\n.visible .entry mesh_jit_warmup() {{ ret; }}\n");
    link(arch, "warm-up", ptx.as_bytes(), ImageKind::Ptx)?;
    Ok(start.elapsed())
}

/// One link, on the calling thread: the image checked, then used as it is or linked by nvJitLink.
pub fn link(arch: &str, name: &str, image: &[u8], kind: ImageKind) -> Result<Linked, BackendError> {
    let start = Instant::now();
    let refused = |reason: String| BackendError::Image { program: name.to_string(), reason };
    let as_is = |info_log: String| Linked {
        cubin: Arc::new(image.to_vec()),
        as_is: true,
        info_log,
        cached: false,
        link_time: start.elapsed(),
    };
    match image::plan(arch, kind, image).map_err(|e| refused(e.to_string()))? {
        Plan::AsIs => Ok(as_is(String::new())),
        Plan::Link { input, lto } => nvjitlink(arch, name, image, input, lto, start),
        // Compressed SASS for this GPU: linked if relocatable; executable SASS links to no code,
        // and is then what the driver loads. Without nvJitLink the driver is left to judge it.
        Plan::LinkOrAsIs { lto } => match NvJitLink::get() {
            Err(e) => Ok(as_is(format!("compressed SASS used as it is: nvJitLink unavailable ({e})"))),
            Ok(_) => {
                let linked = nvjitlink(arch, name, image, InputType::Fatbin, lto, start)?;
                if image::has_code(&linked.cubin) {
                    Ok(linked)
                } else {
                    Ok(as_is("compressed executable SASS used as it is (its link held no code)".into()))
                }
            }
        },
    }
}

/// Links `image` through nvJitLink as `input`.
fn nvjitlink(
    arch: &str,
    name: &str,
    image: &[u8],
    input: InputType,
    lto: bool,
    start: Instant,
) -> Result<Linked, BackendError> {
    let lib = NvJitLink::get().map_err(|e| BackendError::NoJitLink(e.to_string()))?;
    let mut options = vec![CString::new(format!("-arch={arch}")).expect("no NUL")];
    if lto {
        options.push(CString::new("-lto").expect("no NUL"));
    }
    let refs: Vec<&std::ffi::CStr> = options.iter().map(|c| c.as_c_str()).collect();
    let link_err = |log: String| BackendError::Link { program: name.to_string(), arch: arch.to_string(), log };
    // Destroyed when it goes out of scope, on every path.
    let linker = lib.linker(&refs).map_err(|e| link_err(e.to_string()))?;
    let cname = CString::new(name.replace('\0', "?")).expect("NULs replaced");
    // nvJitLink reads PTX as a C string: without a terminating NUL it runs past the buffer and then
    // calls the input malformed (seen on the H200: "does not match type NVJITLINK_INPUT_PTX").
    let terminated;
    let image = if input == InputType::Ptx && image.last() != Some(&0) {
        terminated = [image, &[0u8][..]].concat();
        &terminated[..]
    } else {
        image
    };
    let result = linker
        .add_data(input, image, &cname)
        .and_then(|()| linker.complete())
        .and_then(|()| linker.linked_cubin())
        .map_err(|e| {
            let log = linker.error_log();
            link_err(if log.is_empty() { e.to_string() } else { format!("{e}\n{log}") })
        })
        .map(|cubin| (cubin, linker.info_log()));
    let (cubin, info_log) = result?;
    Ok(Linked { cubin: Arc::new(cubin), as_is: false, info_log, cached: false, link_time: start.elapsed() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::tests::{cubin_sm90, elf, fatbin};

    /// Images used as they are need no nvJitLink, so this runs on a machine without CUDA.
    #[test]
    fn executable_cubins_and_fatbin_sass_are_used_as_they_are() {
        let cubin = cubin_sm90();
        let linked = link("sm_90", "hb", &cubin, ImageKind::Cubin).unwrap();
        assert!(linked.as_is);
        assert_eq!(*linked.cubin, cubin);
        let fat = fatbin(&[(2, 90, 0, &cubin)]);
        let linked = link("sm_90", "hb", &fat, ImageKind::Fatbin).unwrap();
        assert!(linked.as_is);
        assert_eq!(*linked.cubin, fat);
    }

    #[test]
    fn refusals_name_the_program_and_the_reason() {
        let cases: [(Vec<u8>, ImageKind, &str); 4] = [
            (elf(190, 2, 8, 0x0600_5004), ImageKind::Cubin, "built for sm_80; this GPU is sm_90"),
            (elf(62, 1, 0, 0), ImageKind::Cubin, "a host object"),
            (cubin_sm90()[..100].to_vec(), ImageKind::Cubin, "truncated"),
            (fatbin(&[(2, 80, 0x2000, &[0; 8])]), ImageKind::Fatbin, "holds sm_80 SASS"),
        ];
        for (image, kind, why) in cases {
            match link("sm_90", "prog", &image, kind) {
                Err(e @ BackendError::Image { .. }) => {
                    let text = e.to_string();
                    assert!(text.starts_with("program \"prog\": image refused: ") && text.contains(why), "{text}");
                }
                other => panic!("{why}: {other:?}"),
            }
        }
    }
}
