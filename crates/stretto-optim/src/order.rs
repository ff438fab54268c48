//! Ordering the stages of all logical operators (`docs/stretto-method.md` §7).
//!
//! Each stage i has an inter-operator selectivity (share of the tuples it sees that it does not reject) and an
//! intra-operator one (share it leaves unsure), measured by executing the plan hard on the sample. Placing stage i
//! costs `c_i · N_l` where `N_l` is the expected share of tuples still reaching operator l; afterwards `N_l *=
//! sel_intra_i` and every other `N_m *= sel_inter_i`. Stages of one operator keep their cascade order, so a DP state
//! is just how far each operator's chain has been placed, and `N` depends only on that state (a product of the
//! placed stages' factors). The exact DP therefore visits `Π (K_l + 1)` states. Beyond [`MAX_DP_STATES`] a greedy
//! rank order (cheapest expected cost per unit of tuples removed first) is used instead.

use crate::problem::{HardPlan, Problem};
use stretto_core::op::LogicalKind;

/// Largest DP state space explored exactly.
pub const MAX_DP_STATES: usize = 1 << 16;

/// A stage as the ordering sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OrderStage {
    /// Logical operator.
    pub op: usize,
    /// Cost per tuple.
    pub cost: f64,
    /// Share of seen tuples not rejected.
    pub sel_inter: f64,
    /// Share of seen tuples left unsure.
    pub sel_intra: f64,
}

/// Expected cost per tuple of running `stages` in `order` under the selectivity model.
pub fn model_cost(stages: &[OrderStage], order: &[usize]) -> f64 {
    let n_ops = stages.iter().map(|s| s.op + 1).max().unwrap_or(0);
    let mut reach = vec![1.0; n_ops];
    let mut cost = 0.0;
    for &i in order {
        let s = stages[i];
        cost += s.cost * reach[s.op];
        for (l, r) in reach.iter_mut().enumerate() {
            *r *= if l == s.op { s.sel_intra } else { s.sel_inter };
        }
    }
    cost
}

/// The cheapest order of `stages` (indices into it) that keeps each operator's stages in their given order.
pub fn best_order(stages: &[OrderStage]) -> Vec<usize> {
    let n_ops = stages.iter().map(|s| s.op + 1).max().unwrap_or(0);
    let chains: Vec<Vec<usize>> =
        (0..n_ops).map(|l| (0..stages.len()).filter(|&i| stages[i].op == l).collect()).collect();
    let radix: Vec<usize> = chains.iter().map(|c| c.len() + 1).collect();
    let states = radix.iter().try_fold(1usize, |acc, &r| acc.checked_mul(r)).unwrap_or(usize::MAX);
    if states > MAX_DP_STATES {
        return greedy_order(stages, &chains);
    }
    let decode = |mut s: usize| -> Vec<usize> {
        radix
            .iter()
            .map(|&r| {
                let d = s % r;
                s /= r;
                d
            })
            .collect()
    };
    let stride: Vec<usize> = radix
        .iter()
        .scan(1usize, |acc, &r| {
            let s = *acc;
            *acc *= r;
            Some(s)
        })
        .collect();
    let mut best = vec![f64::INFINITY; states];
    let mut choice = vec![usize::MAX; states];
    best[0] = 0.0;
    // States in increasing index are in a topological order: adding a stage increases the index.
    for s in 0..states {
        if !best[s].is_finite() {
            continue;
        }
        let prefix = decode(s);
        let reach: Vec<f64> = (0..n_ops)
            .map(|l| {
                let mut r = 1.0;
                for (m, chain) in chains.iter().enumerate() {
                    for &i in &chain[..prefix[m]] {
                        r *= if m == l { stages[i].sel_intra } else { stages[i].sel_inter };
                    }
                }
                r
            })
            .collect();
        for l in 0..n_ops {
            if prefix[l] == chains[l].len() {
                continue;
            }
            let i = chains[l][prefix[l]];
            let next = s + stride[l];
            let c = best[s] + stages[i].cost * reach[l];
            if c < best[next] {
                best[next] = c;
                choice[next] = l;
            }
        }
    }
    let mut order = Vec::with_capacity(stages.len());
    let mut s = states - 1;
    while s != 0 {
        let l = choice[s];
        let prefix = decode(s);
        order.push(chains[l][prefix[l] - 1]);
        s -= stride[l];
    }
    order.reverse();
    order
}

fn greedy_order(stages: &[OrderStage], chains: &[Vec<usize>]) -> Vec<usize> {
    let mut next = vec![0usize; chains.len()];
    let mut reach = vec![1.0; chains.len()];
    let mut order = Vec::with_capacity(stages.len());
    while order.len() < stages.len() {
        let mut pick: Option<(f64, usize)> = None;
        for (l, chain) in chains.iter().enumerate() {
            if next[l] == chain.len() {
                continue;
            }
            let s = stages[chain[next[l]]];
            // Expected cost per share of tuples it removes from everyone else's work.
            let rank = s.cost * reach[l] / (1.0 - s.sel_inter).max(1e-9);
            if pick.is_none_or(|(r, _)| rank < r) {
                pick = Some((rank, l));
            }
        }
        let Some((_, l)) = pick else { break };
        let i = chains[l][next[l]];
        next[l] += 1;
        order.push(i);
        for (m, r) in reach.iter_mut().enumerate() {
            *r *= if m == l { stages[i].sel_intra } else { stages[i].sel_inter };
        }
    }
    order
}

