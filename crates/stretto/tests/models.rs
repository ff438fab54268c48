//! Bring your own model: a user's GGUF decoder registered by path is converted, cached and used as a ladder rung
//! (gold included) exactly like a catalog model; so is a Hugging Face ONNX export folder (a decoder with KV-past
//! I/O, or a sentence encoder that joins the embedding filters); files that are not what they claim are errors
//! naming them.

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
    // Registering the unchanged file again reuses the conversion: the converted model is not written again.
    let files = stretto::kv::prepare::register_gguf(&home, "byo-smollm2", &gguf).unwrap();
    let written = || std::fs::metadata(&files.model).and_then(|m| m.modified()).unwrap();
    let before = written();
    let again = stretto::kv::prepare::register_gguf(&home, "byo-smollm2", &gguf).unwrap();
    assert_eq!(again.model, files.model);
    assert_eq!(written(), before, "an unchanged file was converted again");
}

/// A GGUF v3 header with one metadata entry, `general.architecture` = `arch`, and no tensors.
fn write_gguf_header(path: &Path, arch: &str) {
    write_gguf_meta(path, arch, None, &[]);
}

/// A GGUF v3 header with no tensors whose metadata are `general.architecture` = `arch`, and, where given, a chat
/// template and a vocabulary (`tokenizer.ggml.tokens`).
fn write_gguf_meta(path: &Path, arch: &str, template: Option<&str>, tokens: &[&str]) {
    let string = |b: &mut Vec<u8>, s: &str| {
        b.extend_from_slice(&(s.len() as u64).to_le_bytes());
        b.extend_from_slice(s.as_bytes());
    };
    let mut entries = Vec::new();
    let mut entry = |key: &str, value: &dyn Fn(&mut Vec<u8>)| {
        string(&mut entries, key);
        value(&mut entries);
    };
    entry("general.architecture", &|b| {
        b.extend_from_slice(&8u32.to_le_bytes()); // string
        string(b, arch);
    });
    if let Some(t) = template {
        entry("tokenizer.chat_template", &|b| {
            b.extend_from_slice(&8u32.to_le_bytes());
            string(b, t);
        });
    }
    if !tokens.is_empty() {
        entry("tokenizer.ggml.tokens", &|b| {
            b.extend_from_slice(&9u32.to_le_bytes()); // array
            b.extend_from_slice(&8u32.to_le_bytes()); // of strings
            b.extend_from_slice(&(tokens.len() as u64).to_le_bytes());
            tokens.iter().for_each(|t| string(b, t));
        });
    }
    let count = 1 + u64::from(template.is_some()) + u64::from(!tokens.is_empty());
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes()); // tensors
    b.extend_from_slice(&count.to_le_bytes()); // metadata entries
    b.extend_from_slice(&entries);
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

    // A llama decoder that does not speak ChatML is refused before any conversion, naming its file: Llama 3's
    // vocabulary and template, or ChatML markers in the vocabulary under another format's template (Zephyr's).
    let llama3 = dir.path().join("llama3.gguf");
    let template = "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] }}";
    write_gguf_meta(&llama3, "llama", Some(template), &["<|begin_of_text|>", "<|start_header_id|>", "hello"]);
    let e = build("mine", &llama3).to_string();
    assert!(e.contains("llama3.gguf") && e.contains("no `<|im_start|>` token") && e.contains("ChatML"), "{e}");
    let zephyr = dir.path().join("zephyr.gguf");
    let template = "{{ '<|user|>\n' + message['content'] + eos_token }}";
    write_gguf_meta(&zephyr, "llama", Some(template), &["<|im_start|>", "<|im_end|>", "<|user|>"]);
    let e = build("mine", &zephyr).to_string();
    assert!(e.contains("zephyr.gguf") && e.contains("chat template is not ChatML"), "{e}");
    assert!(!home.join("models").join("mine").join("onnx").exists(), "nothing was converted");

    let e = build("mine", &dir.path().join("absent.gguf")).to_string();
    assert!(e.contains("absent.gguf"), "{e}");
    let e = build("smollm2-135m", &gpt2).to_string();
    assert!(e.contains("catalog model"), "{e}");
    let e = build("../escape", &gpt2).to_string();
    assert!(e.contains("must be letters"), "{e}");
    assert!(!home.join("models").join("mine").join("onnx").exists(), "nothing half-converted is left");
}

fn hf_export(kind: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../stretto-models/tests/fixtures/hf-export").join(kind)
}

