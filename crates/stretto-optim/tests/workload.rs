//! Optimize on a 10–20% sample, replay on the whole population: the guarantee the global optimizer makes.
//!
//! CI-sized: 40 generated workloads per target. `examples/workload_eval.rs` runs the same at any size.

use stretto_optim::evaluation::{evaluate, summarize, summary_markdown};

#[test]
fn global_plans_meet_both_targets_and_undercut_lotus() {
    let seeds: Vec<u64> = (1000..1040).collect();
    let records = evaluate(&seeds, &["global", "lotus"], &[0.5, 0.7, 0.9], 0.95).unwrap();
    let summary = summarize(&records);
    eprintln!("{}", summary_markdown(&summary));
    for row in summary.iter().filter(|r| r.method == "global") {
        assert!(
            row.met_both >= 0.95,
            "global met both targets on only {:.1}% of runs at {}",
            100.0 * row.met_both,
            row.target
        );
    }
    for t in [0.5, 0.7, 0.9] {
        let cost = |m: &str| records.iter().filter(|r| r.method == m && r.target == t).map(|r| r.cost).sum::<f64>();
        assert!(cost("global") < cost("lotus"), "target {t}: global {} vs lotus {}", cost("global"), cost("lotus"));
    }
    // A gold fallback is exact.
    for r in records.iter().filter(|r| r.fell_back) {
        assert_eq!((r.precision, r.recall), (1.0, 1.0));
    }
}
