//! A profile compiled for optimization: per logical operator, its cascade ladder (non-gold implementations by
//! increasing cost, then gold), gold labels, and hard (exact) evaluation of plans on any subset of the tuples.

use std::collections::{BTreeMap, BTreeSet};

use stretto_core::exec::{filter_decision, map_decision, Decision};
use stretto_core::format::{PlanFile, PlanStage};
use stretto_core::op::LogicalKind;

use crate::error::{OptimError, Result};
use crate::profile::Profile;

/// One implementation of a logical operator.
#[derive(Debug, Clone)]
pub struct Implementation {
    /// `logical/implementation`.
    pub physical: String,
    /// Seconds per tuple.
    pub cost: f64,
    /// Whether it is gold.
    pub gold: bool,
    /// Raw filter scores or map confidences, if any; +∞ where a map was not asked (a tuple outside the gold
    /// result, whose values never count), so that any stage of it decides there.
    pub scores: Option<Vec<f64>>,
    /// `scores` as mid-ranks in (0, 1): the space thresholds are optimised in, robust to heavy tails and to each
    /// operator's scale.
    pub ranks: Option<Vec<f64>>,
    /// Distinct raw scores, ascending, with their rank value: maps rank-space thresholds back to raw ones.
    levels: Vec<(f64, f64)>,
    /// Map only: whether the value equals gold's.
    pub correct: Option<Vec<bool>>,
    /// A part of `cost` paid once per tuple however many stages share it (a model's per-item prefill, where
    /// execution builds an item's cache as it reaches it): the index of the group of implementations sharing it
    /// ([`Problem::share_costs`]) and its seconds per tuple. A hard plan pays it on a tuple where the first stage
    /// of the group sees the tuple; the relaxation counts it in each stage's `cost`.
    pub shared: Option<(usize, f64)>,
}

impl Implementation {
    /// Whether a stage of it has thresholds to tune.
    pub fn tunable(&self) -> bool {
        self.scores.is_some() && !self.gold
    }

    /// The raw threshold `t` such that `score > t` holds exactly for the profiled tuples whose rank is above `q`.
    pub fn upper_from_rank(&self, q: f64) -> f64 {
        let j = self.levels.partition_point(|&(_, r)| r <= q);
        self.raw_between(j)
    }

    /// The raw threshold `t` such that `score < t` holds exactly for the profiled tuples whose rank is below `q`.
    pub fn lower_from_rank(&self, q: f64) -> f64 {
        let j = self.levels.partition_point(|&(_, r)| r < q);
        self.raw_between(j)
    }

    /// A raw value between the `j`-th and `j+1`-th distinct score (beyond the ends when `j` is 0 or all).
    fn raw_between(&self, j: usize) -> f64 {
        let m = self.levels.len();
        if m == 0 {
            return 0.0;
        }
        let spread = (self.levels[m - 1].0 - self.levels[0].0).abs().max(1.0);
        if j == 0 {
            self.levels[0].0 - spread
        } else if j >= m {
            self.levels[m - 1].0 + spread
        } else {
            0.5 * (self.levels[j - 1].0 + self.levels[j].0)
        }
    }
}

/// A logical operator with its ladder.
#[derive(Debug, Clone)]
pub struct LogicalOp {
    /// Name.
    pub name: String,
    /// Filter or map.
    pub kind: LogicalKind,
    /// Non-gold implementations by increasing cost, then gold (always last).
    pub impls: Vec<Implementation>,
    /// Per tuple: does gold accept it (filter: gold score > 0; map: always).
    pub label: Vec<bool>,
}

impl LogicalOp {
    /// Index of the gold implementation (the last).
    pub fn gold(&self) -> usize {
        self.impls.len() - 1
    }
}

/// A compiled profile.
#[derive(Debug, Clone)]
pub struct Problem {
    /// Profiled tuples.
    pub n: usize,
    /// Tuples the plan will run on.
    pub population: u64,
    /// The query text.
    pub query: String,
    /// Logical operators in profile order.
    pub ops: Vec<LogicalOp>,
}

/// One stage of a hard plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    /// Logical operator index.
    pub op: usize,
    /// Implementation index within the operator's ladder.
    pub imp: usize,
    /// Reject below (filters).
    pub lower: Option<f64>,
    /// Accept (filters) or decide (maps) above.
    pub upper: Option<f64>,
}

