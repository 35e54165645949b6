//! What a GPU image holds, read off its headers alone, and what the JIT must do with it: use it as it is, link it, or refuse it.
//!
//! Every read is bounds-checked: an image is untrusted input, so a truncated or corrupt one is
//! refused with the reason, never read past or panicked on.
//!
//! ELF facts relied on (LLVM `llvm/include/llvm/BinaryFormat/ELF.h` and `llvm/lib/Object`'s
//! handling of `EM_CUDA`; the System V gABI for the header layout), checked against CUDA 13.0's
//! nvcc (V13.0.88; its output for heartbeat.cu is in `tests/images/`):
//! - a cubin is a little-endian ELF64 file with `e_machine` = `EM_CUDA` (190); `e_type` is `ET_EXEC`
//!   (2) for `nvcc -cubin` and `ET_REL` (1) for `nvcc -cubin -dc`; `EI_OSABI` is 0x41 in CUDA 13
//!   (not read here);
//! - the SM number sits in `e_flags`, where depends on `e_ident[EI_ABIVERSION]`:
//!   `ELFABIVERSION_CUDA_V1` (7): the low byte (`EF_CUDA_SM` = 0xff; bits 8-11 are
//!   `EF_CUDA_TEXMODE_*`, `EF_CUDA_64BIT_ADDRESS` = 0x400, `EF_CUDA_ACCELERATORS_V1` = 0x800);
//!   `ELFABIVERSION_CUDA_V2` (8, CUDA 12.8 and later, every cubin of CUDA 13): the second byte
//!   (`EF_CUDA_SM_MASK` = 0xff00, `EF_CUDA_SM_OFFSET` = 8). Both encode sm_XY as the number XY
//!   (0x5a = 90). Measured with CUDA 13.0: sm_90 0x06005a04, sm_80 0x06005004, sm_75 0x06004b04,
//!   sm_100 0x06006402, sm_120 0x06007802; sm_90a, sm_100a and sm_100f carry the same `e_flags` as
//!   sm_90 and sm_100 (the suffix is not in the header);
//! - a cubin may hold `SHT_NOBITS` sections (CUDA 13's sm_90 cubin has `.nv.shared.reserved.0`)
//!   and `PT_LOAD` segments of no file bytes; neither occupies the file, so neither is bounds-checked.
//!   Nor are NVIDIA's own section types of no file bytes, which a relocatable cubin (`nvcc -cubin
//!   -dc`) uses in place of `SHT_NOBITS`: `SHT_CUDA_GLOBAL` (0x70000007, `.nv.global`, a
//!   `__device__` array without initializer), `SHT_CUDA_LOCAL` (0x70000009), `SHT_CUDA_SHARED`
//!   (0x7000000a) and `SHT_CUDA_SHARED_RESERVED` (0x70000015), the set nvlink itself exempts from
//!   its data-range check (seen on the H200: a `-dc` cubin of a program with a 32 KiB `__device__`
//!   array, 5,240 bytes long, holds a `.nv.global` of 32,768 bytes at offset 3,456);
//!
//! Fatbin facts relied on (NVIDIA's `fatbinary.h`, shipped with older CUDA toolkits, for the
//! header and the kinds; the entry layout as read by cuobjdump look-alikes: n-eiling's
//! cuda-fatbin-decompression, jiegec's `fatbinary` crate; each checked on CUDA 13.0's output):
//! - header, 16 bytes: magic 0xBA55ED50 (u32), version (u16, 1), header size (u16, 16), size of
//!   the entries that follow (u64);
//! - each entry: kind (u16 at 0: 1 PTX, 2 ELF, 8 LTO-IR, the last for `code=lto_90` with CUDA 13),
//!   header size (u32 at 4: 64 for ELF, 80 or 96 for PTX, 120 for LTO-IR), payload size (u64 at 8,
//!   padded to 8), architecture (u32 at 28: 90 for sm_90 / compute_90 / lto_90), flags (u64 at 40:
//!   0x11 is 64-bit and Linux; 0x2000 (LZ4, older toolkits) and 0x8000 (CUDA 13) mark a
//!   compressed payload); the payload follows the entry's header;
//! - what CUDA 13.0's nvcc compresses by default (`-compress-mode=default`): PTX (zstd, flags
//!   0x8011), relocatable SASS (`-fatbin -dc`: zstd, flags 0x8011) and LTO-IR (flags 0x18011);
//!   executable SASS is stored plain (flags 0x11; a 325 KB one too), unless built with
//!   `-compress-mode=size`. A compressed payload is not decompressed here (no decompressor is
//!   linked in), so a compressed SASS entry's ELF type is unknown: see [`Plan::LinkOrAsIs`].

use mesh_backend::ImageKind;
use nvjitlink_sys::InputType;

