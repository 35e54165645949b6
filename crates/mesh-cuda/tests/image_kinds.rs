//! What `mesh_cuda::image` decides for each real image nvcc makes of heartbeat.cu (tests/images/, built by CUDA 13.0), with no GPU and no CUDA library.

use std::path::PathBuf;

use mesh_cuda::ImageKind;
use mesh_cuda::image::{Plan, has_code, plan};
use nvjitlink_sys::InputType;

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/images").join(name);
    std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (tests/images/README.md says how to build it)", path.display()))
}

/// The file's kind as `ProgramSpec` detects it, and the plan for an sm_90 GPU.
fn classify(name: &str) -> (ImageKind, Result<Plan, String>) {
    let bytes = fixture(name);
    let kind = ImageKind::detect(&bytes).unwrap_or_else(|| panic!("{name}: not recognised as an image"));
    (kind, plan("sm_90", kind, &bytes).map_err(|e| e.to_string()))
}

fn refused(name: &str, arch: &str, words: &[&str]) {
    let bytes = fixture(name);
    let kind = ImageKind::detect(&bytes).unwrap_or_else(|| panic!("{name}: not recognised"));
    let why = plan(arch, kind, &bytes).expect_err(name).to_string();
    for w in words {
        assert!(why.contains(w), "{name} on {arch}: {why:?} lacks {w:?}");
    }
}

const FORMS: &[&str] = &[
    "heartbeat.sm_90.cubin",
    "heartbeat.sm_80.cubin",
    "heartbeat.dc.sm_90.cubin",
    "heartbeat.sm_90.fatbin",
    "heartbeat.compute_90.fatbin",
    "heartbeat.lto_90.fatbin",
    "heartbeat.dc.sm_90.fatbin",
    "heartbeat.sm_90.size.fatbin",
    "heartbeat.host.o",
    "heartbeat.sm_90.truncated.cubin",
];

#[test]
fn each_real_form_gets_its_plan_on_sm_90() {
    let link = |input, lto| Ok(Plan::Link { input, lto });
    let expected: [(&str, ImageKind, Result<Plan, String>); 8] = [
        ("heartbeat.sm_90.cubin", ImageKind::Cubin, Ok(Plan::AsIs)),
        ("heartbeat.dc.sm_90.cubin", ImageKind::Cubin, link(InputType::Cubin, false)),
        ("heartbeat.sm_90.fatbin", ImageKind::Fatbin, Ok(Plan::AsIs)),
        ("heartbeat.compute_90.fatbin", ImageKind::Fatbin, link(InputType::Fatbin, false)),
        ("heartbeat.lto_90.fatbin", ImageKind::Fatbin, link(InputType::Fatbin, true)),
        // Compressed SASS (the -dc one by default, the other by -compress-mode=size): its ELF type
        // cannot be read without decompressing it.
        ("heartbeat.dc.sm_90.fatbin", ImageKind::Fatbin, Ok(Plan::LinkOrAsIs { lto: false })),
        ("heartbeat.sm_90.size.fatbin", ImageKind::Fatbin, Ok(Plan::LinkOrAsIs { lto: false })),
        // A host object is ELF, so detected as a cubin; the plan refuses it (below).
        ("heartbeat.host.o", ImageKind::Cubin, Err(String::new())),
    ];
    for (name, kind, want) in expected {
        let (got_kind, got) = classify(name);
        assert_eq!(got_kind, kind, "{name}");
        match want {
            Ok(p) => assert_eq!(got, Ok(p), "{name}"),
            Err(_) => assert!(got.is_err(), "{name}: {got:?}"),
        }
    }
}

#[test]
fn the_real_refusals_give_their_reasons() {
    refused("heartbeat.sm_80.cubin", "sm_90", &["the cubin is built for sm_80", "this GPU is sm_90", "-arch=sm_90"]);
    refused(
        "heartbeat.host.o",
        "sm_90",
        &["a host object", "x86-64 ELF, e_machine 62", "not a GPU image", "nvcc -cubin -arch=sm_XY", "-fatbin"],
    );
    refused(
        "heartbeat.sm_90.truncated.cubin",
        "sm_90",
        &["truncated or corrupt ELF (2368 bytes)", "program headers of 56 bytes at 4456 do not fit in the file"],
    );
}