/// A plan over a problem: stages in execution order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HardPlan {
    /// Stages in execution order.
    pub stages: Vec<Stage>,
}

/// Outcome counts of a hard plan on some tuples.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counts {
    /// Tuples in both the result and the gold result, with correct map values.
    pub tp: f64,
    /// Result tuples that are not true positives.
    pub fp: f64,
    /// Gold result tuples the result misses (or gets a map value wrong).
    pub fn_: f64,
    /// Seconds spent, summed over tuples.
    pub cost: f64,
    /// Tuples evaluated.
    pub n: usize,
}

impl Counts {
    /// Precision (1 when the result is empty: nothing returned is nothing wrong).
    pub fn precision(&self) -> f64 {
        if self.tp + self.fp == 0.0 {
            1.0
        } else {
            self.tp / (self.tp + self.fp)
        }
    }

    /// Recall (1 when the gold result is empty).
    pub fn recall(&self) -> f64 {
        if self.tp + self.fn_ == 0.0 {
            1.0
        } else {
            self.tp / (self.tp + self.fn_)
        }
    }

    /// Seconds per tuple.
    pub fn cost_per_tuple(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.cost / self.n as f64
        }
    }
}

/// Per-stage tallies of a hard plan, for ordering.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageTally {
    /// Tuples that reached the stage.
    pub seen: usize,
    /// Tuples it rejected.
    pub rejected: usize,
    /// Tuples it left unsure.
    pub unsure: usize,
}

/// Which of a plan's global precision and recall are 1 by construction, on any data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Exactness {
    /// Only gold stages accept filter tuples and no cheap stage decides a map value: every result row passed gold
    /// for every operator, so there are no false positives.
    pub precision: bool,
    /// Only gold stages reject filter tuples and no cheap stage decides a map value: no gold result row can be
    /// dropped, so there are no false negatives.
    pub recall: bool,
}

impl Problem {
    /// What a plan guarantees by its shape alone (see [`Exactness`]). A cheap filter stage counts as never
    /// accepting only with an infinite accept threshold (reject-only stages), and as never rejecting only with an
    /// infinite reject threshold: a finite threshold that no sampled tuple crosses may still be crossed by others.
    pub fn exactness(&self, plan: &HardPlan) -> Exactness {
        let mut e = Exactness { precision: true, recall: true };
        for s in &plan.stages {
            let op = &self.ops[s.op];
            if s.imp == op.gold() {
                continue;
            }
            match op.kind {
                LogicalKind::Filter => {
                    e.precision &= s.upper.is_some_and(|u| u >= f64::MAX);
                    e.recall &= s.lower.is_some_and(|l| l <= f64::MIN);
                }
                LogicalKind::Map => e = Exactness::default(),
            }
        }
        e
    }

