//! Peak memory of one item's prefill, whole or within a memory budget:
//! `/usr/bin/time -v cargo run --release -p stretto-kv --example prefill_memory -- smollm2-135m FILE BYTES`
//! (`BYTES` 0 prefills the item in one run, as before prefills were chunked; `chunk=N` picks the chunk). Prints tokens, chunk and seconds; the
//! peak resident set is `time -v`'s "Maximum resident set size".

use stretto_core::context::default_home;
use stretto_kv::decoder::{prefill_chunk, Decoder};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model = args.next().unwrap_or_else(|| "smollm2-135m".into());
    let file = args.next().ok_or("usage: prefill_memory MODEL FILE BYTES")?;
    let arg = args.next().ok_or("usage: prefill_memory MODEL FILE BYTES|chunk=N")?;
    let text = std::fs::read_to_string(&file)?;
    let dec = Decoder::load(&default_home(), &model, 0)?;
    let tokens = dec.encode(&dec.item_prefix(&text))?;
    let chunk = match arg.strip_prefix("chunk=") {
        Some(n) => n.parse()?,
        None => match arg.parse::<u64>()? {
            0 => tokens.len(),
            budget => prefill_chunk(dec.config(), tokens.len(), budget),
        },
    };
    let t = std::time::Instant::now();
    let (past, stats) = dec.prefill_chunked(&tokens, true, chunk)?;
    println!(
        "{model}: {} tokens, chunk {chunk}, {:.1} s, cache {:.0} MB, query statistics {}",
        tokens.len(),
        t.elapsed().as_secs_f64(),
        past.bytes() as f64 / 1e6,
        stats.is_some()
    );
    Ok(())
}
