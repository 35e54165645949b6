//! The device side's view of the layout: the generated block of `include/mesh/detail/layout.cuh`, and the
//! text of the CUDA header `include/mesh.cuh` and its parts.
//!
//! `mesh/detail/layout.cuh` holds a block between `BEGIN GENERATED LAYOUT` and `END GENERATED
//! LAYOUT` that must equal [`layout_block`]; a test fails when they differ, and
//! `MESH_BLESS=1 cargo test -p mesh-shm` rewrites it. The struct definitions in
//! the block carry `static_assert`s so that nvcc checks them too.

use core::mem::{offset_of, size_of};
use std::fmt::Write;

use crate::layout::*;

/// The text of `include/mesh.cuh`, the umbrella header that includes every part, as shipped in this crate.
pub const MESH_CUH: &str = include_str!("../include/mesh.cuh");

/// Every file of the CUDA header, by its path under `include/`: the umbrella, the public parts
/// (`mesh/*.cuh`) and their internals (`mesh/detail/*.cuh`).
pub const PARTS: &[(&str, &str)] = &[
    ("mesh.cuh", MESH_CUH),
    ("mesh/core.cuh", include_str!("../include/mesh/core.cuh")),
    ("mesh/channel.cuh", include_str!("../include/mesh/channel.cuh")),
    ("mesh/bulk.cuh", include_str!("../include/mesh/bulk.cuh")),
    ("mesh/service.cuh", include_str!("../include/mesh/service.cuh")),
    ("mesh/detail/layout.cuh", include_str!("../include/mesh/detail/layout.cuh")),
    ("mesh/detail/removed.cuh", include_str!("../include/mesh/detail/removed.cuh")),
    ("mesh/detail/ptx.cuh", include_str!("../include/mesh/detail/ptx.cuh")),
    ("mesh/detail/core.cuh", include_str!("../include/mesh/detail/core.cuh")),
    ("mesh/detail/channel.cuh", include_str!("../include/mesh/detail/channel.cuh")),
    ("mesh/detail/bulk.cuh", include_str!("../include/mesh/detail/bulk.cuh")),
    ("mesh/detail/fanin.cuh", include_str!("../include/mesh/detail/fanin.cuh")),
    ("mesh/detail/group.cuh", include_str!("../include/mesh/detail/group.cuh")),
];

/// The part that holds the generated block.
pub const LAYOUT_PART: &str = "mesh/detail/layout.cuh";

/// Start marker of the generated block.
pub const BEGIN: &str = "// BEGIN GENERATED LAYOUT";
/// End marker of the generated block.
pub const END: &str = "// END GENERATED LAYOUT";

