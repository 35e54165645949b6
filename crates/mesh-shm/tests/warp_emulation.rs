//! mesh.cuh's fan-in and service calls, and the service programs themselves, run as emulated warps on the CPU (`tests/emu`: a thread a lane, every warp intrinsic an exchange between barriers), checked against models.
//!
//! The device code is the shipped header (and tests/programs' service loops), compiled by the host's
//! C++ compiler with `MESH_HOST_EMULATION` (which swaps its few PTX primitives for atomics): what the
//! calls compute is tested on every CI run, not the GPU's memory model or speed (the GPU tests do
//! that). Without a C++20 compiler (`$CXX`, `c++` or `g++`) the tests say SKIPPED and pass.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

#[path = "emu/driver.rs"]
mod driver;
use driver::{built, built_from, compiler};

/// How long one emulation run may take before it counts as hung (a run takes seconds).
const HUNG_AFTER: Duration = Duration::from_secs(300);

fn passes(exe: &Path, args: &[&str]) {
    driver::passes(exe, args, HUNG_AFTER, "all passed");
}

#[test]
fn the_fanin_consumer_calls_take_every_request_once_in_order_one_ring_and_sharded() {
    if let Some(exe) = built("fanin_shards.cpp", "fanin_shards_emu", &[]) {
        passes(&exe, &[]);
    }
}

/// The service programs of tests/programs, whole, as blocks of emulated warps against a driver that
/// plays the clients (numbered requests, every reply checked, a quarter departing with requests in
/// flight, each departed slot then bound to a new client at the next epoch, whose replies must never
/// include the departed one's) and meshd (departures, the rebinding, the stop): `service.cu` (the
/// header's batched loop, every warp serving its part of the shards: mesh_fanin_open(ctx, 0, warps) and
/// mesh_group_open from that end) and `service_x_serial.cu` (one request at a time: the take and the commit),
/// each over one ring and over shards, with one warp, a warp a shard, several shards a warp (32 over 8),
/// more warps than shards, a count of warps that is not a power of two (the extra ones idle), and 64
/// shards (more than one warp's lanes hold) over 2 and 8 warps.
/// Arguments: shards, warps.
#[test]
fn the_service_programs_answer_every_client_in_order_and_acknowledge_departures() {
    let cases: [(&str, &[[&str; 2]]); 3] = [
        (
            "service.cu",
            &[
                ["1", "1"],
                ["8", "1"],
                ["32", "1"],
                ["1", "4"],
                ["2", "2"],
                ["8", "2"],
                ["8", "3"],
                ["8", "8"],
                ["2", "8"],
                ["32", "8"],
                ["64", "2"],
                ["64", "8"],
            ],
        ),
        ("service_x_serial.cu", &[["1", "1"], ["8", "1"], ["8", "8"], ["4", "2"], ["64", "2"]]),
        ("service_x_simple.cu", &[["1", "1"], ["8", "1"], ["32", "4"]]),
    ];
    for (program, runs) in cases {
        let name = format!("service_emu_{}", program.trim_end_matches(".cu"));
        let defines = vec![format!("-DPROGRAM=\"{program}\"")];
        let Some(exe) = built("service_emu.cpp", &name, &defines) else { return };
        for [shards, warps] in runs {
            passes(&exe, &[shards, warps]);
        }
    }
}

/// Every whole program in the comments of mesh.cuh and its parts (`//     extern "C" __global__ void mesh_main` to its
/// closing brace) and in the README's CUDA blocks compiles against the header as it is: what a user
/// copies cannot name a call, field or macro that is gone. Compiled by the host's C++ compiler with the
/// emulation's definitions of CUDA's built-ins (syntax and types only; `work` and `use`, the
/// placeholders of the request / reply example, are declared for it).
/// The batched service with requests of 1 and 4 KiB (a peek then returns 4 of them, or 1: what one
/// round trip loads, and what the warp's buffer in service.cu holds), over one and several shards.
#[test]
fn the_batched_service_answers_requests_of_1_and_4_kib() {
    for size in [1024, 4096] {
        let defines = vec!["-DPROGRAM=\"service.cu\"".to_string(), format!("-DEMU_MSG={size}u")];
        let Some(exe) = built("service_emu.cpp", &format!("service_emu_msg{size}"), &defines) else { return };
        for [shards, warps] in [["1", "1"], ["8", "2"], ["8", "8"]] {
            passes(&exe, &[shards, warps]);
        }
    }
}

