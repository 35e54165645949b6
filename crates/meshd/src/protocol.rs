//! The control socket's protocol: one JSON request line (plus the image's raw bytes for load and upgrade),
//! one JSON response line.

use std::io::{BufRead, Write};

use anyhow::{Context, Result, bail};
use mesh_backend::ProgramStatus;
use serde::{Deserialize, Serialize};

/// Largest image a client may send.
pub const MAX_IMAGE: usize = 256 << 20;

/// A client's request.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Load a program; `image_len` raw bytes follow the line.
    Load {
        /// Program name.
        name: String,
        /// Bytes of image after the line.
        image_len: usize,
        /// Grid dimensions.
        grid: [u32; 3],
        /// Block dimensions.
        block: [u32; 3],
        /// Dynamic shared memory per block.
        shared_mem: u32,
        /// Channels, binding 0, 1, …
        bind: Vec<String>,
        /// SMs (MPS mode).
        sms: Option<u32>,
    },
    /// Replace a program's image; `image_len` raw bytes follow.
    Upgrade {
        /// Program name.
        name: String,
        /// Bytes of image after the line.
        image_len: usize,
    },
    /// Stop a program and free its slot.
    Unload {
        /// Program name.
        name: String,
    },
    /// Every program's status.
    Ps,
    /// Create a channel.
    ChannelCreate {
        /// Channel name.
        name: String,
        /// Bytes per message.
        msg_size: u32,
        /// Messages the ring holds.
        capacity: u32,
    },
    /// The daemon's mode, mailbox path and channels.
    Info,
    /// Stop every program and exit.
    Shutdown,
}

/// A program's row in `ps`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProgramRow {
    /// Name.
    pub name: String,
    /// Mailbox slot.
    pub slot: u32,
    /// running, stopped, exited(N), faulted: …
    pub state: String,
    /// Launches so far.
    pub generation: u32,
    /// Kernel heartbeat.
    pub heartbeat: u64,
    /// Worker process (MPS mode).
    pub worker_pid: Option<u32>,
    /// SMs held (None: whole GPU).
    pub sms: Option<u32>,
    /// Image format.
    pub kind: String,
    /// Grid.
    pub grid: [u32; 3],
    /// Block.
    pub block: [u32; 3],
}

impl From<&ProgramStatus> for ProgramRow {
    fn from(s: &ProgramStatus) -> Self {
        Self {
            name: s.name.clone(),
            slot: s.slot,
            state: s.state.to_string(),
            generation: s.generation,
            heartbeat: s.heartbeat,
            worker_pid: s.worker_pid,
            sms: s.sms,
            kind: s.kind.to_string(),
            grid: s.shape.grid,
            block: s.shape.block,
        }
    }
}

/// A channel's row in `info`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChannelRow {
    /// Name.
    pub name: String,
    /// Bytes per message.
    pub msg_size: u32,
    /// Capacity.
    pub capacity: u32,
    /// Messages sent.
    pub head: u64,
    /// Messages received.
    pub tail: u64,
}

/// The daemon's description of itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Info {
    /// blink or mps.
    pub mode: String,
    /// The mailbox file.
    pub mailbox: String,
    /// The GPU.
    pub device: String,
    /// Host-native atomics.
    pub host_atomics: bool,
    /// Every channel.
    pub channels: Vec<ChannelRow>,
}

/// The daemon's answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Response {
    /// Whether the request succeeded.
    pub ok: bool,
    /// Why not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Programs (load, upgrade, ps).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub programs: Option<Vec<ProgramRow>>,
    /// The daemon (info).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub info: Option<Info>,
}

impl Response {
    /// A refusal.
    pub fn error(e: impl std::fmt::Display) -> Self {
        Self { ok: false, error: Some(e.to_string()), ..Self::default() }
    }

    /// A success without data.
    pub fn ok() -> Self {
        Self { ok: true, ..Self::default() }
    }
}

/// Reads one request and the image bytes that follow it, if any.
pub fn read_request(r: &mut impl BufRead) -> Result<(Request, Vec<u8>)> {
    let mut line = String::new();
    if r.read_line(&mut line).context("reading the request")? == 0 {
        bail!("the client closed the connection before sending a request");
    }
    let req: Request = serde_json::from_str(line.trim_end()).context("malformed request")?;
    let len = match &req {
        Request::Load { image_len, .. } | Request::Upgrade { image_len, .. } => *image_len,
        _ => 0,
    };
    if len > MAX_IMAGE {
        bail!("image of {len} bytes, at most {MAX_IMAGE}");
    }
    let mut image = vec![0u8; len];
    r.read_exact(&mut image).with_context(|| format!("reading the {len}-byte image"))?;
    Ok((req, image))
}

/// Writes one request and its image.
pub fn write_request(w: &mut impl Write, req: &Request, image: &[u8]) -> Result<()> {
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.write_all(image)?;
    w.flush()?;
    Ok(())
}

/// Writes one response line.
pub fn write_response(w: &mut impl Write, resp: &Response) -> Result<()> {
    let mut line = serde_json::to_vec(resp)?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.flush()?;
    Ok(())
}

/// Reads one response line.
pub fn read_response(r: &mut impl BufRead) -> Result<Response> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        bail!("meshd closed the connection without answering");
    }
    serde_json::from_str(line.trim_end()).context("malformed response from meshd")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_with_their_image() {
        let req = Request::Load {
            name: "echo".into(),
            image_len: 5,
            grid: [1, 1, 1],
            block: [32, 1, 1],
            shared_mem: 0,
            bind: vec!["a".into(), "b".into()],
            sms: None,
        };
        let mut buf = Vec::new();
        write_request(&mut buf, &req, b"hello").unwrap();
        let (back, image) = read_request(&mut std::io::Cursor::new(buf)).unwrap();
        assert_eq!((back, image.as_slice()), (req, &b"hello"[..]));
    }

    #[test]
    fn bad_requests_are_errors() {
        assert!(read_request(&mut std::io::Cursor::new(b"{\"op\":\"fly\"}\n".to_vec())).is_err());
        assert!(read_request(&mut std::io::Cursor::new(b"".to_vec())).is_err());
        let huge = format!("{{\"op\":\"upgrade\",\"name\":\"x\",\"image_len\":{}}}\n", MAX_IMAGE + 1);
        let err = read_request(&mut std::io::Cursor::new(huge.into_bytes())).unwrap_err().to_string();
        assert!(err.contains("at most"), "{err}");
        let short = b"{\"op\":\"upgrade\",\"name\":\"x\",\"image_len\":10}\nabc".to_vec();
        assert!(read_request(&mut std::io::Cursor::new(short)).is_err(), "a truncated image is refused");
    }
}