/// What to do with an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Load the bytes as they are: an executable cubin for this architecture, or a fatbin holding
    /// SASS for it (the driver picks that entry). Nothing is compiled.
    AsIs,
    /// Link through nvJitLink, giving it the image as `input`; `lto` when LTO-IR is in it.
    Link {
        /// How nvJitLink is told to read the image.
        input: InputType,
        /// Whether nvJitLink needs `-lto`.
        lto: bool,
    },
    /// A fatbin whose only SASS for this architecture is compressed, so whether that SASS is
    /// executable (to be used as it is) or relocatable (`nvcc -fatbin -dc`, compressed by default
    /// since CUDA 12.8; to be linked) cannot be read here. Link the fatbin through nvJitLink
    /// (`NVJITLINK_INPUT_FATBIN`): relocatable SASS links into a cubin with code, while executable
    /// SASS links into one with none ([`has_code`] tells), and then the bytes are used as they are.
    LinkOrAsIs {
        /// Whether nvJitLink needs `-lto`.
        lto: bool,
    },
}

const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];
const ELF64_HEADER: usize = 64;
const ET_REL: u16 = 1;
const ET_EXEC: u16 = 2;
const EM_CUDA: u16 = 190;
const ELFABIVERSION_CUDA_V1: u8 = 7;
const ELFABIVERSION_CUDA_V2: u8 = 8;

const FATBIN_MAGIC: u32 = 0xBA55_ED50;
const FATBIN_HEADER: usize = 16;
/// The entry fields read here end with the flags, at byte 48.
const FATBIN_ENTRY_MIN: usize = 48;
const FATBIN_KIND_PTX: u16 = 1;
const FATBIN_KIND_ELF: u16 = 2;
const FATBIN_KIND_IR: u16 = 8;

/// Decides what the JIT does with `image` (detected as `kind`) for a device of architecture `arch`
/// (`sm_90`); `Err` is the reason for a refusal, worded for the user.
pub fn plan(arch: &str, kind: ImageKind, image: &[u8]) -> Result<Plan, ImageError> {
    match kind {
        ImageKind::Ptx => Ok(Plan::Link { input: InputType::Ptx, lto: false }),
        ImageKind::LtoIr => Ok(Plan::Link { input: InputType::LtoIr, lto: true }),
        ImageKind::Cubin => {
            let sm = device_sm(arch)?;
            let elf = Elf::read(image)?;
            match elf.e_type {
                ET_REL => Ok(Plan::Link { input: InputType::Cubin, lto: false }),
                ET_EXEC if elf.sm == sm => Ok(Plan::AsIs),
                ET_EXEC => Err(ImageError::WrongArch { built: elf.sm, gpu: sm }),
                other => Err(ImageError::ElfType(other)),
            }
        }
        ImageKind::Fatbin => plan_fatbin(device_sm(arch)?, image),
    }
}

/// Why an image is refused for this GPU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[allow(missing_docs, reason = "each field is named in its variant's message")]
pub enum ImageError {
    /// The device's architecture is not `sm_XY`.
    #[error("the device architecture {0:?} is not of the form sm_XY")]
    BadArch(String),
    /// An executable cubin for another SM.
    #[error("the cubin is built for sm_{built}; this GPU is sm_{gpu} (rebuild with -arch=sm_{gpu})")]
    WrongArch { built: u32, gpu: u32 },
    /// An ELF type other than executable or relocatable.
    #[error("an ELF cubin of type {0}, neither executable (2) nor relocatable (1)")]
    ElfType(u16),
    /// A CUDA ELF cut short or whose tables point past its end.
    #[error("truncated or corrupt ELF ({len} bytes): {what}")]
    TruncatedElf { len: usize, what: String },
    /// An ELF file for another machine (`e_machine`): a host object, say.
    #[error("{}", not_cuda(*.0))]
    NotCuda(u16),
    /// A CUDA ELF of another class or byte order.
    #[error("a CUDA ELF that is not 64-bit little-endian (class {class}, data {data}): not a cubin this GPU takes")]
    NotElf64Le { class: u8, data: u8 },
    /// A CUDA ELF ABI version whose flags meshd cannot read the SM from.
    #[error(
        "CUDA ELF ABI version {abi} (e_flags {flags:#010x}): meshd reads versions 7 and 8 only, so the cubin's \
         architecture cannot be checked"
    )]
    ElfAbi { abi: u8, flags: u32 },
    /// A fatbin cut short or whose entries run past its end.
    #[error("truncated or corrupt fatbin ({len} bytes): {what}")]
    TruncatedFatbin { len: usize, what: String },
    /// A fatbin's SASS entry that is no readable cubin.
    #[error("fatbin entry {n} (sm_{arch} SASS): {source}")]
    FatbinEntry { n: usize, arch: u32, source: Box<ImageError> },
    /// A fatbin holding nothing at all.
    #[error("a fatbin with no entries")]
    EmptyFatbin,
    /// A fatbin entry whose cubin says another SM than the entry.
    #[error("corrupt fatbin: an entry marked sm_{marked} holds a cubin built for sm_{built}")]
    MismatchedEntry { marked: u32, built: u32 },
    /// A fatbin with nothing this GPU runs or links.
    #[error(
        "the fatbin holds {}: nothing for this GPU, sm_{sm} (it needs sm_{sm} SASS, or PTX / LTO-IR for compute_{sm} \
         or older)",
        held.join(", ")
    )]
    NothingForGpu { held: Vec<String>, sm: u32 },
}

/// `sm_90` → 90 (a suffix such as `a` is ignored: it names features, not the SM).
fn device_sm(arch: &str) -> Result<u32, ImageError> {
    let digits: String = arch.strip_prefix("sm_").unwrap_or("").chars().take_while(char::is_ascii_digit).collect();
    digits.parse().map_err(|_| ImageError::BadArch(arch.to_string()))
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at.checked_add(2)?)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at.checked_add(4)?)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at.checked_add(8)?)?.try_into().ok()?))
}

