//! The relaxation's hand-written gradient against central finite differences, for every constraint form, both
//! schedule stages, filters and maps.

use stretto_optim::problem::Problem;
use stretto_optim::soft::{Constraint, LossConfig, Sides, SoftProblem};
use stretto_optim::workload::{generate, WorkloadConfig};

fn check(seed: u64, constraint: Constraint, frozen: bool) {
    check_with(seed, constraint, frozen, Sides::Both);
}

/// Small workloads of three operators (maps appear on some seeds), so finite differences stay cheap.
fn small() -> WorkloadConfig {
    WorkloadConfig {
        population: Some(600),
        sample_fraction: Some(0.2),
        operators: Some(3),
        filter_impls: Some(3),
        map_share: None,
    }
}

fn check_with(seed: u64, constraint: Constraint, frozen: bool, sides: Sides) {
    let w = generate(seed, &small());
    let problem = Problem::from_profile(&w.sample).unwrap();
    let rows: Vec<usize> = (0..problem.n).collect();
    let soft = SoftProblem::new(&problem, &rows);
    let np = soft.n_params();
    // Deterministic, varied parameters away from saturation.
    let x: Vec<f64> = (0..np).map(|i| ((i as f64 * 1.7 + seed as f64).sin()) * 1.5).collect();
    let cfg = LossConfig {
        precision: 0.95,
        recall: 0.95,
        credible: 0.95,
        beta: 3.0,
        constraint,
        t_pick: 0.5,
        t_par: 0.2,
        frozen: frozen.then(|| (0..np / 3).map(|k| k % 2 == 0).collect()),
        sides,
    };
    let mut grad = vec![0.0; np];
    let parts = soft.loss(&x, &cfg, Some(&mut grad));
    assert!(
        parts.lb_precision < 0.95 || parts.lb_recall < 0.95,
        "penalties must be active for the test to mean anything"
    );
    let mut worst: f64 = 0.0;
    for i in 0..np {
        let h = 1e-5;
        let mut xp = x.clone();
        xp[i] += h;
        let mut xm = x.clone();
        xm[i] -= h;
        let fd = (soft.loss(&xp, &cfg, None).loss - soft.loss(&xm, &cfg, None).loss) / (2.0 * h);
        let err = (fd - grad[i]).abs() / (1e-4 + fd.abs().max(grad[i].abs()));
        worst = worst.max(err);
        assert!(
            err < 2e-3,
            "param {i}: analytic {} vs finite difference {fd} ({constraint:?}, frozen={frozen})",
            grad[i]
        );
    }
    assert!(grad.iter().any(|g| g.abs() > 1e-6), "gradient is all zero");
    eprintln!("{constraint:?} frozen={frozen}: worst relative error {worst:.2e}");
}

#[test]
fn global_gradient_matches_finite_differences() {
    for seed in [1, 2, 3] {
        check(seed, Constraint::Global, false);
        check(seed, Constraint::Global, true);
    }
}

#[test]
fn reject_only_gradient_matches_finite_differences() {
    for seed in [6, 7] {
        check_with(seed, Constraint::Global, false, Sides::RejectOnly);
        check_with(seed, Constraint::Global, true, Sides::RejectOnly);
    }
}

#[test]
fn accept_only_gradient_matches_finite_differences() {
    for seed in [8, 9] {
        check_with(seed, Constraint::Global, false, Sides::AcceptOnly);
        check_with(seed, Constraint::Global, true, Sides::AcceptOnly);
    }
}

#[test]
fn independent_and_local_gradients_match_finite_differences() {
    for seed in [4, 5] {
        check(seed, Constraint::Product { credible_each: 0.97 }, false);
        check(seed, Constraint::Each { precision_each: 0.97, recall_each: 0.97, credible_each: 0.97 }, false);
    }
}

#[test]
fn the_checked_workloads_include_maps() {
    let kinds: Vec<_> =
        [1u64, 2, 3, 4, 5].iter().flat_map(|&s| generate(s, &small()).sample.logical).map(|l| l.kind).collect();
    assert!(kinds.contains(&stretto_core::op::LogicalKind::Map), "{kinds:?}");
}
