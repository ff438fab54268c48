//! SemBench's movie scenario in Stretto SQL, scored against the bundled labels.
//!
//! A scenario folder holds `Q<n>.sql` files (Stretto SQL, one or more statements; the last one's result is the
//! answer) and, beside them, `truth/Q<n>.sql`: the same question answered relationally from the labels. Each query
//! file says how its answer is scored, in a comment line:
//!
//! - `-- score: rows K`: a set of rows of which any `K` right ones are a full answer (`LIMIT K`): precision over the
//!   rows returned, recall over `min(K, |truth|)`, F1;
//! - `-- score: rows`: every right row is wanted: precision, recall and F1 against all truth rows;
//! - `-- score: value`: numbers (the last column), keyed by the other columns: the mean relative error over the
//!   truth's keys (a missing key counts as an error of 1);
//! - `-- score: rank`: a score per key (first column, score in the last): Spearman's rho with the truth's scores
//!   over the keys both have.
//!
//! Rows are compared by position, as text, so column names need not match.
//!
//! ```
//! use stretto_bench::sembench::{scoring_of, Scoring};
//! assert_eq!(scoring_of("-- score: rows 5\nSELECT 1").unwrap(), Scoring::Rows { limit: Some(5) });
//! assert!(scoring_of("SELECT 1").is_err());
//! ```

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use arrow::array::{Array, RecordBatch};
use arrow::util::display::array_value_to_string;
use serde::{Deserialize, Serialize};
use stretto_core::metrics::spearman;

/// What went wrong with a scenario.
#[derive(Debug, thiserror::Error)]
pub enum SembenchError {
    /// A query file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A query file does not say how it is scored, or says it in a way this module does not know.
    #[error("{0}")]
    Scoring(String),
    /// A query or its truth failed.
    #[error("{name}: {source}")]
    Sql {
        /// `Q3` or `truth/Q3`.
        name: String,
        /// Why.
        #[source]
        source: stretto_sql::SqlError,
    },
}

/// A result of this module.
pub type Result<T, E = SembenchError> = std::result::Result<T, E>;

/// How a query's answer is scored against its truth (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Scoring {
    /// A set of rows; `limit`: any that many right rows are a full answer.
    Rows {
        /// The query's LIMIT.
        limit: Option<usize>,
    },
    /// Numbers keyed by the other columns: mean relative error.
    Value,
    /// Scores per key: Spearman's rho.
    Rank,
}

/// The `-- score: ...` line of a query file.
pub fn scoring_of(sql: &str) -> Result<Scoring> {
    let line = sql
        .lines()
        .find_map(|l| l.trim().strip_prefix("--").map(str::trim).and_then(|l| l.strip_prefix("score:")))
        .ok_or_else(|| SembenchError::Scoring("no `-- score: rows [K] | value | rank` line".into()))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["rows"] => Ok(Scoring::Rows { limit: None }),
        ["rows", k] => k
            .parse()
            .ok()
            .filter(|k| *k > 0)
            .map(|k| Scoring::Rows { limit: Some(k) })
            .ok_or_else(|| SembenchError::Scoring(format!("`-- score: rows {k}`: K must be a positive integer"))),
        ["value"] => Ok(Scoring::Value),
        ["rank"] => Ok(Scoring::Rank),
        _ => Err(SembenchError::Scoring(format!("unknown scoring `{line}`: rows [K], value or rank"))),
    }
}

/// How right one answer is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "metric", rename_all = "snake_case")]
pub enum Score {
    /// Row answers.
    F1 {
        /// Right rows over rows returned (1 when none were returned).
        precision: f64,
        /// Right rows over the rows wanted.
        recall: f64,
        /// Their harmonic mean.
        f1: f64,
    },
    /// Number answers: mean relative error (0 is exact).
    RelativeError {
        /// The error.
        relative_error: f64,
    },
    /// Rankings.
    Spearman {
        /// Spearman's rank correlation (NaN with fewer than two common keys or a constant side).
        rho: f64,
        /// Keys the answer and the truth both score.
        common: usize,
        /// Keys the truth scores.
        truth: usize,
    },
}

impl Score {
    /// The headline number: F1, relative error or rho.
    pub fn headline(&self) -> (&'static str, f64) {
        match self {
            Score::F1 { f1, .. } => ("F1", *f1),
            Score::RelativeError { relative_error } => ("relative error", *relative_error),
            Score::Spearman { rho, .. } => ("Spearman rho", *rho),
        }
    }
}

