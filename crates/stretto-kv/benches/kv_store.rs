//! Compression ladder on bundled reviews and reports: bytes per stored record, question-pass time per item, and
//! agreement of filter decisions with the uncompressed (ratio 0) cache.
//!
//! `cargo bench -p stretto-kv --bench kv_store` (env: `STRETTO_BENCH_ITEMS`, default 16 per dataset;
//! `STRETTO_BENCH_PRESS`, default expected-attention; `STRETTO_BENCH_THREADS`, default 1).
//! Decisions are compared two ways: the sign of the log-odds of '1' over '0', and the side of the ratio-0
//! median log-odds (a calibrated threshold: SmolLM2-135M leans to '1' on most items, which makes sign agreement
//! easy).

use std::time::Instant;

use arrow::array::{Array, AsArray};
use stretto_core::context::default_home;
use stretto_core::datasets::Dataset;
use stretto_kv::decoder::{Decoder, KvPast, Step, Want};
use stretto_kv::press::{compress_ladder, Positions, Press};
use stretto_kv::store::{encode_record, sha256_text, RecordMeta, RECORD_FORMAT};

const RATIOS: [f64; 3] = [0.0, 0.5, 0.8];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::var("STRETTO_BENCH_ITEMS").ok().and_then(|v| v.parse().ok()).unwrap_or(16);
    let threads: usize = std::env::var("STRETTO_BENCH_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let press = Press::parse(&std::env::var("STRETTO_BENCH_PRESS").unwrap_or_else(|_| "expected-attention".into()))?;
    let dec = Decoder::load(&default_home(), "smollm2-135m", threads)?;
    let (yes, no) = (dec.token_id("1")?, dec.token_id("0")?);
    let cases = [
        ("movie", "reviews", "reviewtext", "Is this review clearly positive? Answer 1 or 0."),
        ("rotowire", "reports", "report", "Did the team named first in the report win the game? Answer 1 or 0."),
    ];
    println!("SmolLM2-135M, press {}, {threads} thread(s), {n} items per dataset", press.name());
    println!("| dataset | ratio | mean kept tokens | bytes/item (f16 record) | question ms/item | sign agreement | median-threshold agreement | mean abs Δ log-odds |");
    println!("|---|---|---|---|---|---|---|---|");
    for (ds, table, column, question) in cases {
        let data = Dataset::load(ds)?;
        let col = data
            .table(table)?
            .column_by_name(column)
            .ok_or_else(|| format!("{ds}.{table} has no column {column}"))?
            .as_string::<i32>()
            .clone();
        let q = dec.encode(&dec.question_suffix(question))?;
        // Per ratio: kept tokens, bytes, seconds, log-odds per item.
        let mut kept = [0f64; 3];
        let mut bytes = [0f64; 3];
        let mut secs = [0f64; 3];
        let mut odds: [Vec<f32>; 3] = Default::default();
        let m = n.min(col.len());
        for i in 0..m {
            let prompt = dec.item_prefix(col.value(i));
            let tokens = dec.encode(&prompt)?;
            let out = dec.run(&[Step { past: None, tokens: &tokens }], Want { present: true, query_stats: true })?;
            let past = out[0].present.clone().ok_or("no cache")?;
            let ladder =
                compress_ladder(press, Positions::Keep, dec.config(), &past, out[0].query_stats.as_ref(), &RATIOS)?;
            for (r, c) in ladder.iter().enumerate() {
                kept[r] += c.len as f64;
                bytes[r] += encode_record(&meta(c, tokens.len(), &prompt, RATIOS[r], press), c)?.len() as f64;
                let mut best = f64::INFINITY;
                let mut lo = 0.0;
                for _ in 0..3 {
                    let s = Instant::now();
                    let o = dec.run(&[Step { past: Some(c), tokens: &q }], Want::default())?;
                    best = best.min(s.elapsed().as_secs_f64());
                    lo = o[0].logits[yes as usize] - o[0].logits[no as usize];
                }
                secs[r] += best;
                odds[r].push(lo);
            }
        }
        let mut sorted = odds[0].clone();
        sorted.sort_by(f32::total_cmp);
        let median = sorted[sorted.len() / 2];
        for r in 0..RATIOS.len() {
            let sign = odds[r].iter().zip(&odds[0]).filter(|(a, b)| (**a > 0.0) == (**b > 0.0)).count();
            let med = odds[r].iter().zip(&odds[0]).filter(|(a, b)| (**a > median) == (**b > median)).count();
            let delta: f32 = odds[r].iter().zip(&odds[0]).map(|(a, b)| (a - b).abs()).sum::<f32>() / m as f32;
            println!(
                "| {ds} | {:.1} | {:.1} | {:.0} | {:.1} | {sign}/{m} | {med}/{m} | {delta:.3} |",
                RATIOS[r],
                kept[r] / m as f64,
                bytes[r] / m as f64,
                secs[r] / m as f64 * 1e3,
            );
        }
    }
    Ok(())
}

fn meta(c: &KvPast, tokens: usize, prompt: &str, ratio: f64, press: Press) -> RecordMeta {
    RecordMeta {
        format: RECORD_FORMAT,
        model: "smollm2-135m".into(),
        press,
        ratio,
        positions: Positions::Keep,
        layers: c.keys.len(),
        kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        tokens,
        kept: c.len,
        next_position: c.next_position,
        source_sha256: sha256_text(prompt),
        checksum: String::new(),
    }
}
