//! The sentence-encoder converter: a safetensors BERT (all-MiniLM-L6-v2) or MPNet (all-mpnet-base-v2) encoder
//! converted to ONNX, with sentence-transformers' mean pooling and L2 normalisation inside the graph (the runtime is
//! `stretto_kv::embed`).
//!
//! The graph takes `input_ids` and `attention_mask` [b, s] and returns `sentence_embedding` [b, hidden], unit
//! length, so the cosine similarity of two texts is the dot product of their embeddings.
//!
//! MPNet is BERT's post-norm encoder with three differences, each followed here as Hugging Face's `MPNetModel`
//! computes it: no token-type embedding; absolute positions counted from `padding_idx + 1` over the real tokens;
//! and a relative-position bias added to every layer's attention scores, one learned value per head and
//! T5-style bucket of the key's offset from the query ([`relative_position_bucket`]).

use std::fs;
use std::path::Path;

use safetensors::SafeTensors;
use serde::{Deserialize, Serialize};
use tokenizers::{Tokenizer, TruncationParams};

use crate::error::{ModelError, Result};
use crate::onnx::{dtype, Attr, Dim, GraphBuilder};

/// Bumped whenever the converted encoder graph changes.
pub const ENCODER_VERSION: u32 = 1;

/// sentence-transformers' `max_seq_length` for all-MiniLM-L6-v2: longer texts are truncated. A converted
/// encoder's own limit is [`EncoderConfig::max_tokens`].
pub const MAX_TOKENS: usize = 256;

/// sentence-transformers' `max_seq_length` for all-mpnet-base-v2.
pub const MPNET_MAX_TOKENS: usize = 384;

/// MPNet's `padding_idx`: positions of real tokens count from `PADDING_IDX + 1`.
const MPNET_PADDING_IDX: i64 = 1;

/// MPNet's largest distinguished offset (`max_distance` of its bucket function).
const MPNET_MAX_DISTANCE: i64 = 128;

/// The BERT facts the graph needs (Hugging Face `config.json` fields), plus the converter version.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EncoderConfig {
    /// Hidden size.
    pub hidden_size: usize,
    /// Layers.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Feed-forward size.
    pub intermediate_size: usize,
    /// Position table size.
    pub max_position_embeddings: usize,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f64,
    /// Architecture, Hugging Face's `model_type`: `bert` or `mpnet`.
    #[serde(default = "default_model_type")]
    pub model_type: String,
    /// MPNet's relative-position buckets (absent for BERT).
    #[serde(default)]
    pub relative_attention_num_buckets: usize,
    /// Tokens a text is truncated to (sentence-transformers' `max_seq_length`; written by the converter).
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
    /// Converter version (absent in Hugging Face configs).
    #[serde(default)]
    pub converter: u32,
}

fn default_model_type() -> String {
    "bert".into()
}

fn default_max_tokens() -> usize {
    MAX_TOKENS
}

/// MPNet's (and T5's) bucket of a key at `relative` = key position − query position, over `num_buckets` buckets:
/// half for keys before the query and half after; offsets below a quarter of the buckets each have their own,
/// larger ones share logarithmically wider buckets up to [`MPNET_MAX_DISTANCE`]. Computed in f32 as Hugging Face's
/// `relative_position_bucket` does in torch.
pub fn relative_position_bucket(relative: i64, num_buckets: usize) -> i64 {
    let half = (num_buckets / 2) as i64;
    let n = -relative;
    let mut ret = if n < 0 { half } else { 0 };
    let n = n.abs();
    let max_exact = half / 2;
    if n < max_exact {
        ret += n;
    } else {
        let ratio = (n as f32 / max_exact as f32).ln() / ((MPNET_MAX_DISTANCE as f64 / max_exact as f64).ln() as f32);
        let large = max_exact + (ratio * (half - max_exact) as f32) as i64;
        ret += large.min(half - 1);
    }
    ret
}

fn bad(file: &Path, message: impl Into<String>) -> ModelError {
    ModelError::Format { file: file.display().to_string(), message: message.into() }
}