fn cells(batch: &RecordBatch, row: usize, columns: std::ops::Range<usize>) -> Vec<String> {
    columns
        .map(|c| {
            let a = batch.column(c);
            if a.is_null(row) {
                String::new()
            } else {
                array_value_to_string(a, row).unwrap_or_default()
            }
        })
        .collect()
}

fn number(batch: &RecordBatch, row: usize, column: usize) -> Option<f64> {
    let a = batch.column(column);
    if a.is_null(row) {
        return None;
    }
    array_value_to_string(a, row).ok()?.trim().parse().ok()
}

fn check_width(answer: &RecordBatch, truth: &RecordBatch) -> Result<()> {
    if answer.num_columns() != truth.num_columns() || truth.num_columns() == 0 {
        return Err(SembenchError::Scoring(format!(
            "the answer has {} columns and the truth {}: they are compared by position",
            answer.num_columns(),
            truth.num_columns()
        )));
    }
    Ok(())
}

/// Scores `answer` against `truth`.
pub fn score(scoring: Scoring, answer: &RecordBatch, truth: &RecordBatch) -> Result<Score> {
    check_width(answer, truth)?;
    let width = truth.num_columns();
    match scoring {
        Scoring::Rows { limit } => {
            let truth: HashSet<Vec<String>> = (0..truth.num_rows()).map(|r| cells(truth, r, 0..width)).collect();
            let answer: HashSet<Vec<String>> = (0..answer.num_rows()).map(|r| cells(answer, r, 0..width)).collect();
            let right = answer.intersection(&truth).count() as f64;
            let wanted = limit.map_or(truth.len(), |k| k.min(truth.len()));
            let precision = if answer.is_empty() { 1.0 } else { right / answer.len() as f64 };
            // More rows than the LIMIT wants cannot recall more than all of it.
            let recall = if wanted == 0 { 1.0 } else { right.min(wanted as f64) / wanted as f64 };
            let f1 = if precision + recall > 0.0 { 2.0 * precision * recall / (precision + recall) } else { 0.0 };
            Ok(Score::F1 { precision, recall, f1 })
        }
        Scoring::Value => {
            let answer: HashMap<Vec<String>, Option<f64>> = (0..answer.num_rows())
                .map(|r| (cells(answer, r, 0..width - 1), number(answer, r, width - 1)))
                .collect();
            let mut errors = Vec::new();
            for r in 0..truth.num_rows() {
                let Some(t) = number(truth, r, width - 1) else { continue };
                let e = match answer.get(&cells(truth, r, 0..width - 1)).copied().flatten() {
                    Some(p) if t != 0.0 => (p - t).abs() / t.abs(),
                    Some(p) => p.abs(),
                    None => 1.0,
                };
                errors.push(e);
            }
            if errors.is_empty() {
                return Err(SembenchError::Scoring("the truth has no number to compare with".into()));
            }
            Ok(Score::RelativeError { relative_error: errors.iter().sum::<f64>() / errors.len() as f64 })
        }
        Scoring::Rank => {
            let answer: HashMap<String, f64> = (0..answer.num_rows())
                .filter_map(|r| Some((cells(answer, r, 0..1).remove(0), number(answer, r, width - 1)?)))
                .collect();
            let mut pairs = Vec::new();
            let mut scored = 0;
            for r in 0..truth.num_rows() {
                let Some(t) = number(truth, r, width - 1) else { continue };
                scored += 1;
                if let Some(p) = answer.get(&cells(truth, r, 0..1)[0]) {
                    pairs.push((*p, t));
                }
            }
            let (a, t): (Vec<f64>, Vec<f64>) = pairs.into_iter().unzip();
            Ok(Score::Spearman { rho: spearman(&a, &t), common: a.len(), truth: scored })
        }
    }
}

/// One query of a scenario, run and scored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueryRun {
    /// `Q1` ...
    pub name: String,
    /// How it was scored.
    pub scoring: Scoring,
    /// The score against the truth.
    pub score: Score,
    /// Rows of the answer, and of the truth.
    pub rows: usize,
    /// Rows of the truth.
    pub truth_rows: usize,
    /// Wall-clock seconds of every statement of the query (models loaded, caches built, profiling, execution).
    pub seconds: f64,
    /// What each semantic pipeline did: plan, bounds, executed tuples, seconds per phase.
    pub pipelines: Vec<String>,
    /// Seconds per phase, summed over the query's pipelines.
    pub phases: std::collections::BTreeMap<String, f64>,
}

