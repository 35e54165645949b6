//! The worker's command input: stdin's lines, read with `poll(2)` so that the wait for the next command is bounded while a kernel runs.

use std::os::fd::AsFd;
use std::time::Duration;

/// What [`Lines::next`] found.
pub(crate) enum Next {
    Line(String),
    /// Nothing within the wait.
    Quiet,
    /// End of input (meshd asked us to leave, or is gone), or it cannot be read.
    End,
}

/// Stdin's lines, read with `poll(2)` so that the wait for the next command is bounded while a kernel runs.
#[derive(Default)]
pub(crate) struct Lines {
    buf: Vec<u8>,
}

/// A command line longer than this is cut off and refused as malformed (meshd's are a few hundred bytes).
const MAX_LINE: usize = 1 << 20;

impl Lines {
    pub(crate) fn next(&mut self, wait: Option<Duration>) -> Next {
        loop {
            if let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                return Next::Line(String::from_utf8_lossy(&line[..end]).into_owned());
            }
            if self.buf.len() > MAX_LINE {
                self.buf.clear();
                return Next::Line("(a line over 1 MiB)".into());
            }
            let stdin = std::io::stdin();
            let fd = stdin.as_fd();
            let timeout = wait.map(|w| rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: i64::try_from(w.as_nanos()).unwrap_or(999_999_999).min(999_999_999),
            });
            let mut fds = [rustix::event::PollFd::new(&fd, rustix::event::PollFlags::IN)];
            match rustix::event::poll(&mut fds, timeout.as_ref()) {
                Ok(0) | Err(rustix::io::Errno::INTR) => return Next::Quiet,
                Ok(_) => {}
                Err(_) => return Next::End,
            }
            let mut chunk = [0u8; 4096];
            match rustix::io::read(fd, &mut chunk) {
                Ok(0) => return Next::End,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => return Next::Quiet,
                Err(_) => return Next::End,
            }
        }
    }
}
