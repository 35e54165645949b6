//! Device memory shared between processes by file descriptor (`cuMemCreate` with a POSIX handle type): MPS mode's device rings.
//!
//! In MPS mode every program is a process of its own, and a GPU fault ends every one of them, so a
//! device ring cannot belong to a worker. meshd allocates it with its own *plain* (non-MPS) context
//! current ([`ExportedMemory`]: created and exported as a descriptor, never mapped there), and each
//! worker that binds a program to the channel imports the descriptor and maps it ([`ImportedMemory`]).
//! The physical memory lives as long as meshd's handle, across every worker's end; a probe on the
//! H200 found such memory shared between MPS clients of one server and between a plain context and
//! an MPS client. [`SharedRings`] is meshd's side: one allocation per device channel, renewed in the
//! mailbox (loss counted from its indices) when it is made and kept, messages and all, through a
//! recovery (a fault ends the MPS clients, not meshd's context), and marked to be zeroed by the next
//! worker that maps a new one, on that worker's stream: meshd's context runs no GPU work
//! at all, because a plain context's work time-slices with the MPS server's (gaps up to 1.4 ms were
//! measured between plain processes), while a worker's runs inside the server beside the others.
//!
//! `tests/tests/mps_device.rs` is its GPU test.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use cudarc::driver::sys;
use mesh_shm::{ChannelInfo, Mailbox, Placement};

use crate::context::Context;
use crate::device::Device;
use crate::driver::{self, check};
use crate::error::CudaError;

/// Entry points of the virtual memory management API, checked before the first use (the driver's
/// start does not need them).
pub const VMM_ENTRY_POINTS: &[&str] = &[
    "cuMemGetAllocationGranularity",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
];

fn unsupported(reason: impl Into<String>) -> CudaError {
    CudaError::Invalid { what: "device memory shared by descriptor".into(), reason: reason.into() }
}

/// The driver, and every entry point of [`VMM_ENTRY_POINTS`] in it, checked once before the first
/// call (cudarc's dynamically loaded layer would panic on a missing one).
fn vmm_present() -> Result<(), CudaError> {
    static PRESENT: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    driver::init()?;
    PRESENT
        .get_or_init(|| match driver::missing_symbols(VMM_ENTRY_POINTS).first() {
            Some(missing) => Err(format!("libcuda lacks {missing}")),
            None => Ok(()),
        })
        .clone()
        .map_err(unsupported)
}

/// Whether `device` can share memory by POSIX descriptor from meshd's own plain context beside an
/// MPS server: the entry points, virtual memory management, the descriptor handle type, and compute
/// mode Default (in an exclusive mode the MPS server and meshd's context cannot both hold the GPU).
/// The refusal says which is missing.
pub fn check_support(device: &Device) -> Result<(), CudaError> {
    vmm_present()?;
    use sys::CUdevice_attribute as A;
    for (attr, what) in [
        (A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, "virtual memory management"),
        (A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, "POSIX descriptor handles"),
    ] {
        let mut v = 0;
        // SAFETY: a device the driver returned; a valid out-pointer.
        check("cuDeviceGetAttribute", unsafe { sys::cuDeviceGetAttribute(&mut v, attr, device.handle) })?;
        if v == 0 {
            return Err(unsupported(format!("{} does not support {what}", device.name)));
        }
    }
    let mut mode = 0;
    // SAFETY: as above.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut mode, A::CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, device.handle)
    })?;
    if mode != 0 {
        return Err(unsupported(format!(
            "{} is in compute mode {mode}, not Default (0): meshd's own context and the MPS server cannot both \
             hold it",
            device.name
        )));
    }
    Ok(())
}

fn prop(device: &Device) -> sys::CUmemAllocationProp {
    // SAFETY: plain data; zero is the documented default of every other field.
    let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    p.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = device.handle;
    p
}

