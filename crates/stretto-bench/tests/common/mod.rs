//! Running the `stretto` binary in a scratch folder whose KV caches and memo stay out of the user's.

use std::path::Path;
use std::process::Command;

/// Runs `stretto ARGS` in `dir` with `dir/memo` and `dir/kv`; returns (success, stdout, stderr).
#[allow(dead_code)] // each test binary uses what it needs
pub fn stretto(args: &[&str], dir: &Path) -> (bool, String, String) {
    stretto_with_kv(args, dir, &dir.join("kv"))
}

/// A KV directory the tests of one build share: the caches of the bundled reviews are the same whichever test
/// builds them first (the store is content-addressed and safe for concurrent processes, which `reliability.rs`
/// tests), so a test whose subject is not cache building reads them instead of prefilling them again.
#[allow(dead_code)]
pub fn shared_kv() -> std::path::PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("shared-kv")
}

/// Runs `stretto ARGS` in `dir` with `dir/memo` and the KV caches in `kv`; returns (success, stdout, stderr).
#[allow(dead_code)]
pub fn stretto_with_kv(args: &[&str], dir: &Path, kv: &Path) -> (bool, String, String) {
    stretto_with_env(args, dir, kv, &[])
}

/// [`stretto_with_kv`] with further environment variables set.
#[allow(dead_code)]
pub fn stretto_with_env(args: &[&str], dir: &Path, kv: &Path, vars: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_stretto"))
        .args(args)
        .current_dir(dir)
        .env("STRETTO_MEMO_DIR", dir.join("memo"))
        .env("STRETTO_KV_DIR", kv)
        // A developer's own ladder would change which models the tests' queries may use.
        .env_remove("STRETTO_LADDER")
        .envs(vars.iter().copied())
        .output()
        .expect("binary runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// Every file under `root` (none when it does not exist) with its size, read while other processes may be writing
/// there: a file that vanishes between listing and reading is left out.
#[allow(dead_code)] // each test binary uses what it needs
pub fn files_under(root: &Path) -> Vec<(std::path::PathBuf, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let Ok(md) = e.metadata() else { continue };
            if md.is_dir() {
                stack.push(e.path());
            } else {
                out.push((e.path(), md.len()));
            }
        }
    }
    out.sort();
    out
}

/// The finished KV records under `root`: `.safetensors` files that are not a write's temporary (`.name.tmp…`).
#[allow(dead_code)]
pub fn records_under(root: &Path) -> std::collections::BTreeSet<std::path::PathBuf> {
    files_under(root)
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| {
            p.extension().is_some_and(|x| x == "safetensors")
                && !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect()
}
