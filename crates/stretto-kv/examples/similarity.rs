//! Cosine similarities of sentence pairs with MiniLM:
//! `cargo run --release -p stretto-kv --example similarity -- "first" "second" ...` (every pair is printed).

use stretto_core::context::default_home;
use stretto_kv::embed::{cosine, Embedder};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let texts: Vec<String> = std::env::args().skip(1).collect();
    let emb = Embedder::load(&default_home(), "minilm", 0)?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let v = emb.embed(&refs, 16)?;
    for i in 0..v.len() {
        for j in i + 1..v.len() {
            println!("{:.4}\t{} | {}", cosine(&v[i], &v[j]), texts[i], texts[j]);
        }
    }
    Ok(())
}
