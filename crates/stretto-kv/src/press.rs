//! Query-agnostic KV-cache compression ("presses"): which cached tokens of an item to keep, before the question is
//! known.
//!
//! [`Press::ExpectedAttention`] follows the published method: the item's own pre-RoPE query statistics (mean and
//! covariance per layer and head, emitted by the decoder graph) are rotated by the RoPE averaged over the next 512
//! positions, giving a Gaussian estimate of future queries; each cached key is scored by its expected softmax
//! attention `exp(μ̄·k/√d + kᵀΣ̄k/2d)` (normalised over keys, averaged over the query heads sharing the KV head),
//! times its value's norm. Keys are stored after RoPE, so a kept key keeps its original position unless the caller
//! asks for re-rotation to contiguous positions. [`Press::KeyNorm`] (keep low-norm keys) and
//! [`Press::Streaming`] (sinks plus the most recent tokens) are cheap alternatives. Every press keeps the first
//! [`SINKS`] tokens and `max(1, ⌊L·(1−r)⌋)` tokens per KV head in all.

use serde::{Deserialize, Serialize};

use crate::convert::DecoderConfig;
use crate::decoder::{KvPast, QueryStats};
use crate::error::{KvError, Result};

/// Attention-sink tokens every press keeps.
pub const SINKS: usize = 4;
/// Future positions the Expected Attention press averages RoPE over.
pub const FUTURE_POSITIONS: usize = 512;

/// A compression method.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Press {
    /// Expected attention of future queries times value norm.
    ExpectedAttention,
    /// Keep the keys of smallest norm.
    KeyNorm,
    /// Keep the sinks and the most recent tokens.
    Streaming,
}

impl Press {
    /// Short name used in profile ids and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Press::ExpectedAttention => "expected-attention",
            Press::KeyNorm => "key-norm",
            Press::Streaming => "streaming",
        }
    }

    /// Parses [`Press::name`] (and the abbreviations `ea`, `knorm`).
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "expected-attention" | "ea" => Ok(Press::ExpectedAttention),
            "key-norm" | "knorm" => Ok(Press::KeyNorm),
            "streaming" => Ok(Press::Streaming),
            other => Err(KvError::Usage(format!(
                "unknown press `{other}`; choose expected-attention, key-norm or streaming"
            ))),
        }
    }
}

/// Where kept keys sit after compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Positions {
    /// Kept keys keep their original positions; the question continues after the original length (answered
    /// better on SmolLM2-135M).
    #[default]
    Keep,
    /// Kept keys are re-rotated to positions `0..n_kept` and the question continues at `n_kept` (the published
    /// method).
    Rerotate,
}

/// Tokens kept of `len` at compression ratio `ratio`.
pub fn kept(len: usize, ratio: f64) -> usize {
    if len == 0 {
        return 0;
    }
    // The epsilon keeps 10·(1 − 0.8) at 2 despite binary rounding.
    (((len as f64) * (1.0 - ratio) + 1e-9).floor() as usize).clamp(1, len)
}

