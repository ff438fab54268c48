//! Which answer protocol lets a model separate the derived review labels for "is clearly positive": the filter's
//! '1'/'0' question, generic Yes/No and true/false answers, and a contrastive completion whose answer words carry the
//! meaning (" positive" vs " negative"), and the contrast filter's question, whose opposite the model derives itself
//! ([`stretto_kv::contrast`]). The item's cache is prefilled once and shared by all questions.
//!
//! `cargo run --release -p stretto-kv --example prompt_auc -- [N] [MODEL]` (defaults 240, smollm2-135m).

#[path = "common/reviews.rs"]
mod reviews;

use stretto_kv::contrast::ContrastQuestion;
use stretto_kv::decoder::{Step, Want};
use stretto_kv::tasks::filter_question;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let reviews::Probe { n, model, dec, text, labels } = reviews::load()?;
    let pair = |a: &str, b: &str| -> Result<(u32, u32), Box<dyn std::error::Error>> {
        Ok((dec.token_id(a)?, dec.token_id(b)?))
    };
    let p = "the text above is clearly positive";
    let turn = "<|im_end|>\n<|im_start|>assistant\n";
    // (protocol, question part, (yes, no) answer tokens)
    let questions: Vec<(&str, String, (u32, u32))> = vec![
        ("filter 1/0", dec.question_suffix(&filter_question(p)), pair("1", "0")?),
        ("Yes/No", format!("\nIs it true that {p}?{turn}Answer:"), pair(" Yes", " No")?),
        (
            "yes/no",
            format!("\n\nQuestion: is it true that {p}? Answer yes or no.{turn}The answer is"),
            pair(" yes", " no")?,
        ),
        (
            "true/false",
            format!("\n\nQuestion: is it true that {p}?{turn}The statement \"{p}\" is"),
            pair(" true", " false")?,
        ),
        (
            "contrast",
            format!("\nIs the sentiment of the text above positive or negative?{turn}The sentiment is"),
            pair(" positive", " negative")?,
        ),
    ];
    // The contrast filter's own question: the opposite derived by the model itself.
    let subject = "the text above";
    let derived = match stretto_kv::contrast::derive_opposite(&dec, subject, p)? {
        Some(o) => ContrastQuestion::new(&dec, subject, p, &o)?,
        None => None,
    };
    let mut questions: Vec<(String, Vec<u32>, (u32, u32))> = questions
        .into_iter()
        .map(|(name, q, a)| Ok((name.to_string(), dec.encode(&q)?, a)))
        .collect::<Result<_, Box<dyn std::error::Error>>>()?;
    match derived {
        Some(c) => {
            questions.push((format!("contrast filter: {} → \"{}\"", c.question, c.lead), c.tokens, (c.yes, c.no)))
        }
        None => println!("{model} derived no usable opposite of \"{p}\""),
    }
    let pasts: Vec<_> = (0..n)
        .map(|i| dec.prefill(&dec.encode(&dec.item_prefix(text.value(i)))?, false).map(|p| p.0))
        .collect::<Result<_, _>>()?;
    println!("| protocol | AUC vs is_positive ({n} reviews, {model}) |\n|---|---|");
    for (name, q, (yes, no)) in &questions {
        let mut scores = Vec::with_capacity(n);
        for past in &pasts {
            let o = dec.run(&[Step { past: Some(past), tokens: q }], Want::default())?;
            scores.push((o[0].logits[*yes as usize] - o[0].logits[*no as usize]) as f64);
        }
        println!("| {name} | {:.3} |", stretto_core::metrics::auc(&scores, &labels));
    }
    Ok(())
}
