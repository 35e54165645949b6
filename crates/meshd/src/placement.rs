//! A channel's placement and protocol as a request names them: checked against the isolation mode and the message size before the channel is made.

use anyhow::{Result, bail};
use mesh_backend::IsolationMode;
use mesh_shm::{Placement, Protocol};

/// The placement `text` names (empty: host), refused where the mode cannot serve it: in MPS mode each
/// program is a process of its own, and a device ring is not shared between them yet.
pub fn parse(text: &str, mode: IsolationMode) -> Result<Placement> {
    let placement =
        if text.is_empty() { Placement::Host } else { text.parse::<Placement>().map_err(anyhow::Error::msg)? };
    if placement == Placement::Device && mode == IsolationMode::Mps {
        bail!(
            "placement device: meshd runs in MPS mode, where each program is a process of its own and a \
             device ring is not shared between them yet; use --placement host, or run meshd with --isolation blink"
        );
    }
    Ok(placement)
}

/// The protocol `text` names, or (empty) the one a channel of `msg_size`-byte messages gets by default:
/// LL up to 64 KiB, bulk above. Whether the size suits it is the mailbox's check.
pub fn protocol(text: &str, msg_size: u32) -> Result<Protocol> {
    if text.is_empty() {
        return Ok(Protocol::default_for(msg_size));
    }
    text.parse::<Protocol>().map_err(anyhow::Error::msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_by_size_unless_named() {
        assert_eq!(protocol("", 64).unwrap(), Protocol::Ll);
        assert_eq!(protocol("", 65536).unwrap(), Protocol::Ll, "every size an LL channel could have stays LL");
        assert_eq!(protocol("", 65536 + 16).unwrap(), Protocol::Bulk);
        assert_eq!(protocol("bulk", 4096).unwrap(), Protocol::Bulk);
        assert_eq!(protocol("ll", 1 << 20).unwrap(), Protocol::Ll, "the mailbox refuses the size, naming it");
        let e = protocol("simple", 64).unwrap_err().to_string();
        assert!(e.contains("\"simple\"") && e.contains("ll or bulk"), "{e}");
    }

    #[test]
    fn host_by_default_device_only_in_blink_mode() {
        assert_eq!(parse("", IsolationMode::Mps).unwrap(), Placement::Host);
        assert_eq!(parse("device", IsolationMode::Blink).unwrap(), Placement::Device);
        let e = parse("device", IsolationMode::Mps).unwrap_err().to_string();
        assert!(e.contains("MPS mode") && e.contains("--placement host"), "{e}");
        let e = parse("gpu", IsolationMode::Blink).unwrap_err().to_string();
        assert!(e.contains("\"gpu\"") && e.contains("host or device"), "{e}");
    }
}
