//! Optimize on a workload's sample, replay on its whole population: the measurement behind the optimizer's
//! guarantees (`met both targets` rates, tail of achieved/target ratios, cost relative to gold).

use rayon::prelude::*;

use crate::error::Result;
use crate::problem::Problem;
use crate::strategy::{strategy, Targets};
use crate::workload::{generate, WorkloadConfig};

/// The seeds an evaluation example's RUNS argument names: a count `N` (seeds `0..N`) or a range `FIRST..END`;
/// seeds `0..default` where it is absent.
pub fn seeds_arg(arg: Option<&str>, default: u64) -> std::result::Result<Vec<u64>, std::num::ParseIntError> {
    Ok(match arg {
        Some(r) if r.contains("..") => {
            let (a, b) = r.split_once("..").unwrap_or_default();
            (a.parse()?..b.parse()?).collect()
        }
        Some(n) => (0..n.parse()?).collect(),
        None => (0..default).collect(),
    })
}

/// One (workload, method, target) outcome on the population.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunRecord {
    /// Workload seed.
    pub seed: u64,
    /// Strategy.
    pub method: String,
    /// Precision and recall target.
    pub target: f64,
    /// Achieved precision on the population.
    pub precision: f64,
    /// Achieved recall on the population.
    pub recall: f64,
    /// Cost per tuple on the population.
    pub cost: f64,
    /// Gold plan's cost per tuple on the population.
    pub gold_cost: f64,
    /// Whether the strategy fell back to gold.
    pub fell_back: bool,
    /// Optimizer wall time, seconds.
    pub seconds: f64,
    /// The strategy's warnings.
    pub warnings: String,
}

impl RunRecord {
    /// Both targets met on the population.
    pub fn met_both(&self) -> bool {
        self.precision >= self.target && self.recall >= self.target
    }
}

/// Runs `methods` on workloads `seeds` at each target, with credible level `credible`.
pub fn evaluate(seeds: &[u64], methods: &[&str], targets: &[f64], credible: f64) -> Result<Vec<RunRecord>> {
    let jobs: Vec<(u64, &str, f64)> = seeds
        .iter()
        .flat_map(|&s| methods.iter().flat_map(move |&m| targets.iter().map(move |&t| (s, m, t))))
        .collect();
    // Parallel over jobs; each solve also uses rayon internally, which nests fine.
    jobs.par_iter()
        .map(|&(seed, method, target)| {
            let w = generate(seed, &WorkloadConfig::default());
            let sample = Problem::from_profile(&w.sample)?;
            let population = Problem::from_profile(&w.population)?;
            let t0 = std::time::Instant::now();
            let opt = strategy(method)?.optimize(&sample, &Targets::new(target, target, credible)?, seed)?;
            let seconds = t0.elapsed().as_secs_f64();
            let all = population.all_rows();
            let c = population.evaluate(&opt.plan, &all);
            let gold = population.evaluate(&population.gold_plan(), &all);
            Ok(RunRecord {
                seed,
                method: method.to_string(),
                target,
                precision: c.precision(),
                recall: c.recall(),
                cost: c.cost_per_tuple(),
                gold_cost: gold.cost_per_tuple(),
                fell_back: opt.fell_back_to_gold,
                seconds,
                warnings: opt.warnings.join("; "),
            })
        })
        .collect()
}

/// One row of the summary table.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SummaryRow {
    /// Strategy.
    pub method: String,
    /// Target.
    pub target: f64,
    /// Runs.
    pub runs: usize,
    /// Share of runs meeting both targets.
    pub met_both: f64,
    /// 5th percentile of min(P/T, R/T).
    pub p5_ratio: f64,
    /// Mean cost relative to gold.
    pub cost_vs_gold: f64,
    /// Share of runs that fell back to gold.
    pub fell_back: f64,
    /// Mean optimizer seconds.
    pub seconds: f64,
}

/// Aggregates records per (method, target).
pub fn summarize(records: &[RunRecord]) -> Vec<SummaryRow> {
    let mut keys: Vec<(String, f64)> = records.iter().map(|r| (r.method.clone(), r.target)).collect();
    keys.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    keys.dedup();
    keys.into_iter()
        .map(|(method, target)| {
            let rs: Vec<&RunRecord> = records.iter().filter(|r| r.method == method && r.target == target).collect();
            let n = rs.len().max(1) as f64;
            let mut ratios: Vec<f64> = rs.iter().map(|r| (r.precision / r.target).min(r.recall / r.target)).collect();
            ratios.sort_by(f64::total_cmp);
            SummaryRow {
                runs: rs.len(),
                met_both: rs.iter().filter(|r| r.met_both()).count() as f64 / n,
                p5_ratio: ratios
                    .get(((ratios.len() as f64 - 1.0) * 0.05).round() as usize)
                    .copied()
                    .unwrap_or(f64::NAN),
                cost_vs_gold: rs.iter().map(|r| r.cost / r.gold_cost).sum::<f64>() / n,
                fell_back: rs.iter().filter(|r| r.fell_back).count() as f64 / n,
                seconds: rs.iter().map(|r| r.seconds).sum::<f64>() / n,
                method,
                target,
            }
        })
        .collect()
}

/// The summary as a markdown table.
pub fn summary_markdown(rows: &[SummaryRow]) -> String {
    let mut s = String::from("| method | target | runs | met both | p5 min(P/T,R/T) | cost / gold | fell back to gold | optimizer s |\n|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {:.1}% | {:.3} | {:.3} | {:.1}% | {:.3} |\n",
            r.method,
            r.target,
            r.runs,
            100.0 * r.met_both,
            r.p5_ratio,
            r.cost_vs_gold,
            100.0 * r.fell_back,
            r.seconds
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::seeds_arg;

    #[test]
    fn runs_are_a_count_or_a_range() {
        assert_eq!(seeds_arg(Some("3"), 9).unwrap(), vec![0, 1, 2]);
        assert_eq!(seeds_arg(Some("5..8"), 9).unwrap(), vec![5, 6, 7]);
        assert_eq!(seeds_arg(None, 2).unwrap(), vec![0, 1]);
        assert!(seeds_arg(Some("a..8"), 9).is_err());
        assert!(seeds_arg(Some("x"), 9).is_err());
    }
}