/// Per KV head of one layer, the score of every cached token (higher = keep).
pub fn scores(
    press: Press,
    config: &DecoderConfig,
    past: &KvPast,
    stats: Option<&QueryStats>,
    layer: usize,
) -> Result<Vec<Vec<f32>>> {
    let (kv, hd, n) = (past.kv_heads, past.head_dim, past.len);
    let keys = &past.keys[layer];
    let values = &past.values[layer];
    let at = |h: usize, t: usize| h * n * hd + t * hd;
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    match press {
        Press::Streaming => Ok((0..kv).map(|_| (0..n).map(|t| t as f32).collect()).collect()),
        Press::KeyNorm => {
            Ok((0..kv).map(|h| (0..n).map(|t| -norm(&keys[at(h, t)..at(h, t) + hd])).collect()).collect())
        }
        Press::ExpectedAttention => {
            let stats = stats.ok_or_else(|| {
                KvError::Usage("the expected-attention press needs the prefill's query statistics".into())
            })?;
            let heads = config.heads;
            let group = heads / kv;
            let (c, s) = averaged_rope(config, past.next_position as usize);
            let scale = 1.0 / (hd as f32).sqrt();
            let mut out = vec![vec![0f32; n]; kv];
            for qh in 0..heads {
                let mu = &stats.mean[layer][qh * hd..(qh + 1) * hd];
                let sigma = &stats.cov[layer][qh * hd * hd..(qh + 1) * hd * hd];
                let mu_bar = rotate(&c, &s, mu);
                let sigma_bar = rotate_cov(&c, &s, sigma, hd);
                let h = qh / group;
                let mut logits = vec![0f32; n];
                for (t, l) in logits.iter_mut().enumerate() {
                    let k = &keys[at(h, t)..at(h, t) + hd];
                    let lin: f32 = mu_bar.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale;
                    let mut quad = 0f32;
                    for i in 0..hd {
                        let row = &sigma_bar[i * hd..(i + 1) * hd];
                        quad += k[i] * row.iter().zip(k).map(|(a, b)| a * b).sum::<f32>();
                    }
                    *l = lin + quad / (2.0 * hd as f32);
                }
                let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let z: f32 = logits.iter().map(|l| (l - m).exp()).sum();
                for (t, l) in logits.iter().enumerate() {
                    out[h][t] += (l - m).exp() / z / group as f32;
                }
            }
            for (h, row) in out.iter_mut().enumerate() {
                for (t, v) in row.iter_mut().enumerate() {
                    *v *= norm(&values[at(h, t)..at(h, t) + hd]);
                }
            }
            Ok(out)
        }
    }
}

/// RoPE averaged over the next [`FUTURE_POSITIONS`] positions after `start`, as per-dimension (cos, sin) of
/// `R̄ = diag(c) + diag(s)·P` where `P` is rotate-half.
fn averaged_rope(config: &DecoderConfig, start: usize) -> (Vec<f32>, Vec<f32>) {
    let hd = config.head_dim;
    let mut c = vec![0f64; hd];
    let mut s = vec![0f64; hd];
    for i in 0..hd / 2 {
        let inv = config.rope_base.powf(-2.0 * i as f64 / hd as f64);
        for t in 0..FUTURE_POSITIONS {
            let (sn, cs) = (((start + t) as f64) * inv).sin_cos();
            c[i] += cs;
            s[i] += sn;
        }
        c[i] /= FUTURE_POSITIONS as f64;
        s[i] /= FUTURE_POSITIONS as f64;
        c[i + hd / 2] = c[i];
        s[i + hd / 2] = s[i];
    }
    (c.iter().map(|v| *v as f32).collect(), s.iter().map(|v| *v as f32).collect())
}

/// `R̄·x` with `R̄ = diag(c) + diag(s)·P`, `P·x = [−x₂, x₁]`.
fn rotate(c: &[f32], s: &[f32], x: &[f32]) -> Vec<f32> {
    let half = x.len() / 2;
    (0..x.len())
        .map(|i| {
            let px = if i < half { -x[i + half] } else { x[i - half] };
            c[i] * x[i] + s[i] * px
        })
        .collect()
}

/// `R̄·Σ·R̄ᵀ` in O(d²), using the structure of `R̄`.
fn rotate_cov(c: &[f32], s: &[f32], sigma: &[f32], hd: usize) -> Vec<f32> {
    // A = R̄Σ column by column; then R̄Σ R̄ᵀ = (R̄ Aᵀ)ᵀ.
    let mut a = vec![0f32; hd * hd];
    let mut col = vec![0f32; hd];
    for j in 0..hd {
        for i in 0..hd {
            col[i] = sigma[i * hd + j];
        }
        for (i, v) in rotate(c, s, &col).into_iter().enumerate() {
            a[i * hd + j] = v;
        }
    }
    let mut out = vec![0f32; hd * hd];
    for i in 0..hd {
        // Row i of A is column i of Aᵀ.
        let r = rotate(c, s, &a[i * hd..(i + 1) * hd]);
        for (j, v) in r.into_iter().enumerate() {
            out[i * hd + j] = v;
        }
    }
    out
}

