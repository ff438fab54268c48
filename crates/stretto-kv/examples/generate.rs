//! Greedy generation with a catalog decoder: `cargo run --release -p stretto-kv --example generate -- smollm2-135m "What is the capital of France?"`.

use stretto_core::context::default_home;
use stretto_kv::decoder::{Decoder, Step};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model = args.next().unwrap_or_else(|| "smollm2-135m".into());
    let prompt = args.next().unwrap_or_else(|| "What is the capital of France?".into());
    let t = std::time::Instant::now();
    let dec = Decoder::load(&default_home(), &model, 0)?;
    eprintln!("loaded in {:.2?}", t.elapsed());
    let ids = dec.encode(&dec.chat_prompt(&prompt))?;
    let t = std::time::Instant::now();
    let out = dec.generate(&[Step { past: None, tokens: &ids }], 32)?;
    eprintln!("generated {} tokens in {:.2?}", out[0].tokens.len(), t.elapsed());
    println!("{} (confidence {:.3})", out[0].text, out[0].confidence);
    Ok(())
}
