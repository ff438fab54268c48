//! Which answer protocol each decoder's filters use, chosen by measurement against the human labels of the bundled
//! data (`stretto bench protocols`).
//!
//! Every catalog decoder has a filter protocol ([`FilterProtocol`]): the answer words ('1'/'0', Yes/No, or the
//! contrast question against an opposite the model derives) and whether its scores are calibrated by a content-free
//! item. This module measures each protocol the way the filter operator asks it (the same question tokens, answer
//! tokens and calibration, and the same Yes/No fallback for a predicate without a derivable opposite:
//! [`stretto::kv::tasks::protocol_prompt`]),
//! on labelled predicates of three datasets (and, as `photos`, on the captions the caption bridge writes of the
//! e-commerce photos, against their derived labels: what the caption filters read), and picks per model:
//! - the answer words with the highest mean AUC on the **development slice**;
//! - then calibrated or not, by the higher mean balanced accuracy at the operator's own decision rule (score > 0).
//!
//! **The split is fixed**: the development slice is the *last* `dev` rows of each table, the evaluation slice its
//! *first* `eval` rows. The bench's small scale, the demo and the tests read the first rows of a table, so no figure
//! reported elsewhere at those scales is computed on the rows that chose the protocol (a run over a whole table, the
//! paper scale, does include them). The choice is written into the catalog by hand
//! ([`stretto::models::models::FilterSetting`]), with the figures that chose it.

use std::fmt::Write as _;

use arrow::array::{Array, AsArray};
use arrow::datatypes::Int64Type;
use stretto::core::datasets::Dataset;
use stretto::core::metrics::auc;
use stretto::kv::decoder::{Step, Want};
use stretto::kv::models::{AnswerWords, FilterProtocol};
use stretto::kv::Decoder;
use stretto::OpContext;

/// The dataset name under which `--datasets` measures the caption filters: the e-commerce products that have a
/// photo, each read as its caption ([`LabelledTexts::photo_captions`]).
pub const PHOTOS: &str = "photos";

/// A labelled filter predicate of a bundled dataset.
#[derive(Debug, Clone, Copy)]
pub struct ProbeTask {
    /// Dataset.
    pub dataset: &'static str,
    /// Table of the items.
    pub table: &'static str,
    /// Text column of the items.
    pub column: &'static str,
    /// The predicate as a query writes it.
    pub predicate: &'static str,
    /// Column of the dataset's `labels` table (0/1, one per item row) that is the predicate's truth.
    pub label: &'static str,
}

const fn task(
    dataset: &'static str,
    table: &'static str,
    column: &'static str,
    predicate: &'static str,
    label: &'static str,
) -> ProbeTask {
    ProbeTask { dataset, table, column, predicate, label }
}

/// The labelled predicates: the derived movie sentiment, the e-commerce labels from the product description, and
/// the Enron evaluation labels (`mentions_entity` is a literal mention of the four schemes: 76 of its 79 positives).
pub const TASKS: &[ProbeTask] = &[
    task("movie", "reviews", "reviewtext", "{reviews.reviewtext} is clearly positive", "is_positive"),
    task("movie", "reviews", "reviewtext", "{reviews.reviewtext} is clearly negative", "is_negative"),
    task(
        "ecommerce",
        "products",
        "description",
        "{products.description} describes a t-shirt or a top",
        "is_tshirt_or_top",
    ),
    task("ecommerce", "products", "description", "{products.description} describes an item for men", "is_menswear"),
    task(
        "ecommerce",
        "products",
        "description",
        "{products.description} describes an item designed to carry or hold objects",
        "carries_objects",
    ),
    task("ecommerce", "products", "description", "{products.description} describes footwear", "is_footwear"),
    task(
        "email",
        "emails",
        "text",
        "{emails.text} mentions 'Raptor', 'Deathstar', 'Chewco' or 'Fat Boy'",
        "mentions_entity",
    ),
    task(
        "email",
        "emails",
        "text",
        "{emails.text} refers to a fraudulent scheme (i.e., 'Raptor', 'Deathstar', 'Chewco', and/or 'Fat Boy')",
        "fraudulent",
    ),
];

/// Which rows of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slice {
    /// The last rows: chooses the protocol.
    Dev,
    /// The first rows: reports it.
    Eval,
}

