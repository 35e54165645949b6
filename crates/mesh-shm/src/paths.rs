//! Where a client finds meshd's control socket when it is given none: `$MESHD_SOCKET`, else the meshd of `$MESHD_DEVICE`'s GPU, else `/tmp/meshd.sock`, as the `meshd` command line resolves it.
//!
//! A meshd started for one GPU (`meshd --device SEL run`) listens on `/tmp/meshd-<GPU UUID>.sock`,
//! the UUID as `nvidia-smi -L` writes it. The C and Python clients have no driver to turn an ordinal
//! into a UUID, so for them `$MESHD_DEVICE` must be the whole UUID (the Rust client,
//! `meshd::ServiceClient`, also looks an ordinal up); otherwise the error says what to set.

use std::path::PathBuf;

/// The socket a meshd started without `--socket` or `--device` listens on.
pub const DEFAULT_SOCKET: &str = "/tmp/meshd.sock";

/// The socket of the meshd of GPU `uuid` (`GPU-` and 32 hex digits in 8-4-4-4-12 groups, any case).
pub fn device_socket(uuid: &str) -> Option<PathBuf> {
    whole_uuid(uuid).map(|u| PathBuf::from(format!("/tmp/meshd-{u}.sock")))
}

/// `selector` as `nvidia-smi -L` writes a whole GPU UUID (lower-case hex, `GPU-` prefix), when it is
/// one (surrounding blanks and any case accepted): a client then needs no driver to name that GPU.
pub fn whole_uuid(selector: &str) -> Option<String> {
    let s = selector.trim();
    let rest = s.get(..4).filter(|p| p.eq_ignore_ascii_case("GPU-")).map(|_| &s[4..])?;
    let groups: Vec<&str> = rest.split('-').collect();
    let shape = groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12]);
    (shape && groups.iter().all(|g| g.chars().all(|c| c.is_ascii_hexdigit())))
        .then(|| format!("GPU-{}", rest.to_ascii_lowercase()))
}

/// The control socket a client uses when given none: `$MESHD_SOCKET` (when not empty); else, with
/// `$MESHD_DEVICE` set to a whole GPU UUID, that GPU's meshd; else [`DEFAULT_SOCKET`]. An
/// `$MESHD_DEVICE` that is not a whole UUID (an ordinal, a prefix) is an error naming what to set.
pub fn client_socket_from_env() -> Result<PathBuf, String> {
    client_socket(std::env::var("MESHD_SOCKET").ok(), std::env::var("MESHD_DEVICE").ok())
}

/// [`client_socket_from_env`] with the two variables given.
pub fn client_socket(meshd_socket: Option<String>, meshd_device: Option<String>) -> Result<PathBuf, String> {
    if let Some(s) = meshd_socket.filter(|s| !s.is_empty()) {
        return Ok(PathBuf::from(s));
    }
    match meshd_device.filter(|d| !d.trim().is_empty()) {
        None => Ok(PathBuf::from(DEFAULT_SOCKET)),
        Some(d) => device_socket(&d).ok_or_else(|| {
            format!(
                "MESHD_DEVICE={d}: this client cannot look a GPU up by ordinal or prefix; set MESHD_SOCKET to \
                 the meshd's socket, or MESHD_DEVICE to the GPU's whole UUID (GPU-…, as `nvidia-smi -L` shows it)"
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_follows_meshd_socket_then_a_whole_device_uuid_then_the_default() {
        let uuid = "GPU-5F3A0011-2233-4455-6677-8899AABBCCDD";
        let some = |s: &str| Some(s.to_string());
        assert_eq!(client_socket(some("/run/x.sock"), some(uuid)), Ok(PathBuf::from("/run/x.sock")));
        assert_eq!(
            client_socket(None, some(uuid)),
            Ok(PathBuf::from("/tmp/meshd-GPU-5f3a0011-2233-4455-6677-8899aabbccdd.sock"))
        );
        assert_eq!(client_socket(some(""), some(&uuid.to_lowercase())), client_socket(None, some(uuid)));
        assert_eq!(client_socket(None, None), Ok(PathBuf::from(DEFAULT_SOCKET)));
        assert_eq!(client_socket(None, some("  ")), Ok(PathBuf::from(DEFAULT_SOCKET)));
        for bad in ["0", "GPU-5f3a", "GPU-5f3a0011-2233-4455-6677-8899aabbccdx", "5f3a0011-2233-4455-6677-8899aabbccdd"]
        {
            let why = client_socket(None, some(bad)).unwrap_err();
            assert!(why.contains(&format!("MESHD_DEVICE={bad}")) && why.contains("MESHD_SOCKET"), "{why}");
        }
    }
}
