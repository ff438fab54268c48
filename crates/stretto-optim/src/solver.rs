//! Projected Adam as an `argmin` [`Solver`], the two-stage temperature schedule, parallel restarts and
//! temperature-0 extraction of a hard plan.
//!
//! argmin ships neither Adam nor a bound-constrained solver, so [`ProjectedAdam`] is one: after each Adam step the
//! parameters are projected onto the box `[-clip, clip]`, which keeps every sigmoid out of its flat tails so that
//! gradients keep flowing while temperatures anneal. The objective changes with the iteration (the schedule), so the
//! solver talks to an [`AnnealedObjective`] that takes the iteration number.

use std::cell::RefCell;

use argmin::core::{CostFunction, Error, Executor, IterState, Problem as ArgminProblem, Solver, State, KV};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use stretto_core::op::LogicalKind;

use crate::bounds::beta_lower_bound;
use crate::problem::{HardPlan, Problem, Stage};
use crate::soft::{
    parameter_layout, Constraint, LossConfig, LossParts, LossScratch, Sides, SoftProblem, PARAMS_PER_IMPL,
};

/// An objective whose shape depends on the iteration (annealed temperatures).
pub trait AnnealedObjective {
    /// Loss and gradient at iteration `iter`.
    fn loss_grad(&self, x: &[f64], iter: u64) -> (LossParts, Vec<f64>);
    /// Box bound of every parameter.
    fn clip(&self) -> f64;
}

/// Adam with projection onto a box, as an argmin solver.
#[derive(Debug, Clone)]
pub struct ProjectedAdam {
    /// Initial learning rate.
    pub lr: f64,
    /// Multiplicative learning-rate decay per step.
    pub decay: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Numerical floor.
    pub eps: f64,
    m: Vec<f64>,
    v: Vec<f64>,
}

impl ProjectedAdam {
    /// Adam with the published hyper-parameters (β1 0.9, β2 0.999) and the given learning rate and decay.
    pub fn new(lr: f64, decay: f64) -> Self {
        Self { lr, decay, beta1: 0.9, beta2: 0.999, eps: 1e-8, m: vec![], v: vec![] }
    }
}

/// The solver's view of an [`AnnealedObjective`]: argmin wants a `CostFunction`; the gradient comes with it.
pub struct Annealed<'a, O: AnnealedObjective>(pub &'a O);

impl<O: AnnealedObjective> CostFunction for Annealed<'_, O> {
    type Param = Vec<f64>;
    type Output = f64;
    fn cost(&self, x: &Self::Param) -> Result<f64, Error> {
        Ok(self.0.loss_grad(x, 0).0.loss)
    }
}

type AdamState = IterState<Vec<f64>, Vec<f64>, (), (), (), f64>;

impl<O: AnnealedObjective> Solver<Annealed<'_, O>, AdamState> for ProjectedAdam {
    fn name(&self) -> &str {
        "Projected Adam"
    }

    fn next_iter(
        &mut self,
        problem: &mut ArgminProblem<Annealed<'_, O>>,
        state: AdamState,
    ) -> Result<(AdamState, Option<KV>), Error> {
        let iter = state.get_iter();
        let x =
            state.get_param().ok_or_else(|| Error::msg("Projected Adam needs an initial parameter vector"))?.clone();
        let (parts, g) = problem.problem("loss_grad", |p| Ok(p.0.loss_grad(&x, iter)))?;
        let clip = problem.problem("clip", |p| Ok(p.0.clip()))?;
        if self.m.len() != x.len() {
            self.m = vec![0.0; x.len()];
            self.v = vec![0.0; x.len()];
        }
        let t = (iter + 1) as f64;
        let lr = self.lr * self.decay.powf(iter as f64);
        let (b1, b2) = (self.beta1, self.beta2);
        let mut next = x;
        for i in 0..next.len() {
            self.m[i] = b1 * self.m[i] + (1.0 - b1) * g[i];
            self.v[i] = b2 * self.v[i] + (1.0 - b2) * g[i] * g[i];
            let mh = self.m[i] / (1.0 - b1.powf(t));
            let vh = self.v[i] / (1.0 - b2.powf(t));
            next[i] = (next[i] - lr * mh / (vh.sqrt() + self.eps)).clamp(-clip, clip);
        }
        Ok((state.param(next).cost(parts.loss), None))
    }
}

