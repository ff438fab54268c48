//! Peak memory of one item's prefill, whole or within a memory budget:
//! `/usr/bin/time -v cargo run --release -p stretto-kv --example prefill_memory -- smollm2-135m FILE BYTES [cache]`
//! (`BYTES` 0 prefills the item in one run, as before prefills were chunked; `chunk=N` picks the chunk). With
//! `cache`, the item goes through a query's cache path instead (`PastSource`: prefill within `BYTES`, the press at
//! every ladder ratio, the records written to a temporary KV directory). Prints tokens, chunk and seconds; the peak
//! resident set is `time -v`'s "Maximum resident set size".

use stretto_core::context::default_home;
use stretto_kv::cache::PastSource;
use stretto_kv::decoder::{prefill_chunk, Decoder};
use stretto_kv::press::{Positions, Press};
use stretto_kv::store::Profile;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: prefill_memory MODEL FILE BYTES|chunk=N [cache]";
    let model = args.next().unwrap_or_else(|| "smollm2-135m".into());
    let file = args.next().ok_or(usage)?;
    let arg = args.next().ok_or(usage)?;
    let cache = args.next().as_deref() == Some("cache");
    let text = std::fs::read_to_string(&file)?;
    let dec = Decoder::load(&default_home(), &model, 0)?;
    let tokens = dec.encode(&dec.item_prefix(&text))?;
    let t = std::time::Instant::now();
    if cache {
        let budget: u64 = arg.parse()?;
        let dir = tempfile::tempdir()?;
        let profile =
            Profile { model: model.clone(), press: Press::ExpectedAttention, ratio: 0.0, positions: Positions::Keep };
        let source = PastSource::new(profile, dir.path().to_path_buf()).with_memory_budget(budget);
        let (pasts, _) = source.get(&dec, std::slice::from_ref(&text))?;
        println!(
            "{model} (cache path): {} tokens, {:.1} s, cache {:.0} MB",
            tokens.len(),
            t.elapsed().as_secs_f64(),
            pasts[0].bytes() as f64 / 1e6
        );
        return Ok(());
    }
    let chunk = match arg.strip_prefix("chunk=") {
        Some(n) => n.parse()?,
        None => match arg.parse::<u64>()? {
            0 => tokens.len(),
            budget => prefill_chunk(dec.config(), tokens.len(), budget),
        },
    };
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