    /// `plan` with every cheap stage's decisions scaled by `share`, counted on the scores of `rows`: below 1 a stage
    /// keeps only that share of its most confident decisions and leaves the rest unsure for the next stage (a more
    /// cautious plan); above 1 it decides that many times as many tuples (a cheaper, riskier one). Only finite
    /// thresholds move, so a reject-only or accept-only stage keeps its shape. A stage left with no decisions is
    /// dropped, and an operator whose stages could now all be unsure gets its gold stage at the end, so every tuple
    /// is still decided. A share of exactly 1, or one that is not a finite non-negative number, leaves the plan as
    /// it is. Used to lay a path of plans through a candidate for the certification sequence; `rows` must not be the
    /// tuples that certify it.
    pub fn rescale(&self, plan: &HardPlan, rows: &[usize], share: f64) -> HardPlan {
        if !(share.is_finite() && share >= 0.0) || share == 1.0 {
            return plan.clone();
        }
        // The threshold that leaves `share` times `count` tuples on the decided side, where `sorted` runs from the
        // most confident decision on that side and its first `count` are decided now. `None`: nothing is decided.
        let cut = |sorted: &[f64], count: usize| -> Option<f64> {
            let scaled = share * count as f64;
            let k = if share < 1.0 { scaled.floor() } else { scaled.ceil() } as usize;
            let k = k.min(sorted.len().saturating_sub(1));
            (k > 0).then(|| 0.5 * (sorted[k - 1] + sorted[k]))
        };
        let mut stages = Vec::with_capacity(plan.stages.len() + self.ops.len());
        for s in &plan.stages {
            let op = &self.ops[s.op];
            let imp = &op.impls[s.imp];
            let Some(scores) = imp.scores.as_ref().filter(|_| !imp.gold) else {
                stages.push(s.clone());
                continue;
            };
            // A map's unasked tuples (+∞) are no decisions to scale.
            let mut ascending: Vec<f64> = rows.iter().map(|&r| scores[r]).filter(|v| v.is_finite()).collect();
            ascending.sort_by(f64::total_cmp);
            let descending: Vec<f64> = ascending.iter().rev().copied().collect();
            match op.kind {
                LogicalKind::Filter => {
                    let (l, u) = (s.lower.unwrap_or(0.0), s.upper.unwrap_or(0.0));
                    let mut lower = if l <= f64::MIN {
                        l
                    } else {
                        cut(&ascending, ascending.partition_point(|&v| v < l)).unwrap_or(f64::MIN)
                    };
                    let upper = if u >= f64::MAX {
                        u
                    } else {
                        cut(&descending, descending.partition_point(|&v| v > u)).unwrap_or(f64::MAX)
                    };
                    // Growing sides must not cross: a tuple between them stays unsure.
                    lower = lower.min(upper);
                    if lower > f64::MIN || upper < f64::MAX {
                        stages.push(Stage { lower: Some(lower), upper: Some(upper), ..s.clone() });
                    }
                }
                LogicalKind::Map => {
                    let u = s.upper.unwrap_or(f64::MIN);
                    if let Some(upper) = cut(&descending, descending.partition_point(|&v| v > u)) {
                        stages.push(Stage { upper: Some(upper), ..s.clone() });
                    }
                }
            }
        }
        for (o, op) in self.ops.iter().enumerate() {
            if !stages.iter().any(|s| s.op == o && s.imp == op.gold()) {
                let th = (op.kind == LogicalKind::Filter).then_some(0.0);
                stages.push(Stage { op: o, imp: op.gold(), lower: th, upper: th });
            }
        }
        HardPlan { stages }
    }

    /// Whether any logical operator is a map.
    pub fn has_maps(&self) -> bool {
        self.ops.iter().any(|o| o.kind == LogicalKind::Map)
    }

    /// Compiles a validated profile.
    pub fn from_profile(profile: &Profile) -> Result<Self> {
        profile.validate()?;
        let n = profile.len();
        let mut ops = Vec::with_capacity(profile.logical.len());
        for l in &profile.logical {
            let mut impls: Vec<(bool, Implementation)> = Vec::new();
            for p in profile.physical.iter().filter(|p| p.logical == l.name) {
                // A map's unasked tuple (outside the gold result, validated) decides: +∞ beats every threshold.
                let scores: Option<Vec<f64>> =
                    p.scores.as_ref().map(|s| s.iter().map(|v| v.unwrap_or(f64::INFINITY)).collect());
                let (ranks, levels) = match &scores {
                    Some(s) => {
                        let (r, lv) = asked_mid_ranks(s);
                        (Some(r), lv)
                    }
                    None => (None, vec![]),
                };
                impls.push((
                    p.gold,
                    Implementation {
                        physical: p.name.clone(),
                        cost: p.cost,
                        gold: p.gold,
                        scores,
                        ranks,
                        levels,
                        correct: None,
                        shared: None,
                    },
                ));
            }
            impls.sort_by(|a, b| {
                a.0.cmp(&b.0).then(a.1.cost.total_cmp(&b.1.cost)).then(a.1.physical.cmp(&b.1.physical))
            });
            let mut impls: Vec<Implementation> = impls.into_iter().map(|(_, i)| i).collect();
            let gold_idx = impls.len() - 1;
            let label = match l.kind {
                LogicalKind::Filter => {
                    impls[gold_idx].scores.as_ref().map(|s| s.iter().map(|&v| v > 0.0).collect()).unwrap_or_default()
                }
                LogicalKind::Map => vec![true; n],
            };
            if l.kind == LogicalKind::Map {
                let gold_values = profile
                    .physical
                    .iter()
                    .find(|p| p.name == impls[gold_idx].physical)
                    .and_then(|p| p.values.clone())
                    .unwrap_or_default();
                let gold_imp = impls[gold_idx].clone();
                for imp in impls.iter_mut() {
                    let vals = profile.physical.iter().find(|p| p.name == imp.physical).and_then(|p| p.values.as_ref());
                    // Where it or gold was not asked (outside the gold result), no value counts.
                    let asked = |i: &Implementation, r: usize| i.scores.as_ref().is_none_or(|s| s[r].is_finite());
                    let unasked: Vec<bool> = (0..n).map(|r| !asked(imp, r) || !asked(&gold_imp, r)).collect();
                    imp.correct = vals
                        .map(|v| v.iter().zip(&gold_values).zip(&unasked).map(|((a, b), u)| a == b || *u).collect());
                }
            }
            ops.push(LogicalOp { name: l.name.clone(), kind: l.kind, impls, label });
        }
        Ok(Self { n, population: profile.population, query: profile.query.clone(), ops })
    }

