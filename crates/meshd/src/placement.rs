//! A channel's placement and protocol as a request names them: checked against the isolation mode and the message size before the channel is made.

use anyhow::{Result, bail};
use mesh_backend::IsolationMode;
use mesh_shm::{Placement, Protocol};

/// The placement `text` names (empty: host), refused where the mode cannot serve it: in MPS mode a
/// device ring is owned by meshd's own plain context and mapped by each worker, and when that
/// context could not be made (a compute mode that allows one context per device, say) device
/// channels are refused with the reason.
pub fn parse(text: &str, mode: IsolationMode) -> Result<Placement> {
    parse_with(text, mode, mesh_mps::device_channels_refusal().as_deref())
}

fn parse_with(text: &str, mode: IsolationMode, mps_refusal: Option<&str>) -> Result<Placement> {
    let placement =
        if text.is_empty() { Placement::Host } else { text.parse::<Placement>().map_err(anyhow::Error::msg)? };
    if placement == Placement::Device
        && mode == IsolationMode::Mps
        && let Some(why) = mps_refusal
    {
        bail!(
            "placement device: this MPS meshd cannot serve device channels: {why}; use --placement host, or run \
                 meshd with --isolation blink"
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
    fn host_by_default_device_in_both_modes_unless_the_owner_context_failed() {
        assert_eq!(parse_with("", IsolationMode::Mps, None).unwrap(), Placement::Host);
        assert_eq!(parse_with("device", IsolationMode::Blink, None).unwrap(), Placement::Device);
        assert_eq!(parse_with("device", IsolationMode::Mps, None).unwrap(), Placement::Device, "on by default");
        let why = "meshd's own context, which owns device rings in MPS mode, could not be made: exclusive process";
        let e = parse_with("device", IsolationMode::Mps, Some(why)).unwrap_err().to_string();
        assert!(e.contains("MPS meshd") && e.contains("exclusive process") && e.contains("--placement host"), "{e}");
        assert_eq!(parse_with("device", IsolationMode::Blink, Some(why)).unwrap(), Placement::Device);
        let e = parse_with("gpu", IsolationMode::Blink, None).unwrap_err().to_string();
        assert!(e.contains("\"gpu\"") && e.contains("host or device"), "{e}");
    }
}
