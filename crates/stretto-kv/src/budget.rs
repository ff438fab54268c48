//! The disk budget of a KV directory: ad-hoc caches (those queries compute for themselves, under `adhoc/`) are
//! evicted least recently used first so that the KV directory and the memo together stay within a byte limit.
//!
//! - **What counts**: every file under the KV directory and the memo directory. **What is evicted**: only ad-hoc
//!   records. Repositories built on purpose with `stretto kv build` and memoised answers (a few hundred bytes each)
//!   are never removed by a query; `stretto kv stats --budget` drops dominated profiles of those.
//! - **Recency** is a record's modification time: [`touch`] sets it whenever a query uses a record.
//! - **Never a record in use**: a query holds a [`Lease`] while it runs (a locked file under `adhoc/.leases/`
//!   holding its start time). Eviction spares every record used since the start of the oldest running lease, in
//!   this process or another; a lease whose process died is unlocked, and eviction removes it.
//! - **Temporaries of interrupted writes** (a query killed while writing a record leaves `.<name>.tmp<pid>-<n>`)
//!   count like any file; eviction removes those whose writing process is gone, first.
//! - **When the budget cannot hold a record** (everything left is in use), [`DiskBudget::make_room`] says so and
//!   the caller keeps that past in memory only: answers stay right, the next use recomputes it.
//! - The default limit ([`DiskBudget::default_limit`]) is what the KV directory and memo use now plus half of the
//!   free space of the KV directory's file system, so a query never fills a disk.
//!
//! ```
//! use stretto_kv::budget::DiskBudget;
//! let dir = tempfile::tempdir()?;
//! let budget = DiskBudget::new(dir.path(), None, 10_000_000);
//! let _lease = budget.lease()?; // held while the query runs
//! assert!(budget.make_room(4_000_000)?); // room for a 4 MB record
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::error::{KvError, Result};

/// Slack on the lease check: a record touched this long before the oldest lease started is still spared, for file
/// systems whose modification times are coarse.
const MTIME_SLACK: Duration = Duration::from_secs(2);

static NEXT_LEASE: AtomicU64 = AtomicU64::new(0);

/// The budget of one KV directory (and the memo beside it).
#[derive(Debug)]
pub struct DiskBudget {
    kv_dir: PathBuf,
    memo_dir: Option<PathBuf>,
    /// The limit asked for (`None`: the default, measured on first use).
    requested: Option<u64>,
    limit: std::sync::OnceLock<u64>,
    /// Bytes in use as last measured plus what was written since (`None` until first measured).
    used: Mutex<Option<u64>>,
}

/// What an eviction pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Eviction {
    /// Records removed.
    pub records: usize,
    /// Bytes freed.
    pub bytes: u64,
    /// Bytes in use afterwards.
    pub used: u64,
    /// Temporaries of interrupted writes removed (their bytes are in `bytes`).
    pub temporaries: usize,
}

/// A running query's claim on the records it uses: while held, eviction spares every record used since it was
/// taken. Dropping it releases the claim (and a process that dies releases its lock with it).
#[derive(Debug)]
pub struct Lease {
    path: PathBuf,
    _file: File,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Marks a record as used now (its modification time), so LRU eviction takes it last.
pub fn touch(path: &Path) {
    if let Ok(f) = File::options().write(true).open(path) {
        let _ = f.set_modified(SystemTime::now());
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> KvError + '_ {
    move |e| KvError::io(path, e)
}

/// Every file under `dir` with its size and modification time (none when it does not exist).
fn files(dir: &Path) -> Result<Vec<(PathBuf, u64, SystemTime)>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(KvError::io(&d, e)),
        };
        for entry in entries {
            let Ok(entry) = entry else { continue };
            // A file removed between listing and reading (another process's eviction) is simply gone.
            let Ok(md) = entry.metadata() else { continue };
            if md.is_dir() {
                stack.push(entry.path());
            } else {
                out.push((entry.path(), md.len(), md.modified().unwrap_or(SystemTime::UNIX_EPOCH)));
            }
        }
    }
    Ok(out)
}

