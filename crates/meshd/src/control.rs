//! A Rust client of meshd's control socket: one request, one answer ([`request`]), and the requests that remove what meshd made ([`channel_delete`], [`service_delete`]).
//!
//! Each call opens a connection of its own, as `meshd` on the command line does; a refusal is an
//! error carrying meshd's reason (which names what holds a channel in use). Attaching to a service
//! as a client is [`crate::ServiceClient`]'s.

use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::path::Path;

use anyhow::{Context, Result, anyhow};

use crate::protocol::{Request, Response, read_response, write_request};

/// Sends `req` (a request without an image) to the meshd listening on `socket` and returns its
/// answer; a refusal (`ok: false`) is an error with meshd's reason, and so is a meshd that cannot be
/// reached.
pub fn request(socket: &Path, req: &Request) -> Result<Response> {
    let conn = UnixStream::connect(socket)
        .with_context(|| format!("cannot reach meshd at {} (is `meshd run` running?)", socket.display()))?;
    let mut writer = conn.try_clone().context("the control connection")?;
    // A failed write is not the answer: meshd may refuse before reading the whole line and close,
    // and its answer, read next, says why.
    let _ = write_request(&mut writer, req, &[]);
    let resp = read_response(&mut BufReader::new(conn))?;
    if !resp.ok {
        return Err(anyhow!(resp.error.unwrap_or_else(|| "refused".into())));
    }
    Ok(resp)
}

/// Deletes channel `name` (what `meshd channel delete` does): its ring's memory is reused by the
/// next channel created and the name can be created again at once, with any size. Returns the
/// messages it held that were dropped (0 unless `discard`: a channel holding messages is refused
/// without it). Refused, naming the holder, while a program binds the channel or a host process
/// holds one of its ends; a service's channels are deleted with the service ([`service_delete`]).
pub fn channel_delete(socket: &Path, name: &str, discard: bool) -> Result<u64> {
    let resp = request(socket, &Request::ChannelDelete { name: name.to_string(), discard })?;
    Ok(resp.discarded.unwrap_or(0))
}

/// Deletes service `name`, its fan-in channel and its reply group (what `meshd service delete`
/// does). Returns the requests and replies dropped (0 unless `discard`: a service holding any is
/// refused without it). Refused, naming the client's process, while a client is attached, and while
/// a program binds either channel.
pub fn service_delete(socket: &Path, name: &str, discard: bool) -> Result<u64> {
    let resp = request(socket, &Request::ServiceDelete { name: name.to_string(), discard })?;
    Ok(resp.discarded.unwrap_or(0))
}
