//! Bayesian credible lower bounds on precision and recall.
//!
//! With a uniform prior, the posterior of a rate after `s` successes and `f` failures is `Beta(1 + s, 1 + f)`; its
//! `(1 − α)` quantile is the bound that holds with posterior probability `α`:
//! `LB_P = BetaQuantile(1 − α; 1 + TP, 1 + FP)`, `LB_R = BetaQuantile(1 − α; 1 + TP, 1 + FN)`.
//!
//! The optimizer needs the bound's derivatives with respect to the (soft) counts. We take them by central
//! differences of the *exact* quantile (statrs' inverse regularised incomplete beta), with a step relative to the
//! counts: an honest derivative of exactly what is optimised, accurate to ~1e-7, at the price of four extra
//! quantile evaluations per step (microseconds), which is negligible next to the cascade relaxation.

use statrs::function::beta::inv_beta_reg;
use statrs::function::gamma::{gamma_lr, ln_gamma};

/// `BetaQuantile(1 − credible; 1 + successes, 1 + failures)`.
pub fn beta_lower_bound(successes: f64, failures: f64, credible: f64) -> f64 {
    let a = 1.0 + successes.max(0.0);
    let b = 1.0 + failures.max(0.0);
    inv_beta_reg(a, b, (1.0 - credible).clamp(0.0, 1.0))
}

/// The bound and its partial derivatives with respect to `successes` and `failures`.
pub fn beta_lower_bound_grad(successes: f64, failures: f64, credible: f64) -> (f64, f64, f64) {
    let lb = beta_lower_bound(successes, failures, credible);
    let (ds, df) = beta_lower_bound_slopes(successes, failures, credible, lb);
    (lb, ds, df)
}

/// The partial derivatives of [`beta_lower_bound`] with respect to `successes` and `failures`, given the bound
/// itself (`lb`), for a caller that needs them only sometimes (the loss, only while a penalty is active).
pub fn beta_lower_bound_slopes(successes: f64, failures: f64, credible: f64, lb: f64) -> (f64, f64) {
    let s = successes.max(0.0);
    let f = failures.max(0.0);
    let hs = 1e-4 * (1.0 + s);
    let hf = 1e-4 * (1.0 + f);
    // One-sided at 0 keeps the counts non-negative.
    let ds = if s > hs {
        (beta_lower_bound(s + hs, f, credible) - beta_lower_bound(s - hs, f, credible)) / (2.0 * hs)
    } else {
        (beta_lower_bound(s + hs, f, credible) - lb) / hs
    };
    let df = if f > hf {
        (beta_lower_bound(s, f + hf, credible) - beta_lower_bound(s, f - hf, credible)) / (2.0 * hf)
    } else {
        (beta_lower_bound(s, f + hf, credible) - lb) / hf
    };
    (ds, df)
}

