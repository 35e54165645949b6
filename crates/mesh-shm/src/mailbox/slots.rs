//! Program slots: meshd's control words, the kernel's status, and the `mesh_ctx` a launch passes.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::handle::{ChannelInfo, Mailbox, Placement, in_map, u32_of};
use crate::error::{Result, ShmError};
use crate::layout::*;
use crate::protocol::Protocol;

impl Mailbox {
    /// Program slot `index`.
    pub fn slot(&self, index: u32) -> Result<SlotRef<'_>> {
        let count = self.inner.geometry.slot_count;
        if index >= count {
            return Err(ShmError::NoSuchSlot { index, count });
        }
        Ok(SlotRef { mailbox: self, index })
    }

    /// Every live channel slot `index` binds (the channels its kernel's context will name).
    pub fn bound_channels(&self, index: u32) -> Result<Vec<ChannelInfo>> {
        let slot = self.slot(index)?;
        let mut out = Vec::new();
        for channel in slot.bindings() {
            if channel >= self.inner.geometry.channel_count {
                return Err(ShmError::NoSuchChannel(format!("#{channel}")));
            }
            out.push(self.channel_info_at(channel)?.ok_or_else(|| ShmError::NoSuchChannel(format!("#{channel}")))?);
        }
        Ok(out)
    }

    /// The kernel's argument for slot `index`, with `base` the mailbox's device address in the launching
    /// context. A binding to a device channel is refused: see [`Mailbox::mesh_ctx_with`].
    pub fn mesh_ctx(&self, index: u32, base: u64) -> Result<MeshCtx> {
        self.mesh_ctx_with(index, base, |_| None)
    }

    /// The kernel's argument for slot `index`, with `base` the mailbox's device address in the launching
    /// context and `device_slots` the device address, in that context, of a device channel's slots
    /// (`None`: this context has none, and the binding is refused).
    pub fn mesh_ctx_with(
        &self,
        index: u32,
        base: u64,
        device_slots: impl Fn(&ChannelInfo) -> Option<u64>,
    ) -> Result<MeshCtx> {
        let slot = self.slot(index)?;
        let mut ctx = MeshCtx { base, slot_offset: slot.offset(), slot: index, ..MeshCtx::default() };
        let bindings = slot.bindings();
        ctx.binding_count = u32_of(bindings.len());
        for (b, &channel) in ctx.bindings.iter_mut().zip(&bindings) {
            if channel >= self.inner.geometry.channel_count {
                return Err(ShmError::NoSuchChannel(format!("#{channel}")));
            }
            let info = self.channel_info_at(channel)?.ok_or_else(|| ShmError::NoSuchChannel(format!("#{channel}")))?;
            if !info.protocol.gpu_bindable() {
                return Err(ShmError::HostOnly { channel: info.name, protocol: info.protocol });
            }
            let slots = match info.placement {
                // A fan-in binding names its LL slots (the owner table before them is host only); a
                // group's names its header, from which a program reads the rest.
                Placement::Host if info.protocol == Protocol::FanIn => {
                    base + info.slots_offset + fanin_slots_offset(info.capacity)
                }
                Placement::Host => base + info.slots_offset,
                Placement::Device => {
                    device_slots(&info).ok_or_else(|| ShmError::NoDeviceRing { channel: info.name.clone() })?
                }
            };
            *b = MeshBinding {
                ring_offset: info.ring_offset,
                slots,
                msg_size: info.msg_size,
                capacity: info.capacity,
                placement: info.placement.code(),
                protocol: binding_protocol(info.protocol.code(), info.parts),
            };
        }
        Ok(ctx)
    }
}

/// A consistent-enough snapshot of a slot's kernel-written status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotStatusSnapshot {
    /// The kernel's loop counter.
    pub heartbeat: u64,
    /// One of the `STATE_*` values.
    pub state: u32,
    /// The code passed to mesh_exit.
    pub exit_code: i32,
    /// The generation the kernel saw at start.
    pub generation: u32,
}

