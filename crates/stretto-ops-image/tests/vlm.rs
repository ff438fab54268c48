//! The VLM operator on a small model in the Hugging Face ONNX layout, generated here: a vision encoder, a token
//! embedder and a one-layer decoder with KV past whose logits read the mean of everything it has seen.

use std::path::Path;

use arrow::array::{RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use stretto_core::op::{OpOutput, Registry, SemanticTask};
use stretto_kv::onnx::{dtype, Attr, Dim, GraphBuilder};

const D: i64 = 4;
const N_IMG: i64 = 2;
const SIDE: i64 = 8;
const WORDS: [&str; 12] =
    ["[UNK]", "Yes", "No", "User:", "Assistant:", "Is", "it", "true", "that", "the", "image", "shows"];

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| (((i as u32).wrapping_mul(2654435761u32) ^ seed) % 1000) as f32 / 500.0 - 1.0).collect()
}

/// How the generated vision encoder takes its pixels.
#[derive(Clone, Copy, PartialEq)]
enum Pixels {
    /// `[1, 3, S, S]`.
    Four,
    /// `[1, images, 3, S, S]` with a `pixel_attention_mask`, as SmolVLM exports.
    FiveWithMask,
}

fn write_model(dir: &Path, pixels: Pixels) {
    let v = WORDS.len() as i64;
    // Vision encoder: per-channel mean → linear map to N_IMG tokens of D.
    let mut b = GraphBuilder::new(&dir.join("vision.onnx.data")).unwrap();
    let side = [Dim::Fixed(SIDE), Dim::Fixed(SIDE)];
    let m = match pixels {
        Pixels::Four => {
            let px = b.input("pixel_values", dtype::FLOAT, &[&[Dim::Fixed(1), Dim::Fixed(3)][..], &side].concat());
            b.op("ReduceMean", &[&px], vec![Attr::ints("axes", &[2, 3]), Attr::int("keepdims", 0)])
        }
        Pixels::FiveWithMask => {
            let px = b.input(
                "pixel_values",
                dtype::FLOAT,
                &[&[Dim::Fixed(1), Dim::Sym("images"), Dim::Fixed(3)][..], &side].concat(),
            );
            let mask = b.input(
                "pixel_attention_mask",
                dtype::BOOL,
                &[&[Dim::Fixed(1), Dim::Sym("images")][..], &side].concat(),
            );
            // [1, images, 3] → mean over the images → [1, 3]; the mask must be consumed and must be all true:
            // the features are scaled by its mean.
            let m = b.op("ReduceMean", &[&px], vec![Attr::ints("axes", &[1, 3, 4]), Attr::int("keepdims", 0)]);
            let mf = b.op("Cast", &[&mask], vec![Attr::int("to", dtype::FLOAT as i64)]);
            let mm = b.op("ReduceMean", &[&mf], vec![Attr::int("keepdims", 0)]);
            b.op("Mul", &[&m, &mm], vec![])
        }
    };
    let w = b.weight("wv", &[3, N_IMG * D], &values((3 * N_IMG * D) as usize, 7)).unwrap();
    let f = b.op("MatMul", &[&m, &w], vec![]);
    let shape = b.ints(&[N_IMG, D]).unwrap();
    let f = b.op("Reshape", &[&f, &shape], vec![]);
    b.output(&f, "image_features", dtype::FLOAT, &[Dim::Fixed(N_IMG), Dim::Fixed(D)]);
    b.finish(&dir.join("vision.onnx"), "vision", &[]).unwrap();
    // Token embedder.
    let mut b = GraphBuilder::new(&dir.join("embed.onnx.data")).unwrap();
    let ids = b.input("input_ids", dtype::INT64, &[Dim::Fixed(1), Dim::Sym("s")]);
    let t = b.weight("table", &[v, D], &values((v * D) as usize, 11)).unwrap();
    let e = b.op("Gather", &[&t, &ids], vec![Attr::int("axis", 0)]);
    b.output(&e, "inputs_embeds", dtype::FLOAT, &[Dim::Fixed(1), Dim::Sym("s"), Dim::Fixed(D)]);
    b.finish(&dir.join("embed.onnx"), "embed", &[]).unwrap();
    // Decoder: keys = values = the embeddings; logits = mean of all keys (past + new) times W.
    let mut b = GraphBuilder::new(&dir.join("decoder.onnx.data")).unwrap();
    let x = b.input("inputs_embeds", dtype::FLOAT, &[Dim::Fixed(1), Dim::Sym("s"), Dim::Fixed(D)]);
    let mask = b.input("attention_mask", dtype::INT64, &[Dim::Fixed(1), Dim::Sym("t")]);
    let pos = b.input("position_ids", dtype::INT64, &[Dim::Fixed(1), Dim::Sym("s")]);
    let kv = [Dim::Fixed(1), Dim::Fixed(1), Dim::Sym("p"), Dim::Fixed(D)];
    let pk = b.input("past_key_values.0.key", dtype::FLOAT, &kv);
    let pv = b.input("past_key_values.0.value", dtype::FLOAT, &kv);
    let ax1 = b.ints(&[1]).unwrap();
    let new = b.op("Unsqueeze", &[&x, &ax1], vec![]);
    let k = b.op("Concat", &[&pk, &new], vec![Attr::int("axis", 2)]);
    let vv = b.op("Concat", &[&pv, &new], vec![Attr::int("axis", 2)]);
    let mean = b.op("ReduceMean", &[&k], vec![Attr::ints("axes", &[2]), Attr::int("keepdims", 0)]);
    let wo = b.weight("wo", &[D, v], &values((D * v) as usize, 13)).unwrap();
    let logits = b.op("MatMul", &[&mean, &wo], vec![]);
    // The mask and positions must be consumed; they add zero.
    let zero = b.f32s(&[], &[0.0]).unwrap();
    let mf = b.op("Cast", &[&mask], vec![Attr::int("to", dtype::FLOAT as i64)]);
    let pf = b.op("Cast", &[&pos], vec![Attr::int("to", dtype::FLOAT as i64)]);
    let ms = b.op("ReduceSum", &[&mf], vec![Attr::int("keepdims", 0)]);
    let ps = b.op("ReduceSum", &[&pf], vec![Attr::int("keepdims", 0)]);
    let z = b.op("Add", &[&ms, &ps], vec![]);
    let z = b.op("Mul", &[&z, &zero], vec![]);
    let logits = b.op("Add", &[&logits, &z], vec![]);
    b.output(&logits, "logits", dtype::FLOAT, &[Dim::Fixed(1), Dim::Fixed(1), Dim::Fixed(v)]);
    b.output(&k, "present.0.key", dtype::FLOAT, &[Dim::Fixed(1), Dim::Fixed(1), Dim::Sym("t"), Dim::Fixed(D)]);
    b.output(&vv, "present.0.value", dtype::FLOAT, &[Dim::Fixed(1), Dim::Fixed(1), Dim::Sym("t"), Dim::Fixed(D)]);
    b.finish(&dir.join("decoder.onnx"), "decoder", &[]).unwrap();
    // A word-level tokenizer over the words above.
    let vocab: serde_json::Map<String, serde_json::Value> =
        WORDS.iter().enumerate().map(|(i, w)| (w.to_string(), serde_json::json!(i))).collect();
    let tok = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    });
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
    let spec = serde_json::json!({
        "vision": "vision.onnx", "embed": "embed.onnx", "decoder": "decoder.onnx", "tokenizer": "tokenizer.json",
        "image_size": SIDE, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "layers": 1, "kv_heads": 1,
        "head_dim": D, "prompt_prefix": "User:", "after_image": "", "prompt_suffix": " Assistant:",
        "yes": " Yes", "no": " No"
    });
    std::fs::write(dir.join("stretto-vlm.json"), spec.to_string()).unwrap();
}

