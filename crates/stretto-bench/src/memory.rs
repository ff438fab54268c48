//! `stretto bench memory`: the peak resident memory and the disk use of one `stretto query` run, in a child process
//! with its own empty KV directory and memo (a first query: every cache is built), under a memory budget
//! (`--memory-budget`, working memory per model run) and a disk budget (`--disk-budget`, KV directory and memo).
//!
//! Peak memory is the child's `VmHWM` (Linux's high-water mark of its resident set), read from `/proc` while it
//! runs; disk is every file under the child's KV directory and memo when it has finished.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::experiments::Error;

/// What to run.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryOptions {
    /// Bundled dataset.
    pub dataset: String,
    /// The semantic query (operators joined by ` -- `).
    pub query: String,
    /// Rows of the dataset's tables read.
    pub rows: usize,
    /// Decoders of the LLM ladder (the last is gold).
    pub ladder: Vec<String>,
    /// `--memory-budget` of the query, bytes.
    pub memory_budget: u64,
    /// `--disk-budget` of the query, bytes.
    pub disk_budget: u64,
    /// The peak resident memory the run must stay under, bytes.
    pub rss_limit: u64,
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryReport {
    /// What ran, with its budgets and limit.
    #[serde(flatten)]
    pub options: MemoryOptions,
    /// Whether the query exited 0.
    pub succeeded: bool,
    /// Wall seconds of the run.
    pub seconds: f64,
    /// Peak resident memory of the child, bytes.
    pub peak_rss: u64,
    /// Bytes under the KV directory afterwards.
    pub kv_bytes: u64,
    /// Bytes under the memo afterwards.
    pub memo_bytes: u64,
    /// Rows of the result.
    pub result_rows: Option<u64>,
}

impl MemoryReport {
    /// Whether the run succeeded within both limits.
    pub fn respected(&self) -> bool {
        self.succeeded
            && self.peak_rss <= self.options.rss_limit
            && self.kv_bytes + self.memo_bytes <= self.options.disk_budget
    }
}

/// Runs the query with the `stretto` binary `exe` in `out` (which it empties first: `kv/`, `memo/`, `run/`, the
/// query's JSON and log).
pub fn measure(exe: &Path, o: &MemoryOptions, out: &Path) -> Result<MemoryReport, Error> {
    for d in ["kv", "memo", "run"] {
        match std::fs::remove_dir_all(out.join(d)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
    }
    std::fs::create_dir_all(out)?;
    let (kv, memo) = (out.join("kv"), out.join("memo"));
    let mut models = o.ladder.clone();
    models.push("minilm".into());
    let args: Vec<String> = vec![
        "query".into(),
        "--dataset".into(),
        o.dataset.clone(),
        "--query".into(),
        o.query.clone(),
        "--limit".into(),
        o.rows.to_string(),
        "--precision".into(),
        "0.8".into(),
        "--recall".into(),
        "0.8".into(),
        "--models".into(),
        models.join(","),
        "--ladder".into(),
        o.ladder.join(","),
        "--memory-budget".into(),
        o.memory_budget.to_string(),
        "--disk-budget".into(),
        o.disk_budget.to_string(),
        "--run-dir".into(),
        out.join("run").display().to_string(),
        "--json".into(),
    ];
    let start = Instant::now();
    let mut child = std::process::Command::new(exe)
        .args(&args)
        .env("STRETTO_KV_DIR", &kv)
        .env("STRETTO_MEMO_DIR", &memo)
        .stdout(std::fs::File::create(out.join("query.json"))?)
        .stderr(std::fs::File::create(out.join("query.log"))?)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let status_file = PathBuf::from(format!("/proc/{}/status", child.id()));
    let mut peak_rss = 0u64;
    let status = loop {
        // The high-water mark only grows, so its last reading before exit is the peak.
        if let Some(hwm) = std::fs::read_to_string(&status_file).ok().and_then(|s| vm_hwm(&s)) {
            peak_rss = peak_rss.max(hwm);
        }
        if let Some(status) = child.try_wait()? {
            break status;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let seconds = start.elapsed().as_secs_f64();
    let result_rows = std::fs::read_to_string(out.join("query.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["rows"].as_array().map(|r| r.len() as u64));
    Ok(MemoryReport {
        options: o.clone(),
        succeeded: status.success(),
        seconds,
        peak_rss,
        kv_bytes: stretto::doctor::tree_bytes(&kv)?,
        memo_bytes: stretto::doctor::tree_bytes(&memo)?,
        result_rows,
    })
}

/// `VmHWM` of a `/proc/<pid>/status` text, in bytes.
fn vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.trim_start_matches("VmHWM:").trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

/// The report as markdown.
pub fn markdown(r: &MemoryReport) -> String {
    let gb = |b: u64| b as f64 / 1e9;
    let o = &r.options;
    format!(
        "# Memory and disk of one cold `stretto query`\n\n\
         `{}` over the first {} rows of {}, ladder {}, empty KV directory and memo; {} build. Command: `stretto \
         bench memory --dataset {} --rows {} --memory-budget {} --disk-budget {} --rss-limit {}`.\n\n\
         | exit | seconds | peak resident | limit | KV directory | memo | disk budget | result rows | within both |\n\
         |---|---|---|---|---|---|---|---|---|\n\
         | {} | {:.1} | {:.2} GB | {:.2} GB | {:.2} GB | {:.4} GB | {:.2} GB | {} | {} |\n",
        o.query,
        o.rows,
        o.dataset,
        o.ladder.join(", "),
        if cfg!(debug_assertions) { "debug" } else { "release" },
        o.dataset,
        o.rows,
        o.memory_budget,
        o.disk_budget,
        o.rss_limit,
        if r.succeeded { "ok" } else { "failed (see query.log)" },
        r.seconds,
        gb(r.peak_rss),
        gb(o.rss_limit),
        gb(r.kv_bytes),
        gb(r.memo_bytes),
        gb(o.disk_budget),
        r.result_rows.map_or("-".into(), |n| n.to_string()),
        if r.respected() { "yes" } else { "no" },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_high_water_mark() {
        let status = "Name:\tstretto\nVmPeak:\t 9000 kB\nVmHWM:\t    2048 kB\nVmRSS:\t 1024 kB\n";
        assert_eq!(vm_hwm(status), Some(2048 * 1024));
        assert_eq!(vm_hwm("Name:\tx\n"), None);
    }
}
