//! A channel's placement as a request names it: checked against the isolation mode before the channel is made.

use anyhow::{Result, bail};
use mesh_backend::IsolationMode;
use mesh_shm::Placement;

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

#[cfg(test)]
mod tests {
    use super::*;

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
