//! The pair operators of a semantic join, on real models (SmolLM2-135M, MiniLM): each judges a pair from its two
//! sides seen apart, and what it does once per side is done once.

use std::sync::Arc;

use arrow::array::{RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use stretto_core::op::{OpOutput, Registry, SemanticTask};
use stretto_kv::decoder::{Step, Want};

const SAME: &str = "{a.text} and {b.text} express the same sentiment";

fn context(dir: &std::path::Path) -> stretto_core::OpContext {
    stretto_ops_text::link();
    let home = stretto_core::context::default_home();
    for m in ["smollm2-135m", "minilm"] {
        stretto_kv::prepare::ensure_ready(&home, m).expect("CI-sized model prepares");
    }
    stretto_core::OpContext::new(home)
        .with_kv_dir(dir.join("kv"))
        .with_memo(stretto_core::MemoPolicy::Dir(dir.join("memo")))
        .with_ladder(["smollm2-135m"])
}

const TEXTS: [&str; 4] = [
    "A warm, funny and moving film; the best of the year.",
    "Dull, overlong and badly acted. I walked out.",
    "A delight from start to finish.",
    "Tedious and forgettable.",
];

/// Every ordered pair of distinct texts, as tables `a` and `b`.
fn pairs() -> (RecordBatch, Vec<(usize, usize)>) {
    let idx: Vec<(usize, usize)> = (0..4).flat_map(|i| (0..4).filter(move |&j| j != i).map(move |j| (i, j))).collect();
    let col = |f: fn(&(usize, usize)) -> usize| {
        Arc::new(StringArray::from(idx.iter().map(|p| TEXTS[f(p)]).collect::<Vec<_>>())) as arrow::array::ArrayRef
    };
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("a.text", DataType::Utf8, true),
            Field::new("b.text", DataType::Utf8, true),
        ])),
        vec![col(|p| p.0), col(|p| p.1)],
    )
    .unwrap();
    (batch, idx)
}

#[test]
fn the_llm_pair_filter_over_the_first_texts_cached_past_equals_the_whole_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = context(dir.path());
    let registry = Registry::discover(&ctx).unwrap();
    // Raw log-odds ('1' over '0'), so the reference needs no calibration.
    let op = registry
        .build("llm-pair-filter", &serde_json::json!({"model": "smollm2-135m", "protocol": "digits-raw"}))
        .unwrap();
    let (batch, idx) = pairs();
    let task = SemanticTask::filter("same", SAME);
    let OpOutput::Scores(scores) = op.evaluate(&task, &batch).unwrap() else { panic!("scores") };
    // Only the four texts' own caches were built (as one-item operators read them), none for the 12 pairs.
    let records = walkdir(&dir.path().join("kv"));
    assert_eq!(records, 4 * 3, "one record per text and ladder ratio (0, 0.5, 0.8), none per pair");

    // The reference: the whole prompt of each pair from scratch, tokenised as the operator tokenises it (the first
    // text's prefix as cached, then the second text and the question).
    let dec = stretto_kv::pool::decoder(&ctx.model_home, stretto_ops_text::runtime(&ctx), "smollm2-135m").unwrap();
    let statement = "the first text and the second text express the same sentiment";
    let protocol = stretto_kv::models::FilterProtocol::parse("digits-raw").unwrap();
    let prompt = stretto_kv::tasks::pair_filter_prompt(&dec, protocol, statement).unwrap();
    for (k, &(i, j)) in idx.iter().enumerate() {
        let mut tokens = dec.encode(&dec.item_prefix(TEXTS[i])).unwrap();
        tokens.extend(dec.encode(&format!("{}{}", stretto_kv::tasks::second_text(TEXTS[j]), prompt.suffix)).unwrap());
        let out = dec.run(&[Step { past: None, tokens: &tokens }], Want::default()).unwrap();
        let want = (out[0].logits[prompt.answers.0 as usize] - out[0].logits[prompt.answers.1 as usize]) as f64;
        assert!((scores[k] - want).abs() < 1e-3 * (1.0 + want.abs()), "pair {i},{j}: {} vs {want}", scores[k]);
    }
    // The order matters: (i, j) and (j, i) are different prompts.
    assert!(idx.iter().enumerate().any(|(k, &(i, j))| {
        let back = idx.iter().position(|&p| p == (j, i)).unwrap();
        (scores[k] - scores[back]).abs() > 1e-4
    }));
}

fn walkdir(dir: &std::path::Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            n += walkdir(&p);
        } else if p.extension().is_some_and(|x| x == "safetensors") {
            n += 1;
        }
    }
    n
}