/// Settings of the solve.
#[derive(Debug, Clone)]
pub struct SolverSettings {
    /// Independent restarts, run in parallel.
    pub restarts: usize,
    /// Steps of the first stage (operators chosen, thresholds moving).
    pub pick_steps: u64,
    /// Steps of the second stage (picks frozen, thresholds tuned).
    pub threshold_steps: u64,
    /// Learning rate.
    pub lr: f64,
    /// Learning-rate decay per step.
    pub decay: f64,
    /// Initial pick temperature (`T_pick = t_pick0 · e^{−0.008 i}`).
    pub t_pick0: f64,
    /// Pick temperature decay rate.
    pub t_pick_rate: f64,
    /// Threshold temperature in rank units during the first stage, and start of the second.
    pub t_par0: f64,
    /// Threshold temperature decay rate in the second stage.
    pub t_par_rate: f64,
    /// Parameter box.
    pub clip: f64,
    /// Penalty weights of the restarts are log-spaced over this range (published: 1 to 100).
    pub beta_range: (f64, f64),
    /// Seed.
    pub seed: u64,
}

impl Default for SolverSettings {
    fn default() -> Self {
        // The published schedule (256 restarts, 315 + 235 steps, T_pick 0.11·e^{−0.008i}, T_par 0.11·e^{−0.003i},
        // lr 0.009 decaying by 0.99984) is shortened here: on 2 CPU cores a whole certified search (several
        // candidate solves) must fit in about a second. Fewer steps with a larger learning rate reach the same
        // temperatures; threshold temperatures are in rank units (share of tuples). On the generated workloads, 4
        // restarts found plans as cheap as 8 (measured with `examples/workload_eval.rs`).
        Self {
            restarts: 4,
            pick_steps: 160,
            threshold_steps: 120,
            lr: 0.05,
            decay: 0.999,
            t_pick0: 0.11,
            t_pick_rate: 0.015,
            t_par0: 0.04,
            t_par_rate: 0.006,
            clip: 6.0,
            beta_range: (1.0, 100.0),
            seed: 0,
        }
    }
}

/// The two stages of the schedule: choose operators (thresholds move too), then tune thresholds with picks frozen.
#[derive(Debug, Clone, Copy)]
enum Phase {
    Pick,
    Threshold,
}

/// The relaxed loss under the annealing schedule of one phase.
struct Scheduled<'a> {
    soft: &'a SoftProblem,
    cfg: LossConfig,
    settings: &'a SolverSettings,
    phase: Phase,
    /// The loss's working memory, kept across the phase's steps (one restart's, on one thread).
    scratch: RefCell<LossScratch>,
}

impl<'a> Scheduled<'a> {
    fn new(soft: &'a SoftProblem, cfg: LossConfig, settings: &'a SolverSettings, phase: Phase) -> Self {
        Self { soft, cfg, settings, phase, scratch: RefCell::default() }
    }
}

impl AnnealedObjective for Scheduled<'_> {
    fn loss_grad(&self, x: &[f64], iter: u64) -> (LossParts, Vec<f64>) {
        let s = self.settings;
        let mut cfg = self.cfg.clone();
        match self.phase {
            Phase::Pick => {
                cfg.t_pick = s.t_pick0 * (-s.t_pick_rate * iter as f64).exp();
                cfg.t_par = s.t_par0;
            }
            Phase::Threshold => cfg.t_par = s.t_par0 * (-s.t_par_rate * iter as f64).exp(),
        }
        let mut g = vec![0.0; x.len()];
        let parts = self.soft.loss_in(x, &cfg, Some(&mut g), &mut self.scratch.borrow_mut());
        (parts, g)
    }
    fn clip(&self) -> f64 {
        self.settings.clip
    }
}

fn run_adam<O: AnnealedObjective>(
    objective: &O,
    x0: Vec<f64>,
    steps: u64,
    settings: &SolverSettings,
) -> Result<Vec<f64>, Error> {
    if steps == 0 {
        return Ok(x0);
    }
    let solver = ProjectedAdam::new(settings.lr, settings.decay);
    let result = Executor::new(Annealed(objective), solver).configure(|s| s.param(x0).max_iters(steps)).run()?;
    result.state.get_param().cloned().ok_or_else(|| Error::msg("solver returned no parameters"))
}

