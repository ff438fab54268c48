//! Sentence encoders converted from safetensors: MiniLM (all-MiniLM-L6-v2) reproduces the similarities
//! sentence-transformers publishes; MPNet (all-mpnet-base-v2) those of an independent numpy implementation of
//! Hugging Face's `MPNetModel` over the same weights.

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

fn mpnet() -> &'static Embedder {
    static E: OnceLock<Embedder> = OnceLock::new();
    E.get_or_init(|| Embedder::load(&default_home(), "mpnet", 2).expect("MPNet prepares, converts and loads"))
}

#[test]
fn mpnet_reproduces_a_reference_implementation_on_short_and_long_texts() {
    let e = mpnet();
    assert_eq!(e.dim(), 768);
    // Expected values: a numpy MPNet written from Hugging Face's modeling code (word + position embeddings from
    // padding_idx + 1, relative-position buckets, post-norm layers, mean pooling, L2 norm), run on the same
    // safetensors and tokenizer. The long review spans more than 16 tokens, so it reaches the logarithmic buckets.
    let long = "This movie was a sprawling, ambitious mess: the actors try hard, the score soars, and yet the plot \
                collapses under its own weight long before the final act, leaving nothing but noise and a sense of \
                wasted talent everywhere you look on the screen.";
    let quiet = "A quiet, tender drama about a family that learns to forgive, beautifully acted and shot with \
                 patience and grace.";
    let texts = [
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "The girl is carrying a baby.",
        "A man is riding a horse.",
        long,
        quiet,
        "a terrible film",
    ];
    // Batched: short texts padded beside the long one.
    let v = e.embed(&texts, 7).unwrap();
    let want = [
        (0, 1, 0.6601f32),
        (0, 2, -0.0559),
        (0, 3, 0.2464),
        (1, 3, 0.2232),
        (4, 5, 0.4666),
        (4, 6, 0.5591),
        (5, 6, 0.4529),
    ];
    for (i, j, sim) in want {
        let got = cosine(&v[i], &v[j]);
        assert!((got - sim).abs() < 5e-4, "{} | {}: {got} against {sim}", texts[i], texts[j]);
    }
    for (t, batched) in texts.iter().zip(&v) {
        let alone = e.embed(&[t], 1).unwrap().remove(0);
        let diff = alone.iter().zip(batched).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff < 1e-5, "{t:?}: padding moved the embedding by {diff}");
    }
}
