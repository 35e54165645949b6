//! Each real image of heartbeat.cu (tests/images/) through the JIT and the real libnvJitLink, for sm_90, with no GPU: nvJitLink needs none.
//!
//! Skipped, with a `SKIPPED` line saying why, when libnvJitLink cannot be found. To run it, point
//! the loader at the library: `MESH_NVJITLINK=/path/to/libnvJitLink.so.13` (a file) or
//! `CUDA_HOME=/path/to/cuda` (holding `lib64/`, `lib/` or `targets/x86_64-linux/lib/`), e.g. for
//! NVIDIA's pip wheel `CUDA_HOME=.../site-packages/nvidia/cu13 cargo test -p mesh-cuda --test jit_nvjitlink`.

use std::path::PathBuf;

use mesh_cuda::image::{Plan, has_code, plan};
use mesh_cuda::{BackendError, ImageKind, Jit};
use nvjitlink_sys::NvJitLink;

const TEST: &str = "every_real_form_links_or_is_used_as_it_is_or_is_refused";

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/images").join(name);
    std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (tests/images/README.md says how to build it)", path.display()))
}

/// Whether ELF `b` has a symbol table holding a function named `name` (bounds-checked throughout).
fn has_function(b: &[u8], name: &str) -> bool {
    let u32_at = |at: usize| Some(u32::from_le_bytes(b.get(at..at.checked_add(4)?)?.try_into().ok()?));
    let u64_at = |at: usize| Some(u64::from_le_bytes(b.get(at..at.checked_add(8)?)?.try_into().ok()?));
    let u16_at = |at: usize| Some(u16::from_le_bytes(b.get(at..at.checked_add(2)?)?.try_into().ok()?));
    let section = |i: usize| -> Option<(u32, usize, usize, usize, usize)> {
        let at = usize::try_from(u64_at(40)?).ok()?.checked_add(i.checked_mul(usize::from(u16_at(58)?))?)?;
        let size = |off| u64_at(at + off).and_then(|v| usize::try_from(v).ok());
        Some((u32_at(at + 4)?, size(24)?, size(32)?, usize::try_from(u32_at(at + 40)?).ok()?, size(56)?))
    };
    let shnum = usize::from(u16_at(60).unwrap_or(0));
    (0..shnum).filter_map(section).filter(|s| s.0 == 2).any(|(_, off, size, link, entsize)| {
        let Some((_, str_off, str_size, _, _)) = section(link) else { return false };
        let Some(strtab) = b.get(str_off..str_off.saturating_add(str_size)) else { return false };
        let Some(symtab) = b.get(off..off.saturating_add(size)) else { return false };
        symtab.chunks_exact(entsize.max(24)).any(|sym| {
            let st_name = u32::from_le_bytes([sym[0], sym[1], sym[2], sym[3]]) as usize;
            let is_func = sym[4] & 0xf == 2;
            let named = strtab.get(st_name..).and_then(|s| s.split(|&c| c == 0).next()) == Some(name.as_bytes());
            is_func && named
        })
    })
}

/// An sm_90 executable cubin with code and a function `mesh_main`.
fn assert_sm90_executable_with_mesh_main(form: &str, cubin: &[u8]) {
    assert_eq!(plan("sm_90", ImageKind::Cubin, cubin), Ok(Plan::AsIs), "{form}: not an sm_90 executable cubin");
    assert!(has_code(cubin), "{form}: no code");
    assert!(has_function(cubin, "mesh_main"), "{form}: no function mesh_main");
}

