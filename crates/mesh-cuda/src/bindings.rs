//! The bindings a program declares (`MESH_BINDINGS(...)` in mesh/core.cuh), read from its linked cubin's ELF symbol table, and compared with the channels a load binds.
//!
//! The header's macro defines `extern "C" __device__ const uint32_t mesh_bindings[]`: the word
//! [`TABLE_MAGIC`], then one protocol code per binding. Its bytes are the symbol's initial value in
//! the cubin (a `PROGBITS` section, `.nv.global.init` or `.nv.constant*`), so both modes read it on
//! the CPU, before any GPU work and before anything changes: a program bound to a channel of another
//! protocol is refused naming the binding, instead of loading to find `msg_size` 0. An image without
//! the symbol, or one that is not an ELF file (a fatbin used as it is), is not checked.

use mesh_shm::Protocol;

/// The symbol the header's `MESH_BINDINGS` defines.
pub const TABLE_SYMBOL: &str = "mesh_bindings";

/// Word 0 of the table (mesh/core.cuh's `MESH_DETAIL_BINDINGS_MAGIC`): "MB" and the table's version, 1.
pub const TABLE_MAGIC: u32 = 0x4d42_0001;

/// Reads the protocol codes `cubin` declares, one per binding: `Ok(None)` when it declares none (no
/// `mesh_bindings` symbol, or not an ELF file), `Err` with the reason when the symbol is there but
/// is not a table the header writes.
pub fn declared(cubin: &[u8]) -> Result<Option<Vec<u32>>, String> {
    let Some(bytes) = symbol_bytes(cubin, TABLE_SYMBOL)? else { return Ok(None) };
    if bytes.len() < 4 || !bytes.len().is_multiple_of(4) {
        return Err(format!("{TABLE_SYMBOL} is {} bytes, not a table of 32-bit words", bytes.len()));
    }
    let words: Vec<u32> = bytes.chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect();
    if words[0] != TABLE_MAGIC {
        return Err(format!(
            "{TABLE_SYMBOL} starts with {:#010x}, not {TABLE_MAGIC:#010x}: declare it with mesh.cuh's MESH_BINDINGS",
            words[0]
        ));
    }
    Ok(Some(words[1..].to_vec()))
}

/// A protocol's name in a refusal ("an LL channel").
fn described(p: Protocol) -> &'static str {
    match p {
        Protocol::Ll => "an LL channel",
        Protocol::Bulk => "a bulk channel",
        Protocol::Index => "an index channel",
        Protocol::FanIn => "a fan-in channel",
        Protocol::Group => "a channel group",
    }
}

/// A declared code's name in a refusal.
fn expected(code: u32) -> String {
    Protocol::from_code(code).map_or_else(|| format!("a channel of protocol code {code}"), |p| described(p).to_string())
}

/// Compares the declared codes with the `bound` channels (name and protocol, in `--bind` order):
/// `Err` names the first binding that cannot work.
pub fn check(declared: &[u32], bound: &[(String, Protocol)]) -> Result<(), String> {
    for (i, &code) in declared.iter().enumerate() {
        let Some((name, protocol)) = bound.get(i) else {
            return Err(format!(
                "binding {i}: the program expects {}, and the load binds {} channel{} (--bind)",
                expected(code),
                bound.len(),
                if bound.len() == 1 { "" } else { "s" }
            ));
        };
        if protocol.code() != code {
            return Err(format!(
                "binding {i} (`{name}`): the program expects {}, `{name}` is {}",
                expected(code),
                described(*protocol)
            ));
        }
    }
    Ok(())
}