#[test]
fn hugging_face_exports_are_a_gold_rung_and_an_embedding_filter() {
    let dir = tempfile::tempdir().unwrap();
    let home = stretto::core::context::default_home();
    stretto::kv::prepare::ensure_ready(&home, "smollm2-135m").expect("CI-sized model prepares");
    // A registration names a new model of the home; this test's names are its own.
    let (dec, enc) = (format!("hf-qwen2-{}", std::process::id()), format!("hf-bert-{}", std::process::id()));
    let s = Session::builder(&home)
        .kv_dir(dir.path().join("kv"))
        .memo_off()
        .model(&dec, hf_export("decoder"))
        .model(&enc, hf_export("encoder"))
        .ladder(["smollm2-135m", dec.as_str()])
        .build()
        .expect("both exports register");
    let _cleanup = scopeguard([&dec, &enc].iter().map(|m| stretto::kv::models::model_dir(&home, m)).collect());
    // The decoder export: every rung compressed with key-norm (no query statistics), the uncompressed one gold.
    let gold = format!("llm:{dec}@key-norm-0.00");
    let op = s.registry().get(&gold).expect("the export's gold rung");
    assert!(op.properties().gold);
    assert_eq!(op.kv_cache_model(), Some(dec.as_str()));
    for rung in [gold.clone(), format!("llm:{dec}@key-norm-0.50")] {
        let v = scores(&s, &rung);
        assert_eq!(v.len(), 6);
        assert!(v.iter().all(|x| x.is_finite()), "{rung}: {v:?}");
    }
    // The catalog rungs keep their press and their answers.
    assert!(s.registry().get("llm:smollm2-135m@expected-attention-0.00").is_ok());
    // The encoder export joins the embedding filters beside MiniLM.
    assert_eq!(s.config().operators.encoders, vec!["minilm".to_string(), enc.clone()]);
    let v = scores(&s, &format!("embed:{enc}"));
    assert!(v.len() == 6 && v.iter().all(|x| (-1.0..=1.0).contains(x)), "{v:?}");
    // An encoder cannot be a rung of the LLM ladder.
    let e = Session::builder(&home).memo_off().ladder([enc.as_str()]).build().unwrap_err().to_string();
    assert!(e.contains(&enc), "{e}");
    // The other plugins that name a model take a registered one of the right kind, and refuse the wrong kind by
    // name when the query is built, not at its first answer.
    let built =
        |factory: &str, config: serde_json::Value| s.registry().build(factory, &config).map(|op| op.name().to_string());
    assert_eq!(built("codegen-map", serde_json::json!({"model": dec})).unwrap(), format!("codegen:{dec}"));
    let bridge = built("label-bridge", serde_json::json!({"encoder": enc})).unwrap();
    assert_eq!(bridge, format!("label-bridge:efficientnet-lite0+{enc}"));
    for (factory, config, wrong) in [
        ("codegen-map", serde_json::json!({"model": enc}), "is a sentence encoder, not a decoder"),
        ("codegen-map", serde_json::json!({"model": "minilm"}), "is not a decoder LLM"),
        ("label-bridge", serde_json::json!({"encoder": dec}), "is a decoder LLM, not a sentence encoder"),
        ("label-bridge", serde_json::json!({"encoder": "smollm2-135m"}), "is not a sentence encoder"),
    ] {
        let e = built(factory, config).unwrap_err().to_string();
        assert!(e.contains(factory) && e.contains(wrong), "{e}");
    }
    // A model brought stays allowed when `models` is set after it, so its embedding filter is a candidate.
    let s = Session::builder(&home).memo_off().model(&enc, hf_export("encoder")).models(["minilm"]).build().unwrap();
    assert_eq!(s.config().models, vec!["minilm".to_string(), enc.clone()]);
}

/// A real model through Optimum: SmolLM2-135M exported from the catalog's own GGUF weights
/// (`stretto-models/tests/fixtures/hf-export/make.py --smollm2 DIR` writes it) must answer as the catalog's
/// conversion of the same weights does. Needs PyTorch to make the export, so it runs only when asked:
/// `STRETTO_HF_SMOLLM2=DIR cargo test --release -p stretto --test models -- --ignored`.
#[test]
#[ignore = "needs a SmolLM2-135M export made with Optimum (STRETTO_HF_SMOLLM2=DIR)"]
fn a_real_optimum_export_answers_like_the_catalog_conversion_of_the_same_weights() {
    let export = std::env::var_os("STRETTO_HF_SMOLLM2").expect("STRETTO_HF_SMOLLM2=DIR names the export");
    let home = stretto::core::context::default_home();
    let dir = tempfile::tempdir().unwrap();
    let name = format!("hf-smollm2-{}", std::process::id());
    let mine =
        Session::builder(&home).kv_dir(dir.path().join("kv")).memo_off().model(&name, &export).ladder([name.as_str()]);
    let mine = mine.build().unwrap();
    let catalog = Session::builder(&home).kv_dir(dir.path().join("kv")).memo_off().build().unwrap();
    let (a, b) = (
        scores(&mine, &format!("llm:{name}@key-norm-0.00")),
        scores(&catalog, "llm:smollm2-135m@expected-attention-0.00"),
    );
    let _ = std::fs::remove_dir_all(stretto::kv::models::model_dir(&home, &name));
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() < 1e-3, "{a:?} vs {b:?}");
    }
}

