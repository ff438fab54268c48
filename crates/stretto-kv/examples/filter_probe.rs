//! How a model's filter log-odds behave on movie reviews, for several predicates: AUC against the derived
//! `is_positive` label, and the share of reviews accepted with raw and with content-free-calibrated log-odds.
//!
//! `cargo run --release -p stretto-kv --example filter_probe -- [N] [MODEL] [yes-no]` (defaults 240,
//! smollm2-135m; `yes-no` scores "Yes" over "No" instead of "1" over "0").

#[path = "common/reviews.rs"]
mod reviews;

use stretto_kv::decoder::{Step, Want};
use stretto_kv::tasks::filter_question;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let reviews::Probe { n, model, dec, text, labels } = reviews::load()?;
    let yn = std::env::args().nth(3).is_some_and(|a| a == "yes-no");
    let (yes, no) =
        if yn { (dec.token_id("Yes")?, dec.token_id("No")?) } else { (dec.token_id("1")?, dec.token_id("0")?) };
    let preds = [
        "the text above is clearly positive",
        "the text above is clearly negative",
        "the text above mentions terrible dialogue",
        "the text above is a scathing review",
    ];
    let pasts: Vec<_> =
        (0..n).map(|i| dec.prefill(&dec.encode(&dec.item_prefix(text.value(i))).unwrap(), false).unwrap().0).collect();
    let (na, _) = dec.prefill(&dec.encode(&dec.item_prefix("N/A"))?, false)?;
    for v in preds {
        let qtext = if yn {
            format!("Answer the question about the text above with Yes or No.\nQuestion: is it true that {v}?")
        } else {
            filter_question(v)
        };
        let q = dec.encode(&dec.question_suffix(&qtext))?;
        let mut scores = Vec::with_capacity(n);
        for p in &pasts {
            let o = dec.run(&[Step { past: Some(p), tokens: &q }], Want::default())?;
            scores.push((o[0].logits[yes as usize] - o[0].logits[no as usize]) as f64);
        }
        let o = dec.run(&[Step { past: Some(&na), tokens: &q }], Want::default())?;
        let base = (o[0].logits[yes as usize] - o[0].logits[no as usize]) as f64;
        let raw = scores.iter().filter(|s| **s > 0.0).count() as f64 / n as f64;
        let cal = scores.iter().filter(|s| **s > base).count() as f64 / n as f64;
        println!(
            "{model} `{v}`: AUC vs is_positive {:.3}, accepted raw {raw:.2}, calibrated {cal:.2} (content-free log-odds {base:.2})",
            stretto_core::metrics::auc(&scores, &labels)
        );
    }
    Ok(())
}
