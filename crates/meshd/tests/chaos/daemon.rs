//! The chaos test's seeded generator and the child meshd it starts, asks, kills and starts again.

use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use meshd::protocol::{Request, Response, read_response, write_request};

use crate::common::wait_until;
use crate::{ADOPT, CHILD, DEADLINE};

/// A small generator whose sequence is fixed by its seed for good (splitmix64, Steele et al. 2014):
/// a schedule printed today replays the same in any later build, whatever RNG crates do.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap_or(0)
    }
    pub fn pick<'a, T>(&mut self, from: &'a [T]) -> Option<&'a T> {
        (!from.is_empty()).then(|| &from[self.below(from.len())])
    }
}

pub fn seed() -> u64 {
    match std::env::var("MESH_CHAOS_SEED") {
        Ok(s) => {
            let s = s.trim();
            let parsed = match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            };
            parsed.unwrap_or_else(|e| panic!("MESH_CHAOS_SEED={s}: not a number ({e})"))
        }
        Err(_) => {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            Rng(u64::from(t.subsec_nanos()) ^ t.as_secs() ^ (u64::from(std::process::id()) << 32)).next()
        }
    }
}

/// One request, one answer; `None` while nobody answers on `socket` (meshd restarting).
pub fn try_ask(socket: &Path, req: &Request, image: &[u8]) -> Option<Response> {
    let conn = UnixStream::connect(socket).ok()?;
    conn.set_read_timeout(Some(DEADLINE)).ok()?;
    write_request(&mut conn.try_clone().ok()?, req, image).ok()?;
    read_response(&mut BufReader::new(conn)).ok()
}

/// The child meshd and the command that starts it.
pub struct Daemon {
    pub dir: PathBuf,
    pub child: Child,
}

impl Daemon {
    /// The same command every time (what systemd's `Restart=` would run).
    fn spawn(dir: &Path) -> Child {
        Self::spawn_adopting(dir, false)
    }

    /// [`Daemon::spawn`]; `adopt`: a start that adopts what a killed meshd left running.
    fn spawn_adopting(dir: &Path, adopt: bool) -> Child {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        if adopt {
            cmd.env(ADOPT, "1");
        }
        cmd.args(["--exact", "child_meshd", "--nocapture", "--test-threads=1"])
            .env(CHILD, dir)
            // libtest's report of the child (a failed assertion's text) goes to a log beside the mailbox.
            .stdout(Self::log(dir))
            .stderr(Self::log(dir))
            .spawn()
            .unwrap()
    }

    fn log(dir: &Path) -> std::fs::File {
        std::fs::OpenOptions::new().create(true).append(true).open(dir.join("child.log")).unwrap()
    }

    /// The last 80 lines of the child meshd's log (every start appends to it).
    pub fn log_text(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("child.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(80)..].join("\n")
    }

    pub fn start(dir: &Path) -> Self {
        let d = Self { dir: dir.to_path_buf(), child: Self::spawn(dir) };
        d.wait_up();
        d
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("sock")
    }

    pub fn wait_up(&self) {
        assert!(wait_until(DEADLINE, || try_ask(&self.socket(), &Request::Ps, &[]).is_some()), "meshd did not answer");
    }

    pub fn ask(&self, req: &Request, image: &[u8]) -> Response {
        try_ask(&self.socket(), req, image).unwrap_or_else(|| panic!("meshd did not answer {req:?}"))
    }

    pub fn ok(&self, req: &Request, image: &[u8]) -> Response {
        let r = self.ask(req, image);
        assert!(r.ok, "{req:?} refused: {:?}", r.error);
        r
    }

    pub fn kill9_and_restart(&mut self) {
        self.kill9_and_restart_adopting(false);
    }

    /// `kill -9`, then the same command again; `adopt`: as MPS mode's meshd under an orphan grace,
    /// the new one takes over the programs the killed one left running instead of relaunching them.
    pub fn kill9_and_restart_adopting(&mut self, adopt: bool) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.child = Self::spawn_adopting(&self.dir, adopt);
        self.wait_up();
    }

    pub fn shutdown(&mut self) {
        self.ok(&Request::Shutdown, &[]);
        let ended = wait_until(DEADLINE, || self.child.try_wait().is_ok_and(|s| s.is_some()));
        assert!(ended, "meshd did not exit after shutdown");
        assert!(self.child.wait().unwrap().success(), "the child meshd failed");
    }

    pub fn restart(&mut self) {
        self.child = Self::spawn(&self.dir);
        self.wait_up();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
