//! `stretto bench memory`: the peak resident memory and the disk use of one `stretto query` run, in a child process
//! with its own empty KV directory and memo (a first query: every cache is built), under a memory budget
//! (`--memory-budget`, working memory per model run) and a disk budget (`--disk-budget`, KV directory and memo).
//!
//! Peak memory is the child's `VmHWM` (Linux's high-water mark of its resident set), read from `/proc` while it
//! runs; disk is every file under the child's KV directory and memo when it has finished. The result is scored
//! against the dataset's true labels (`--label-column`, the query's own option), so that a run within its budgets
//! says how right it was too.
//!
//! A long measurement (all 1000 emails take hours on two cores) may be interrupted: `--resume` keeps what the
//! earlier run left (caches, memoised answers, the query's log) and runs the same query again, which carries on from
//! what was finished. Every run is a *segment*: its seconds and peak resident memory are written to
//! `segments.json` every few seconds while it runs (so a killed run leaves its figures), and the report gives the
//! peak over all segments and their summed seconds.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::experiments::Error;

/// What to run (also the arguments of `stretto bench memory`, whose defaults are these fields' `default_value`s).
#[derive(Debug, Clone, Serialize, clap::Args)]
pub struct MemoryOptions {
    /// Bundled dataset.
    #[arg(long, default_value = "email")]
    pub dataset: String,
    /// The semantic query (operators joined by ` -- `).
    #[arg(
        long,
        default_value = "{emails.text} refers to a fraudulent scheme (i.e., 'Raptor', 'Deathstar', 'Chewco', and/or 'Fat Boy')"
    )]
    pub query: String,
    /// Rows of the dataset's tables read (1000: all the bundled emails).
    #[arg(long, default_value_t = 1000)]
    pub rows: usize,
    /// Decoders of the LLM ladder, smallest first (the last is gold).
    #[arg(long, value_delimiter = ',', default_value = "smollm2-135m,qwen2.5-coder-0.5b")]
    pub ladder: Vec<String>,
    /// The query's --memory-budget (working memory per model run), bytes. Half the query's default: both
    /// models' f32 weights stay loaded (some 2.5 GB with the default ladder), and a run over the longest emails
    /// took the query's own peak to 3.73 GB at 1 GiB while the 0.5B alone was loaded.
    #[arg(long, default_value_t = 1 << 29)]
    pub memory_budget: u64,
    /// The query's --disk-budget (KV directory and memo), bytes.
    #[arg(long, default_value_t = 10_000_000_000)]
    pub disk_budget: u64,
    /// Peak resident memory the run must stay under, bytes.
    #[arg(long, default_value_t = 4_000_000_000)]
    pub rss_limit: u64,
    /// The bundled label column the result is scored against (the query's --label-column; empty: none).
    // The full path keeps clap from reading the field as an optional flag: it always has a value, `None` for "".
    #[arg(long, default_value = "fraudulent", value_parser = label_column)]
    pub label_column: ::std::option::Option<String>,
}

/// `--label-column`'s parser: empty names no column.
fn label_column(s: &str) -> std::result::Result<Option<String>, std::convert::Infallible> {
    Ok((!s.is_empty()).then(|| s.to_string()))
}

