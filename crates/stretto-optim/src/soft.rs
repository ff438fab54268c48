//! The relaxed cascade (`docs/stretto-method.md` §5) and its exact gradient.
//!
//! Parameters are a flat `Vec<f64>` with three entries per non-gold implementation, in problem order:
//! pick score `s`, and unconstrained `x_lo`, `x_hi` whose sigmoids are the thresholds in rank space (each
//! implementation's scores replaced by their mid-rank in (0, 1)). Gold is always picked with thresholds 0.
//!
//! Per tuple and logical operator the cascade is a chain: starting unsure (`U = 1`), stage k accepts with
//! `U·p_k·q_acc`, rejects with `U·p_k·q_rej`, and passes the rest on. Maps are filters over (row, value)
//! candidates; because every stage either decides a row's value or passes the whole row on, the soft count of the
//! correct candidate reduces to `Σ_k U_k·d_k·[value_k correct] + U_gold`. Global soft counts combine operators
//! without any independence assumption (`TP = Σ_r Π_c tp_c(r)`, ...). The gradient is written out by hand (reverse
//! mode through the chain, then through the products) and tested against finite differences.
//!
//! The loss is the optimizer's innermost loop (hundreds of evaluations per solve). Both passes walk an operator's
//! chain a stage at a time over all rows, each row seeing exactly the arithmetic, in the order, of walking its own
//! chain; the bounds' slopes (four more quantiles each) are computed only while their penalty is active. A solve
//! keeps its working memory between steps ([`LossScratch`]), with each stage's rows' `exp(v / t)`, so a row's soft
//! decisions need no exponential of their own while the threshold temperature stays put (see `StageExp`).

use stretto_core::op::LogicalKind;

use crate::bounds::{beta_lower_bound, beta_lower_bound_slopes};
use crate::problem::Problem;

/// Parameters per non-gold implementation.
pub const PARAMS_PER_IMPL: usize = 3;

/// How the precision/recall constraints are formed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Constraint {
    /// Bounds on the global counts of the whole query (Stretto).
    Global,
    /// Per-operator bounds at a per-operator credible level; constraint on their product (Stretto-Independent).
    Product {
        /// Credible level of each operator's bound.
        credible_each: f64,
    },
    /// Each operator must meet its own target at its own level (Stretto-Local).
    Each {
        /// Per-operator precision target.
        precision_each: f64,
        /// Per-operator recall target.
        recall_each: f64,
        /// Credible level of each operator's bound.
        credible_each: f64,
    },
}

/// Everything the loss needs besides the parameters.
#[derive(Debug, Clone)]
pub struct LossConfig {
    /// Precision target.
    pub precision: f64,
    /// Recall target.
    pub recall: f64,
    /// Credible level of the (global) bounds.
    pub credible: f64,
    /// Penalty weight.
    pub beta: f64,
    /// How the constraint is formed.
    pub constraint: Constraint,
    /// Pick temperature (ignored when picks are frozen).
    pub t_pick: f64,
    /// Threshold temperature, in rank units.
    pub t_par: f64,
    /// Hard picks, when frozen (second stage of the schedule).
    pub frozen: Option<Vec<bool>>,
    /// Which decisions non-gold filter stages may make.
    pub sides: Sides,
}

/// Which decisions the non-gold stages of a filter may make. One-sided plans are a safer family: with cheap
/// stages that only reject, every accepted tuple passed gold, so a filters-only plan has no false positives on
/// any data (and symmetrically, cheap stages that only accept lose no positive), and only the other side of the
/// targets needs evidence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sides {
    /// Accept, reject or pass on.
    #[default]
    Both,
    /// Reject or pass on.
    RejectOnly,
    /// Accept or pass on.
    AcceptOnly,
}

/// The loss's parts, for reporting.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LossParts {
    /// Total loss.
    pub loss: f64,
    /// Normalised expected cost.
    pub cost: f64,
    /// Soft precision bound (global, or the product).
    pub lb_precision: f64,
    /// Soft recall bound.
    pub lb_recall: f64,
}

/// One non-gold stage, prepared for the relaxation over a subset of tuples.
#[derive(Debug, Clone)]
struct SoftStage {
    param: usize,
    cost: f64,
    tunable: bool,
    /// Rank-space score (filter) or confidence (map) per subset tuple.
    v: Vec<f64>,
    /// The largest `|v|`, which decides whether [`StageExp`] may be used.
    v_max: f64,
    /// Map: 1 if the value is correct.
    correct: Vec<f64>,
}

#[derive(Debug, Clone)]
struct SoftOp {
    kind: LogicalKind,
    stages: Vec<SoftStage>,
    gold_cost: f64,
    /// Filter: gold accepts (0/1). Map: unused.
    gold_accept: Vec<f64>,
}