/// `bytes` rounded up to the device's allocation granularity (what `cuMemCreate` and `cuMemMap` need).
pub fn rounded(device: &Device, bytes: usize) -> Result<usize, CudaError> {
    vmm_present()?;
    let p = prop(device);
    let mut granularity = 0;
    // SAFETY: valid out-pointer and property.
    check("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut granularity,
            &p,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    })?;
    let g = granularity.max(1);
    bytes.max(1).div_ceil(g).checked_mul(g).ok_or_else(|| unsupported(format!("{bytes} bytes overflow")))
}

/// A virtual range of `bytes` in `ctx` with `handle` mapped read-write for the context's device;
/// unmapped and freed on drop (the physical memory is released by whoever holds the handle).
#[derive(Debug)]
struct Mapping {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    ctx: Context,
}

impl Mapping {
    fn new(ctx: &Context, handle: sys::CUmemGenericAllocationHandle, bytes: usize) -> Result<Self, CudaError> {
        ctx.bind()?;
        let mut ptr = 0;
        // SAFETY: valid out-pointer; no fixed address, default alignment.
        check("cuMemAddressReserve", unsafe { sys::cuMemAddressReserve(&mut ptr, bytes, 0, 0, 0) })?;
        // From here the range is freed by Drop (an unmap of a range not mapped fails harmlessly).
        let m = Self { ptr, bytes, ctx: ctx.clone() };
        // SAFETY: a reserved range of `bytes`, a live handle of at least `bytes`.
        check("cuMemMap", unsafe { sys::cuMemMap(ptr, bytes, 0, handle, 0) })?;
        // SAFETY: plain data.
        let mut access: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
        access.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        access.location.id = ctx.device().handle;
        access.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        // SAFETY: the range was just mapped; one descriptor.
        check("cuMemSetAccess", unsafe { sys::cuMemSetAccess(ptr, bytes, &access, 1) })?;
        Ok(m)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let _ = self.ctx.make_current();
        // SAFETY: reserved (and mapped) in `new`, released once; errors cannot be acted on in Drop.
        unsafe {
            sys::cuMemUnmap(self.ptr, self.bytes);
            sys::cuMemAddressFree(self.ptr, self.bytes);
        }
    }
}