#[test]
fn project_then_join_names_each_sides_property_once_and_compares() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = context(dir.path());
    let registry = Registry::discover(&ctx).unwrap();
    let op = registry.get("project-pair:smollm2-135m").unwrap();
    let (batch, idx) = pairs();
    let same = SemanticTask::filter("same", SAME);
    let opposite = SemanticTask::filter("opposite", "{a.text} and {b.text} express opposite sentiments");
    // Shown the input, it spreads each side's answer over the pairs holding it (each text is in 6 of the 12).
    op.observe_input(&same, &batch).unwrap();
    let (out, secs) = op.evaluate_timed(&same, &batch).unwrap();
    let OpOutput::Scores(same_scores) = out else { panic!("scores") };
    let OpOutput::Scores(opposite_scores) = op.evaluate(&opposite, &batch).unwrap() else { panic!("scores") };

    // Each side's projection, as the model's contrast between the two values it names for "sentiment" scores it
    // over the text's cached past (calibrated, as SmolLM2's filters are).
    let dec = stretto_kv::pool::decoder(&ctx.model_home, stretto_ops_text::runtime(&ctx), "smollm2-135m").unwrap();
    let q = stretto_kv::contrast::property_question(&dec, "the text above", "sentiment").unwrap().expect("two values");
    let source = stretto_kv::cache::PastSource::new(
        stretto_kv::store::Profile {
            model: "smollm2-135m".into(),
            press: stretto_kv::press::Press::ExpectedAttention,
            ratio: 0.0,
            positions: stretto_kv::press::Positions::Keep,
        },
        dir.path().join("kv"),
    );
    let texts: Vec<String> = TEXTS.iter().map(|t| t.to_string()).collect();
    let (sides, _) =
        stretto_kv::tasks::filter_scores_after(&dec, &source, &texts, &q.tokens, (q.yes, q.no), 8).unwrap();
    let free = [stretto_ops_text::llm::CONTENT_FREE.to_string()];
    let (base, _) = stretto_kv::tasks::filter_scores_after(&dec, &source, &free, &q.tokens, (q.yes, q.no), 1).unwrap();
    eprintln!("{} sides: {sides:?} (content-free {}); same: {same_scores:?}", q.question, base[0]);
    use stretto_ops_text::join::{polar_pair_score, Relation};
    for (k, &(i, j)) in idx.iter().enumerate() {
        let want = polar_pair_score(Relation::Same, sides[i] - base[0], sides[j] - base[0]);
        assert!(
            (same_scores[k] - want).abs() < 1e-3 * (1.0 + want.abs()),
            "pair {i},{j}: {} vs {want}",
            same_scores[k]
        );
        assert!((same_scores[k] + opposite_scores[k]).abs() < 1e-9, "pair {i},{j}");
    }
    // Four side answers were computed for twelve pairs; each pair is charged a sixth of each of its sides'.
    let total: f64 = secs.iter().sum();
    assert!(total > 0.0 && secs.iter().all(|s| *s > 0.0));
    let unshown = registry.build("project-pair-filter", &serde_json::json!({"model": "smollm2-135m"})).unwrap();
    let (_, full) = unshown.unmemoised().evaluate_timed(&same, &batch).unwrap();
    let ratio = full.iter().sum::<f64>() / total;
    assert!(ratio > 4.0, "an operator never shown the input charges each pair its sides in full: {ratio}");

    // A predicate that compares no property is declined, not guessed.
    let other = SemanticTask::filter("x", "{a.text} is a reply to {b.text}");
    assert!(matches!(op.evaluate(&other, &batch), Err(stretto_core::CoreError::NotApplicable { .. })));
}

#[test]
fn the_embedding_pair_filter_is_the_cosine_of_the_sides() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = context(dir.path());
    let registry = Registry::discover(&ctx).unwrap();
    let op = registry.get("embed-pair:minilm").unwrap();
    let (batch, idx) = pairs();
    let OpOutput::Scores(scores) = op.evaluate(&SemanticTask::filter("same", SAME), &batch).unwrap() else {
        panic!("scores")
    };
    let enc = stretto_kv::pool::embedder(&ctx.model_home, stretto_ops_text::runtime(&ctx), "minilm").unwrap();
    let v = enc.embed(&TEXTS, 4).unwrap();
    for (k, &(i, j)) in idx.iter().enumerate() {
        let want = stretto_kv::embed::cosine(&v[i], &v[j]) as f64;
        assert!((scores[k] - want).abs() < 1e-4, "pair {i},{j}: {} vs {want}", scores[k]);
    }
}