impl Slice {
    /// `dev` or `eval`.
    pub fn name(self) -> &'static str {
        match self {
            Slice::Dev => "dev",
            Slice::Eval => "eval",
        }
    }

    /// Row indices of this slice of a table of `total` rows (`n` rows; the slices never overlap).
    pub fn rows(self, total: usize, n: usize, other: usize) -> std::ops::Range<usize> {
        let n = n.min(total.saturating_sub(other.min(total)));
        match self {
            Slice::Dev => total - n..total,
            Slice::Eval => 0..n,
        }
    }
}

/// One measured (model, protocol, predicate, slice).
#[derive(Debug, Clone)]
pub struct ProtocolRow {
    /// Decoder.
    pub model: String,
    /// Protocol.
    pub protocol: FilterProtocol,
    /// The question as the model was asked it (a contrast protocol's derived question, or the Yes/No question it
    /// fell back to).
    pub question: String,
    /// The predicate.
    pub task: ProbeTask,
    /// Slice.
    pub slice: Slice,
    /// Items scored.
    pub n: usize,
    /// Of which labelled true.
    pub positives: usize,
    /// AUC of the scores against the labels.
    pub auc: f64,
    /// Share of items accepted by the operator's rule (score > 0).
    pub accepted: f64,
    /// Accuracy of that rule against the labels.
    pub accuracy: f64,
    /// Its balanced accuracy (mean of the true-positive and true-negative rates).
    pub balanced: f64,
}

impl ProtocolRow {
    /// Whether the row's slice held both classes of its label: only then do its AUC and balanced accuracy mean
    /// anything, and only such rows choose a protocol or enter a mean.
    pub fn ranks(&self) -> bool {
        both_classes(self.positives, self.n)
    }
}

/// A model's chosen protocol and the development figures that chose it.
#[derive(Debug, Clone)]
pub struct Choice {
    /// Decoder.
    pub model: String,
    /// Chosen protocol.
    pub protocol: FilterProtocol,
    /// Mean development AUC of its answer words.
    pub dev_auc: f64,
    /// Mean development balanced accuracy of it.
    pub dev_balanced: f64,
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    /// Decoders.
    pub models: Vec<String>,
    /// Datasets (of [`TASKS`]).
    pub datasets: Vec<String>,
    /// Rows of each development slice.
    pub dev: usize,
    /// Rows of each evaluation slice.
    pub eval: usize,
    /// Characters of an item kept (long emails are cut here, the same for every protocol; 0 keeps all).
    pub max_chars: usize,
    /// Answer words measured (empty: all three); each is measured calibrated and raw. Fewer words ask fewer
    /// questions of every item: the 1.5B's question passes are most of its run.
    pub answers: Vec<AnswerWords>,
}

/// Every filter's answer words, in the order the bench measures and reports them.
const ANSWER_WORDS: [AnswerWords; 3] = [AnswerWords::Digits, AnswerWords::YesNo, AnswerWords::Contrast];

impl ProbeOptions {
    /// The answer words to measure, in [`ANSWER_WORDS`]' order.
    fn answer_words(&self) -> Vec<AnswerWords> {
        ANSWER_WORDS.into_iter().filter(|w| self.answers.is_empty() || self.answers.contains(w)).collect()
    }
}

/// Raw (uncalibrated) log-odds of every item of `items` for every (task, answer words), and of the content-free item.
struct Scored {
    raw: Vec<Vec<f64>>,
    base: Vec<f64>,
}

fn score(
    dec: &Decoder,
    label: &str,
    items: &[String],
    prompts: &[stretto::kv::tasks::FilterPrompt],
) -> Result<Scored, crate::experiments::Error> {
    let mut raw = vec![Vec::with_capacity(items.len()); prompts.len()];
    let one = |text: &str, out: &mut dyn FnMut(usize, f64)| -> Result<(), crate::experiments::Error> {
        let (past, _) = dec.prefill(&dec.encode_item(&dec.item_prefix(text))?, false)?;
        for (k, p) in prompts.iter().enumerate() {
            let o = dec.run(&[Step { past: Some(&past), tokens: &p.tokens }], Want::default())?;
            let row = o.first().ok_or("empty decoder output")?;
            out(k, (row.logits[p.answers.0 as usize] - row.logits[p.answers.1 as usize]) as f64);
        }
        Ok(())
    };
    let mut base = vec![0.0; prompts.len()];
    one(stretto::ops_text::llm::CONTENT_FREE, &mut |k, s| base[k] = s)?;
    // A terminal sees every item; a log (no terminal) a line every 25.
    let bar = stretto::models::progress::bar(items.len() as u64, label);
    for (i, item) in items.iter().enumerate() {
        one(item, &mut |k, s| raw[k].push(s))?;
        bar.inc(1);
        if (i + 1) % 25 == 0 {
            tracing::info!(model = dec.name(), done = i + 1, of = items.len(), "protocol probe");
        }
    }
    bar.finish_and_clear();
    Ok(Scored { raw, base })
}

