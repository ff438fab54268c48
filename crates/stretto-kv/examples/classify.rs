//! Top-5 ImageNet classes of image files: `cargo run --release -p stretto-kv --example classify -- a.jpg b.jpg`.

use std::path::PathBuf;

use stretto_core::context::default_home;
use stretto_kv::vision::{top_k, Classifier};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let paths: Vec<PathBuf> = std::env::args().skip(1).map(PathBuf::from).collect();
    let c = Classifier::load(&default_home(), 0)?;
    let refs: Vec<&std::path::Path> = paths.iter().map(|p| p.as_path()).collect();
    for (p, probs) in paths.iter().zip(c.classify_files(&refs, 8)?) {
        let top: Vec<String> =
            top_k(&probs, 5).iter().map(|(i, pr)| format!("{} {:.2}", c.classes()[*i], pr)).collect();
        println!("{}: {}", p.display(), top.join(", "));
    }
    Ok(())
}