/// Converts a BERT `model.safetensors` + `config.json` + `tokenizer.json` folder into `out_dir`: `encoder.onnx`
/// (+ `.data`), `tokenizer.json` (fixed padding/truncation removed: the runtime pads per batch), `config.json` last.
pub fn convert_bert(src: &Path, out_dir: &Path) -> Result<()> {
    let _span = tracing::info_span!("convert_encoder", src = %src.display()).entered();
    let cpath = src.join("config.json");
    let text = fs::read_to_string(&cpath).map_err(|e| ModelError::io(&cpath, e))?;
    let mut config: EncoderConfig = serde_json::from_str(&text).map_err(|e| bad(&cpath, e.to_string()))?;
    config.converter = ENCODER_VERSION;
    let mpnet = match config.model_type.as_str() {
        "bert" => false,
        "mpnet" if config.relative_attention_num_buckets >= 4 => true,
        "mpnet" => return Err(bad(&cpath, "an MPNet config needs relative_attention_num_buckets (>= 4)")),
        other => {
            return Err(bad(
                &cpath,
                format!("model_type `{other}` is not a sentence encoder this converts (bert, mpnet)"),
            ))
        }
    };
    config.max_tokens = if mpnet { MPNET_MAX_TOKENS } else { MAX_TOKENS };
    // Positions start after the padding index for MPNet: the table must cover the longest text.
    let first_position = if mpnet { MPNET_PADDING_IDX as usize + 1 } else { 0 };
    if config.max_position_embeddings < config.max_tokens + first_position {
        config.max_tokens = config.max_position_embeddings.saturating_sub(first_position).max(1);
    }
    let wpath = src.join("model.safetensors");
    let file = fs::File::open(&wpath).map_err(|e| ModelError::io(&wpath, e))?;
    // SAFETY: the model file is not modified while mapped (it sits in the model home, written once).
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ModelError::io(&wpath, e))?;
    let st = SafeTensors::deserialize(&map).map_err(|e| bad(&wpath, e.to_string()))?;
    fs::create_dir_all(out_dir).map_err(|e| ModelError::io(out_dir, e))?;

    let tensor = |name: &str| -> Result<(Vec<usize>, Vec<f32>)> {
        let t = st.tensor(name).map_err(|e| bad(&wpath, format!("{name}: {e}")))?;
        if t.dtype() != safetensors::Dtype::F32 {
            return Err(bad(&wpath, format!("{name}: {:?} weights are not supported (f32 only)", t.dtype())));
        }
        let v = t.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        Ok((t.shape().to_vec(), v))
    };
    let c = &config;
    let (d, h) = (c.hidden_size as i64, c.num_attention_heads as i64);
    let hd = d / h;
    let mut b = GraphBuilder::new(&out_dir.join("encoder.onnx.data"))?;
    let ids = b.input("input_ids", dtype::INT64, &[Dim::Sym("batch_size"), Dim::Sym("sequence_length")]);
    let mask = b.input("attention_mask", dtype::INT64, &[Dim::Sym("batch_size"), Dim::Sym("sequence_length")]);
    let vec_w = |b: &mut GraphBuilder, name: &str| -> Result<String> {
        let (shape, v) = tensor(name)?;
        b.weight(name, &shape.iter().map(|&x| x as i64).collect::<Vec<_>>(), &v)
    };
    // torch Linear stores [out][in]; MatMul wants [in][out].
    let linear = |b: &mut GraphBuilder, x: &str, prefix: &str| -> Result<String> {
        let (shape, w) = tensor(&format!("{prefix}.weight"))?;
        let (rows, cols) = match shape.as_slice() {
            [r, c] => (*r, *c),
            _ => return Err(bad(&wpath, format!("{prefix}.weight is not a matrix"))),
        };
        let mut t = vec![0f32; w.len()];
        for r in 0..rows {
            for c in 0..cols {
                t[c * rows + r] = w[r * cols + c];
            }
        }
        let wt = b.weight(&format!("{prefix}.weight"), &[cols as i64, rows as i64], &t)?;
        let bias = vec_w(b, &format!("{prefix}.bias"))?;
        let y = b.op("MatMul", &[x, &wt], vec![]);
        Ok(b.op("Add", &[&y, &bias], vec![]))
    };
    let eps = c.layer_norm_eps as f32;
    let layer_norm = |b: &mut GraphBuilder, x: &str, prefix: &str| -> Result<String> {
        let g = vec_w(b, &format!("{prefix}.weight"))?;
        let beta = vec_w(b, &format!("{prefix}.bias"))?;
        Ok(b.op("LayerNormalization", &[x, &g, &beta], vec![Attr::int("axis", -1), Attr::float("epsilon", eps)]))
    };

    // Padding mask: as floats, and as an additive bias [b, 1, 1, s].
    let maskf = b.op("Cast", &[&mask], vec![Attr::int("to", dtype::FLOAT as i64)]);
    let ax12 = b.ints(&[1, 2])?;
    let m4 = b.op("Unsqueeze", &[&maskf, &ax12], vec![]);
    let fone = b.f32s(&[], &[1.0])?;
    let inv = b.op("Sub", &[&fone, &m4], vec![]);
    let big = b.f32s(&[], &[-1e9])?;
    let bias = b.op("Mul", &[&inv, &big], vec![]);

    // Embeddings: word + position (+ token type 0 for BERT).
    let word = vec_w(&mut b, "embeddings.word_embeddings.weight")?;
    let posw = vec_w(&mut b, "embeddings.position_embeddings.weight")?;
    let we = b.op("Gather", &[&word, &ids], vec![Attr::int("axis", 0)]);
    let shape = b.op("Shape", &[&ids], vec![]);
    let x = if mpnet {
        // Real tokens are numbered padding_idx + 1, + 2, … (cumulative count of the mask); padding gets padding_idx.
        let axis1 = b.i64s(&[], &[1])?;
        let count = b.op("CumSum", &[&mask, &axis1], vec![]);
        let counted = b.op("Mul", &[&count, &mask], vec![]);
        let pad = b.i64s(&[], &[MPNET_PADDING_IDX])?;
        let positions = b.op("Add", &[&counted, &pad], vec![]);
        let pe = b.op("Gather", &[&posw, &positions], vec![Attr::int("axis", 0)]);
        b.op("Add", &[&we, &pe], vec![])
    } else {
        let (_, types) = tensor("embeddings.token_type_embeddings.weight")?;
        let type0 = b.weight("token_type_0", &[d], &types[..d as usize])?;
        let one = b.i64s(&[], &[1])?;
        let s_sc = b.op("Gather", &[&shape, &one], vec![Attr::int("axis", 0)]);
        let zero = b.i64s(&[], &[0])?;
        let positions = b.op("Range", &[&zero, &s_sc, &one], vec![]);
        let pe = b.op("Gather", &[&posw, &positions], vec![Attr::int("axis", 0)]);
        let x = b.op("Add", &[&we, &pe], vec![]);
        b.op("Add", &[&x, &type0], vec![])
    };
    let mut x = layer_norm(&mut b, &x, "embeddings.LayerNorm")?;

    // MPNet: the relative-position bias [h, s, s], the same for every layer: a bucket table over the longest text,
    // cut to this batch's length, looks up each head's learned value.
    let position_bias = if mpnet {
        let n = config.max_tokens as i64;
        let buckets: Vec<i64> = (0..n)
            .flat_map(|q| (0..n).map(move |k| (q, k)))
            .map(|(q, k)| relative_position_bucket(k - q, c.relative_attention_num_buckets))
            .collect();
        let table = b.i64s(&[n, n], &buckets)?;
        let both = b.ints(&[1, 1])?;
        let ss = b.op("Gather", &[&shape, &both], vec![Attr::int("axis", 0)]);
        let starts = b.ints(&[0, 0])?;
        let axes = b.ints(&[0, 1])?;
        let cut = b.op("Slice", &[&table, &starts, &ss, &axes], vec![]);
        let rel = vec_w(&mut b, "encoder.relative_attention_bias.weight")?;
        let per_head = b.op("Gather", &[&rel, &cut], vec![Attr::int("axis", 0)]);
        Some(b.op("Transpose", &[&per_head], vec![Attr::ints("perm", &[2, 0, 1])]))
    } else {
        None
    };

    let heads_shape = b.ints(&[0, 0, h, hd])?;
    let hidden_shape = b.ints(&[0, 0, d])?;
    let scale = b.f32s(&[], &[1.0 / (hd as f32).sqrt()])?;
    let sqrt2 = b.f32s(&[], &[std::f32::consts::SQRT_2])?;
    let half = b.f32s(&[], &[0.5])?;
    let to_heads = |b: &mut GraphBuilder, y: &str, perm: &[i64]| -> String {
        let r = b.op("Reshape", &[y, &heads_shape], vec![]);
        b.op("Transpose", &[&r], vec![Attr::ints("perm", perm)])
    };
    for l in 0..c.num_hidden_layers {
        let p = |n: &str| format!("encoder.layer.{l}.{n}");
        // Hugging Face's names: BERT's `attention.self.query` … `attention.output.LayerNorm`, MPNet's
        // `attention.attn.q` … `attention.LayerNorm`.
        let (qn, kn, vn, on, ln) = if mpnet {
            ("attention.attn.q", "attention.attn.k", "attention.attn.v", "attention.attn.o", "attention.LayerNorm")
        } else {
            (
                "attention.self.query",
                "attention.self.key",
                "attention.self.value",
                "attention.output.dense",
                "attention.output.LayerNorm",
            )
        };
        let q = linear(&mut b, &x, &p(qn))?;
        let k = linear(&mut b, &x, &p(kn))?;
        let v = linear(&mut b, &x, &p(vn))?;
        let q = to_heads(&mut b, &q, &[0, 2, 1, 3]);
        let kt = to_heads(&mut b, &k, &[0, 2, 3, 1]);
        let v = to_heads(&mut b, &v, &[0, 2, 1, 3]);
        let scores = b.op("MatMul", &[&q, &kt], vec![]);
        let mut scores = b.op("Mul", &[&scores, &scale], vec![]);
        if let Some(pb) = &position_bias {
            scores = b.op("Add", &[&scores, pb], vec![]);
        }
        let scores = b.op("Add", &[&scores, &bias], vec![]);
        let probs = b.op("Softmax", &[&scores], vec![Attr::int("axis", -1)]);
        let ctx = b.op("MatMul", &[&probs, &v], vec![]);
        let ctx = b.op("Transpose", &[&ctx], vec![Attr::ints("perm", &[0, 2, 1, 3])]);
        let ctx = b.op("Reshape", &[&ctx, &hidden_shape], vec![]);
        let o = linear(&mut b, &ctx, &p(on))?;
        let o = b.op("Add", &[&o, &x], vec![]);
        x = layer_norm(&mut b, &o, &p(ln))?;
        // Exact (erf) GELU, as BERT's `gelu`.
        let i = linear(&mut b, &x, &p("intermediate.dense"))?;
        let e = b.op("Div", &[&i, &sqrt2], vec![]);
        let e = b.op("Erf", &[&e], vec![]);
        let e = b.op("Add", &[&e, &fone], vec![]);
        let e = b.op("Mul", &[&e, &half], vec![]);
        let g = b.op("Mul", &[&i, &e], vec![]);
        let o = linear(&mut b, &g, &p("output.dense"))?;
        let o = b.op("Add", &[&o, &x], vec![]);
        x = layer_norm(&mut b, &o, &p("output.LayerNorm"))?;
    }
    // Mean pooling over real tokens, then L2 normalisation (sentence-transformers' Pooling + Normalize).
    let ax2 = b.ints(&[2])?;
    let m3 = b.op("Unsqueeze", &[&maskf, &ax2], vec![]);
    let xm = b.op("Mul", &[&x, &m3], vec![]);
    let ax1 = b.ints(&[1])?;
    let sum = b.op("ReduceSum", &[&xm, &ax1], vec![Attr::int("keepdims", 0)]);
    let count = b.op("ReduceSum", &[&m3, &ax1], vec![Attr::int("keepdims", 0)]);
    let tiny = b.f32s(&[], &[1e-9])?;
    let count = b.op("Max", &[&count, &tiny], vec![]);
    let mean = b.op("Div", &[&sum, &count], vec![]);
    let sq = b.op("Mul", &[&mean, &mean], vec![]);
    let axl = b.ints(&[-1])?;
    let norm = b.op("ReduceSum", &[&sq, &axl], vec![Attr::int("keepdims", 1)]);
    let norm = b.op("Sqrt", &[&norm], vec![]);
    let eps12 = b.f32s(&[], &[1e-12])?;
    let norm = b.op("Max", &[&norm, &eps12], vec![]);
    let emb = b.op("Div", &[&mean, &norm], vec![]);
    b.output(&emb, "sentence_embedding", dtype::FLOAT, &[Dim::Sym("batch_size"), Dim::Fixed(d)]);
    b.finish(&out_dir.join("encoder.onnx"), &config.model_type, &[("stretto.converter", ENCODER_VERSION.to_string())])?;

    let tsrc = src.join("tokenizer.json");
    let mut tok = Tokenizer::from_file(&tsrc).map_err(|e| bad(&tsrc, e.to_string()))?;
    tok.with_padding(None);
    tok.with_truncation(Some(TruncationParams { max_length: config.max_tokens, ..Default::default() }))
        .map_err(|e| bad(&tsrc, e.to_string()))?;
    let tdst = out_dir.join("tokenizer.json");
    tok.save(&tdst, false).map_err(|e| bad(&tdst, e.to_string()))?;
    let cdst = out_dir.join("config.json");
    fs::write(&cdst, serde_json::to_vec_pretty(&config).unwrap_or_default()).map_err(|e| ModelError::io(&cdst, e))?;
    Ok(())
}

