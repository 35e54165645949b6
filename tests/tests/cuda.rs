//! The CUDA layer and the JIT on a real GPU: every test program links, the echo program echoes a
//! million messages, heartbeats and stop requests work, a green context confines blocks to its SMs,
//! malformed images are refused with nvJitLink's log. Without a GPU, the driver's absence is a clear error.

use std::time::Duration;

use mesh_backend::{BackendError, ImageKind, LaunchShape};
use mesh_cuda::{Context, CudaError, Device, Module, StreamState};
use mesh_gpu_tests::{Fixture, program, program_names, require_gpu, wait_until};
use mesh_shm::layout::{STATE_RUNNING, STATE_STOPPED};
use mesh_shm::{Consumer, Producer};

const ONE: LaunchShape = LaunchShape { grid: [1, 1, 1], block: [32, 1, 1], shared_mem: 0 };

#[test]
fn no_driver_is_a_clear_error_not_a_panic() {
    if std::env::var_os(mesh_gpu_tests::GATE).is_some() {
        eprintln!("SKIPPED no_driver_is_a_clear_error_not_a_panic: this machine is meant to have a driver");
        return;
    }
    match Device::get(0) {
        Err(CudaError::NoDriver(msg)) => assert!(msg.contains("libcuda"), "{msg}"),
        Err(CudaError::NoDevice(msg)) => eprintln!("driver present, no GPU: {msg}"),
        Err(other) => panic!("unexpected error kind: {other}"),
        Ok(d) => eprintln!("SKIPPED no_driver_is_a_clear_error_not_a_panic: this machine has {}", d.name),
    }
}

#[test]
fn device_reports_its_architecture_and_atomics() {
    require_gpu!("device_reports_its_architecture_and_atomics");
    let d = Device::get(0).unwrap();
    let part = d.sm_partitioning().unwrap();
    eprintln!(
        "device {}: {} SMs, {} (cc {}.{}), host-native atomics {}, MPS {}, SM partition min {} align {}",
        d.name,
        d.sm_count,
        d.arch(),
        d.compute_capability.0,
        d.compute_capability.1,
        d.host_atomics,
        d.mps_enabled,
        part.min_partition,
        part.alignment
    );
    assert!(d.sm_count > 0 && d.arch().starts_with("sm_"));
    assert_eq!(part.sm_count, d.sm_count);
    if d.name.contains("H200") {
        assert!(!d.host_atomics, "gpu.md measured HOST_NATIVE_ATOMIC_SUPPORTED = 0 on the H200");
    }
    let err = part.check(part.min_partition.saturating_sub(1).max(1)).unwrap_err().to_string();
    assert!(err.contains("at least"), "{err}");
}

#[test]
fn every_test_program_links_through_the_jit() {
    require_gpu!("every_test_program_links_through_the_jit");
    let f = Fixture::new();
    eprintln!("JIT warm-up (library start) took {:?}", f.jit.warmup);
    let names = program_names();
    assert!(names.len() >= 5, "programs: {names:?}");
    for name in &names {
        let linked = f.jit.link(name, program(name), ImageKind::Ptx).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(&linked.cubin[..4], b"\x7fELF", "{name}: a cubin");
        let module = Module::load(&f.ctx, &linked.cubin).unwrap();
        let func = module.function("mesh_main").unwrap();
        let attrs = func.attributes().unwrap();
        let per_sm = func.max_active_blocks_per_sm(&ONE).unwrap();
        eprintln!(
            "{name}: {} bytes of cubin in {:?}, {attrs:?}, {per_sm} blocks/SM",
            linked.cubin.len(),
            linked.link_time
        );
        assert!(per_sm > 0);
        let again = f.jit.link(name, program(name), ImageKind::Ptx).unwrap();
        assert!(again.cached && again.cubin == linked.cubin, "{name}: the second link comes from the cache");
    }
}

#[test]
fn malformed_images_are_refused_with_the_linker_log() {
    require_gpu!("malformed_images_are_refused_with_the_linker_log");
    let f = Fixture::new();
    let arch = f.device.arch();
    let bad = format!(
        ".version 8.0\n.target {arch}\n.address_size 64\n.visible .entry mesh_main() {{ bogus.instruction %r1; }}\n"
    );
    match f.jit.link("bad", bad.into_bytes(), ImageKind::Ptx) {
        Err(BackendError::Link { program, log, .. }) => {
            eprintln!("refused as expected: {log}");
            assert_eq!(program, "bad");
            assert!(log.contains("NVJITLINK_ERROR"), "{log}");
            assert!(log.lines().count() >= 2, "the linker's own log follows the code: {log}");
        }
        other => panic!("expected a link error, got {other:?}"),
    }
    // A valid image without mesh_main links, but the entry point is missing.
    let other = format!(".version 8.0\n.target {arch}\n.address_size 64\n.visible .entry not_main() {{ ret; }}\n");
    let linked = f.jit.link("no-main", other.into_bytes(), ImageKind::Ptx).unwrap();
    let module = Module::load(&f.ctx, &linked.cubin).unwrap();
    let err = module.function("mesh_main").unwrap_err().to_string();
    assert!(err.contains("CUDA_ERROR_NOT_FOUND"), "{err}");
}

