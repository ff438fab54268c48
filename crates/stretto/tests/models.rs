//! Bring your own model: a user's GGUF decoder registered by path is converted, cached and used as a ladder rung
//! (gold included) exactly like a catalog model; files that are not what they claim are errors naming them.

use std::path::Path;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema};
use stretto::core::op::{OpOutput, SemanticTask};
use stretto::Session;

fn reviews() -> RecordBatch {
    let ds = stretto::core::datasets::Dataset::load("movie").unwrap();
    let text = ds.table("reviews").unwrap().column_by_name("reviewtext").unwrap().slice(0, 6);
    RecordBatch::try_new(Arc::new(Schema::new(vec![Field::new("r.text", DataType::Utf8, true)])), vec![text]).unwrap()
}

fn scores(s: &Session, op: &str) -> Vec<f64> {
    let task = SemanticTask::filter("f", "{r.text} is clearly positive");
    match s.registry().get(op).unwrap().evaluate(&task, &reviews()).unwrap() {
        OpOutput::Scores(v) => v,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_users_gguf_is_a_gold_rung_that_answers_like_the_same_catalog_weights() {
    let home = stretto::core::context::default_home();
    stretto::kv::prepare::ensure_ready(&home, "smollm2-135m").expect("CI-sized model prepares");
    // The user's file: here the catalog's own SmolLM2 GGUF, so the answers must be the catalog model's.
    let gguf = stretto::kv::models::model_dir(&home, "smollm2-135m").join("model.gguf");
    let dir = tempfile::tempdir().unwrap();
    let mine = Session::builder(&home)
        .kv_dir(dir.path().join("kv"))
        .memo_off()
        .model("byo-smollm2", &gguf)
        .ladder(["byo-smollm2"])
        .build()
        .expect("the GGUF registers");
    let rung = "llm:byo-smollm2@expected-attention-0.00";
    let op = mine.registry().get(rung).unwrap();
    assert!(op.properties().gold, "the last ladder model, uncompressed, is the gold candidate");
    assert_eq!(op.kv_cache_model(), Some("byo-smollm2"));
    assert!(mine.config().models.contains(&"byo-smollm2".to_string()), "a registered model is allowed in queries");

    let catalog = Session::builder(&home).kv_dir(dir.path().join("kv")).memo_off().build().unwrap();
    let (a, b) = (scores(&mine, rung), scores(&catalog, "llm:smollm2-135m@expected-attention-0.00"));
    assert_eq!(a.len(), 6);
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() < 1e-4, "{a:?} vs {b:?}");
    }
    // Registering the unchanged file again reuses the conversion.
    let t = std::time::Instant::now();
    stretto::kv::prepare::register_gguf(&home, "byo-smollm2", &gguf).unwrap();
    assert!(t.elapsed().as_secs_f64() < 5.0, "an unchanged file was converted again");
}

/// A GGUF v3 header with one metadata entry, `general.architecture` = `arch`, and no tensors.
fn write_gguf_header(path: &Path, arch: &str) {
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes()); // tensors
    b.extend_from_slice(&1u64.to_le_bytes()); // metadata entries
    let key = "general.architecture";
    b.extend_from_slice(&(key.len() as u64).to_le_bytes());
    b.extend_from_slice(key.as_bytes());
    b.extend_from_slice(&8u32.to_le_bytes()); // string
    b.extend_from_slice(&(arch.len() as u64).to_le_bytes());
    b.extend_from_slice(arch.as_bytes());
    std::fs::write(path, b).unwrap();
}

#[test]
fn files_that_are_not_what_they_claim_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let build = |name: &str, path: &Path| Session::builder(&home).memo_off().model(name, path).build().unwrap_err();

    let text = dir.path().join("weights.gguf");
    std::fs::write(&text, "this is not a model").unwrap();
    let e = build("mine", &text).to_string();
    assert!(e.contains("weights.gguf") && e.contains("not a GGUF"), "{e}");

    let gpt2 = dir.path().join("gpt2.gguf");
    write_gguf_header(&gpt2, "gpt2");
    let e = build("mine", &gpt2).to_string();
    assert!(e.contains("gpt2.gguf") && e.contains("`gpt2` is not supported"), "{e}");

    let e = build("mine", &dir.path().join("absent.gguf")).to_string();
    assert!(e.contains("absent.gguf"), "{e}");
    let e = build("smollm2-135m", &gpt2).to_string();
    assert!(e.contains("catalog model"), "{e}");
    let e = build("../escape", &gpt2).to_string();
    assert!(e.contains("must be letters"), "{e}");
    assert!(!home.join("models").join("mine").join("onnx").exists(), "nothing half-converted is left");
}
