//! Filter question over a cached KV past versus full-prompt inference, per item, on bundled reviews and reports.
//!
//! `cargo bench -p stretto-kv --bench kv_past` (env: `STRETTO_BENCH_ITEMS`, default 12 per dataset;
//! `STRETTO_BENCH_MODEL`, default smollm2-135m; `STRETTO_BENCH_THREADS`, default 1).
//! Per item: the offline prefill of the chat-templated item, then the question pass over its past, then the same
//! question asked with the whole prompt from scratch; each timed as the median of three runs. The answers (log-odds
//! of '1' over '0') must agree, or the comparison would be meaningless.

use std::time::Instant;

use arrow::array::{Array, AsArray};
use stretto_core::context::default_home;
use stretto_core::datasets::Dataset;
use stretto_kv::decoder::{Decoder, Step, Want};

fn median_ms(mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..3)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[1]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::var("STRETTO_BENCH_ITEMS").ok().and_then(|v| v.parse().ok()).unwrap_or(12);
    let model = std::env::var("STRETTO_BENCH_MODEL").unwrap_or_else(|_| "smollm2-135m".into());
    let threads: usize = std::env::var("STRETTO_BENCH_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let dec = Decoder::load(&default_home(), &model, threads)?;
    let (yes, no) = (dec.token_id("1")?, dec.token_id("0")?);
    let cases = [
        ("movie", "reviews", "reviewtext", "Review", "Is this review clearly positive?"),
        ("rotowire", "reports", "report", "Report", "Did the home team win this game?"),
    ];
    println!("model {model}, {threads} thread(s), {n} items per dataset");
    println!("| dataset | item tokens (mean) | question tokens | prefill ms/item (offline) | question over cached past ms/item | full prompt ms/item | speedup | same answer |");
    println!("|---|---|---|---|---|---|---|---|");
    for (ds, table, column, label, question) in cases {
        let data = Dataset::load(ds)?;
        let texts = data.table(table)?;
        let col = texts
            .column_by_name(column)
            .ok_or_else(|| format!("{ds}.{table} has no column {column}"))?
            .as_string::<i32>()
            .clone();
        let q = dec.encode(&format!(
            "\n{question} Answer 1 for yes or 0 for no.<|im_end|>\n<|im_start|>assistant\nAnswer: "
        ))?;
        let (mut tokens, mut prefill, mut cached, mut full, mut agree) = (0usize, 0.0, 0.0, 0.0, 0usize);
        for i in 0..n.min(col.len()) {
            let item = dec.encode(&format!(
                "<|im_start|>system\n{}<|im_end|>\n<|im_start|>user\n{label}: {}",
                dec.config().system_prompt,
                col.value(i)
            ))?;
            tokens += item.len();
            let mut past = None;
            prefill += median_ms(|| past = Some(dec.prefill(&item, false).expect("prefill").0));
            let past = past.expect("prefilled");
            let mut a = 0.0;
            cached += median_ms(|| {
                let out = dec.run(&[Step { past: Some(&past), tokens: &q }], Want::default()).expect("question");
                a = out[0].logits[yes as usize] - out[0].logits[no as usize];
            });
            let whole: Vec<u32> = item.iter().chain(&q).copied().collect();
            let mut b = 0.0;
            full += median_ms(|| {
                let out = dec.run(&[Step { past: None, tokens: &whole }], Want::default()).expect("full");
                b = out[0].logits[yes as usize] - out[0].logits[no as usize];
            });
            if (a > 0.0) == (b > 0.0) && (a - b).abs() <= 1e-3 * b.abs().max(1.0) {
                agree += 1;
            }
        }
        let m = n.min(col.len()) as f64;
        println!(
            "| {ds} | {:.0} | {} | {:.1} | {:.1} | {:.1} | {:.2}× | {agree}/{} |",
            tokens as f64 / m,
            q.len(),
            prefill / m,
            cached / m,
            full / m,
            full / cached,
            m as usize
        );
    }
    Ok(())
}
