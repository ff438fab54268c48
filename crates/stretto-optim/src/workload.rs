//! A generator of realistic optimization workloads, for testing and benchmarking the optimizer without models.
//!
//! Each workload is a population of thousands of tuples and a query of 1–4 correlated semantic operators. The
//! generator draws one population profile (every operator's output on every tuple) and a 10–20% sample of it. The
//! optimizer sees only the sample; plans are then replayed on the whole population. The structure aims at what
//! makes real cascades hard:
//!
//! - **correlated operators**: filter labels share a latent factor, so global counts differ from products of
//!   per-operator counts;
//! - **shared difficulty**: some tuples are noisy for every model, so implementations' errors are correlated;
//! - **heavy-tailed noise** (Student-t, 3 degrees of freedom) and **miscalibration**: cheap operators' scores have
//!   random offsets and scales, so the default threshold 0 is wrong for them;
//! - **sub-populations on which cheap operators are confidently wrong** (their score's sign flips with a large
//!   magnitude), which a threshold tuned on the bulk will not catch. Each cheap model family (embeddings, small
//!   LLM at every compression ratio) has its own blind spot of 5–15% of the tuples, as models of different
//!   families fail on different inputs; map extractors share a third one;
//! - maps with a codegen-like extractor that is exact on a well-formatted share of tuples and silent elsewhere,
//!   and LLM extractors whose confidence is only loosely tied to correctness.
//!
//! Costs follow the published ladder's shape: embeddings ≪ small LLM (compressed cheaper) < medium LLM < gold.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal, StudentT};
use stretto_core::op::LogicalKind;

use crate::profile::{LogicalEntry, PhysicalEntry, Profile, PROFILE_FORMAT};

/// Settings of the generator; `Default` draws everything at random from the seed.
#[derive(Debug, Clone, Default)]
pub struct WorkloadConfig {
    /// Population size (default: uniform in 2000..6000).
    pub population: Option<usize>,
    /// Sample fraction (default: uniform in 0.10..0.20).
    pub sample_fraction: Option<f64>,
    /// Number of logical operators (default: uniform in 1..=4).
    pub operators: Option<usize>,
    /// Implementations per filter besides gold (default 6; at most 6).
    pub filter_impls: Option<usize>,
    /// Probability that an operator after the first is a map (default 0.3).
    pub map_share: Option<f64>,
}

/// A generated workload.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Every operator's output on every tuple of the population.
    pub population: Profile,
    /// Indices of the sampled tuples in the population.
    pub sample_rows: Vec<usize>,
    /// The profile the optimizer sees (the sample, with `population` set to the population size).
    pub sample: Profile,
}

/// (name, cost in seconds, signal strength, cheap: confidently wrong on the sub-population, family)
const FILTER_LADDER: &[(&str, f64, f64, bool, usize)] = &[
    ("emb", 0.0008, 0.9, true, 0),
    ("small@0.8", 0.011, 1.3, true, 1),
    ("small@0.5", 0.014, 1.6, true, 1),
    ("small@0", 0.018, 1.8, true, 1),
    ("mid@0.5", 0.038, 2.8, false, 2),
    ("mid@0", 0.048, 3.2, false, 2),
];
const FILTER_GOLD_COST: f64 = 0.09;

/// (name, cost, base accuracy logit)
const MAP_LADDER: &[(&str, f64, f64)] = &[("small@0.5", 0.016, 0.6), ("small@0", 0.021, 1.0), ("mid@0", 0.05, 2.2)];
const MAP_GOLD_COST: f64 = 0.12;
const MAP_CARDINALITY: usize = 12;

