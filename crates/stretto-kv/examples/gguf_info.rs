//! Prints a GGUF file's metadata (arrays abbreviated) and tensor types.
//! `cargo run -p stretto-kv --example gguf_info -- PATH`
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: gguf_info PATH")?;
    let g = stretto_kv::gguf::Gguf::open(std::path::Path::new(&path))?;
    for (k, v) in &g.metadata {
        match v.as_array() {
            Some(a) => println!("{k}: array of {}", a.len()),
            None => println!("{k}: {v:?}"),
        }
    }
    let mut types = std::collections::BTreeMap::new();
    for t in g.tensors.values() {
        *types.entry(format!("{:?}", t.ty)).or_insert(0) += 1;
    }
    println!("{} tensors: {types:?}", g.tensors.len());
    for (n, t) in g.tensors.iter().take(12) {
        println!("  {n} {:?} {:?}", t.dims, t.ty);
    }
    Ok(())
}