/// Removes the file at `path`, `bytes` long, and takes it off `used`; whether this call removed it (`false`: another
/// process evicted it first).
fn remove(path: &Path, bytes: u64, used: &mut u64) -> Result<bool> {
    let removed = match fs::remove_file(path) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(KvError::io(path, e)),
    };
    *used = used.saturating_sub(bytes);
    Ok(removed)
}

/// The budget every user of `kv_dir` in this process shares (one account of what was written), `limit` bytes or,
/// when `None`, [`DiskBudget::default_limit`] measured on first use (nothing is read before).
pub fn shared(kv_dir: &Path, memo_dir: Option<&Path>, limit: Option<u64>) -> Result<std::sync::Arc<DiskBudget>> {
    type Key = (PathBuf, Option<PathBuf>, Option<u64>);
    static BUDGETS: Mutex<Vec<(Key, std::sync::Arc<DiskBudget>)>> = Mutex::new(Vec::new());
    let key = (kv_dir.to_path_buf(), memo_dir.map(Path::to_path_buf), limit);
    let mut all = BUDGETS.lock().map_err(|_| KvError::Runtime("disk budgets poisoned".into()))?;
    if let Some((_, b)) = all.iter().find(|(k, _)| *k == key) {
        return Ok(b.clone());
    }
    let b = std::sync::Arc::new(DiskBudget {
        requested: limit,
        ..DiskBudget::new(kv_dir, memo_dir.map(Path::to_path_buf), 0)
    });
    all.push((key, b.clone()));
    Ok(b)
}

impl DiskBudget {
    /// A budget of `limit` bytes for `kv_dir` and `memo_dir` together.
    pub fn new(kv_dir: impl Into<PathBuf>, memo_dir: Option<PathBuf>, limit: u64) -> Self {
        Self {
            kv_dir: kv_dir.into(),
            memo_dir,
            requested: Some(limit),
            limit: std::sync::OnceLock::new(),
            used: Mutex::new(None),
        }
    }

    /// What the stores use now plus half of the free space of the KV directory's file system (the nearest
    /// existing ancestor's, before the directory exists).
    pub fn default_limit(kv_dir: &Path, memo_dir: Option<&Path>) -> Result<u64> {
        let mut probe = kv_dir;
        while !probe.exists() {
            probe = probe.parent().unwrap_or(Path::new("/"));
        }
        let stat = rustix::fs::statvfs(probe).map_err(|e| KvError::io(probe, e.into()))?;
        let free = stat.f_bavail.saturating_mul(stat.f_frsize);
        Ok(Self::measure(kv_dir, memo_dir)?.saturating_add(free / 2))
    }

    /// The limit in bytes (the default one is measured on first call).
    pub fn limit(&self) -> Result<u64> {
        if let Some(l) = self.limit.get() {
            return Ok(*l);
        }
        let l = match self.requested {
            Some(l) => l,
            None => Self::default_limit(&self.kv_dir, self.memo_dir.as_deref())?,
        };
        Ok(*self.limit.get_or_init(|| l))
    }

    /// Bytes the KV directory and the memo use now (measured).
    pub fn usage(&self) -> Result<u64> {
        Self::measure(&self.kv_dir, self.memo_dir.as_deref())
    }

    /// Bytes under `kv_dir` and `memo_dir` (a memo inside the KV directory counted once).
    fn measure(kv_dir: &Path, memo_dir: Option<&Path>) -> Result<u64> {
        let mut used: u64 = files(kv_dir)?.iter().map(|f| f.1).sum();
        if let Some(m) = memo_dir.filter(|m| !m.starts_with(kv_dir)) {
            used += files(m)?.iter().map(|f| f.1).sum::<u64>();
        }
        Ok(used)
    }