/// The relaxation of a problem over a subset of its tuples.
#[derive(Debug, Clone)]
pub struct SoftProblem {
    ops: Vec<SoftOp>,
    rows: usize,
    n_params: usize,
    total_cost: f64,
}

/// Indices of the non-gold implementations in parameter order: (op, imp).
pub fn parameter_layout(problem: &Problem) -> Vec<(usize, usize)> {
    problem
        .ops
        .iter()
        .enumerate()
        .flat_map(|(o, op)| (0..op.impls.len()).filter(|&i| !op.impls[i].gold).map(move |i| (o, i)))
        .collect()
}

fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// Per-stage quantities derived from the parameters once per evaluation.
#[derive(Debug, Clone, Copy, Default)]
struct StageParams {
    p: f64,
    dp_ds: f64,
    lo: f64,
    hi: f64,
    dlo_dx: f64,
    dhi_dx: f64,
}

impl SoftProblem {
    /// Prepares the relaxation of `problem` over the tuples `rows`.
    pub fn new(problem: &Problem, rows: &[usize]) -> Self {
        let layout = parameter_layout(problem);
        let ops = problem
            .ops
            .iter()
            .enumerate()
            .map(|(o, op)| {
                let stages = op
                    .impls
                    .iter()
                    .enumerate()
                    .filter(|(_, i)| !i.gold)
                    .map(|(k, imp)| {
                        let v: Vec<f64> = imp
                            .ranks
                            .as_ref()
                            .map(|r| rows.iter().map(|&i| r[i]).collect())
                            .unwrap_or_else(|| vec![0.0; rows.len()]);
                        SoftStage {
                            param: layout.iter().position(|&(a, b)| a == o && b == k).unwrap_or(0) * PARAMS_PER_IMPL,
                            cost: imp.cost,
                            tunable: imp.ranks.is_some(),
                            v_max: v.iter().fold(0.0, |m: f64, x| m.max(x.abs())),
                            v,
                            correct: imp
                                .correct
                                .as_ref()
                                .map(|c| rows.iter().map(|&i| f64::from(u8::from(c[i]))).collect())
                                .unwrap_or_default(),
                        }
                    })
                    .collect();
                let gold = &op.impls[op.gold()];
                SoftOp {
                    kind: op.kind,
                    stages,
                    gold_cost: gold.cost,
                    gold_accept: rows.iter().map(|&i| f64::from(u8::from(op.label[i]))).collect(),
                }
            })
            .collect();
        Self { ops, rows: rows.len(), n_params: layout.len() * PARAMS_PER_IMPL, total_cost: problem.total_cost() }
    }

    /// Number of parameters.
    pub fn n_params(&self) -> usize {
        self.n_params
    }

    fn stage_params(&self, x: &[f64], cfg: &LossConfig, out: &mut Vec<StageParams>) {
        out.clear();
        out.resize(self.n_params / PARAMS_PER_IMPL, StageParams::default());
        for (k, sp) in out.iter_mut().enumerate() {
            let base = k * PARAMS_PER_IMPL;
            let (p, dp_ds) = match &cfg.frozen {
                Some(f) => (if f[k] { 1.0 } else { 0.0 }, 0.0),
                None => {
                    let p = sigmoid(x[base] / cfg.t_pick);
                    // Once annealing has switched a stage off, its effect and its gradient are below 1e-9: treat
                    // it as off, which lets both passes skip it.
                    if p < 1e-9 {
                        (0.0, 0.0)
                    } else {
                        (p, p * (1.0 - p) / cfg.t_pick)
                    }
                }
            };
            let lo = sigmoid(x[base + 1]);
            let hi = sigmoid(x[base + 2]);
            *sp = StageParams { p, dp_ds, lo, hi, dlo_dx: lo * (1.0 - lo), dhi_dx: hi * (1.0 - hi) };
        }
    }

    /// The loss, and its gradient into `grad` when given.
    pub fn loss(&self, x: &[f64], cfg: &LossConfig, grad: Option<&mut [f64]>) -> LossParts {
        self.loss_in(x, cfg, grad, &mut LossScratch::default())
    }