    /// Sum of every implementation's cost per tuple (the cost of running everything): normalises the loss.
    pub fn total_cost(&self) -> f64 {
        self.ops.iter().flat_map(|o| o.impls.iter()).map(|i| i.cost).sum::<f64>().max(f64::MIN_POSITIVE)
    }

    /// Finds a stage by its physical name.
    pub fn locate(&self, physical: &str) -> Option<(usize, usize)> {
        self.ops
            .iter()
            .enumerate()
            .find_map(|(o, op)| op.impls.iter().position(|i| i.physical == physical).map(|i| (o, i)))
    }

    /// The gold plan: gold of every operator, in profile order.
    pub fn gold_plan(&self) -> HardPlan {
        HardPlan {
            stages: self
                .ops
                .iter()
                .enumerate()
                .map(|(o, op)| {
                    let th = (op.kind == LogicalKind::Filter).then_some(0.0);
                    Stage { op: o, imp: op.gold(), lower: th, upper: th }
                })
                .collect(),
        }
    }

    /// Marks the part of some implementations' cost that execution pays once per tuple for all of them: `shared`
    /// names, per physical implementation, its group (e.g. the model whose per-item prefill it pays) and the
    /// seconds per tuple of that part, which its `cost` already includes. [`evaluate`](Self::evaluate) then
    /// charges the part once per tuple that reaches any stage of the group; implementations not named (and
    /// seconds not finite and positive) are left alone.
    pub fn share_costs(&mut self, shared: &BTreeMap<String, (String, f64)>) {
        let groups: Vec<&String> = shared.values().map(|(g, _)| g).collect::<BTreeSet<_>>().into_iter().collect();
        for imp in self.ops.iter_mut().flat_map(|o| o.impls.iter_mut()) {
            imp.shared = shared.get(&imp.physical).and_then(|(g, secs)| {
                let secs = secs.min(imp.cost);
                (secs.is_finite() && secs > 0.0).then(|| (groups.iter().position(|x| *x == g).unwrap_or(0), secs))
            });
        }
    }

    /// Whether tuple `r` is in the gold result.
    pub fn gold_positive(&self, r: usize) -> bool {
        self.ops.iter().all(|o| o.label[r])
    }

    /// Executes a plan hard on the given tuples, exactly as the executor would (`docs/profile-format.md`).
    pub fn evaluate(&self, plan: &HardPlan, rows: &[usize]) -> Counts {
        self.evaluate_with_tally(plan, rows).0
    }