/// The initial bytes of object `name` in ELF `b`: `Ok(None)` when `b` is not an ELF file or defines no
/// such symbol; bounds-checked throughout.
fn symbol_bytes(b: &[u8], name: &str) -> Result<Option<Vec<u8>>, String> {
    if !b.starts_with(b"\x7fELF") || b.get(4) != Some(&2) {
        return Ok(None);
    }
    let u16_at = |at: usize| Some(u16::from_le_bytes(b.get(at..at.checked_add(2)?)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(b.get(at..at.checked_add(4)?)?.try_into().ok()?));
    let u64_at = |at: usize| Some(u64::from_le_bytes(b.get(at..at.checked_add(8)?)?.try_into().ok()?));
    let size = |at: usize| u64_at(at).and_then(|v| usize::try_from(v).ok());
    // (type, address, offset, size, link, entry size) of section `i`.
    let section = |i: usize| -> Option<(u32, usize, usize, usize, usize, usize)> {
        let at = size(40)?.checked_add(i.checked_mul(usize::from(u16_at(58)?))?)?;
        Some((
            u32_at(at.checked_add(4)?)?,
            size(at.checked_add(16)?)?,
            size(at.checked_add(24)?)?,
            size(at.checked_add(32)?)?,
            usize::try_from(u32_at(at.checked_add(40)?)?).ok()?,
            size(at.checked_add(56)?)?,
        ))
    };
    const SHT_PROGBITS: u32 = 1;
    const SHT_SYMTAB: u32 = 2;
    const SHT_NOBITS: u32 = 8;
    const STT_OBJECT: u8 = 1;
    let shnum = usize::from(u16_at(60).unwrap_or(0));
    for (_, _, off, len, link, entsize) in (0..shnum).filter_map(section).filter(|s| s.0 == SHT_SYMTAB) {
        let Some((_, _, str_off, str_len, _, _)) = section(link) else { continue };
        let Some(strtab) = b.get(str_off..str_off.saturating_add(str_len)) else { continue };
        let Some(symtab) = b.get(off..off.saturating_add(len)) else { continue };
        for sym in symtab.chunks_exact(entsize.max(24)) {
            let st_name = usize::try_from(u32::from_le_bytes([sym[0], sym[1], sym[2], sym[3]])).unwrap_or(usize::MAX);
            let named = strtab.get(st_name..).and_then(|s| s.split(|&c| c == 0).next()) == Some(name.as_bytes());
            if !named || sym[4] & 0xf != STT_OBJECT {
                continue;
            }
            let shndx = usize::from(u16::from_le_bytes([sym[6], sym[7]]));
            let value = u64::from_le_bytes(sym[8..16].try_into().expect("8 bytes"));
            let sym_size = u64::from_le_bytes(sym[16..24].try_into().expect("8 bytes"));
            let Some((kind, addr, sec_off, sec_len, _, _)) = section(shndx) else {
                return Err(format!("{name} lies in section {shndx}, which the file does not have"));
            };
            if kind == SHT_NOBITS {
                return Err(format!("{name} has no initial value (zero-filled section {shndx})"));
            }
            if kind != SHT_PROGBITS {
                return Err(format!("{name} lies in section {shndx} of type {kind}, not a data section"));
            }
            // A cubin's symbols hold offsets into their section (its address is 0); an address
            // relative to the section's is read the same way.
            let at = usize::try_from(value).ok().map(|v| v.checked_sub(addr).unwrap_or(v));
            let len = usize::try_from(sym_size).ok();
            let bytes = at.zip(len).and_then(|(at, len)| {
                (at.checked_add(len)? <= sec_len).then_some(())?;
                b.get(sec_off.checked_add(at)?..sec_off.checked_add(at)?.checked_add(len)?)
            });
            return match bytes {
                Some(bytes) => Ok(Some(bytes.to_vec())),
                None => Err(format!("{name} ({sym_size} bytes at {value}) runs past its section {shndx}")),
            };
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal 64-bit ELF file with a data section `.nv.global.init` holding `data` at offset
    /// `pad`, a symbol table with one object `symbol` of `size` bytes at `value` in section `shndx`
    /// of type `data_type`: what a linked cubin holds, as far as the table goes.
    fn elf(symbol: &str, data: &[u8], value: u64, size: u64, data_type: u32, st_info: u8) -> Vec<u8> {
        let mut strtab = vec![0u8];
        strtab.extend_from_slice(symbol.as_bytes());
        strtab.push(0);
        let mut sym = vec![0u8; 24]; // the null symbol
        let mut s = Vec::new();
        s.extend_from_slice(&1u32.to_le_bytes()); // st_name
        s.push(st_info);
        s.push(0);
        s.extend_from_slice(&1u16.to_le_bytes()); // st_shndx: the data section
        s.extend_from_slice(&value.to_le_bytes());
        s.extend_from_slice(&size.to_le_bytes());
        sym.extend_from_slice(&s);
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2; // 64-bit
        b[5] = 1; // little-endian
        let data_off = b.len();
        b.extend_from_slice(data);
        let str_off = b.len();
        b.extend_from_slice(&strtab);
        let sym_off = b.len();
        b.extend_from_slice(&sym);
        let shoff = b.len();
        // Sections: null, data, symtab (link 3), strtab.
        let header = |kind: u32, off: usize, len: usize, link: u32, entsize: u64| {
            let mut h = vec![0u8; 64];
            h[4..8].copy_from_slice(&kind.to_le_bytes());
            h[24..32].copy_from_slice(&(off as u64).to_le_bytes());
            h[32..40].copy_from_slice(&(len as u64).to_le_bytes());
            h[40..44].copy_from_slice(&link.to_le_bytes());
            h[56..64].copy_from_slice(&entsize.to_le_bytes());
            h
        };
        let headers = [
            header(0, 0, 0, 0, 0),
            header(data_type, data_off, data.len(), 0, 0),
            header(2, sym_off, sym.len(), 3, 24),
            header(3, str_off, strtab.len(), 0, 0),
        ];
        for h in headers {
            b.extend_from_slice(&h);
        }
        b[40..48].copy_from_slice(&(shoff as u64).to_le_bytes());
        b[58..60].copy_from_slice(&64u16.to_le_bytes());
        b[60..62].copy_from_slice(&4u16.to_le_bytes());
        b
    }

    fn table(words: &[u32]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    const OBJECT: u8 = 0x11; // STB_GLOBAL, STT_OBJECT

    #[test]
    fn a_declared_table_is_read_from_its_section_at_its_offset() {
        let mut data = vec![0xaau8; 8]; // another object first
        data.extend(table(&[TABLE_MAGIC, 0, 1, 3, 4]));
        let b = elf(TABLE_SYMBOL, &data, 8, 20, 1, OBJECT);
        assert_eq!(declared(&b), Ok(Some(vec![0, 1, 3, 4])));
    }

    #[test]
    fn no_symbol_or_no_elf_is_no_table() {
        let b = elf("other", &table(&[TABLE_MAGIC, 0]), 0, 8, 1, OBJECT);
        assert_eq!(declared(&b), Ok(None));
        assert_eq!(declared(b"\x50\xed\x55\xba fatbin"), Ok(None));
        assert_eq!(declared(b""), Ok(None));
        // A function of that name is not the table.
        let f = elf(TABLE_SYMBOL, &table(&[TABLE_MAGIC, 0]), 0, 8, 1, 0x12);
        assert_eq!(declared(&f), Ok(None));
    }

    #[test]
    fn a_table_the_header_did_not_write_is_refused_with_the_reason() {
        let wrong_magic = elf(TABLE_SYMBOL, &table(&[7, 0]), 0, 8, 1, OBJECT);
        assert!(declared(&wrong_magic).unwrap_err().contains("MESH_BINDINGS"));
        let odd = elf(TABLE_SYMBOL, &[1, 2, 3, 4, 5, 6], 0, 6, 1, OBJECT);
        assert!(declared(&odd).unwrap_err().contains("6 bytes"));
        let past = elf(TABLE_SYMBOL, &table(&[TABLE_MAGIC, 0]), 4, 8, 1, OBJECT);
        assert!(declared(&past).unwrap_err().contains("runs past"));
        let zeroed = elf(TABLE_SYMBOL, &table(&[TABLE_MAGIC, 0]), 0, 8, 8, OBJECT);
        assert!(declared(&zeroed).unwrap_err().contains("no initial value"));
    }

    #[test]
    fn truncated_files_never_panic() {
        let b = elf(TABLE_SYMBOL, &table(&[TABLE_MAGIC, 1]), 0, 8, 1, OBJECT);
        for n in 0..b.len() {
            let _ = declared(&b[..n]);
        }
        let mut flipped = b.clone();
        for i in 0..flipped.len() {
            flipped[i] ^= 0xff;
            let _ = declared(&flipped);
            flipped[i] ^= 0xff;
        }
    }

    fn bound(list: &[(&str, Protocol)]) -> Vec<(String, Protocol)> {
        list.iter().map(|(n, p)| (n.to_string(), *p)).collect()
    }

    #[test]
    fn a_binding_of_another_protocol_is_refused_naming_it() {
        let b = bound(&[("req", Protocol::Ll), ("big", Protocol::Ll)]);
        assert_eq!(
            check(&[Protocol::Ll.code(), Protocol::Bulk.code()], &b),
            Err("binding 1 (`big`): the program expects a bulk channel, `big` is an LL channel".into())
        );
        let svc = bound(&[("svc", Protocol::FanIn), ("svc", Protocol::FanIn)]);
        assert_eq!(
            check(&[Protocol::FanIn.code(), Protocol::Group.code()], &svc),
            Err("binding 1 (`svc`): the program expects a channel group, `svc` is a fan-in channel".into())
        );
    }

    #[test]
    fn matching_or_undeclared_bindings_pass_and_missing_ones_are_refused() {
        let b = bound(&[("svc", Protocol::FanIn), ("svc.replies", Protocol::Group), ("extra", Protocol::Bulk)]);
        assert_eq!(check(&[Protocol::FanIn.code(), Protocol::Group.code()], &b), Ok(()));
        assert_eq!(check(&[], &b), Ok(()));
        let err = check(&[Protocol::Ll.code(), Protocol::Ll.code()], &bound(&[("a", Protocol::Ll)])).unwrap_err();
        assert_eq!(err, "binding 1: the program expects an LL channel, and the load binds 1 channel (--bind)");
        assert!(check(&[9], &bound(&[("a", Protocol::Ll)])).unwrap_err().contains("protocol code 9"));
    }

    /// The header's macro writes the magic this module reads.
    #[test]
    fn the_header_declares_the_same_magic() {
        // The header as mesh-shm ships it (also inside a packaged crate, where no repository is around).
        let (_, text) = mesh_shm::device_header::PARTS
            .iter()
            .find(|(name, _)| *name == "mesh/core.cuh")
            .expect("mesh-shm ships mesh/core.cuh");
        let line = format!("#define MESH_DETAIL_BINDINGS_MAGIC {TABLE_MAGIC:#010x}u");
        assert!(text.contains(&line), "mesh/core.cuh lacks `{line}`");
        assert!(text.contains(&format!("uint32_t {TABLE_SYMBOL}[]")), "mesh/core.cuh does not define {TABLE_SYMBOL}");
    }
}
