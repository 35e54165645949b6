//! The desired state on disk: a record survives reopening, marks and the culprit search survive a
//! replacement, linked images are found by hash and architecture, services come back as they were,
//! and a damaged record is refused naming `--fresh`.

use std::os::unix::fs::PermissionsExt;

use mesh_backend::ProgramSpec;
use mesh_backend::watch::Cause;
use mesh_shm::{Mailbox, Protocol};
use meshd::replace::Search;
use meshd::state::{Carried, HeldMark, Recorded, StateStore};

const PTX: &[u8] = b".version 8.0\n.target sm_90\n";

#[test]
fn a_record_survives_reopening_and_keeps_only_images_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().join("state");
    let mut s = StateStore::open(&at).unwrap();
    assert_eq!(std::fs::metadata(&at).unwrap().permissions().mode() & 0o777, 0o700);
    let mut spec = ProgramSpec::new("a", PTX.to_vec()).unwrap();
    spec.bindings = vec!["in".into()];
    spec.shape.grid = [2, 1, 1];
    s.record_load(Recorded::of(&spec), &spec.image).unwrap();
    let v2 = [PTX, b"// v2\n"].concat();
    s.record_upgrade("a", &v2).unwrap();
    let back = StateStore::open(&at).unwrap();
    assert_eq!(back.recorded().programs.len(), 1);
    let again = back.spec_of(&back.recorded().programs[0]).unwrap();
    assert_eq!((again.image.as_slice(), again.shape.grid, again.bindings.clone()), (&v2[..], [2, 1, 1], spec.bindings));
    assert_eq!(std::fs::read_dir(at.join("images")).unwrap().count(), 1, "the first image is gone");
    let mut back = back;
    back.record_unload("a").unwrap();
    assert!(StateStore::open(&at).unwrap().recorded().programs.is_empty());
    StateStore::forget(&at).unwrap();
    assert!(!at.exists());
}

#[test]
fn marks_restarts_and_the_search_survive_reopening_and_a_new_image_clears_the_mark() {
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().join("state");
    let mut s = StateStore::open(&at).unwrap();
    for name in ["a", "b"] {
        let spec = ProgramSpec::new(name, [PTX, name.as_bytes()].concat()).unwrap();
        s.record_load(Recorded::of(&spec), &spec.image).unwrap();
    }
    let search = Search {
        error: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
        suspects: vec!["a".into(), "b".into()],
        likely: None,
        answers: vec![true],
        noticed_mono_ns: 5,
    };
    s.update(|st| {
        st.carried.insert(
            "a".into(),
            Carried {
                restarts: 2,
                last_fault: Some("GPU fault: x (caused by this program: y)".into()),
                last_fault_unix_ms: Some(7),
                held: Some(HeldMark { why: "caused a GPU fault: left stopped".into(), culprit: true }),
                searching: None,
            },
        );
        st.carried.insert("b".into(), Carried { restarts: 3, ..Carried::default() });
        st.recovery.reexecs_unix_ms = vec![1, 2];
        st.recovery.search = Some(search.clone());
    })
    .unwrap();
    let mut back = StateStore::open(&at).unwrap();
    let a = &back.recorded().carried["a"];
    assert_eq!((a.restarts, a.last_fault_unix_ms, a.held.as_ref().map(|h| h.culprit)), (2, Some(7), Some(true)));
    assert_eq!(back.recorded().carried["b"].restarts, 3);
    assert_eq!(back.recorded().recovery.reexecs_unix_ms, [1, 2]);
    assert_eq!(back.recorded().recovery.search.as_ref(), Some(&search));
    // An upgrade clears the mark and keeps the count; a new load of the name forgets both.
    back.record_upgrade("a", &[PTX, b"// v2\n"].concat()).unwrap();
    let a = StateStore::open(&at).unwrap().recorded().carried["a"].clone();
    assert_eq!((a.held.is_none(), a.restarts), (true, 2));
    let spec = ProgramSpec::new("b", PTX.to_vec()).unwrap();
    back.record_load(Recorded::of(&spec), &spec.image).unwrap();
    assert!(!StateStore::open(&at).unwrap().recorded().carried.contains_key("b"));
    back.record_unload("a").unwrap();
    assert!(StateStore::open(&at).unwrap().recorded().carried.is_empty());
    // A record without any of this (an older meshd's) still reads.
    std::fs::write(at.join("state.json"), b"{\"version\": 1, \"channels\": [], \"programs\": []}").unwrap();
    assert!(StateStore::open(&at).unwrap().recorded().recovery.search.is_none());
}

#[test]
fn a_fault_waiting_for_its_culprit_names_it_once_found_even_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().join("state");
    let mut s = StateStore::open(&at).unwrap();
    s.update(|st| {
        let waiting = st.carried.entry("bystander".into()).or_default();
        waiting.set_fault("CUDA_ERROR_ILLEGAL_ADDRESS", &Cause::Searching, 7);
        let named = st.carried.entry("other".into()).or_default();
        named.set_fault("CUDA_ERROR_ILLEGAL_ADDRESS", &Cause::NoneNamed, 7);
    })
    .unwrap();
    // The search ends in a later process: the mark comes back from state.json.
    let mut back = StateStore::open(&at).unwrap();
    assert_eq!(back.recorded().carried["bystander"].searching.as_deref(), Some("CUDA_ERROR_ILLEGAL_ADDRESS"));
    back.update(|st| st.carried.values_mut().for_each(|c| c.culprit_found("bad"))).unwrap();
    let reopened = StateStore::open(&at).unwrap();
    let carried = &reopened.recorded().carried;
    let bystander = &carried["bystander"];
    assert_eq!(bystander.last_fault.as_deref(), Some("GPU fault: CUDA_ERROR_ILLEGAL_ADDRESS (caused by bad)"));
    assert_eq!((bystander.last_fault_unix_ms, bystander.searching.as_deref()), (Some(7), None));
    assert_eq!(
        carried["other"].last_fault.as_deref(),
        Some("GPU fault: CUDA_ERROR_ILLEGAL_ADDRESS (no culprit named)"),
        "a fault not waiting for a culprit is left alone"
    );
    // A record from before the field still reads, as not searching.
    let old = br#"{"version": 1, "channels": [], "programs": [], "carried": {"a": {"restarts": 1, "last_fault": "GPU fault: x (no culprit named)"}}}"#;
    std::fs::write(at.join("state.json"), old).unwrap();
    let a = StateStore::open(&at).unwrap().recorded().carried["a"].clone();
    assert_eq!((a.restarts, a.searching), (1, None));
}