/// The generated block (markers included) for the layout compiled into this crate.
pub fn layout_block() -> String {
    let mut s = String::new();
    let mut def = |name: &str, value: u64| writeln!(s, "#define {name} {value}u").expect("write to String");
    def("MESH_LAYOUT_VERSION", LAYOUT_VERSION.into());
    def("MESH_MAX_BINDINGS", MAX_BINDINGS as u64);
    def("MESH_SLOT_SIZE", size_of::<Slot>() as u64);
    def("MESH_SLOT_STOP", (offset_of!(Slot, control) + offset_of!(SlotControl, stop)) as u64);
    def("MESH_SLOT_GENERATION", (offset_of!(Slot, control) + offset_of!(SlotControl, generation)) as u64);
    def("MESH_SLOT_HEARTBEAT", (offset_of!(Slot, status) + offset_of!(SlotStatus, heartbeat)) as u64);
    def("MESH_SLOT_STATE", (offset_of!(Slot, status) + offset_of!(SlotStatus, state)) as u64);
    def("MESH_SLOT_EXIT_CODE", (offset_of!(Slot, status) + offset_of!(SlotStatus, exit_code)) as u64);
    def("MESH_SLOT_SEEN_GENERATION", (offset_of!(Slot, status) + offset_of!(SlotStatus, generation)) as u64);
    def("MESH_SLOT_USER", (offset_of!(Slot, user) + offset_of!(SlotUser, words)) as u64);
    def("MESH_SLOT_USER_WORDS", 32);
    def("MESH_RING_HEAD", (offset_of!(RingHeader, producer) + offset_of!(ProducerLine, head)) as u64);
    def("MESH_RING_TAIL", (offset_of!(RingHeader, consumer) + offset_of!(ConsumerLine, tail)) as u64);
    def("MESH_RING_SLOTS", size_of::<RingHeader>() as u64);
    def("MESH_RING_WIRE_FACTOR", RING_WIRE_FACTOR);
    def("MESH_STATE_IDLE", STATE_IDLE.into());
    def("MESH_STATE_RUNNING", STATE_RUNNING.into());
    def("MESH_STATE_STOPPED", STATE_STOPPED.into());
    def("MESH_STATE_EXITED", STATE_EXITED.into());
    def("MESH_PLACEMENT_HOST", PLACEMENT_HOST.into());
    def("MESH_PLACEMENT_DEVICE", PLACEMENT_DEVICE.into());
    def("MESH_PROTOCOL_LL", PROTOCOL_LL.into());
    def("MESH_PROTOCOL_BULK", PROTOCOL_BULK.into());
    def("MESH_BULK_FLAG_SIZE", BULK_FLAG_SIZE);
    def("MESH_BULK_ALIGN", SLOTS_ALIGN);
    def("MESH_BULK_MAX_PARTS", MAX_BULK_PARTS.into());
    def("MESH_BULK_PARTS_SHIFT", BINDING_PARTS_SHIFT.into());
    def("MESH_FANIN_MAX_SHARDS", MAX_FANIN_SHARDS.into());
    def("MESH_LINE", LINE);
    let mut out = format!("{BEGIN} (from mesh-shm's layout.rs; MESH_BLESS=1 cargo test -p mesh-shm rewrites it)\n{s}");
    out.push_str(
        "typedef struct {\n    uint64_t ring_offset;\n    uint64_t slots;\n    uint32_t msg_size;\n    uint32_t capacity;\n    \
         uint32_t placement;\n    uint32_t protocol;\n} mesh_binding;\n\
         typedef struct {\n    uint64_t base;\n    uint64_t slot_offset;\n    uint32_t slot;\n    uint32_t binding_count;\n    \
         mesh_binding bindings[MESH_MAX_BINDINGS];\n    uint64_t stop_due;\n    uint32_t stop_seen;\n    uint32_t reserved;\n} mesh_ctx;\n",
    );
    let mut asserts = String::new();
    let mut check = |what: &str, value: usize| {
        writeln!(asserts, "static_assert({what} == {value}, \"{what} disagrees with mesh-shm\");")
            .expect("write to String")
    };
    check("sizeof(mesh_binding)", size_of::<MeshBinding>());
    check("offsetof(mesh_binding, slots)", offset_of!(MeshBinding, slots));
    check("offsetof(mesh_binding, msg_size)", offset_of!(MeshBinding, msg_size));
    check("offsetof(mesh_binding, capacity)", offset_of!(MeshBinding, capacity));
    check("offsetof(mesh_binding, placement)", offset_of!(MeshBinding, placement));
    check("offsetof(mesh_binding, protocol)", offset_of!(MeshBinding, protocol));
    check("sizeof(mesh_ctx)", size_of::<MeshCtx>());
    check("offsetof(mesh_ctx, slot_offset)", offset_of!(MeshCtx, slot_offset));
    check("offsetof(mesh_ctx, slot)", offset_of!(MeshCtx, slot));
    check("offsetof(mesh_ctx, binding_count)", offset_of!(MeshCtx, binding_count));
    check("offsetof(mesh_ctx, bindings)", offset_of!(MeshCtx, bindings));
    check("offsetof(mesh_ctx, stop_due)", offset_of!(MeshCtx, stop_due));
    check("offsetof(mesh_ctx, stop_seen)", offset_of!(MeshCtx, stop_seen));
    out.push_str(&asserts);
    out.push_str(END);
    out
}

/// The generated block as it stands in `text`, or `None` when the markers are missing.
pub fn block_in(text: &str) -> Option<&str> {
    let start = text.find(BEGIN)?;
    let end = text[start..].find(END)? + start + END.len();
    Some(&text[start..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mesh_cuh_matches_the_rust_layout() {
        let expected = layout_block();
        let path = format!("{}/include/{LAYOUT_PART}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).expect("read the layout part");
        let current = block_in(&text).expect("the layout part lacks its generated-layout markers").to_string();
        if current != expected {
            if std::env::var_os("MESH_BLESS").is_some() {
                std::fs::write(&path, text.replace(&current, &expected)).expect("rewrite the layout part");
                return;
            }
            panic!(
                "{LAYOUT_PART}'s layout block differs from layout.rs; run MESH_BLESS=1 cargo test -p mesh-shm\n--- expected\n{expected}\n--- found\n{current}"
            );
        }
        let embedded = PARTS.iter().find(|(name, _)| *name == LAYOUT_PART).expect("the layout part is listed").1;
        assert_eq!(block_in(embedded), Some(expected.as_str()), "the embedded copy is stale: rebuild");
    }

    #[test]
    fn every_define_is_used_by_the_device_code_or_documented() {
        // The device functions must address the layout through the generated names, never literals.
        for line in layout_block().lines().filter(|l| l.starts_with("#define ")) {
            let name = line.split_whitespace().nth(1).expect("a name");
            let uses: usize = PARTS.iter().map(|(_, text)| text.matches(name).count()).sum();
            assert!(uses >= 2, "{name} is generated but no part of mesh.cuh uses it");
        }
    }
}
