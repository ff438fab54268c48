//! The int8-weight rung beside its f32 parent (#21): for each model and dataset, the LLM filter of a reference
//! predicate over a seeded sample of rows, once with the f32 decoder and once with its 8-bit `MatMulNBits`
//! conversion, both over the same cached KV pasts (the f32 model prefills them). Reports milliseconds per item of
//! each (the operator's own per-item seconds: loading the past and the question pass), the speed-up, how often the
//! two decisions (the sign of the calibrated log-odds, the gold rule) agree, and how far the log-odds move; on the
//! reviews also how often each decision is right against the critics' labels (`scoresentiment`).
//!
//! Each rung runs the sample twice and the second run is timed: the first pays one-off work (the int8 conversion,
//! loading the sessions, building missing caches).
//!
//! ```no_run
//! use stretto_bench::quant::{measure, QuantOptions};
//! let home = stretto_core::context::default_home();
//! let rows = measure(&home, &QuantOptions::default())?;
//! print!("{}", stretto_bench::quant::markdown(&rows, &QuantOptions::default()));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::Path;

use arrow::array::{Array, AsArray};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use stretto::core::datasets::Dataset;
use stretto::core::op::{parse_config, LogicalKind, OpOutput, PhysicalOp, SemanticTask};
use stretto::core::OpContext;
use stretto::kv::convert::Weights;
use stretto::ops_text::llm::{LlmConfig, LlmOp};

use crate::peer::PeerError;

/// What to measure.
#[derive(Debug, Clone)]
pub struct QuantOptions {
    /// Catalog decoders.
    pub models: Vec<String>,
    /// Rows in each dataset's sample.
    pub items: usize,
    /// Intra-op threads.
    pub threads: usize,
    /// Seed of the sample.
    pub seed: u64,
    /// Items per decoder batch (the LLM operators' default is 8).
    pub batch: usize,
    /// The quantized rungs measured against f32 (`int8`, `int8-dyn`).
    pub weights: Vec<Weights>,
}

impl Default for QuantOptions {
    fn default() -> Self {
        Self {
            models: vec!["smollm2-135m".into(), "qwen2.5-coder-0.5b".into()],
            items: 100,
            threads: 1,
            seed: 42,
            batch: 8,
            weights: Weights::QUANTIZED.to_vec(),
        }
    }
}

/// A reference predicate over one dataset's text column, with the label column and value that say "true" where
/// the dataset has one.
struct Case {
    dataset: &'static str,
    table: &'static str,
    column: &'static str,
    predicate: &'static str,
    truth: Option<(&'static str, &'static str)>,
}

/// The reference predicates: short reviews (with the critics' verdicts as truth) and long Rotowire reports.
const CASES: [Case; 2] = [
    Case {
        dataset: "movie",
        table: "reviews",
        column: "reviewtext",
        predicate: "{reviews.reviewtext} is clearly positive",
        truth: Some(("scoresentiment", "POSITIVE")),
    },
    Case {
        dataset: "rotowire",
        table: "reports",
        column: "report",
        predicate: "the home team won the game {reports.report} reports",
        truth: None,
    },
];

/// One model on one dataset.
#[derive(Debug, Clone, serde::Serialize)]
pub struct QuantRow {
    /// Catalog model.
    pub model: String,
    /// Dataset.
    pub dataset: String,
    /// The quantized rung's weights (`int8`, `int8-dyn`).
    pub weights: String,
    /// Items in the sample.
    pub items: usize,
    /// f32 rung, ms per item.
    pub f32_ms: f64,
    /// The quantized rung, ms per item.
    pub int8_ms: f64,
    /// `f32_ms / int8_ms`.
    pub speedup: f64,
    /// Share of items whose decisions (score > 0) agree.
    pub agreement: f64,
    /// Mean |int8 − f32| of the calibrated log-odds.
    pub mean_change: f64,
    /// Share of decisions right against the labels (f32, int8), where the dataset has them.
    pub truth_accuracy: Option<(f64, f64)>,
}

/// A seeded sample of `n` rows of a case's text column, with each row's truth where the case has one.
fn sample(case: &Case, n: usize, seed: u64) -> Result<(Vec<String>, Option<Vec<bool>>), PeerError> {
    let Case { dataset, table, column, truth: label, .. } = case;
    let data = Dataset::load(dataset)?;
    let batch = data.table(table)?;
    let text = |name: &str| {
        batch
            .column_by_name(name)
            .and_then(|c| c.as_string_opt::<i32>().cloned())
            .ok_or_else(|| PeerError::Options(format!("{dataset}.{table} has no text column {name}")))
    };
    let col = text(column)?;
    let mut rows: Vec<usize> = (0..col.len()).collect();
    rows.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    rows.truncate(n);
    let items = rows.iter().map(|&r| col.value(r).to_string()).collect();
    let truth = match label {
        Some((name, yes)) => {
            let l = text(name)?;
            Some(rows.iter().map(|&r| l.value(r) == *yes).collect())
        }
        None => None,
    };
    Ok((items, truth))
}

