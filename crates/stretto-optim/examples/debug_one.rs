//! Debug helper: optimizes one workload with tracing at debug level.
//! `RUST_LOG=stretto_optim=debug cargo run --release -p stretto-optim --example debug_one -- SEED TARGET [METHOD]`
use stretto_optim::problem::Problem;
use stretto_optim::strategy::{strategy, Targets};
use stretto_optim::workload::{generate, WorkloadConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let a: Vec<String> = std::env::args().collect();
    let seed: u64 = a.get(1).map(|s| s.parse()).transpose()?.unwrap_or(0);
    let target: f64 = a.get(2).map(|s| s.parse()).transpose()?.unwrap_or(0.9);
    let method = a.get(3).cloned().unwrap_or_else(|| "global".into());
    let w = generate(seed, &WorkloadConfig::default());
    let sample = Problem::from_profile(&w.sample)?;
    let pop = Problem::from_profile(&w.population)?;
    println!(
        "n={} population={} ops={:?}",
        sample.n,
        pop.n,
        sample.ops.iter().map(|o| (o.name.clone(), o.kind)).collect::<Vec<_>>()
    );
    let opt = strategy(&method)?.optimize(&sample, &Targets::new(target, target, 0.95)?, seed)?;
    let c = pop.evaluate(&opt.plan, &pop.all_rows());
    let g = pop.evaluate(&pop.gold_plan(), &pop.all_rows());
    for s in &opt.plan.stages {
        println!("  {:<16} {:?} {:?}", sample.ops[s.op].impls[s.imp].physical, s.lower, s.upper);
    }
    println!(
        "P={:.3} R={:.3} cost/gold={:.3} lb=({:.3},{:.3}) warnings={:?}",
        c.precision(),
        c.recall(),
        c.cost / g.cost,
        opt.precision_lower_bound,
        opt.recall_lower_bound,
        opt.warnings
    );
    Ok(())
}
