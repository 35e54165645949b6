//! The hand-written reference pages under docs/reference/ against the code they describe: the
//! mailbox layout's version, constants and offsets against mesh-shm's layout, the C API page against
//! mesh_shm.h, and the Python API page against the package's exports and stubs. Each test fails
//! naming what the page lacks or gets wrong, so an API change cannot leave its page behind.

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::path::PathBuf;

use mesh_shm::layout::{self, ChannelDesc, Header, MeshBinding, MeshCtx, RingHeader, Slot};

fn repo_file(path: &str) -> String {
    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: cannot read: {e}", full.display()))
}

/// The rows of the table that follows `heading` (a line starting with it), as cells with the
/// backticks of their first cell removed.
fn table_after(page: &str, heading: &str) -> Vec<Vec<String>> {
    let mut lines = page.lines().skip_while(|l| !l.starts_with(heading));
    assert!(lines.next().is_some(), "the page has no section {heading:?}");
    lines
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|row| {
            let cells: Vec<String> =
                row.trim_matches('|').split(" | ").map(|c| c.trim().trim_matches('`').to_string()).collect();
            cells
        })
        .collect()
}

/// `field -> offset` of a table whose first two columns are the field and its offset.
fn offsets(page: &str, heading: &str) -> BTreeMap<String, usize> {
    table_after(page, heading)
        .into_iter()
        .map(|cells| {
            let offset = cells[1].parse().unwrap_or_else(|_| panic!("{heading}: {:?}: offset is no number", cells[0]));
            (cells[0].clone(), offset)
        })
        .collect()
}

fn check_struct(page: &str, heading: &str, size: usize, expected: &[(&str, usize)]) {
    assert!(
        page.lines().any(|l| l.starts_with(heading) && l.contains(&format!("{size} bytes"))),
        "mailbox-layout.md: section {heading:?} must give the size {size} bytes"
    );
    let found = offsets(page, heading);
    let expected: BTreeMap<String, usize> = expected.iter().map(|(f, o)| ((*f).to_string(), *o)).collect();
    assert_eq!(found, expected, "mailbox-layout.md: section {heading:?}: fields and offsets differ from layout.rs");
}