/// Paths of a runnable sentence encoder: a converted folder, or a registered Hugging Face export used in place.
#[derive(Debug, Clone)]
pub struct EncoderFiles {
    /// The model's `onnx/` folder.
    pub dir: std::path::PathBuf,
    /// The ONNX model.
    pub model: std::path::PathBuf,
    /// The tokenizer.
    pub tokenizer: std::path::PathBuf,
    /// The encoder's facts.
    pub config: EncoderConfig,
    /// Whether texts must be truncated by the runtime to this many tokens (an export's tokenizer may not truncate);
    /// `None` for converted encoders, whose tokenizer truncates at [`EncoderConfig::max_tokens`].
    pub truncate: Option<usize>,
}

impl EncoderFiles {
    /// Opens a converted (or linked) encoder folder.
    pub fn open(dir: &Path) -> Result<Self> {
        let config = open_encoder(dir)?;
        let (model, tokenizer, truncate) = match crate::export::ExportLink::read(dir)? {
            Some(link) => (link.model_path(), link.tokenizer_path(), Some(link.max_tokens.max(1))),
            None => (dir.join("encoder.onnx"), dir.join("tokenizer.json"), None),
        };
        crate::fsutil::require_files([model.as_path(), tokenizer.as_path()])?;
        Ok(Self { dir: dir.into(), model, tokenizer, config, truncate })
    }
}

/// Reads a converted encoder folder's config, checking the converter version.
pub fn open_encoder(dir: &Path) -> Result<EncoderConfig> {
    let cpath = dir.join("config.json");
    let text = fs::read_to_string(&cpath).map_err(|e| ModelError::io(&cpath, e))?;
    let config: EncoderConfig = serde_json::from_str(&text).map_err(|e| bad(&cpath, e.to_string()))?;
    if config.converter != ENCODER_VERSION {
        return Err(bad(&cpath, format!("written by converter {}, this is {ENCODER_VERSION}", config.converter)));
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_position_buckets_follow_mpnets_function() {
        // Keys before the query (negative offsets) take the first 16 buckets, keys after it the last 16; offsets
        // below 8 are exact, larger ones share log-spaced buckets, and 128 or more the last of each half.
        let cases = [
            (0, 0),
            (-1, 1),
            (1, 17),
            (-7, 7),
            (-8, 8),
            (-16, 10),
            (16, 26),
            (-64, 14),
            (64, 30),
            (-127, 15),
            (-200, 15),
        ];
        for (relative, bucket) in cases {
            assert_eq!(relative_position_bucket(relative, 32), bucket, "offset {relative}");
        }
    }
}