/// Whether `positives` of `n` labels hold both classes (without both, AUC is undefined and balanced accuracy says
/// nothing).
fn both_classes(positives: usize, n: usize) -> bool {
    positives > 0 && positives < n
}

fn rule_figures(scores: &[f64], labels: &[bool]) -> (f64, f64, f64) {
    let (accuracy, balanced, accepted) = crate::photos::rule(scores, labels, 0.0);
    (accepted, accuracy, balanced)
}

/// Measures every protocol of every model on the development and evaluation slices. `measured` is handed the rows
/// so far after each model, so that a long run (the 1.5B over the emails takes hours on 2 cores) keeps what it
/// measured when a later model fails or the run is stopped.
pub fn measure(
    ctx: &OpContext,
    o: &ProbeOptions,
    mut measured: impl FnMut(&[ProtocolRow]) -> Result<(), crate::experiments::Error>,
) -> Result<Vec<ProtocolRow>, crate::experiments::Error> {
    let mut rows = Vec::new();
    // Each dataset's items once (the photos' captions need the image classifier), before any model is loaded.
    let data: Vec<LabelledTexts> = o
        .datasets
        .iter()
        .map(|d| if d == PHOTOS { LabelledTexts::photo_captions(ctx) } else { LabelledTexts::load(d) })
        .collect::<Result<_, _>>()?;
    for model in &o.models {
        let _span = tracing::info_span!("protocol_probe", model = %model).entered();
        let options = stretto::kv::runtime::RuntimeOptions::new(ctx.threads, false);
        let dec = Decoder::load(&ctx.model_home, model, options)?;
        for (dataset, data) in o.datasets.iter().zip(&data) {
            let tasks = &data.tasks;
            let answer_words = o.answer_words();
            let mut prompts = Vec::new();
            for t in tasks {
                let statement = stretto::ops_text::llm::about(t.predicate, data.subject);
                for &words in &answer_words {
                    // As the filter asks: a contrast question where the model derives an opposite, Yes/No where not.
                    let p = FilterProtocol { answers: words, calibrated: true };
                    let (prompt, _) = stretto::kv::tasks::protocol_prompt(&dec, p, data.subject, &statement)?;
                    prompts.push(prompt);
                }
            }
            for slice in [Slice::Dev, Slice::Eval] {
                let range = data.rows(slice, o.dev, o.eval);
                let truths: Vec<Vec<bool>> =
                    tasks.iter().map(|t| data.truth(t, range.clone())).collect::<Result<_, _>>()?;
                // A slice where every predicate's labels are one class ranks nothing (the bundled emails' positives
                // are all among the first rows, so their development slice holds none): not worth the model's time.
                if !truths.iter().any(|y| both_classes(y.iter().filter(|&&y| y).count(), y.len())) {
                    tracing::warn!(
                        model = %model,
                        dataset = %dataset,
                        slice = slice.name(),
                        rows = range.len(),
                        "no labelled predicate has both classes in this slice: not scored"
                    );
                    continue;
                }
                let items = data.texts(range.clone(), o.max_chars);
                let label = format!("{model} on {dataset} ({})", slice.name());
                let scored = score(&dec, &label, &items, &prompts)?;
                for ((ti, t), truth) in tasks.iter().enumerate().zip(truths) {
                    for (wi, words) in answer_words.iter().enumerate() {
                        let question = prompts[ti * answer_words.len() + wi].text.replace('\n', " ");
                        let raw = &scored.raw[ti * answer_words.len() + wi];
                        let base = scored.base[ti * answer_words.len() + wi];
                        for calibrated in [true, false] {
                            let s: Vec<f64> = raw.iter().map(|r| if calibrated { r - base } else { *r }).collect();
                            let (accepted, accuracy, balanced) = rule_figures(&s, &truth);
                            rows.push(ProtocolRow {
                                model: model.clone(),
                                protocol: FilterProtocol { answers: *words, calibrated },
                                question: question.clone(),
                                task: *t,
                                slice,
                                n: s.len(),
                                positives: truth.iter().filter(|&&y| y).count(),
                                auc: auc(&s, &truth),
                                accepted,
                                accuracy,
                                balanced,
                            });
                        }
                    }
                }
            }
        }
        measured(&rows)?;
    }
    Ok(rows)
}