/// Indices kept per KV head (ascending) given per-token scores: the sinks, then the best-scored rest.
pub fn select(scores: &[Vec<f32>], len: usize, ratio: f64) -> Vec<Vec<usize>> {
    let keep = kept(len, ratio);
    scores
        .iter()
        .map(|row| {
            if keep >= len {
                return (0..len).collect();
            }
            let sinks = SINKS.min(keep);
            let mut rest: Vec<usize> = (sinks..len).collect();
            rest.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            let mut idx: Vec<usize> = (0..sinks).chain(rest.into_iter().take(keep - sinks)).collect();
            idx.sort_unstable();
            idx
        })
        .collect()
}

/// Compresses `past` at every ratio of `ratios` from one scoring pass (nested index sets: a higher ratio keeps a
/// subset of a lower one's tokens).
pub fn compress_ladder(
    press: Press,
    positions: Positions,
    config: &DecoderConfig,
    past: &KvPast,
    stats: Option<&QueryStats>,
    ratios: &[f64],
) -> Result<Vec<KvPast>> {
    let mut out = Vec::with_capacity(ratios.len());
    compress_each(press, positions, config, past, stats, ratios, |_, c| {
        out.push(c.into_owned());
        Ok(())
    })?;
    Ok(out)
}

/// [`compress_ladder`] one ratio at a time: `each(ratio, past)` is handed each ratio's past in the order of `ratios`
/// (`past` itself, borrowed, where a ratio keeps every token), so that at most one compressed copy is alive at once.
/// A long item's caches are hundreds of megabytes: this is what keeps building them within memory.
pub fn compress_each(
    press: Press,
    positions: Positions,
    config: &DecoderConfig,
    past: &KvPast,
    stats: Option<&QueryStats>,
    ratios: &[f64],
    mut each: impl FnMut(f64, std::borrow::Cow<'_, KvPast>) -> Result<()>,
) -> Result<()> {
    for &r in ratios {
        if !(0.0..1.0).contains(&r) {
            return Err(KvError::Usage(format!("compression ratio {r} is outside [0, 1)")));
        }
    }
    let needs_scores = ratios.iter().any(|&r| kept(past.len, r) < past.len);
    let per_layer: Vec<Vec<Vec<f32>>> = if needs_scores {
        (0..config.layers).map(|l| scores(press, config, past, stats, l)).collect::<Result<_>>()?
    } else {
        Vec::new()
    };
    for &r in ratios {
        let keep = kept(past.len, r);
        if keep == past.len {
            each(r, std::borrow::Cow::Borrowed(past))?;
            continue;
        }
        let (kv, hd, n) = (past.kv_heads, past.head_dim, past.len);
        let mut out = KvPast {
            keys: Vec::with_capacity(config.layers),
            values: Vec::with_capacity(config.layers),
            len: keep,
            next_position: past.next_position,
            kv_heads: kv,
            head_dim: hd,
        };
        for (l, layer_scores) in per_layer.iter().enumerate() {
            let idx = select(layer_scores, n, r);
            let mut k = Vec::with_capacity(kv * keep * hd);
            let mut v = Vec::with_capacity(kv * keep * hd);
            for (h, ids) in idx.iter().enumerate() {
                for (j, &t) in ids.iter().enumerate() {
                    let at = h * n * hd + t * hd;
                    let key = &past.keys[l][at..at + hd];
                    match positions {
                        Positions::Keep => k.extend_from_slice(key),
                        Positions::Rerotate => k.extend(rerotate(
                            config,
                            key,
                            j as f64 - (t as f64 + past.next_position as f64 - n as f64),
                        )),
                    }
                    v.extend_from_slice(&past.values[l][at..at + hd]);
                }
            }
            out.keys.push(k);
            out.values.push(v);
        }
        if positions == Positions::Rerotate {
            out.next_position = keep as i64;
        }
        each(r, std::borrow::Cow::Owned(out))?;
    }
    Ok(())
}

/// Moves a post-RoPE key by `delta` positions (rotate-half convention).
fn rerotate(config: &DecoderConfig, key: &[f32], delta: f64) -> Vec<f32> {
    let hd = key.len();
    let half = hd / 2;
    let mut out = vec![0f32; hd];
    for i in 0..half {
        let inv = config.rope_base.powf(-2.0 * i as f64 / hd as f64);
        let (s, c) = (delta * inv).sin_cos();
        let (a, b) = (key[i] as f64, key[i + half] as f64);
        out[i] = (a * c - b * s) as f32;
        out[i + half] = (b * c + a * s) as f32;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> DecoderConfig {
        crate::decoder::tests::tiny_config(None)
    }

    fn past(n: usize) -> KvPast {
        let keys: Vec<f32> = (0..n * 4).map(|i| ((i * 37 % 11) as f32 - 5.0) / 3.0).collect();
        let values: Vec<f32> = (0..n * 4).map(|i| ((i * 13 % 7) as f32 - 3.0) / 2.0).collect();
        KvPast { keys: vec![keys], values: vec![values], len: n, next_position: n as i64, kv_heads: 1, head_dim: 4 }
    }

    #[test]
    fn kept_counts_follow_the_formula() {
        assert_eq!(kept(10, 0.0), 10);
        assert_eq!(kept(10, 0.5), 5);
        assert_eq!(kept(10, 0.8), 2);
        assert_eq!(kept(3, 0.9), 1);
    }

    #[test]
    fn ratio_zero_is_the_identity_and_ladders_are_nested() {
        let c = config();
        let p = past(20);
        let stats = QueryStats { mean: vec![vec![0.3; 8]], cov: vec![vec![0.01; 32]] };
        let ladder =
            compress_ladder(Press::ExpectedAttention, Positions::Keep, &c, &p, Some(&stats), &[0.0, 0.5, 0.8]).unwrap();
        assert_eq!(ladder[0], p);
        assert_eq!((ladder[1].len, ladder[2].len), (10, 4));
        assert_eq!(ladder[2].next_position, 20);
        // Every key kept at 0.8 is also kept at 0.5, and the sinks are always there.
        let rows = |q: &KvPast| q.keys[0].chunks(4).map(|k| k.to_vec()).collect::<Vec<_>>();
        let (half, fifth) = (rows(&ladder[1]), rows(&ladder[2]));
        assert!(fifth.iter().all(|k| half.contains(k)));
        assert_eq!(fifth[..4], rows(&p)[..4]);
    }

    #[test]
    fn rerotation_moves_keys_to_contiguous_positions() {
        let c = config();
        let p = past(12);
        let out = compress_ladder(Press::Streaming, Positions::Rerotate, &c, &p, None, &[0.5]).unwrap().remove(0);
        assert_eq!((out.len, out.next_position), (6, 6));
        // Streaming keeps the 4 sinks (positions unchanged) and the 2 most recent tokens (moved from 10, 11 to 4, 5).
        assert_eq!(out.keys[0][..16], p.keys[0][..16]);
        let back = rerotate(&c, &out.keys[0][16..20], 6.0);
        for (a, b) in back.iter().zip(&p.keys[0][40..44]) {
            assert!((a - b).abs() < 1e-5);
        }
    }

    #[test]
    fn averaged_rope_structure_matches_dense_products() {
        let c = config();
        let (cs, sn) = averaged_rope(&c, 7);
        let hd = 4;
        let dense: Vec<f32> = (0..hd * hd)
            .map(|ij| {
                let (i, j) = (ij / hd, ij % hd);
                let p = if i < 2 {
                    if j == i + 2 {
                        -1.0
                    } else {
                        0.0
                    }
                } else if j + 2 == i {
                    1.0
                } else {
                    0.0
                };
                (if i == j { cs[i] } else { 0.0 }) + sn[i] * p
            })
            .collect();
        let sigma: Vec<f32> = (0..16).map(|i| ((i * 7 % 5) as f32) / 4.0).collect();
        let mut want = vec![0f32; 16];
        for i in 0..4 {
            for j in 0..4 {
                for a in 0..4 {
                    for b in 0..4 {
                        want[i * 4 + j] += dense[i * 4 + a] * sigma[a * 4 + b] * dense[j * 4 + b];
                    }
                }
            }
        }
        let got = rotate_cov(&cs, &sn, &sigma, 4);
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5, "{got:?} vs {want:?}");
        }
        assert!(Press::parse("nope").is_err());
    }
}