#[test]
fn the_plans_follow_the_device() {
    // On an sm_80 GPU the sm_80 cubin is the one used as it is.
    assert_eq!(plan("sm_80", ImageKind::Cubin, &fixture("heartbeat.sm_80.cubin")), Ok(Plan::AsIs));
    refused("heartbeat.sm_90.cubin", "sm_80", &["built for sm_90", "this GPU is sm_80"]);
    refused("heartbeat.sm_90.fatbin", "sm_80", &["the fatbin holds sm_90 SASS", "nothing for this GPU, sm_80"]);
    refused("heartbeat.compute_90.fatbin", "sm_80", &["holds compute_90 PTX", "sm_80"]);
    refused("heartbeat.lto_90.fatbin", "sm_80", &["holds lto_90 LTO-IR", "sm_80"]);
    refused("heartbeat.dc.sm_90.fatbin", "sm_80", &["holds sm_90 SASS"]);
    // compute_90 PTX runs forward on newer GPUs; sm_90 SASS does not.
    let ptx = plan("sm_100", ImageKind::Fatbin, &fixture("heartbeat.compute_90.fatbin"));
    assert_eq!(ptx, Ok(Plan::Link { input: InputType::Fatbin, lto: false }));
    refused("heartbeat.sm_90.fatbin", "sm_100", &["holds sm_90 SASS", "sm_100"]);
}

/// The header bytes image.rs reads, as CUDA 13.0 writes them (see its module documentation).
#[test]
fn the_real_headers_hold_what_image_rs_reads() {
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    for (name, e_type, flags) in [
        ("heartbeat.sm_90.cubin", 2, 0x0600_5a04),
        ("heartbeat.sm_80.cubin", 2, 0x0600_5004),
        ("heartbeat.dc.sm_90.cubin", 1, 0x0600_5a04),
    ] {
        let b = fixture(name);
        assert_eq!(&b[..9], b"\x7fELF\x02\x01\x01\x41\x08", "{name}: ELF64 LE, OSABI 0x41, ABI version 8");
        assert_eq!((u16_at(&b, 16), u16_at(&b, 18), u32_at(&b, 48)), (e_type, 190, flags), "{name}");
    }
    let truncated = fixture("heartbeat.sm_90.truncated.cubin");
    let whole = fixture("heartbeat.sm_90.cubin");
    assert_eq!(truncated[..], whole[..whole.len() / 2]);
    assert_eq!(&fixture("heartbeat.host.o")[16..20], &[1, 0, 62, 0], "ET_REL, EM_X86_64");
    // (file, [(kind, header size, arch, flags)]): each fatbin holds one entry.
    for (name, kind, head, flags) in [
        ("heartbeat.sm_90.fatbin", 2, 64, 0x11),
        ("heartbeat.compute_90.fatbin", 1, 80, 0x8011),
        ("heartbeat.lto_90.fatbin", 8, 120, 0x1_8011),
        ("heartbeat.dc.sm_90.fatbin", 2, 64, 0x8011),
        ("heartbeat.sm_90.size.fatbin", 2, 64, 0x8011),
    ] {
        let b = fixture(name);
        assert_eq!((u32_at(&b, 0), u16_at(&b, 4), u16_at(&b, 6)), (0xBA55_ED50, 1, 16), "{name}");
        assert_eq!(u64_at(&b, 8), b.len() as u64 - 16, "{name}: one container");
        let e = 16;
        assert_eq!((u16_at(&b, e), u32_at(&b, e + 4), u32_at(&b, e + 28)), (kind, head, 90), "{name}");
        assert_eq!(u64_at(&b, e + 8), b.len() as u64 - 16 - u64::from(head), "{name}: one entry");
        assert_eq!(u64_at(&b, e + 40), flags, "{name}");
        let payload = &b[e + head as usize..];
        if flags & 0x8000 != 0 && kind != 8 {
            assert_eq!(&payload[..4], &[0x28, 0xb5, 0x2f, 0xfd], "{name}: a zstd frame");
        }
    }
    // The plain SASS entry is the sm_90 cubin itself.
    assert_eq!(fixture("heartbeat.sm_90.fatbin")[80..], whole[..]);
    assert!(has_code(&whole) && has_code(&fixture("heartbeat.dc.sm_90.cubin")));
}