    fn leases_dir(&self) -> PathBuf {
        self.kv_dir.join("adhoc").join(".leases")
    }

    /// Takes a lease for a query about to use records of this directory.
    pub fn lease(&self) -> Result<Lease> {
        let dir = self.leases_dir();
        fs::create_dir_all(&dir).map_err(io(&dir))?;
        let name = format!("{}-{}.lease", std::process::id(), NEXT_LEASE.fetch_add(1, Ordering::Relaxed));
        let (path, hidden) = (dir.join(&name), dir.join(format!(".{name}")));
        // Locked and written under a hidden name, then renamed into place (the lock goes with the file): another
        // process's eviction never sees it unlocked, which it would take for a dead query's and remove.
        let mut file = File::options().create(true).truncate(true).write(true).open(&hidden).map_err(io(&hidden))?;
        let placed = file
            .lock()
            .and_then(|()| {
                let start = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
                file.write_all(start.as_nanos().to_string().as_bytes())
            })
            .and_then(|()| file.sync_data())
            .and_then(|()| fs::rename(&hidden, &path));
        if let Err(e) = placed {
            let _ = fs::remove_file(&hidden);
            return Err(KvError::io(&hidden, e));
        }
        Ok(Lease { path, _file: file })
    }

    /// The start of the oldest running lease (`None` when no query runs); stale leases of dead processes are
    /// removed on the way.
    fn oldest_running(&self) -> Result<Option<SystemTime>> {
        let dir = self.leases_dir();
        let mut oldest: Option<SystemTime> = None;
        for (path, _, _) in files(&dir)? {
            // One being placed (see `lease`); a crash in that instant leaves a few bytes, which count for nothing.
            if path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.')) {
                continue;
            }
            let Ok(mut file) = File::options().read(true).write(true).open(&path) else { continue };
            match file.try_lock() {
                // Nobody holds it: its process is gone.
                Ok(()) => {
                    let _ = fs::remove_file(&path);
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    let mut text = String::new();
                    let _ = file.read_to_string(&mut text);
                    // A lease still being written reads as "now": nothing it may use is evicted.
                    let start = text
                        .trim()
                        .parse::<u128>()
                        .ok()
                        .and_then(|n| u64::try_from(n).ok())
                        .map(|n| SystemTime::UNIX_EPOCH + Duration::from_nanos(n))
                        .unwrap_or(SystemTime::UNIX_EPOCH);
                    oldest = Some(oldest.map_or(start, |o| o.min(start)));
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(KvError::io(&path, e)),
            }
        }
        Ok(oldest)
    }

    /// Evicts least-recently-used ad-hoc records that no running query may be using until the stores hold at most
    /// `limit - incoming` bytes, or nothing more can go.
    pub fn evict(&self, incoming: u64) -> Result<Eviction> {
        let limit = self.limit()?;
        let _span = tracing::info_span!("kv_evict", limit, incoming).entered();
        let mut used = self.usage()?;
        let mut ev = Eviction::default();
        let target = limit.saturating_sub(incoming);
        if used > target {
            // What killed writers left: never a record, and nothing will rename it into place.
            for (path, bytes, _) in files(&self.kv_dir.join("adhoc"))? {
                if crate::store::is_temp(&path) && crate::store::abandoned(&path) && remove(&path, bytes, &mut used)? {
                    ev.temporaries += 1;
                    ev.bytes += bytes;
                }
            }
        }
        if used > target {
            let spared_from = self.oldest_running()?.map(|t| t.checked_sub(MTIME_SLACK).unwrap_or(t));
            let mut candidates: Vec<(PathBuf, u64, SystemTime)> = files(&self.kv_dir.join("adhoc"))?
                .into_iter()
                .filter(|(p, _, mtime)| {
                    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                    p.extension().is_some_and(|e| e == "safetensors")
                        && !name.starts_with('.')
                        && spared_from.is_none_or(|from| *mtime < from)
                })
                .collect();
            candidates.sort_by(|a, b| a.2.cmp(&b.2).then_with(|| a.0.cmp(&b.0)));
            for (path, bytes, _) in candidates {
                if used <= target {
                    break;
                }
                if remove(&path, bytes, &mut used)? {
                    ev.records += 1;
                    ev.bytes += bytes;
                }
            }
            if ev.records > 0 || ev.temporaries > 0 {
                tracing::info!(
                    records = ev.records,
                    temporaries = ev.temporaries,
                    bytes = ev.bytes,
                    used,
                    limit,
                    "evicted KV caches"
                );
            }
        }
        ev.used = used;
        *self.used.lock().map_err(|_| KvError::Runtime("disk budget poisoned".into()))? = Some(used);
        Ok(ev)
    }