/// Whether `[offset, offset + count * size)` lies inside a file of `len` bytes.
fn table_fits(offset: u64, count: u64, size: u64, len: usize) -> bool {
    count.checked_mul(size).and_then(|n| n.checked_add(offset)).is_some_and(|end| end <= len as u64)
}

/// What the JIT needs of a CUDA ELF file's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Elf {
    e_type: u16,
    /// The SM number from `e_flags` (90 for sm_90).
    sm: u32,
}

impl Elf {
    /// Reads and checks the header of an ELF image: a CUDA ELF64 file whose header, section and
    /// program tables, and every section and segment they describe, lie inside the bytes.
    fn read(b: &[u8]) -> Result<Self, ImageError> {
        let truncated = |what: &str| ImageError::TruncatedElf { len: b.len(), what: what.to_string() };
        if b.get(..4) != Some(&ELF_MAGIC[..]) {
            return Err(truncated("no ELF magic"));
        }
        // e_machine sits at byte 18 in ELF32 and ELF64 alike, so a host object is told apart
        // before anything else is read.
        let big_endian = b.get(5) == Some(&2);
        let machine = match b.get(18..20) {
            Some(&[x, y]) if big_endian => u16::from_be_bytes([x, y]),
            Some(&[x, y]) => u16::from_le_bytes([x, y]),
            _ => return Err(truncated("shorter than an ELF header (64 bytes)")),
        };
        if machine != EM_CUDA {
            return Err(ImageError::NotCuda(machine));
        }
        if b[4] != 2 || b[5] != 1 {
            return Err(ImageError::NotElf64Le { class: b[4], data: b[5] });
        }
        if b.len() < ELF64_HEADER {
            return Err(truncated("shorter than an ELF header (64 bytes)"));
        }
        // Every field below lies inside the 64-byte header, checked just above.
        let field16 = |at| u16_at(b, at).unwrap_or(0);
        let field64 = |at| u64_at(b, at).unwrap_or(0);
        let e_type = field16(16);
        let flags = u32_at(b, 48).unwrap_or(0);
        let (phoff, phentsize, phnum) = (field64(32), u64::from(field16(54)), u64::from(field16(56)));
        let (shoff, shentsize, shnum) = (field64(40), u64::from(field16(58)), u64::from(field16(60)));
        check_tables(b, (phoff, phentsize, phnum), (shoff, shentsize, shnum))?;
        let sm = match b[8] {
            ELFABIVERSION_CUDA_V1 => flags & 0xff,
            ELFABIVERSION_CUDA_V2 => (flags >> 8) & 0xff,
            other => {
                return Err(ImageError::ElfAbi { abi: other, flags });
            }
        };
        Ok(Self { e_type, sm })
    }
}

/// Whether a section of type `sh_type` describes memory only, with no bytes in the file: `SHT_NOBITS`
/// and NVIDIA's types of no file bytes (the module's notes).
fn section_is_memory_only(sh_type: u32) -> bool {
    const SHT_NOBITS: u32 = 8;
    const SHT_CUDA_GLOBAL: u32 = 0x7000_0007;
    const SHT_CUDA_LOCAL: u32 = 0x7000_0009;
    const SHT_CUDA_SHARED: u32 = 0x7000_000a;
    const SHT_CUDA_SHARED_RESERVED: u32 = 0x7000_0015;
    matches!(sh_type, SHT_NOBITS | SHT_CUDA_GLOBAL | SHT_CUDA_LOCAL | SHT_CUDA_SHARED | SHT_CUDA_SHARED_RESERVED)
}

/// Checks that an ELF's program and section headers, each table given as (offset, entry size,
/// count), and every section and segment they describe, lie inside `b`.
fn check_tables(
    b: &[u8],
    (phoff, phentsize, phnum): (u64, u64, u64),
    (shoff, shentsize, shnum): (u64, u64, u64),
) -> Result<(), ImageError> {
    let truncated = |what: &str| ImageError::TruncatedElf { len: b.len(), what: what.to_string() };
    if phnum > 0 && (phentsize < 56 || !table_fits(phoff, phnum, phentsize, b.len())) {
        return Err(truncated(&format!(
            "{phnum} program headers of {phentsize} bytes at {phoff} do not fit in the file"
        )));
    }
    if shnum > 0 && (shentsize < 64 || !table_fits(shoff, shnum, shentsize, b.len())) {
        return Err(truncated(&format!(
            "{shnum} section headers of {shentsize} bytes at {shoff} do not fit in the file"
        )));
    }
    for i in 0..shnum {
        #[allow(clippy::cast_possible_truncation, reason = "table_fits put the table inside b, a slice")]
        let at = (shoff + i * shentsize) as usize;
        let sh_type = u32_at(b, at + 4).unwrap_or(0);
        let (offset, size) = (u64_at(b, at + 24).unwrap_or(0), u64_at(b, at + 32).unwrap_or(0));
        if sh_type != 0 && !section_is_memory_only(sh_type) && !table_fits(offset, 1, size, b.len()) {
            return Err(truncated(&format!("section {i} ({size} bytes at {offset}) runs past the end")));
        }
    }
    for i in 0..phnum {
        #[allow(clippy::cast_possible_truncation, reason = "table_fits put the table inside b, a slice")]
        let at = (phoff + i * phentsize) as usize;
        let (offset, filesz) = (u64_at(b, at + 8).unwrap_or(0), u64_at(b, at + 32).unwrap_or(0));
        if !table_fits(offset, 1, filesz, b.len()) {
            return Err(truncated(&format!("segment {i} ({filesz} bytes at {offset}) runs past the end")));
        }
    }
    Ok(())
}

