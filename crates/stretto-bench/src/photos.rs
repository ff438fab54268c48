//! How well each image operator separates the true labels of the bundled e-commerce photos (`stretto bench
//! photos`): the image counterpart of [`crate::protocols`] and [`crate::encoders`].
//!
//! No CLIP or VLM weights are in reach, so the image operators are bridges, named as such: the label bridge
//! (EfficientNet-Lite0's ImageNet classes embedded through a sentence encoder, cosine with the predicate) and the
//! caption bridge (the classes written as a caption, which each ladder LLM reads as its cached item). Every image
//! filter of the registry that serves a predicate is scored on the rows of `products` that have a bundled photo,
//! against the labels derived from the catalog (`labels.is_tshirt_or_top`, …).
//!
//! **The split is fixed**, as in the protocols bench: among the photo rows in table order, the development slice
//! is the *last* `dev`, the evaluation slice the *first* `eval`. Reported per operator and predicate on each slice:
//! AUC, the share accepted and balanced accuracy at score > 0 (the LLM filters' calibrated log-odds rule), and
//! accuracy and balanced accuracy on the evaluation slice at the threshold that maximises balanced accuracy on the
//! development slice (the label bridge's cosine has no rule of its own: the optimizer tunes it).

use std::fmt::Write as _;
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use stretto::core::datasets::Dataset;
use stretto::core::metrics::auc;
use stretto::core::op::{Modality, OpOutput, Registry, SemanticTask};

use crate::experiments::Error;
use crate::protocols::Slice;

/// The photo predicates and the derived label each is scored against (the e-commerce predicates of
/// [`crate::protocols::TASKS`], asked of the photo instead of the description).
pub const PHOTO_TASKS: &[(&str, &str)] = &[
    ("{products.photo} shows a t-shirt or a top", "is_tshirt_or_top"),
    ("{products.photo} shows an item for men", "is_menswear"),
    ("{products.photo} shows an item designed to carry or hold objects", "carries_objects"),
    ("{products.photo} shows footwear", "is_footwear"),
];

/// What to measure.
#[derive(Debug, Clone)]
pub struct PhotoOptions {
    /// Photo rows of the development slice.
    pub dev: usize,
    /// Photo rows of the evaluation slice.
    pub eval: usize,
}

/// One measured (operator, predicate).
#[derive(Debug, Clone, serde::Serialize)]
pub struct PhotoRow {
    /// The physical operator.
    pub operator: String,
    /// The predicate.
    pub predicate: String,
    /// The label column it is scored against.
    pub label: String,
    /// Evaluation photos (positives among them).
    pub eval_n: usize,
    /// Positives among the evaluation photos.
    pub eval_positives: usize,
    /// AUC on the development slice.
    pub dev_auc: f64,
    /// AUC on the evaluation slice.
    pub eval_auc: f64,
    /// Share of evaluation photos accepted at score > 0.
    pub eval_accepted_at_0: f64,
    /// Accuracy on the evaluation slice at score > 0.
    pub eval_accuracy_at_0: f64,
    /// Balanced accuracy on the evaluation slice at score > 0.
    pub eval_balanced_at_0: f64,
    /// The threshold that maximises balanced accuracy on the development slice.
    pub dev_threshold: f64,
    /// Accuracy on the evaluation slice at that threshold.
    pub eval_accuracy_at_dev: f64,
    /// Balanced accuracy on the evaluation slice at that threshold.
    pub eval_balanced_at_dev: f64,
    /// Mean seconds per photo the operator reported (memoised answers report what computing them cost).
    pub seconds_per_item: f64,
}

/// Accuracy and balanced accuracy of `score > threshold` against `labels`, and the share accepted (the protocols
/// bench reads its rule, threshold 0, through this too).
pub fn rule(scores: &[f64], labels: &[bool], threshold: f64) -> (f64, f64, f64) {
    let n = scores.len().max(1) as f64;
    let (mut tp, mut tn, mut pos, mut accepted) = (0usize, 0usize, 0usize, 0usize);
    for (&s, &y) in scores.iter().zip(labels) {
        let keep = s > threshold;
        pos += y as usize;
        accepted += keep as usize;
        tp += (keep && y) as usize;
        tn += (!keep && !y) as usize;
    }
    let neg = labels.len() - pos;
    let rate = |hit: usize, of: usize| if of == 0 { 1.0 } else { hit as f64 / of as f64 };
    ((tp + tn) as f64 / n, (rate(tp, pos) + rate(tn, neg)) / 2.0, accepted as f64 / n)
}