    /// Whether `bytes` more fit the budget, evicting what may go if they do not yet; counts them as written when
    /// they fit. `false`: the record should not be kept on disk.
    pub fn make_room(&self, bytes: u64) -> Result<bool> {
        let limit = self.limit()?;
        {
            let mut used = self.used.lock().map_err(|_| KvError::Runtime("disk budget poisoned".into()))?;
            if let Some(u) = used.as_mut() {
                if u.saturating_add(bytes) <= limit {
                    *u += bytes;
                    return Ok(true);
                }
            }
        }
        // Measure (others may have written or evicted too), then evict what may go.
        let ev = self.evict(bytes)?;
        let fits = ev.used.saturating_add(bytes) <= limit;
        if fits {
            if let Some(u) = self.used.lock().map_err(|_| KvError::Runtime("disk budget poisoned".into()))?.as_mut() {
                *u += bytes;
            }
        }
        Ok(fits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(dir: &Path, name: &str, bytes: usize, age_s: u64) -> PathBuf {
        let p = dir.join("adhoc/m@p-0.00").join(format!("{name}.safetensors"));
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, vec![7u8; bytes]).unwrap();
        let f = File::options().write(true).open(&p).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(age_s)).unwrap();
        p
    }

    #[test]
    fn the_least_recently_used_records_go_first_and_built_repositories_stay() {
        let dir = tempfile::tempdir().unwrap();
        let built = dir.path().join("movie/reviewtext/m@p-0.00/00000000.safetensors");
        fs::create_dir_all(built.parent().unwrap()).unwrap();
        fs::write(&built, vec![0u8; 1000]).unwrap();
        let old = record(dir.path(), "old", 1000, 300);
        let mid = record(dir.path(), "mid", 1000, 200);
        let new = record(dir.path(), "new", 1000, 100);
        // Used just now: the oldest by creation, the newest by use.
        touch(&old);
        let budget = DiskBudget::new(dir.path(), None, 2500);
        let ev = budget.evict(0).unwrap();
        assert_eq!((ev.records, ev.bytes, ev.used), (2, 2000, 2000));
        assert!(built.is_file() && old.is_file() && !mid.exists() && !new.exists());
        // Room for 500 more bytes now; not for 1000 (only the touched record could go, and it is all that's left).
        assert!(budget.make_room(500).unwrap());
        let ev = budget.evict(1000).unwrap();
        assert_eq!(ev.records, 1);
        assert!(!old.exists() && built.is_file());
        assert!(!budget.make_room(2000).unwrap(), "the built repository alone leaves no room for 2000 bytes");
    }

    #[test]
    fn records_used_by_a_running_query_are_spared_until_its_lease_ends() {
        let dir = tempfile::tempdir().unwrap();
        let stale = record(dir.path(), "stale", 1000, 600);
        let budget = DiskBudget::new(dir.path(), None, 100);
        let lease = budget.lease().unwrap();
        let in_use = record(dir.path(), "in-use", 1000, 0);
        // Over budget, but the record used since the lease began stays; the stale one goes.
        let ev = budget.evict(0).unwrap();
        assert_eq!(ev.records, 1);
        assert!(!stale.exists() && in_use.is_file());
        assert!(!budget.make_room(10).unwrap(), "the budget cannot be met while the record is in use");
        drop(lease);
        let ev = budget.evict(0).unwrap();
        assert_eq!(ev.records, 1);
        assert!(!in_use.exists());
    }

