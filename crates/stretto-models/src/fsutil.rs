//! File-system helpers shared by everything that writes into a model home: temporary names that no other writer
//! (thread or process) can pick, and advisory locks that make a second preparer wait for the first.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{ModelError, Result};

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A temporary path in `dir` for something that will be renamed to `name`: `.{name}.tmp{pid}-{n}`, unique to this
/// process (the pid) and to this call (a process-wide counter), so two threads preparing the same file never
/// write into one temporary. Cleanup code recognises it by its leading dot and `.tmp`.
pub fn unique_tmp(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!(".{name}.tmp{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)))
}

/// Syncs every file under `dir` (and the folders themselves) to disk, so a folder renamed into place after it
/// never comes back from a power loss with an empty `tokenizer.json` or config beside a whole graph.
pub fn sync_tree(dir: &Path) -> Result<()> {
    let entries = fs::read_dir(dir).map_err(|e| ModelError::io(dir, e))?;
    for e in entries {
        let path = e.map_err(|e| ModelError::io(dir, e))?.path();
        if path.is_dir() {
            sync_tree(&path)?;
        } else {
            File::open(&path).and_then(|f| f.sync_all()).map_err(|e| ModelError::io(&path, e))?;
        }
    }
    File::open(dir).and_then(|f| f.sync_all()).map_err(|e| ModelError::io(dir, e))
}

/// Removes what killed writers left of `name`'s temporaries in `dir` ([`unique_tmp`]: `.{name}.tmp…`, files or
/// folders). Call it only while holding the lock every writer of those temporaries takes: none of them is then
/// being written, so each is stale (a Ctrl-C or a crash mid-preparation leaves one, up to gigabytes for a
/// converted model, that nothing else would ever remove).
pub fn remove_stale_tmps(dir: &Path, name: &str) {
    let prefix = format!(".{name}.tmp");
    let Ok(entries) = fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        if !e.file_name().to_string_lossy().starts_with(&prefix) {
            continue;
        }
        let path = e.path();
        let removed = if path.is_dir() { fs::remove_dir_all(&path) } else { fs::remove_file(&path) };
        match removed {
            Ok(()) => tracing::info!(path = %path.display(), "removed what an interrupted preparation left"),
            Err(err) => tracing::warn!(path = %path.display(), error = %err, "cannot remove a stale temporary"),
        }
    }
}

/// An exclusive advisory lock on `path` (created if missing), held until the returned guard is dropped. It blocks
/// while another thread or process holds it: preparation of one model runs once, and everyone else waits for it.
#[derive(Debug)]
pub struct FileLock {
    _file: File,
    path: PathBuf,
}

/// The locks this process holds: a wait on one of them is another thread's work here, not another process's.
static HELD: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

impl Drop for FileLock {
    fn drop(&mut self) {
        // Unlocked before it leaves the list: a thread finding it locked always finds it listed.
        let _ = self._file.unlock();
        if let Ok(mut held) = HELD.lock() {
            if let Some(i) = held.iter().position(|p| *p == self.path) {
                held.swap_remove(i);
            }
        }
    }
}

/// The lock file of one kind of work (`prepare`, `convert`) on model `name` in `home`: under `home/locks/`, so the
/// model folders hold only models.
pub fn model_lock(home: &Path, name: &str, work: &str) -> PathBuf {
    home.join("locks").join(format!("{name}.{work}.lock"))
}

/// `Ok` where every one of `files` is a regular file; else the read error of the first that is not (a converted
/// folder missing its graph or tokenizer, deleted by hand or lost to a disk error, is not a conversion: its
/// `ensure_*` converts it again).
pub fn require_files<'a>(files: impl IntoIterator<Item = &'a Path>) -> Result<()> {
    for f in files {
        if !f.is_file() {
            let e = fs::metadata(f).err().unwrap_or_else(|| std::io::Error::other("not a regular file"));
            return Err(ModelError::io(f, e));
        }
    }
    Ok(())
}

/// Takes the lock at `path`, creating its folder and the lock file if needed.
pub fn lock_exclusive(path: &Path) -> Result<FileLock> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    }
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| ModelError::io(path, e))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => {
            // Another process preparing the same model (a download can take minutes) is named, rather than this
            // one hanging without a word; another thread of this one is its own progress.
            if HELD.lock().is_ok_and(|held| held.iter().any(|p| p == path)) {
                tracing::debug!(lock = %path.display(), "waiting for another thread preparing the same model");
            } else {
                tracing::warn!(
                    lock = %path.display(),
                    "waiting for another process preparing the same model in this model home"
                );
            }
            file.lock().map_err(|e| ModelError::io(path, e))?;
        }
        Err(fs::TryLockError::Error(e)) => return Err(ModelError::io(path, e)),
    }
    if let Ok(mut held) = HELD.lock() {
        held.push(path.to_path_buf());
    }
    Ok(FileLock { _file: file, path: path.to_path_buf() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    #[test]
    fn temporary_names_differ_per_call() {
        let d = Path::new("/x");
        assert_ne!(unique_tmp(d, "a"), unique_tmp(d, "a"));
        assert!(unique_tmp(d, "a").file_name().unwrap().to_str().unwrap().starts_with(".a.tmp"));
    }

    #[test]
    fn stale_temporaries_of_a_name_go_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::create_dir_all(d.join(".onnx.tmp123-0/sub")).unwrap();
        fs::write(d.join(".onnx.tmp123-0/sub/model.onnx"), b"half").unwrap();
        fs::write(d.join(".onnx.tmp9-4"), b"half").unwrap();
        for keep in [".onnx-int8.tmp1-0", "onnx", "model.gguf"] {
            fs::create_dir_all(d.join(keep)).unwrap();
        }
        remove_stale_tmps(d, "onnx");
        let mut left: Vec<String> =
            fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(left, [".onnx-int8.tmp1-0", "model.gguf", "onnx"]);
    }

    #[test]
    fn a_second_holder_waits_for_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/.m.lock");
        let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let start = Arc::new(Barrier::new(4));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (path, inside, start) = (path.clone(), inside.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    let _g = lock_exclusive(&path).unwrap();
                    // Nobody else is inside while this thread holds the lock.
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    inside.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
}