/// The `Q<n>.sql` files of a scenario folder, in numeric order.
pub fn query_files(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let read = |e: std::io::Error| SembenchError::Read { path: dir.to_path_buf(), source: e };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read)? {
        let path = entry.map_err(read)?.path();
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
        let number = stem.strip_prefix('Q').and_then(|n| n.parse::<u32>().ok());
        if let (Some(n), Some("sql")) = (number, path.extension().and_then(|e| e.to_str())) {
            files.push((n, stem, path));
        }
    }
    if files.is_empty() {
        return Err(SembenchError::Scoring(format!("no Q<n>.sql file in {}", dir.display())));
    }
    files.sort();
    Ok(files.into_iter().map(|(_, s, p)| (s, p)).collect())
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| SembenchError::Read { path: path.to_path_buf(), source: e })
}

/// Runs `sql` (every statement; the last one's rows are the answer) in a fresh SQL context over `session`, so
/// tables one query creates do not meet the next.
fn answer(
    session: &stretto::Session,
    settings: &[String],
    name: &str,
    sql: &str,
) -> Result<(RecordBatch, Vec<stretto_sql::PipelineRun>)> {
    let err = |e| SembenchError::Sql { name: name.to_string(), source: e };
    let ctx = stretto_sql::SqlContext::new(session).map_err(err)?;
    for s in settings {
        ctx.sql(s).map_err(err)?;
    }
    let result = ctx.sql(sql).and_then(|f| f.collect()).map_err(err)?;
    Ok((result.batch().map_err(err)?, result.pipelines().to_vec()))
}

/// Runs every query of the scenario in `dir` on the session `session_for` gives for it (after the `SET ...`
/// statements in `settings`) and scores it against `dir/truth/`. `only` keeps the named queries (all when empty);
/// `done` sees each run as it ends. One session for all shares its models and memo across the queries, as a user's
/// session would; a session per query with its own memo measures each query as if it came first.
pub fn run(
    session_for: &mut dyn FnMut(&str) -> stretto::Result<stretto::Session>,
    dir: &Path,
    settings: &[String],
    only: &[String],
    done: &mut dyn FnMut(&QueryRun),
) -> Result<Vec<QueryRun>> {
    let mut runs = Vec::new();
    for (name, path) in query_files(dir)? {
        if !only.is_empty() && !only.iter().any(|o| o.eq_ignore_ascii_case(&name)) {
            continue;
        }
        let sql = read(&path)?;
        let scoring = scoring_of(&sql)?;
        let truth_sql = read(&dir.join("truth").join(format!("{name}.sql")))?;
        let _span = tracing::info_span!("sembench_query", query = %name).entered();
        let session = session_for(&name)
            .map_err(|e| SembenchError::Sql { name: name.clone(), source: stretto_sql::SqlError::Stretto(e) })?;
        let (truth, _) = answer(&session, &[], &format!("truth/{name}"), &truth_sql)?;
        let start = Instant::now();
        let (rows, pipelines) = answer(&session, settings, &name, &sql)?;
        let seconds = start.elapsed().as_secs_f64();
        let score = score(scoring, &rows, &truth)?;
        let mut phases = std::collections::BTreeMap::new();
        for p in &pipelines {
            for (k, v) in &p.timings {
                *phases.entry(k.clone()).or_insert(0.0) += v;
            }
        }
        let (metric, value) = score.headline();
        tracing::info!(query = %name, metric, value, seconds, "scored");
        runs.push(QueryRun {
            name,
            scoring,
            score,
            rows: rows.num_rows(),
            truth_rows: truth.num_rows(),
            seconds,
            pipelines: pipelines.iter().map(|p| p.summary()).collect(),
            phases,
        });
        done(&runs[runs.len() - 1]);
    }
    Ok(runs)
}