    /// [`loss`](Self::loss) with its working memory in `scratch`, which a caller evaluating the loss many times
    /// (a solve's steps) keeps between calls: the same result, without allocating and clearing it each time.
    pub fn loss_in(
        &self,
        x: &[f64],
        cfg: &LossConfig,
        grad: Option<&mut [f64]>,
        scratch: &mut LossScratch,
    ) -> LossParts {
        let n_ops = self.ops.len();
        let n = self.rows;
        let t = cfg.t_par;
        let want_grad = grad.is_some();
        let LossScratch { sp, exps, outcome, u, row_cost, traces, up, rc, sgrad, d_out, v } = scratch;
        self.stage_params(x, cfg, sp);
        let sp = &sp[..];
        exps.resize_with(sp.len(), StageExp::default);
        // Forward: per operator, every row's chain outcome (filter: accept mass A; map: correct mass) and cost,
        // stage by stage over all rows; with a gradient wanted, each operator's trace for the reverse pass.
        outcome.resize(n_ops * n, 0.0);
        u.resize(n, 0.0);
        row_cost.resize(n, 0.0);
        if want_grad {
            traces.resize_with(n_ops, Trace::default);
            for (trace, op) in traces.iter_mut().zip(&self.ops) {
                trace.fit(op.stages.len(), n);
            }
        }
        let mut cost_sum = 0.0;
        for (o, op) in self.ops.iter().enumerate() {
            let trace = if want_grad { Some(&mut traces[o]) } else { None };
            let out = &mut outcome[o * n..(o + 1) * n];
            chain_forward(op, sp, t, cfg.sides, out, u, row_cost, trace, exps);
            // Row by row, in the order the per-row sum always took.
            for c in row_cost.iter() {
                cost_sum += c;
            }
        }
        let outcome = &outcome[..];
        // Per row, per operator soft counts.
        let counts =
            |o: usize, r: usize| -> RowCounts { row_counts(self.ops[o].kind, outcome[o * n + r], &self.ops[o], r) };
        let norm = 1.0 / (n.max(1) as f64 * self.total_cost);
        let cost = cost_sum * norm;

        let mut parts = LossParts { cost, ..Default::default() };
        // Upstream gradients: per (op,row) of tp, fp, fn, pp (every entry is written below when wanted).
        if want_grad {
            up.resize(n_ops * n, RowCounts::default());
        }
        let mut penalty = 0.0;
        match cfg.constraint {
            Constraint::Global => {
                let (mut tp, mut fp, mut fnn) = (0.0, 0.0, 0.0);
                for r in 0..n {
                    let g = global_row(n_ops, |o| counts(o, r));
                    tp += g.0;
                    fp += g.1;
                    fnn += g.2;
                }
                // The bounds' slopes are wanted only where their penalty is active (most steps near the end of a
                // solve have none): four more quantiles each.
                let lbp = beta_lower_bound(tp, fp, cfg.credible);
                let lbr = beta_lower_bound(tp, fnn, cfg.credible);
                parts.lb_precision = lbp;
                parts.lb_recall = lbr;
                let (mut g_tp, mut g_fp, mut g_fn) = (0.0, 0.0, 0.0);
                // One-sided plans over filters are exact on one side on any data (see `Sides`), which then needs
                // no bound.
                let filters_only = self.ops.iter().all(|o| o.kind == LogicalKind::Filter);
                let exact_precision = filters_only && cfg.sides == Sides::RejectOnly;
                let exact_recall = filters_only && cfg.sides == Sides::AcceptOnly;
                if exact_precision {
                    parts.lb_precision = 1.0;
                } else if lbp < cfg.precision {
                    penalty += cfg.beta * (cfg.precision - lbp);
                    let (dp_tp, dp_fp) =
                        if want_grad { beta_lower_bound_slopes(tp, fp, cfg.credible, lbp) } else { (0.0, 0.0) };
                    g_tp -= cfg.beta * dp_tp;
                    g_fp -= cfg.beta * dp_fp;
                }
                if exact_recall {
                    parts.lb_recall = 1.0;
                } else if lbr < cfg.recall {
                    penalty += cfg.beta * (cfg.recall - lbr);
                    let (dr_tp, dr_fn) =
                        if want_grad { beta_lower_bound_slopes(tp, fnn, cfg.credible, lbr) } else { (0.0, 0.0) };
                    g_tp -= cfg.beta * dr_tp;
                    g_fn -= cfg.beta * dr_fn;
                }
                if want_grad {
                    for r in 0..n {
                        rc.clear();
                        rc.extend((0..n_ops).map(|o| counts(o, r)));
                        global_row_backward(rc, g_tp, g_fp, g_fn, |o, d| up[o * n + r] = d);
                    }
                }
            }
            Constraint::Product { credible_each } | Constraint::Each { credible_each, .. } => {
                // Per operator: its counts and bounds; the slopes only where a penalty needs them.
                let mut counts_each = Vec::with_capacity(n_ops);
                let mut lbs = Vec::with_capacity(n_ops);
                for o in 0..n_ops {
                    let (mut tp, mut fp, mut fnn) = (0.0, 0.0, 0.0);
                    for r in 0..n {
                        let c = counts(o, r);
                        tp += c.tp;
                        fp += c.fp;
                        fnn += c.fn_;
                    }
                    counts_each.push((tp, fp, fnn));
                    lbs.push((beta_lower_bound(tp, fp, credible_each), beta_lower_bound(tp, fnn, credible_each)));
                }
                // Operator o's slopes of its precision bound (`recall` false) or its recall bound.
                let slopes = |o: usize, recall: bool| -> (f64, f64) {
                    let (tp, fp, fnn) = counts_each[o];
                    let (failures, lb) = if recall { (fnn, lbs[o].1) } else { (fp, lbs[o].0) };
                    if want_grad {
                        beta_lower_bound_slopes(tp, failures, credible_each, lb)
                    } else {
                        (0.0, 0.0)
                    }
                };
                // d penalty / d (TP_o, FP_o, FN_o)
                let mut g = vec![(0.0, 0.0, 0.0); n_ops];
                if let Constraint::Each { precision_each, recall_each, .. } = cfg.constraint {
                    parts.lb_precision = lbs.iter().map(|l| l.0).fold(1.0, f64::min);
                    parts.lb_recall = lbs.iter().map(|l| l.1).fold(1.0, f64::min);
                    for (o, (lbp, lbr)) in lbs.iter().copied().enumerate() {
                        if lbp < precision_each {
                            penalty += cfg.beta * (precision_each - lbp);
                            let (dp_tp, dp_fp) = slopes(o, false);
                            g[o].0 -= cfg.beta * dp_tp;
                            g[o].1 -= cfg.beta * dp_fp;
                        }
                        if lbr < recall_each {
                            penalty += cfg.beta * (recall_each - lbr);
                            let (dr_tp, dr_fn) = slopes(o, true);
                            g[o].0 -= cfg.beta * dr_tp;
                            g[o].2 -= cfg.beta * dr_fn;
                        }
                    }
                } else {
                    let prod_p: f64 = lbs.iter().map(|l| l.0).product();
                    let prod_r: f64 = lbs.iter().map(|l| l.1).product();
                    parts.lb_precision = prod_p;
                    parts.lb_recall = prod_r;
                    let others = |o: usize, which: usize| -> f64 {
                        lbs.iter()
                            .enumerate()
                            .filter(|(j, _)| *j != o)
                            .map(|(_, l)| if which == 0 { l.0 } else { l.1 })
                            .product()
                    };
                    if prod_p < cfg.precision {
                        penalty += cfg.beta * (cfg.precision - prod_p);
                        for (o, g) in g.iter_mut().enumerate() {
                            let w = cfg.beta * others(o, 0);
                            let (dp_tp, dp_fp) = slopes(o, false);
                            g.0 -= w * dp_tp;
                            g.1 -= w * dp_fp;
                        }
                    }
                    if prod_r < cfg.recall {
                        penalty += cfg.beta * (cfg.recall - prod_r);
                        for (o, g) in g.iter_mut().enumerate() {
                            let w = cfg.beta * others(o, 1);
                            let (dr_tp, dr_fn) = slopes(o, true);
                            g.0 -= w * dr_tp;
                            g.2 -= w * dr_fn;
                        }
                    }
                }
                if want_grad {
                    for o in 0..n_ops {
                        for r in 0..n {
                            up[o * n + r] = RowCounts { tp: g[o].0, fp: g[o].1, fn_: g[o].2, pp: 0.0 };
                        }
                    }
                }
            }
        }
        parts.loss = cost + penalty;

        if let Some(grad) = grad {
            grad.iter_mut().for_each(|g| *g = 0.0);
            sgrad.clear();
            sgrad.resize(sp.len(), [0.0f64; 3]);
            d_out.resize(n, 0.0);
            for (o, (op, trace)) in self.ops.iter().zip(traces.iter()).enumerate() {
                for (r, d) in d_out.iter_mut().enumerate() {
                    let u = up[o * n + r];
                    *d = match op.kind {
                        LogicalKind::Filter => {
                            let y = op.gold_accept[r];
                            u.tp * y + u.fp * (1.0 - y) - u.fn_ * y + u.pp
                        }
                        LogicalKind::Map => u.tp - u.fp - u.fn_,
                    };
                }
                chain_backward(op, sp, t, trace, d_out, norm, sgrad, v);
            }
            for (k, g) in sgrad.iter().enumerate() {
                let base = k * PARAMS_PER_IMPL;
                grad[base] = g[0] * sp[k].dp_ds;
                grad[base + 1] = g[1] * sp[k].dlo_dx;
                grad[base + 2] = g[2] * sp[k].dhi_dx;
            }
        }
        parts
    }
}

