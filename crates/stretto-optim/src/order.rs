//! Ordering the stages of all logical operators (`docs/stretto-method.md` §7).
//!
//! Each stage i has an inter-operator selectivity (share of the tuples it sees that it does not reject) and an
//! intra-operator one (share it leaves unsure), measured by executing the plan hard on the sample. Placing stage i
//! costs `c_i · N_l` where `N_l` is the expected share of tuples still reaching operator l; afterwards `N_l *=
//! sel_intra_i` and every other `N_m *= sel_inter_i`. Stages of one operator keep their cascade order, so a DP state
//! is just how far each operator's chain has been placed, and `N` depends only on that state (a product of the
//! placed stages' factors). The exact DP therefore visits `Π (K_l + 1)` states. Beyond [`MAX_DP_STATES`] a greedy
//! rank order (cheapest expected cost per unit of tuples removed first) is used instead.
//!
//! That model treats stages as rejecting independently, with selectivities measured in the plan's current order: a
//! later stage's share is conditional on the earlier ones passing. Where filters are correlated (one nested in
//! another: "a multiple of 6" among "multiples of 3"), it misjudges every other order. So [`order_plan`] also prices
//! each order of the filters' stages exactly on the rows, as execution would pay on them (shared costs included),
//! while there are at most [`MAX_EXACT_ORDERS`] of them, and keeps the DP's order unless one is strictly cheaper.
//! The order never changes which tuples a plan returns, only what it costs.

use crate::problem::{HardPlan, Problem};
use stretto_core::op::LogicalKind;

/// Largest DP state space explored exactly.
pub const MAX_DP_STATES: usize = 1 << 16;

/// Most orders of a plan's filter stages that [`order_plan`] prices exactly on the rows (7! orders of seven
/// single-stage filters; three filters of three stages each have 1,680).
pub const MAX_EXACT_ORDERS: usize = 5040;

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

/// Reorders a plan's stages by the DP, with selectivities measured on `rows`, then checks every order of its filter
/// stages by their exact cost on `rows` where there are few enough of them (module doc).
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
    let arrange =
        |filters: &[usize]| HardPlan { stages: filters.iter().chain(&maps).map(|&i| plan.stages[i].clone()).collect() };
    let modelled = arrange(&filters);
    // Each filter operator's stages, in their cascade order (the DP keeps it).
    let mut chains: Vec<Vec<usize>> = Vec::new();
    for &i in &filters {
        match chains.iter_mut().find(|c| plan.stages[c[0]].op == plan.stages[i].op) {
            Some(chain) => chain.push(i),
            None => chains.push(vec![i]),
        }
    }
    if chains.len() < 2 || interleavings_count(&chains) > MAX_EXACT_ORDERS {
        return modelled;
    }
    let mut best_cost = problem.evaluate(&modelled, rows).cost;
    let mut best = filters.clone();
    for_each_interleaving(&chains, &mut |candidate| {
        let cost = problem.evaluate(&arrange(candidate), rows).cost;
        // Strictly cheaper beyond rounding: where the rows tie two orders, the model's choice stands.
        if cost < best_cost - 1e-9 * best_cost.abs().max(1e-9) {
            best_cost = cost;
            best = candidate.to_vec();
        }
    });
    arrange(&best)
}

/// How many orders of `chains`' elements keep each chain's own order (a multinomial coefficient), or `usize::MAX`
/// where that does not fit.
fn interleavings_count(chains: &[Vec<usize>]) -> usize {
    // Built up one element at a time: placing the j-th element of a chain among `n` placed so far multiplies the
    // count by `n / j`; every partial product is itself a multinomial coefficient, so each division is exact. A count
    // below `usize::MAX` times any element number fits in a u128, so nothing overflows before the early return.
    let mut count: u128 = 1;
    let mut n: u128 = 0;
    for chain in chains {
        for j in 1..=chain.len() as u128 {
            n += 1;
            count = count * n / j;
            if count > usize::MAX as u128 {
                return usize::MAX;
            }
        }
    }
    count as usize
}