/// The service programs over a grid (`meshd load --grid`): blocks of warps at once, each block its own
/// copy of the program (its own shared memory) and every block the program's device-memory counters,
/// `service_emu SHARDS WARPS BLOCKS`. Warp w of block b serves part b x WARPS + w; the last block out
/// reports the exact counts and zeroes the counters. `service_x_simple.cu` is the header's one-warp
/// example, which looks block-local (`if (threadIdx.x >= 32) return;` and `mesh_fanin_open(ctx, 0)`):
/// over a grid its blocks' warps must split the shards, one consumer each (with one shard, block 0's
/// warp serves and the others are spare), or replies would come twice or out of order.
#[test]
fn the_service_programs_over_a_grid_answer_every_client_and_count_every_block() {
    let cases: [(&str, &[[&str; 3]]); 3] = [
        (
            "service.cu",
            &[["8", "2", "2"], ["8", "2", "4"], ["32", "2", "4"], ["2", "1", "4"], ["8", "1", "3"], ["64", "2", "4"]],
        ),
        ("service_x_serial.cu", &[["8", "2", "2"], ["4", "1", "4"]]),
        (
            "service_x_simple.cu",
            &[["1", "1", "4"], ["8", "1", "4"], ["8", "2", "4"], ["2", "1", "4"], ["64", "1", "4"], ["4", "1", "2"]],
        ),
    ];
    for (program, runs) in cases {
        let name = format!("service_grid_emu_{}", program.trim_end_matches(".cu"));
        let program = format!("-DPROGRAM=\"{program}\"");
        let mut units = vec![("service_emu.cpp", vec![program.clone(), "-DEMU_GRID=4".to_string()])];
        for b in 0..4 {
            units.push(("service_block.cpp", vec![program.clone(), format!("-Dmesh_main=mesh_main_b{b}")]));
        }
        let Some(exe) = built_from(&units, &name, &["-Wl,--allow-multiple-definition"]) else { return };
        for [shards, warps, blocks] in runs {
            passes(&exe, &[shards, warps, blocks]);
        }
    }
}

