//! Running the `stretto` binary in a scratch folder whose KV caches and memo stay out of the user's.

use std::path::Path;
use std::process::Command;

/// Runs `stretto ARGS` in `dir` with `dir/memo` and `dir/kv`; returns (success, stdout, stderr).
pub fn stretto(args: &[&str], dir: &Path) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_stretto"))
        .args(args)
        .current_dir(dir)
        .env("STRETTO_MEMO_DIR", dir.join("memo"))
        .env("STRETTO_KV_DIR", dir.join("kv"))
        .output()
        .expect("binary runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}