/// A query whose ladder holds a Hugging Face decoder export runs end to end, past gold alone: its compressed rungs
/// and its contrast rung are profiled beside gold on a sample smaller than the input. The caches profiling builds
/// before it starts are the ones the export's rungs read (key-norm: an export returns no query statistics, which the
/// expected-attention press needs), and no rung asks the export for them; a press a configuration names is kept.
#[test]
fn a_query_over_a_hugging_face_decoder_export_profiles_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let dec = format!("hf-qwen2-query-{}", std::process::id());
    let (builder, _cleanup) = over_export(dir.path(), &dec);
    let s = builder.models([dec.as_str()]).sample(0.25, 10).screen(0).build().expect("the export registers");
    let reviews = stretto::core::datasets::Dataset::load("movie").unwrap().table("reviews").unwrap().slice(0, 60);
    s.register_batch("reviews", reviews).unwrap();
    // Every rung of the export, the contrast one included, compresses with key-norm.
    assert!(s.registry().get(&format!("llm-contrast:{dec}@key-norm-0.00")).is_ok());
    let frame = s.table("reviews").unwrap().sem_filter("{reviews.reviewtext} is clearly positive").unwrap();
    let profiled = frame.profile().expect("the export's rungs are profiled");
    let names: Vec<&str> = profiled.profile().physical.iter().map(|e| e.name.as_str()).collect();
    assert!(names.len() > 2, "only gold was profiled: {names:?}");
    assert!(names.iter().any(|n| n.contains("key-norm-0.50")), "{names:?}");
    assert!(names.iter().all(|n| !n.contains("expected-attention")), "{names:?}");
    let r = profiled.collect(stretto::Targets::new(0.5, 0.5, 0.95).unwrap()).expect("the query runs");
    assert!(r.batch().num_rows() <= 60);
    // Every record is a key-norm one: the cache step's, the compressed rungs' and the contrast rung's.
    let records: Vec<String> = walk(&dir.path().join("kv"));
    assert!(records.iter().any(|p| p.contains("key-norm")), "{records:?}");
    assert!(!records.iter().any(|p| p.contains("expected-attention")), "{records:?}");
    // A press named in a rung's configuration is the one it uses.
    let named = s.registry().build("llm-filter", &serde_json::json!({"model": dec, "press": "streaming"})).unwrap();
    assert!(named.name().contains("streaming"), "{}", named.name());
}

/// An image query whose ladder is a Hugging Face decoder export: the caption rungs (the image filter's LLM gold)
/// prefill the export's caches with the press it supports.
#[test]
fn an_image_query_with_a_hugging_face_export_as_its_ladder_runs() {
    let dir = tempfile::tempdir().unwrap();
    let dec = format!("hf-qwen2-photos-{}", std::process::id());
    let (builder, _cleanup) = over_export(dir.path(), &dec);
    let s = builder.build().expect("the export registers");
    let r = s
        .dataset("ecommerce")
        .unwrap()
        .table("products")
        .unwrap()
        .filter(stretto::col("products.photo").is_null().not())
        .unwrap()
        .limit(6)
        .unwrap()
        .sem_filter("{products.photo} shows a t-shirt or a top")
        .unwrap()
        .collect(stretto::Targets::new(0.5, 0.5, 0.95).unwrap())
        .expect("the image query runs");
    assert!(r.batch().num_rows() <= 6);
    assert!(
        r.plan().stages.iter().any(|st| st.physical.contains(&format!("caption:{dec}@key-norm-0.00"))),
        "{:?}",
        r.plan().stages
    );
}

