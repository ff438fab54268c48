//! Small evaluation measures shared by the optimizer, the operators' tests and the benchmarks.

/// Ranks of `x` from 1, ties sharing their mean rank.
pub fn ranks(x: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let mut r = vec![0.0; x.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && x[order[j + 1]] == x[order[i]] {
            j += 1;
        }
        let mean = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            r[k] = mean;
        }
        i = j + 1;
    }
    r
}

/// Area under the ROC curve of `scores` against `labels` (ties count half; 0.5 when one class is empty).
pub fn auc(scores: &[f64], labels: &[bool]) -> f64 {
    let r = ranks(scores);
    let pos = labels.iter().filter(|l| **l).count();
    let neg = scores.len() - pos;
    if pos == 0 || neg == 0 {
        return 0.5;
    }
    let rank_sum: f64 = r.iter().zip(labels).filter(|(_, l)| **l).map(|(r, _)| r).sum();
    (rank_sum - (pos * (pos + 1)) as f64 / 2.0) / (pos * neg) as f64
}

/// Spearman's rank correlation of `a` and `b`: Pearson's correlation of their tie-averaged ranks; NaN when it is
/// undefined (different lengths, fewer than two pairs, or a constant side).
pub fn spearman(a: &[f64], b: &[f64]) -> f64 {
    if a.len() != b.len() || a.len() < 2 {
        return f64::NAN;
    }
    let (ra, rb) = (ranks(a), ranks(b));
    let n = ra.len() as f64;
    let (ma, mb) = (ra.iter().sum::<f64>() / n, rb.iter().sum::<f64>() / n);
    let cov: f64 = ra.iter().zip(&rb).map(|(x, y)| (x - ma) * (y - mb)).sum();
    let va: f64 = ra.iter().map(|x| (x - ma).powi(2)).sum();
    let vb: f64 = rb.iter().map(|y| (y - mb).powi(2)).sum();
    cov / (va * vb).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auc_of_perfect_reversed_and_tied_scores() {
        assert_eq!(auc(&[0.1, 0.2, 0.9, 0.8], &[false, false, true, true]), 1.0);
        assert_eq!(auc(&[0.9, 0.8, 0.1, 0.2], &[false, false, true, true]), 0.0);
        assert_eq!(auc(&[0.5, 0.5], &[false, true]), 0.5);
        assert_eq!(auc(&[0.5, 0.7], &[true, true]), 0.5);
        // Ties between the classes count half: one positive above one negative, one tied pair.
        assert_eq!(auc(&[0.3, 0.5, 0.5, 0.9], &[false, false, true, true]), 0.875);
    }

    #[test]
    fn spearman_averages_ties() {
        assert_eq!(ranks(&[3.0, 1.0, 3.0, 2.0]), [3.5, 1.0, 3.5, 2.0]);
        assert!((spearman(&[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]) - 1.0).abs() < 1e-12);
        assert!((spearman(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]) + 1.0).abs() < 1e-12);
        // Ranks (1.5, 1.5, 3) against (1, 2, 3): rho = sqrt(3)/2.
        assert!((spearman(&[1.0, 1.0, 2.0], &[1.0, 2.0, 3.0]) - 0.75f64.sqrt()).abs() < 1e-12);
        assert!(spearman(&[1.0, 1.0], &[1.0, 2.0]).is_nan());
    }
}
