//! What a freshly loaded decoder session's first question passes cost against its later ones, and whether warming
//! the session at load would pay (#21). Profiling asks gold and each candidate a probe's worth of tuples first, so
//! a session's one-off first-run cost lands on the few tuples that decide which candidates go on.
//!
//! The pasts of the first N movie reviews are prefilled once, by a session of their own, and not timed. Then, twice
//! over, a fresh session of the same model is loaded and asked the same filter question over the pasts in batches
//! of 8, timed per batch, after one of three starts:
//! - `cold`: nothing before the first batch;
//! - `full warm-up`: 8 question passes over the past of a short text (the shape of a batch);
//! - `tiny warm-up`: one pass of one token over a one-token past (the least the session can run).
//!
//! `cargo run --release -p stretto-kv --example cold_session -- [N] [MODEL]` (defaults 24, qwen2.5-coder-0.5b).

#[path = "common/reviews.rs"]
mod reviews;

use stretto_core::context::default_home;
use stretto_kv::decoder::{Decoder, Step, Want};

/// Question passes per timed batch (the ladder's configured batch).
const BATCH: usize = 8;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let probe = reviews::load_with(24, "qwen2.5-coder-0.5b")?;
    let reviews::PlotFilter { pasts, question: q, answers: (yes, no) } = reviews::plot_filter(&probe)?;
    let reviews::Probe { n, model, dec, .. } = probe;
    let refs: Vec<_> = pasts.iter().collect();
    drop(dec);
    println!("{model}, {n} movie reviews, question passes in batches of {BATCH} on a freshly loaded session:");
    for round in 1..=2 {
        for start in ["cold", "full warm-up", "tiny warm-up"] {
            let t = std::time::Instant::now();
            let fresh = Decoder::load(&default_home(), &model, 0)?;
            let load = t.elapsed().as_secs_f64();
            let t = std::time::Instant::now();
            match start {
                "full warm-up" => {
                    let (p, _) = fresh.prefill(&fresh.encode(&fresh.item_prefix("A short warm-up text."))?, false)?;
                    let steps: Vec<Step<'_>> = (0..BATCH).map(|_| Step { past: Some(&p), tokens: &q }).collect();
                    fresh.run(&steps, Want::default())?;
                }
                "tiny warm-up" => {
                    let tokens = fresh.encode("Hi.")?;
                    let one = &tokens[..1];
                    let (p, _) = fresh.prefill(one, false)?;
                    fresh.run(&[Step { past: Some(&p), tokens: one }], Want::default())?;
                }
                _ => {}
            }
            let warm = t.elapsed().as_secs_f64();
            let mut per_item = Vec::new();
            for chunk in refs.chunks(BATCH) {
                let t = std::time::Instant::now();
                fresh.log_odds(chunk, &q, yes, no, BATCH)?;
                per_item.push(format!("{:.1}", 1e3 * t.elapsed().as_secs_f64() / chunk.len() as f64));
            }
            println!(
                "  round {round}, {start:<12}: load {load:5.2} s, warm-up {warm:4.2} s, ms per item by batch: {}",
                per_item.join(" ")
            );
        }
    }
    Ok(())
}