/// Posterior probability that *both* precision ≥ `target_p` and recall ≥ `target_r`.
///
/// The counts' cells get a Dirichlet(1 + TP, 1 + FP, 1 + FN, 1 + TN) posterior, whose marginals for precision and
/// recall are exactly the Beta posteriors above. With the gamma representation `X_c ~ Gamma(1 + count_c)`,
/// precision ≥ T_P ⟺ `X_FP ≤ X_TP·(1 − T_P)/T_P`, and recall likewise with `X_FN`; given `X_TP` the two events are
/// independent, so the joint probability is the one-dimensional integral
/// `∫ f_TP(x) · G_FP(x·k_P) · G_FN(x·k_R) dx` with `G` the gamma CDFs, computed by Simpson's rule over ±12
/// standard deviations of `X_TP`.
pub fn joint_target_probability(tp: f64, fp: f64, fn_: f64, target_p: f64, target_r: f64) -> f64 {
    let a = 1.0 + tp.max(0.0);
    let (b, c) = (1.0 + fp.max(0.0), 1.0 + fn_.max(0.0));
    let kp = (1.0 - target_p) / target_p;
    let kr = (1.0 - target_r) / target_r;
    let sd = a.sqrt();
    let lo = (a - 12.0 * sd).max(0.0);
    let hi = a + 12.0 * sd + 10.0;
    let steps = 800; // even
    let h = (hi - lo) / steps as f64;
    let ln_ga = ln_gamma(a);
    let f = |x: f64| -> f64 {
        if x <= 0.0 {
            return 0.0;
        }
        let dens = ((a - 1.0) * x.ln() - x - ln_ga).exp();
        dens * gamma_lr(b, x * kp) * gamma_lr(c, x * kr)
    };
    let mut sum = f(lo) + f(hi);
    for i in 1..steps {
        let w = if i % 2 == 1 { 4.0 } else { 2.0 };
        sum += w * f(lo + i as f64 * h);
    }
    (sum * h / 3.0).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_known_quantiles() {
        // Beta(1,1) is uniform: its 5% quantile is 0.05.
        assert!((beta_lower_bound(0.0, 0.0, 0.95) - 0.05).abs() < 1e-9);
        // Beta(10, 1): CDF x^10, 5% quantile 0.05^(1/10).
        assert!((beta_lower_bound(9.0, 0.0, 0.95) - 0.05f64.powf(0.1)).abs() < 1e-9);
        // Beta(1, 10): CDF 1-(1-x)^10, 5% quantile 1-0.95^(1/10).
        assert!((beta_lower_bound(0.0, 9.0, 0.95) - (1.0 - 0.95f64.powf(0.1))).abs() < 1e-9);
    }

    #[test]
    fn joint_probability_agrees_with_marginals_and_monte_carlo() {
        use rand::SeedableRng;
        use rand_distr::{Distribution, Gamma};
        // With no false positives and a lenient precision target, the joint probability is recall's marginal one.
        let marginal_r = 1.0 - statrs::function::beta::beta_reg(1.0 + 60.0, 1.0 + 3.0, 0.9);
        let joint = joint_target_probability(60.0, 0.0, 3.0, 0.01, 0.9);
        assert!((joint - marginal_r).abs() < 1e-6, "{joint} vs {marginal_r}");
        // The marginal quantile is consistent: Pr(P >= LB_P) = α.
        let lb = beta_lower_bound(80.0, 5.0, 0.95);
        assert!((joint_target_probability(80.0, 5.0, 0.0, lb, 1e-9) - 0.95).abs() < 1e-6);
        // Monte Carlo on the Dirichlet posterior.
        let (tp, fp, fn_, t) = (70.0, 4.0, 6.0, 0.88);
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let (g_tp, g_fp, g_fn) = (
            Gamma::new(1.0 + tp, 1.0).unwrap(),
            Gamma::new(1.0 + fp, 1.0).unwrap(),
            Gamma::new(1.0 + fn_, 1.0).unwrap(),
        );
        let draws = 200_000;
        let hits = (0..draws)
            .filter(|_| {
                let (x, y, z): (f64, f64, f64) = (g_tp.sample(&mut rng), g_fp.sample(&mut rng), g_fn.sample(&mut rng));
                x / (x + y) >= t && x / (x + z) >= t
            })
            .count();
        let mc = hits as f64 / draws as f64;
        let exact = joint_target_probability(tp, fp, fn_, t, t);
        assert!((mc - exact).abs() < 0.005, "{mc} vs {exact}");
        // And it is below each marginal probability.
        let mp = 1.0 - statrs::function::beta::beta_reg(1.0 + tp, 1.0 + fp, t);
        let mr = 1.0 - statrs::function::beta::beta_reg(1.0 + tp, 1.0 + fn_, t);
        assert!(exact <= mp.min(mr) + 1e-9);
    }

    #[test]
    fn bound_moves_the_right_way() {
        let (lb, ds, df) = beta_lower_bound_grad(80.0, 20.0, 0.95);
        assert!(lb < 0.8 && lb > 0.7);
        assert!(ds > 0.0 && df < 0.0);
        // Analytic check on Beta(a, 1): d/da of 0.05^(1/a) = 0.05^(1/a) * -ln(0.05) / a^2.
        let (v, d, _) = beta_lower_bound_grad(9.0, 0.0, 0.95);
        let exact = v * -(0.05f64.ln()) / 100.0;
        assert!((d - exact).abs() < 1e-6, "{d} vs {exact}");
    }
}
