//! The image-classifier converter: EfficientNet-Lite0 (ImageNet-1k) from its legacy PyTorch state dict to ONNX
//! (the runtime is `stretto_kv::vision`).
//!
//! The graph takes `image` [b, 3, 224, 224] as RGB values in 0..=255 (normalised inside, `(x − 127) / 128`, the
//! model's training convention) and returns `probs` [b, 1000]. Batch norms are folded into the convolutions at
//! conversion. No CLIP-like model exists in reach, so this classifier is what Stretto's image operators build on
//! (as honest compositions: class posteriors bridged to text).

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use crate::error::{ModelError, Result};
use crate::onnx::{dtype, Attr, Dim, GraphBuilder};
use crate::torch::{read_state_dict, TorchTensor};

/// Bumped whenever the converted classifier graph changes.
pub const CLASSIFIER_VERSION: u32 = 1;
/// Input side length.
pub const SIDE: usize = 224;
/// EfficientNet-B0's stages (Lite0 shares them): (repeats, stride of the first block).
const STAGES: [(usize, i64); 7] = [(1, 1), (2, 2), (2, 2), (3, 2), (3, 1), (4, 2), (1, 1)];
/// Batch-norm epsilon of the Lite models.
const BN_EPS: f32 = 1e-3;

fn bad(file: &Path, message: impl Into<String>) -> ModelError {
    ModelError::Format { file: file.display().to_string(), message: message.into() }
}

