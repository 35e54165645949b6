//! A native worker's ready pipe: made close-on-exec, read until the worker says `ready`.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::pipe::PipeFlags;

/// A pipe, both ends close-on-exec (the worker's end is made inheritable in the child only).
pub(super) fn ready_pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::pipe::pipe_with(PipeFlags::CLOEXEC)?)
}

/// Why a worker did not become ready.
pub(super) enum Why {
    Eof,
    Timeout,
    Said(String),
    Other(String),
}

/// Reads the ready pipe until a whole line arrives, it closes, or `timeout` passes.
pub(super) fn wait_for_ready(fd: &OwnedFd, timeout: Duration) -> Result<(), Why> {
    let deadline = Instant::now() + timeout;
    let mut line = Vec::new();
    let mut file = std::fs::File::from(fd.try_clone().map_err(|e| Why::Other(e.to_string()))?);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Why::Timeout);
        }
        let ts = rustix::time::Timespec { tv_sec: left.as_secs() as i64, tv_nsec: i64::from(left.subsec_nanos()) };
        let mut fds = [PollFd::new(fd, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(Why::Other(format!("poll on the ready pipe: {e}"))),
        }
        let mut buf = [0u8; 64];
        match file.read(&mut buf) {
            Ok(0) => return Err(Why::Eof),
            Ok(n) => line.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Why::Other(format!("reading the ready pipe: {e}"))),
        }
        if let Some(end) = line.iter().position(|&b| b == b'\n') {
            let said = String::from_utf8_lossy(&line[..end]).trim().to_string();
            return if said == "ready" { Ok(()) } else { Err(Why::Said(said)) };
        }
        if line.len() > 256 {
            return Err(Why::Said(String::from_utf8_lossy(&line).into_owned()));
        }
    }
}