/// A new POSIX descriptor of allocation `handle`.
fn export_handle(handle: sys::CUmemGenericAllocationHandle) -> Result<OwnedFd, CudaError> {
    let mut fd: std::ffi::c_int = -1;
    // SAFETY: for a POSIX descriptor the out-parameter is an int; a live, exportable handle.
    check("cuMemExportToShareableHandle", unsafe {
        sys::cuMemExportToShareableHandle(
            (&raw mut fd).cast(),
            handle,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    })?;
    if fd < 0 {
        return Err(unsupported(format!("cuMemExportToShareableHandle returned descriptor {fd}")));
    }
    // SAFETY: the driver just opened this descriptor for us; nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The allocation handle that descriptor `fd` exports; release it once. The descriptor stays the
/// caller's: the driver keeps a reference of its own.
fn import_handle(fd: &OwnedFd) -> Result<sys::CUmemGenericAllocationHandle, CudaError> {
    let raw = fd.as_raw_fd();
    let mut handle = 0;
    // SAFETY: for a POSIX descriptor the OS handle is the descriptor's value cast to a pointer.
    let imported = check("cuMemImportFromShareableHandle", unsafe {
        sys::cuMemImportFromShareableHandle(
            &mut handle,
            raw as usize as *mut std::ffi::c_void,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        )
    });
    imported?;
    Ok(handle)
}

/// A copy of descriptor `fd`, close-on-exec, for another process to receive.
fn duplicate(fd: &OwnedFd) -> Result<OwnedFd, CudaError> {
    fd.try_clone().map_err(|e| unsupported(format!("duplicating the allocation's descriptor: {e}")))
}

/// Device memory that meshd allocates (its own context current) and exports: the physical
/// allocation's handle, released on drop (the memory goes once every importer has unmapped it too).
#[derive(Debug)]
pub struct ExportedMemory {
    handle: sys::CUmemGenericAllocationHandle,
    ctx: Context,
    bytes: usize,
    /// The descriptor it was imported from, if it was: the driver refuses to export an imported
    /// handle again (`CUDA_ERROR_INVALID_VALUE`), so copies of this descriptor are handed out.
    imported_from: Option<OwnedFd>,
}

impl ExportedMemory {
    /// `bytes` (rounded up to the granularity) of device memory on `ctx`'s device, exportable by
    /// descriptor. Its content is undefined until an importer zeroes it.
    pub fn create(ctx: &Context, bytes: usize) -> Result<Self, CudaError> {
        ctx.bind()?;
        let device = ctx.device();
        let bytes = rounded(device, bytes)?;
        let p = prop(device);
        let mut handle = 0;
        // SAFETY: valid out-pointer and property; a granularity multiple.
        check("cuMemCreate", unsafe { sys::cuMemCreate(&mut handle, bytes, &p, 0) })?;
        Ok(Self { handle, ctx: ctx.clone(), bytes, imported_from: None })
    }

    /// A new descriptor of the allocation (each call makes one; the receiver's copy is its own).
    pub fn export_fd(&self) -> Result<OwnedFd, CudaError> {
        match &self.imported_from {
            Some(fd) => duplicate(fd),
            None => export_handle(self.handle),
        }
    }

    /// Takes hold of the allocation that `fd` (kept, for [`Self::export_fd`]) describes, `bytes`
    /// long, as this process's own: what a meshd that adopts a worker holds of a ring the worker had
    /// mapped, so that the ring, and the messages in it, outlive that worker too.
    pub fn import(ctx: &Context, fd: OwnedFd, bytes: usize) -> Result<Self, CudaError> {
        ctx.bind()?;
        if bytes == 0 || rounded(ctx.device(), bytes)? != bytes {
            return Err(unsupported(format!("{bytes} bytes is not a multiple of the allocation granularity")));
        }
        let handle = import_handle(&fd)?;
        Ok(Self { handle, ctx: ctx.clone(), bytes, imported_from: Some(fd) })
    }

    /// Bytes allocated (granularity-rounded).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for ExportedMemory {
    fn drop(&mut self) {
        let _ = self.ctx.make_current();
        // SAFETY: created in `create`, released once; an error cannot be acted on in Drop.
        unsafe { sys::cuMemRelease(self.handle) };
    }
}

// SAFETY: the handle and addresses are process-wide driver objects, used with their context bound.
unsafe impl Send for ExportedMemory {}

/// Memory another process exported, mapped in this process's context: unmapped on drop.
#[derive(Debug)]
pub struct ImportedMemory {
    mapping: Mapping,
    /// The descriptor it was imported from: copies of it are what [`Self::export_fd`] hands out,
    /// since the driver exports no handle this process imported.
    fd: OwnedFd,
}

// SAFETY: as `ExportedMemory`.
unsafe impl Send for ImportedMemory {}

impl ImportedMemory {
    /// Imports `fd` (kept, for [`Self::export_fd`]) of `bytes` bytes and maps it in `ctx`.
    pub fn import(ctx: &Context, fd: OwnedFd, bytes: usize) -> Result<Self, CudaError> {
        ctx.bind()?;
        if bytes == 0 || rounded(ctx.device(), bytes)? != bytes {
            return Err(unsupported(format!("{bytes} bytes is not a multiple of the allocation granularity")));
        }
        let handle = import_handle(&fd)?;
        let mapped = Mapping::new(ctx, handle, bytes);
        // The mapping holds the memory now; our handle is released whatever happened.
        // SAFETY: imported above, released once.
        unsafe { sys::cuMemRelease(handle) };
        Ok(Self { mapping: mapped?, fd })
    }

    /// The mapped address in this context.
    pub fn address(&self) -> u64 {
        self.mapping.ptr
    }

    /// Bytes mapped.
    pub fn bytes(&self) -> usize {
        self.mapping.bytes
    }

    /// A new descriptor of the mapped allocation (the same physical memory), for another process to
    /// hold: what an adopted worker hands the meshd that adopts it. A copy of the descriptor it was
    /// imported from: the driver refuses `cuMemExportToShareableHandle` on an imported allocation
    /// (`CUDA_ERROR_INVALID_VALUE`, seen on an H100 with driver 580), while a passed-on descriptor
    /// imports in a third process and sees the same memory.
    pub fn export_fd(&self) -> Result<OwnedFd, CudaError> {
        duplicate(&self.fd)
    }

    /// Zeroes the whole mapping (no tag in any word: every slot of a ring reads as empty) on
    /// `stream`, a stream of this context with nothing running, and waits for it.
    pub fn zero(&self, stream: &crate::context::Stream) -> Result<(), CudaError> {
        let m = &self.mapping;
        if !stream.context().same(&m.ctx) {
            return Err(unsupported("zeroing on a stream of another context"));
        }
        m.ctx.make_current()?;
        // SAFETY: `m.ptr` maps `m.bytes` bytes in this context; the stream belongs to it.
        check("cuMemsetD8Async", unsafe { sys::cuMemsetD8Async(m.ptr, 0, m.bytes, stream.raw()) })?;
        stream.synchronize()
    }
}

/// A device ring renewed empty whose indices still counted messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedRingLoss {
    /// The channel.
    pub channel: String,
    /// Messages lost by the published indices.
    pub lost: u64,
}

/// A device ring kept through a recovery with messages in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedRingKept {
    /// The channel.
    pub channel: String,
    /// Messages in it by the published indices (`head - tail`).
    pub held: u64,
}

