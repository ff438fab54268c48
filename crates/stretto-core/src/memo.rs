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
                for line in BufReader::new(f).split(b'\n') {
                    let Ok(line) = line else { break };
                    // A torn line (crash mid-append, perhaps inside a character) is skipped, and only it: its
                    // answer is simply recomputed, and the lines appended after it are read.
                    if let Ok(e) = serde_json::from_slice::<MemoEntry>(&line) {
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

    /// Takes answers computed elsewhere (another process's memo, shipped with a plan) into memory, without writing
    /// them to this memo's file: this process reads them as its own until it ends. An answer already known is kept
    /// as it is. Returns how many were new.
    pub fn remember(&self, answers: impl IntoIterator<Item = MemoEntry>) -> usize {
        let Ok(mut entries) = self.entries.lock() else { return 0 };
        let mut new = 0;
        for e in answers {
            if let std::collections::hash_map::Entry::Vacant(v) = entries.entry(e.key.clone()) {
                v.insert(e);
                new += 1;
            }
        }
        new
    }

    /// Appends answers (all computed successfully) and syncs them to disk.
    pub fn put(&self, new: Vec<MemoEntry>) -> Result<()> {
        if new.is_empty() {
            return Ok(());
        }
        let mut entries = self.entries.lock().map_err(|_| CoreError::operator("memo", "memo lock poisoned"))?;
        if let Some(dir) = self.path.parent() {
            fs::create_dir_all(dir).map_err(|e| CoreError::Write { path: dir.to_path_buf(), source: e })?;
        }
        let mut text = String::new();
        for e in &new {
            text.push_str(&serde_json::to_string(e).map_err(|err| CoreError::operator("memo", err.to_string()))?);
            text.push('\n');
        }
        append_lines(&self.path, &text, true).map_err(|e| CoreError::Write { path: self.path.clone(), source: e })?;
        for e in new {
            entries.insert(e.key.clone(), e);
        }
        Ok(())
    }
}

/// Appends `text` (whole lines) to the file at `path`, starting a new line first where a crash left the last one
/// torn (so that the torn line stays the only one lost), and syncs it to disk if `sync`.
fn append_lines(path: &Path, text: &str, sync: bool) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = OpenOptions::new().create(true).read(true).append(true).open(path)?;
    let len = f.metadata()?.len();
    let mut torn = false;
    if len > 0 {
        f.seek(SeekFrom::Start(len - 1))?;
        let mut last = [0u8];
        f.read_exact(&mut last)?;
        torn = last[0] != b'\n';
    }
    let out = if torn { format!("\n{text}") } else { text.to_string() };
    // Append mode writes at the end whatever the read position.
    f.write_all(out.as_bytes())?;
    if sync {
        f.sync_data()?;
    }
    Ok(())
}

/// What each operator's answers cost per item and task: seconds per (operator, item), for the last few tasks.
///
/// An LLM operator's cost per item is mostly its question pass over the item's cached past, so another prompt over
/// the same items costs about the same: a query's pay check can read what earlier queries measured rather than ask
/// a candidate again. Every evaluation records into it (a memoised answer records the seconds it cost when
/// computed). It is shared by the registries built from one context (a session's queries, a benchmark's run), in
/// memory ([`CostRecord::default`]) or also in a JSON-lines file beside the memo ([`CostRecord::open`]), which later
/// processes read (a torn last line is skipped); items and tasks are kept by a digest of their text.
#[derive(Debug, Default)]
pub struct CostRecord {
    seconds: Mutex<HashMap<(String, Digest16), TaskFigures>>,
    /// The file figures are appended to, if any.
    path: Option<PathBuf>,
}

/// Per task, the seconds an answer cost and whether the figure was read from the file (recorded by an earlier
/// process), oldest first.
type TaskFigures = Vec<(Digest16, f64, bool)>;

/// The file name of a persisted [`CostRecord`] in a memo directory.
pub const COSTS_FILE: &str = "costs.jsonl";

/// The version of what [`CostRecord`]'s figures measure: lines of another version are not read (the figure is
/// simply measured again). Raise it when operators change how long an answer takes in a way the figures recorded
/// before would misstate. Version 1: an LLM map's free answer stops at the end of its first line, where it ran on
/// to its token limit before (lines without a version are of version 0).
pub const COST_FIGURES: u32 = 1;

