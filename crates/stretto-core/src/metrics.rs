//! Small evaluation measures shared by the optimizer, the operators' tests and the benchmarks.

/// Area under the ROC curve of `scores` against `labels` (ties count half; 0.5 when one class is empty).
pub fn auc(scores: &[f64], labels: &[bool]) -> f64 {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let (mut rank_sum, mut pos) = (0.0, 0usize);
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && scores[idx[j + 1]] == scores[idx[i]] {
            j += 1;
        }
        let r = (i + j) as f64 / 2.0 + 1.0;
        for &k in &idx[i..=j] {
            if labels[k] {
                rank_sum += r;
                pos += 1;
            }
        }
        i = j + 1;
    }
    let neg = scores.len() - pos;
    if pos == 0 || neg == 0 {
        return 0.5;
    }
    (rank_sum - (pos * (pos + 1)) as f64 / 2.0) / (pos * neg) as f64
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
    }
}