/// Converts `model.pth` (from the `efficientnet-lite0` model folder) into `out_dir/classifier.onnx` and a
/// `config.json` (written last).
pub fn convert_efficientnet(src: &Path, out_dir: &Path) -> Result<()> {
    let _span = tracing::info_span!("convert_classifier", src = %src.display()).entered();
    let pth = src.join("model.pth");
    let dict: HashMap<String, TorchTensor> = read_state_dict(&pth)?.into_iter().collect();
    let get = |name: &str| dict.get(name).ok_or_else(|| bad(&pth, format!("tensor {name} is missing")));
    fs::create_dir_all(out_dir).map_err(|e| ModelError::io(out_dir, e))?;
    let mut b = GraphBuilder::new(&out_dir.join("classifier.onnx.data"))?;
    let image = b.input(
        "image",
        dtype::FLOAT,
        &[Dim::Sym("batch_size"), Dim::Fixed(3), Dim::Fixed(SIDE as i64), Dim::Fixed(SIDE as i64)],
    );
    let mean = b.f32s(&[], &[127.0])?;
    let scale = b.f32s(&[], &[1.0 / 128.0])?;
    let x = b.op("Sub", &[&image, &mean], vec![]);
    let x = b.op("Mul", &[&x, &scale], vec![]);
    let lo = b.f32s(&[], &[0.0])?;
    let hi = b.f32s(&[], &[6.0])?;

    // A convolution with its batch norm folded in: w' = w·γ/σ, b' = β − μ·γ/σ.
    let conv_bn = |b: &mut GraphBuilder, x: &str, conv: &str, bn: &str, stride: i64, relu6: bool| -> Result<String> {
        let w = get(&format!("{conv}.weight"))?;
        let [out_c, in_c, k, k2] = w.shape[..] else { return Err(bad(&pth, format!("{conv} is not a 2-D conv"))) };
        if k != k2 {
            return Err(bad(&pth, format!("{conv}: non-square kernel")));
        }
        let (g, be, mu, var) = (
            get(&format!("{bn}.weight"))?,
            get(&format!("{bn}.bias"))?,
            get(&format!("{bn}.running_mean"))?,
            get(&format!("{bn}.running_var"))?,
        );
        let per = in_c * k * k;
        let mut wf = w.data.clone();
        let mut bias = vec![0f32; out_c];
        for o in 0..out_c {
            let s = g.data[o] / (var.data[o] + BN_EPS).sqrt();
            wf[o * per..(o + 1) * per].iter_mut().for_each(|v| *v *= s);
            bias[o] = be.data[o] - mu.data[o] * s;
        }
        let wn = b.weight(conv, &[out_c as i64, in_c as i64, k as i64, k as i64], &wf)?;
        let bn_ = b.weight(&format!("{conv}.bias"), &[out_c as i64], &bias)?;
        let p = (k / 2) as i64;
        // Depthwise when each output channel sees one input channel.
        let group = if in_c == 1 && out_c > 1 { out_c as i64 } else { 1 };
        let y = b.op(
            "Conv",
            &[x, &wn, &bn_],
            vec![
                Attr::ints("kernel_shape", &[k as i64, k as i64]),
                Attr::ints("pads", &[p, p, p, p]),
                Attr::ints("strides", &[stride, stride]),
                Attr::int("group", group),
            ],
        );
        Ok(if relu6 { b.op("Clip", &[&y, &lo, &hi], vec![]) } else { y })
    };

    let mut x = conv_bn(&mut b, &x, "_conv_stem", "_bn0", 2, true)?;
    let mut block = 0usize;
    for (repeats, stride) in STAGES {
        for r in 0..repeats {
            let p = format!("_blocks.{block}");
            let s = if r == 0 { stride } else { 1 };
            let input = x.clone();
            let in_c = get(&format!("{p}._project_conv.weight"))?.shape[1];
            let mut h = input.clone();
            if dict.contains_key(&format!("{p}._expand_conv.weight")) {
                h = conv_bn(&mut b, &h, &format!("{p}._expand_conv"), &format!("{p}._bn0"), 1, true)?;
            }
            h = conv_bn(&mut b, &h, &format!("{p}._depthwise_conv"), &format!("{p}._bn1"), s, true)?;
            h = conv_bn(&mut b, &h, &format!("{p}._project_conv"), &format!("{p}._bn2"), 1, false)?;
            let out_c = get(&format!("{p}._project_conv.weight"))?.shape[0];
            let block_in = match get(&format!("{p}._expand_conv.weight")) {
                Ok(t) => t.shape[1],
                Err(_) => in_c,
            };
            x = if s == 1 && block_in == out_c { b.op("Add", &[&h, &input], vec![]) } else { h };
            block += 1;
        }
    }
    if dict.contains_key(&format!("_blocks.{block}._project_conv.weight")) {
        return Err(bad(&pth, "more blocks than EfficientNet-Lite0 has"));
    }
    let x = conv_bn(&mut b, &x, "_conv_head", "_bn1", 1, true)?;
    let x = b.op("GlobalAveragePool", &[&x], vec![]);
    let x = b.op("Flatten", &[&x], vec![Attr::int("axis", 1)]);
    let fc = get("_fc.weight")?;
    let [classes, feat] = fc.shape[..] else { return Err(bad(&pth, "_fc.weight is not a matrix")) };
    let mut t = vec![0f32; fc.data.len()];
    for r in 0..classes {
        for c in 0..feat {
            t[c * classes + r] = fc.data[r * feat + c];
        }
    }
    let w = b.weight("_fc.weight", &[feat as i64, classes as i64], &t)?;
    let bias = b.weight("_fc.bias", &[classes as i64], &get("_fc.bias")?.data)?;
    let y = b.op("MatMul", &[&x, &w], vec![]);
    let logits = b.op("Add", &[&y, &bias], vec![]);
    let probs = b.op("Softmax", &[&logits], vec![Attr::int("axis", -1)]);
    b.output(&probs, "probs", dtype::FLOAT, &[Dim::Sym("batch_size"), Dim::Fixed(classes as i64)]);
    b.finish(&out_dir.join("classifier.onnx"), "efficientnet-lite0", &[])?;
    let cpath = out_dir.join("config.json");
    let config = serde_json::json!({"converter": CLASSIFIER_VERSION, "classes": classes, "side": SIDE});
    fs::write(&cpath, config.to_string()).map_err(|e| ModelError::io(&cpath, e))?;
    Ok(())
}

/// Whether `dir` holds a classifier written by this converter version.
pub fn is_converted(dir: &Path) -> bool {
    fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["converter"].as_u64())
        == Some(CLASSIFIER_VERSION as u64)
        && crate::fsutil::require_files([dir.join("classifier.onnx").as_path()]).is_ok()
}