/// One restart's starting point: every 8th neutral (`s = 0`, thresholds at the 20th and 80th percentile), the
/// rest uniform in [−2, 2].
fn initial_point(n_params: usize, restart: usize, rng: &mut StdRng) -> Vec<f64> {
    let logit = |p: f64| (p / (1.0 - p)).ln();
    (0..n_params)
        .map(|i| {
            if restart.is_multiple_of(8) {
                match i % PARAMS_PER_IMPL {
                    0 => 0.0,
                    1 => logit(0.2),
                    _ => logit(0.8),
                }
            } else {
                rng.random_range(-2.0..2.0)
            }
        })
        .collect()
}

/// Extracts the hard plan at temperature 0: a non-gold stage is kept iff its pick score is positive and it still
/// receives tuples on `rows`; crossed thresholds collapse to their midpoint; gold closes every cascade. Stages are
/// listed operator by operator (ordering comes later).
pub fn extract(problem: &Problem, x: &[f64], rows: &[usize], sides: Sides) -> HardPlan {
    let layout = parameter_layout(problem);
    let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
    let mut stages = Vec::new();
    for (o, op) in problem.ops.iter().enumerate() {
        for (k, &(po, pi)) in layout.iter().enumerate() {
            if po != o {
                continue;
            }
            let base = k * PARAMS_PER_IMPL;
            if x[base] <= 0.0 {
                continue;
            }
            let imp = &op.impls[pi];
            let stage = match op.kind {
                LogicalKind::Filter => {
                    let (mut lo, mut hi) = (sig(x[base + 1]), sig(x[base + 2]));
                    if lo >= hi {
                        let mid = 0.5 * (lo + hi);
                        lo = mid;
                        hi = mid;
                    }
                    let (lower, upper) = match sides {
                        // Never accept (reject), also on unseen tuples beyond the sample's scores.
                        Sides::RejectOnly => (imp.lower_from_rank(sig(x[base + 1])), f64::MAX),
                        Sides::AcceptOnly => (f64::MIN, imp.upper_from_rank(sig(x[base + 2]))),
                        Sides::Both => (imp.lower_from_rank(lo), imp.upper_from_rank(hi)),
                    };
                    Stage { op: o, imp: pi, lower: Some(lower.min(upper)), upper: Some(upper) }
                }
                LogicalKind::Map => Stage {
                    op: o,
                    imp: pi,
                    lower: None,
                    upper: imp.scores.as_ref().map(|_| imp.upper_from_rank(sig(x[base + 2]))),
                },
            };
            stages.push(stage);
        }
        let th = (op.kind == LogicalKind::Filter).then_some(0.0);
        stages.push(Stage { op: o, imp: op.gold(), lower: th, upper: th });
    }
    prune_idle_stages(problem, HardPlan { stages }, rows)
}

/// Drops non-gold stages that no tuple of `rows` reaches: they cost nothing on the sample but would on new data
/// without evidence that they help.
pub fn prune_idle_stages(problem: &Problem, plan: HardPlan, rows: &[usize]) -> HardPlan {
    let (_, tally) = problem.evaluate_with_tally(&plan, rows);
    let stages = plan
        .stages
        .into_iter()
        .zip(tally)
        .filter(|(s, t)| problem.ops[s.op].impls[s.imp].gold || t.seen > 0)
        .map(|(s, _)| s)
        .collect();
    HardPlan { stages }
}

/// Whether a hard plan's exact bounds on `rows` meet the targets under `cfg`'s constraint form.
pub fn hard_bounds_ok(problem: &Problem, plan: &HardPlan, rows: &[usize], cfg: &LossConfig) -> bool {
    match cfg.constraint {
        Constraint::Global => {
            let c = problem.evaluate(plan, rows);
            let exact = problem.exactness(plan);
            (exact.precision || beta_lower_bound(c.tp, c.fp, cfg.credible) >= cfg.precision)
                && (exact.recall || beta_lower_bound(c.tp, c.fn_, cfg.credible) >= cfg.recall)
        }
        Constraint::Product { credible_each } => {
            let per = per_operator_counts(problem, plan, rows);
            let p: f64 = per.iter().map(|c| beta_lower_bound(c.0, c.1, credible_each)).product();
            let r: f64 = per.iter().map(|c| beta_lower_bound(c.0, c.2, credible_each)).product();
            p >= cfg.precision && r >= cfg.recall
        }
        Constraint::Each { precision_each, recall_each, credible_each } => {
            per_operator_counts(problem, plan, rows).iter().all(|c| {
                beta_lower_bound(c.0, c.1, credible_each) >= precision_each
                    && beta_lower_bound(c.0, c.2, credible_each) >= recall_each
            })
        }
    }
}

