//! Descriptors from meshd to a worker: one `SCM_RIGHTS` message per descriptor on a unix socket the worker inherited, with its [`FdTag`].
//!
//! The socket is a `socketpair` made at the worker's spawn, its child end inherited as `--fd-socket N`
//! (the command pipes stay plain pipes). meshd sends the descriptor, then the command that names it
//! on stdin; the worker reads the command, then takes the descriptor without waiting (it is queued
//! already: a unix stream socket's send completes into the receiver's queue) and checks that its tag
//! names the command's channel and size.
//!
//! An adoption passes one descriptor the other way round the usual plumbing: the new fd socket rides
//! on the `adopt` line itself ([`send_line_with_fd`]), on the rendezvous socket that becomes the
//! worker's input; the worker reads that one line with `recvmsg` ([`recv_line_with_fd`]) before it
//! reads lines as usual.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};

use crate::FdTag;

/// One `sendmsg` of `payload` with `fd` riding on it; the bytes it sent.
fn send_with_fd(socket: BorrowedFd<'_>, payload: &[u8], fd: BorrowedFd<'_>) -> io::Result<usize> {
    let fds = [fd];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("the descriptor does not fit the control buffer"));
    }
    Ok(rustix::net::sendmsg(socket, &[io::IoSlice::new(payload)], &mut control, SendFlags::NOSIGNAL)?)
}

/// Sends `fd` with `tag` on `socket`.
pub fn send_fd(socket: impl AsFd, fd: BorrowedFd<'_>, tag: FdTag) -> io::Result<()> {
    let payload = tag.encode();
    let sent = send_with_fd(socket.as_fd(), &payload, fd)?;
    if sent != payload.len() {
        return Err(io::Error::other(format!("sent {sent} of the tag's {} bytes", payload.len())));
    }
    Ok(())
}

/// Why no descriptor could be taken.
#[derive(Debug, thiserror::Error)]
pub enum FdError {
    /// Nothing was queued (meshd sent the command without its descriptor).
    #[error("no descriptor was waiting on the fd socket")]
    Nothing,
    /// The peer closed the socket.
    #[error("the fd socket was closed")]
    Closed,
    /// A message without exactly one descriptor, or with a tag that is not 16 bytes.
    #[error("a malformed descriptor message: {0}")]
    Malformed(String),
    /// The descriptor's tag names another channel or size than the command.
    #[error("the descriptor's tag {got:?} does not match the command's {want:?}")]
    Mismatch {
        /// What the tag said.
        got: FdTag,
        /// What the command said.
        want: FdTag,
    },
    /// The system call failed.
    #[error("recvmsg: {0}")]
    Io(#[from] io::Error),
}

/// Takes the descriptor queued on `socket` without waiting, checked against `want`.
pub fn recv_fd(socket: impl AsFd, want: FdTag) -> Result<OwnedFd, FdError> {
    let mut payload = [0u8; 32];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = match rustix::net::recvmsg(
        socket,
        &mut [io::IoSliceMut::new(&mut payload)],
        &mut control,
        RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
    ) {
        Ok(m) => m,
        Err(rustix::io::Errno::AGAIN) => return Err(FdError::Nothing),
        Err(e) => return Err(FdError::Io(e.into())),
    };
    if got.bytes == 0 {
        return Err(FdError::Closed);
    }
    let mut fds: Vec<OwnedFd> = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = msg {
            fds.extend(rights);
        }
    }
    let tag = FdTag::decode(&payload[..got.bytes])
        .ok_or_else(|| FdError::Malformed(format!("a {}-byte tag where 16 were due", got.bytes)))?;
    if fds.len() != 1 {
        return Err(FdError::Malformed(format!("{} descriptors where one was due", fds.len())));
    }
    if tag != want {
        return Err(FdError::Mismatch { got: tag, want });
    }
    Ok(fds.remove(0))
}

/// Sends `line` and a newline on `socket`, with `fd` riding on its first byte.
pub fn send_line_with_fd(socket: impl AsFd, line: &str, fd: BorrowedFd<'_>) -> io::Result<()> {
    let payload = format!("{line}\n");
    let socket = socket.as_fd();
    let mut sent = send_with_fd(socket, payload.as_bytes(), fd)?;
    // The descriptor went with the first bytes; the rest of a long line follows plainly.
    while sent < payload.len() {
        sent += rustix::net::send(socket, &payload.as_bytes()[sent..], SendFlags::NOSIGNAL)?;
    }
    Ok(())
}

