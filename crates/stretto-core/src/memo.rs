//! A persistent memo of operator outputs, keyed by (operator, task prompt, item).
//!
//! Profiling runs every physical operator on a sample, execution then runs some of them again on the same tuples,
//! and benchmarks repeat queries: answers are worth keeping. Each operator has one append-only JSON-lines file;
//! an entry is written only after the answer was computed successfully (failures are never memoised), and a torn
//! last line from a crash is skipped on reading. Every entry keeps the seconds its answer cost, so a memoised
//! answer still reports an honest cost.

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
}