/// Soft counts of one operator on one row.
#[derive(Debug, Clone, Copy, Default)]
struct RowCounts {
    tp: f64,
    fp: f64,
    fn_: f64,
    /// Predicted-positive mass (filters; 1 for maps).
    pp: f64,
}

fn row_counts(kind: LogicalKind, outcome: f64, op: &SoftOp, r: usize) -> RowCounts {
    match kind {
        LogicalKind::Filter => {
            let y = op.gold_accept[r];
            RowCounts { tp: outcome * y, fp: outcome * (1.0 - y), fn_: (1.0 - outcome) * y, pp: outcome }
        }
        LogicalKind::Map => RowCounts { tp: outcome, fp: 1.0 - outcome, fn_: 1.0 - outcome, pp: 1.0 },
    }
}

fn label_mass(c: &RowCounts) -> f64 {
    // lp = tp + fn for both kinds (filter: y; map: 1).
    c.tp + c.fn_
}

/// Global soft counts of a row: TP, FP, FN.
fn global_row(n_ops: usize, counts: impl Fn(usize) -> RowCounts) -> (f64, f64, f64) {
    let (mut tp, mut not_fp, mut pp, mut not_fn, mut lp) = (1.0, 1.0, 1.0, 1.0, 1.0);
    for o in 0..n_ops {
        let c = counts(o);
        tp *= c.tp;
        not_fp *= 1.0 - c.fp;
        pp *= c.pp;
        not_fn *= 1.0 - c.fn_;
        lp *= label_mass(&c);
    }
    (tp, (1.0 - not_fp) * pp, (1.0 - not_fn) * lp)
}

