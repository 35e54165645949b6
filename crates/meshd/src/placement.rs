//! A channel's placement and protocol as a request names them: checked against the isolation mode and the message size before the channel is made.

use anyhow::{Result, bail};
use mesh_backend::IsolationMode;
use mesh_shm::{Placement, Protocol};

/// The placement `text` names (empty: host), refused where the mode cannot serve it: in MPS mode each
/// program is a process of its own, and a device ring is shared between them only under the opt-in
/// `MESH_MPS_DEVICE_CHANNELS=1` (meshd's own context owns it; not yet verified on a GPU).
pub fn parse(text: &str, mode: IsolationMode) -> Result<Placement> {
    parse_with(text, mode, mesh_mps::device_channels_opted_in())
}

fn parse_with(text: &str, mode: IsolationMode, mps_device_channels: bool) -> Result<Placement> {
    let placement =
        if text.is_empty() { Placement::Host } else { text.parse::<Placement>().map_err(anyhow::Error::msg)? };
    if placement == Placement::Device && mode == IsolationMode::Mps && !mps_device_channels {
        bail!(
            "placement device: meshd runs in MPS mode, where each program is a process of its own and a \
             device ring is not shared between them yet; use --placement host, or run meshd with --isolation blink"
        );
    }
    Ok(placement)
}

/// The protocol `text` names, or (empty) the one a channel of `msg_size`-byte messages gets by default:
/// LL up to 64 KiB, bulk above (index only when named: its ends must both be host processes). Whether
/// the size and placement suit it is the mailbox's check.
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
        assert!(e.contains("\"simple\"") && e.contains("ll, bulk or index"), "{e}");
        assert_eq!(protocol("index", 8).unwrap(), Protocol::Index);
        assert_eq!(protocol("", 8).unwrap(), Protocol::Ll, "index is never a default: GPU programs cannot bind it");
    }

    #[test]
    fn host_by_default_device_only_in_blink_mode() {
        assert_eq!(parse_with("", IsolationMode::Mps, false).unwrap(), Placement::Host);
        assert_eq!(parse_with("device", IsolationMode::Blink, false).unwrap(), Placement::Device);
        let e = parse_with("device", IsolationMode::Mps, false).unwrap_err().to_string();
        assert!(e.contains("MPS mode") && e.contains("--placement host"), "{e}");
        assert_eq!(
            parse_with("device", IsolationMode::Mps, true).unwrap(),
            Placement::Device,
            "MESH_MPS_DEVICE_CHANNELS=1 lets MPS mode take device channels"
        );
        let e = parse_with("gpu", IsolationMode::Blink, false).unwrap_err().to_string();
        assert!(e.contains("\"gpu\"") && e.contains("host or device"), "{e}");
    }
}