/// Calls `visit` with every order of `chains`' elements that keeps each chain's own order.
fn for_each_interleaving(chains: &[Vec<usize>], visit: &mut dyn FnMut(&[usize])) {
    fn walk(chains: &[Vec<usize>], next: &mut [usize], order: &mut Vec<usize>, visit: &mut dyn FnMut(&[usize])) {
        if chains.iter().zip(next.iter()).all(|(c, &n)| n == c.len()) {
            visit(order);
            return;
        }
        for l in 0..chains.len() {
            if next[l] < chains[l].len() {
                order.push(chains[l][next[l]]);
                next[l] += 1;
                walk(chains, next, order, visit);
                next[l] -= 1;
                order.pop();
            }
        }
    }
    walk(chains, &mut vec![0; chains.len()], &mut Vec::new(), visit);
}

#[cfg(test)]
mod tests {
    use super::*;

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
            for_each_interleaving(&chains, &mut |o| all.push(o.to_vec()));
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

    /// A profile of two gold filters over the numbers 0..100: "a multiple of 3" (cost 1) and "a multiple of 6"
    /// (cost 0.8), the second nested in the first, in that query order.
    fn nested_filters() -> Problem {
        let scores = |k: usize| (0..100).map(|n| if n % k == 0 { "1" } else { "-1" }).collect::<Vec<_>>().join(",");
        let tuples = (0..100).map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(",");
        let text = format!(
            r#"{{"format":"stretto.profile/v1","query":"q","population":100,"tuples":[{tuples}],
            "logical":[{{"name":"three","kind":"filter"}},{{"name":"six","kind":"filter"}}],
            "physical":[{{"name":"three/gold","logical":"three","cost":1.0,"scores":[{}],"gold":true}},
                        {{"name":"six/gold","logical":"six","cost":0.8,"scores":[{}],"gold":true}}]}}"#,
            scores(3),
            scores(6)
        );
        Problem::from_profile(&crate::profile::Profile::parse(&text, "t").unwrap()).unwrap()
    }

    /// Measured in query order, "six" passes half of what "three" passed, so the model prices six-first at
    /// 0.8 + 0.5 > 1 + 0.34 · 0.8 and keeps three-first (1.272 per tuple). On the rows six-first costs
    /// 0.8 + 0.17 = 0.97, and that is the order returned.
    #[test]
    fn nested_filters_are_ordered_by_what_each_order_costs_on_the_rows() {
        let problem = nested_filters();
        let rows = problem.all_rows();
        let gold = problem.gold_plan();
        assert_eq!(problem.ops[gold.stages[0].op].name, "three");
        let (_, tally) = problem.evaluate_with_tally(&gold, &rows);
        let model: Vec<OrderStage> = gold
            .stages
            .iter()
            .zip(&tally)
            .map(|(s, t)| OrderStage {
                op: s.op,
                cost: problem.ops[s.op].impls[s.imp].cost,
                sel_inter: (t.seen - t.rejected) as f64 / t.seen as f64,
                sel_intra: 0.0,
            })
            .collect();
        assert_eq!(best_order(&model), vec![0, 1], "the model alone keeps the query order");
        let plan = order_plan(&problem, &gold, &rows);
        let names: Vec<&str> = plan.stages.iter().map(|s| problem.ops[s.op].name.as_str()).collect();
        assert_eq!(names, ["six", "three"]);
        let cost = |p: &HardPlan| problem.evaluate(p, &rows).cost_per_tuple();
        assert!((cost(&gold) - 1.272).abs() < 1e-9 && (cost(&plan) - 0.97).abs() < 1e-9);
        // Same tuples either way: the order only changes the cost.
        let (a, b) = (problem.evaluate(&gold, &rows), problem.evaluate(&plan, &rows));
        assert_eq!((a.tp, a.fp, a.fn_), (b.tp, b.fp, b.fn_));
    }

    #[test]
    fn interleavings_are_counted_and_visited_keeping_each_chain_in_order() {
        let chains = vec![vec![0, 1], vec![2], vec![3, 4, 5]];
        let mut seen = Vec::new();
        for_each_interleaving(&chains, &mut |o| seen.push(o.to_vec()));
        assert_eq!(interleavings_count(&chains), 60); // 6! / (2! 1! 3!)
        assert_eq!(seen.len(), 60);
        let mut unique = seen.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), 60);
        let pos = |o: &[usize], x: usize| o.iter().position(|&y| y == x).unwrap();
        assert!(seen.iter().all(|o| pos(o, 0) < pos(o, 1) && pos(o, 3) < pos(o, 4) && pos(o, 4) < pos(o, 5)));
        assert_eq!(interleavings_count(&[(0..30).collect(), (30..60).collect(), (60..90).collect()]), usize::MAX);
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