/// Every strict prefix of every real image is refused (truncated, or for the host object what it
/// is), and none panics.
#[test]
fn every_truncation_of_every_real_image_is_refused() {
    for name in FORMS {
        let bytes = fixture(name);
        let kind = ImageKind::detect(&bytes).unwrap_or_else(|| panic!("{name}"));
        for len in 0..bytes.len() {
            let got = plan("sm_90", kind, &bytes[..len]);
            assert!(got.is_err(), "{name} cut to {len} bytes: {got:?}");
        }
    }
}

/// Writes `value`'s low `width` bytes at `at` (wrapped into the image), little-endian, as a corrupt
/// header field would hold them.
fn overwrite(bytes: &mut [u8], at: usize, width: usize, value: u64) {
    let n = bytes.len();
    for (i, b) in value.to_le_bytes().iter().take(width).enumerate() {
        bytes[(at + i) % n] = *b;
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 2000, ..Default::default() })]

    /// A real image with header fields overwritten (random spots, field widths of 1 to 8 bytes,
    /// extreme values: 0, all ones, just past the image's size, 2^31 and 2^63) is detected, planned
    /// and searched for code without a panic or a read past its end; what it was planned as is
    /// whatever the corrupt headers say, so only the absence of a panic is asserted, and a refusal
    /// must say why.
    #[test]
    fn corrupt_real_images_never_panic(
        form in proptest::sample::select(FORMS),
        edits in proptest::collection::vec(
            (proptest::prelude::any::<usize>(), proptest::sample::select(&[1usize, 2, 4, 8][..]),
             proptest::prop_oneof![
                 proptest::prelude::Just(0u64),
                 proptest::prelude::Just(u64::MAX),
                 proptest::prelude::Just(1u64 << 31),
                 proptest::prelude::Just(1u64 << 63),
                 0u64..4096,
                 proptest::prelude::any::<u64>(),
             ]),
            1..6,
        ),
        early in proptest::prelude::any::<bool>(),
        arch in proptest::sample::select(&["sm_90", "sm_80", "sm_100", "sm_7", ""][..]),
    ) {
        let mut bytes = fixture(form);
        let len = bytes.len();
        for (at, width, value) in edits {
            // Half the runs aim at the headers (the first 256 bytes: ELF and fatbin headers, the
            // first entries), half anywhere.
            let at = if early { at % 256.min(len) } else { at % len };
            let value = if value < 4096 { (len as u64 + value).saturating_sub(2048) } else { value };
            overwrite(&mut bytes, at, width, value);
        }
        let _ = has_code(&bytes);
        if let Some(kind) = ImageKind::detect(&bytes)
            && let Err(e) = plan(arch, kind, &bytes)
        {
            proptest::prop_assert!(!e.to_string().is_empty());
        }
    }

    /// Any bytes behind a real image's first 16 (its magic and the start of its header) are planned
    /// or refused without a panic.
    #[test]
    fn any_bytes_behind_a_real_magic_never_panic(
        form in proptest::sample::select(FORMS),
        tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048),
    ) {
        let mut bytes = fixture(form)[..16].to_vec();
        bytes.extend_from_slice(&tail);
        let _ = has_code(&bytes);
        if let Some(kind) = ImageKind::detect(&bytes) {
            let _ = plan("sm_90", kind, &bytes);
        }
    }
}