/// Reorders a plan's stages by the DP, with selectivities measured on `rows`.
pub fn order_plan(problem: &Problem, plan: &HardPlan, rows: &[usize]) -> HardPlan {
    let _span = tracing::debug_span!("order", stages = plan.stages.len()).entered();
    let (_, tally) = problem.evaluate_with_tally(plan, rows);
    let stages: Vec<OrderStage> = plan
        .stages
        .iter()
        .zip(&tally)
        .map(|(s, t)| {
            let seen = t.seen.max(1) as f64;
            OrderStage {
                op: s.op,
                cost: problem.ops[s.op].impls[s.imp].cost,
                sel_inter: if t.seen == 0 { 1.0 } else { (t.seen - t.rejected) as f64 / seen },
                sel_intra: if t.seen == 0 { 1.0 } else { t.unsure as f64 / seen },
            }
        })
        .collect();
    let order = best_order(&stages);
    // A map rejects nothing, so its stages after every filter's never cost more: the DP's order is as cheap, and
    // where the sample ties them (a filter that rejected none of it), this keeps a map from running on tuples a
    // filter would have dropped. So the order of a plan with at most one filter needs no figures at all.
    let (filters, maps): (Vec<usize>, Vec<usize>) =
        order.into_iter().partition(|&i| problem.ops[plan.stages[i].op].kind != LogicalKind::Map);
    HardPlan { stages: filters.into_iter().chain(maps).map(|i| plan.stages[i].clone()).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interleavings(chains: &[Vec<usize>], prefix: &mut Vec<usize>, cur: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        let total: usize = chains.iter().map(Vec::len).sum();
        if cur.len() == total {
            out.push(cur.clone());
            return;
        }
        for l in 0..chains.len() {
            if prefix[l] < chains[l].len() {
                cur.push(chains[l][prefix[l]]);
                prefix[l] += 1;
                interleavings(chains, prefix, cur, out);
                prefix[l] -= 1;
                cur.pop();
            }
        }
    }

    #[test]
    fn dp_matches_brute_force_and_greedy_is_valid() {
        let mut seed = 12345u64;
        let mut rnd = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        for _ in 0..40 {
            let n_ops = 1 + (rnd() * 3.0) as usize;
            let mut stages = Vec::new();
            for l in 0..n_ops {
                for _ in 0..1 + (rnd() * 3.0) as usize {
                    let inter = 0.2 + 0.8 * rnd();
                    stages.push(OrderStage { op: l, cost: rnd(), sel_inter: inter, sel_intra: inter * rnd() });
                }
            }
            let chains: Vec<Vec<usize>> =
                (0..n_ops).map(|l| (0..stages.len()).filter(|&i| stages[i].op == l).collect()).collect();
            let mut all = Vec::new();
            interleavings(&chains, &mut vec![0; n_ops], &mut vec![], &mut all);
            let brute = all.iter().map(|o| model_cost(&stages, o)).fold(f64::INFINITY, f64::min);
            let dp = best_order(&stages);
            assert!((model_cost(&stages, &dp) - brute).abs() < 1e-12);
            let greedy = greedy_order(&stages, &chains);
            assert!(all.contains(&greedy), "greedy order breaks a chain");
            assert!(model_cost(&stages, &greedy) >= brute - 1e-12);
        }
    }

    /// A one-tuple sample that the filter passes ties every order of a filter and a cheaper map: the map still runs
    /// after the filter, and gold's plan of one filter needs no figures to be ordered.
    #[test]
    fn maps_run_after_the_filters_even_where_the_sample_ties_them() {
        let text = r#"{"format":"stretto.profile/v1","query":"q","population":100,"tuples":["a"],
            "logical":[{"name":"title","kind":"map"},{"name":"pos","kind":"filter"}],
            "physical":[{"name":"title/gold","logical":"title","cost":0.01,"values":["Heat"],"gold":true},
                        {"name":"pos/gold","logical":"pos","cost":1.0,"scores":[1],"gold":true}]}"#;
        let problem = Problem::from_profile(&crate::profile::Profile::parse(text, "t").unwrap()).unwrap();
        let plan = order_plan(&problem, &problem.gold_plan(), &problem.all_rows());
        let kinds: Vec<LogicalKind> = plan.stages.iter().map(|s| problem.ops[s.op].kind).collect();
        assert_eq!(kinds, [LogicalKind::Filter, LogicalKind::Map]);
    }

    #[test]
    fn a_cheap_selective_filter_goes_first() {
        let stages = [
            OrderStage { op: 0, cost: 1.0, sel_inter: 0.9, sel_intra: 0.0 },
            OrderStage { op: 1, cost: 0.1, sel_inter: 0.1, sel_intra: 0.0 },
        ];
        assert_eq!(best_order(&stages), vec![1, 0]);
    }
}
