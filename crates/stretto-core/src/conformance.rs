//! The conformance suite every physical operator must pass; operator crates run it over their registered
//! operators from their own tests.
//!
//! It checks what the executor and the optimizer rely on: one output per input tuple, a positive and finite cost
//! per tuple, finite scores and confidences, and **answers that belong to the tuple alone**. The executor hands a
//! stage only the tuples earlier stages left unsure, in batches whose make-up depends on the plan, and the
//! optimizer moves thresholds over scores it profiled on other batches; both are sound only if a tuple's score (or
//! value) does not depend on which other tuples share its batch, where it stands in it, or whether it is asked for
//! the first or second time. So [`check`] evaluates the operator itself (memo off) several times under
//! perturbations it controls:
//!
//! - the same batch again (determinism of the model, not of the memo);
//! - the batch in reverse order;
//! - every other tuple only (a smaller batch with other neighbours).
//!
//! Each tuple's fresh answer must equal its first one (scores and confidences within [`TOLERANCE`], map values
//! exactly), and the decisions the executor derives from the fresh scores must be those of the first scores:
//! at every threshold between two answers, the accept and reject sets (as sets of tuples, not counts) are the
//! first evaluation's restricted to the perturbed batch, and they are nested as the threshold moves (a higher
//! acceptance threshold never accepts a tuple a lower one rejected).

use std::collections::BTreeSet;

use arrow::array::{RecordBatch, UInt32Array};
use arrow::compute::kernels::take::take_record_batch;

use crate::exec::{filter_decision, map_decision, Decision};
use crate::op::{OpOutput, RegisteredOp, SemanticTask};

/// How far a score or confidence may move between evaluations of the same tuple (absolute, plus as much again
/// relative to its size): floating-point reassociation across batch shapes, not a change of answer.
pub const TOLERANCE: f64 = 1e-3;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= TOLERANCE * (1.0 + a.abs().max(b.abs()))
}

/// Runs every check of `op` on `task` over `batch`; returns the violations (empty when it conforms).
pub fn check(op: &RegisteredOp, task: &SemanticTask, batch: &RecordBatch) -> Vec<String> {
    let op = op.unmemoised();
    let mut bad = Vec::new();
    let n = batch.num_rows();
    let (out, seconds) = match op.evaluate_timed(task, batch) {
        Ok(x) => x,
        Err(e) => return vec![format!("evaluation failed: {e}")],
    };
    if out.len() != n {
        bad.push(format!("{} outputs for {n} tuples", out.len()));
        return bad;
    }
    if seconds.len() != n {
        bad.push(format!("{} costs for {n} tuples", seconds.len()));
    }
    if let Some(s) = seconds.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
        bad.push(format!("a tuple cost {s} seconds (must be finite and > 0)"));
    }
    match &out {
        OpOutput::Scores(scores) => {
            if let Some(s) = scores.iter().find(|s| !s.is_finite()) {
                bad.push(format!("score {s} is not finite"));
            }
        }
        OpOutput::Values { values, confidences } => {
            if let Some(c) = confidences.iter().find(|c| !c.is_finite()) {
                bad.push(format!("confidence {c} is not finite"));
            }
            if values.iter().flatten().any(|v| v.is_empty()) {
                bad.push("an empty string value (use no value instead)".into());
            }
        }
    }
    for (what, rows) in perturbations(n) {
        let fresh = if rows.iter().copied().eq(0..n) {
            op.evaluate(task, batch)
        } else {
            take_record_batch(batch, &UInt32Array::from_iter_values(rows.iter().map(|&r| r as u32)))
                .map_err(|e| crate::CoreError::arrow("a perturbed batch", e))
                .and_then(|b| op.evaluate(task, &b))
        };
        match fresh {
            Ok(fresh) => bad.extend(compare(&out, &fresh, &rows).into_iter().map(|v| format!("{what}: {v}"))),
            Err(e) => bad.push(format!("{what}: evaluation failed: {e}")),
        }
    }
    bad
}

/// The perturbed batches, as the rows of the original each holds, in order.
fn perturbations(n: usize) -> Vec<(&'static str, Vec<usize>)> {
    let mut p = vec![("asked again", (0..n).collect()), ("in reverse order", (0..n).rev().collect())];
    if n >= 2 {
        p.push(("every other tuple alone", (0..n).step_by(2).collect()));
    }
    p
}

