//! Whether a linked cubin defines the entry `mesh_main`, read from its ELF symbol table without a context.
//!
//! MPS mode checks this before it takes a worker from the pool, so that an image without the entry
//! is refused for that reason, not for an empty pool (the worker's `cuModuleGetFunction` stays the
//! final word for what this cannot read, such as a fatbin used as it is).

/// What a linked image says about a function of its symbol table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// An ELF file whose symbol table defines the function.
    Defined,
    /// An ELF file whose symbol tables do not define it.
    Missing,
    /// Not an ELF file (a fatbin used as it is): only the driver can tell.
    Unknown,
}

/// Looks `name` up as a function (`STT_FUNC`) in the symbol tables of ELF `b`, bounds-checked throughout.
pub fn function(b: &[u8], name: &str) -> Entry {
    if !b.starts_with(b"\x7fELF") || b.get(4) != Some(&2) {
        return Entry::Unknown;
    }
    let u16_at = |at: usize| Some(u16::from_le_bytes(b.get(at..at.checked_add(2)?)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(b.get(at..at.checked_add(4)?)?.try_into().ok()?));
    let u64_at = |at: usize| Some(u64::from_le_bytes(b.get(at..at.checked_add(8)?)?.try_into().ok()?));
    let size = |at: usize| u64_at(at).and_then(|v| usize::try_from(v).ok());
    // (type, offset, size, link, entry size) of section `i`.
    let section = |i: usize| -> Option<(u32, usize, usize, usize, usize)> {
        let at = size(40)?.checked_add(i.checked_mul(usize::from(u16_at(58)?))?)?;
        Some((
            u32_at(at.checked_add(4)?)?,
            size(at.checked_add(24)?)?,
            size(at.checked_add(32)?)?,
            usize::try_from(u32_at(at.checked_add(40)?)?).ok()?,
            size(at.checked_add(56)?)?,
        ))
    };
    const SHT_SYMTAB: u32 = 2;
    const STT_FUNC: u8 = 2;
    let shnum = usize::from(u16_at(60).unwrap_or(0));
    let defined = (0..shnum).filter_map(section).filter(|s| s.0 == SHT_SYMTAB).any(|(_, off, len, link, entsize)| {
        let Some((_, str_off, str_len, _, _)) = section(link) else { return false };
        let Some(strtab) = b.get(str_off..str_off.saturating_add(str_len)) else { return false };
        let Some(symtab) = b.get(off..off.saturating_add(len)) else { return false };
        symtab.chunks_exact(entsize.max(24)).any(|sym| {
            let st_name = usize::try_from(u32::from_le_bytes([sym[0], sym[1], sym[2], sym[3]])).unwrap_or(usize::MAX);
            let named = strtab.get(st_name..).and_then(|s| s.split(|&c| c == 0).next()) == Some(name.as_bytes());
            sym[4] & 0xf == STT_FUNC && named
        })
    });
    if defined { Entry::Defined } else { Entry::Missing }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_elf_is_unknown_and_garbage_elf_is_missing_without_panicking() {
        assert_eq!(function(b"not an elf", "mesh_main"), Entry::Unknown);
        let mut elf = b"\x7fELF\x02\x01\x01".to_vec();
        elf.resize(64, 0xff);
        assert_eq!(function(&elf, "mesh_main"), Entry::Missing);
        for cut in 0..elf.len() {
            let _ = function(&elf[..cut], "mesh_main");
        }
    }
}