    #[test]
    fn a_lease_left_by_a_dead_process_protects_nothing_and_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let budget = DiskBudget::new(dir.path(), None, 0);
        // What a killed query leaves: a lease file nobody holds a lock on.
        let leases = dir.path().join("adhoc/.leases");
        fs::create_dir_all(&leases).unwrap();
        let dead = leases.join("999999-0.lease");
        fs::write(&dead, "0").unwrap();
        let r = record(dir.path(), "r", 10, 0);
        budget.evict(0).unwrap();
        assert!(!dead.exists() && !r.exists());
    }

    #[test]
    #[cfg(unix)]
    fn temporaries_of_killed_writers_are_evicted_first_and_live_ones_stay() {
        let dir = tempfile::tempdir().unwrap();
        let r = record(dir.path(), "r", 100, 600);
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        let tmp = |pid: u32| r.with_file_name(format!(".x.safetensors.tmp{pid}-0"));
        fs::write(tmp(gone), vec![1u8; 1000]).unwrap();
        fs::write(tmp(std::process::id()), vec![1u8; 50]).unwrap();
        // Over budget by the dead writer's temporary alone: it goes, and the record (older than everything) stays.
        let budget = DiskBudget::new(dir.path(), None, 200);
        let ev = budget.evict(0).unwrap();
        assert_eq!((ev.temporaries, ev.records, ev.bytes, ev.used), (1, 0, 1000, 150));
        assert!(!tmp(gone).exists() && tmp(std::process::id()).exists() && r.exists());
    }

    #[test]
    fn a_lease_is_in_place_and_locked_when_taken() {
        let dir = tempfile::tempdir().unwrap();
        let budget = DiskBudget::new(dir.path(), None, 0);
        let lease = budget.lease().unwrap();
        let leases: Vec<_> = files(&budget.leases_dir()).unwrap().into_iter().map(|f| f.0).collect();
        assert_eq!(leases, std::slice::from_ref(&lease.path), "nothing left under the hidden name");
        assert!(budget.oldest_running().unwrap().is_some() && lease.path.exists());
        drop(lease);
        assert!(budget.oldest_running().unwrap().is_none());
        // One another process is placing (not locked yet) is neither taken for a dead query's nor removed.
        let placing = budget.leases_dir().join(".4242-0.lease");
        fs::write(&placing, "").unwrap();
        assert!(budget.oldest_running().unwrap().is_none() && placing.exists());
    }

    #[test]
    fn the_memo_counts_toward_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let memo = dir.path().join("memo");
        fs::create_dir_all(&memo).unwrap();
        fs::write(memo.join("op.jsonl"), vec![b'x'; 700]).unwrap();
        let kv = dir.path().join("kv");
        let r = record(&kv, "r", 500, 10);
        let budget = DiskBudget::new(&kv, Some(memo.clone()), 1000);
        assert_eq!(budget.usage().unwrap(), 1200);
        // A memo kept inside the KV directory is counted once.
        assert_eq!(DiskBudget::new(dir.path(), Some(memo), 1000).usage().unwrap(), 1200);
        budget.evict(0).unwrap();
        assert!(!r.exists());
        assert!(DiskBudget::default_limit(&dir.path().join("not/yet"), None).unwrap() > 0);
        let shared = super::shared(&dir.path().join("kv"), None, None).unwrap();
        assert!(std::sync::Arc::ptr_eq(&shared, &super::shared(&dir.path().join("kv"), None, None).unwrap()));
        assert!(shared.limit().unwrap() > 0);
    }
}
