//! What the stand-in tests of this crate share: a stand-in `nvidia-cuda-mps-control` and the writing of an executable script.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A stand-in `nvidia-cuda-mps-control`: `-f` is the daemon (until `quit`); else one command, of
/// one server (4242) whose clients `<pipe dir>/clients` lists.
pub const FAKE_CONTROL: &str = r#"#!/bin/sh
if [ "$1" = "-f" ]; then
  : > "$CUDA_MPS_PIPE_DIRECTORY/control"
  while [ ! -e "$CUDA_MPS_PIPE_DIRECTORY/quit" ]; do sleep 0.02; done
  exit 0
fi
read cmd arg rest
case "$cmd" in
  get_server_list) echo 4242 ;;
  get_client_list) cat "$CUDA_MPS_PIPE_DIRECTORY/clients" 2>/dev/null ;;
  terminate_client) : ;;
  quit) : > "$CUDA_MPS_PIPE_DIRECTORY/quit" ;;
  *) echo "unknown command $cmd" >&2; exit 1 ;;
esac
"#;

/// Writes `text` to `dir/name`, executable; its path.
pub fn script(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}
