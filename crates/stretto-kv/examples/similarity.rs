//! Cosine similarities of sentence pairs with a catalog sentence encoder (MiniLM unless `--model` names another):
//! `cargo run --release -p stretto-kv --example similarity -- [--model mpnet] "first" "second" ...` (every pair is
//! printed).

use stretto_core::context::default_home;
use stretto_kv::embed::{cosine, Embedder};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut texts: Vec<String> = std::env::args().skip(1).collect();
    let model = match texts.first().map(String::as_str) {
        Some("--model") if texts.len() >= 2 => texts.drain(..2).nth(1).unwrap_or_default(),
        _ => "minilm".to_string(),
    };
    let emb = Embedder::load(&default_home(), &model, 0)?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let v = emb.embed(&refs, 16)?;
    for i in 0..v.len() {
        for j in i + 1..v.len() {
            println!("{:.4}\t{} | {}", cosine(&v[i], &v[j]), texts[i], texts[j]);
        }
    }
    Ok(())
}