/// Reads one line (up to `max` bytes, its newline dropped) from `socket`, and the descriptors that
/// rode on it, waiting as the socket's read timeout says. Reads byte by byte past the first message,
/// so that nothing after the newline is taken from the socket.
pub fn recv_line_with_fd(socket: impl AsFd, max: usize) -> Result<(String, Vec<OwnedFd>), FdError> {
    let socket = socket.as_fd();
    let mut line = Vec::new();
    let mut fds: Vec<OwnedFd> = Vec::new();
    while line.len() < max {
        let mut byte = [0u8; 1];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = match rustix::net::recvmsg(
            socket,
            &mut [io::IoSliceMut::new(&mut byte)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(m) => m,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(FdError::Io(e.into())),
        };
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(rights) = msg {
                fds.extend(rights);
            }
        }
        if got.bytes == 0 {
            return Err(FdError::Closed);
        }
        if byte[0] == b'\n' {
            return Ok((String::from_utf8_lossy(&line).into_owned(), fds));
        }
        line.push(byte[0]);
    }
    Err(FdError::Malformed(format!("no newline within {max} bytes")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_descriptor_travels_with_its_tag_and_a_wrong_one_is_refused() {
        let (meshd, worker) = UnixStream::pair().unwrap();
        let (mut r, mut w) = std::io::pipe().unwrap();
        let tag = FdTag { channel: 3, bytes: 2 << 20 };
        send_fd(&meshd, w.as_fd(), tag).unwrap();
        let received = recv_fd(&worker, tag).unwrap();
        // The received descriptor is the pipe's write end: what is written through it arrives.
        let mut copy = std::fs::File::from(received);
        copy.write_all(b"ring").unwrap();
        drop(copy);
        w.flush().unwrap();
        drop(w);
        let mut s = String::new();
        r.read_to_string(&mut s).unwrap();
        assert_eq!(s, "ring");

        assert!(matches!(recv_fd(&worker, tag), Err(FdError::Nothing)), "nothing queued: no wait");
        let (_r2, w2) = std::io::pipe().unwrap();
        send_fd(&meshd, w2.as_fd(), FdTag { channel: 4, bytes: 2 << 20 }).unwrap();
        let e = recv_fd(&worker, tag).unwrap_err().to_string();
        assert!(e.contains("does not match") && e.contains("channel: 4"), "{e}");
        (&meshd).write_all(&[1, 2, 3]).unwrap();
        let e = recv_fd(&worker, tag).unwrap_err().to_string();
        assert!(e.contains("a 3-byte tag"), "{e}");
        // Shut down, not only dropped: a process another test spawns at this moment holds a copy of
        // the descriptor until its exec closes it, and the socket closes only with the last copy.
        meshd.shutdown(std::net::Shutdown::Both).unwrap();
        drop(meshd);
        assert!(matches!(recv_fd(&worker, tag), Err(FdError::Closed)));
    }

    #[test]
    fn a_line_carries_a_descriptor_and_what_follows_it_stays_on_the_socket() {
        let (meshd, worker) = UnixStream::pair().unwrap();
        let (mut r, w) = std::io::pipe().unwrap();
        send_line_with_fd(&meshd, r#"{"op":"adopt"}"#, w.as_fd()).unwrap();
        (&meshd).write_all(b"{\"op\":\"wait\"}\n").unwrap();
        let (line, fds) = recv_line_with_fd(&worker, 4096).unwrap();
        assert_eq!((line.as_str(), fds.len()), (r#"{"op":"adopt"}"#, 1));
        drop(w);
        let mut copy = std::fs::File::from(fds.into_iter().next().unwrap());
        copy.write_all(b"fd").unwrap();
        drop(copy);
        let mut s = String::new();
        r.read_to_string(&mut s).unwrap();
        assert_eq!(s, "fd", "the descriptor that arrived is the pipe's write end");
        let (next, none) = recv_line_with_fd(&worker, 4096).unwrap();
        assert_eq!((next.as_str(), none.len()), (r#"{"op":"wait"}"#, 0), "the next line, untouched");
        (&meshd).write_all(b"0123456789").unwrap();
        let e = recv_line_with_fd(&worker, 4).unwrap_err().to_string();
        assert!(e.contains("no newline within 4 bytes"), "{e}");
        meshd.shutdown(std::net::Shutdown::Both).unwrap();
        assert!(matches!(recv_line_with_fd(&worker, 4096), Err(FdError::Closed)));
    }
}