#[test]
fn mailbox_layout_page_matches_layout_rs() {
    let page = repo_file("docs/reference/mailbox-layout.md");
    assert!(
        page.contains(&format!("layout version **{}**", layout::LAYOUT_VERSION)),
        "mailbox-layout.md does not say layout version **{}**",
        layout::LAYOUT_VERSION
    );
    let constants: BTreeMap<String, String> =
        table_after(&page, "## Constants").into_iter().map(|c| (c[0].clone(), c[1].clone())).collect();
    let expected: [(&str, u64); 13] = [
        ("MAGIC", layout::MAGIC),
        ("LAYOUT_VERSION", layout::LAYOUT_VERSION.into()),
        ("HEADER_SIZE", layout::HEADER_SIZE),
        ("LINE", layout::LINE),
        ("MAX_BINDINGS", layout::MAX_BINDINGS as u64),
        ("NAME_LEN", layout::NAME_LEN as u64),
        ("MAX_MSG_SIZE", layout::MAX_MSG_SIZE.into()),
        ("MAX_BULK_MSG_SIZE", layout::MAX_BULK_MSG_SIZE.into()),
        ("MAX_BULK_PARTS", layout::MAX_BULK_PARTS.into()),
        ("MAX_FANIN_SHARDS", layout::MAX_FANIN_SHARDS.into()),
        ("MAX_GROUP_ENTRIES", layout::MAX_GROUP_ENTRIES.into()),
        ("MAX_CAPACITY", layout::MAX_CAPACITY.into()),
        ("NO_CHANNEL", layout::NO_CHANNEL.into()),
    ];
    for (name, value) in expected {
        let shown = constants.get(name).unwrap_or_else(|| panic!("mailbox-layout.md: no row for {name}"));
        let parsed = match shown.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => shown.parse().ok(),
        };
        assert_eq!(parsed, Some(value), "mailbox-layout.md: {name} is {shown}, layout.rs says {value}");
    }

    check_struct(
        &page,
        "## Header",
        size_of::<Header>(),
        &[
            ("magic", offset_of!(Header, magic)),
            ("version", offset_of!(Header, version)),
            ("header_size", offset_of!(Header, header_size)),
            ("file_size", offset_of!(Header, file_size)),
            ("slot_count", offset_of!(Header, slot_count)),
            ("slot_size", offset_of!(Header, slot_size)),
            ("slots_offset", offset_of!(Header, slots_offset)),
            ("channel_count", offset_of!(Header, channel_count)),
            ("channel_desc_size", offset_of!(Header, channel_desc_size)),
            ("channels_offset", offset_of!(Header, channels_offset)),
            ("arena_offset", offset_of!(Header, arena_offset)),
            ("arena_size", offset_of!(Header, arena_size)),
            ("arena_used", offset_of!(Header, arena_used)),
            ("table_lock", offset_of!(Header, table_lock)),
            ("creator_pid", offset_of!(Header, creator_pid)),
            ("owner_pid", offset_of!(Header, owner_pid)),
        ],
    );
    check_struct(
        &page,
        "## Slot",
        size_of::<Slot>(),
        &[
            ("control.stop", offset_of!(Slot, control.stop)),
            ("control.generation", offset_of!(Slot, control.generation)),
            ("control.in_use", offset_of!(Slot, control.in_use)),
            ("control.binding_count", offset_of!(Slot, control.binding_count)),
            ("control.bindings", offset_of!(Slot, control.bindings)),
            ("control.name", offset_of!(Slot, control.name)),
            ("status.heartbeat", offset_of!(Slot, status.heartbeat)),
            ("status.state", offset_of!(Slot, status.state)),
            ("status.exit_code", offset_of!(Slot, status.exit_code)),
            ("status.generation", offset_of!(Slot, status.generation)),
            ("user.words", offset_of!(Slot, user.words)),
        ],
    );
    check_struct(
        &page,
        "## Channel descriptor",
        size_of::<ChannelDesc>(),
        &[
            ("state", offset_of!(ChannelDesc, state)),
            ("msg_size", offset_of!(ChannelDesc, msg_size)),
            ("capacity", offset_of!(ChannelDesc, capacity)),
            ("placement", offset_of!(ChannelDesc, placement)),
            ("ring_offset", offset_of!(ChannelDesc, ring_offset)),
            ("name", offset_of!(ChannelDesc, name)),
            ("slots_offset", offset_of!(ChannelDesc, slots_offset)),
            ("lost", offset_of!(ChannelDesc, lost)),
            ("protocol", offset_of!(ChannelDesc, protocol)),
            ("parts", offset_of!(ChannelDesc, parts)),
            ("pad", offset_of!(ChannelDesc, pad)),
        ],
    );
    check_struct(
        &page,
        "## Ring header",
        size_of::<RingHeader>(),
        &[
            ("producer.head", offset_of!(RingHeader, producer.head)),
            ("consumer.tail", offset_of!(RingHeader, consumer.tail)),
            ("claims.producer", offset_of!(RingHeader, claims.producer)),
            ("claims.consumer", offset_of!(RingHeader, claims.consumer)),
        ],
    );
    check_struct(
        &page,
        "`mesh_binding`",
        size_of::<MeshBinding>(),
        &[
            ("ring_offset", offset_of!(MeshBinding, ring_offset)),
            ("slots", offset_of!(MeshBinding, slots)),
            ("msg_size", offset_of!(MeshBinding, msg_size)),
            ("capacity", offset_of!(MeshBinding, capacity)),
            ("placement", offset_of!(MeshBinding, placement)),
            ("protocol", offset_of!(MeshBinding, protocol)),
        ],
    );
    check_struct(
        &page,
        "`mesh_ctx`",
        size_of::<MeshCtx>(),
        &[
            ("base", offset_of!(MeshCtx, base)),
            ("slot_offset", offset_of!(MeshCtx, slot_offset)),
            ("slot", offset_of!(MeshCtx, slot)),
            ("binding_count", offset_of!(MeshCtx, binding_count)),
            ("bindings", offset_of!(MeshCtx, bindings)),
            ("stop_due", offset_of!(MeshCtx, stop_due)),
            ("stop_seen", offset_of!(MeshCtx, stop_seen)),
            ("reserved", offset_of!(MeshCtx, reserved)),
        ],
    );

    let protocols: BTreeMap<String, String> =
        table_after(&page, "The protocol codes:").into_iter().map(|c| (c[0].clone(), c[1].clone())).collect();
    for (code, name) in [
        (layout::PROTOCOL_LL, "ll"),
        (layout::PROTOCOL_BULK, "bulk"),
        (layout::PROTOCOL_INDEX, "index"),
        (layout::PROTOCOL_FANIN, "fanin"),
        (layout::PROTOCOL_GROUP, "group"),
    ] {
        assert_eq!(protocols.get(&code.to_string()).map(String::as_str), Some(name), "protocol code {code}");
    }
}

