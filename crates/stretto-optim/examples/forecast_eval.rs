//! How well the test sequence's expected saving forecasts what the certified search then saves (#21).
//!
//! The engine decides twice from [`Global::plan_tests`]'s expected saving whether profiling can pay: on the
//! screening tuples (20, outside the sample) before the sample's candidates answer, and on the sample's fit part
//! before the hold-out's answers. On generated workloads of the small scale's size this example draws the sample and
//! the screening tuples as the engine does, computes both forecasts, runs the certified search on the sample, and
//! prices its plan on the tuples left to execution.
//!
//! `cargo run --release -p stretto-optim --example forecast_eval -- [RUNS|FIRST..END] [POPULATION] [TARGETS] [K]`
//! e.g. `-- 0..400 400 0.5,0.7 0` (K: `Certification::fit_optimism`, the library's default if left out). Prints a
//! table per target (markdown) and writes every run to `forecast_runs.csv`.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use stretto_optim::evaluation::seeds_arg;
use stretto_optim::problem::Problem;
use stretto_optim::strategy::{Global, HoldOut, Strategy, Targets};
use stretto_optim::workload::{generate, WorkloadConfig};

/// The engine's defaults: a 15% sample, at least 40 tuples, and 20 screening tuples outside it.
const SAMPLE_FRACTION: f64 = 0.15;
const MIN_SAMPLE: usize = 40;
const SCREEN: usize = 20;
const CREDIBLE: f64 = 0.95;

#[derive(Debug, Clone)]
struct Run {
    seed: u64,
    target: f64,
    /// Tuples left to execution (the population less the sample and the screening tuples).
    rest: usize,
    /// Expected saving per tuple, planned on the screening tuples.
    screening: f64,
    /// Expected saving per tuple, planned on the sample's fit part.
    fit: f64,
    /// Saving per tuple of the certified search's plan on the rest (0 where it fell back to gold).
    realized: f64,
    /// Profiling the non-gold candidates on the sample, seconds.
    profiling: f64,
    /// Gold's cost per tuple on the rest.
    gold: f64,
    certified: bool,
}

