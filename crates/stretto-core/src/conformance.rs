//! The conformance suite every physical operator must pass; operator crates run it over their registered
//! operators from their own tests.
//!
//! It checks what the executor and the optimizer rely on: one output per input tuple, the same output when asked
//! again, a positive and finite cost per tuple, finite scores and confidences, and thresholds that are monotone in
//! effect (a higher acceptance threshold never accepts more tuples, a higher rejection threshold never rejects
//! fewer).

use arrow::array::RecordBatch;

use crate::exec::{filter_decision, map_decision, Decision};
use crate::op::{OpOutput, RegisteredOp, SemanticTask};

/// Runs every check of `op` on `task` over `batch`; returns the violations (empty when it conforms).
///
/// Both evaluations run with the memo off, so "the same output when asked again" is the operator's determinism,
/// not the memo's.
pub fn check(op: &RegisteredOp, task: &SemanticTask, batch: &RecordBatch) -> Vec<String> {
    let op = op.unmemoised();
    let mut bad = Vec::new();
    let n = batch.num_rows();
    let first = match op.evaluate_timed(task, batch) {
        Ok(x) => x,
        Err(e) => return vec![format!("evaluation failed: {e}")],
    };
    let (out, seconds) = &first;
    if out.len() != n {
        bad.push(format!("{} outputs for {n} tuples", out.len()));
    }
    if seconds.len() != n {
        bad.push(format!("{} costs for {n} tuples", seconds.len()));
    }
    if let Some(s) = seconds.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
        bad.push(format!("a tuple cost {s} seconds (must be finite and > 0)"));
    }
    match op.evaluate_timed(task, batch) {
        Ok((again, _)) if &again != out => bad.push("a second evaluation gave different outputs".into()),
        Ok(_) => {}
        Err(e) => bad.push(format!("a second evaluation failed: {e}")),
    }
    match out {
        OpOutput::Scores(scores) => {
            if let Some(s) = scores.iter().find(|s| !s.is_finite()) {
                bad.push(format!("score {s} is not finite"));
            }
            let mut ts: Vec<f64> = scores.iter().copied().filter(|s| s.is_finite()).collect();
            ts.sort_by(f64::total_cmp);
            let count =
                |t: f64, d: Decision| scores.iter().filter(|&&s| filter_decision(s, Some(t), Some(t)) == d).count();
            for w in ts.windows(2) {
                if count(w[1], Decision::Accept) > count(w[0], Decision::Accept) {
                    bad.push(format!("raising the acceptance threshold from {} to {} accepts more", w[0], w[1]));
                }
                if count(w[1], Decision::Reject) < count(w[0], Decision::Reject) {
                    bad.push(format!("raising the rejection threshold from {} to {} rejects fewer", w[0], w[1]));
                }
            }
        }
        OpOutput::Values { values, confidences } => {
            if let Some(c) = confidences.iter().find(|c| !c.is_finite()) {
                bad.push(format!("confidence {c} is not finite"));
            }
            if values.iter().flatten().any(|v| v.is_empty()) {
                bad.push("an empty string value (use no value instead)".into());
            }
            let mut ts = confidences.clone();
            ts.sort_by(f64::total_cmp);
            let count = |t: f64| confidences.iter().filter(|&&c| map_decision(c, Some(t)) == Decision::Accept).count();
            for w in ts.windows(2) {
                if count(w[1]) > count(w[0]) {
                    bad.push(format!("raising the confidence threshold from {} to {} takes more values", w[0], w[1]));
                }
            }
        }
    }
    bad
}

/// Lists the operators a suite could not check (`(operator, model)` pairs, their model not prepared) and fails,
/// naming them, if any runs a model outside `may_skip`: an operator cannot slip out of the suite silently.
pub fn report_unchecked(not_checked: &[(String, String)], may_skip: &[&str]) {
    for (op, model) in not_checked {
        eprintln!("NOT CHECKED: {op} (model {model} not prepared; `stretto models fetch {model}` to include it)");
    }
    let unexpected: Vec<&str> = not_checked
        .iter()
        .filter(|(_, model)| !model.split('+').all(|m| may_skip.contains(&m)))
        .map(|(op, _)| op.as_str())
        .collect();
    assert!(
        unexpected.is_empty(),
        "operators not checked although their models are not on the allow-list {may_skip:?}: {unexpected:?}"
    );
}
