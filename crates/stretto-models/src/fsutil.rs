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

/// An exclusive advisory lock on `path` (created if missing), held until the returned guard is dropped. It blocks
/// while another thread or process holds it: preparation of one model runs once, and everyone else waits for it.
#[derive(Debug)]
pub struct FileLock {
    _file: File,
}

/// The lock file of one kind of work (`prepare`, `convert`) on model `name` in `home`: under `home/locks/`, so the
/// model folders hold only models.
pub fn model_lock(home: &Path, name: &str, work: &str) -> PathBuf {
    home.join("locks").join(format!("{name}.{work}.lock"))
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
    file.lock().map_err(|e| ModelError::io(path, e))?;
    Ok(FileLock { _file: file })
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
