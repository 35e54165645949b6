//! Device channels in MPS mode: meshd's own context that owns every device ring, the rings mapped into
//! a worker, and the refusal when that context cannot be made.

use super::*;

/// The device rings' owner, a plain context made while the MPS daemon starts (or is adopted);
/// without it MPS mode still starts, and only device channels are refused, saying why (see
/// [`device_channels_refusal`]).
pub(super) fn open_rings(device: &Device) -> Option<SharedRings> {
    let began = Instant::now();
    match owner_context(device) {
        Ok(rings) => {
            *DEVICE_CHANNELS_REFUSED.lock() = None;
            tracing::info!(
                "device channels: their rings are owned by meshd's own plain context (made in {:.1?})",
                began.elapsed()
            );
            Some(rings)
        }
        Err(e) => {
            let why = format!("meshd's own context, which owns device rings in MPS mode, could not be made: {e}");
            tracing::warn!("device channels are refused in this MPS meshd: {why}");
            *DEVICE_CHANNELS_REFUSED.lock() = Some(why);
            None
        }
    }
}

/// meshd's own context for the device rings: a plain (non-MPS) context. meshd's daemon is not one
/// it can join (only the children's environment names its pipe directory), but a process whose own
/// environment leads it to an MPS server becomes its client instead, so the context is checked
/// (`MPS_ENABLED` = 0) and refused with the reason otherwise.
fn owner_context(device: &Device) -> Result<SharedRings> {
    let refuse = |reason: String| BackendError::Invalid { what: "device channels in MPS mode".into(), reason };
    mesh_cuda::exported::check_support(device)?;
    let ctx = Context::primary(device).map_err(|e| refuse(format!("meshd's own context for device rings: {e}")))?;
    let seen = Device::get(0)?;
    if seen.mps_enabled {
        let pipe = std::env::var_os(crate::control::PIPE_ENV)
            .map_or_else(|| "unset: the default /tmp/nvidia-mps".to_string(), |p| format!("{p:?}"));
        return Err(refuse(format!(
            "meshd's own context became a client of another MPS server (CUDA_MPS_PIPE_DIRECTORY {pipe} in meshd's \
             environment), but the device rings must outlive every MPS client: start meshd where no other MPS \
             daemon serves this GPU, or with CUDA_MPS_PIPE_DIRECTORY naming an empty directory"
        )));
    }
    Ok(SharedRings::new(ctx)?)
}

/// Maps, in `worker`, every device channel program slot `slot` binds (meshd's rings, opt-in);
/// without the opt-in nothing (a binding to a device channel is then refused by the launch).
pub(super) fn map_channels(
    rings: &mut Option<SharedRings>,
    mailbox: &Mailbox,
    worker: &mut Worker,
    slot: u32,
) -> Result<()> {
    let Some(rings) = rings.as_mut() else { return Ok(()) };
    for ring in rings.export_for(mailbox, slot)? {
        if ring.zero || !worker.has_mapped(ring.channel) {
            worker.map(ring.channel, &ring.fd, ring.bytes, ring.zero)?;
            if ring.zero {
                rings.zeroed(ring.channel);
            }
        }
    }
    for loss in rings.take_losses() {
        tracing::warn!(
            channel = loss.channel,
            "channel {:?}: its device ring was made anew, empty: {} messages lost",
            loss.channel,
            loss.lost
        );
    }
    Ok(())
}