/// Violations of `fresh` (the answers for the original's `rows`, in that order) against the original `first`.
fn compare(first: &OpOutput, fresh: &OpOutput, rows: &[usize]) -> Vec<String> {
    let mut bad = Vec::new();
    if fresh.len() != rows.len() {
        return vec![format!("{} outputs for {} tuples", fresh.len(), rows.len())];
    }
    match (first, fresh) {
        (OpOutput::Scores(a), OpOutput::Scores(b)) => {
            for (&r, &s) in rows.iter().zip(b) {
                if !close(a[r], s) {
                    bad.push(format!("tuple {r} scored {} first and {s} now", a[r]));
                }
            }
            let first: Vec<f64> = rows.iter().map(|&r| a[r]).collect();
            let decide = |scores: &[f64], t: f64, d: Decision| -> BTreeSet<usize> {
                let hits = scores.iter().zip(rows).filter(|(&s, _)| filter_decision(s, Some(t), Some(t)) == d);
                hits.map(|(_, &r)| r).collect()
            };
            let mut last: Option<(f64, BTreeSet<usize>, BTreeSet<usize>)> = None;
            for t in thresholds(&first, b) {
                let (acc, rej) = (decide(b, t, Decision::Accept), decide(b, t, Decision::Reject));
                if acc != decide(&first, t, Decision::Accept) || rej != decide(&first, t, Decision::Reject) {
                    bad.push(format!("at threshold {t} the tuples accepted or rejected differ from the first answers"));
                }
                if let Some((t0, acc0, rej0)) = &last {
                    if !acc.is_subset(acc0) || !rej0.is_subset(&rej) {
                        bad.push(format!("moving the threshold from {t0} to {t} is not nested"));
                    }
                }
                last = Some((t, acc, rej));
            }
        }
        (OpOutput::Values { values: va, confidences: ca }, OpOutput::Values { values: vb, confidences: cb }) => {
            for (i, &r) in rows.iter().enumerate() {
                if va[r] != vb[i] {
                    bad.push(format!("tuple {r} answered {:?} first and {:?} now", va[r], vb[i]));
                }
                if !close(ca[r], cb[i]) {
                    bad.push(format!("tuple {r} had confidence {} first and {} now", ca[r], cb[i]));
                }
            }
            let first: Vec<f64> = rows.iter().map(|&r| ca[r]).collect();
            let take = |conf: &[f64], t: f64| -> BTreeSet<usize> {
                let hits = conf.iter().zip(rows).filter(|(&c, _)| map_decision(c, Some(t)) == Decision::Accept);
                hits.map(|(_, &r)| r).collect()
            };
            let mut last: Option<(f64, BTreeSet<usize>)> = None;
            for t in thresholds(&first, cb) {
                let taken = take(cb, t);
                if taken != take(&first, t) {
                    bad.push(format!("at confidence threshold {t} the values taken differ from the first answers"));
                }
                if let Some((t0, taken0)) = &last {
                    if !taken.is_subset(taken0) {
                        bad.push(format!("raising the confidence threshold from {t0} to {t} takes a value it refused"));
                    }
                }
                last = Some((t, taken));
            }
        }
        _ => bad.push("a filter answered a map, or the other way round".into()),
    }
    bad
}