#[test]
fn heartbeat_advances_and_a_stop_request_ends_the_kernel() {
    require_gpu!("heartbeat_advances_and_a_stop_request_ends_the_kernel");
    let f = Fixture::new();
    let module = f.load_in(&f.ctx, "heartbeat");
    let func = module.function("mesh_main").unwrap();
    let slot = f.mailbox.slot(0).unwrap();
    slot.bind("heartbeat", &[]).unwrap();
    slot.arm(1);
    let stream = f.ctx.stream().unwrap();
    func.launch(&ONE, &stream, &f.mailbox.mesh_ctx(0, f.registered.device_address()).unwrap()).unwrap();
    assert!(wait_until(Duration::from_secs(5), || slot.status().state == STATE_RUNNING), "the kernel never started");
    let first = slot.status().heartbeat;
    assert!(
        wait_until(Duration::from_secs(5), || slot.status().heartbeat > first + 1000),
        "the heartbeat did not advance"
    );
    assert_eq!(slot.status().generation, 1);
    assert_eq!(stream.state(), StreamState::Busy);
    let asked = std::time::Instant::now();
    slot.request_stop();
    assert!(
        wait_until(Duration::from_secs(5), || stream.state() == StreamState::Idle),
        "the kernel ignored its stop request"
    );
    eprintln!(
        "stopped {:?} after the request; max gap between iterations {} ns",
        asked.elapsed(),
        slot.user_words()[0]
    );
    assert_eq!(slot.status().state, STATE_STOPPED);
    let at_stop = slot.status().heartbeat;
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(slot.status().heartbeat, at_stop, "nothing beats after the stop");
}

#[test]
fn echo_returns_a_million_messages_in_order() {
    require_gpu!("echo_returns_a_million_messages_in_order");
    let f = Fixture::new();
    let to_gpu = f.mailbox.create_channel("to-gpu", 16, 1024).unwrap();
    let from_gpu = f.mailbox.create_channel("from-gpu", 16, 1024).unwrap();
    let module = f.load_in(&f.ctx, "echo");
    let func = module.function("mesh_main").unwrap();
    let slot = f.mailbox.slot(1).unwrap();
    slot.bind("echo", &[to_gpu.index, from_gpu.index]).unwrap();
    slot.arm(1);
    let stream = f.ctx.stream().unwrap();
    func.launch(&ONE, &stream, &f.mailbox.mesh_ctx(1, f.registered.device_address()).unwrap()).unwrap();
    let count: u64 = 1_000_000;
    let mailbox = f.mailbox.clone();
    let start = std::time::Instant::now();
    let sender = std::thread::spawn(move || {
        let mut tx = Producer::claim(&mailbox, "to-gpu").unwrap();
        let mut batch = vec![0u8; 16 * 256];
        let mut next = 0u64;
        while next < count {
            let n = (count - next).min(256) as usize;
            for (i, m) in batch.chunks_exact_mut(16).take(n).enumerate() {
                let v = next + i as u64;
                m[..8].copy_from_slice(&v.to_le_bytes());
                m[8..].copy_from_slice(&(v ^ 0x5555_5555_5555_5555).to_le_bytes());
            }
            next += tx.try_send_batch(&batch[..n * 16]).unwrap() as u64;
        }
    });
    let mut rx = Consumer::claim(&f.mailbox, "from-gpu").unwrap();
    let mut buf = vec![0u8; 16 * 256];
    let mut expect = 0u64;
    while expect < count {
        let n =
            rx.recv_batch(&mut buf, Duration::from_secs(10)).unwrap_or_else(|e| panic!("after {expect} messages: {e}"));
        for m in buf.chunks_exact(16).take(n) {
            let a = u64::from_le_bytes(m[..8].try_into().unwrap());
            let b = u64::from_le_bytes(m[8..].try_into().unwrap());
            assert_eq!(a, expect, "lost, duplicated or reordered");
            assert_eq!(b, a ^ 0x5555_5555_5555_5555, "torn message {a}");
            expect += 1;
        }
    }
    sender.join().unwrap();
    let took = start.elapsed();
    eprintln!("echoed {count} messages in {took:?} ({:.0} msg/s)", count as f64 / took.as_secs_f64());
    slot.request_stop();
    assert!(wait_until(Duration::from_secs(5), || stream.state() == StreamState::Idle));
    assert_eq!(slot.status().exit_code, 0);
}

#[test]
fn a_green_context_confines_blocks_to_its_sms() {
    require_gpu!("a_green_context_confines_blocks_to_its_sms");
    let f = Fixture::new();
    let blocks = 32u32;
    let shape = LaunchShape { grid: [blocks, 1, 1], block: [32, 1, 1], shared_mem: 0 };
    let run = |ctx: &Context, slot_index: u32| -> std::collections::BTreeSet<u32> {
        let module = f.load_in(ctx, "smid");
        let func = module.function("mesh_main").unwrap();
        let slot = f.mailbox.slot(slot_index).unwrap();
        slot.bind("smid", &[]).unwrap();
        slot.arm(1);
        let stream = ctx.stream().unwrap();
        func.launch(&shape, &stream, &f.mailbox.mesh_ctx(slot_index, f.registered.device_address()).unwrap()).unwrap();
        stream.synchronize().unwrap();
        let words = slot.user_words();
        assert!(words.iter().all(|&w| w > 0), "every block reported: {words:?}");
        words.iter().map(|w| w - 1).collect()
    };
    let green = Context::green(&f.device, 16).unwrap();
    assert!(green.is_green());
    eprintln!("green context asked 16 SMs, got {}", green.sms());
    let confined = run(&green, 2);
    eprintln!("green context: blocks ran on {} SMs: {confined:?}", confined.len());
    assert!(confined.len() <= 16, "{} distinct SMs in a 16-SM green context", confined.len());
    f.ctx.bind().unwrap();
    let free = run(&f.ctx, 3);
    eprintln!("primary context: blocks ran on {} SMs", free.len());
    assert!(free.len() > 16, "the same launch spreads wider without the green context, so the check can fail");
    let bad = Context::green(&f.device, 3).unwrap_err().to_string();
    assert!(bad.contains("3 SMs") && bad.contains("at least"), "{bad}");
}
