//! What a filter's question pass costs per item at several decoder batch widths, over cached pasts of the first N
//! movie reviews: the price of asking an operator a few tuples at a time (a probe's worth, 4) against the batch it
//! is configured for (8), which execution fills (#21). The pasts are prefilled first and not timed; each width runs
//! the same question over every past `REPS` times, widths interleaved, and the fastest pass is reported.
//!
//! `cargo run -p stretto-kv --example batch_width -- [N] [MODEL] [WIDTH,...]` (defaults 64, qwen2.5-coder-0.5b,
//! 1,4,8,16).

#[path = "common/reviews.rs"]
mod reviews;

/// Passes per width; the fastest is reported.
const REPS: usize = 3;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::args().nth(2).is_none() {
        eprintln!("(model qwen2.5-coder-0.5b: pass [N] [MODEL] to choose)");
    }
    let probe = reviews::load_with(64, "qwen2.5-coder-0.5b")?;
    let widths: Vec<usize> = std::env::args()
        .nth(3)
        .unwrap_or_else(|| "1,4,8,16".into())
        .split(',')
        .map(|w| w.trim().parse::<usize>())
        .collect::<Result<_, _>>()?;
    let reviews::PlotFilter { pasts, question: q, answers: (yes, no) } = reviews::plot_filter(&probe)?;
    let reviews::Probe { n, model, dec, .. } = probe;
    let refs: Vec<_> = pasts.iter().collect();
    // Warm-up: the session's first runs pay one-off allocations.
    dec.log_odds(&refs[..n.min(8)], &q, yes, no, 8)?;
    let mut best = vec![f64::INFINITY; widths.len()];
    let mut answers: Vec<Vec<f32>> = vec![Vec::new(); widths.len()];
    for _ in 0..REPS {
        for (k, &w) in widths.iter().enumerate() {
            let t = std::time::Instant::now();
            answers[k] = dec.log_odds(&refs, &q, yes, no, w)?;
            best[k] = best[k].min(t.elapsed().as_secs_f64());
        }
    }
    println!("{model}, {n} movie reviews, the question pass over cached pasts (fastest of {REPS}):");
    for (k, &w) in widths.iter().enumerate() {
        let agree = answers[k].iter().zip(&answers[0]).filter(|(a, b)| (**a > 0.0) == (**b > 0.0)).count();
        println!(
            "  batch {w:>3}: {:>7.1} ms per item, {:.2}x batch {}'s, decisions agreeing with batch {}'s: {agree} of {n}",
            1e3 * best[k] / n as f64,
            best[k] / best[0],
            widths[0],
            widths[0],
        );
    }
    Ok(())
}
