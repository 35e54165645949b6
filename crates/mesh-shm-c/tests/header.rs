//! `include/mesh_shm.h` is what cbindgen generates from the crate now (`MESH_BLESS=1` rewrites it).

use std::path::Path;

#[test]
fn committed_header_matches_cbindgen() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header");
    let mut fresh = Vec::new();
    bindings.write(&mut fresh);
    let fresh = String::from_utf8(fresh).expect("UTF-8 header");
    let path = crate_dir.join("include/mesh_shm.h");
    if std::env::var_os("MESH_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &fresh).expect("write the header");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "{} is stale: regenerate it with `MESH_BLESS=1 cargo test -p mesh-shm-c --test header`",
        path.display()
    );
}