/// One line of a persisted [`CostRecord`].
#[derive(serde::Serialize, serde::Deserialize)]
struct CostLine {
    op: String,
    item: String,
    task: String,
    seconds: f64,
    /// [`COST_FIGURES`] when it was recorded.
    #[serde(default)]
    v: u32,
}

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

    /// The digest as 32 lower-case hex digits.
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 32 || !s.is_ascii() {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Self(out))
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
    /// The record persisted in `path` (created on the first figure): what earlier processes recorded there, and
    /// every figure recorded from now on appended to it.
    pub fn open(path: &Path) -> Result<Self> {
        let mut m: HashMap<(String, Digest16), TaskFigures> = HashMap::new();
        match File::open(path) {
            Ok(f) => {
                for line in BufReader::new(f).split(b'\n') {
                    let Ok(line) = line else { break };
                    // A torn or foreign line is skipped: the figure is simply measured again.
                    let Ok(l) = serde_json::from_slice::<CostLine>(&line) else { continue };
                    if l.v != COST_FIGURES {
                        continue;
                    }
                    let (Some(item), Some(task)) = (Digest16::from_hex(&l.item), Digest16::from_hex(&l.task)) else {
                        continue;
                    };
                    if l.seconds.is_finite() && l.seconds >= 0.0 {
                        push_figure(m.entry((l.op, item)).or_default(), task, l.seconds, true);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(CoreError::io(path, e)),
        }
        Ok(Self { seconds: Mutex::new(m), path: Some(path.to_path_buf()) })
    }

    /// Records what `operator`'s answers to `task` on `items` cost, one figure per item (appending the new or
    /// changed figures to the file of a persisted record; a failed append only warns: the figures are a cache).
    pub fn record(&self, operator: &str, task: Digest16, items: &[String], seconds: &[f64]) {
        let Ok(mut m) = self.seconds.lock() else { return };
        let mut text = String::new();
        for (item, &s) in items.iter().zip(seconds) {
            let digest = Digest16::of(item);
            let figures = m.entry((operator.to_string(), digest)).or_default();
            let known = figures.iter().any(|&(t, old, _)| t == task && old == s);
            // Recorded by this process now, whether or not an earlier one recorded the same.
            push_figure(figures, task, s, false);
            if !known && self.path.is_some() {
                let line = CostLine {
                    op: operator.to_string(),
                    item: digest.hex(),
                    task: task.hex(),
                    seconds: s,
                    v: COST_FIGURES,
                };
                if let Ok(l) = serde_json::to_string(&line) {
                    text.push_str(&l);
                    text.push('\n');
                }
            }
        }
        drop(m);
        if let (Some(path), false) = (&self.path, text.is_empty()) {
            let append = || -> std::io::Result<()> {
                if let Some(dir) = path.parent() {
                    fs::create_dir_all(dir)?;
                }
                append_lines(path, &text, false)
            };
            if let Err(e) = append() {
                tracing::warn!(path = %path.display(), error = %e, "cost record not saved");
            }
        }
    }

    /// What `operator`'s answers on `items` cost as recorded, one figure per item: its answer to `task` where one
    /// is recorded, else its latest answer to another task. With `earlier_processes` false, only figures recorded
    /// by this process count. `None` unless every item has a figure.
    pub fn lookup(
        &self,
        operator: &str,
        task: Digest16,
        items: &[String],
        earlier_processes: bool,
    ) -> Option<Vec<RecordedCost>> {
        let m = self.seconds.lock().ok()?;
        items
            .iter()
            .map(|item| {
                let figures = m.get(&(operator.to_string(), Digest16::of(item)))?;
                let mut usable = figures.iter().filter(|f| earlier_processes || !f.2);
                let &(t, seconds, _) = usable.clone().find(|f| f.0 == task).or(usable.next_back())?;
                Some(RecordedCost { seconds, task: t })
            })
            .collect()
    }

    /// What `operator`'s answer to `task` on `item` cost, if recorded (by this process only, unless
    /// `earlier_processes`).
    pub fn figure(&self, operator: &str, task: Digest16, item: &str, earlier_processes: bool) -> Option<f64> {
        let m = self.seconds.lock().ok()?;
        m.get(&(operator.to_string(), Digest16::of(item)))?
            .iter()
            .find(|f| f.0 == task && (earlier_processes || !f.2))
            .map(|f| f.1)
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

/// Puts `task`'s figure last among `figures`, keeping the latest [`TASKS_KEPT`].
fn push_figure(figures: &mut TaskFigures, task: Digest16, seconds: f64, loaded: bool) {
    figures.retain(|f| f.0 != task);
    if figures.len() >= TASKS_KEPT {
        figures.remove(0);
    }
    figures.push((task, seconds, loaded));
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
        // An answer appended after the torn line is not lost with it.
        let k2 = memo_key("op", "is positive", "dull film");
        again
            .put(vec![MemoEntry { key: k2.clone(), score: Some(-1.0), value: None, confidence: None, seconds: 0.1 }])
            .unwrap();
        let third = Memo::open(dir.path(), "llm:x@y").unwrap();
        assert_eq!((third.len(), third.get(&k2).map(|e| e.score)), (2, Some(Some(-1.0))));
        // A line torn inside a character (a map's answer is any text) is no more than a torn line.
        OpenOptions::new()
            .append(true)
            .open(m.path())
            .unwrap()
            .write_all(b"{\"key\":\"x\",\"value\":\"caf\xc3")
            .unwrap();
        let k3 = memo_key("op", "is positive", "caf\u{e9} film");
        let v = Some("caf\u{e9}".to_string());
        third
            .put(vec![MemoEntry { key: k3.clone(), score: None, value: v.clone(), confidence: None, seconds: 0.1 }])
            .unwrap();
        let fourth = Memo::open(dir.path(), "llm:x@y").unwrap();
        assert_eq!((fourth.len(), fourth.get(&k3).and_then(|e| e.value)), (3, v), "answers after it are read");
    }

    #[test]
    fn a_cost_record_prefers_the_same_task_and_answers_only_where_every_item_has_a_figure() {
        let r = CostRecord::default();
        let items = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (t1, t2) = (Digest16::of("task one"), Digest16::of("task two"));
        r.record("op", t1, &items(&["a", "b"]), &[0.5, 0.25]);
        let secs = |v: Option<Vec<RecordedCost>>| v.map(|v| v.iter().map(|c| c.seconds).collect::<Vec<_>>());
        assert_eq!(secs(r.lookup("op", t1, &items(&["b", "a"]), true)), Some(vec![0.25, 0.5]));
        assert_eq!(r.lookup("op", t1, &items(&["a", "c"]), true), None);
        assert_eq!(r.lookup("other", t1, &items(&["a"]), true), None);
        // Another task's figure stands in where the task has none, and says whose it is.
        assert_eq!(r.lookup("op", t2, &items(&["a"]), true), Some(vec![RecordedCost { seconds: 0.5, task: t1 }]));
        r.record("op", t2, &items(&["a"]), &[0.75]);
        assert_eq!(secs(r.lookup("op", t1, &items(&["a"]), true)), Some(vec![0.5]), "the same task's figure first");
        assert_eq!(secs(r.lookup("op", t2, &items(&["a"]), true)), Some(vec![0.75]));
        assert_eq!(r.figure("op", t1, "a", true), Some(0.5));
        assert_eq!(r.figure("op", t2, "b", true), None);
        assert_eq!(r.len(), 3);
        for k in 0..20 {
            r.record("op", Digest16::of(&k.to_string()), &items(&["a"]), &[1.0]);
        }
        assert_eq!(r.len(), 1 + TASKS_KEPT, "a few tasks are kept per item");
    }

    #[test]
    fn a_persisted_cost_record_is_read_by_later_processes_and_skips_torn_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(COSTS_FILE);
        let items = vec!["a".to_string(), "b".to_string()];
        let task = Digest16::of("task");
        CostRecord::open(&path).unwrap().record("op", task, &items, &[0.5, 0.25]);
        // A crash in the middle of an append leaves a torn line.
        OpenOptions::new().append(true).open(&path).unwrap().write_all(br#"{"op":"op","item":"ab"#).unwrap();
        // And one torn inside a character, with a figure after it.
        OpenOptions::new().append(true).open(&path).unwrap().write_all(b"\n{\"op\":\"caf\xc3").unwrap();
        CostRecord::open(&path).unwrap().record("op", task, &["c".to_string()], &[0.125]);
        let later = CostRecord::open(&path).unwrap();
        assert_eq!(later.figure("op", task, "c", true), Some(0.125), "a figure after it is read");
        let secs = later.lookup("op", task, &items, true).unwrap();
        assert_eq!(secs.iter().map(|c| c.seconds).collect::<Vec<_>>(), vec![0.5, 0.25]);
        // A process pricing answers as a cold run would reads only what it recorded itself.
        assert_eq!(later.lookup("op", task, &items, false), None);
        assert_eq!(later.figure("op", task, "a", false), None);
        // Recording the same figure again (a memoised answer read back) appends nothing.
        let lines = || fs::read(&path).unwrap().iter().filter(|&&b| b == b'\n').count();
        let before = lines();
        later.record("op", task, &items[..1], &[0.5]);
        assert_eq!(lines(), before);
        later.record("op", task, &items[..1], &[0.75]);
        assert_eq!(lines(), before + 1);
        assert_eq!(later.figure("op", task, "a", false), Some(0.75));
        // A line of another version of the figures (here one written before versions: 0) is not read.
        let other = dir.path().join("other.jsonl");
        let hex = |d: Digest16| d.hex();
        let old = format!(
            "{{\"op\":\"op\",\"item\":\"{}\",\"task\":\"{}\",\"seconds\":2.0}}\n",
            hex(Digest16::of("a")),
            hex(task)
        );
        fs::write(&other, &old).unwrap();
        assert_eq!(CostRecord::open(&other).unwrap().figure("op", task, "a", true), None);
        fs::write(&other, old.replace("2.0}", &format!("2.0,\"v\":{COST_FIGURES}}}"))).unwrap();
        assert_eq!(CostRecord::open(&other).unwrap().figure("op", task, "a", true), Some(2.0));
        // Its directory is made on the first figure.
        let deeper = dir.path().join("new").join(COSTS_FILE);
        CostRecord::open(&deeper).unwrap().record("op", task, &items, &[1.0, 1.0]);
        assert_eq!(CostRecord::open(&deeper).unwrap().figure("op", task, "b", true), Some(1.0));
    }
}
