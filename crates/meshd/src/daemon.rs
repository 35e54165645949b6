//! `meshd run`: the mailbox, a backend and the control socket wired together, until shutdown or a signal.

use std::io::BufReader;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use mesh_backend::{Backend, LaunchShape, ProgramSpec, cleanup};
use mesh_shm::Mailbox;

use crate::protocol::{ChannelRow, Info, ProgramRow, Request, Response, read_request, write_response};

/// What the loop serves.
pub struct Daemon {
    /// The backend.
    pub backend: Box<dyn Backend>,
    /// The mailbox.
    pub mailbox: Mailbox,
    /// The GPU's name, for `info`.
    pub device: String,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Daemon({} on {}, mailbox {})", self.backend.mode(), self.device, self.mailbox.path().display())
    }
}

/// Binds the control socket with mode 0600, refusing when a live meshd already answers there.
pub fn bind_socket(path: &Path) -> Result<UnixListener> {
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            bail!("control socket {}: another meshd is listening there", path.display());
        }
        std::fs::remove_file(path).with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    // The socket is created with the process umask: tighten it for the bind so that no other user can connect in between.
    let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o177));
    let bound = UnixListener::bind(path);
    rustix::process::umask(old);
    let listener = bound.with_context(|| format!("control socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

impl Daemon {
    /// Serves `listener` until a `shutdown` request or until `stop` is set (by SIGINT / SIGTERM).
    /// Returns whether every program stopped (false: some kernel ignored its stop request and still runs).
    pub fn serve(&mut self, listener: &UnixListener, stop: &Arc<AtomicBool>) -> Result<bool> {
        listener.set_nonblocking(true)?;
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((conn, _)) => {
                    if self.handle(conn) {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => tracing::warn!("accept: {e}"),
            }
        }
        tracing::info!("shutting down: stopping every program");
        match self.backend.shutdown() {
            Ok(()) => Ok(true),
            Err(e) => {
                tracing::error!("shutdown: {e}");
                Ok(false)
            }
        }
    }

    /// Handles one connection; returns true when it asked for shutdown.
    fn handle(&mut self, conn: UnixStream) -> bool {
        let _ = conn.set_nonblocking(false);
        let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
        let mut reader = BufReader::new(match conn.try_clone() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("connection: {e}");
                return false;
            }
        });
        let mut writer = conn;
        let (response, shutdown) = match read_request(&mut reader) {
            Ok((Request::Shutdown, _)) => (Response::ok(), true),
            Ok((req, image)) => (self.answer(req, image), false),
            Err(e) => (Response::error(format!("{e:#}")), false),
        };
        if let Err(e) = write_response(&mut writer, &response) {
            tracing::warn!("answering a client: {e}");
        }
        shutdown
    }

    fn rows(&self) -> Vec<ProgramRow> {
        self.backend.status().iter().map(ProgramRow::from).collect()
    }

    fn answer(&mut self, req: Request, image: Vec<u8>) -> Response {
        let result: Result<Response> = (|| match req {
            Request::Load { name, grid, block, shared_mem, bind, sms, .. } => {
                let mut spec = ProgramSpec::new(&name, image)?;
                spec.shape = LaunchShape { grid, block, shared_mem };
                spec.bindings = bind;
                spec.sms = sms;
                let status = self.backend.load(spec)?;
                tracing::info!(program = %name, slot = status.slot, "loaded");
                Ok(Response { ok: true, programs: Some(vec![ProgramRow::from(&status)]), ..Response::default() })
            }
            Request::Upgrade { name, .. } => {
                let status = self.backend.upgrade(&name, image)?;
                tracing::info!(program = %name, generation = status.generation, "upgraded");
                Ok(Response { ok: true, programs: Some(vec![ProgramRow::from(&status)]), ..Response::default() })
            }
            Request::Unload { name } => {
                self.backend.unload(&name)?;
                tracing::info!(program = %name, "unloaded");
                Ok(Response::ok())
            }
            Request::Ps => Ok(Response { ok: true, programs: Some(self.rows()), ..Response::default() }),
            Request::ChannelCreate { name, msg_size, capacity } => {
                self.mailbox.create_channel(&name, msg_size, capacity)?;
                tracing::info!(channel = %name, msg_size, capacity, "channel created");
                Ok(Response::ok())
            }
            Request::Info => {
                let channels = self
                    .mailbox
                    .channels()?
                    .into_iter()
                    .map(|c| ChannelRow {
                        name: c.name,
                        msg_size: c.msg_size,
                        capacity: c.capacity,
                        head: c.head,
                        tail: c.tail,
                    })
                    .collect();
                Ok(Response {
                    ok: true,
                    info: Some(Info {
                        mode: self.backend.mode().to_string(),
                        mailbox: self.mailbox.path().display().to_string(),
                        device: self.device.clone(),
                        host_atomics: self.backend.host_atomics(),
                        channels,
                    }),
                    ..Response::default()
                })
            }
            Request::Shutdown => Ok(Response::ok()),
        })();
        result.unwrap_or_else(|e| {
            tracing::warn!("refused: {e:#}");
            Response::error(format!("{e:#}"))
        })
    }
}