/// Every `name` the C header declares: functions, `#define`d constants and types.
fn c_header_names(header: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in header.lines() {
        let ident = |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
        if let Some(rest) = line.strip_prefix("#define ") {
            let name = ident(rest);
            if name.starts_with("MESH") && name != "MESH_SHM_H" {
                names.push(name);
            }
        } else if let Some(paren) = line.find('(').filter(|_| !line.starts_with(' ') && !line.starts_with("//")) {
            let before = line[..paren].trim_end();
            let name: String = before.rsplit([' ', '*']).next().unwrap_or("").to_string();
            if name.starts_with("mesh_") {
                names.push(name);
            }
        } else if let Some(rest) = line.strip_prefix("typedef struct ") {
            names.push(ident(rest));
        }
    }
    names
}

#[test]
fn c_api_page_names_everything_the_header_declares() {
    let header = repo_file("crates/mesh-shm-c/include/mesh_shm.h");
    let page = repo_file("docs/reference/c-api.md");
    let names = c_header_names(&header);
    assert!(names.len() > 40, "only {} names found in mesh_shm.h: is the parser broken?", names.len());
    let missing: Vec<&String> =
        names.iter().filter(|n| !page.contains(&format!("`{n}")) && !page.contains(&format!(" {n}("))).collect();
    assert!(missing.is_empty(), "docs/reference/c-api.md does not name {missing:?}, which mesh_shm.h declares");
}

/// The public names of a Python source: classes, and the methods and properties of its classes,
/// as `(class, member)`.
fn python_members(source: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut class = None::<String>;
    for line in source.lines() {
        let name_after = |prefix: &str| -> Option<String> {
            line.strip_prefix(prefix)
                .map(|rest| rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect())
        };
        if let Some(name) = name_after("class ") {
            class = (!name.starts_with('_')).then_some(name.clone());
            if class.is_some() {
                out.push((name.clone(), name));
            }
        } else if !line.starts_with(' ') && !line.trim().is_empty() {
            class = None;
        } else if let (Some(c), Some(name)) = (&class, name_after("    def ").or_else(|| name_after("    async def ")))
            && !name.starts_with('_')
        {
            out.push((c.clone(), name));
        }
    }
    out
}

#[test]
fn python_api_page_names_every_export_and_public_member() {
    let page = repo_file("docs/reference/python-api.md");
    let init = repo_file("crates/mesh-py/python/meshd/__init__.py");
    let all = init.split("__all__").nth(1).expect("__init__.py has __all__");
    let exports: Vec<&str> = all.split('"').skip(1).step_by(2).collect();
    assert!(exports.len() > 20, "only {} exports found in __all__", exports.len());
    let mut missing: Vec<String> =
        exports.iter().filter(|n| !page.contains(&format!("`{n}"))).map(|n| (*n).to_string()).collect();
    let mut checked = 0;
    for file in ["_meshd.pyi", "control.py", "service.py"] {
        let source = repo_file(&format!("crates/mesh-py/python/meshd/{file}"));
        for (class, member) in python_members(&source) {
            // The rows of control.py (TypedDicts) are named as a group; their fields are the protocol's.
            if !exports.contains(&class.as_str()) {
                continue;
            }
            checked += 1;
            let named = page.contains(&format!("`{member}")) || page.contains(&format!("`{class}.{member}"));
            if !named {
                missing.push(format!("{class}.{member} ({file})"));
            }
        }
    }
    assert!(checked > 60, "only {checked} public members found: is the parser broken?");
    assert!(missing.is_empty(), "docs/reference/python-api.md does not name {missing:?}");
}