/// A file registered again under the same name (changed, or another one) reads none of the KV records and memoised
/// answers of the registration before it: they are kept under the registration as well as the name. Registering the
/// unchanged file again reads them all.
#[test]
fn a_model_registered_again_reads_none_of_the_caches_and_answers_of_the_registration_before() {
    let dir = tempfile::tempdir().unwrap();
    let copy = |kind: &str| {
        let to = dir.path().join(kind);
        std::fs::create_dir(&to).unwrap();
        for e in std::fs::read_dir(hf_export(kind)).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
        to
    };
    let (export, encoder) = (copy("decoder"), copy("encoder"));
    let (name, enc) =
        (format!("hf-qwen2-again-{}", std::process::id()), format!("hf-bert-again-{}", std::process::id()));
    let home = stretto::core::context::default_home();
    let _cleanup = scopeguard([&name, &enc].iter().map(|m| stretto::kv::models::model_dir(&home, m)).collect());
    let session = || {
        let b = Session::builder(&home).kv_dir(dir.path().join("kv")).memo_dir(dir.path().join("memo"));
        b.model(&name, &export).model(&enc, &encoder).ladder([name.as_str()]).build().expect("the exports register")
    };
    let touch = |folder: &Path| {
        let model = std::fs::File::options().write(true).open(folder.join("model.onnx")).unwrap();
        model.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(60)).unwrap();
    };
    // Bytes of the memo's files whose path holds `part`.
    let bytes_of = |part: &str| {
        let files = walk(&dir.path().join("memo")).into_iter().filter(|p| p.contains(part));
        files.map(|p| std::fs::metadata(p).unwrap().len()).sum::<u64>()
    };
    let memo_bytes = || bytes_of("");
    // What a compressed rung's answers leave: its items' KV records, and its answers in the memo.
    let rung = format!("llm:{name}@key-norm-0.50");
    let first = scores(&session(), &rung);
    let (records, memo) = (walk(&dir.path().join("kv")).len(), memo_bytes());
    assert!(records >= 6 && memo > 0, "{records} records, {memo} memo bytes");
    // (Memoised scores come back to within float32 rounding.)
    let close = |v: Vec<f64>| v.len() == first.len() && v.iter().zip(&first).all(|(a, b)| (a - b).abs() < 1e-6);
    // The same file registered again: everything is read back.
    assert!(close(scores(&session(), &rung)));
    assert_eq!((walk(&dir.path().join("kv")).len(), memo_bytes()), (records, memo), "the same registration");
    // The file changed (here only its time; a fine-tune saved over it would change its weights too).
    let held = stretto::kv::pool::decoder(&home, 1usize, &name).unwrap();
    touch(&export);
    assert!(close(scores(&session(), &rung)), "same weights, same answers");
    // A copy loaded before is not handed out for the new registration.
    let now = stretto::kv::pool::decoder(&home, 1usize, &name).unwrap();
    assert!(!Arc::ptr_eq(&held, &now), "the pool handed out the old registration's model");
    assert_eq!(now.config().registration, stretto::kv::prepare::registration_id(&home, &name));
    assert_ne!(held.config().registration, now.config().registration);
    let again = walk(&dir.path().join("kv")).len();
    assert!(again >= 2 * records, "the new registration prefilled its own records: {records} then {again}");
    assert!(memo_bytes() > memo, "the new registration's answers were computed, not read back");
    // An encoder's embeddings likewise.
    let embed = format!("embed:{enc}");
    let first = scores(&session(), &embed);
    let (memo, items) = (memo_bytes(), bytes_of(".items"));
    assert!(items > 0);
    scores(&session(), &embed);
    assert_eq!(memo_bytes(), memo, "the same registration's embeddings are read back");
    touch(&encoder);
    let again = scores(&session(), &embed);
    assert!(again.iter().zip(&first).all(|(a, b)| (a - b).abs() < 1e-6), "{again:?} vs {first:?}");
    // Both the filter's scores and the item embeddings under them (which the label bridge reads too) anew.
    assert!(bytes_of(".items") > items, "the new registration's item embeddings were computed, not read back");
    assert!(memo_bytes() - bytes_of(".items") > memo - items, "the filter's scores were computed, not read back");
}

/// Removes registered models' folders when dropped, passed or not.
fn scopeguard(model_dirs: Vec<std::path::PathBuf>) -> impl Drop {
    struct Cleanup(Vec<std::path::PathBuf>);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            self.0.iter().for_each(|d| drop(std::fs::remove_dir_all(d)));
        }
    }
    Cleanup(model_dirs)
}

/// A session builder over `dir` whose ladder is the decoder export fixture registered as `name` (unique to the
/// test), with the guard that unregisters it.
fn over_export(dir: &Path, name: &str) -> (stretto::SessionBuilder, impl Drop) {
    let home = stretto::core::context::default_home();
    let guard = scopeguard(vec![stretto::kv::models::model_dir(&home, name)]);
    let b = Session::builder(&home).kv_dir(dir.join("kv")).memo_off().model(name, hf_export("decoder")).ladder([name]);
    (b, guard)
}

/// Every file path under `dir`.
fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p.display().to_string());
        }
    }
    out
}
