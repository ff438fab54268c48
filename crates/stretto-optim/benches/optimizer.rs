//! Optimizer wall time for 4 logical operators × 7 implementations × 600 sampled tuples (goal: median ≤ 1 s on 2
//! cores), for the certified `global` strategy at a target its sample can certify.

use criterion::{criterion_group, criterion_main, Criterion};
use stretto_optim::problem::Problem;
use stretto_optim::strategy::{strategy, Targets};
use stretto_optim::workload::{generate, WorkloadConfig};

fn bench(c: &mut Criterion) {
    let config = WorkloadConfig {
        population: Some(4000),
        sample_fraction: Some(0.15),
        operators: Some(4),
        filter_impls: Some(6),
        map_share: Some(0.0),
    };
    let w = generate(2, &config);
    let problem = Problem::from_profile(&w.sample).expect("valid workload");
    assert_eq!(problem.n, 600);
    assert!(problem.ops.iter().all(|o| o.impls.len() == 7));
    let global = strategy("global").expect("global");
    let mut group = c.benchmark_group("optimizer");
    group.sample_size(10);
    for target in [0.5, 0.7] {
        let targets = Targets::new(target, target, 0.95).expect("targets");
        group.bench_function(format!("global 4x7x600 target {target}"), |b| {
            b.iter(|| global.optimize(&problem, &targets, 0).expect("optimize"))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