/// A program slot: meshd's side writes control, reads status.
#[derive(Debug, Clone, Copy)]
pub struct SlotRef<'a> {
    mailbox: &'a Mailbox,
    index: u32,
}

impl SlotRef<'_> {
    /// The slot's index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Offset of the slot from the file's start.
    pub fn offset(&self) -> u64 {
        self.mailbox.inner.geometry.slots_offset + u64::from(self.index) * size_of::<Slot>() as u64
    }

    pub(super) fn ptr(&self) -> *mut Slot {
        // SAFETY: `index` was checked against the validated slot table, which lies in the mapping.
        unsafe { self.mailbox.base().add(in_map(self.offset())).cast::<Slot>() }
    }

    /// One 32-bit word of this slot as an atomic.
    ///
    /// # Safety
    /// `field` must point at a 4-aligned `u32` inside this slot (a field projected from
    /// [`SlotRef::ptr`]), which the host accesses only atomically (the GPU's accesses are outside
    /// Rust's model).
    unsafe fn word32(&self, field: *mut u32) -> &AtomicU32 {
        // SAFETY: the caller's contract: the word lies in the mapping, which outlives `&self`.
        unsafe { AtomicU32::from_ptr(field) }
    }

    /// Asks the kernel to stop (`mesh_should_stop` becomes true).
    pub fn request_stop(&self) {
        // SAFETY: the slot pointer is valid and `control.stop` a 4-aligned u32 of it, used only
        // atomically by the host; `&raw mut` takes the field's address without a reference.
        unsafe { self.word32(&raw mut (*self.ptr()).control.stop) }.store(1, Ordering::Release);
    }

    /// Whether a stop is requested.
    pub fn stop_requested(&self) -> bool {
        // SAFETY: as in `request_stop`.
        unsafe { self.word32(&raw mut (*self.ptr()).control.stop) }.load(Ordering::Acquire) != 0
    }

    /// Prepares a (re)launch: clears the stop request, sets the generation, marks the kernel idle.
    /// The heartbeat and user words are kept, so that a program's counters continue across blinks.
    /// Only call while no kernel runs in this slot (the status words have no other writer then).
    pub fn arm(&self, generation: u32) {
        let p = self.ptr();
        // SAFETY: the slot is valid; with no kernel running meshd is the only writer of every word.
        unsafe {
            self.word32(&raw mut (*p).control.generation).store(generation, Ordering::Relaxed);
            self.word32(&raw mut (*p).control.stop).store(0, Ordering::Relaxed);
            self.word32(&raw mut (*p).status.state).store(STATE_IDLE, Ordering::Relaxed);
            self.word32((&raw mut (*p).status.exit_code).cast()).store(0, Ordering::Relaxed);
        }
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// Zeroes the kernel-written status and user words, for a program new to the slot.
    /// Only call while no kernel runs in this slot.
    pub fn reset_status(&self) {
        let p = self.ptr();
        // SAFETY: the slot is valid; with no kernel running meshd is the only writer of every word.
        unsafe {
            AtomicU64::from_ptr(&raw mut (*p).status.heartbeat).store(0, Ordering::Relaxed);
            self.word32(&raw mut (*p).status.generation).store(0, Ordering::Relaxed);
            for w in 0..32 {
                self.word32((&raw mut (*p).user.words).cast::<u32>().add(w)).store(0, Ordering::Relaxed);
            }
        }
        self.arm(0);
    }

    /// Takes the slot for a program: name and channel bindings (indices in the channel table).
    pub fn bind(&self, name: &str, bindings: &[u32]) -> Result<()> {
        if bindings.len() > MAX_BINDINGS {
            return Err(ShmError::TooManyBindings { index: self.index, count: bindings.len(), max: MAX_BINDINGS });
        }
        let p = self.ptr();
        let mut name_field = [0u8; NAME_LEN];
        let n = name.len().min(NAME_LEN);
        name_field[..n].copy_from_slice(&name.as_bytes()[..n]);
        // SAFETY: meshd is the only writer of the control line; the kernel is not running while a slot is bound.
        unsafe {
            for (i, w) in name_field.chunks_exact(4).enumerate() {
                let word = u32::from_ne_bytes(w.try_into().expect("4 bytes"));
                self.word32((&raw mut (*p).control.name).cast::<u32>().add(i)).store(word, Ordering::Relaxed);
            }
            for i in 0..MAX_BINDINGS {
                let v = bindings.get(i).copied().unwrap_or(NO_CHANNEL);
                self.word32((&raw mut (*p).control.bindings).cast::<u32>().add(i)).store(v, Ordering::Relaxed);
            }
            self.word32(&raw mut (*p).control.binding_count).store(u32_of(bindings.len()), Ordering::Relaxed);
            self.word32(&raw mut (*p).control.in_use).store(1, Ordering::Release);
        }
        Ok(())
    }

    /// The name `bind` wrote (cut to the field's bytes; a cut inside a character is dropped).
    pub fn name(&self) -> String {
        let p = self.ptr();
        let mut bytes = Vec::with_capacity(NAME_LEN);
        for i in 0..NAME_LEN / 4 {
            // SAFETY: `i < NAME_LEN / 4`, inside the name field; host reads are atomic loads.
            let word =
                unsafe { self.word32((&raw mut (*p).control.name).cast::<u32>().add(i)) }.load(Ordering::Relaxed);
            bytes.extend_from_slice(&word.to_ne_bytes());
        }
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        bytes.truncate(end);
        match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => {
                let valid = e.utf8_error().valid_up_to();
                String::from_utf8_lossy(&e.as_bytes()[..valid]).into_owned()
            }
        }
    }

    /// Frees the slot.
    pub fn release(&self) {
        // SAFETY: as in `request_stop`.
        unsafe { self.word32(&raw mut (*self.ptr()).control.in_use) }.store(0, Ordering::Release);
    }

    /// Whether a program owns the slot.
    pub fn in_use(&self) -> bool {
        // SAFETY: as in `request_stop`.
        unsafe { self.word32(&raw mut (*self.ptr()).control.in_use) }.load(Ordering::Acquire) != 0
    }

    /// The generation meshd last armed.
    pub fn generation(&self) -> u32 {
        // SAFETY: as in `request_stop`.
        unsafe { self.word32(&raw mut (*self.ptr()).control.generation) }.load(Ordering::Acquire)
    }

    /// The channel indices bound to the slot.
    pub fn bindings(&self) -> Vec<u32> {
        let p = self.ptr();
        // SAFETY: as in `request_stop`.
        let count = unsafe { self.word32(&raw mut (*p).control.binding_count) }.load(Ordering::Acquire) as usize;
        (0..count.min(MAX_BINDINGS))
            .map(|i| {
                // SAFETY: `i < MAX_BINDINGS`, inside the array.
                unsafe { self.word32((&raw mut (*p).control.bindings).cast::<u32>().add(i)) }.load(Ordering::Relaxed)
            })
            .collect()
    }

    /// The kernel-written status.
    pub fn status(&self) -> SlotStatusSnapshot {
        let p = self.ptr();
        // SAFETY: the slot is valid; host reads of kernel-written words are atomic loads.
        unsafe {
            SlotStatusSnapshot {
                heartbeat: AtomicU64::from_ptr(&raw mut (*p).status.heartbeat).load(Ordering::Acquire),
                state: self.word32(&raw mut (*p).status.state).load(Ordering::Acquire),
                exit_code: self.word32((&raw mut (*p).status.exit_code).cast()).load(Ordering::Acquire) as i32,
                generation: self.word32(&raw mut (*p).status.generation).load(Ordering::Acquire),
            }
        }
    }

    /// The kernel-written user words.
    pub fn user_words(&self) -> [u32; 32] {
        let p = self.ptr();
        let mut out = [0u32; 32];
        for (i, o) in out.iter_mut().enumerate() {
            // SAFETY: `i < 32`, inside the user line.
            *o = unsafe { self.word32((&raw mut (*p).user.words).cast::<u32>().add(i)) }.load(Ordering::Acquire);
        }
        out
    }
}