    /// Like [`evaluate`](Self::evaluate), also tallying each stage.
    pub fn evaluate_with_tally(&self, plan: &HardPlan, rows: &[usize]) -> (Counts, Vec<StageTally>) {
        /// A stage with what its decisions read looked up once (searches evaluate thousands of plans).
        struct Resolved<'a> {
            op: usize,
            kind: LogicalKind,
            /// The cost less its shared part.
            cost: f64,
            shared: Option<(usize, f64)>,
            scores: Option<&'a [f64]>,
            correct: Option<&'a [bool]>,
            lower: Option<f64>,
            upper: Option<f64>,
        }
        let n_ops = self.ops.len();
        let stages: Vec<Resolved> = plan
            .stages
            .iter()
            .map(|s| {
                let op = &self.ops[s.op];
                let imp = &op.impls[s.imp];
                Resolved {
                    op: s.op,
                    kind: op.kind,
                    cost: imp.cost - imp.shared.map_or(0.0, |(_, s)| s),
                    shared: imp.shared,
                    scores: imp.scores.as_deref(),
                    correct: imp.correct.as_deref(),
                    lower: s.lower,
                    upper: s.upper,
                }
            })
            .collect();
        let mut tally = vec![StageTally::default(); plan.stages.len()];
        let mut c = Counts { n: rows.len(), ..Default::default() };
        // Which operators the row being walked has decided, and which shared costs it has paid: marked with the
        // row's position, so nothing is cleared between rows.
        let mut decided_at = vec![usize::MAX; n_ops];
        let mut paid_at =
            vec![usize::MAX; stages.iter().filter_map(|s| s.shared).map(|(g, _)| g + 1).max().unwrap_or(0)];
        for (i, &r) in rows.iter().enumerate() {
            let mut alive = true;
            let mut n_decided = 0;
            let mut all_correct = true;
            for (s, t) in stages.iter().zip(tally.iter_mut()) {
                if decided_at[s.op] == i {
                    continue;
                }
                c.cost += s.cost;
                if let Some((g, secs)) = s.shared {
                    if paid_at[g] != i {
                        paid_at[g] = i;
                        c.cost += secs;
                    }
                }
                t.seen += 1;
                let score = s.scores.map(|v| v[r]);
                let decision = match s.kind {
                    LogicalKind::Filter => filter_decision(score.unwrap_or(0.0), s.lower, s.upper),
                    LogicalKind::Map => match score {
                        Some(conf) => map_decision(conf, s.upper),
                        None => Decision::Accept,
                    },
                };
                match decision {
                    Decision::Accept => {
                        decided_at[s.op] = i;
                        n_decided += 1;
                        if let Some(ok) = s.correct {
                            all_correct &= ok[r];
                        }
                    }
                    Decision::Reject => {
                        alive = false;
                        t.rejected += 1;
                        // A rejected tuple reaches no later stage.
                        break;
                    }
                    Decision::Unsure => t.unsure += 1,
                }
            }
            let in_result = alive && n_decided == n_ops;
            let positive = self.gold_positive(r);
            let tp = in_result && positive && all_correct;
            if tp {
                c.tp += 1.0;
            } else {
                if in_result {
                    c.fp += 1.0;
                }
                if positive {
                    c.fn_ += 1.0;
                }
            }
        }
        (c, tally)
    }

    /// All tuple indices.
    pub fn all_rows(&self) -> Vec<usize> {
        (0..self.n).collect()
    }

    /// Converts a hard plan to a plan file.
    pub fn to_plan_file(&self, plan: &HardPlan) -> PlanFile {
        let mut file = PlanFile::new(
            plan.stages
                .iter()
                .map(|s| PlanStage {
                    physical: self.ops[s.op].impls[s.imp].physical.clone(),
                    lower: s.lower,
                    upper: s.upper,
                })
                .collect(),
        );
        file.query = (!self.query.is_empty()).then(|| self.query.clone());
        file
    }

    /// Reads a plan file against this problem: every stage must name a profiled physical operator.
    pub fn from_plan_file(&self, file: &PlanFile) -> Result<HardPlan> {
        let mut stages = Vec::with_capacity(file.stages.len());
        for s in &file.stages {
            let (op, imp) = self.locate(&s.physical).ok_or_else(|| {
                OptimError::PlanMismatch(format!("stage `{}` names no physical operator of the profile", s.physical))
            })?;
            let im = &self.ops[op].impls[imp];
            if self.ops[op].kind == LogicalKind::Map && s.upper.is_some() && im.scores.is_none() {
                return Err(OptimError::PlanMismatch(format!(
                    "map stage `{}` has a threshold but the profile has no confidence scores for it",
                    s.physical
                )));
            }
            stages.push(Stage { op, imp, lower: s.lower, upper: s.upper });
        }
        for (o, op) in self.ops.iter().enumerate() {
            if !stages.iter().any(|s| s.op == o) {
                return Err(OptimError::PlanMismatch(format!("no stage implements logical operator `{}`", op.name)));
            }
        }
        Ok(HardPlan { stages })
    }
}