fn write_image(path: &Path, rgb: [u8; 3]) {
    image::RgbImage::from_pixel(16, 16, image::Rgb(rgb)).save(path).unwrap();
}

#[test]
fn a_vlm_in_the_hugging_face_layout_scores_images() {
    scores_images(Pixels::Four);
}

#[test]
fn five_dimensional_pixel_inputs_with_an_attention_mask_are_fed() {
    scores_images(Pixels::FiveWithMask);
}

fn scores_images(pixels: Pixels) {
    stretto_ops_image::link();
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), pixels);
    let red = dir.path().join("red.png");
    let blue = dir.path().join("blue.png");
    write_image(&red, [250, 10, 10]);
    write_image(&blue, [10, 10, 250]);
    let registry =
        Registry::discover(&stretto_core::OpContext::from_env().unwrap().with_memo(stretto_core::MemoPolicy::Off))
            .unwrap();
    let op = registry.build("vlm-filter", &serde_json::json!({"dir": dir.path(), "name": "tiny"})).unwrap();
    assert_eq!(op.name(), "vlm:tiny");
    let schema = std::sync::Arc::new(Schema::new(vec![Field::new("p.photo", DataType::Utf8, false)]));
    let paths = [red.display().to_string(), blue.display().to_string(), red.display().to_string()];
    let batch = RecordBatch::try_new(schema, vec![std::sync::Arc::new(StringArray::from(paths.to_vec()))]).unwrap();
    let task = SemanticTask::filter("t", "{p.photo} shows the image");
    let OpOutput::Scores(s) = op.evaluate(&task, &batch).unwrap() else { panic!("not scores") };
    assert_eq!(s.len(), 3);
    assert!(s.iter().all(|v| v.is_finite()));
    assert_eq!(s[0], s[2], "the same image scores the same");
    assert_ne!(s[0], s[1], "the image reaches the decoder through its features");
    let violations = stretto_core::conformance::check(op.as_ref(), &task, &batch);
    assert!(violations.is_empty(), "{violations:?}");
    // An empty cell of an image column is a tuple without an image: the lowest score, not a failed query.
    let schema = std::sync::Arc::new(Schema::new(vec![stretto_core::table::ColumnKind::Image.field("p.photo")]));
    let photos = StringArray::from(vec![Some(paths[0].as_str()), None]);
    let batch = RecordBatch::try_new(schema, vec![std::sync::Arc::new(photos)]).unwrap();
    let OpOutput::Scores(none) = op.evaluate(&task, &batch).unwrap() else { panic!("not scores") };
    assert_eq!(none, vec![s[0], op.properties().score_range.0]);
    // A folder without a spec is a clear error naming the file.
    let bad = registry.build("vlm-filter", &serde_json::json!({"dir": "/nonexistent"})).unwrap();
    let e = bad.evaluate(&task, &batch).unwrap_err().to_string();
    assert!(e.contains("stretto-vlm.json"), "{e}");
}
