//! Optimizes generated workloads on their samples and replays the plans on the whole populations.
//!
//! `cargo run --release -p stretto-optim --example workload_eval -- [RUNS|FIRST..END] [METHODS] [TARGETS]`
//! e.g. `-- 200 global,lotus` or `-- 100..200 global,lotus,gold 0.9`. Prints the summary table (markdown) and writes every run to `workload_runs.csv`.

use stretto_optim::evaluation::{evaluate, seeds_arg, summarize, summary_markdown};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let seeds = seeds_arg(args.get(1).map(String::as_str), 100)?;
    let methods: Vec<String> = args
        .get(2)
        .map(|s| s.split(',').map(str::to_string).collect())
        .unwrap_or_else(|| vec!["global".into(), "lotus".into()]);
    let methods: Vec<&str> = methods.iter().map(String::as_str).collect();
    let targets: Vec<f64> = match args.get(3) {
        Some(s) => s.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![0.5, 0.7, 0.9],
    };
    let t0 = std::time::Instant::now();
    let records = evaluate(&seeds, &methods, &targets, 0.95)?;
    let mut csv = String::from("seed,method,target,precision,recall,cost,gold_cost,fell_back,seconds\n");
    for r in &records {
        csv.push_str(&format!(
            "{},{},{},{},{},{},{},{},{}\n",
            r.seed, r.method, r.target, r.precision, r.recall, r.cost, r.gold_cost, r.fell_back, r.seconds
        ));
    }
    std::fs::write("workload_runs.csv", csv)?;
    for &t in &targets {
        let fb: Vec<_> = records.iter().filter(|r| r.method == "global" && r.target == t && r.fell_back).collect();
        let none = fb.iter().filter(|r| r.warnings.contains("no candidate plan reached")).count();
        let empty = fb.iter().filter(|r| r.warnings.contains("test sequence is empty")).count();
        eprintln!(
            "target {t}: {} fallbacks: {none} without any candidate, {empty} with no step worth testing, {} with the \
             first step not certified",
            fb.len(),
            fb.len() - none - empty
        );
    }
    print!("{}", summary_markdown(&summarize(&records)));
    // Cost of global relative to lotus on the same runs.
    for &t in &targets {
        let cost = |m: &str| records.iter().filter(|r| r.method == m && r.target == t).map(|r| r.cost).sum::<f64>();
        if cost("lotus") > 0.0 && cost("global") > 0.0 {
            println!("target {t}: mean cost global / lotus = {:.3}", cost("global") / cost("lotus"));
        }
    }
    eprintln!("{} runs in {:.1}s", records.len(), t0.elapsed().as_secs_f64());
    Ok(())
}