/// One run of the query within a measurement (more than one when it was interrupted and resumed).
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct Segment {
    /// Wall seconds the run took (or had taken when last recorded, if it was killed).
    pub seconds: f64,
    /// The run's peak resident memory, bytes.
    pub peak_rss: u64,
    /// Whether the run ended (exited, with any status) rather than being killed with the bench.
    pub ended: bool,
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryReport {
    /// What ran, with its budgets and limit.
    #[serde(flatten)]
    pub options: MemoryOptions,
    /// Whether the query exited 0.
    pub succeeded: bool,
    /// Wall seconds of the run, summed over its segments.
    pub seconds: f64,
    /// Peak resident memory of the child, bytes: the highest of its segments.
    pub peak_rss: u64,
    /// The runs the measurement took, in order (one unless it was interrupted and resumed).
    pub segments: Vec<Segment>,
    /// Bytes under the KV directory afterwards.
    pub kv_bytes: u64,
    /// Bytes under the memo afterwards.
    pub memo_bytes: u64,
    /// Rows of the result.
    pub result_rows: Option<u64>,
    /// Precision, recall and F1 of the result against the true labels (`label_column`).
    pub truth: Option<crate::experiments::TruthFigures>,
    /// Whether the plan that ran was gold's (its cost measured, not estimated).
    pub gold_ran: Option<bool>,
    /// What the query said about its KV caches (deferral, prefills and their prices), if anything.
    pub kv_note: Option<String>,
}

/// What the query's `--json` report says that the measurement reports: result rows, truth figures, whether gold
/// ran, the caches' note. All `None` where the report is missing or unreadable (a killed or failed run).
fn read_result(json: &str) -> (Option<u64>, Option<crate::experiments::TruthFigures>, Option<bool>, Option<String>) {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(json) else { return (None, None, None, None) };
    (
        v["rows"].as_array().map(|r| r.len() as u64),
        crate::experiments::TruthFigures::of(&v["truth"]["plan"]),
        v["cost"]["gold_measured"].as_bool(),
        v["kv_caches"].as_str().map(String::from),
    )
}

impl MemoryReport {
    /// Whether the run succeeded within both limits.
    pub fn respected(&self) -> bool {
        self.succeeded
            && self.peak_rss <= self.options.rss_limit
            && self.kv_bytes + self.memo_bytes <= self.options.disk_budget
    }
}

/// The segments file of a measurement folder.
fn segments_path(out: &Path) -> PathBuf {
    out.join("segments.json")
}

/// The segments an earlier, interrupted measurement in `out` recorded (none when there is no file).
pub fn read_segments(out: &Path) -> Result<Vec<Segment>, Error> {
    match std::fs::read_to_string(segments_path(out)) {
        Ok(t) => serde_json::from_str(&t)
            .map_err(|e| format!("{} is not a segments record: {e}", segments_path(out).display()).into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// Writes the segments whole (a temporary file renamed over the old), so a kill never leaves half a record.
fn write_segments(out: &Path, segments: &[Segment]) -> Result<(), Error> {
    let tmp = out.join("segments.json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(segments).map_err(|e| e.to_string())?)?;
    std::fs::rename(&tmp, segments_path(out))?;
    Ok(())
}

/// The `stretto query` arguments of a measurement writing into `out`.
fn query_args(o: &MemoryOptions, out: &Path) -> Vec<String> {
    let mut models = o.ladder.clone();
    models.push("minilm".into());
    let mut args: Vec<String> = vec![
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
    if let Some(c) = &o.label_column {
        args.extend(["--label-column".into(), c.clone()]);
    }
    args
}

/// Runs the query with the `stretto` binary `exe` in `out`. Without `resume` it empties `out` first (`kv/`,
/// `memo/`, `run/`, the segments); with it, it keeps what an interrupted measurement left and adds a segment.
pub fn measure(exe: &Path, o: &MemoryOptions, out: &Path, resume: bool) -> Result<MemoryReport, Error> {
    let mut segments = if resume { read_segments(out)? } else { Vec::new() };
    if !resume {
        for d in ["kv", "memo", "run"] {
            match std::fs::remove_dir_all(out.join(d)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
        match std::fs::remove_file(segments_path(out)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
    }
    std::fs::create_dir_all(out)?;
    let (kv, memo) = (out.join("kv"), out.join("memo"));
    let args = query_args(o, out);
    let start = Instant::now();
    let mut child = std::process::Command::new(exe)
        .args(&args)
        .env("STRETTO_KV_DIR", &kv)
        .env("STRETTO_MEMO_DIR", &memo)
        .stdout(std::fs::File::create(out.join("query.json"))?)
        .stderr(
            std::fs::File::options()
                .create(true)
                .append(resume)
                .write(true)
                .truncate(!resume)
                .open(out.join("query.log"))?,
        )
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let status_file = PathBuf::from(format!("/proc/{}/status", child.id()));
    segments.push(Segment { seconds: 0.0, peak_rss: 0, ended: false });
    let mut last_record = Instant::now();
    let status = loop {
        let current = segments.last_mut().expect("pushed above");
        // The high-water mark only grows, so its last reading before exit is the peak.
        if let Some(hwm) = std::fs::read_to_string(&status_file).ok().and_then(|s| vm_hwm(&s)) {
            current.peak_rss = current.peak_rss.max(hwm);
        }
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if last_record.elapsed() >= Duration::from_secs(5) {
            current.seconds = start.elapsed().as_secs_f64();
            write_segments(out, &segments)?;
            last_record = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let current = segments.last_mut().expect("pushed above");
    current.seconds = start.elapsed().as_secs_f64();
    current.ended = true;
    write_segments(out, &segments)?;
    let (result_rows, truth, gold_ran, kv_note) =
        read_result(&std::fs::read_to_string(out.join("query.json")).unwrap_or_default());
    Ok(MemoryReport {
        options: o.clone(),
        succeeded: status.success(),
        seconds: segments.iter().map(|s| s.seconds).sum(),
        peak_rss: segments.iter().map(|s| s.peak_rss).max().unwrap_or(0),
        segments,
        kv_bytes: stretto::doctor::tree_bytes(&kv)?,
        memo_bytes: stretto::doctor::tree_bytes(&memo)?,
        result_rows,
        truth,
        gold_ran,
        kv_note,
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
         bench memory --dataset {} --rows {} --memory-budget {} --disk-budget {} --rss-limit {}{}`.\n\n\
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
        o.label_column.as_ref().map_or(String::new(), |c| format!(" --label-column {c}")),
        if r.succeeded { "ok" } else { "failed (see query.log)" },
        r.seconds,
        gb(r.peak_rss),
        gb(o.rss_limit),
        gb(r.kv_bytes),
        gb(r.memo_bytes),
        gb(o.disk_budget),
        r.result_rows.map_or("-".into(), |n| n.to_string()),
        if r.respected() { "yes" } else { "no" },
    ) + &result_markdown(r)
        + &segments_markdown(&r.segments)
}

/// How right the result is against the true labels, which plan ran, and what the query said about its caches.
fn result_markdown(r: &MemoryReport) -> String {
    let mut t = String::new();
    if let (Some(c), Some(f)) = (&r.options.label_column, r.truth) {
        let fig = |x: Option<f64>| x.map_or("n/a".into(), |x| format!("{x:.3}"));
        t += &format!(
            "\nAgainst the true labels (`{c}`): precision {}, recall {}, F1 {}.\n",
            fig(f.precision),
            fig(f.recall),
            fig(f.f1)
        );
    }
    match r.gold_ran {
        Some(true) => t += "\nThe plan that ran is gold's, on every tuple.\n",
        Some(false) => t += "\nA plan cheaper than gold ran (optimized on the profiling sample).\n",
        None => {}
    }
    if let Some(note) = &r.kv_note {
        t += &format!("\nKV caches, as the query reported them: {note}.\n");
    }
    t
}

/// The segments of an interrupted and resumed measurement (nothing when it ran once).
fn segments_markdown(segments: &[Segment]) -> String {
    if segments.len() < 2 {
        return String::new();
    }
    let mut t = format!(
        "\nThe measurement ran in {} segments: after each, `--resume` ran the same query again over what the \
         earlier ones left (caches, memoised answers), whether the earlier was killed with the bench or exited. \
         Peak resident memory above is the highest of the segments; seconds are their sum.\n\n\
         | segment | seconds | peak resident | ended |\n|---|---|---|---|\n",
        segments.len()
    );
    for (i, s) in segments.iter().enumerate() {
        t += &format!(
            "| {} | {:.1} | {:.2} GB | {} |\n",
            i + 1,
            s.seconds,
            s.peak_rss as f64 / 1e9,
            if s.ended { "exited" } else { "killed" }
        );
    }
    t
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

    #[test]
    fn the_arguments_default_to_the_1000_email_run_and_an_empty_label_column_names_none() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            o: MemoryOptions,
        }
        use clap::Parser;
        let o = Cli::try_parse_from(["bench"]).unwrap().o;
        assert_eq!((o.dataset.as_str(), o.rows, o.memory_budget, o.rss_limit), ("email", 1000, 1 << 29, 4_000_000_000));
        assert_eq!(o.ladder, ["smollm2-135m", "qwen2.5-coder-0.5b"]);
        assert_eq!(o.label_column.as_deref(), Some("fraudulent"));
        let o = Cli::try_parse_from(["bench", "--label-column", "", "--ladder", "a,b,c"]).unwrap().o;
        assert_eq!((o.label_column, o.ladder.len()), (None, 3));
        let o = Cli::try_parse_from(["bench", "--label-column", "mentions_entity"]).unwrap().o;
        assert_eq!(o.label_column.as_deref(), Some("mentions_entity"));
    }

    #[test]
    fn the_result_is_scored_against_the_labels_and_its_figures_reported() {
        let mut o = MemoryOptions {
            dataset: "email".into(),
            query: "{emails.text} is spam".into(),
            rows: 3,
            ladder: vec!["smollm2-135m".into()],
            memory_budget: 1 << 30,
            disk_budget: 1 << 30,
            rss_limit: 1 << 30,
            label_column: Some("fraudulent".into()),
        };
        let args = query_args(&o, Path::new("/m"));
        let at = args.iter().position(|a| a == "--label-column").expect("the label column is passed on");
        assert_eq!(args[at + 1], "fraudulent");
        assert_eq!(args[args.iter().position(|a| a == "--run-dir").unwrap() + 1], "/m/run");
        o.label_column = None;
        assert!(!query_args(&o, Path::new("/m")).contains(&"--label-column".to_string()));
        o.label_column = Some("fraudulent".into());

        let json = r#"{"rows": [{"a": 1}, {"a": 2}], "truth": {"plan": {"precision": 0.5, "recall": 1.0, "f1": 0.6667}},
            "cost": {"gold_measured": true}, "kv_caches": "deferred"}"#;
        let (rows, truth, gold_ran, note) = read_result(json);
        assert_eq!((rows, gold_ran, note.as_deref()), (Some(2), Some(true), Some("deferred")));
        assert_eq!(truth.unwrap().recall, Some(1.0));
        assert_eq!(read_result(""), (None, None, None, None), "a killed run's empty report reads as nothing");

        let r = MemoryReport {
            options: o,
            succeeded: true,
            seconds: 1.0,
            peak_rss: 1,
            segments: vec![],
            kv_bytes: 0,
            memo_bytes: 0,
            result_rows: rows,
            truth,
            gold_ran,
            kv_note: note,
        };
        let md = markdown(&r);
        assert!(
            md.contains("Against the true labels (`fraudulent`): precision 0.500, recall 1.000, F1 0.667."),
            "{md}"
        );
        assert!(md.contains("--label-column fraudulent`") && md.contains("gold's, on every tuple"), "{md}");
        assert!(md.contains("as the query reported them: deferred."), "{md}");
    }

    #[test]
    fn a_resumed_measurement_keeps_the_earlier_segments_and_a_fresh_one_drops_them() {
        let out = tempfile::tempdir().unwrap();
        let killed = Segment { seconds: 12.5, peak_rss: 3_000_000_000, ended: false };
        write_segments(out.path(), std::slice::from_ref(&killed)).unwrap();
        assert_eq!(read_segments(out.path()).unwrap(), vec![killed.clone()]);
        std::fs::write(segments_path(out.path()), "{ half").unwrap();
        assert!(read_segments(out.path()).is_err(), "a broken record is an error, not an empty history");
        write_segments(out.path(), &[killed.clone(), Segment { seconds: 1.0, peak_rss: 1, ended: true }]).unwrap();
        let md = segments_markdown(&read_segments(out.path()).unwrap());
        assert!(md.contains("2 segments") && md.contains("| 1 | 12.5 | 3.00 GB | killed |"), "{md}");
        assert_eq!(segments_markdown(std::slice::from_ref(&killed)), "");

        // A run (here `true`, which ignores the query's arguments) adds a segment when resuming and starts afresh
        // otherwise.
        write_segments(out.path(), std::slice::from_ref(&killed)).unwrap();
        let o = MemoryOptions {
            dataset: "email".into(),
            query: "{emails.text} is spam".into(),
            rows: 1,
            ladder: vec!["smollm2-135m".into()],
            memory_budget: 1 << 30,
            disk_budget: 1 << 30,
            rss_limit: 1 << 30,
            label_column: None,
        };
        let exe = Path::new("/bin/true");
        let resumed = measure(exe, &o, out.path(), true).unwrap();
        assert_eq!(resumed.segments.len(), 2);
        assert_eq!(resumed.segments[0], killed);
        assert!(resumed.segments[1].ended && resumed.succeeded);
        assert_eq!(resumed.peak_rss, killed.peak_rss, "the peak is the highest segment's");
        assert!(resumed.seconds >= killed.seconds);
        assert_eq!(read_segments(out.path()).unwrap(), resumed.segments, "the record holds every segment");
        let fresh = measure(exe, &o, out.path(), false).unwrap();
        assert_eq!(fresh.segments.len(), 1);
        assert!(fresh.peak_rss < killed.peak_rss);
    }
}