/// Whether `cubin` is a CUDA ELF file holding code: a `SHT_PROGBITS` section with
/// `SHF_EXECINSTR` and some bytes (`.text.mesh_main`). What nvJitLink makes of executable SASS
/// (an executable cubin, or a fatbin of one) holds none: no `PROGBITS` section at all.
pub fn has_code(cubin: &[u8]) -> bool {
    const SHT_PROGBITS: u32 = 1;
    const SHF_EXECINSTR: u64 = 0x4;
    if Elf::read(cubin).is_err() {
        return false;
    }
    // Elf::read checked that the section table lies inside the bytes; reads stay checked anyway.
    let (shoff, shentsize, shnum) = (u64_at(cubin, 40), u16_at(cubin, 58), u16_at(cubin, 60));
    let (Some(shoff), Some(shentsize), Some(shnum)) = (shoff, shentsize, shnum) else {
        return false;
    };
    (0..u64::from(shnum)).any(|i| {
        let Some(at) = i.checked_mul(u64::from(shentsize)).and_then(|o| o.checked_add(shoff)) else {
            return false;
        };
        let at = usize::try_from(at).unwrap_or(usize::MAX);
        let field32 = |off: usize| at.checked_add(off).and_then(|a| u32_at(cubin, a));
        let field64 = |off: usize| at.checked_add(off).and_then(|a| u64_at(cubin, a));
        field32(4) == Some(SHT_PROGBITS)
            && field64(8).is_some_and(|f| f & SHF_EXECINSTR != 0)
            && field64(32).is_some_and(|n| n > 0)
    })
}

/// The refusal of an ELF file that is not for a CUDA GPU.
fn not_cuda(machine: u16) -> String {
    let host = match machine {
        3 => Some("x86"),
        62 => Some("x86-64"),
        21 => Some("PowerPC64"),
        183 => Some("AArch64"),
        243 => Some("RISC-V"),
        _ => None,
    };
    let build = "build the device code alone with `nvcc -cubin -arch=sm_XY`, `nvcc -ptx` or `nvcc -fatbin`";
    match host {
        Some(cpu) => format!("a host object ({cpu} ELF, e_machine {machine}), not a GPU image: {build}"),
        None => format!("an ELF file for machine {machine}, not a GPU image (a cubin is EM_CUDA, 190): {build}"),
    }
}

/// One fatbin entry, as far as choosing among them goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    kind: u16,
    arch: u32,
    /// For an ELF entry whose payload could be read (not compressed): its header.
    elf: Option<Elf>,
}

impl Entry {
    fn describe(&self) -> String {
        match self.kind {
            FATBIN_KIND_ELF => format!("sm_{} SASS", self.arch),
            FATBIN_KIND_PTX => format!("compute_{} PTX", self.arch),
            FATBIN_KIND_IR => format!("lto_{} LTO-IR", self.arch),
            other => format!("an entry of kind {other} for {}", self.arch),
        }
    }
}

/// Reads every entry of a fatbin, refusing one whose header or payload runs past its bytes.
fn fatbin_entries(b: &[u8]) -> Result<Vec<Entry>, ImageError> {
    let truncated = |what: String| ImageError::TruncatedFatbin { len: b.len(), what };
    if u32_at(b, 0) != Some(FATBIN_MAGIC) {
        return Err(truncated("no fatbin magic".into()));
    }
    let (Some(header), Some(size)) = (u16_at(b, 6), u64_at(b, 8)) else {
        return Err(truncated(format!("shorter than a fatbin header ({FATBIN_HEADER} bytes)")));
    };
    let start = usize::from(header);
    let end = u64::try_from(start).ok().and_then(|s| s.checked_add(size));
    let end = match end.and_then(|e| usize::try_from(e).ok()) {
        Some(e) if start >= FATBIN_HEADER && e <= b.len() => e,
        _ => return Err(truncated(format!("a header of {header} bytes and {size} bytes of entries do not fit"))),
    };
    let mut entries = Vec::new();
    let mut at = start;
    while at < end {
        let n = entries.len();
        let fields = (u16_at(b, at), u32_at(b, at + 4), u64_at(b, at + 8), u32_at(b, at + 28), u64_at(b, at + 40));
        let (Some(kind), Some(head), Some(len), Some(arch), Some(flags)) = fields else {
            return Err(truncated(format!("entry {n} at byte {at}: its header runs past the end")));
        };
        let payload = usize::try_from(head)
            .ok()
            .filter(|&h| h >= FATBIN_ENTRY_MIN)
            .and_then(|h| at.checked_add(h))
            .and_then(|p| Some((p, p.checked_add(usize::try_from(len).ok()?)?)))
            .filter(|&(_, e)| e <= end);
        let Some((from, to)) = payload else {
            return Err(truncated(format!(
                "entry {n} at byte {at}: a {head}-byte header and {len}-byte payload do not fit"
            )));
        };
        // A compressed payload cannot be read without its decompressor; the entry's own header is
        // trusted for it. An uncompressed ELF payload is checked like a cubin.
        const COMPRESSED: u64 = 0x2000 | 0x8000;
        let data = &b[from..to];
        let elf = if kind == FATBIN_KIND_ELF && flags & COMPRESSED == 0 && data.starts_with(&ELF_MAGIC) {
            Some(Elf::read(data).map_err(|e| ImageError::FatbinEntry { n, arch, source: Box::new(e) })?)
        } else {
            None
        };
        entries.push(Entry { kind, arch, elf });
        at = to;
    }
    Ok(entries)
}

