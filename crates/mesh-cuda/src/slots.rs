//! What both backends do with the mailbox for a program: resolve its channels, take a free slot,
//! bind and arm it, ask it to stop, read it for `ps`, release it.
//!
//! It lives here because mesh-backend depends on no other member and so cannot name the mailbox,
//! while mesh-mps already depends on this crate; the arithmetic behind it is mesh-backend's.

use mesh_backend::roster::{self, HasCore};
use mesh_backend::{BackendError, Result, SlotReading};
use mesh_shm::Mailbox;
use mesh_shm::layout::STATE_EXITED;

/// The channel indices of `names`, in order (binding 0, 1, …); a missing channel, or one of a
/// protocol no GPU program speaks (protocol index), is refused by name. Both backends call this
/// before they change anything, so a refused load leaves everything as it was.
pub fn channel_indices(mailbox: &Mailbox, names: &[String]) -> Result<Vec<u32>> {
    names.iter().map(|name| mailbox.channel_for_program(name).map(|c| c.index).map_err(BackendError::mailbox)).collect()
}

/// Refuses a load whose linked `cubin` declares bindings (mesh.cuh's `MESH_BINDINGS`) that the
/// channels `names` (binding 0, 1, …) cannot serve: a channel of another protocol, or too few
/// channels. Read from the cubin on the CPU, so both backends call it before they change anything.
/// An image that declares nothing (or is not an ELF file: a fatbin used as it is) loads unchecked.
pub fn check_declared(mailbox: &Mailbox, program: &str, names: &[String], cubin: &[u8]) -> Result<()> {
    let refused = |reason: String| BackendError::Invalid { what: format!("program {program:?}"), reason };
    let Some(declared) = crate::bindings::declared(cubin).map_err(refused)? else { return Ok(()) };
    let bound = names
        .iter()
        .map(|name| {
            mailbox.channel_for_program(name).map(|c| (name.clone(), c.protocol)).map_err(BackendError::mailbox)
        })
        .collect::<Result<Vec<_>>>()?;
    crate::bindings::check(&declared, &bound).map_err(refused)
}

/// [`check_declared`] for an upgrade: the new `cubin` against the channels `slot` binds now.
pub fn check_declared_in(mailbox: &Mailbox, program: &str, slot: u32, cubin: &[u8]) -> Result<()> {
    let refused = |reason: String| BackendError::Invalid { what: format!("program {program:?}"), reason };
    let Some(declared) = crate::bindings::declared(cubin).map_err(refused)? else { return Ok(()) };
    let bound: Vec<_> = mailbox
        .bound_channels(slot)
        .map_err(BackendError::mailbox)?
        .into_iter()
        .map(|c| (c.name, c.protocol))
        .collect();
    crate::bindings::check(&declared, &bound).map_err(refused)
}

/// The lowest slot of the mailbox that none of `programs` holds.
pub fn free_slot<P: HasCore>(mailbox: &Mailbox, programs: &[P]) -> Result<u32> {
    roster::free_slot(programs, mailbox.geometry().slot_count)
}

/// Gives `slot` to program `name` with its channel `bindings`, its status zeroed (no kernel runs
/// there). Returns the generation the program goes on from: the one it last ran as when the slot
/// last held a program of this name (a relaunch by a restarted meshd), else 0. So a generation
/// names one launch even across restarts of meshd, and a late kernel of the previous process can
/// never pass for the new one.
pub fn prepare(mailbox: &Mailbox, slot: u32, name: &str, bindings: &[u32]) -> Result<u32> {
    let s = mailbox.slot(slot).map_err(BackendError::mailbox)?;
    let previous = if s.name() == name { s.generation() } else { 0 };
    s.bind(name, bindings).map_err(BackendError::mailbox)?;
    s.reset_status();
    Ok(previous)
}

/// Arms `slot` for a launch of `generation` (stop request cleared; no kernel runs there).
pub fn arm(mailbox: &Mailbox, slot: u32, generation: u32) -> Result<()> {
    mailbox.slot(slot).map_err(BackendError::mailbox)?.arm(generation);
    Ok(())
}

/// Asks the kernel in `slot` to stop. A slot the mailbox refuses has no kernel to ask.
pub fn request_stop(mailbox: &Mailbox, slot: u32) {
    if let Ok(s) = mailbox.slot(slot) {
        s.request_stop();
    }
}

/// Frees `slot` for another program.
pub fn release(mailbox: &Mailbox, slot: u32) -> Result<()> {
    mailbox.slot(slot).map_err(BackendError::mailbox)?.release();
    Ok(())
}

/// What `slot` says for `ps`: the heartbeat, and the exit code once the kernel exited by itself.
pub fn reading(mailbox: &Mailbox, slot: u32) -> SlotReading {
    let Ok(s) = mailbox.slot(slot) else { return SlotReading::default() };
    let status = s.status();
    SlotReading { heartbeat: status.heartbeat, exit_code: (status.state == STATE_EXITED).then_some(status.exit_code) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh_shm::{CreateMode, MailboxConfig};

    #[test]
    fn a_program_relaunched_into_its_slot_goes_on_from_its_generation_and_a_new_one_starts_at_zero() {
        let dir = tempfile::tempdir().unwrap();
        let config = MailboxConfig { size: 1 << 20, slots: 4, channels: 4 };
        let mailbox = Mailbox::create(dir.path().join("mb"), &config, CreateMode::Exclusive).unwrap();
        assert_eq!(prepare(&mailbox, 0, "a", &[]).unwrap(), 0, "a slot never used");
        arm(&mailbox, 0, 3).unwrap();
        // What a killed meshd leaves and the next one's takeover releases: the slot, its words kept.
        release(&mailbox, 0).unwrap();
        assert_eq!(prepare(&mailbox, 0, "a", &[]).unwrap(), 3, "the same program in the same slot");
        assert_eq!(mailbox.slot(0).unwrap().generation(), 0, "the slot is reset until the launch arms it");
        arm(&mailbox, 0, 4).unwrap();
        release(&mailbox, 0).unwrap();
        assert_eq!(prepare(&mailbox, 0, "b", &[]).unwrap(), 0, "another program starts afresh");
    }
}