#[test]
fn a_linked_image_is_found_by_hash_and_arch_and_a_torn_one_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = StateStore::open(dir.path()).unwrap();
    let spec = ProgramSpec::new("a", PTX.to_vec()).unwrap();
    let rec = Recorded::of(&spec);
    s.record_load(rec.clone(), &spec.image).unwrap();
    let cubin = b"\x7fELF linked for sm_90".to_vec();
    s.store_linked(&rec.image_sha256, "sm_90", &cubin).unwrap();
    assert_eq!(s.linked(&rec.image_sha256, "sm_90").as_deref(), Some(&cubin[..]));
    assert_eq!(s.linked(&rec.image_sha256, "sm_100"), None, "another GPU architecture");
    assert!(s.store_linked("../x", "sm_90", &cubin).is_err());
    let path = dir.path().join("linked").join(format!("{}.sm_90", rec.image_sha256));
    let mut torn = std::fs::read(&path).unwrap();
    torn.truncate(torn.len() - 3);
    std::fs::write(&path, torn).unwrap();
    assert_eq!(s.linked(&rec.image_sha256, "sm_90"), None, "a torn file is no image");
    // Collected with the image.
    s.record_unload("a").unwrap();
    assert!(!path.exists());
}

#[test]
fn a_service_s_fan_in_and_group_are_recorded_and_restored_as_they_were() {
    use mesh_shm::{CreateMode, MailboxConfig};
    let dir = tempfile::tempdir().unwrap();
    let config = MailboxConfig { size: 1 << 20, slots: 4, channels: 8 };
    let first = Mailbox::create(dir.path().join("a"), &config, CreateMode::Exclusive).unwrap();
    first.create_channel("plain", 16, 8).unwrap();
    first.create_fanin("kv", 32, 64, 1).unwrap();
    first.create_group("kv.replies", 5, 24, 4).unwrap();
    let mut s = StateStore::open(&dir.path().join("state")).unwrap();
    s.record_channels(&first).unwrap();
    let protocols: Vec<_> = s.recorded().channels.iter().map(|c| (c.protocol.as_str(), c.parts)).collect();
    assert_eq!(protocols, [("ll", 1), ("fanin", 1), ("group", 5)], "a group's parts word is its entries");
    // The mailbox lost (a reboot), the state kept: both come back with their formats and sizes.
    let second = Mailbox::create(dir.path().join("b"), &config, CreateMode::Exclusive).unwrap();
    let mut back = StateStore::open(&dir.path().join("state")).unwrap();
    assert_eq!(back.restore_channels(&second).unwrap(), 3);
    let kv = second.channel("kv").unwrap();
    assert_eq!((kv.protocol, kv.msg_size, kv.capacity), (Protocol::FanIn, 32, 64));
    let replies = second.channel("kv.replies").unwrap();
    assert_eq!(
        (replies.protocol, replies.clients(), replies.msg_size, replies.capacity),
        (Protocol::Group, Some(5), 24, 4)
    );
    // And serve: meshd's side opens over them and binds a client.
    let mut owner = mesh_shm::ServiceOwner::open(&second, "kv", "kv.replies").unwrap();
    owner.connect(mesh_shm::claim::Holder::current()).unwrap();
    assert_eq!(back.restore_channels(&second).unwrap(), 0, "nothing missing any more");
}

#[test]
fn a_recorded_image_hash_that_is_no_hash_is_refused_before_any_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open(dir.path()).unwrap();
    let rec = |hash: &str| Recorded {
        name: "p".into(),
        image_sha256: hash.into(),
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_mem: 0,
        bindings: Vec::new(),
        sms: None,
        no_readiness: false,
    };
    for bad in ["../../../../dev/zero", "", "g".repeat(64).as_str(), &"a".repeat(65)] {
        let err = store.spec_of(&rec(bad)).unwrap_err().to_string();
        assert!(err.contains("not a SHA-256 in hex"), "{bad:?}: {err}");
    }
    let err = format!("{:#}", store.spec_of(&rec(&"ab".repeat(32))).unwrap_err());
    assert!(err.contains("images"), "a well-formed hash is looked up: {err}");
}

#[test]
fn an_unreadable_record_is_refused_naming_fresh() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("state.json"), b"{\"version\": 9, \"channels\": [], \"programs\": []}").unwrap();
    let err = StateStore::open(dir.path()).unwrap_err().to_string();
    assert!(err.contains("version 9") && err.contains("--fresh"), "{err}");
    std::fs::write(dir.path().join("state.json"), b"garbage").unwrap();
    assert!(format!("{:#}", StateStore::open(dir.path()).unwrap_err()).contains("--fresh"));
}