/// Per logical operator, its own (TP, FP, FN) under the plan's stages for it, each operator judged alone.
pub fn per_operator_counts(problem: &Problem, plan: &HardPlan, rows: &[usize]) -> Vec<(f64, f64, f64)> {
    (0..problem.ops.len())
        .map(|o| {
            let sub = Problem { ops: vec![problem.ops[o].clone()], ..problem.clone() };
            let stages = plan.stages.iter().filter(|s| s.op == o).map(|s| Stage { op: 0, ..s.clone() }).collect();
            let c = sub.evaluate(&HardPlan { stages }, rows);
            (c.tp, c.fp, c.fn_)
        })
        .collect()
}

/// The result of a solve.
#[derive(Debug, Clone)]
pub struct Solution {
    /// The hard plan (stages grouped by operator, not yet ordered).
    pub plan: HardPlan,
    /// Whether its exact bounds on the solve's tuples meet the targets.
    pub feasible: bool,
    /// Its hard cost per tuple on the solve's tuples.
    pub cost: f64,
}

/// Minimises the relaxed loss on `rows` from many restarts (in parallel) and returns the cheapest extracted plan
/// whose exact bounds on `rows` meet the targets, or the one with the lowest loss if none does.
pub fn solve(
    problem: &Problem,
    rows: &[usize],
    cfg: &LossConfig,
    settings: &SolverSettings,
) -> Result<Solution, Error> {
    let _span = tracing::debug_span!("solve", rows = rows.len(), restarts = settings.restarts).entered();
    let soft = SoftProblem::new(problem, rows);
    let np = soft.n_params();
    if np == 0 {
        let plan = problem.gold_plan();
        let cost = problem.evaluate(&plan, rows).cost_per_tuple();
        return Ok(Solution { feasible: true, plan, cost });
    }
    let results: Vec<Result<(HardPlan, f64), Error>> = (0..settings.restarts.max(1))
        .into_par_iter()
        .map(|restart| {
            let mut rng = StdRng::seed_from_u64(settings.seed.wrapping_mul(1_000_003).wrapping_add(restart as u64));
            let x0 = initial_point(np, restart, &mut rng);
            let (b0, b1) = settings.beta_range;
            let frac = if settings.restarts > 1 { restart as f64 / (settings.restarts - 1) as f64 } else { 0.5 };
            let cfg = &LossConfig { beta: b0 * (b1 / b0).powf(frac), ..cfg.clone() };
            let s1 = Scheduled::new(&soft, cfg.clone(), settings, Phase::Pick);
            let x1 = run_adam(&s1, x0, settings.pick_steps, settings)?;
            let picks: Vec<bool> = (0..np / PARAMS_PER_IMPL).map(|k| x1[k * PARAMS_PER_IMPL] > 0.0).collect();
            let s2 = Scheduled::new(&soft, LossConfig { frozen: Some(picks), ..cfg.clone() }, settings, Phase::Threshold);
            let x2 = run_adam(&s2, x1, settings.threshold_steps, settings)?;
            let parts = s2.loss_grad(&x2, settings.threshold_steps).0;
            let plan = extract(problem, &x2, rows, cfg.sides);
            let c = problem.evaluate(&plan, rows);
            tracing::trace!(restart, beta = cfg.beta, soft = ?parts, hard_tp = c.tp, hard_fp = c.fp, hard_fn = c.fn_, stages = plan.stages.len(), "restart");
            Ok((plan, parts.loss))
        })
        .collect();
    let mut best: Option<Solution> = None;
    let mut best_loss: Option<(f64, HardPlan)> = None;
    for r in results {
        let (plan, loss) = r?;
        let feasible = hard_bounds_ok(problem, &plan, rows, cfg);
        let cost = problem.evaluate(&plan, rows).cost_per_tuple();
        if feasible && best.as_ref().is_none_or(|b| cost < b.cost) {
            best = Some(Solution { plan: plan.clone(), feasible, cost });
        }
        if best_loss.as_ref().is_none_or(|(l, _)| loss < *l) {
            best_loss = Some((loss, plan));
        }
    }
    Ok(best.unwrap_or_else(|| {
        let plan = best_loss.map(|(_, p)| p).unwrap_or_else(|| problem.gold_plan());
        let cost = problem.evaluate(&plan, rows).cost_per_tuple();
        Solution { plan, feasible: false, cost }
    }))
}