/// A Markdown table of `runs`.
pub fn markdown(runs: &[QueryRun], header: &str) -> String {
    let mut s = format!("{header}\n\n| query | metric | score | precision / recall | rows (truth) | seconds | profiling / execution s | semantic pipeline |\n|---|---|---|---|---|---|---|---|\n");
    for r in runs {
        let (metric, value) = r.score.headline();
        let pr = match &r.score {
            Score::F1 { precision, recall, .. } => format!("{precision:.3} / {recall:.3}"),
            Score::Spearman { common, truth, .. } => format!("{common} of {truth} keys scored"),
            Score::RelativeError { .. } => "-".into(),
        };
        let phase = |k: &str| r.phases.get(k).map_or("-".to_string(), |v| format!("{v:.1}"));
        s.push_str(&format!(
            "| {} | {metric} | {value:.3} | {pr} | {} ({}) | {:.1} | {} / {} | {} |\n",
            r.name,
            r.rows,
            r.truth_rows,
            r.seconds,
            phase("profiling"),
            phase("execution"),
            r.pipelines.join("<br>").replace('|', "\\|")
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Float64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn table(keys: &[&str], values: &[Option<f64>]) -> RecordBatch {
        let schema =
            Schema::new(vec![Field::new("k", DataType::Utf8, false), Field::new("v", DataType::Float64, true)]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![Arc::new(StringArray::from(keys.to_vec())), Arc::new(Float64Array::from(values.to_vec()))],
        )
        .unwrap()
    }

    #[test]
    fn scoring_lines_parse_and_bad_ones_are_named() {
        assert_eq!(scoring_of("-- what\n-- score: rows\nSELECT").unwrap(), Scoring::Rows { limit: None });
        assert_eq!(scoring_of("  --score: value").unwrap(), Scoring::Value);
        assert_eq!(scoring_of("-- score: rank").unwrap(), Scoring::Rank);
        assert!(scoring_of("-- score: rows 0").unwrap_err().to_string().contains("positive integer"));
        assert!(scoring_of("-- score: mean").unwrap_err().to_string().contains("unknown scoring"));
    }

    #[test]
    fn rows_under_a_limit_want_only_that_many() {
        let truth = table(&["a", "b", "c", "d"], &[Some(1.0); 4]);
        // Two rows, one right, under LIMIT 2: precision 1/2, recall 1/2.
        let answer = table(&["a", "x"], &[Some(1.0), Some(1.0)]);
        let Score::F1 { precision, recall, f1 } = score(Scoring::Rows { limit: Some(2) }, &answer, &truth).unwrap()
        else {
            panic!()
        };
        assert_eq!((precision, recall, f1), (0.5, 0.5, 0.5));
        // Without a limit every truth row is wanted.
        let Score::F1 { recall, .. } = score(Scoring::Rows { limit: None }, &answer, &truth).unwrap() else { panic!() };
        assert_eq!(recall, 0.25);
        // An answer longer than its LIMIT recalls at most everything.
        let Score::F1 { recall, .. } = score(Scoring::Rows { limit: Some(1) }, &truth, &truth).unwrap() else {
            panic!()
        };
        assert_eq!(recall, 1.0);
        // Whole rows are compared: the same key with another value is wrong.
        let answer = table(&["a"], &[Some(2.0)]);
        let Score::F1 { f1, .. } = score(Scoring::Rows { limit: Some(1) }, &answer, &truth).unwrap() else { panic!() };
        assert_eq!(f1, 0.0);
    }

    #[test]
    fn values_are_relative_errors_and_a_missing_key_is_a_full_error() {
        let truth = table(&["neg", "pos"], &[Some(100.0), Some(20.0)]);
        let answer = table(&["neg", "pos"], &[Some(90.0), Some(30.0)]);
        let Score::RelativeError { relative_error } = score(Scoring::Value, &answer, &truth).unwrap() else { panic!() };
        assert!((relative_error - (0.1 + 0.5) / 2.0).abs() < 1e-12);
        let answer = table(&["neg"], &[Some(100.0)]);
        let Score::RelativeError { relative_error } = score(Scoring::Value, &answer, &truth).unwrap() else { panic!() };
        assert!((relative_error - 0.5).abs() < 1e-12);
        // A different column count is an error, not a silent zero.
        let one = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("v", DataType::Float64, true)])),
            vec![Arc::new(Float64Array::from(vec![1.0]))],
        )
        .unwrap();
        assert!(score(Scoring::Value, &one, &truth).is_err());
    }

    #[test]
    fn ranks_are_compared_over_the_keys_both_score() {
        let truth = table(&["a", "b", "c", "d"], &[Some(1.0), Some(2.0), Some(3.0), None]);
        let answer = table(&["c", "b", "a", "z"], &[Some(5.0), Some(4.0), None, Some(1.0)]);
        let Score::Spearman { rho, common, truth } = score(Scoring::Rank, &answer, &truth).unwrap() else { panic!() };
        assert_eq!((common, truth), (2, 3));
        assert!((rho - 1.0).abs() < 1e-12);
    }
}