/// Registers removal of `path` at exit, unless `keep`.
pub fn remove_at_exit(what: &'static str, path: PathBuf, keep: bool) {
    if !keep {
        cleanup::register(what, move || {
            let _ = std::fs::remove_file(&path);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{read_response, write_request};
    use mesh_backend::{BackendError, IsolationMode, ProgramState, ProgramStatus};
    use mesh_shm::{CreateMode, MailboxConfig};

    /// A backend double that keeps programs in a list: exercises the socket, the protocol and the
    /// dispatch without a GPU (the GPU path itself is tested in mesh-gpu-tests).
    #[derive(Default)]
    struct ListBackend {
        programs: Vec<ProgramStatus>,
    }

    impl Backend for ListBackend {
        fn mode(&self) -> IsolationMode {
            IsolationMode::Blink
        }
        fn load(&mut self, spec: ProgramSpec) -> mesh_backend::Result<ProgramStatus> {
            spec.validate()?;
            if self.programs.iter().any(|p| p.name == spec.name) {
                return Err(BackendError::AlreadyLoaded(spec.name));
            }
            let status = ProgramStatus {
                name: spec.name,
                slot: self.programs.len() as u32,
                state: ProgramState::Running,
                generation: 1,
                heartbeat: 0,
                worker_pid: None,
                sms: None,
                shape: spec.shape,
                kind: spec.kind,
            };
            self.programs.push(status.clone());
            Ok(status)
        }
        fn upgrade(&mut self, name: &str, _image: Vec<u8>) -> mesh_backend::Result<ProgramStatus> {
            let p = self
                .programs
                .iter_mut()
                .find(|p| p.name == name)
                .ok_or_else(|| BackendError::NoSuchProgram(name.into()))?;
            p.generation += 1;
            Ok(p.clone())
        }
        fn unload(&mut self, name: &str) -> mesh_backend::Result<()> {
            let before = self.programs.len();
            self.programs.retain(|p| p.name != name);
            if before == self.programs.len() { Err(BackendError::NoSuchProgram(name.into())) } else { Ok(()) }
        }
        fn status(&self) -> Vec<ProgramStatus> {
            self.programs.clone()
        }
        fn shutdown(&mut self) -> mesh_backend::Result<()> {
            self.programs.clear();
            Ok(())
        }
        fn host_atomics(&self) -> bool {
            false
        }
    }

    fn ask(socket: &Path, req: &Request, image: &[u8]) -> Response {
        let conn = UnixStream::connect(socket).unwrap();
        write_request(&mut conn.try_clone().unwrap(), req, image).unwrap();
        read_response(&mut BufReader::new(conn)).unwrap()
    }

    #[test]
    fn the_socket_serves_requests_and_refusals_until_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("sock");
        let listener = bind_socket(&socket).unwrap();
        assert_eq!(std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(bind_socket(&socket).unwrap_err().to_string().contains("another meshd"));
        let mailbox = Mailbox::create(
            dir.path().join("mb"),
            &MailboxConfig { size: 1 << 20, slots: 4, channels: 4 },
            CreateMode::Exclusive,
        )
        .unwrap();
        let mut daemon = Daemon { backend: Box::<ListBackend>::default(), mailbox, device: "test double".into() };
        let stop = Arc::new(AtomicBool::new(false));
        let server = std::thread::spawn(move || daemon.serve(&listener, &stop).unwrap());
        let ptx = b".version 8.0\n.target sm_90\n";
        let load = |name: &str, image: &[u8]| Request::Load {
            name: name.into(),
            image_len: image.len(),
            grid: [2, 1, 1],
            block: [64, 1, 1],
            shared_mem: 0,
            bind: vec![],
            sms: None,
        };
        let r = ask(&socket, &load("a", ptx), ptx);
        assert!(r.ok, "{r:?}");
        assert_eq!(r.programs.unwrap()[0].grid, [2, 1, 1]);
        let r = ask(&socket, &load("a", ptx), ptx);
        assert!(!r.ok && r.error.unwrap().contains("already loaded"));
        let r = ask(&socket, &load("b", b"junk"), b"junk");
        assert!(!r.ok && r.error.unwrap().contains("neither PTX"));
        assert!(ask(&socket, &Request::ChannelCreate { name: "c".into(), msg_size: 16, capacity: 8 }, &[]).ok);
        let r = ask(&socket, &Request::ChannelCreate { name: "d".into(), msg_size: 12, capacity: 8 }, &[]);
        assert!(!r.ok && r.error.unwrap().contains("multiple of 8"));
        let info = ask(&socket, &Request::Info, &[]).info.unwrap();
        assert_eq!((info.mode.as_str(), info.channels.len(), info.channels[0].name.as_str()), ("blink", 1, "c"));
        let r = ask(&socket, &Request::Upgrade { name: "a".into(), image_len: ptx.len() }, ptx);
        assert_eq!(r.programs.unwrap()[0].generation, 2);
        assert_eq!(ask(&socket, &Request::Ps, &[]).programs.unwrap().len(), 1);
        assert!(!ask(&socket, &Request::Unload { name: "zzz".into() }, &[]).ok);
        // A client that sends garbage gets an error line, and the daemon carries on.
        let mut raw = UnixStream::connect(&socket).unwrap();
        std::io::Write::write_all(&mut raw, b"not json\n").unwrap();
        let r = read_response(&mut BufReader::new(raw)).unwrap();
        assert!(!r.ok && r.error.unwrap().contains("malformed request"));
        assert!(ask(&socket, &Request::Unload { name: "a".into() }, &[]).ok);
        assert!(ask(&socket, &Request::Shutdown, &[]).ok);
        assert!(server.join().unwrap(), "a clean shutdown");
    }
}
