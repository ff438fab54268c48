//! A persistent memo of operator outputs, keyed by (operator, task prompt, item).
//!
//! Profiling runs every physical operator on a sample, execution then runs some of them again on the same tuples,
//! and benchmarks repeat queries: answers are worth keeping. Each operator has one append-only JSON-lines file;
//! an entry is written only after the answer was computed successfully (failures are never memoised), and a torn
//! last line from a crash is skipped on reading. Every entry keeps the seconds its answer cost, so a memoised
//! answer still reports an honest cost. A [`CostRecord`] keeps what answers cost per (operator, item) across tasks.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::{CoreError, Result};

/// One memoised answer.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MemoEntry {
    /// [`memo_key`] of (operator, prompt, item).
    pub key: String,
    /// Filter score.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// Map value (absent = no value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Map confidence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
    /// Seconds the answer cost when it was computed.
    pub seconds: f64,
}

/// The key of an answer: SHA-256 of the operator's identity, the task prompt and the item, length-prefixed so that
/// different splits of the same bytes never collide.
pub fn memo_key(operator: &str, prompt: &str, item: &str) -> String {
    let mut h = Sha256::new();
    for part in [operator, prompt, item] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// An operator's memo file, loaded in memory and appended to.
#[derive(Debug)]
pub struct Memo {
    path: PathBuf,
    entries: Mutex<HashMap<String, MemoEntry>>,
}

impl Memo {
    /// Opens (or starts) the memo of `operator` in `dir`.
    pub fn open(dir: &Path, operator: &str) -> Result<Self> {
        let safe: String =
            operator.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.@".contains(c) { c } else { '_' }).collect();
        let path = dir.join(format!("{safe}.jsonl"));
        let mut entries = HashMap::new();
        match File::open(&path) {
            Ok(f) => {
                for line in BufReader::new(f).lines() {
                    let Ok(line) = line else { break };
                    // A torn line (crash mid-append) is skipped: its answer is simply recomputed.
                    if let Ok(e) = serde_json::from_str::<MemoEntry>(&line) {
                        entries.insert(e.key.clone(), e);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(CoreError::io(&path, e)),
        }
        Ok(Self { path, entries: Mutex::new(entries) })
    }

    /// The memo file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A memoised answer.
    pub fn get(&self, key: &str) -> Option<MemoEntry> {
        self.entries.lock().ok().and_then(|m| m.get(key).cloned())
    }

    /// Whether it holds an answer under `key`.
    pub fn contains(&self, key: &str) -> bool {
        self.entries.lock().is_ok_and(|m| m.contains_key(key))
    }

    /// Number of answers.
    pub fn len(&self) -> usize {
        self.entries.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// Whether it holds no answer.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends answers (all computed successfully) and syncs them to disk.
    pub fn put(&self, new: Vec<MemoEntry>) -> Result<()> {
        if new.is_empty() {
            return Ok(());
        }
        let mut entries = self.entries.lock().map_err(|_| CoreError::operator("memo", "memo lock poisoned"))?;
        if let Some(dir) = self.path.parent() {
            fs::create_dir_all(dir).map_err(|e| CoreError::io(dir, e))?;
        }
        let mut text = String::new();
        for e in &new {
            text.push_str(&serde_json::to_string(e).map_err(|err| CoreError::operator("memo", err.to_string()))?);
            text.push('\n');
        }
        let mut f =
            OpenOptions::new().create(true).append(true).open(&self.path).map_err(|e| CoreError::io(&self.path, e))?;
        f.write_all(text.as_bytes()).map_err(|e| CoreError::io(&self.path, e))?;
        f.sync_data().map_err(|e| CoreError::io(&self.path, e))?;
        for e in new {
            entries.insert(e.key.clone(), e);
        }
        Ok(())
    }
}

/// What each operator's answers cost per item and task: seconds per (operator, item), for the last few tasks.
///
/// An LLM operator's cost per item is mostly its question pass over the item's cached past, so another prompt over
/// the same items costs about the same: a query's pay check can read what earlier queries measured rather than ask
/// a candidate again. Every evaluation records into it (a memoised answer records the seconds it cost when
/// computed). It lives in memory, shared by the registries built from one context (a session's queries, a
/// benchmark's run); items and tasks are kept by a digest of their text.
#[derive(Debug, Default)]
pub struct CostRecord {
    seconds: Mutex<HashMap<(String, Digest16), TaskFigures>>,
}

/// Per task, the seconds an answer cost, oldest first.
type TaskFigures = Vec<(Digest16, f64)>;

/// Tasks a [`CostRecord`] keeps figures of per (operator, item), the latest.
const TASKS_KEPT: usize = 8;

/// The first 16 bytes of a SHA-256 digest: how a [`CostRecord`] names an item or a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest16([u8; 16]);

impl Digest16 {
    /// The digest of `text`.
    pub fn of(text: &str) -> Self {
        let d = Sha256::digest(text.as_bytes());
        let mut out = [0u8; 16];
        out.copy_from_slice(&d[..16]);
        Self(out)
    }
}

/// One recorded figure: seconds an answer cost, and the task it answered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecordedCost {
    /// Seconds.
    pub seconds: f64,
    /// The task it answered.
    pub task: Digest16,
}

/// A record is what was measured, not a setting: contexts that differ only in it compare equal.
impl PartialEq for CostRecord {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl CostRecord {
    /// Records what `operator`'s answers to `task` on `items` cost, one figure per item.
    pub fn record(&self, operator: &str, task: Digest16, items: &[String], seconds: &[f64]) {
        let Ok(mut m) = self.seconds.lock() else { return };
        for (item, &s) in items.iter().zip(seconds) {
            let figures = m.entry((operator.to_string(), Digest16::of(item))).or_default();
            figures.retain(|(t, _)| *t != task);
            if figures.len() >= TASKS_KEPT {
                figures.remove(0);
            }
            figures.push((task, s));
        }
    }

    /// What `operator`'s answers on `items` cost as recorded, one figure per item: its answer to `task` where one
    /// is recorded, else its latest answer to another task. `None` unless every item has a figure.
    pub fn lookup(&self, operator: &str, task: Digest16, items: &[String]) -> Option<Vec<RecordedCost>> {
        let m = self.seconds.lock().ok()?;
        items
            .iter()
            .map(|item| {
                let figures = m.get(&(operator.to_string(), Digest16::of(item)))?;
                let &(t, seconds) = figures.iter().find(|(t, _)| *t == task).or(figures.last())?;
                Some(RecordedCost { seconds, task: t })
            })
            .collect()
    }

    /// What `operator`'s answer to `task` on `item` cost, if recorded.
    pub fn figure(&self, operator: &str, task: Digest16, item: &str) -> Option<f64> {
        let m = self.seconds.lock().ok()?;
        m.get(&(operator.to_string(), Digest16::of(item)))?.iter().find(|(t, _)| *t == task).map(|(_, s)| *s)
    }

    /// Figures recorded.
    pub fn len(&self) -> usize {
        self.seconds.lock().map(|m| m.values().map(Vec::len).sum()).unwrap_or(0)
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_persist_and_torn_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let m = Memo::open(dir.path(), "llm:x@y").unwrap();
        let k = memo_key("op", "is positive", "great film");
        assert_ne!(k, memo_key("op", "is positiv", "egreat film"));
        m.put(vec![MemoEntry { key: k.clone(), score: Some(1.5), value: None, confidence: None, seconds: 0.2 }])
            .unwrap();
        // A crash in the middle of an append leaves a torn line.
        let mut f = OpenOptions::new().append(true).open(m.path()).unwrap();
        f.write_all(br#"{"key":"abc","sco"#).unwrap();
        drop(f);
        let again = Memo::open(dir.path(), "llm:x@y").unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(again.get(&k).unwrap().score, Some(1.5));
        assert!(again.get("abc").is_none());
    }

    #[test]
    fn a_cost_record_prefers_the_same_task_and_answers_only_where_every_item_has_a_figure() {
        let r = CostRecord::default();
        let items = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (t1, t2) = (Digest16::of("task one"), Digest16::of("task two"));
        r.record("op", t1, &items(&["a", "b"]), &[0.5, 0.25]);
        let secs = |v: Option<Vec<RecordedCost>>| v.map(|v| v.iter().map(|c| c.seconds).collect::<Vec<_>>());
        assert_eq!(secs(r.lookup("op", t1, &items(&["b", "a"]))), Some(vec![0.25, 0.5]));
        assert_eq!(r.lookup("op", t1, &items(&["a", "c"])), None);
        assert_eq!(r.lookup("other", t1, &items(&["a"])), None);
        // Another task's figure stands in where the task has none, and says whose it is.
        assert_eq!(r.lookup("op", t2, &items(&["a"])), Some(vec![RecordedCost { seconds: 0.5, task: t1 }]));
        r.record("op", t2, &items(&["a"]), &[0.75]);
        assert_eq!(secs(r.lookup("op", t1, &items(&["a"]))), Some(vec![0.5]), "the same task's figure first");
        assert_eq!(secs(r.lookup("op", t2, &items(&["a"]))), Some(vec![0.75]));
        assert_eq!(r.figure("op", t1, "a"), Some(0.5));
        assert_eq!(r.figure("op", t2, "b"), None);
        assert_eq!(r.len(), 3);
        for k in 0..20 {
            r.record("op", Digest16::of(&k.to_string()), &items(&["a"]), &[1.0]);
        }
        assert_eq!(r.len(), 1 + TASKS_KEPT, "a few tasks are kept per item");
    }
}
