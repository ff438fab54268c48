//! MiniLM (all-MiniLM-L6-v2) converted from safetensors: the similarities sentence-transformers publishes.

use std::sync::OnceLock;

use stretto_core::context::default_home;
use stretto_kv::embed::{cosine, Embedder};

fn embedder() -> &'static Embedder {
    static E: OnceLock<Embedder> = OnceLock::new();
    E.get_or_init(|| Embedder::load(&default_home(), "minilm", 2).expect("MiniLM converts and loads"))
}

#[test]
fn reproduces_the_sentence_transformers_similarities() {
    let e = embedder();
    // The semantic-search example of sentence-transformers (query "A man is eating food.").
    let v = e
        .embed(
            &[
                "A man is eating food.",
                "A man is eating a piece of bread.",
                "The girl is carrying a baby.",
                "A man is riding a horse.",
            ],
            4,
        )
        .unwrap();
    let sims: Vec<f32> = v[1..].iter().map(|x| cosine(&v[0], x)).collect();
    for (got, want) in sims.iter().zip([0.7553f32, -0.1050, 0.2474]) {
        assert!((got - want).abs() < 5e-4, "similarities {sims:?}");
    }
    // The quickstart example (0.6660 / 0.1046 / 0.1411).
    let w =
        e.embed(&["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."], 2).unwrap();
    assert!((cosine(&w[0], &w[1]) - 0.6660).abs() < 5e-4);
    assert!((cosine(&w[0], &w[2]) - 0.1046).abs() < 5e-4);
    assert!((cosine(&w[1], &w[2]) - 0.1411).abs() < 5e-4);
    for x in v.iter().chain(&w) {
        assert_eq!(x.len(), e.dim());
        let norm: f32 = x.iter().map(|a| a * a).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4);
    }
}

#[test]
fn padding_in_a_batch_does_not_change_an_embedding() {
    let e = embedder();
    let texts = ["short", "a much longer sentence that needs padding for the others in its batch", ""];
    let batched = e.embed(&texts, 3).unwrap();
    for (i, t) in texts.iter().enumerate() {
        let alone = e.embed(&[t], 1).unwrap().remove(0);
        let diff = alone.iter().zip(&batched[i]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff < 1e-5, "{t:?}: {diff}");
    }
    // Texts beyond the model's window are truncated, not an error.
    let long = "word ".repeat(2000);
    assert_eq!(e.embed(&[&long], 1).unwrap()[0].len(), e.dim());
}