/// The product of `f` over every operator's row counts but `o`'s, multiplied in operator order from 1 (exactly
/// what `product()` over the others gives), with the part before `o` taken from `prefix`.
#[inline]
fn prod_except(rc: &[RowCounts], o: usize, prefix: f64, f: impl Fn(&RowCounts) -> f64) -> f64 {
    rc[o + 1..].iter().fold(prefix, |acc, c| acc * f(c))
}

/// Back-propagates d loss / d (TP, FP, FN) of a row into each operator's row counts.
fn global_row_backward(rc: &[RowCounts], g_tp: f64, g_fp: f64, g_fn: f64, mut emit: impl FnMut(usize, RowCounts)) {
    let all_not_fp: f64 = rc.iter().map(|c| 1.0 - c.fp).product();
    let all_pp: f64 = rc.iter().map(|c| c.pp).product();
    let all_lp: f64 = rc.iter().map(label_mass).product();
    // Products over the operators before `o`, in order (shared by every `o`'s product over the others).
    let (mut pre_tp, mut pre_not_fp, mut pre_pp, mut pre_not_fn) = (1.0, 1.0, 1.0, 1.0);
    for (o, c) in rc.iter().enumerate() {
        let d_tp = g_tp * prod_except(rc, o, pre_tp, |c| c.tp);
        let d_fp = g_fp * prod_except(rc, o, pre_not_fp, |c| 1.0 - c.fp) * all_pp;
        let d_pp = g_fp * (1.0 - all_not_fp) * prod_except(rc, o, pre_pp, |c| c.pp);
        // lp is a constant of the data (labels), so FN only flows through fn.
        let d_fn = g_fn * prod_except(rc, o, pre_not_fn, |c| 1.0 - c.fn_) * all_lp;
        emit(o, RowCounts { tp: d_tp, fp: d_fp, fn_: d_fn, pp: d_pp });
        pre_tp *= c.tp;
        pre_not_fp *= 1.0 - c.fp;
        pre_pp *= c.pp;
        pre_not_fn *= 1.0 - c.fn_;
    }
}

/// Accept/reject probabilities of a soft stage, given p and thresholds.
#[inline]
fn soft_decision(v: f64, lo: f64, hi: f64, t: f64, sides: Sides) -> (f64, f64) {
    match sides {
        Sides::RejectOnly => return (0.0, sigmoid((lo - v) / t)),
        Sides::AcceptOnly => return (sigmoid((v - hi) / t), 0.0),
        Sides::Both => {}
    }
    let z0 = (v - hi) / t;
    let z1 = (lo - v) / t;
    // Shifted by the largest logit, whose own term is exactly 1: two exponentials instead of three (this is the
    // optimizer's innermost loop).
    let (e0, e1, e2) = if z0 >= z1 && z0 >= 0.0 {
        (1.0, (z1 - z0).exp(), (-z0).exp())
    } else if z1 >= 0.0 {
        ((z0 - z1).exp(), 1.0, (-z1).exp())
    } else {
        (z0.exp(), z1.exp(), 1.0)
    };
    let s = e0 + e1 + e2;
    (e0 / s, e1 / s)
}