fn plan_fatbin(sm: u32, b: &[u8]) -> Result<Plan, ImageError> {
    let entries = fatbin_entries(b)?;
    if entries.is_empty() {
        return Err(ImageError::EmptyFatbin);
    }
    let sass = |e: &Entry| e.kind == FATBIN_KIND_ELF && e.arch == sm;
    if let Some(e) = entries.iter().find(|e| sass(e) && e.elf.is_some_and(|elf| elf.sm != sm)) {
        return Err(ImageError::MismatchedEntry { marked: e.arch, built: e.elf.map_or(0, |elf| elf.sm) });
    }
    if entries.iter().any(|e| sass(e) && e.elf.is_some_and(|elf| elf.e_type == ET_EXEC)) {
        return Ok(Plan::AsIs);
    }
    // PTX and LTO-IR are compiled forward (compute_80 PTX runs on sm_90); relocatable SASS for this
    // SM links. nvJitLink reads the whole fatbin and picks among them itself.
    let linkable = |e: &&Entry| (matches!(e.kind, FATBIN_KIND_PTX | FATBIN_KIND_IR) && e.arch <= sm) || sass(e);
    let usable: Vec<&Entry> = entries.iter().filter(linkable).collect();
    let lto = usable.iter().any(|e| e.kind == FATBIN_KIND_IR);
    if entries.iter().any(|e| sass(e) && e.elf.is_none()) {
        return Ok(Plan::LinkOrAsIs { lto });
    }
    if !usable.is_empty() {
        return Ok(Plan::Link { input: InputType::Fatbin, lto });
    }
    Err(ImageError::NothingForGpu { held: entries.iter().map(Entry::describe).collect(), sm })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const ET_DYN: u16 = 3;

    /// A synthetic ELF64 file: the header, 32 bytes of section data, then a section table of two
    /// entries (the null one and a PROGBITS over the data), as a real cubin lays them out.
    pub(crate) fn elf(machine: u16, e_type: u16, abi: u8, flags: u32) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(&ELF_MAGIC);
        b[4] = 2; // ELFCLASS64
        b[5] = 1; // ELFDATA2LSB
        b[6] = 1; // EV_CURRENT
        b[7] = 0x33; // ELFOSABI_CUDA
        b[8] = abi;
        b[16..18].copy_from_slice(&e_type.to_le_bytes());
        b[18..20].copy_from_slice(&machine.to_le_bytes());
        b[20..24].copy_from_slice(&1u32.to_le_bytes());
        b[40..48].copy_from_slice(&96u64.to_le_bytes()); // e_shoff
        b[48..52].copy_from_slice(&flags.to_le_bytes());
        b[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
        b[58..60].copy_from_slice(&64u16.to_le_bytes()); // e_shentsize
        b[60..62].copy_from_slice(&2u16.to_le_bytes()); // e_shnum
        b.extend_from_slice(&[0xab; 32]);
        b.extend_from_slice(&[0; 64]); // the null section
        let mut progbits = [0u8; 64];
        progbits[4..8].copy_from_slice(&1u32.to_le_bytes());
        progbits[8..16].copy_from_slice(&6u64.to_le_bytes()); // SHF_ALLOC | SHF_EXECINSTR, as .text.mesh_main
        progbits[24..32].copy_from_slice(&64u64.to_le_bytes());
        progbits[32..40].copy_from_slice(&32u64.to_le_bytes());
        b.extend_from_slice(&progbits);
        b
    }

    /// What `nvcc -cubin -arch=sm_90` makes with CUDA 13 (ABI version 8, the measured e_flags).
    pub(crate) fn cubin_sm90() -> Vec<u8> {
        elf(EM_CUDA, ET_EXEC, ELFABIVERSION_CUDA_V2, 0x0600_5a04)
    }

    /// A fatbin of `(kind, arch, flags, payload)` entries, each header 64 bytes, payloads padded to 8.
    pub(crate) fn fatbin(entries: &[(u16, u32, u64, &[u8])]) -> Vec<u8> {
        let mut body = Vec::new();
        for &(kind, arch, flags, payload) in entries {
            let padded = payload.len().div_ceil(8) * 8;
            let mut h = [0u8; 64];
            h[..2].copy_from_slice(&kind.to_le_bytes());
            h[2..4].copy_from_slice(&0x0101u16.to_le_bytes());
            h[4..8].copy_from_slice(&64u32.to_le_bytes());
            h[8..16].copy_from_slice(&(padded as u64).to_le_bytes());
            h[28..32].copy_from_slice(&arch.to_le_bytes());
            h[40..48].copy_from_slice(&(flags | 0x11).to_le_bytes()); // 64-bit, Linux
            body.extend_from_slice(&h);
            body.extend_from_slice(payload);
            body.resize(body.len() + padded - payload.len(), 0);
        }
        let mut b = Vec::new();
        b.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        b.extend_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&16u16.to_le_bytes());
        b.extend_from_slice(&(body.len() as u64).to_le_bytes());
        b.extend_from_slice(&body);
        b
    }

    fn cubin(b: &[u8]) -> Result<Plan, ImageError> {
        plan("sm_90", ImageKind::Cubin, b)
    }

    fn fat(b: &[u8]) -> Result<Plan, ImageError> {
        plan("sm_90", ImageKind::Fatbin, b)
    }

    fn refused(r: Result<Plan, ImageError>, words: &[&str]) {
        let why = r.expect_err("should be refused").to_string();
        for w in words {
            assert!(why.contains(w), "{why:?} lacks {w:?}");
        }
    }

    const LINK_CUBIN: Plan = Plan::Link { input: InputType::Cubin, lto: false };
    const LINK_FATBIN: Plan = Plan::Link { input: InputType::Fatbin, lto: false };

    #[test]
    fn the_sm_is_read_from_both_elf_abi_versions() {
        // Version 7: sm_90 in the low byte, next to EF_CUDA_64BIT_ADDRESS (0x400) and a texture
        // mode bit (0x100): read as version 8 this would give sm_5.
        assert_eq!(cubin(&elf(EM_CUDA, ET_EXEC, 7, 0x005a_055a)), Ok(Plan::AsIs));
        // Version 8 (CUDA 12.8+): sm_90 in the second byte, flags in the low one.
        assert_eq!(cubin(&cubin_sm90()), Ok(Plan::AsIs));
        // Other bits of the low byte do not matter (CUDA 13 writes 0x04 for sm_90, 0x02 for sm_100;
        // sm_90a's e_flags are sm_90's).
        assert_eq!(cubin(&elf(EM_CUDA, ET_EXEC, 8, 0x5a08)), Ok(Plan::AsIs));
        refused(cubin(&elf(EM_CUDA, ET_EXEC, 7, 0x0050_0550)), &["built for sm_80", "this GPU is sm_90"]);
        refused(cubin(&elf(EM_CUDA, ET_EXEC, 8, 0x0600_5004)), &["built for sm_80", "this GPU is sm_90"]);
        refused(cubin(&elf(EM_CUDA, ET_EXEC, 8, 0x0600_6402)), &["built for sm_100", "this GPU is sm_90"]);
        refused(cubin(&elf(EM_CUDA, ET_EXEC, 9, 0x5a00)), &["ABI version 9"]);
        assert_eq!(plan("sm_100", ImageKind::Cubin, &elf(EM_CUDA, ET_EXEC, 8, 0x0600_6402)), Ok(Plan::AsIs));
        refused(plan("gpu", ImageKind::Cubin, &cubin_sm90()), &["not of the form sm_XY"]);
    }

    #[test]
    fn relocatable_cubins_link_and_other_elf_types_are_refused() {
        assert_eq!(cubin(&elf(EM_CUDA, ET_REL, 8, 0x0600_5a04)), Ok(LINK_CUBIN));
        // nvJitLink judges a relocatable cubin's architecture itself (its log says why).
        assert_eq!(cubin(&elf(EM_CUDA, ET_REL, 8, 0x0600_5004)), Ok(LINK_CUBIN));
        refused(cubin(&elf(EM_CUDA, ET_DYN, 8, 0x0600_5a04)), &["type 3"]);
    }

    #[test]
    fn host_objects_and_other_elf_files_are_not_gpu_images() {
        refused(
            cubin(&elf(62, ET_REL, 0, 0)),
            &["a host object", "x86-64", "not a GPU image", "nvcc -cubin", "-fatbin"],
        );
        refused(cubin(&elf(183, ET_REL, 0, 0)), &["a host object", "AArch64"]);
        refused(cubin(&elf(40, ET_EXEC, 0, 0)), &["machine 40", "not a GPU image"]);
        let mut elf32 = cubin_sm90();
        elf32[4] = 1;
        refused(cubin(&elf32), &["not 64-bit little-endian"]);
        // A host object cut short after its e_machine is still named for what it is.
        refused(cubin(&elf(62, ET_REL, 0, 0)[..20]), &["a host object"]);
    }

    #[test]
    fn every_truncation_of_a_cubin_is_refused_as_such() {
        for image in [cubin_sm90(), elf(EM_CUDA, ET_REL, 8, 0x0600_5a04)] {
            assert!(cubin(&image).is_ok());
            for len in 0..image.len() {
                refused(cubin(&image[..len]), &["truncated or corrupt ELF"]);
            }
        }
    }

    #[test]
    fn corrupt_tables_are_refused_not_read_past() {
        let mut b = cubin_sm90();
        b[40..48].copy_from_slice(&u64::MAX.to_le_bytes()); // e_shoff
        refused(cubin(&b), &["section headers"]);
        let mut b = cubin_sm90();
        b[58..60].copy_from_slice(&8u16.to_le_bytes()); // e_shentsize too small to hold a section header
        refused(cubin(&b), &["section headers"]);
        let mut b = cubin_sm90();
        b[160 + 32..160 + 40].copy_from_slice(&u64::MAX.to_le_bytes()); // sh_size of the PROGBITS
        refused(cubin(&b), &["section 1"]);
        let mut b = cubin_sm90();
        b[32..40].copy_from_slice(&100u64.to_le_bytes()); // e_phoff
        b[54..56].copy_from_slice(&56u16.to_le_bytes());
        b[56..58].copy_from_slice(&u16::MAX.to_le_bytes()); // e_phnum
        refused(cubin(&b), &["program headers"]);
    }

    #[test]
    fn sections_of_memory_only_are_not_looked_for_in_the_file() {
        // A relocatable cubin's `.nv.global` (SHT_CUDA_GLOBAL) of 32 KiB in a file of 224 bytes, as
        // `nvcc -cubin -dc` writes one for a `__device__` array: accepted, like SHT_NOBITS and
        // NVIDIA's other types of no file bytes; the same size as PROGBITS or an unknown NVIDIA
        // type is refused, naming the section.
        for (sh_type, ok) in [
            (8u32, true),
            (0x7000_0007, true),
            (0x7000_0009, true),
            (0x7000_000a, true),
            (0x7000_0015, true),
            (1, false),
            (0x7000_0000, false),
            (0x7000_0008, false),
        ] {
            let mut b = elf(EM_CUDA, ET_REL, 8, 0x0600_5a04);
            b[160 + 4..160 + 8].copy_from_slice(&sh_type.to_le_bytes());
            b[160 + 32..160 + 40].copy_from_slice(&32768u64.to_le_bytes());
            if ok {
                assert_eq!(cubin(&b), Ok(LINK_CUBIN), "section type {sh_type:#x}");
            } else {
                refused(cubin(&b), &["section 1", "runs past the end"]);
            }
        }
    }

    #[test]
    fn a_fatbin_with_sass_for_this_gpu_is_used_as_it_is() {
        let sass = cubin_sm90();
        assert_eq!(fat(&fatbin(&[(FATBIN_KIND_ELF, 90, 0, &sass)])), Ok(Plan::AsIs));
        // Beside other architectures and compressed PTX, as `nvcc -fatbin` with three -gencode makes it.
        let sm80 = elf(EM_CUDA, ET_EXEC, 8, 0x0600_5004);
        let mixed = fatbin(&[
            (FATBIN_KIND_ELF, 80, 0, &sm80),
            (FATBIN_KIND_PTX, 90, 0x8000, &[0x28, 0xb5, 0x2f, 0xfd]),
            (FATBIN_KIND_ELF, 90, 0, &sass),
        ]);
        assert_eq!(fat(&mixed), Ok(Plan::AsIs));
        // A compressed sm_90 entry beside a plain one: the plain executable one decides.
        let both = fatbin(&[(FATBIN_KIND_ELF, 90, 0x8000, &[7; 40]), (FATBIN_KIND_ELF, 90, 0, &sass)]);
        assert_eq!(fat(&both), Ok(Plan::AsIs));
        // An sm_90 entry holding an sm_80 cubin is corrupt.
        refused(fat(&fatbin(&[(FATBIN_KIND_ELF, 90, 0, &sm80)])), &["corrupt fatbin", "holds a cubin built for sm_80"]);
    }

    #[test]
    fn a_fatbin_without_sass_for_this_gpu_is_linked_from_its_ptx_or_lto_ir() {
        assert_eq!(fat(&fatbin(&[(FATBIN_KIND_PTX, 90, 0, b".version 9.0")])), Ok(LINK_FATBIN));
        assert_eq!(fat(&fatbin(&[(FATBIN_KIND_PTX, 80, 0x2000, &[1; 9])])), Ok(LINK_FATBIN));
        let lto = Plan::Link { input: InputType::Fatbin, lto: true };
        assert_eq!(fat(&fatbin(&[(FATBIN_KIND_IR, 90, 0, &[0xed, 0x43, 0x4e, 0x7f])])), Ok(lto));
        assert_eq!(fat(&fatbin(&[(FATBIN_KIND_IR, 90, 0x1_8000, &[0x79, 0x53, 0x4b, 0x8a])])), Ok(lto));
        // Relocatable SASS for this GPU (`-fatbin -dc`) is a link input too.
        let rel = elf(EM_CUDA, ET_REL, 8, 0x0600_5a04);
        assert_eq!(fat(&fatbin(&[(FATBIN_KIND_ELF, 90, 0, &rel)])), Ok(LINK_FATBIN));
        let sm80 = elf(EM_CUDA, ET_EXEC, 8, 0x0600_5004);
        assert_eq!(fat(&fatbin(&[(FATBIN_KIND_ELF, 80, 0, &sm80), (FATBIN_KIND_PTX, 80, 0, b"ptx")])), Ok(LINK_FATBIN));
    }

    /// nvcc 13 compresses `-fatbin -dc` SASS by default (and any SASS with `-compress-mode=size`):
    /// its ELF type cannot be read, so it is linked, and used as it is if the link has no code.
    #[test]
    fn compressed_sass_for_this_gpu_is_linked_else_used_as_it_is() {
        let zstd: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd, 0x60, 0xa8, 0x11, 0xd5];
        for flags in [0x2000, 0x8000] {
            assert_eq!(fat(&fatbin(&[(FATBIN_KIND_ELF, 90, flags, zstd)])), Ok(Plan::LinkOrAsIs { lto: false }));
        }
        let with_ptx = fatbin(&[(FATBIN_KIND_PTX, 90, 0x8000, zstd), (FATBIN_KIND_ELF, 90, 0x8000, zstd)]);
        assert_eq!(fat(&with_ptx), Ok(Plan::LinkOrAsIs { lto: false }));
        let with_ir = fatbin(&[(FATBIN_KIND_IR, 90, 0x1_8000, zstd), (FATBIN_KIND_ELF, 90, 0x8000, zstd)]);
        assert_eq!(fat(&with_ir), Ok(Plan::LinkOrAsIs { lto: true }));
        // Compressed SASS for another GPU is still nothing for this one.
        refused(fat(&fatbin(&[(FATBIN_KIND_ELF, 80, 0x8000, zstd)])), &["holds sm_80 SASS"]);
    }

    #[test]
    fn code_is_told_from_an_empty_link() {
        assert!(has_code(&cubin_sm90()));
        // The PROGBITS section of the synthetic cubin without SHF_EXECINSTR, then with no bytes.
        let mut b = cubin_sm90();
        b[160 + 8..160 + 16].copy_from_slice(&2u64.to_le_bytes());
        assert!(!has_code(&b));
        let mut b = cubin_sm90();
        b[160 + 32..160 + 40].copy_from_slice(&0u64.to_le_bytes());
        assert!(!has_code(&b));
        assert!(!has_code(&cubin_sm90()[..100]));
        assert!(!has_code(b"not an ELF"));
    }

    #[test]
    fn a_fatbin_that_fits_nothing_is_refused_naming_what_it_holds() {
        let sm80 = elf(EM_CUDA, ET_EXEC, 8, 0x0600_5004);
        refused(fat(&fatbin(&[(FATBIN_KIND_ELF, 80, 0, &sm80)])), &["holds sm_80 SASS", "nothing for this GPU, sm_90"]);
        let newer = fatbin(&[
            (FATBIN_KIND_ELF, 100, 0x2000, &[0; 16]),
            (FATBIN_KIND_PTX, 100, 0, b"p"),
            (FATBIN_KIND_IR, 120, 0, b"i"),
        ]);
        refused(fat(&newer), &["sm_100 SASS, compute_100 PTX, lto_120 LTO-IR", "sm_90"]);
        refused(fat(&fatbin(&[])), &["no entries"]);
    }

    #[test]
    fn every_truncation_of_a_fatbin_is_refused_as_such() {
        let sass = cubin_sm90();
        let image =
            fatbin(&[(FATBIN_KIND_PTX, 90, 0, b".version 9.0\n.target sm_90\n"), (FATBIN_KIND_ELF, 90, 0, &sass)]);
        assert_eq!(fat(&image), Ok(Plan::AsIs));
        for len in 0..image.len() {
            refused(fat(&image[..len]), &["truncated or corrupt fatbin"]);
        }
        // The fatbin's own sizes intact but the cubin inside cut short.
        let cut = fatbin(&[(FATBIN_KIND_ELF, 90, 0, &sass[..sass.len() - 8])]);
        refused(fat(&cut), &["fatbin entry 0", "truncated or corrupt ELF"]);
        // Sizes that overflow.
        let mut huge = image.clone();
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        refused(fat(&huge), &["do not fit"]);
        let mut huge = image.clone();
        huge[16 + 8..16 + 16].copy_from_slice(&(u64::MAX - 8).to_le_bytes());
        refused(fat(&huge), &["entry 0"]);
        let mut tiny = image;
        tiny[16 + 4..16 + 8].copy_from_slice(&0u32.to_le_bytes()); // an entry header of 0 bytes
        refused(fat(&tiny), &["entry 0"]);
    }

    /// Corrupts bytes of each synthetic image at random (a fixed xorshift, so a failure repeats):
    /// every outcome is a plan or a refusal, never a panic.
    #[test]
    fn corrupt_images_never_panic() {
        let sass = cubin_sm90();
        let images = [
            sass.clone(),
            elf(62, ET_REL, 0, 0),
            fatbin(&[(FATBIN_KIND_ELF, 90, 0, &sass), (FATBIN_KIND_PTX, 80, 0, b".version")]),
        ];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for image in &images {
            for _ in 0..20_000 {
                let mut b = image.clone();
                for _ in 0..1 + next() % 4 {
                    #[allow(clippy::cast_possible_truncation, reason = "less than b.len()")]
                    let at = (next() % b.len() as u64) as usize;
                    b[at] = next().to_le_bytes()[0];
                }
                #[allow(clippy::cast_possible_truncation, reason = "less than b.len()")]
                let len = if next() % 4 == 0 { (next() % b.len() as u64) as usize } else { b.len() };
                for kind in [ImageKind::Cubin, ImageKind::Fatbin] {
                    let _ = plan("sm_90", kind, &b[..len]);
                }
                let _ = has_code(&b[..len]);
            }
        }
    }
}