fn run(
    seed: u64,
    population: usize,
    target: f64,
    optimism: Option<f64>,
) -> Result<Option<Run>, Box<dyn std::error::Error + Send + Sync>> {
    let fraction = (SAMPLE_FRACTION.max(MIN_SAMPLE as f64 / population as f64)).min(1.0);
    let w = generate(
        seed,
        &WorkloadConfig { population: Some(population), sample_fraction: Some(fraction), ..Default::default() },
    );
    let n = w.population.len();
    let mut outside: Vec<usize> = (0..n).filter(|r| w.sample_rows.binary_search(r).is_err()).collect();
    let mut rng = StdRng::seed_from_u64(seed ^ 0x05C2_EE11);
    for i in 0..SCREEN.min(outside.len()) {
        let j = rng.random_range(i..outside.len());
        outside.swap(i, j);
    }
    let (screen, rest) = outside.split_at(SCREEN.min(outside.len()));
    let targets = Targets::new(target, target, CREDIBLE)?;
    let mut global = Global::default();
    if let Some(k) = optimism {
        global.certification.fit_optimism = k;
    }
    let sample = Problem::from_profile(&w.sample)?;
    let positives: Vec<bool> = sample.all_rows().iter().map(|&r| sample.gold_positive(r)).collect();
    let (fit, hold) = global.certification.split_sample(&positives, &targets, CREDIBLE, seed);
    if global.certification.too_small(&fit, &hold).is_some() {
        return Ok(None);
    }
    let held = HoldOut { tuples: hold.len(), positives: hold.iter().filter(|&&r| positives[r]).count() as f64 };
    let screening = Problem::from_profile(&w.population.subset(screen, n as u64))?;
    let forecast = global.plan_tests(&screening, held, &targets, seed)?.expected_saving;
    let fit_problem = Problem::from_profile(&w.sample.subset(&fit, n as u64))?;
    let on_fit = global.plan_tests(&fit_problem, held, &targets, seed)?.expected_saving;
    let opt = global.optimize(&sample, &targets, seed)?;
    let whole = Problem::from_profile(&w.population)?;
    let plan_cost = whole.evaluate(&opt.plan, rest).cost_per_tuple();
    let gold = whole.evaluate(&whole.gold_plan(), rest).cost_per_tuple();
    let profiling: f64 =
        w.sample.physical.iter().filter(|p| !p.gold).map(|p| p.cost).sum::<f64>() * w.sample.len() as f64;
    Ok(Some(Run {
        seed,
        target,
        rest: rest.len(),
        screening: forecast,
        fit: on_fit,
        realized: if opt.fell_back_to_gold { 0.0 } else { gold - plan_cost },
        profiling,
        gold,
        certified: !opt.fell_back_to_gold,
    }))
}

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args: Vec<String> = std::env::args().collect();
    let seeds = seeds_arg(args.get(1).map(String::as_str), 200)?;
    let population: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(400);
    let targets: Vec<f64> = match args.get(3) {
        Some(s) => s.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![0.5, 0.7, 0.9],
    };
    // The fit part's optimism (`Certification::fit_optimism`); the library's default where not given.
    let optimism: Option<f64> = args.get(4).map(|s| s.parse()).transpose()?;
    let jobs: Vec<(u64, f64)> = seeds.iter().flat_map(|&s| targets.iter().map(move |&t| (s, t))).collect();
    let runs: Vec<Run> = jobs
        .par_iter()
        .map(|&(s, t)| run(s, population, t, optimism))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .flatten()
        .collect();
    let mut csv = String::from("seed,target,rest,screening_forecast,fit_forecast,realized,profiling,gold,certified\n");
    for r in &runs {
        csv.push_str(&format!(
            "{},{},{},{},{},{},{},{},{}\n",
            r.seed, r.target, r.rest, r.screening, r.fit, r.realized, r.profiling, r.gold, r.certified
        ));
    }
    std::fs::write("forecast_runs.csv", csv)?;
    println!(
        "population {population}, {} seeds, fit optimism {}; savings per tuple, mean over the runs whose sample \
         can certify\n",
        seeds.len(),
        optimism.unwrap_or(Global::default().certification.fit_optimism)
    );
    println!(
        "| target | runs | screening forecast | fit-part forecast | realized | certified | screening says pay | of those \
         certified | their forecast / realized | total / gold (screening rule) | total / gold (always profile) | total \
         / gold (hindsight) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for &t in &targets {
        let rs: Vec<&Run> = runs.iter().filter(|r| r.target == t).collect();
        let k = rs.len().max(1) as f64;
        let mean = |f: &dyn Fn(&Run) -> f64| rs.iter().map(|r| f(r)).sum::<f64>() / k;
        let pays = |r: &Run| r.screening * r.rest as f64 > r.profiling;
        let said: Vec<&&Run> = rs.iter().filter(|r| pays(r)).collect();
        let gold_total: f64 = rs.iter().map(|r| r.gold * r.rest as f64).sum();
        let profiled = |r: &Run| r.profiling + (r.gold - r.realized) * r.rest as f64;
        let rule: f64 = rs.iter().map(|r| if pays(r) { profiled(r) } else { r.gold * r.rest as f64 }).sum();
        let always: f64 = rs.iter().map(|r| profiled(r)).sum();
        let hindsight: f64 = rs.iter().map(|r| profiled(r).min(r.gold * r.rest as f64)).sum();
        let (f, g) = said.iter().fold((0.0, 0.0), |(f, g), r| (f + r.screening, g + r.realized));
        println!(
            "| {t} | {} | {:.5} | {:.5} | {:.5} | {:.1}% | {} | {} | {:.2} | {:.3} | {:.3} | {:.3} |",
            rs.len(),
            mean(&|r| r.screening),
            mean(&|r| r.fit),
            mean(&|r| r.realized),
            100.0 * rs.iter().filter(|r| r.certified).count() as f64 / k,
            said.len(),
            said.iter().filter(|r| r.certified).count(),
            f / g,
            rule / gold_total,
            always / gold_total,
            hindsight / gold_total,
        );
    }
    Ok(())
}