/// A stage's rows' `w = exp(v / t)` and `1 / w` at the threshold temperature `t` they were computed for. A
/// stage's decisions are softmaxes of `(v − θ_hi) / t` and `(θ_lo − v) / t`, whose exponentials are `w·e^{−θ_hi/t}`
/// and `e^{θ_lo/t} / w`: with `w` kept, a row's decisions need no exponential, only the stage's two. The first
/// stage of a solve keeps `t` fixed for all its steps, so there `w` is computed once per solve; later steps compute
/// one exponential per row instead of two. Used only while every exponent stays within ±[`FAST_EXPONENT`], where
/// the unshifted exponentials cannot overflow; beyond it the shifted form ([`soft_decision`]) is used.
#[derive(Debug, Default)]
struct StageExp {
    t: Option<f64>,
    w: Vec<f64>,
    w_inv: Vec<f64>,
}

/// See [`StageExp`]: `e^{600}` and sums of three such terms are far inside `f64`'s range (`e^{709}`).
const FAST_EXPONENT: f64 = 600.0;

impl StageExp {
    /// Whether the stage's exponents at `t` stay within ±[`FAST_EXPONENT`] (`|v| / t` and `|θ| / t` with θ in
    /// (0, 1)).
    fn usable(stage: &SoftStage, t: f64) -> bool {
        t > 0.0 && (stage.v_max + 1.0) / t <= FAST_EXPONENT
    }

    /// `w` and `1 / w` of `v` at `t`, computed unless they already are.
    fn at(&mut self, v: &[f64], t: f64) -> (&[f64], &[f64]) {
        if self.t != Some(t) || self.w.len() != v.len() {
            self.w.clear();
            self.w.extend(v.iter().map(|x| (x / t).exp()));
            self.w_inv.clear();
            self.w_inv.extend(self.w.iter().map(|w| 1.0 / w));
            self.t = Some(t);
        }
        (&self.w, &self.w_inv)
    }
}

/// [`soft_decision`] from a row's `w` and `1 / w` ([`StageExp`]) and the stage's `e^{−θ_hi/t}` (`a`) and
/// `e^{θ_lo/t}` (`b`).
#[inline]
fn soft_decision_from(w: f64, w_inv: f64, a: f64, b: f64, sides: Sides) -> (f64, f64) {
    match sides {
        Sides::RejectOnly => {
            let e1 = b * w_inv;
            (0.0, e1 / (1.0 + e1))
        }
        Sides::AcceptOnly => {
            let e0 = w * a;
            (e0 / (1.0 + e0), 0.0)
        }
        Sides::Both => {
            let (e0, e1) = (w * a, b * w_inv);
            let inv = 1.0 / (1.0 + e0 + e1);
            (e0 * inv, e1 * inv)
        }
    }
}

/// What the forward pass of one operator's chain leaves for the reverse pass, per stage and row (stage-major): the
/// mass `U` entering the stage and its decisions (filters: accept and reject masses; maps: the decide sigmoid and 0),
/// so the reverse pass recomputes no exponential. Stages switched off (`p = 0`) leave theirs unwritten.
#[derive(Debug, Default)]
struct Trace {
    u: Vec<f64>,
    a: Vec<f64>,
    b: Vec<f64>,
}

impl Trace {
    /// Room for `stages × rows` entries; what an earlier evaluation left there is overwritten before it is read.
    fn fit(&mut self, stages: usize, rows: usize) {
        for buf in [&mut self.u, &mut self.a, &mut self.b] {
            buf.resize(stages * rows, 0.0);
        }
    }
}

/// The working memory of [`SoftProblem::loss_in`], kept between evaluations. What one evaluation leaves in it never
/// reaches the next one's result: every entry read is first written by the evaluation reading it.
#[derive(Debug, Default)]
pub struct LossScratch {
    sp: Vec<StageParams>,
    /// Per non-gold stage (parameter order), its rows' `exp(v / t)`.
    exps: Vec<StageExp>,
    outcome: Vec<f64>,
    u: Vec<f64>,
    row_cost: Vec<f64>,
    traces: Vec<Trace>,
    up: Vec<RowCounts>,
    rc: Vec<RowCounts>,
    sgrad: Vec<[f64; 3]>,
    d_out: Vec<f64>,
    v: Vec<f64>,
}

/// What a row gains when gold closes its chain: a filter's gold decision, or a map's correct value.
#[inline]
fn gold_gain(op: &SoftOp, r: usize) -> f64 {
    match op.kind {
        LogicalKind::Filter => op.gold_accept[r],
        LogicalKind::Map => 1.0,
    }
}

