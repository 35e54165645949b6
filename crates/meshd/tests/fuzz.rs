//! The request parser under arbitrary input (proptest): never a panic, always a clear error or a request, memory bounded by the line limit.

use std::io::Cursor;

use meshd::protocol::{MAX_IMAGE, MAX_LINE, Request, RequestError, parse_request, read_request, write_request};
use proptest::prelude::*;

/// Lines that look like requests: a known or unknown op with fields of any JSON type.
fn requestish() -> impl Strategy<Value = Vec<u8>> {
    let op = prop_oneof![
        prop::sample::select(vec![
            "load",
            "upgrade",
            "unload",
            "ps",
            "channel_create",
            "info",
            "shutdown",
            "spawn",
            "stop",
            "metrics",
            "service_create",
            "service_attach",
            "detach",
        ])
        .prop_map(String::from),
        "[a-z_]{0,12}",
    ];
    let value = prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        any::<u64>().prop_map(|v| v.to_string()),
        "\"[^\"\\\\]{0,16}\"".prop_map(|s| s),
        Just("null".to_string()),
        Just("[1,2,3]".to_string()),
        Just("[4294967296,0,0]".to_string()),
        Just("{}".to_string()),
    ];
    let key = prop::sample::select(vec![
        "name",
        "image_len",
        "grid",
        "block",
        "shared_mem",
        "bind",
        "sms",
        "msg_size",
        "capacity",
        "placement",
        "protocol",
        "parts",
        "command",
        "ready_timeout_ms",
        "clients",
        "reply_size",
        "reply_capacity",
        "shards",
        "service",
        "no_readiness",
    ]);
    (op, proptest::collection::vec((key, value), 0..8)).prop_map(|(op, fields)| {
        let mut s = format!("{{\"op\":\"{op}\"");
        for (k, v) in fields {
            s.push_str(&format!(",\"{k}\":{v}"));
        }
        s.push_str("}\n");
        s.into_bytes()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic_and_errors_say_why(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        match parse_request(&bytes) {
            Ok(_) => {}
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
        match read_request(&mut Cursor::new(bytes)) {
            Ok((req, image)) => prop_assert_eq!(image.len(), meshd::protocol::image_len(&req)),
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    #[test]
    fn requestish_lines_parse_or_are_refused_clearly(mut line in requestish(), tail in proptest::collection::vec(any::<u8>(), 0..64)) {
        line.extend_from_slice(&tail);
        match read_request(&mut Cursor::new(line)) {
            Ok((req, image)) => {
                prop_assert_eq!(image.len(), meshd::protocol::image_len(&req));
                prop_assert!(image.len() <= MAX_IMAGE);
            }
            Err(RequestError::Malformed(why)) => prop_assert!(!why.is_empty()),
            Err(RequestError::ImageTooLarge { len }) => prop_assert!(len > MAX_IMAGE),
            Err(RequestError::ImageTruncated { len, got }) => prop_assert!(got < len),
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    #[test]
    fn lines_past_the_limit_are_refused_whatever_they_hold(extra in 1usize..4096, fill in any::<u8>()) {
        let fill = if fill == b'\n' { b' ' } else { fill };
        let mut line = vec![fill; MAX_LINE + extra];
        line.push(b'\n');
        let err = read_request(&mut Cursor::new(line)).unwrap_err();
        prop_assert!(matches!(err, RequestError::LineTooLong { max: MAX_LINE }), "{}", err);
    }

    #[test]
    fn written_requests_read_back(name in "[ -~]{0,40}", len in 0usize..256, bind in proptest::collection::vec("[a-z]{1,8}", 0..4)) {
        let req = Request::Load { name, image_len: len, grid: [1, 2, 3], block: [32, 1, 1], shared_mem: 0, bind, sms: Some(8), no_readiness: false };
        let image = vec![7u8; len];
        let mut buf = Vec::new();
        write_request(&mut buf, &req, &image).unwrap();
        let (back, got) = read_request(&mut Cursor::new(buf)).unwrap();
        prop_assert_eq!(back, req);
        prop_assert_eq!(got, image);
    }
}