/// Thresholds to move through, in increasing order: below every answer, midway between neighbouring answers that
/// lie further apart than the tolerance (of both evaluations), and above every answer.
fn thresholds(a: &[f64], b: &[f64]) -> Vec<f64> {
    let mut all: Vec<f64> = a.iter().chain(b).copied().filter(|x| x.is_finite()).collect();
    all.sort_by(f64::total_cmp);
    let (Some(&lo), Some(&hi)) = (all.first(), all.last()) else { return Vec::new() };
    let mut ts = vec![lo - 1.0];
    ts.extend(all.windows(2).filter(|w| !close(w[0], w[1])).map(|w| (w[0] + w[1]) / 2.0));
    ts.push(hi + 1.0);
    ts
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use arrow::array::StringArray;
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use crate::op::{LogicalKind, Modality, OpProperties, PhysicalOp, ValueType};
    use crate::{MemoPolicy, Result};

    /// How an operator under test answers a batch of items.
    #[derive(Debug, Clone, Copy)]
    enum Behaviour {
        /// By the item alone: its length.
        Own,
        /// Relative to its batch: length minus the batch's mean length (a batch-level calibration).
        BatchRelative,
        /// By where it stands: length plus a bonus for coming first.
        Positional,
        /// Differently each time it is asked.
        Drifting,
    }

    #[derive(Debug)]
    struct Probe {
        props: OpProperties,
        how: Behaviour,
        calls: AtomicUsize,
    }

    fn probe(kind: LogicalKind, how: Behaviour) -> RegisteredOp {
        let props = OpProperties {
            kind,
            family: "probe".into(),
            modality: Modality::Text,
            model: None,
            compression: None,
            tunable: true,
            gold: false,
            cost_hint: 1e-6,
            score_range: (-10.0, 10.0),
        };
        // The memo is on: the suite must turn it off itself, or "drifting" would be served its first answers.
        let dir = std::env::temp_dir().join(format!("stretto-conformance-{}-{how:?}-{kind:?}", std::process::id()));
        RegisteredOp::new(Arc::new(Probe { props, how, calls: AtomicUsize::new(0) }), MemoPolicy::Dir(dir))
    }

    impl PhysicalOp for Probe {
        fn name(&self) -> &str {
            "probe"
        }
        fn properties(&self) -> &OpProperties {
            &self.props
        }
        fn evaluate_items(&self, _: &SemanticTask, items: &[String]) -> Result<(OpOutput, Vec<f64>)> {
            let call = self.calls.fetch_add(1, Ordering::SeqCst) as f64;
            let mean = items.iter().map(|i| i.len() as f64).sum::<f64>() / items.len().max(1) as f64;
            let scores: Vec<f64> = items
                .iter()
                .enumerate()
                .map(|(k, i)| {
                    let len = i.len() as f64;
                    match self.how {
                        Behaviour::Own => len - 4.5,
                        Behaviour::BatchRelative => len - mean,
                        Behaviour::Positional => len - 4.5 + if k == 0 { 3.0 } else { 0.0 },
                        Behaviour::Drifting => len - 4.5 + call,
                    }
                })
                .collect();
            let out = match self.props.kind {
                LogicalKind::Filter => OpOutput::Scores(scores),
                _ => OpOutput::Values {
                    values: scores.iter().map(|s| Some(format!("{}", s.round()))).collect(),
                    confidences: scores.iter().map(|s| 1.0 / (1.0 + (-s).exp())).collect(),
                },
            };
            Ok((out, vec![1e-3; items.len()]))
        }
    }

    fn batch() -> RecordBatch {
        let texts = ["a", "abcdefgh", "abc", "abcdefghijkl", "abcde", "ab", "abcdefg"];
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("r.text", DataType::Utf8, true)])),
            vec![Arc::new(StringArray::from(texts.to_vec()))],
        )
        .unwrap()
    }

    #[test]
    fn an_operator_answering_each_tuple_alone_conforms() {
        let filter = SemanticTask::filter("f", "{r.text} is long");
        let map = SemanticTask::map("m", "the length of {r.text}", "len", ValueType::Integer);
        assert_eq!(check(&probe(LogicalKind::Filter, Behaviour::Own), &filter, &batch()), Vec::<String>::new());
        assert_eq!(check(&probe(LogicalKind::Map, Behaviour::Own), &map, &batch()), Vec::<String>::new());
    }

    #[test]
    fn answers_that_depend_on_the_batch_its_order_or_the_call_are_caught() {
        let filter = SemanticTask::filter("f", "{r.text} is long");
        let map = SemanticTask::map("m", "the length of {r.text}", "len", ValueType::Integer);
        for (how, perturbation) in [
            (Behaviour::BatchRelative, "every other tuple alone"),
            (Behaviour::Positional, "in reverse order"),
            (Behaviour::Drifting, "asked again"),
        ] {
            for (kind, task) in [(LogicalKind::Filter, &filter), (LogicalKind::Map, &map)] {
                let bad = check(&probe(kind, how), task, &batch());
                assert!(bad.iter().any(|v| v.starts_with(perturbation)), "{how:?} {kind:?}: {bad:?}");
            }
        }
        // A batch-level calibration keeps every score's order, so only comparing decisions across batches
        // (not counting accepted tuples within one) sees that tuples change sides.
        let bad = check(&probe(LogicalKind::Filter, Behaviour::BatchRelative), &filter, &batch());
        assert!(bad.iter().any(|v| v.contains("accepted or rejected differ")), "{bad:?}");
    }
}