/// Forward pass of one operator's chain on every row, a stage at a time: each row's outcome into `out` and its
/// expected cost into `cost` (`u` is scratch of the same length). Each row sees exactly the arithmetic of walking
/// its own chain, in the same order. With `trace`, what the reverse pass needs is written there.
#[allow(clippy::too_many_arguments)]
fn chain_forward(
    op: &SoftOp,
    sp: &[StageParams],
    t: f64,
    sides: Sides,
    out: &mut [f64],
    u: &mut [f64],
    cost: &mut [f64],
    mut trace: Option<&mut Trace>,
    exps: &mut [StageExp],
) {
    let n = out.len();
    u.fill(1.0);
    out.fill(0.0);
    cost.fill(0.0);
    for (i, st) in op.stages.iter().enumerate() {
        let idx = st.param / PARAMS_PER_IMPL;
        let k = &sp[idx];
        if k.p == 0.0 {
            continue;
        }
        let mut rec = trace.as_deref_mut().map(|tr| {
            tr.u[i * n..(i + 1) * n].copy_from_slice(u);
            (&mut tr.a[i * n..(i + 1) * n], &mut tr.b[i * n..(i + 1) * n])
        });
        // A map stage without confidences decides every row: it reads no exponential.
        let reads_v = op.kind == LogicalKind::Filter || st.tunable;
        let fast = (reads_v && StageExp::usable(st, t)).then(|| {
            let (w, w_inv) = exps[idx].at(&st.v, t);
            (w, w_inv, (-k.hi / t).exp(), (k.lo / t).exp())
        });
        match op.kind {
            LogicalKind::Filter => {
                for r in 0..n {
                    cost[r] += u[r] * k.p * st.cost;
                    let (qa, qr) = match fast {
                        Some((w, w_inv, a_hi, b_lo)) => soft_decision_from(w[r], w_inv[r], a_hi, b_lo, sides),
                        None => soft_decision(st.v[r], k.lo, k.hi, t, sides),
                    };
                    if let Some((a, b)) = rec.as_mut() {
                        a[r] = qa;
                        b[r] = qr;
                    }
                    out[r] += u[r] * k.p * qa;
                    u[r] *= 1.0 - k.p * (qa + qr);
                }
            }
            LogicalKind::Map => {
                for r in 0..n {
                    cost[r] += u[r] * k.p * st.cost;
                    let s = match (st.tunable, fast) {
                        (false, _) => 1.0,
                        (true, Some((w, _, a_hi, _))) => {
                            let e0 = w[r] * a_hi;
                            e0 / (1.0 + e0)
                        }
                        (true, None) => sigmoid((st.v[r] - k.hi) / t),
                    };
                    if let Some((a, _)) = rec.as_mut() {
                        a[r] = s;
                    }
                    let d = k.p * s;
                    out[r] += u[r] * d * st.correct[r];
                    u[r] *= 1.0 - d;
                }
            }
        }
    }
    for r in 0..n {
        cost[r] += u[r] * op.gold_cost;
        out[r] += u[r] * gold_gain(op, r);
    }
}