/// The threshold (between two neighbouring scores, or below them all) with the highest balanced accuracy.
pub fn best_threshold(scores: &[f64], labels: &[bool]) -> f64 {
    let mut sorted: Vec<f64> = scores.iter().copied().filter(|s| s.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    sorted.dedup();
    let mut candidates = vec![sorted.first().map_or(0.0, |s| s - 1.0)];
    candidates.extend(sorted.windows(2).map(|w| (w[0] + w[1]) / 2.0));
    let mut best = (f64::NEG_INFINITY, candidates[0]);
    for t in candidates {
        let (_, balanced, _) = rule(scores, labels, t);
        if balanced > best.0 {
            best = (balanced, t);
        }
    }
    best.1
}

/// The photo rows of `products` (indices in table order) and a one-column batch of their photo paths, its field
/// named `products.photo` as a query's frame names it.
pub(crate) fn photo_rows(ds: &Dataset) -> Result<(Vec<usize>, StringArray), Error> {
    let products = ds.table("products")?;
    let photo = products.column_by_name("photo").ok_or("the bundled products table has no photo column")?;
    let photo = arrow::compute::cast(photo, &DataType::Utf8)?;
    let photo = photo.as_string::<i32>();
    let rows: Vec<usize> = (0..photo.len()).filter(|&i| photo.is_valid(i)).collect();
    let paths: StringArray = rows.iter().map(|&i| Some(photo.value(i))).collect();
    Ok((rows, paths))
}

/// The row numbers of `products` that have a bundled photo, in table order.
pub fn rows_with_photos(ds: &Dataset) -> Result<Vec<usize>, Error> {
    Ok(photo_rows(ds)?.0)
}

/// The table `products` cut to the rows that have a bundled photo ([`rows_with_photos`]), every column kept. The
/// experiments' `photos` dataset is this table.
pub fn products_with_photos(ds: &Dataset) -> Result<RecordBatch, Error> {
    let at = arrow::array::UInt32Array::from(rows_with_photos(ds)?.iter().map(|&i| i as u32).collect::<Vec<_>>());
    Ok(arrow::compute::take_record_batch(ds.table("products")?, &at)?)
}

/// The photo queries of the experiments: each predicate of [`PHOTO_TASKS`] alone, and each product category
/// (every predicate but the audience, `is_menswear`) asked of the items for men as a two-filter query (the
/// categories exclude each other: a photo shows one product), in an order shuffled with `seed`.
pub fn photo_queries(seed: u64) -> Vec<String> {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let men = PHOTO_TASKS.iter().find(|(_, l)| *l == "is_menswear").map(|(p, _)| *p);
    let mut out: Vec<String> = PHOTO_TASKS.iter().map(|(p, _)| p.to_string()).collect();
    for (p, _) in PHOTO_TASKS.iter().filter(|(p, _)| Some(*p) != men) {
        out.extend(men.map(|m| format!("{m} -- {p}")));
    }
    out.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    out
}

/// The derived label column that a photo predicate is scored against (`None` for any other text).
pub fn photo_label(predicate: &str) -> Option<&'static str> {
    PHOTO_TASKS.iter().find(|(p, _)| *p == predicate.trim()).map(|(_, l)| *l)
}