#[test]
fn the_example_programs_in_the_header_and_the_readme_compile() {
    let Some(cxx) = compiler() else {
        println!("SKIPPED: no C++ compiler ($CXX, c++ or g++) for mesh.cuh's examples");
        return;
    };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    // The umbrella and its public parts: the examples live in the parts' opening comments.
    let mut header = std::fs::read_to_string(manifest.join("include/mesh.cuh")).unwrap();
    let mut parts: Vec<_> = std::fs::read_dir(manifest.join("include/mesh"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cuh"))
        .collect();
    parts.sort();
    for part in parts {
        header.push('\n');
        header.push_str(&std::fs::read_to_string(part).unwrap());
    }
    let readme = std::fs::read_to_string(manifest.join("../../README.md")).unwrap();
    let mut examples = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in header.lines() {
        match (&mut current, line.strip_prefix("//     ")) {
            (None, Some(code)) if code.starts_with("extern \"C\" __global__ void mesh_main") => {
                current = Some(vec![code]);
            }
            (Some(lines), Some(code)) => {
                lines.push(code);
                if code == "}" {
                    examples.push(("mesh.cuh", current.take().unwrap().join("\n")));
                }
            }
            (Some(_), None) => current = None,
            (None, _) => {}
        }
    }
    let from_header = examples.len();
    for block in readme.split("```cuda\n").skip(1) {
        let code = block.split("```").next().unwrap_or("");
        if code.contains("__global__ void mesh_main") {
            examples.push(("README.md", code.replace("#include \"mesh.cuh\"", "")));
        }
    }
    assert!(from_header >= 5, "found {from_header} example programs in mesh.cuh's comments");
    assert!(examples.len() > from_header, "found no example program in the README");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("header-examples");
    std::fs::create_dir_all(&dir).unwrap();
    let prelude = "#include \"mesh.cuh\"\nstatic uint32_t work(uint32_t, uint32_t) { return 0; }\n\
                   static void use(const uint32_t*) {}\n";
    for (i, (source, code)) in examples.iter().enumerate() {
        let file = dir.join(format!("example{i}.cpp"));
        std::fs::write(&file, format!("{prelude}{code}\n")).unwrap();
        let out = Command::new(&cxx)
            .args(["-std=c++20", "-fsyntax-only", "-Wno-unknown-pragmas", "-Wno-unused-function"])
            .arg("-include")
            .arg(manifest.join("tests/emu/warp_emu.h"))
            .arg("-I")
            .arg(manifest.join("include"))
            .arg(&file)
            .output()
            .expect("run the compiler");
        let err = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && (err.contains("c++20") || err.contains("<barrier>")) {
            println!("SKIPPED: {cxx} cannot build C++20: {}", err.lines().next().unwrap_or(""));
            return;
        }
        assert!(out.status.success(), "example {i} of {source} does not compile:\n{code}\n{err}");
    }
    println!("{} example programs compiled ({from_header} from mesh.cuh, the rest from the README)", examples.len());
}

/// Every GPU test program (tests/programs/*.cu: the GPU tests', the benchmarks' and their `_x_`
/// variants) compiles against the header as it is, with the emulation's definitions of CUDA's
/// built-ins (syntax and types only): a header change that breaks a program, or a variant written
/// without nvcc at hand, is caught here instead of by nvcc in a device call.
#[test]
fn every_test_program_compiles_against_the_header() {
    let Some(cxx) = compiler() else {
        println!("SKIPPED: no C++ compiler ($CXX, c++ or g++) for tests/programs");
        return;
    };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let programs = manifest.join("../../tests/programs");
    let mut sources: Vec<_> = std::fs::read_dir(&programs)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    sources.sort();
    assert!(sources.len() >= 30, "found {} programs in {}", sources.len(), programs.display());
    let check = |source: &Path| {
        let out = Command::new(&cxx)
            .args(["-std=c++20", "-fsyntax-only", "-Wno-unknown-pragmas", "-Wno-unused-function", "-x", "c++"])
            .arg("-include")
            .arg(manifest.join("tests/emu/warp_emu.h"))
            .arg("-I")
            .arg(manifest.join("include"))
            .arg("-I")
            .arg(&programs)
            .arg(source)
            .output()
            .expect("run the compiler");
        (source.to_path_buf(), out)
    };
    // Two at a time: the CI machine has two cores.
    let results: Vec<_> = std::thread::scope(|s| {
        let (a, b): (Vec<_>, Vec<_>) = sources.iter().enumerate().partition(|(i, _)| i % 2 == 0);
        let first = s.spawn(|| a.into_iter().map(|(_, p)| check(p)).collect::<Vec<_>>());
        let second = s.spawn(|| b.into_iter().map(|(_, p)| check(p)).collect::<Vec<_>>());
        let mut all = first.join().unwrap();
        all.extend(second.join().unwrap());
        all
    });
    for (source, out) in &results {
        let err = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && (err.contains("c++20") || err.contains("<barrier>")) {
            println!("SKIPPED: {cxx} cannot build C++20: {}", err.lines().next().unwrap_or(""));
            return;
        }
        assert!(out.status.success(), "{} does not compile against mesh.cuh:\n{err}", source.display());
    }
    println!("{} programs compiled against mesh.cuh", results.len());
}
