//! What the review probes share: their command line (`[N] [MODEL]`), the decoder, and the first N movie reviews
//! with their derived `is_positive` labels.

use arrow::array::{Array, AsArray, StringArray};
use arrow::datatypes::Int64Type;
use stretto_core::context::default_home;
use stretto_core::datasets::Dataset;
use stretto_kv::decoder::{Decoder, KvPast};
use stretto_kv::tasks::filter_question;

/// A probe's inputs.
pub struct Probe {
    /// Reviews probed.
    pub n: usize,
    /// Catalog model name.
    pub model: String,
    /// Its decoder.
    pub dec: Decoder,
    /// The `reviewtext` column.
    pub text: StringArray,
    /// `is_positive` of the first `n` reviews.
    #[allow(dead_code)] // (Not every probe reads the labels.)
    pub labels: Vec<bool>,
}

/// Reads `[N] [MODEL]` (defaults 240, smollm2-135m) and loads the model and the reviews.
#[allow(dead_code)] // (Not every probe reads the defaults.)
pub fn load() -> Result<Probe, Box<dyn std::error::Error>> {
    load_with(240, "smollm2-135m")
}

/// [`load`] with other defaults.
pub fn load_with(n: usize, model: &str) -> Result<Probe, Box<dyn std::error::Error>> {
    let n: usize = std::env::args().nth(1).and_then(|v| v.parse().ok()).unwrap_or(n);
    let model = std::env::args().nth(2).unwrap_or_else(|| model.into());
    let dec = Decoder::load(&default_home(), &model, 0)?;
    let ds = Dataset::load("movie")?;
    let text = ds.table("reviews")?.column_by_name("reviewtext").ok_or("no reviewtext")?.as_string::<i32>().clone();
    let lab = ds.table("labels")?.column_by_name("is_positive").ok_or("no label")?.as_primitive::<Int64Type>().clone();
    if n > text.len().min(lab.len()) {
        return Err(format!("only {} labelled reviews, not {n}", text.len().min(lab.len())).into());
    }
    let labels: Vec<bool> = (0..n).map(|i| lab.value(i) == 1).collect();
    Ok(Probe { n, model, dec, text, labels })
}

/// The plot filter the batch probes ask.
#[allow(dead_code)] // (Not every probe asks it.)
pub struct PlotFilter {
    /// The pasts of the probe's reviews (prefilled by its decoder, not timed).
    pub pasts: Vec<KvPast>,
    /// The question's tokens after a past.
    pub question: Vec<u32>,
    /// The '1' / '0' answer tokens.
    pub answers: (u32, u32),
}

/// [`PlotFilter`] over the first `probe.n` reviews.
#[allow(dead_code)] // (Not every probe asks it.)
pub fn plot_filter(probe: &Probe) -> Result<PlotFilter, Box<dyn std::error::Error>> {
    let dec = &probe.dec;
    let pasts = (0..probe.n)
        .map(|i| Ok(dec.prefill(&dec.encode(&dec.item_prefix(probe.text.value(i)))?, false)?.0))
        .collect::<Result<_, Box<dyn std::error::Error>>>()?;
    let question =
        dec.encode(&dec.question_suffix(&filter_question("the text above discusses the story or the plot")))?;
    Ok(PlotFilter { pasts, question, answers: (dec.token_id("1")?, dec.token_id("0")?) })
}
