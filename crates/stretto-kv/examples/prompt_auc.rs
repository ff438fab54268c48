//! AUC of the LLM filter question "is clearly positive" against the derived review labels, for one model:
//! `cargo run --release -p stretto-kv --example prompt_auc -- [N] [MODEL]` (defaults 240, smollm2-135m).

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use stretto_core::datasets::Dataset;
use stretto_kv::decoder::{Decoder, Step, Want};
use stretto_kv::models::default_home;
use stretto_kv::tasks::filter_question;

fn auc(scores: &[f32], labels: &[bool]) -> f64 {
    stretto_core::metrics::auc(&scores.iter().map(|&s| s as f64).collect::<Vec<_>>(), labels)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args().nth(1).and_then(|v| v.parse().ok()).unwrap_or(240);
    let model = std::env::args().nth(2).unwrap_or_else(|| "smollm2-135m".into());
    let dec = Decoder::load(&default_home(), &model, 0)?;
    let ds = Dataset::load("movie")?;
    let text = ds.table("reviews")?.column_by_name("reviewtext").ok_or("no reviewtext")?.as_string::<i32>().clone();
    let lab = ds.table("labels")?.column_by_name("is_positive").ok_or("no label")?.as_primitive::<Int64Type>().clone();
    let labels: Vec<bool> = (0..n).map(|i| lab.value(i) == 1).collect();
    let (yes, no) = (dec.token_id("1")?, dec.token_id("0")?);
    let q = dec.encode(&dec.question_suffix(&filter_question("the text above is clearly positive")))?;
    let mut scores = Vec::with_capacity(n);
    for i in 0..n {
        let (past, _) = dec.prefill(&dec.encode(&dec.item_prefix(text.value(i)))?, false)?;
        let o = dec.run(&[Step { past: Some(&past), tokens: &q }], Want::default())?;
        scores.push(o[0].logits[yes as usize] - o[0].logits[no as usize]);
    }
    println!("{model}: AUC {:.3} on {n} reviews", auc(&scores, &labels));
    Ok(())
}