#[test]
fn every_real_form_links_or_is_used_as_it_is_or_is_refused() {
    if let Err(e) = NvJitLink::get() {
        eprintln!(
            "SKIPPED {TEST}: no libnvJitLink to link with: {e}; run it with MESH_NVJITLINK=/path/to/libnvJitLink.so.13 \
             or CUDA_HOME=/path/to/cuda set"
        );
        return;
    }
    let jit = Jit::start("sm_90").expect("the JIT starts (its warm-up links PTX through nvJitLink)");
    let lib = NvJitLink::get().expect("loaded above");
    eprintln!("libnvJitLink {}.{} from {}", lib.version.0, lib.version.1, lib.path);

    // Linked by nvJitLink into an sm_90 executable cubin holding mesh_main.
    for (file, kind) in [
        ("heartbeat.dc.sm_90.cubin", ImageKind::Cubin),
        ("heartbeat.compute_90.fatbin", ImageKind::Fatbin),
        ("heartbeat.lto_90.fatbin", ImageKind::Fatbin),
        ("heartbeat.dc.sm_90.fatbin", ImageKind::Fatbin),
    ] {
        let linked = jit.link(file, fixture(file), kind).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(!linked.as_is, "{file}: used as it is, not linked");
        assert_sm90_executable_with_mesh_main(file, &linked.cubin);
        eprintln!("{file}: linked in {:?} to {} bytes", linked.link_time, linked.cubin.len());
    }

    // Used as they are: the bytes loaded are the file's.
    for (file, kind) in [
        ("heartbeat.sm_90.cubin", ImageKind::Cubin),
        ("heartbeat.sm_90.fatbin", ImageKind::Fatbin),
        ("heartbeat.sm_90.size.fatbin", ImageKind::Fatbin),
    ] {
        let bytes = fixture(file);
        let linked = jit.link(file, bytes.clone(), kind).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(linked.as_is, "{file}: linked ({} bytes), not used as it is", linked.cubin.len());
        assert_eq!(*linked.cubin, bytes, "{file}");
        eprintln!("{file}: used as it is ({})", if linked.info_log.is_empty() { "-" } else { &linked.info_log });
    }
    assert_sm90_executable_with_mesh_main("heartbeat.sm_90.cubin", &fixture("heartbeat.sm_90.cubin"));
    // The compressed executable SASS went through nvJitLink first, whose link held no code.
    let size = jit.link("size", fixture("heartbeat.sm_90.size.fatbin"), ImageKind::Fatbin).expect("cached");
    assert!(size.cached && size.info_log.contains("held no code"), "{size:?}");

    // What nvJitLink makes of an executable cubin, the reason those are not linked: no code.
    let exec = fixture("heartbeat.sm_90.cubin");
    let direct = mesh_cuda::jit::link("sm_90", "exec", &exec, ImageKind::Cubin).expect("as is");
    assert!(direct.as_is);
    // SAFETY: the handle is used on this thread only and destroyed before the block ends.
    let empty = unsafe {
        let h = lib.create(&[c"-arch=sm_90"]).expect("create");
        let out = lib
            .add_data(h, nvjitlink_sys::InputType::Cubin, &exec, c"exec")
            .and_then(|()| lib.complete(h))
            .and_then(|()| lib.linked_cubin(h));
        let _ = lib.destroy(h);
        out.expect("nvJitLink takes an executable cubin")
    };
    assert!(!has_code(&empty) && !has_function(&empty, "mesh_main"), "an executable cubin linked to code");

    // Refused before nvJitLink, with the reason.
    for (file, words) in [
        ("heartbeat.sm_80.cubin", &["built for sm_80", "this GPU is sm_90"][..]),
        ("heartbeat.host.o", &["a host object", "not a GPU image"][..]),
        ("heartbeat.sm_90.truncated.cubin", &["truncated or corrupt ELF"][..]),
    ] {
        match jit.link(file, fixture(file), ImageKind::Cubin) {
            Err(e @ BackendError::Image { .. }) => {
                let text = e.to_string();
                assert!(words.iter().all(|w| text.contains(w)), "{file}: {text}");
            }
            other => panic!("{file}: {other:?}"),
        }
    }
    assert_eq!(jit.cache_len(), 7, "the seven images used or linked, the size fatbin once (the warm-up is not cached)");
}