/// The rank of a tuple a map was not asked about (a score of +∞): above every threshold, so the stage decides it.
pub const UNASKED_RANK: f64 = 2.0;

/// [`mid_ranks`] of the finite scores among themselves; the others (a map's unasked tuples) get [`UNASKED_RANK`]
/// and no level, so thresholds fall between asked scores only.
fn asked_mid_ranks(scores: &[f64]) -> (Vec<f64>, Vec<(f64, f64)>) {
    let asked: Vec<usize> = (0..scores.len()).filter(|&r| scores[r].is_finite()).collect();
    if asked.len() == scores.len() {
        return mid_ranks(scores);
    }
    let (r, levels) = mid_ranks(&asked.iter().map(|&k| scores[k]).collect::<Vec<_>>());
    let mut ranks = vec![UNASKED_RANK; scores.len()];
    for (k, r) in asked.into_iter().zip(r) {
        ranks[k] = r;
    }
    (ranks, levels)
}

/// Mid-ranks scaled into (0, 1), and the distinct values with their rank.
fn mid_ranks(scores: &[f64]) -> (Vec<f64>, Vec<(f64, f64)>) {
    let n = scores.len();
    let mut idx: Vec<usize> = (0..n).collect();
    idx.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let mut ranks = vec![0.0; n];
    let mut levels = Vec::new();
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j + 1 < n && scores[idx[j + 1]] == scores[idx[i]] {
            j += 1;
        }
        let r = ((i + j) as f64 / 2.0 + 0.5) / n as f64;
        for &k in &idx[i..=j] {
            ranks[k] = r;
        }
        levels.push((scores[idx[i]], r));
        i = j + 1;
    }
    (ranks, levels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_thresholds_map_back_exactly() {
        let scores = vec![3.0, -1.0, 0.5, 0.5, 10.0, -7.0];
        let (ranks, levels) = mid_ranks(&scores);
        let imp = Implementation {
            physical: "x".into(),
            cost: 1.0,
            gold: false,
            scores: Some(scores.clone()),
            ranks: Some(ranks.clone()),
            levels,
            correct: None,
            shared: None,
        };
        for q in [0.0, 0.1, 0.3, 0.5, 0.58, 0.7, 0.99, 1.0] {
            let up = imp.upper_from_rank(q);
            let lo = imp.lower_from_rank(q);
            for (s, r) in scores.iter().zip(&ranks) {
                assert_eq!(*s > up, *r > q, "upper q={q} s={s}");
                assert_eq!(*s < lo, *r < q, "lower q={q} s={s}");
            }
        }
    }

    #[test]
    fn maps_unasked_outside_the_gold_result_change_no_plans_precision_or_recall() {
        use crate::workload::{generate, WorkloadConfig};
        let cfg = WorkloadConfig { operators: Some(3), map_share: Some(1.0), ..Default::default() };
        for seed in 0..8 {
            let w = generate(seed, &cfg);
            let full = Problem::from_profile(&w.sample).unwrap();
            assert_eq!(full.ops[0].kind, LogicalKind::Filter);
            // The same profile with every map left unasked on the tuples outside the gold result.
            let mut unasked = w.sample.clone();
            let outside: Vec<usize> = full.all_rows().into_iter().filter(|&r| !full.gold_positive(r)).collect();
            assert!(!outside.is_empty() && outside.len() < full.n, "seed {seed}");
            for e in unasked.physical.iter_mut().filter(|e| e.logical != w.sample.logical[0].name) {
                for &r in &outside {
                    if let Some(s) = e.scores.as_mut() {
                        s[r] = None;
                    }
                    e.values.as_mut().unwrap()[r] = None;
                }
            }
            let part = Problem::from_profile(&unasked).unwrap();
            let ranks = part.ops[1].impls[0].ranks.as_ref().unwrap();
            assert!(outside.iter().all(|&r| ranks[r] == UNASKED_RANK));
            assert!((0..full.n).filter(|r| !outside.contains(r)).all(|r| ranks[r] > 0.0 && ranks[r] < 1.0));
            // Plans: a cheap filter stage, then each map's cheapest candidate deciding every tuple or, with a
            // threshold, deferring to gold.
            let rows = full.all_rows();
            let filter = Stage { op: 0, imp: 0, lower: Some(-0.5), upper: Some(0.5) };
            let gold_filter = Stage { op: 0, imp: full.ops[0].gold(), lower: Some(0.0), upper: Some(0.0) };
            for upper in [None, Some(0.2), Some(0.6)] {
                let mut stages = vec![filter.clone(), gold_filter.clone()];
                for o in 1..full.ops.len() {
                    let th = upper.map(|q| full.ops[o].impls[0].upper_from_rank(q));
                    stages.push(Stage { op: o, imp: 0, lower: None, upper: th });
                    stages.push(Stage { op: o, imp: full.ops[o].gold(), lower: None, upper: None });
                }
                let plan = HardPlan { stages };
                let (a, b) = (full.evaluate(&plan, &rows), part.evaluate(&plan, &rows));
                assert_eq!((a.tp, a.fp, a.fn_), (b.tp, b.fp, b.fn_), "seed {seed} upper {upper:?}");
                if upper.is_none() {
                    assert!((a.cost - b.cost).abs() < 1e-9, "seed {seed}: {a:?} {b:?}");
                } else {
                    // Unasked tuples decide at the first stage: never dearer.
                    assert!(b.cost <= a.cost + 1e-9, "seed {seed}: {a:?} {b:?}");
                }
            }
        }
    }

    #[test]
    fn one_sided_filter_plans_are_exact_on_their_side_on_any_data() {
        use crate::workload::{generate, WorkloadConfig};
        let cfg = WorkloadConfig { operators: Some(2), map_share: Some(0.0), ..Default::default() };
        let w = generate(3, &cfg);
        let (sample, population) =
            (Problem::from_profile(&w.sample).unwrap(), Problem::from_profile(&w.population).unwrap());
        let cheap = |o: usize| (0..sample.ops[o].impls.len()).find(|&i| i != sample.ops[o].gold()).unwrap();
        let plan = |lower: f64, upper: f64| HardPlan {
            stages: (0..2)
                .flat_map(|o| {
                    [
                        Stage { op: o, imp: cheap(o), lower: Some(lower), upper: Some(upper) },
                        Stage { op: o, imp: sample.ops[o].gold(), lower: Some(0.0), upper: Some(0.0) },
                    ]
                })
                .collect(),
        };
        let all = population.all_rows();
        // Cheap stages that only reject (aggressively): no false positive on the whole population.
        let reject_only = plan(0.5, f64::MAX);
        assert_eq!(sample.exactness(&reject_only), Exactness { precision: true, recall: false });
        let c = population.evaluate(&reject_only, &all);
        assert!(c.fp == 0.0 && c.fn_ > 0.0, "{c:?}");
        // Cheap stages that only accept: no false negative.
        let accept_only = plan(f64::MIN, -0.5);
        assert_eq!(sample.exactness(&accept_only), Exactness { precision: false, recall: true });
        let c = population.evaluate(&accept_only, &all);
        assert!(c.fn_ == 0.0 && c.fp > 0.0, "{c:?}");
        // Finite thresholds on both sides guarantee nothing; gold alone is exact.
        assert_eq!(sample.exactness(&plan(-0.5, 0.5)), Exactness::default());
        assert_eq!(sample.exactness(&sample.gold_plan()), Exactness { precision: true, recall: true });
    }

    #[test]
    fn rescaled_plans_scale_cheap_decisions_and_keep_their_shape() {
        use crate::workload::{generate, WorkloadConfig};
        let cfg = WorkloadConfig { operators: Some(1), ..Default::default() };
        let w = generate(5, &cfg);
        let p = Problem::from_profile(&w.sample).unwrap();
        let rows = p.all_rows();
        let gold = p.ops[0].gold();
        let cheap = (0..p.ops[0].impls.len()).find(|&i| i != gold).unwrap();
        let scores = p.ops[0].impls[cheap].scores.clone().unwrap();
        let mut sorted = scores.clone();
        sorted.sort_by(f64::total_cmp);
        // Reject the lowest 40%: a reject-only cheap stage, then gold.
        let t = sorted[sorted.len() * 2 / 5];
        let plan = HardPlan {
            stages: vec![
                Stage { op: 0, imp: cheap, lower: Some(t), upper: Some(f64::MAX) },
                Stage { op: 0, imp: gold, lower: Some(0.0), upper: Some(0.0) },
            ],
        };
        let rejected = |plan: &HardPlan| p.evaluate_with_tally(plan, &rows).1[0].rejected as f64;
        let base = rejected(&plan);
        assert_eq!(p.rescale(&plan, &rows, 1.0), plan);
        for share in [0.25, 0.5, 0.75, 1.5] {
            let scaled = p.rescale(&plan, &rows, share);
            assert_eq!(scaled.stages.len(), 2);
            assert_eq!(scaled.stages[0].upper, Some(f64::MAX), "a reject-only stage stays reject-only");
            assert_eq!(p.exactness(&scaled), p.exactness(&plan));
            let r = rejected(&scaled);
            assert!((r - share * base).abs() <= 2.0, "share {share}: rejected {r} of {base}");
        }
        // No decisions left: the cheap stage goes, gold stays.
        let none = p.rescale(&plan, &rows, 0.0);
        assert_eq!(none.stages.len(), 1);
        assert_eq!(none.stages[0].imp, gold);
        // A plan whose cheap stage decided every tuple gets gold back when it no longer does.
        let alone = HardPlan { stages: vec![Stage { op: 0, imp: cheap, lower: Some(t), upper: Some(t) }] };
        let widened = p.rescale(&alone, &rows, 0.5);
        assert!(widened.stages.iter().any(|s| s.imp == gold));
        assert_eq!(p.evaluate(&widened, &rows).n, rows.len());
    }

    #[test]
    fn a_shared_cost_is_paid_once_per_tuple_that_reaches_any_stage_of_its_group() {
        // Two filters whose gold reads the big model's caches (1 s per answer + a 4 s prefill per item, priced into
        // both), a cheap one for `a` reading the small model's (0.5 + 1).
        let text = r#"{"format":"stretto.profile/v1","population":10,"tuples":["0","1","2","3"],
            "logical":[{"name":"a","kind":"filter"},{"name":"b","kind":"filter"}],
            "physical":[{"name":"a/big","logical":"a","cost":5,"scores":[1,1,1,-1],"gold":true},
                        {"name":"a/small","logical":"a","cost":1.5,"scores":[2,2,-2,-2]},
                        {"name":"b/big","logical":"b","cost":5,"scores":[1,1,1,1],"gold":true}]}"#;
        let mut p = Problem::from_profile(&Profile::parse(text, "t").unwrap()).unwrap();
        let rows = p.all_rows();
        let gold = p.gold_plan();
        // Priced per stage: gold asks a on 4 tuples and b on the 3 a lets through.
        assert!((p.evaluate(&gold, &rows).cost - 35.0).abs() < 1e-9);
        let shared: BTreeMap<String, (String, f64)> = [
            ("a/big".to_string(), ("big".to_string(), 4.0)),
            ("b/big".to_string(), ("big".to_string(), 4.0)),
            ("a/small".to_string(), ("small".to_string(), 1.0)),
        ]
        .into();
        p.share_costs(&shared);
        // Once per tuple: 4 prefills, 7 answers.
        assert!((p.evaluate(&gold, &rows).cost - 23.0).abs() < 1e-9);
        // The small model decides `a` on every tuple (accepts 0, 1, rejects 2, 3); b's gold then still reads the
        // big model's caches of the two tuples let through: each tuple pays the small prefill, those two the big one.
        let (ia, ib) = (p.ops[0].impls.iter().position(|i| i.physical == "a/small").unwrap(), p.ops[1].gold());
        let plan = HardPlan {
            stages: vec![
                Stage { op: 0, imp: ia, lower: Some(0.0), upper: Some(0.0) },
                Stage { op: 1, imp: ib, lower: Some(0.0), upper: Some(0.0) },
            ],
        };
        let c = p.evaluate(&plan, &rows);
        assert!((c.cost - (4.0 * 1.5 + 2.0 * 5.0)).abs() < 1e-9, "{}", c.cost);
        // Unnamed implementations, and parts that are not positive, are left alone.
        p.share_costs(&[("a/big".to_string(), ("big".to_string(), f64::NAN))].into());
        assert!((p.evaluate(&gold, &rows).cost - 35.0).abs() < 1e-9);
    }
}
