//! How well each sentence encoder's embedding filter separates the true labels of the bundled data
//! (`stretto bench encoders`): the embedding rungs' counterpart of [`crate::protocols`].
//!
//! An embedding filter scores an item by the cosine similarity of its embedding and the predicate's (column
//! references removed: [`stretto::ops_text::embedding::predicate_sentence`]); its thresholds are the optimizer's to
//! choose, so what matters is how well the score *orders* items: the AUC against the labels. The predicates,
//! labels and the fixed development / evaluation split are those of [`crate::protocols`]; the time per item is the
//! encoder's alone (the predicate's embedding is computed once).

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use stretto::core::metrics::auc;
use stretto::kv::embed::{cosine, Embedder};

use crate::experiments::Error;
use crate::protocols::{mean, LabelledTexts, Slice};

/// What to measure.
#[derive(Debug, Clone)]
pub struct EncoderOptions {
    /// Catalog sentence encoders (or registered encoder exports).
    pub encoders: Vec<String>,
    /// Datasets (of [`crate::protocols::TASKS`]).
    pub datasets: Vec<String>,
    /// Rows of each development slice.
    pub dev: usize,
    /// Rows of each evaluation slice.
    pub eval: usize,
    /// Texts per encoder batch.
    pub batch: usize,
}

/// One measured (encoder, predicate, slice).
#[derive(Debug, Clone, serde::Serialize)]
pub struct EncoderRow {
    /// Encoder.
    pub encoder: String,
    /// Dataset.
    pub dataset: String,
    /// The predicate.
    pub predicate: String,
    /// Its label column.
    pub label: String,
    /// `dev` or `eval`.
    pub slice: String,
    /// Items scored.
    pub n: usize,
    /// Of which labelled true.
    pub positives: usize,
    /// AUC of the cosine scores against the labels; `None` when the slice holds only one class (the last 100
    /// emails have no positive).
    pub auc: Option<f64>,
    /// Milliseconds per item to embed the slice (one run, a cold encoder cache).
    pub ms_per_item: f64,
}

/// Embeds every slice once per encoder and scores every predicate of its dataset against the labels.
pub fn measure(home: &Path, threads: usize, o: &EncoderOptions) -> Result<Vec<EncoderRow>, Error> {
    let mut rows = Vec::new();
    for name in &o.encoders {
        let _span = tracing::info_span!("encoder_probe", encoder = %name).entered();
        let enc = Embedder::load(home, name, stretto::kv::runtime::RuntimeOptions::new(threads, false))?;
        for dataset in &o.datasets {
            let data = LabelledTexts::load(dataset)?;
            let sentences: Vec<String> =
                data.tasks.iter().map(|t| stretto::ops_text::embedding::predicate_sentence(t.predicate)).collect();
            let predicates = enc.embed(&sentences.iter().map(String::as_str).collect::<Vec<_>>(), o.batch)?;
            for slice in [Slice::Dev, Slice::Eval] {
                let range = data.rows(slice, o.dev, o.eval);
                let items = data.texts(range.clone(), 0);
                let start = Instant::now();
                let vecs = enc.embed(&items.iter().map(String::as_str).collect::<Vec<_>>(), o.batch)?;
                let ms = start.elapsed().as_secs_f64() * 1e3 / items.len().max(1) as f64;
                for (t, p) in data.tasks.iter().zip(&predicates) {
                    let truth = data.truth(t, range.clone())?;
                    let scores: Vec<f64> = vecs.iter().map(|v| cosine(v, p) as f64).collect();
                    let positives = truth.iter().filter(|&&y| y).count();
                    rows.push(EncoderRow {
                        encoder: name.clone(),
                        dataset: dataset.clone(),
                        predicate: t.predicate.into(),
                        label: t.label.into(),
                        slice: slice.name().into(),
                        n: scores.len(),
                        positives,
                        auc: (positives > 0 && positives < truth.len()).then(|| auc(&scores, &truth)),
                        ms_per_item: ms,
                    });
                }
            }
        }
    }
    Ok(rows)
}

/// A figure to three places, `n/a` where there is none (NaN: no row, or only one class).
fn figure(x: f64) -> String {
    if x.is_nan() {
        "n/a".into()
    } else {
        format!("{x:.3}")
    }
}

/// The markdown report: mean AUC per encoder and slice, then every predicate.
pub fn markdown(rows: &[EncoderRow], o: &EncoderOptions) -> String {
    let mut s = String::from("# Embedding rungs against the human labels\n\n");
    let _ = writeln!(
        s,
        "Written by `stretto bench encoders --encoders {} --datasets {} --dev {} --eval {}`. The embedding filter's \
         score (cosine of the item's and the predicate's embeddings) ranked against the labels: AUC (n/a where a \
         slice holds one class only), on the fixed split of `stretto bench protocols` (development: the last {} rows of each table; evaluation: the first {}). \
         Time: ms per item to embed, one run, batches of {}.\n",
        o.encoders.join(","),
        o.datasets.join(","),
        o.dev,
        o.eval,
        o.dev,
        o.eval,
        o.batch
    );
    s.push_str("| encoder | dataset | dev mean AUC | eval mean AUC | eval ms per item |\n|---|---|---|---|---|\n");
    for e in &o.encoders {
        for d in &o.datasets {
            let of = |slice: &'static str| {
                rows.iter().filter(move |r| &r.encoder == e && &r.dataset == d && r.slice == slice)
            };
            let _ = writeln!(
                s,
                "| {e} | {d} | {} | {} | {:.1} |",
                figure(mean(of("dev").filter_map(|r| r.auc))),
                figure(mean(of("eval").filter_map(|r| r.auc))),
                mean(of("eval").map(|r| r.ms_per_item)),
            );
        }
    }
    s.push_str("\n## Every predicate\n\n| encoder | predicate | label | slice | n (positive) | AUC |\n|---|---|---|---|---|---|\n");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} ({}) | {} |",
            r.encoder,
            r.predicate,
            r.label,
            r.slice,
            r.n,
            r.positives,
            figure(r.auc.unwrap_or(f64::NAN))
        );
    }
    s
}