/// Generates the workload of `seed`.
pub fn generate(seed: u64, config: &WorkloadConfig) -> Workload {
    let mut rng = StdRng::seed_from_u64(seed);
    let n = config.population.unwrap_or_else(|| rng.random_range(2000..6000));
    let fraction = config.sample_fraction.unwrap_or_else(|| rng.random_range(0.10..0.20));
    let n_ops = config.operators.unwrap_or_else(|| rng.random_range(1..=4));
    let n_filter_impls = config.filter_impls.unwrap_or(FILTER_LADDER.len()).min(FILTER_LADDER.len());
    let normal = Normal::new(0.0, 1.0).expect("valid normal");
    let heavy = StudentT::new(3.0).expect("valid t");

    // Tuple-level latents shared by all operators.
    let shared: Vec<f64> = (0..n).map(|_| normal.sample(&mut rng)).collect();
    let difficulty: Vec<f64> = (0..n).map(|_| normal.sample(&mut rng).abs()).collect();
    // Each cheap model family has its own blind spot: a sub-population on which it is confidently wrong.
    let blind: Vec<Vec<bool>> = (0..3)
        .map(|_| {
            let share = rng.random_range(0.05..0.15);
            (0..n).map(|_| rng.random::<f64>() < share).collect()
        })
        .collect();
    let sub = &blind[2];
    let rho = rng.random_range(0.0..0.7);

    let mut logical = Vec::new();
    let mut physical = Vec::new();
    let mut query = Vec::new();
    // At least one filter, so the gold result is a strict subset.
    for c in 0..n_ops {
        let is_map = c > 0 && rng.random::<f64>() < config.map_share.unwrap_or(0.3);
        if is_map {
            let name = format!("m{c}");
            logical.push(LogicalEntry { name: name.clone(), kind: LogicalKind::Map, prompt: None });
            query.push(format!("extract {name}"));
            let gold: Vec<usize> = (0..n).map(|_| rng.random_range(0..MAP_CARDINALITY)).collect();
            let formatted_share = rng.random_range(0.3..0.8);
            let formatted: Vec<bool> = (0..n).map(|_| rng.random::<f64>() < formatted_share).collect();
            // Codegen: exact where the text is well formatted (but confidently wrong 3% of the time), silent elsewhere.
            let mut values = Vec::with_capacity(n);
            let mut conf = Vec::with_capacity(n);
            for r in 0..n {
                if formatted[r] {
                    let v = if rng.random::<f64>() < 0.97 { gold[r] } else { (gold[r] + 1) % MAP_CARDINALITY };
                    values.push(Some(format!("v{v}")));
                    conf.push(Some(1.0));
                } else {
                    values.push(None);
                    conf.push(Some(0.0));
                }
            }
            physical.push(PhysicalEntry {
                name: format!("{name}/codegen"),
                logical: name.clone(),
                cost: 0.0001,
                scores: Some(conf),
                values: Some(values),
                gold: false,
            });
            for &(imp, cost, base) in MAP_LADDER {
                let cost = cost * rng.random_range(0.8..1.2);
                let calib = rng.random_range(0.3..1.5);
                let offset = rng.random_range(-1.0..1.0);
                let mut values = Vec::with_capacity(n);
                let mut conf = Vec::with_capacity(n);
                for r in 0..n {
                    let logit = base - 1.2 * difficulty[r] - if sub[r] { 1.5 } else { 0.0 };
                    let correct = rng.random::<f64>() < 1.0 / (1.0 + (-logit).exp());
                    let v = if correct {
                        gold[r]
                    } else {
                        (gold[r] + rng.random_range(1..MAP_CARDINALITY)) % MAP_CARDINALITY
                    };
                    values.push(Some(format!("v{v}")));
                    let c = offset + calib * (if correct { 1.0 } else { -0.2 }) + 0.8 * heavy.sample(&mut rng);
                    conf.push(Some(c));
                }
                physical.push(PhysicalEntry {
                    name: format!("{name}/{imp}"),
                    logical: name.clone(),
                    cost,
                    scores: Some(conf),
                    values: Some(values),
                    gold: false,
                });
            }
            physical.push(PhysicalEntry {
                name: format!("{name}/gold"),
                logical: name.clone(),
                cost: MAP_GOLD_COST * rng.random_range(0.8..1.2),
                scores: None,
                values: Some(gold.iter().map(|v| Some(format!("v{v}"))).collect()),
                gold: true,
            });
        } else {
            let name = format!("f{c}");
            logical.push(LogicalEntry { name: name.clone(), kind: LogicalKind::Filter, prompt: None });
            query.push(format!("{name} holds"));
            let selectivity = rng.random_range(0.15..0.6);
            let own: Vec<f64> = (0..n).map(|_| normal.sample(&mut rng)).collect();
            let latent: Vec<f64> = (0..n).map(|r| rho * shared[r] + (1.0 - rho * rho).sqrt() * own[r]).collect();
            let cut = quantile(&latent, 1.0 - selectivity);
            let label: Vec<f64> = latent.iter().map(|&z| if z > cut { 1.0 } else { -1.0 }).collect();
            // Items near the decision boundary are ambiguous for every model.
            let margin: Vec<f64> = latent.iter().map(|&z| ((z - cut).abs() * 2.0).tanh()).collect();
            let family_noise: Vec<Vec<f64>> =
                (0..3).map(|_| (0..n).map(|_| heavy.sample(&mut rng)).collect()).collect();
            for &(imp, cost, strength, cheap, family) in &FILTER_LADDER[FILTER_LADDER.len() - n_filter_impls..] {
                let cost = cost * rng.random_range(0.8..1.2);
                let (offset, scale) = if imp == "emb" {
                    (rng.random_range(0.2..0.5), rng.random_range(0.05..0.15))
                } else {
                    (rng.random_range(-1.5..1.5), rng.random_range(0.7..2.5))
                };
                let scores = (0..n)
                    .map(|r| {
                        let noise = (0.75f64.sqrt() * family_noise[family][r] + 0.5 * heavy.sample(&mut rng))
                            * (0.6 + difficulty[r]);
                        let signal = if cheap && blind[family][r] {
                            -label[r] * strength * 1.5
                        } else {
                            label[r] * strength * (0.3 + margin[r])
                        };
                        Some(offset + scale * (signal + noise))
                    })
                    .collect();
                physical.push(PhysicalEntry {
                    name: format!("{name}/{imp}"),
                    logical: name.clone(),
                    cost,
                    scores: Some(scores),
                    values: None,
                    gold: false,
                });
            }
            let gold = label.iter().map(|&y| Some(y * (1.0 + 2.0 * rng.random::<f64>()))).collect();
            physical.push(PhysicalEntry {
                name: format!("{name}/gold"),
                logical: name.clone(),
                cost: FILTER_GOLD_COST * rng.random_range(0.8..1.2),
                scores: Some(gold),
                values: None,
                gold: true,
            });
        }
    }
    let population = Profile {
        format: PROFILE_FORMAT.into(),
        query: query.join(" -- "),
        population: n as u64,
        tuples: (0..n).map(|i| format!("t{i}")).collect(),
        logical,
        physical,
        sample_digest: None,
    };
    let m = ((n as f64 * fraction).round() as usize).clamp(1, n);
    let mut rows: Vec<usize> = (0..n).collect();
    for i in 0..m {
        let j = rng.random_range(i..n);
        rows.swap(i, j);
    }
    let mut sample_rows = rows[..m].to_vec();
    sample_rows.sort_unstable();
    let sample = population.subset(&sample_rows, n as u64);
    Workload { population, sample_rows, sample }
}

fn quantile(values: &[f64], q: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_are_valid_and_deterministic() {
        for seed in 0..20 {
            let w = generate(seed, &WorkloadConfig::default());
            w.population.validate().unwrap();
            w.sample.validate().unwrap();
            let frac = w.sample.len() as f64 / w.population.len() as f64;
            assert!((0.095..=0.205).contains(&frac), "{frac}");
            assert!((1..=4).contains(&w.population.logical.len()));
        }
        let a = generate(7, &WorkloadConfig::default());
        let b = generate(7, &WorkloadConfig::default());
        assert_eq!(a.sample, b.sample);
    }
}