/// A dataset's labelled predicates (of [`TASKS`]), the text column they read and its `labels` table: what both
/// the protocols and the encoders bench score against.
pub(crate) struct LabelledTexts {
    /// The dataset's predicates.
    pub(crate) tasks: Vec<ProbeTask>,
    /// What a column reference becomes in a question: "the text above", or the caption bridge's subject.
    pub(crate) subject: &'static str,
    text: arrow::array::StringArray,
    labels: arrow::record_batch::RecordBatch,
}

impl LabelledTexts {
    /// Loads the bundled `dataset`; an error when it has no labelled predicates or its text column is missing.
    pub(crate) fn load(dataset: &str) -> Result<Self, crate::experiments::Error> {
        let tasks: Vec<ProbeTask> = TASKS.iter().filter(|t| t.dataset == dataset).copied().collect();
        let first = tasks.first().ok_or_else(|| format!("no labelled predicates for dataset `{dataset}`"))?;
        let ds = Dataset::load(dataset)?;
        let table = ds.table(first.table)?;
        let text = table
            .column_by_name(first.column)
            .and_then(|c| c.as_string_opt::<i32>())
            .ok_or_else(|| format!("{dataset}.{} has no text column `{}`", first.table, first.column))?
            .clone();
        Ok(Self { text, labels: ds.table("labels")?.clone(), tasks, subject: stretto::kv::tasks::TEXT_SUBJECT })
    }

    /// The e-commerce products that have a bundled photo, each item its caption as the caption bridge writes it
    /// (EfficientNet-Lite0's classes, loaded under `ctx`), with the photo predicates of [`crate::photos::PHOTO_TASKS`]
    /// and their derived labels: the caption filters' items, so that their protocols are measured on what they read.
    pub(crate) fn photo_captions(ctx: &OpContext) -> Result<Self, crate::experiments::Error> {
        let ds = Dataset::load("ecommerce")?;
        let (rows, paths) = crate::photos::photo_rows(&ds)?;
        let paths: Vec<String> = paths.iter().map(|p| p.unwrap_or_default().to_string()).collect();
        let (captions, _) = stretto::ops_image::caption::captions(ctx, &paths)?;
        let at = arrow::array::UInt32Array::from(rows.iter().map(|&i| i as u32).collect::<Vec<_>>());
        let labels = arrow::compute::take_record_batch(ds.table("labels")?, &at)?;
        let tasks = crate::photos::PHOTO_TASKS
            .iter()
            .map(|(predicate, label)| task(PHOTOS, "products", "photo", predicate, label))
            .collect();
        let subject = stretto::ops_image::caption::CAPTION_SUBJECT;
        Ok(Self { text: captions.into_iter().map(Some).collect(), labels, tasks, subject })
    }

    /// Row indices of `slice`, with development and evaluation slices of `dev` and `eval` rows.
    pub(crate) fn rows(&self, slice: Slice, dev: usize, eval: usize) -> std::ops::Range<usize> {
        let (n, other) = if slice == Slice::Dev { (dev, eval) } else { (eval, dev) };
        slice.rows(self.text.len(), n, other)
    }

    /// The texts of rows `range` (null as empty), each cut to `max_chars` characters (0 keeps all).
    pub(crate) fn texts(&self, range: std::ops::Range<usize>, max_chars: usize) -> Vec<String> {
        range
            .map(|i| {
                let t = if self.text.is_null(i) { "" } else { self.text.value(i) };
                if max_chars > 0 {
                    t.chars().take(max_chars).collect()
                } else {
                    t.to_string()
                }
            })
            .collect()
    }

    /// The truth of `task` for rows `range`.
    pub(crate) fn truth(
        &self,
        task: &ProbeTask,
        range: std::ops::Range<usize>,
    ) -> Result<Vec<bool>, crate::experiments::Error> {
        let col = self
            .labels
            .column_by_name(task.label)
            .ok_or_else(|| format!("the labels table has no column `{}`", task.label))?
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| format!("label column `{}` is not an integer column", task.label))?;
        Ok(range.map(|i| col.value(i) == 1).collect())
    }
}