/// Scores every image filter of `registry` on every predicate of [`PHOTO_TASKS`].
pub fn measure(registry: &Registry, o: &PhotoOptions) -> Result<Vec<PhotoRow>, Error> {
    let ds = Dataset::load("ecommerce")?;
    let (rows, paths) = photo_rows(&ds)?;
    let labels = ds.table("labels")?;
    let slice = |s: Slice| {
        let (n, other) = if s == Slice::Dev { (o.dev, o.eval) } else { (o.eval, o.dev) };
        s.rows(rows.len(), n, other)
    };
    let (dev, eval) = (slice(Slice::Dev), slice(Slice::Eval));
    if dev.is_empty() || eval.is_empty() {
        return Err(format!("{} photo rows cannot hold a development and an evaluation slice", rows.len()).into());
    }
    let schema = Arc::new(Schema::new(vec![Field::new("products.photo", DataType::Utf8, true)]));
    let batch = RecordBatch::try_new(schema, vec![Arc::new(paths)])?;
    let mut out = Vec::new();
    let image_filters = |task: &SemanticTask| {
        registry
            .operators()
            .map(|(op, _)| op)
            .filter(|op| op.properties().modality == Modality::Image && op.serves(task))
            .collect::<Vec<_>>()
    };
    let steps: usize = PHOTO_TASKS.iter().map(|(p, _)| image_filters(&SemanticTask::filter("photo", *p)).len()).sum();
    // One step per operator and predicate (an operator scores all the photos at once).
    let bar = stretto::models::progress::bar(steps as u64, "photo filters");
    for (predicate, label) in PHOTO_TASKS {
        let column = labels
            .column_by_name(label)
            .ok_or_else(|| format!("the labels table has no column `{label}`"))?
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| format!("label column `{label}` is not an integer column"))?;
        let truth: Vec<bool> = rows.iter().map(|&i| column.value(i) == 1).collect();
        let task = SemanticTask::filter("photo", *predicate);
        for op in image_filters(&task) {
            bar.set_message(format!("{} on {label}", op.name()));
            let _span = tracing::info_span!("photo_probe", operator = op.name(), predicate).entered();
            let (output, secs) = op.evaluate_timed(&task, &batch)?;
            let OpOutput::Scores(scores) = output else {
                return Err(format!("{} returned map values for a filter", op.name()).into());
            };
            let (dev_s, dev_y) = (&scores[dev.clone()], &truth[dev.clone()]);
            let (eval_s, eval_y) = (&scores[eval.clone()], &truth[eval.clone()]);
            let (accuracy_0, balanced_0, accepted_0) = rule(eval_s, eval_y, 0.0);
            let threshold = best_threshold(dev_s, dev_y);
            let (accuracy_dev, balanced_dev, _) = rule(eval_s, eval_y, threshold);
            out.push(PhotoRow {
                operator: op.name().to_string(),
                predicate: predicate.to_string(),
                label: label.to_string(),
                eval_n: eval_s.len(),
                eval_positives: eval_y.iter().filter(|&&y| y).count(),
                dev_auc: auc(dev_s, dev_y),
                eval_auc: auc(eval_s, eval_y),
                eval_accepted_at_0: accepted_0,
                eval_accuracy_at_0: accuracy_0,
                eval_balanced_at_0: balanced_0,
                dev_threshold: threshold,
                eval_accuracy_at_dev: accuracy_dev,
                eval_balanced_at_dev: balanced_dev,
                seconds_per_item: secs.iter().sum::<f64>() / secs.len().max(1) as f64,
            });
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    if out.is_empty() {
        return Err("no image filter in the registry serves the photo predicates".into());
    }
    Ok(out)
}

/// The table of `rows`, with how it was measured.
pub fn markdown(rows: &[PhotoRow], o: &PhotoOptions) -> String {
    let mut s = String::from("# Image operators on the bundled e-commerce photos, against the derived labels\n\n");
    let _ = writeln!(
        s,
        "Written by `stretto bench photos --dev {} --eval {}`. Rows of `ecommerce.products` with a bundled photo, in \
         table order: the evaluation slice is the first {}, the development slice the last {}. Truth: the labels \
         derived from the catalog (`ecommerce.labels`). The operators are bridges (no CLIP or VLM weights are in \
         reach): `label-bridge` embeds EfficientNet-Lite0's top ImageNet classes through a sentence encoder; \
         `caption` writes them as a caption that an LLM reads. \"at 0\": score > 0, the LLM filters' calibrated \
         log-odds rule; \"at dev\": the threshold with the best balanced accuracy on the development slice.\n",
        o.dev, o.eval, o.eval, o.dev
    );
    s.push_str(
        "| operator | predicate | label | eval n (positive) | dev AUC | eval AUC | accepted at 0 | accuracy at 0 | \
         balanced at 0 | accuracy at dev | balanced at dev | s per photo |\n",
    );
    s.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} ({}) | {:.3} | {:.3} | {:.2} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |",
            r.operator,
            r.predicate,
            r.label,
            r.eval_n,
            r.eval_positives,
            r.dev_auc,
            r.eval_auc,
            r.eval_accepted_at_0,
            r.eval_accuracy_at_0,
            r.eval_balanced_at_0,
            r.eval_accuracy_at_dev,
            r.eval_balanced_at_dev,
            r.seconds_per_item
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_counts_right() {
        // Scores of two positives and two negatives; one of each kept at 0.
        let (accuracy, balanced, accepted) = rule(&[1.0, -1.0, 2.0, -2.0], &[true, true, false, false], 0.0);
        assert_eq!((accuracy, balanced, accepted), (0.5, 0.5, 0.5));
        let (accuracy, balanced, _) = rule(&[1.0, 0.5, -1.0], &[true, true, false], 0.0);
        assert_eq!((accuracy, balanced), (1.0, 1.0));
    }

    #[test]
    fn the_best_threshold_separates_what_can_be_separated() {
        let scores = [0.9, 0.8, 0.3, 0.2, 0.1];
        let labels = [true, true, false, false, false];
        let t = best_threshold(&scores, &labels);
        assert!(t > 0.3 && t < 0.8, "{t}");
        assert_eq!(rule(&scores, &labels, t).1, 1.0);
        // Labels the scores order backwards: no threshold does better than keeping everything or nothing.
        let t = best_threshold(&scores, &[false, false, true, true, true]);
        assert_eq!(rule(&scores, &[false, false, true, true, true], t).1, 0.5);
    }
}
