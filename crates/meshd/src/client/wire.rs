//! One request to meshd's control socket and its answer, with the exit codes a script relies on: a refusal is 1, a meshd that cannot be reached 3.

use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::path::Path;

use anyhow::{Context, anyhow};
use meshd::protocol::{Request, Response, read_response, write_request};

use crate::exit::{Exit, refused};

/// One request to the daemon; a refusal becomes exit 1, an unreachable daemon exit 3.
pub(super) fn call(socket: &Path, req: &Request, image: &[u8]) -> Result<Response, Exit> {
    let conn = UnixStream::connect(socket)
        .with_context(|| format!("cannot reach meshd at {} (is `meshd run` running?)", socket.display()))
        .map_err(|e| Exit(3, e))?;
    let mut writer = conn.try_clone().map_err(|e| Exit(3, e.into()))?;
    // meshd may refuse before reading everything (a peer it does not serve, a line too long) and
    // close: then the write fails, but its answer is there to read, and it says why.
    let written = write_request(&mut writer, req, image);
    let resp = match (read_response(&mut BufReader::new(conn)), written) {
        (Ok(resp), _) => resp,
        (Err(_), Err(e)) | (Err(e), Ok(())) => return Err(Exit(3, e)),
    };
    if !resp.ok {
        return Err(refused(anyhow!(resp.error.unwrap_or_else(|| "refused".into()))));
    }
    Ok(resp)
}