pub(crate) fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        f64::NAN
    } else {
        s / n as f64
    }
}

/// The protocol each model's development figures choose: answer words by mean AUC, then calibration by mean
/// balanced accuracy, over the development rows whose slice held both classes. A model with no such row (say, only
/// email was measured) gets no choice.
pub fn choose(rows: &[ProtocolRow]) -> Vec<Choice> {
    let mut models: Vec<&str> = rows.iter().map(|r| r.model.as_str()).collect();
    models.dedup();
    fn dev_rows<'a>(rows: &'a [ProtocolRow], m: &'a str) -> impl Iterator<Item = &'a ProtocolRow> + 'a {
        rows.iter().filter(move |r| r.model == m && r.slice == Slice::Dev && r.ranks())
    }
    let dev = |m: &str, p: FilterProtocol, f: &dyn Fn(&ProtocolRow) -> f64| {
        mean(dev_rows(rows, m).filter(|r| r.protocol == p).map(f))
    };
    models
        .into_iter()
        .filter(|m| dev_rows(rows, m).next().is_some())
        .map(|m| {
            let best = |candidates: Vec<FilterProtocol>, f: &dyn Fn(&ProtocolRow) -> f64| {
                candidates
                    .into_iter()
                    .map(|p| (p, dev(m, p, f)))
                    .max_by(|a, b| a.1.total_cmp(&b.1))
                    .expect("candidates")
            };
            let (words, dev_auc) = best(
                ANSWER_WORDS
                    .into_iter()
                    .map(|answers| FilterProtocol { answers, calibrated: true })
                    .filter(|&p| dev_rows(rows, m).any(|r| r.protocol == p))
                    .collect(),
                &|r| r.auc,
            );
            let (protocol, dev_balanced) =
                best(vec![words, FilterProtocol { calibrated: false, ..words }], &|r| r.balanced);
            Choice { model: m.to_string(), protocol, dev_auc, dev_balanced }
        })
        .collect()
}

/// The CSV of `rows`; AUC and balanced accuracy are empty where the row's slice held one class of its label.
pub fn csv(rows: &[ProtocolRow]) -> String {
    let defined = |r: &ProtocolRow, v: f64| if r.ranks() { format!("{v:.4}") } else { String::new() };
    let mut s = String::from(
        "model,protocol,dataset,predicate,label,slice,n,positives,auc,accepted,accuracy,balanced_accuracy\n",
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{},{},{},\"{}\",{},{},{},{},{},{:.4},{:.4},{}",
            r.model,
            r.protocol,
            r.task.dataset,
            r.task.predicate.replace('"', "\"\""),
            r.task.label,
            r.slice.name(),
            r.n,
            r.positives,
            defined(r, r.auc),
            r.accepted,
            r.accuracy,
            defined(r, r.balanced)
        );
    }
    s
}

