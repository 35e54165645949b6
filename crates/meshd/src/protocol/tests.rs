//! The protocol module's unit tests: default capacities, user words, and requests read back as written.

use super::*;

#[test]
fn a_bulk_channel_without_a_capacity_gets_one_that_fits_the_budget() {
    use mesh_shm::Protocol;
    let cases = [(16 << 20, 2), (8 << 20, 2), (4 << 20, 4), (1 << 20, 16), (65_552, 128), (16 << 10, 1024), (16, 1024)];
    for (msg_size, want) in cases {
        let got = default_capacity(msg_size, Protocol::Bulk);
        assert_eq!(got, want, "bulk of {msg_size} bytes");
        assert!(got.is_power_of_two());
        // The rule's promise: within the budget, except the two-message floor.
        assert!(u64::from(got) * u64::from(msg_size) <= BULK_CAPACITY_BUDGET.max(2 * u64::from(msg_size)));
    }
    assert_eq!(default_capacity(64, Protocol::Ll), 1024);
    assert_eq!(default_capacity(64, Protocol::Index), 1024);
}

#[test]
fn user_words_are_found_by_name_and_refused_with_the_reason() {
    let mut row: ProgramRow = serde_json::from_str(
        r#"{"name": "a", "slot": 0, "state": "running", "generation": 1, "heartbeat": 0, "worker_pid": null,
            "sms": null, "kind": "ptx", "grid": [1, 1, 1], "block": [32, 1, 1]}"#,
    )
    .unwrap();
    row.user = (0..32).collect();
    let mut held = row.clone();
    held.name = "held".into();
    held.slot = HELD_SLOT;
    held.user.clear();
    let rows = [row, held];
    assert_eq!(user_words(&rows, "a").unwrap()[5], 5);
    let e = user_words(&rows, "b").unwrap_err().to_string();
    assert!(e.contains("\"b\": not loaded (loaded: a, held)"), "{e}");
    let e = user_words(&rows, "held").unwrap_err().to_string();
    assert!(e.contains("held back"), "{e}");
}

#[test]
fn requests_round_trip_with_their_image() {
    let req = Request::Load {
        name: "echo".into(),
        image_len: 5,
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_mem: 0,
        bind: vec!["a".into(), "b".into()],
        sms: None,
        no_readiness: true,
    };
    let mut buf = Vec::new();
    write_request(&mut buf, &req, b"hello").unwrap();
    let (back, image) = read_request(&mut std::io::Cursor::new(buf)).unwrap();
    assert_eq!((back, image.as_slice()), (req, &b"hello"[..]));
}

#[test]
fn bad_requests_are_errors() {
    assert!(read_request(&mut std::io::Cursor::new(b"{\"op\":\"fly\"}\n".to_vec())).is_err());
    assert!(read_request(&mut std::io::Cursor::new(b"".to_vec())).is_err());
    let huge = format!("{{\"op\":\"upgrade\",\"name\":\"x\",\"image_len\":{}}}\n", MAX_IMAGE + 1);
    let err = read_request(&mut std::io::Cursor::new(huge.into_bytes())).unwrap_err().to_string();
    assert!(err.contains("at most"), "{err}");
    let short = b"{\"op\":\"upgrade\",\"name\":\"x\",\"image_len\":10}\nabc".to_vec();
    assert!(read_request(&mut std::io::Cursor::new(short)).is_err(), "a truncated image is refused");
}