/// Reverse pass of one operator's chain on every row, a stage at a time from the last: accumulates d loss /
/// d (p, θ_lo, θ_hi) per stage into `sgrad`, given d loss / d outcome per row (`d_out`) and per unit of cost
/// (`d_cost`). Each stage's sums take the rows in order, as walking the rows one by one did.
/// (`v` is scratch.)
#[allow(clippy::too_many_arguments)]
fn chain_backward(
    op: &SoftOp,
    sp: &[StageParams],
    t: f64,
    trace: &Trace,
    d_out: &[f64],
    d_cost: f64,
    sgrad: &mut [[f64; 3]],
    v: &mut Vec<f64>,
) {
    let n = d_out.len();
    // v = d loss / d U entering the next stage, per row.
    v.clear();
    v.extend((0..n).map(|r| d_out[r] * gold_gain(op, r) + d_cost * op.gold_cost));
    for (i, st) in op.stages.iter().enumerate().rev() {
        let idx = st.param / PARAMS_PER_IMPL;
        let k = &sp[idx];
        if k.p == 0.0 {
            continue;
        }
        let (us, az, bz) = (&trace.u[i * n..(i + 1) * n], &trace.a[i * n..(i + 1) * n], &trace.b[i * n..(i + 1) * n]);
        let mut g = sgrad[idx];
        match op.kind {
            LogicalKind::Filter => {
                for r in 0..n {
                    let (u, qa, qr, d_out) = (us[r], az[r], bz[r], d_out[r]);
                    let d_tacc = u * (d_out - v[r]);
                    let d_trej = u * (-v[r]);
                    let d_p = u * st.cost * d_cost + qa * d_tacc + qr * d_trej;
                    let d_qa = k.p * d_tacc;
                    let d_qr = k.p * d_trej;
                    let mean = qa * d_qa + qr * d_qr;
                    let d_z0 = qa * (d_qa - mean);
                    let d_z1 = qr * (d_qr - mean);
                    g[0] += d_p;
                    g[1] += d_z1 / t;
                    g[2] -= d_z0 / t;
                    let t_acc = k.p * qa;
                    let t_rej = k.p * qr;
                    v[r] = t_acc * d_out + k.p * st.cost * d_cost + (1.0 - t_acc - t_rej) * v[r];
                }
            }
            LogicalKind::Map => {
                for r in 0..n {
                    let (u, s, d_out) = (us[r], az[r], d_out[r]);
                    let m = st.correct[r];
                    let d = k.p * s;
                    let d_d = u * (d_out * m - v[r]);
                    g[0] += u * st.cost * d_cost + d_d * s;
                    if st.tunable {
                        // s = σ((v_r − θ_hi)/T): ds/dθ_hi = −s(1−s)/T.
                        g[2] -= d_d * k.p * s * (1.0 - s) / t;
                    }
                    v[r] = d * d_out * m + k.p * st.cost * d_cost + (1.0 - d) * v[r];
                }
            }
        }
        sgrad[idx] = g;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{generate, WorkloadConfig};

    /// Global targets 0.9 / 0.9 at 0.95, both sides, pick temperature 0.3.
    fn global(t_par: f64, frozen: Option<Vec<bool>>) -> LossConfig {
        LossConfig {
            precision: 0.9,
            recall: 0.9,
            credible: 0.95,
            beta: 3.0,
            constraint: Constraint::Global,
            t_pick: 0.3,
            t_par,
            frozen,
            sides: Sides::Both,
        }
    }

    /// The relaxation, over all its sampled tuples, of a generated workload of `operators` operators.
    fn relaxed(seed: u64, operators: usize) -> SoftProblem {
        let w =
            generate(seed, &WorkloadConfig { population: Some(600), operators: Some(operators), ..Default::default() });
        let problem = Problem::from_profile(&w.sample).unwrap();
        SoftProblem::new(&problem, &problem.all_rows())
    }

    #[test]
    fn decisions_from_kept_exponentials_match_the_shifted_softmax() {
        let mut worst: f64 = 0.0;
        for sides in [Sides::Both, Sides::RejectOnly, Sides::AcceptOnly] {
            for t in [1.0, 0.11, 0.04, 0.01, 0.002] {
                for i in 0..=20 {
                    let v = f64::from(i) / 20.0;
                    for (lo, hi) in [(0.2, 0.8), (0.5, 0.5), (0.9, 0.1), (0.0025, 0.9975)] {
                        let w = (v / t).exp();
                        let (a, b) = ((-hi / t).exp(), (lo / t).exp());
                        let fast = soft_decision_from(w, 1.0 / w, a, b, sides);
                        let exact = soft_decision(v, lo, hi, t, sides);
                        for (f, e) in [(fast.0, exact.0), (fast.1, exact.1)] {
                            assert!(f.is_finite(), "{sides:?} t {t} v {v}: {f}");
                            worst = worst.max((f - e).abs());
                        }
                    }
                }
            }
        }
        assert!(worst < 1e-12, "largest difference {worst:e}");
    }

    #[test]
    fn a_temperature_too_low_for_kept_exponentials_falls_back_to_the_shifted_form() {
        let soft = relaxed(3, 2);
        let x: Vec<f64> = (0..soft.n_params()).map(|i| (i as f64 * 1.3).sin()).collect();
        for t_par in [0.2, 1e-3, 1e-5] {
            let cfg = LossConfig { t_pick: 0.5, ..global(t_par, None) };
            let mut grad = vec![0.0; soft.n_params()];
            let parts = soft.loss(&x, &cfg, Some(&mut grad));
            assert!(parts.loss.is_finite(), "t {t_par}: loss {}", parts.loss);
            assert!(grad.iter().all(|g| g.is_finite()), "t {t_par}: gradient {grad:?}");
        }
    }

    #[test]
    fn kept_exponentials_give_the_loss_of_a_fresh_evaluation() {
        // A scratch reused across evaluations at changing temperatures and parameters gives what a fresh one does.
        let soft = relaxed(5, 3);
        let np = soft.n_params();
        let mut scratch = LossScratch::default();
        for step in 0..6 {
            let x: Vec<f64> = (0..np).map(|i| ((i + step) as f64 * 0.7).sin() * 2.0).collect();
            let frozen = (step % 2 == 1).then(|| (0..np / PARAMS_PER_IMPL).map(|k| k % 3 != 0).collect());
            let cfg = global([0.04, 0.04, 0.03, 1e-4, 0.04, 0.02][step], frozen);
            let (mut g_kept, mut g_fresh) = (vec![0.0; np], vec![0.0; np]);
            let kept = soft.loss_in(&x, &cfg, Some(&mut g_kept), &mut scratch);
            let fresh = soft.loss(&x, &cfg, Some(&mut g_fresh));
            assert_eq!(kept, fresh, "step {step}");
            assert_eq!(g_kept, g_fresh, "step {step}");
        }
    }
}