/// The markdown report: the choice per model, then every predicate's figures under it on both slices.
pub fn markdown(rows: &[ProtocolRow], choices: &[Choice], o: &ProbeOptions) -> String {
    let mut s = String::from("# Filter protocols per model, against the human labels\n\n");
    let _ = writeln!(
        s,
        "Written by `stretto bench protocols --models {} --datasets {} --dev {} --eval {}{}{}`. Development slice: \
         the last {} rows of each table (chooses); evaluation slice: the first {} rows (reports). Answer words by \
         mean development AUC, then calibration by mean development balanced accuracy at the operator's rule \
         (score > 0).\n",
        o.models.join(","),
        o.datasets.join(","),
        o.dev,
        o.eval,
        if o.max_chars > 0 { format!(" --max-chars {}", o.max_chars) } else { String::new() },
        if o.answers.is_empty() {
            String::new()
        } else {
            let words: Vec<&str> =
                o.answer_words().iter().map(|&w| FilterProtocol { answers: w, calibrated: true }.name()).collect();
            format!(" --answers {}", words.join(","))
        },
        o.dev,
        o.eval
    );
    s.push_str("| model | chosen | dev mean AUC | dev mean balanced accuracy | eval mean AUC | eval mean balanced accuracy |\n|---|---|---|---|---|---|\n");
    for c in choices {
        let eval = |f: &dyn Fn(&ProtocolRow) -> f64| {
            mean(
                rows.iter()
                    .filter(|r| r.model == c.model && r.slice == Slice::Eval && r.protocol == c.protocol && r.ranks())
                    .map(f),
            )
        };
        let _ = writeln!(
            s,
            "| {} | `{}` | {:.3} | {:.3} | {:.3} | {:.3} |",
            c.model,
            c.protocol,
            c.dev_auc,
            c.dev_balanced,
            eval(&|r| r.auc),
            eval(&|r| r.balanced)
        );
    }
    let mut models: Vec<&str> = rows.iter().map(|r| r.model.as_str()).collect();
    models.dedup();
    for m in models.iter().filter(|m| !choices.iter().any(|c| c.model == **m)) {
        let _ = writeln!(s, "| {m} | – (no development slice held both classes of a label) | – | – | – | – |");
    }
    s.push_str(
        "\n## Evaluation slice, per model and protocol\n\nMeans over the predicates whose evaluation slice holds both \
         classes of their label.\n\n| model | protocol | predicates | eval mean AUC | eval mean accuracy | eval mean \
         balanced accuracy |\n|---|---|---|---|---|---|\n",
    );
    let mut seen = std::collections::HashSet::new();
    for r in rows.iter().filter(|r| r.slice == Slice::Eval && r.ranks()) {
        if !seen.insert((r.model.as_str(), r.protocol)) {
            continue;
        }
        let of = || {
            rows.iter()
                .filter(|x| x.model == r.model && x.protocol == r.protocol && x.slice == Slice::Eval && x.ranks())
        };
        let _ = writeln!(
            s,
            "| {} | `{}` | {} | {:.3} | {:.3} | {:.3} |",
            r.model,
            r.protocol,
            of().count(),
            mean(of().map(|x| x.auc)),
            mean(of().map(|x| x.accuracy)),
            mean(of().map(|x| x.balanced))
        );
    }
    s.push_str("\n## Contrast questions\n\nThe question each model derived for each predicate (a predicate without a usable opposite is asked with Yes/No).\n\n| model | predicate | question |\n|---|---|---|\n");
    let mut seen = std::collections::HashSet::new();
    for r in rows.iter().filter(|r| r.protocol.answers == AnswerWords::Contrast) {
        if seen.insert((r.model.as_str(), r.task.predicate)) {
            let _ = writeln!(s, "| {} | {} | {} |", r.model, r.task.predicate, r.question.replace('|', "/"));
        }
    }
    s.push_str("\n## Every protocol, every predicate\n\n| model | protocol | predicate | label | slice | n (positive) | AUC | accepted | accuracy | balanced |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | `{}` | {} | {} | {} | {} ({}) | {} | {:.3} | {:.3} | {} |",
            r.model,
            r.protocol,
            r.task.predicate,
            r.task.label,
            r.slice.name(),
            r.n,
            r.positives,
            if r.ranks() { format!("{:.3}", r.auc) } else { "n/a".into() },
            r.accepted,
            r.accuracy,
            if r.ranks() { format!("{:.3}", r.balanced) } else { "n/a".into() }
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_select_the_words_measured_in_a_fixed_order() {
        let o = |answers: Vec<AnswerWords>| ProbeOptions {
            models: Vec::new(),
            datasets: Vec::new(),
            dev: 1,
            eval: 1,
            max_chars: 0,
            answers,
        };
        assert_eq!(o(Vec::new()).answer_words(), [AnswerWords::Digits, AnswerWords::YesNo, AnswerWords::Contrast]);
        assert_eq!(o(vec![AnswerWords::Contrast]).answer_words(), [AnswerWords::Contrast]);
        assert_eq!(
            o(vec![AnswerWords::Contrast, AnswerWords::Digits]).answer_words(),
            [AnswerWords::Digits, AnswerWords::Contrast]
        );
    }

    #[test]
    fn slices_never_overlap() {
        assert_eq!(Slice::Dev.rows(1000, 200, 200), 800..1000);
        assert_eq!(Slice::Eval.rows(1000, 200, 200), 0..200);
        // Asking for more than the table holds shrinks the slice rather than overlap the other.
        assert_eq!(Slice::Dev.rows(100, 80, 40), 40..100);
        assert_eq!(Slice::Eval.rows(100, 80, 40), 0..60);
    }

    #[test]
    fn the_rule_figures_count_right() {
        let (accepted, accuracy, balanced) = rule_figures(&[1.0, -1.0, 2.0, -3.0], &[true, true, false, false]);
        assert_eq!(accepted, 0.5);
        assert_eq!(accuracy, 0.5);
        assert_eq!(balanced, 0.5);
        let (_, accuracy, balanced) = rule_figures(&[-1.0, -1.0, -1.0, 1.0], &[false, false, false, true]);
        assert_eq!((accuracy, balanced), (1.0, 1.0));
    }

    fn row(model: &str, protocol: FilterProtocol, slice: Slice, auc: f64, balanced: f64) -> ProtocolRow {
        ProtocolRow {
            model: model.into(),
            protocol,
            question: String::new(),
            task: TASKS[0],
            slice,
            n: 10,
            positives: 5,
            auc,
            accepted: 0.5,
            accuracy: balanced,
            balanced,
        }
    }

    #[test]
    fn choice_reads_only_the_development_slice() {
        let p = |name: &str| FilterProtocol::parse(name).unwrap();
        let rows = vec![
            row("m", p("digits"), Slice::Dev, 0.7, 0.6),
            row("m", p("digits-raw"), Slice::Dev, 0.7, 0.5),
            row("m", p("yes-no"), Slice::Dev, 0.8, 0.55),
            row("m", p("yes-no-raw"), Slice::Dev, 0.8, 0.65),
            // The evaluation slice would choose otherwise: it must not be read.
            row("m", p("digits"), Slice::Eval, 0.99, 0.99),
        ];
        let c = choose(&rows);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].protocol, p("yes-no-raw"));
        assert!((c[0].dev_auc - 0.8).abs() < 1e-12 && (c[0].dev_balanced - 0.65).abs() < 1e-12);
        // A measured contrast question competes like the other answer words.
        let mut with_contrast = rows.clone();
        with_contrast.push(row("m", p("contrast"), Slice::Dev, 0.85, 0.7));
        with_contrast.push(row("m", p("contrast-raw"), Slice::Dev, 0.85, 0.6));
        assert_eq!(choose(&with_contrast)[0].protocol, p("contrast"));
    }

    #[test]
    fn slices_with_one_class_neither_choose_nor_count() {
        let p = |name: &str| FilterProtocol::parse(name).unwrap();
        let one_class = |protocol| ProtocolRow { positives: 0, ..row("m", protocol, Slice::Dev, 0.5, 1.0) };
        let rows = vec![
            row("m", p("digits"), Slice::Dev, 0.7, 0.6),
            row("m", p("digits-raw"), Slice::Dev, 0.7, 0.5),
            row("m", p("yes-no"), Slice::Dev, 0.8, 0.55),
            row("m", p("yes-no-raw"), Slice::Dev, 0.8, 0.65),
            // An email slice without positives: its AUC of 0.5 is made up (`auc` of one class), and its balanced
            // accuracy of 1.0 is the empty true-positive rate's; both would have entered the means.
            one_class(p("yes-no")),
            one_class(p("yes-no")),
        ];
        let c = choose(&rows);
        assert_eq!(c[0].protocol, p("yes-no-raw"));
        assert!((c[0].dev_auc - 0.8).abs() < 1e-12);
        // A model measured only on such slices gets no choice, and its rows print n/a.
        let only = vec![ProtocolRow { model: "e".into(), ..one_class(p("yes-no")) }];
        assert!(choose(&only).is_empty());
        let o = ProbeOptions {
            models: vec!["e".into()],
            datasets: vec!["email".into()],
            dev: 10,
            eval: 0,
            max_chars: 0,
            answers: Vec::new(),
        };
        let md = markdown(&only, &[], &o);
        assert!(md.contains("| e | – (no development slice held both classes of a label)"), "{md}");
        assert!(md.contains("| 10 (0) | n/a | 0.500 | 1.000 | n/a |"), "{md}");
        assert!(!md.contains("NaN"), "{md}");
        assert!(csv(&only).ends_with(",dev,10,0,,0.5000,1.0000,\n"), "{}", csv(&only));
        assert!(md.contains("--eval 0`"), "all answer words measured: no --answers in the command: {md}");
        // A subset of the answer words is part of the command that reproduces the file.
        let o = ProbeOptions { answers: vec![AnswerWords::Contrast], ..o };
        let md = markdown(&only, &[], &o);
        assert!(md.contains("--eval 0 --answers contrast`"), "{md}");
    }
}
