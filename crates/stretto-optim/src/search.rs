//! A combinatorial candidate generator beside the gradient solver: coordinate search over one cheap stage per
//! filter or map, with thresholds on a grid of the scores' (a map's confidences') quantiles, judged by the *exact*
//! hard counts.
//!
//! At high targets the feasible region of the relaxed problem is a thin corner: a cheap stage may reject only the
//! few tuples its scores put far below every positive, and the soft bounds' penalty, which sees the soft mass of
//! every tuple, tends to push the solver to the gold plan before it finds that corner. Walking each stage's
//! threshold from the cautious end and stopping at the first plan whose hard bounds miss the targets finds it
//! directly. The search sees only the tuples it is given, so its plans are candidates like the solver's, to be
//! certified on tuples it did not see.

use stretto_core::op::LogicalKind;

use crate::problem::{Counts, HardPlan, Problem, Stage};
use crate::soft::Sides;

/// Thresholds tried per stage and side: the scores' quantiles at `j / GRID`.
const GRID: usize = 20;

/// The cheapest plan the coordinate search reaches from gold on `rows` that `feasible` accepts (given the plan and
/// its hard counts on `rows`), if it is cheaper than gold. Each filter may get one cheap stage before its gold;
/// `sides` says which thresholds may be finite. Each map may get one cheap stage deciding the values it is
/// confident of, except under [`Sides::RejectOnly`] (a map stage's decision is an accepted value).
///
/// One stage per filter is deliberate: a version with two measured no cheaper on the generated workloads (mean
/// cost relative to LOTUS at target 0.9: 0.759 against 0.756) and took a tenth longer; longer cascades are the
/// solver's.
pub fn coordinate_search(
    problem: &Problem,
    rows: &[usize],
    sides: Sides,
    feasible: &dyn Fn(&HardPlan, &Counts) -> bool,
) -> Option<HardPlan> {
    if rows.is_empty() {
        return None;
    }
    let _span = tracing::debug_span!("coordinate_search", ?sides, rows = rows.len()).entered();
    let n_ops = problem.ops.len();
    // Operator o's cheap stage, if any.
    let mut state: Vec<Option<Stage>> = vec![None; n_ops];
    let gold_cost = problem.evaluate(&assemble(problem, &state), rows).cost_per_tuple();
    let mut best_cost = gold_cost;
    // Quantile grids per (op, implementation), on the searched rows.
    let grids: Vec<Vec<Vec<f64>>> = problem
        .ops
        .iter()
        .map(|op| {
            op.impls
                .iter()
                .map(|imp| match (&imp.scores, op.kind, imp.gold) {
                    (Some(s), LogicalKind::Filter, false) => quantile_grid(rows.iter().map(|&r| s[r]).collect()),
                    // A map's confidences where it was asked (+∞ marks a tuple outside the gold result).
                    (Some(s), LogicalKind::Map, false) if sides != Sides::RejectOnly => {
                        quantile_grid(rows.iter().map(|&r| s[r]).filter(|v| v.is_finite()).collect())
                    }
                    _ => Vec::new(),
                })
                .collect()
        })
        .collect();
    for _round in 0..(2 * n_ops + 2) {
        let mut improved: Option<(f64, usize, Option<Stage>)> = None;
        for o in 0..n_ops {
            let current = state[o].clone();
            let consider = |stage: Option<Stage>, improved: &mut Option<(f64, usize, Option<Stage>)>| -> bool {
                let mut trial = state.clone();
                trial[o] = stage.clone();
                let plan = assemble(problem, &trial);
                let counts = problem.evaluate(&plan, rows);
                if !feasible(&plan, &counts) {
                    return false;
                }
                let c = counts.cost_per_tuple();
                if c < best_cost - 1e-12 && improved.as_ref().is_none_or(|(b, _, _)| c < *b) {
                    *improved = Some((c, o, stage));
                }
                true
            };
            if current.is_some() {
                consider(None, &mut improved);
            }
            for (i, grid) in grids[o].iter().enumerate() {
                if grid.is_empty() {
                    continue;
                }
                if problem.ops[o].kind == LogicalKind::Map {
                    // A map stage decides the values it is confident of and passes the rest to gold: cautious (a
                    // high threshold) to bold; the first plan that misses the targets ends the walk.
                    for &t in grid.iter().rev() {
                        if !consider(Some(Stage { op: o, imp: i, lower: None, upper: Some(t) }), &mut improved) {
                            break;
                        }
                    }
                    continue;
                }
                let same = current.as_ref().filter(|s| s.imp == i);
                let keep_upper = same.and_then(|s| s.upper).unwrap_or(f64::MAX);
                let keep_lower = same.and_then(|s| s.lower).unwrap_or(f64::MIN);
                if matches!(sides, Sides::RejectOnly | Sides::Both) {
                    let upper = if sides == Sides::RejectOnly { f64::MAX } else { keep_upper };
                    // Cautious to bold: the first plan that misses the targets ends the walk.
                    for &t in grid.iter().filter(|&&t| t <= upper) {
                        let stage = Stage { op: o, imp: i, lower: Some(t), upper: Some(upper) };
                        if !consider(Some(stage), &mut improved) {
                            break;
                        }
                    }
                }
                if matches!(sides, Sides::AcceptOnly | Sides::Both) {
                    let lower = if sides == Sides::AcceptOnly { f64::MIN } else { keep_lower };
                    for &t in grid.iter().rev().filter(|&&t| t >= lower) {
                        let stage = Stage { op: o, imp: i, lower: Some(lower), upper: Some(t) };
                        if !consider(Some(stage), &mut improved) {
                            break;
                        }
                    }
                }
            }
        }
        match improved {
            Some((c, o, stage)) => {
                best_cost = c;
                state[o] = stage;
            }
            None => break,
        }
    }
    (best_cost < gold_cost - 1e-12).then(|| assemble(problem, &state))
}