/// meshd's device rings in MPS mode: one exported allocation per device channel, owned by meshd's
/// plain context, made when the first program bound to the channel is launched.
#[derive(Debug)]
pub struct SharedRings {
    ctx: Context,
    rings: HashMap<u32, Ring>,
    losses: Vec<SharedRingLoss>,
}

/// One channel's allocation and whether its content must be zeroed before a program uses it.
#[derive(Debug)]
struct Ring {
    memory: ExportedMemory,
    dirty: bool,
}

/// A device ring to map in a worker: what [`SharedRings::export_for`] hands out.
#[derive(Debug)]
pub struct RingExport {
    /// The channel's index.
    pub channel: u32,
    /// A new descriptor of its allocation.
    pub fd: OwnedFd,
    /// The allocation's size.
    pub bytes: usize,
    /// Whether the worker must zero it before anything uses it (new, or renewed after a recovery);
    /// call [`SharedRings::zeroed`] once it has.
    pub zero: bool,
}

impl SharedRings {
    /// The rings of `ctx`, meshd's own context (checked to support descriptor sharing).
    pub fn new(ctx: Context) -> Result<Self, CudaError> {
        check_support(ctx.device())?;
        Ok(Self { ctx, rings: HashMap::new(), losses: Vec::new() })
    }

    /// The device channels program slot `slot` binds, each allocated first if it is not yet (renewed
    /// in the mailbox, its loss recorded), with a new descriptor each.
    pub fn export_for(&mut self, mailbox: &Mailbox, slot: u32) -> Result<Vec<RingExport>, CudaError> {
        let bound = mailbox
            .bound_channels(slot)
            .map_err(|e| CudaError::Invalid { what: format!("program slot {slot}"), reason: e.to_string() })?;
        let mut out = Vec::new();
        for info in bound.iter().filter(|i| i.placement == Placement::Device) {
            if !self.rings.contains_key(&info.index) {
                self.allocate(mailbox, info)?;
            }
            let ring = &self.rings[&info.index];
            out.push(RingExport {
                channel: info.index,
                fd: ring.memory.export_fd()?,
                bytes: ring.memory.bytes(),
                zero: ring.dirty,
            });
        }
        Ok(out)
    }

    fn allocate(&mut self, mailbox: &Mailbox, info: &ChannelInfo) -> Result<(), CudaError> {
        // In the channel's own format (a bulk ring is its payload and a page of flags, not an LL ring's
        // twice its payload).
        let bytes = crate::device_ring::ring_bytes(info)?;
        let ring = ExportedMemory::create(&self.ctx, bytes).map_err(|e| CudaError::Invalid {
            what: format!("channel {:?}", info.name),
            reason: format!("allocating its {bytes}-byte ring in meshd's own context: {e}"),
        })?;
        self.renew(mailbox, info)?;
        self.rings.insert(info.index, Ring { memory: ring, dirty: true });
        Ok(())
    }