/// Calibrated scores and mean ms per item of the second of two runs of `op` over `items`.
fn timed_scores(op: &LlmOp, task: &SemanticTask, items: &[String]) -> Result<(Vec<f64>, f64), PeerError> {
    op.evaluate_items(task, items)?;
    let (out, secs) = op.evaluate_items(task, items)?;
    let OpOutput::Scores(scores) = out else {
        return Err(PeerError::Options(format!("{} returned no filter scores", op.name())));
    };
    Ok((scores, 1e3 * secs.iter().sum::<f64>() / items.len().max(1) as f64))
}

/// Measures every model on both datasets.
pub fn measure(home: &Path, o: &QuantOptions) -> Result<Vec<QuantRow>, PeerError> {
    if o.items == 0 || o.threads == 0 || o.batch == 0 || o.models.is_empty() || o.weights.is_empty() {
        return Err(PeerError::Options(
            "--items, --threads, --batch, --models and --weights must be positive / non-empty".into(),
        ));
    }
    if o.weights.contains(&Weights::F32) {
        return Err(PeerError::Options(
            "--weights names the quantized rungs (int8, int8-dyn); f32 is always run".into(),
        ));
    }
    let _span = tracing::info_span!("quant_bench", items = o.items, threads = o.threads).entered();
    let ctx = OpContext::new(home).with_threads(o.threads);
    let mut rows = Vec::new();
    for model in &o.models {
        let rung = |weights: &str| -> Result<LlmOp, PeerError> {
            let config: LlmConfig =
                parse_config("llm-filter", &serde_json::json!({"model": model, "weights": weights, "batch": o.batch}))?;
            Ok(LlmOp::new(LogicalKind::Filter, config, &ctx)?)
        };
        let reference = rung("f32")?;
        let quantized =
            o.weights.iter().map(|w| Ok((w.as_str(), rung(w.as_str())?))).collect::<Result<Vec<_>, PeerError>>()?;
        for case in &CASES {
            let (items, truth) = sample(case, o.items, o.seed)?;
            let task = SemanticTask::filter("q", case.predicate);
            let (a, f32_ms) = timed_scores(&reference, &task, &items)?;
            for (weights, op) in &quantized {
                let (b, int8_ms) = timed_scores(op, &task, &items)?;
                let n = items.len() as f64;
                let agree = a.iter().zip(&b).filter(|(x, y)| (**x > 0.0) == (**y > 0.0)).count();
                let right =
                    |s: &[f64], t: &[bool]| s.iter().zip(t).filter(|(x, y)| (**x > 0.0) == **y).count() as f64 / n;
                rows.push(QuantRow {
                    model: model.clone(),
                    dataset: case.dataset.into(),
                    weights: weights.to_string(),
                    items: items.len(),
                    f32_ms,
                    int8_ms,
                    speedup: f32_ms / int8_ms.max(1e-9),
                    agreement: agree as f64 / n,
                    mean_change: a.iter().zip(&b).map(|(x, y)| (x - y).abs()).sum::<f64>() / n,
                    truth_accuracy: truth.as_deref().map(|t| (right(&a, t), right(&b, t))),
                });
            }
        }
    }
    Ok(rows)
}

/// The rows as a markdown table, with what was measured.
pub fn markdown(rows: &[QuantRow], o: &QuantOptions) -> String {
    let mut out = format!(
        "# int8-weight rungs beside their f32 parents\n\n`stretto bench quant --items {} --threads {} --seed {} --batch {} \
         --weights {}`: the LLM filter over a seeded sample of {} rows per dataset, f32 and quantized weights over the \
         same cached pasts; ms per item of the second of two runs. Agreement: the decisions (calibrated log-odds > 0) \
         of the two rungs. Right: decisions against the critics' verdicts (reviews only).\n\n\
         | model | dataset | weights | f32 ms | quantized ms | speed-up | agreement | mean log-odds change | right f32 / quantized |\n\
         |---|---|---|---|---|---|---|---|---|\n",
        o.items,
        o.threads,
        o.seed,
        o.batch,
        o.weights.iter().map(|w| w.as_str()).collect::<Vec<_>>().join(","),
        o.items
    );
    for r in rows {
        let truth = r.truth_accuracy.map_or("–".to_string(), |(a, b)| format!("{a:.2} / {b:.2}"));
        out.push_str(&format!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.2}× | {:.2} | {:.3} | {truth} |\n",
            r.model, r.dataset, r.weights, r.f32_ms, r.int8_ms, r.speedup, r.agreement, r.mean_change
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_shows_both_rungs_and_the_truth_where_there_is_one() {
        let row = |dataset: &str, truth| QuantRow {
            model: "m".into(),
            dataset: dataset.into(),
            weights: "int8-dyn".into(),
            items: 10,
            f32_ms: 100.0,
            int8_ms: 50.0,
            speedup: 2.0,
            agreement: 0.9,
            mean_change: 0.05,
            truth_accuracy: truth,
        };
        let md = markdown(&[row("movie", Some((0.7, 0.75))), row("rotowire", None)], &QuantOptions::default());
        assert!(md.contains("| m | movie | int8-dyn | 100.0 | 50.0 | 2.00× | 0.90 | 0.050 | 0.70 / 0.75 |"), "{md}");
        assert!(md.contains("| m | rotowire | int8-dyn | 100.0 | 50.0 | 2.00× | 0.90 | 0.050 | – |"), "{md}");
    }
}