/// The filters' cheap stages by increasing cost, then the maps' (a map decides values, no tuple, so it is asked
/// after the filters' cheap stages), then every operator's gold.
fn assemble(problem: &Problem, state: &[Option<Stage>]) -> HardPlan {
    let mut cheap: Vec<Stage> = state.iter().flatten().cloned().collect();
    let is_map = |s: &Stage| problem.ops[s.op].kind == LogicalKind::Map;
    cheap.sort_by(|a, b| {
        is_map(a)
            .cmp(&is_map(b))
            .then(problem.ops[a.op].impls[a.imp].cost.total_cmp(&problem.ops[b.op].impls[b.imp].cost))
    });
    let mut stages = cheap;
    for (o, op) in problem.ops.iter().enumerate() {
        let th = (op.kind == LogicalKind::Filter).then_some(0.0);
        stages.push(Stage { op: o, imp: op.gold(), lower: th, upper: th });
    }
    HardPlan { stages }
}

/// Thresholds between the sorted scores at the `j / GRID` quantiles, ascending and distinct.
fn quantile_grid(mut scores: Vec<f64>) -> Vec<f64> {
    scores.sort_by(f64::total_cmp);
    let n = scores.len();
    let mut grid: Vec<f64> = (1..GRID)
        .map(|j| j * n / GRID)
        .filter(|&k| k > 0 && k < n)
        .map(|k| 0.5 * (scores[k - 1] + scores[k]))
        .collect();
    grid.dedup();
    grid
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{generate, WorkloadConfig};

    #[test]
    fn the_search_finds_a_cheaper_feasible_reject_only_plan_and_respects_feasibility() {
        let w = generate(11, &WorkloadConfig { population: Some(3000), operators: Some(1), ..Default::default() });
        let p = Problem::from_profile(&w.sample).unwrap();
        let rows = p.all_rows();
        let gold = p.evaluate(&p.gold_plan(), &rows);
        // Recall at least 0.9 on these rows, exactly.
        let feasible = |_: &HardPlan, c: &Counts| c.recall() >= 0.9;
        let plan = coordinate_search(&p, &rows, Sides::RejectOnly, &feasible).expect("a cheaper plan exists");
        let c = p.evaluate(&plan, &rows);
        assert!(c.recall() >= 0.9, "recall {}", c.recall());
        assert!(c.cost < gold.cost, "cost {} vs gold {}", c.cost, gold.cost);
        assert_eq!(c.fp, 0.0, "reject-only plans make no false positives");
        assert!(p.exactness(&plan).precision);
        // An impossible requirement leaves gold.
        assert!(coordinate_search(&p, &rows, Sides::Both, &|_: &HardPlan, _: &Counts| false).is_none());
    }

    #[test]
    fn a_map_gets_a_cheap_stage_deciding_the_values_it_is_confident_of_but_not_under_reject_only() {
        let cfg = WorkloadConfig { operators: Some(2), map_share: Some(1.0), ..Default::default() };
        let mut with_map_stage = 0;
        for seed in 0..12 {
            let p = Problem::from_profile(&generate(seed, &cfg).sample).unwrap();
            let rows = p.all_rows();
            let feasible = |_: &HardPlan, c: &Counts| c.precision() >= 0.8 && c.recall() >= 0.8;
            if let Some(plan) = coordinate_search(&p, &rows, Sides::Both, &feasible) {
                let c = p.evaluate(&plan, &rows);
                assert!(feasible(&plan, &c), "seed {seed}: {} / {}", c.precision(), c.recall());
                assert!(c.cost < p.evaluate(&p.gold_plan(), &rows).cost);
                let map_stage = plan
                    .stages
                    .iter()
                    .position(|s| p.ops[s.op].kind == LogicalKind::Map && !p.ops[s.op].impls[s.imp].gold);
                if let Some(m) = map_stage {
                    with_map_stage += 1;
                    let s = &plan.stages[m];
                    assert!(s.lower.is_none() && s.upper.is_some(), "a map stage has a confidence threshold only");
                    // After every cheap filter stage: a map decides values, not tuples.
                    let cheap_filter =
                        |t: &Stage| p.ops[t.op].kind == LogicalKind::Filter && !p.ops[t.op].impls[t.imp].gold;
                    assert!(!plan.stages[m..].iter().any(cheap_filter));
                }
            }
            if let Some(plan) = coordinate_search(&p, &rows, Sides::RejectOnly, &feasible) {
                assert!(plan
                    .stages
                    .iter()
                    .all(|s| p.ops[s.op].kind == LogicalKind::Filter || p.ops[s.op].impls[s.imp].gold));
            }
        }
        assert!(with_map_stage > 0, "no workload's map got a cheap stage");
    }
}