    /// Holds, as channel `channel`'s ring, the allocation `fd` describes (`bytes` long), which an
    /// adopted worker had mapped: nothing is renewed or zeroed, so the messages in it stay. A ring
    /// held already (another adopted worker mapped the same channel) is kept as it is.
    pub fn adopt(&mut self, channel: u32, fd: OwnedFd, bytes: usize) -> Result<(), CudaError> {
        if self.rings.contains_key(&channel) {
            return Ok(());
        }
        let memory = ExportedMemory::import(&self.ctx, fd, bytes)?;
        self.rings.insert(channel, Ring { memory, dirty: false });
        Ok(())
    }

    /// Whether channel `channel`'s ring is held.
    pub fn holds(&self, channel: u32) -> bool {
        self.rings.contains_key(&channel)
    }

    /// The device this context is on.
    pub fn device(&self) -> &Device {
        self.ctx.device()
    }

    /// Channel `channel` was deleted: its allocation is released (the physical memory goes once no
    /// worker maps it: every program that bound the channel was unloaded first, and an unload unmaps
    /// its worker's rings), so that a channel created later at that index gets its own.
    pub fn release(&mut self, channel: u32) {
        self.rings.remove(&channel);
    }

    /// Channel `channel`'s ring was zeroed by the worker that mapped it.
    pub fn zeroed(&mut self, channel: u32) {
        if let Some(r) = self.rings.get_mut(&channel) {
            r.dirty = false;
        }
    }

    fn renew(&mut self, mailbox: &Mailbox, info: &ChannelInfo) -> Result<(), CudaError> {
        let lost = mailbox
            .renew_device_ring(info)
            .map_err(|e| CudaError::Invalid { what: format!("channel {:?}", info.name), reason: e.to_string() })?;
        if lost > 0 {
            self.losses.push(SharedRingLoss { channel: info.name.clone(), lost });
        }
        Ok(())
    }

    /// After a recovery ended every MPS client (none maps a ring now): every ring kept as it is,
    /// messages and indices, for the relaunched programs to go on from, as host channels do (a
    /// producer resumes after the last whole message in the ring, a consumer at the position it last
    /// published, taking up to a ring again). The memory is meshd's, which a fault of the MPS server
    /// does not touch. A ring whose channel is gone is released. Returns the rings kept with messages
    /// in them (by the published indices), for the log, and the errors.
    pub fn keep_all(&mut self, mailbox: &Mailbox) -> (Vec<SharedRingKept>, Vec<String>) {
        let mut errors = Vec::new();
        // Each descriptor on its own: one that a peer process damaged is reported, and its ring kept
        // (memory meshd owns) all the same.
        let mut channels = Vec::new();
        for c in mailbox.channels_each() {
            match c {
                Ok(info) => channels.push(info),
                Err(e) => errors.push(format!("device rings after the recovery: a channel left as it was: {e}")),
            }
        }
        let unreadable = !errors.is_empty();
        let mut kept = Vec::new();
        let indices: Vec<u32> = self.rings.keys().copied().collect();
        for index in indices {
            match channels.iter().find(|c| c.index == index) {
                Some(info) if info.head > info.tail => {
                    kept.push(SharedRingKept { channel: info.name.clone(), held: info.head - info.tail })
                }
                Some(_) => {}
                None if unreadable => {}
                None => {
                    self.rings.remove(&index);
                }
            }
        }
        (kept, errors)
    }

    /// Rings renewed with messages in them since the last call, for the log.
    pub fn take_losses(&mut self) -> Vec<SharedRingLoss> {
        std::mem::take(&mut self.losses)
    }

    /// Bytes of device memory held.
    pub fn bytes(&self) -> usize {
        self.rings.values().map(|r| r.memory.bytes()).sum()
    }
}
