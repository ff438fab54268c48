//! GGUF → ONNX conversion of decoder-only LLMs (`llama`, `qwen2`), with Hugging Face optimum I/O.
//!
//! The graph takes `input_ids` [b, s], `attention_mask` [b, past + s], `position_ids` [b, s] and
//! `past_key_values.{i}.key|value` [b, kv_heads, past, head_dim], and returns `logits` [b, vocab] of the **last**
//! position only (all a filter or a greedy step needs, and much cheaper than every position), `present.{i}.key|value`
//! [b, kv_heads, past + s, head_dim], and, per layer, the mean `query_mean.{i}` [b, heads, head_dim] and covariance
//! `query_cov.{i}` [b, heads, head_dim, head_dim] of the pre-RoPE queries of the unmasked new tokens, which the
//! Expected Attention press needs. ONNX Runtime only computes the outputs a run asks for.
//!
//! Because positions come from `position_ids` and masking from `attention_mask`, rows with pasts of different
//! lengths can be left-padded and batched. Weights are dequantized to f32: the GGUF's quantized formats have no
//! fast ONNX kernel on CPU. A second, opt-in variant ([`Weights::Int8`]) re-quantizes every linear layer to 8-bit
//! blockwise-symmetric weights run by ONNX Runtime's `MatMulNBits` with int8 compute: about twice as fast per
//! question pass on CPU, with logits that move a little (measured in `bench/results/quant/`), so it is a separate
//! rung of the ladder that the optimizer must certify like any other, never a silent replacement. A third,
//! [`Weights::Int8Dyn`], also quantizes the activations on the fly (`MatMulIntegerToFloat`) everywhere but the
//! feed-forward down-projection: faster again on CPUs with integer dot-product units, its logits move a little more.
//! On x86-64 CPUs without VNNI its weight codes are 7-bit ([`int8_dyn_code_max`]), in a folder of their own.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::gguf::Gguf;
use crate::onnx::{dtype, Attr, Dim, GraphBuilder, MS_DOMAIN};

/// Bumped whenever the converted graph changes, so stale conversions are rebuilt.
pub const CONVERTER_VERSION: u32 = 1;

/// How a converted decoder stores the weights of its linear layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Weights {
    /// The GGUF's weights dequantized to f32 (the reference graph).
    #[default]
    F32,
    /// 8-bit weights, symmetric per block of [`INT8_BLOCK`] inputs, run by `MatMulNBits` with int8 compute.
    Int8,
    /// 8-bit weights with 8-bit activations quantized on the fly: every linear layer but the feed-forward
    /// down-projection as `DynamicQuantizeLinear` + `MatMulIntegerToFloat` (int8 weights, one scale per output
    /// channel; uint8 activations, one scale per tensor, shared by the layers that read the same input), the
    /// down-projection as in [`Weights::Int8`]: its SwiGLU input carries outlier channels that one scale per tensor
    /// loses (`bench/results/quant/w8a8/`). Faster than [`Weights::Int8`] where the CPU has integer dot-product
    /// units, with logits that move a little more.
    #[serde(rename = "int8-dyn")]
    Int8Dyn,
}

/// Inputs per quantization block of [`Weights::Int8`] (the probe's best trade-off, `bench/results/quant/`).
pub const INT8_BLOCK: usize = 128;

impl Weights {
    /// The quantized variants, in a fixed order.
    pub const QUANTIZED: [Self; 2] = [Self::Int8, Self::Int8Dyn];
    /// Every variant, the reference first.
    pub const ALL: [Self; 3] = [Self::F32, Self::Int8, Self::Int8Dyn];

    /// Parses `f32`, `int8` or `int8-dyn`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "f32" => Ok(Self::F32),
            "int8" => Ok(Self::Int8),
            "int8-dyn" => Ok(Self::Int8Dyn),
            other => Err(ModelError::Usage(format!("unknown weights `{other}` (f32, int8, int8-dyn)"))),
        }
    }

    /// The name [`Weights::parse`] reads.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Int8 => "int8",
            Self::Int8Dyn => "int8-dyn",
        }
    }

    /// Every folder a model's conversion with these weights may have: [`Weights::Int8Dyn`]'s codes depend on the
    /// CPU ([`int8_dyn_code_max`]), and each code range has its folder, so a model home carried between machines
    /// never reads codes made for another CPU.
    pub fn folders(self) -> &'static [&'static str] {
        match self {
            Self::F32 => &["onnx"],
            Self::Int8 => &["onnx-int8"],
            Self::Int8Dyn => &["onnx-int8-dyn", "onnx-int8-dyn7"],
        }
    }

    /// The folder of a model's conversion with these weights, on this CPU.
    pub fn folder(self) -> &'static str {
        let folders = self.folders();
        match self {
            Self::Int8Dyn if int8_dyn_code_max() < 127 => folders[1],
            _ => folders[0],
        }
    }
}

/// The largest weight code of [`Weights::Int8Dyn`] on this CPU: 127, or 63 on x86-64 without VNNI. There ONNX
/// Runtime's u8 × s8 kernel (AVX2's `vpmaddubsw`) adds each pair of products in 16 bits with saturation: two
/// products of an activation code of 255 and a weight code of ±127 (64 770) overflow them, and the layer's output
/// goes wrong. With 7-bit codes no pair can (2 × 255 × 63 = 32 130 ≤ 32 767). VNNI's instructions add in 32 bits.
pub fn int8_dyn_code_max() -> i8 {
    #[cfg(target_arch = "x86_64")]
    {
        if !(std::arch::is_x86_feature_detected!("avx512vnni") || std::arch::is_x86_feature_detected!("avxvnni")) {
            return 63;
        }
    }
    127
}

/// The `/proc/cpuinfo` flags that choose ONNX Runtime's integer kernels on x86-64, in the order they are reported.
pub const INT8_KERNEL_FLAGS: [&str; 5] = ["avx2", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8"];

/// The x86-64 features that choose ONNX Runtime's integer kernels on this machine, as Linux names them in
/// `/proc/cpuinfo` (AVX2's 16-bit pair sums, VNNI's exact 32-bit sums, AMX's tiles): what an `int8-dyn` rung's speed
/// and codes ([`int8_dyn_code_max`]) depend on. Empty where the file is missing or lists none of them.
pub fn int8_kernel_features() -> Vec<String> {
    int8_kernel_features_in(&std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default())
}

/// [`int8_kernel_features`] of a `/proc/cpuinfo` text (its first `flags` line).
pub fn int8_kernel_features_in(cpuinfo: &str) -> Vec<String> {
    let flags: Vec<&str> = cpuinfo
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim() == "flags")
        .map_or_else(Vec::new, |(_, v)| v.split_whitespace().collect());
    INT8_KERNEL_FLAGS.into_iter().filter(|f| flags.contains(f)).map(str::to_string).collect()
}

/// Quantizes `[rows][cols]` weights (GGUF's `[out][in]`, which is `MatMulNBits`' layout) to 8 bits per value,
/// symmetric per block of [`INT8_BLOCK`] columns: returns the codes `[rows][blocks][INT8_BLOCK]` (value
/// `round(w / scale) + 128`, the operator's default zero point; padding decodes to 0) and the scales
/// `[rows][blocks]` (`max |w| / 127` of the block).
pub fn quantize_int8_blocks(w: &[f32], rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
    let blocks = cols.div_ceil(INT8_BLOCK);
    let mut codes = vec![128u8; rows * blocks * INT8_BLOCK];
    let mut scales = vec![0f32; rows * blocks];
    for r in 0..rows {
        for b in 0..blocks {
            let lo = r * cols + b * INT8_BLOCK;
            let block = &w[lo..lo + INT8_BLOCK.min(cols - b * INT8_BLOCK)];
            let max = block.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = max / 127.0;
            scales[r * blocks + b] = scale;
            if scale > 0.0 {
                let out = &mut codes[(r * blocks + b) * INT8_BLOCK..];
                for (o, v) in out.iter_mut().zip(block) {
                    *o = ((v / scale).round().clamp(-127.0, 127.0) as i32 + 128) as u8;
                }
            }
        }
    }
    (codes, scales)
}

/// Quantizes `[rows][cols]` weights (GGUF's `[out][in]`) to int8 per output row, symmetric, with codes in
/// `-max_code..=max_code` ([`int8_dyn_code_max`]): returns the codes transposed to `[cols][rows]`
/// (`MatMulIntegerToFloat`'s `[K][N]` layout; value `round(w / scale)`) and the scales `[rows]` (`max |w| / max_code`
/// of the row; 0 for an all-zero row, whose codes are 0).
pub fn quantize_int8_channels(w: &[f32], rows: usize, cols: usize, max_code: i8) -> (Vec<i8>, Vec<f32>) {
    let top = f32::from(max_code.max(1));
    let mut codes = vec![0i8; rows * cols];
    let mut scales = vec![0f32; rows];
    for (r, scale) in scales.iter_mut().enumerate() {
        let row = &w[r * cols..(r + 1) * cols];
        *scale = row.iter().fold(0f32, |m, v| m.max(v.abs())) / top;
        if *scale > 0.0 {
            for (c, v) in row.iter().enumerate() {
                codes[c * rows + r] = (v / *scale).round().clamp(-top, top) as i8;
            }
        }
    }
    (codes, scales)
}

/// The architecture facts a decoder graph and its runtime need; written as `config.json` beside the graph.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DecoderConfig {
    /// `llama` or `qwen2`.
    pub arch: String,
    /// Transformer blocks.
    pub layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention).
    pub kv_heads: usize,
    /// Per-head size.
    pub head_dim: usize,
    /// Feed-forward size.
    pub ffn: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// RoPE base.
    pub rope_base: f64,
    /// RMSNorm epsilon.
    pub eps: f64,
    /// Tokens that end generation.
    pub stop_tokens: Vec<u32>,
    /// The system prompt of the model's chat template (ChatML).
    pub system_prompt: String,
    /// Converter version that wrote the graph.
    pub converter: u32,
    /// How the graph stores its linear weights.
    #[serde(default)]
    pub weights: Weights,
    /// Tokens the model was trained to attend over (GGUF `{arch}.context_length`, Hugging Face
    /// `max_position_embeddings`); `None` where the source does not say. Items are cut to fit it (see
    /// `stretto_kv::decoder::item_token_limit`). Folders converted before it was recorded lack it; opening a
    /// catalog model fills it in from the GGUF ([`crate::prepare::ensure_decoder`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_length: Option<usize>,
    /// For a user's own model, its registration ([`crate::prepare::registration_id`]), filled in when it is opened
    /// and never written: what its KV records and memoised answers are kept under besides its name, so that another
    /// file registered under the same name never reads them. `None` for a catalog model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registration: Option<String>,
}

impl DecoderConfig {
    /// Reads the architecture from GGUF metadata.
    pub fn from_gguf(g: &Gguf, tokenizer: &tokenizers::Tokenizer) -> Result<Self> {
        let arch = g.meta("general.architecture")?.as_str().unwrap_or_default().to_string();
        if arch != "llama" && arch != "qwen2" {
            return Err(ModelError::Format {
                file: "GGUF".into(),
                message: format!("architecture `{arch}` is not supported (llama, qwen2)"),
            });
        }
        let u = |k: &str| -> Result<usize> {
            let key = format!("{arch}.{k}");
            g.meta(&key)?.as_u64().map(|v| v as usize).ok_or_else(|| ModelError::Format {
                file: "GGUF".into(),
                message: format!("`{key}` is not an integer"),
            })
        };
        let f = |k: &str| -> Result<f64> {
            let key = format!("{arch}.{k}");
            g.meta(&key)?
                .as_f64()
                .ok_or_else(|| ModelError::Format { file: "GGUF".into(), message: format!("`{key}` is not a number") })
        };
        let hidden = u("embedding_length")?;
        let heads = u("attention.head_count")?;
        let embed = g.info("token_embd.weight")?;
        let vocab = embed.dims.get(1).copied().unwrap_or(0) as usize;
        let mut stop_tokens = Vec::new();
        if let Some(id) = g.metadata.get("tokenizer.ggml.eos_token_id").and_then(|v| v.as_u64()) {
            stop_tokens.push(id as u32);
        }
        for t in ["<|im_end|>", "<|endoftext|>"] {
            if let Some(id) = tokenizer.token_to_id(t) {
                if !stop_tokens.contains(&id) {
                    stop_tokens.push(id);
                }
            }
        }
        // The one the model's own chat template writes when a conversation has none (SmolLM2's and Qwen2.5's do).
        let template = g.metadata.get("tokenizer.chat_template").and_then(|v| v.as_str());
        let system_prompt = template.and_then(crate::export::default_system_prompt).unwrap_or_else(|| {
            match arch.as_str() {
                "qwen2" => "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
                _ => "You are a helpful assistant.",
            }
            .to_string()
        });
        let context_length = u("context_length").ok().filter(|&n| n > 0);
        let kv_heads = u("attention.head_count_kv")?;
        if heads == 0 || kv_heads == 0 || !hidden.is_multiple_of(heads) || !heads.is_multiple_of(kv_heads) {
            return Err(ModelError::Format {
                file: g.path().display().to_string(),
                message: format!(
                    "{hidden} wide with {heads} attention heads and {kv_heads} KV heads: the heads must divide the \
                     width and the KV heads the heads"
                ),
            });
        }
        Ok(Self {
            layers: u("block_count")?,
            hidden,
            heads,
            kv_heads,
            head_dim: hidden / heads,
            ffn: u("feed_forward_length")?,
            vocab,
            rope_base: f("rope.freq_base").unwrap_or(10000.0),
            eps: f("attention.layer_norm_rms_epsilon")?,
            stop_tokens,
            system_prompt,
            arch,
            converter: CONVERTER_VERSION,
            weights: Weights::F32,
            context_length,
            registration: None,
        })
    }
}

/// Undoes llama.cpp's Q/K permutation: GGUF row `h·hd + 2j + t` is Hugging Face row `h·hd + t·hd/2 + j`.
pub fn unpermute(w: &[f32], n_heads: usize, hd: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; w.len()];
    for h in 0..n_heads {
        for j in 0..hd / 2 {
            for t in 0..2 {
                let src = (h * hd + 2 * j + t) * cols;
                let dst = (h * hd + t * hd / 2 + j) * cols;
                out[dst..dst + cols].copy_from_slice(&w[src..src + cols]);
            }
        }
    }
    out
}

/// `[rows][cols]` → `[cols][rows]`.
fn transpose(w: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; w.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = w[r * cols + c];
        }
    }
    out
}

/// Paths of a converted decoder.
#[derive(Debug, Clone)]
pub struct DecoderFiles {
    /// The folder.
    pub dir: PathBuf,
    /// `decoder.onnx` (or a registered export's model file).
    pub model: PathBuf,
    /// `tokenizer.json` (or a registered export's).
    pub tokenizer: PathBuf,
    /// The architecture.
    pub config: DecoderConfig,
}

impl DecoderFiles {
    /// Opens a converted folder, checking that it was written by this converter version.
    pub fn open(dir: &Path) -> Result<Self> {
        let cpath = dir.join("config.json");
        let text = fs::read_to_string(&cpath).map_err(|e| ModelError::io(&cpath, e))?;
        let config: DecoderConfig = serde_json::from_str(&text)
            .map_err(|e| ModelError::Format { file: cpath.display().to_string(), message: e.to_string() })?;
        if config.converter != CONVERTER_VERSION {
            return Err(ModelError::Format {
                file: cpath.display().to_string(),
                message: format!("written by converter {}, this is {CONVERTER_VERSION}", config.converter),
            });
        }
        // A registered Hugging Face export is used in place: its own model file and tokenizer.
        let (model, tokenizer) = match crate::export::ExportLink::read(dir)? {
            Some(link) => (link.model_path(), link.tokenizer_path()),
            None => (dir.join("decoder.onnx"), dir.join("tokenizer.json")),
        };
        crate::fsutil::require_files([model.as_path(), tokenizer.as_path()])?;
        Ok(Self { model, tokenizer, dir: dir.into(), config })
    }
}

/// Converts `gguf_path` into `out_dir` (created; must not exist): `decoder.onnx` (+ `.data`), `tokenizer.json`,
/// `config.json` (written last: its presence marks a complete conversion).
pub fn convert_gguf(gguf_path: &Path, out_dir: &Path) -> Result<DecoderFiles> {
    convert_gguf_with(gguf_path, out_dir, Weights::F32)
}

/// [`convert_gguf`] with the linear layers' weights stored as `weights` says ([`Weights::Int8Dyn`]'s codes in the
/// range this CPU adds exactly: [`int8_dyn_code_max`]).
pub fn convert_gguf_with(gguf_path: &Path, out_dir: &Path, weights: Weights) -> Result<DecoderFiles> {
    convert_gguf_with_code_max(gguf_path, out_dir, weights, int8_dyn_code_max())
}

/// [`convert_gguf_with`] with [`Weights::Int8Dyn`]'s codes within `±code_max` (127 or 63) whatever the CPU, so that
/// either range can be made and measured anywhere (the other weights ignore it). A range the CPU does not add
/// exactly (127 without VNNI) gives wrong layers there: the model home only ever holds [`int8_dyn_code_max`]'s.
pub fn convert_gguf_with_code_max(
    gguf_path: &Path,
    out_dir: &Path,
    weights: Weights,
    code_max: i8,
) -> Result<DecoderFiles> {
    if code_max < 1 {
        return Err(ModelError::Usage(format!("int8-dyn code range ±{code_max}: 1 to 127 expected")));
    }
    let _span =
        tracing::info_span!("convert_decoder", gguf = %gguf_path.display(), weights = weights.as_str()).entered();
    let g = Gguf::open(gguf_path)?;
    let tokenizer = crate::tokenizer::from_gguf(&g)?;
    let config = DecoderConfig { weights, ..DecoderConfig::from_gguf(&g, &tokenizer)? };
    fs::create_dir_all(out_dir).map_err(|e| ModelError::io(out_dir, e))?;
    let tok_doc = crate::tokenizer::tokenizer_json(&g)?;
    let tpath = out_dir.join("tokenizer.json");
    fs::write(&tpath, serde_json::to_vec(&tok_doc).unwrap_or_default()).map_err(|e| ModelError::io(&tpath, e))?;
    let model = out_dir.join("decoder.onnx");
    build_decoder_graph(&g, &config, code_max, &model)?;
    let cpath = out_dir.join("config.json");
    fs::write(&cpath, serde_json::to_vec_pretty(&config).unwrap_or_default()).map_err(|e| ModelError::io(&cpath, e))?;
    DecoderFiles::open(out_dir)
}

fn build_decoder_graph(g: &Gguf, c: &DecoderConfig, code_max: i8, model_path: &Path) -> Result<()> {
    let (d, h, kv, hd, ffn, vocab) = (c.hidden, c.heads, c.kv_heads, c.head_dim, c.ffn, c.vocab);
    let (d64, h64, kv64, hd64) = (d as i64, h as i64, kv as i64, hd as i64);
    let group = (h / kv) as i64;
    let permuted = c.arch == "llama";
    let data_path = model_path.with_extension("onnx.data");
    let mut b = GraphBuilder::new(&data_path)?;
    let bar = crate::progress::bar(c.layers as u64 + 2, "converting");

    let ids = b.input("input_ids", dtype::INT64, &[Dim::Sym("batch_size"), Dim::Sym("sequence_length")]);
    let mask = b.input("attention_mask", dtype::INT64, &[Dim::Sym("batch_size"), Dim::Sym("total_sequence_length")]);
    let pos = b.input("position_ids", dtype::INT64, &[Dim::Sym("batch_size"), Dim::Sym("sequence_length")]);
    let kv_dims = |len: &'static str| [Dim::Sym("batch_size"), Dim::Fixed(kv64), Dim::Sym(len), Dim::Fixed(hd64)];
    let mut pasts = Vec::new();
    for i in 0..c.layers {
        let k = b.input(&format!("past_key_values.{i}.key"), dtype::FLOAT, &kv_dims("past_sequence_length"));
        let v = b.input(&format!("past_key_values.{i}.value"), dtype::FLOAT, &kv_dims("past_sequence_length"));
        pasts.push((k, v));
    }

    // Dynamic int8: one `DynamicQuantizeLinear` per input tensor, shared by the layers that read it (q/k/v, gate/up).
    // `x · Wᵀ` for GGUF weights W stored as [out = rows][in = cols]: MatMul wants [in][out]; MatMulNBits takes the
    // rows as they are.
    let quantized_inputs: std::cell::RefCell<std::collections::HashMap<String, [String; 3]>> = Default::default();
    let linear = |b: &mut GraphBuilder, x: &str, w: &[f32], name: &str, rows: usize, cols: usize| -> Result<String> {
        let weights = match c.weights {
            Weights::Int8Dyn if name.contains("ffn_down") => Weights::Int8,
            other => other,
        };
        match weights {
            Weights::Int8Dyn => {
                let (codes, scales) = quantize_int8_channels(w, rows, cols, code_max);
                let q = b.i8s(name, &[cols as i64, rows as i64], &codes)?;
                let s = b.weight(&format!("{name}.scales"), &[rows as i64], &scales)?;
                let [xq, xs, xz] = quantized_inputs
                    .borrow_mut()
                    .entry(x.to_string())
                    .or_insert_with(|| b.op_multi("DynamicQuantizeLinear", &[x]))
                    .clone();
                Ok(b.op_in(MS_DOMAIN, "MatMulIntegerToFloat", &[&xq, &q, &xs, &s, &xz], vec![]))
            }
            Weights::F32 => {
                let w = b.weight(name, &[cols as i64, rows as i64], &transpose(w, rows, cols))?;
                Ok(b.op("MatMul", &[x, &w], vec![]))
            }
            Weights::Int8 => {
                let blocks = cols.div_ceil(INT8_BLOCK) as i64;
                let (codes, scales) = quantize_int8_blocks(w, rows, cols);
                let q = b.u8s(name, &[rows as i64, blocks, INT8_BLOCK as i64], &codes)?;
                let s = b.weight(&format!("{name}.scales"), &[rows as i64, blocks], &scales)?;
                let attrs = vec![
                    Attr::int("K", cols as i64),
                    Attr::int("N", rows as i64),
                    Attr::int("bits", 8),
                    Attr::int("block_size", INT8_BLOCK as i64),
                    // int8 compute: what makes 8-bit weights as fast as 4-bit ones on CPU.
                    Attr::int("accuracy_level", 4),
                ];
                Ok(b.op_in(MS_DOMAIN, "MatMulNBits", &[x, &q, &s], attrs))
            }
        }
    };
    let lin = |b: &mut GraphBuilder, x: &str, name: &str, rows: usize, cols: usize, unperm: Option<usize>| {
        let mut w = g.tensor_f32(name)?;
        if w.len() != rows * cols {
            return Err(ModelError::Format {
                file: "GGUF".into(),
                message: format!("{name}: unexpected size {}", w.len()),
            });
        }
        if let Some(n_heads) = unperm {
            w = unpermute(&w, n_heads, hd, cols);
        }
        linear(b, x, &w, name, rows, cols)
    };
    let vec_w = |b: &mut GraphBuilder, name: &str| -> Result<String> {
        let w = g.tensor_f32(name)?;
        b.weight(name, &[w.len() as i64], &w)
    };

    // Shapes and scalars.
    let zero = b.i64s(&[], &[0])?;
    let one = b.i64s(&[], &[1])?;
    let idx1 = b.i64s(&[], &[1])?;
    let ids_shape = b.op("Shape", &[&ids], vec![]);
    let mask_shape = b.op("Shape", &[&mask], vec![]);
    let s_sc = b.op("Gather", &[&ids_shape, &idx1], vec![Attr::int("axis", 0)]);
    let t_sc = b.op("Gather", &[&mask_shape, &idx1], vec![Attr::int("axis", 0)]);
    let p_sc = b.op("Sub", &[&t_sc, &s_sc], vec![]);

    // Causal + padding mask as an additive bias [b, 1, 1, s, T].
    let cols = b.op("Range", &[&zero, &t_sc, &one], vec![]);
    let rows = b.op("Range", &[&p_sc, &t_sc, &one], vec![]);
    let ax1 = b.ints(&[1])?;
    let rows2 = b.op("Unsqueeze", &[&rows, &ax1], vec![]);
    let causal = b.op("LessOrEqual", &[&cols, &rows2], vec![]);
    let pad = b.op("Cast", &[&mask], vec![Attr::int("to", dtype::BOOL as i64)]);
    let pad3 = b.op("Unsqueeze", &[&pad, &ax1], vec![]);
    let allowed = b.op("And", &[&causal, &pad3], vec![]);
    let fzero = b.f32s(&[], &[0.0])?;
    let fneg = b.f32s(&[], &[-1e9])?;
    let bias = b.op("Where", &[&allowed, &fzero, &fneg], vec![]);
    let ax12 = b.ints(&[1, 2])?;
    let bias5 = b.op("Unsqueeze", &[&bias, &ax12], vec![]);

    // Query-statistics weights: the unmasked new tokens, [b, 1, s, 1], and their count.
    let ax0 = b.ints(&[0])?;
    let p1 = b.op("Unsqueeze", &[&p_sc, &ax0], vec![]);
    let t1 = b.op("Unsqueeze", &[&t_sc, &ax0], vec![]);
    let new_mask = b.op("Slice", &[&mask, &p1, &t1, &ax1], vec![]);
    let new_mask = b.op("Cast", &[&new_mask], vec![Attr::int("to", dtype::FLOAT as i64)]);
    let m4_shape = b.ints(&[0, 1, -1, 1])?;
    let m4 = b.op("Reshape", &[&new_mask, &m4_shape], vec![]);
    let ax2 = b.ints(&[2])?;
    let count = b.op("ReduceSum", &[&m4, &ax2], vec![Attr::int("keepdims", 1)]);
    let fone = b.f32s(&[], &[1.0])?;
    let count = b.op("Max", &[&count, &fone], vec![]);
    let ax3 = b.ints(&[3])?;
    let count3 = b.op("Squeeze", &[&count, &ax3], vec![]);

    // RoPE tables (rotate-half convention) from position_ids: [b, 1, s, hd].
    let inv: Vec<f32> = (0..hd / 2).map(|i| c.rope_base.powf(-2.0 * i as f64 / hd as f64) as f32).collect();
    let inv = b.f32s(&[hd64 / 2], &inv)?;
    let posf = b.op("Cast", &[&pos], vec![Attr::int("to", dtype::FLOAT as i64)]);
    let posu = b.op("Unsqueeze", &[&posf, &ax2], vec![]);
    let freqs = b.op("Mul", &[&posu, &inv], vec![]);
    let emb = b.op("Concat", &[&freqs, &freqs], vec![Attr::int("axis", -1)]);
    let cos = b.op("Cos", &[&emb], vec![]);
    let sin = b.op("Sin", &[&emb], vec![]);
    let cos = b.op("Unsqueeze", &[&cos, &ax1], vec![]);
    let sin = b.op("Unsqueeze", &[&sin, &ax1], vec![]);
    let half_a = b.ints(&[0])?;
    let half_b = b.ints(&[hd64 / 2])?;
    let half_c = b.ints(&[hd64])?;
    let last_ax = b.ints(&[-1])?;
    let rope = |b: &mut GraphBuilder, x: &str| -> String {
        let x1 = b.op("Slice", &[x, &half_a, &half_b, &last_ax], vec![]);
        let x2 = b.op("Slice", &[x, &half_b, &half_c, &last_ax], vec![]);
        let nx2 = b.op("Neg", &[&x2], vec![]);
        let rot = b.op("Concat", &[&nx2, &x1], vec![Attr::int("axis", -1)]);
        let a = b.op("Mul", &[x, &cos], vec![]);
        let r = b.op("Mul", &[&rot, &sin], vec![]);
        b.op("Add", &[&a, &r], vec![])
    };

    let eps = b.f32s(&[], &[c.eps as f32])?;
    let two = b.f32s(&[], &[2.0])?;
    let rmsnorm = |b: &mut GraphBuilder, x: &str, w: &str| -> String {
        let sq = b.op("Pow", &[x, &two], vec![]);
        let ms = b.op("ReduceMean", &[&sq], vec![Attr::ints("axes", &[-1]), Attr::int("keepdims", 1)]);
        let ms = b.op("Add", &[&ms, &eps], vec![]);
        let rs = b.op("Sqrt", &[&ms], vec![]);
        let y = b.op("Div", &[x, &rs], vec![]);
        b.op("Mul", &[&y, w], vec![])
    };

    let embed = g.tensor_f32("token_embd.weight")?;
    if embed.len() != vocab * d {
        return Err(ModelError::Format {
            file: "GGUF".into(),
            message: "token_embd.weight has an unexpected size".into(),
        });
    }
    let embed_w = b.weight("token_embd", &[vocab as i64, d64], &embed)?;
    bar.inc(1);
    let mut x = b.op("Gather", &[&embed_w, &ids], vec![Attr::int("axis", 0)]);

    let heads_shape = b.ints(&[0, 0, h64, hd64])?;
    let kv_shape = b.ints(&[0, 0, kv64, hd64])?;
    let q5_shape = b.ints(&[0, kv64, group, -1, hd64])?;
    let merge_shape = b.ints(&[0, h64, -1, hd64])?;
    let hidden_shape = b.ints(&[0, 0, d64])?;
    let scale = b.f32s(&[], &[1.0 / (hd as f32).sqrt()])?;
    let perm_heads = Attr::ints("perm", &[0, 2, 1, 3]);

    let mut outputs = Vec::new();
    for (i, (past_k, past_v)) in pasts.iter().enumerate() {
        let p = |n: &str| format!("blk.{i}.{n}");
        let attn_norm = vec_w(&mut b, &p("attn_norm.weight"))?;
        let hn = rmsnorm(&mut b, &x, &attn_norm);
        let project = |b: &mut GraphBuilder, rows: usize, unperm: Option<usize>, what: &str| {
            let y = lin(b, &hn, &p(&format!("{what}.weight")), rows, d, unperm)?;
            let bias_name = p(&format!("{what}.bias"));
            if g.tensors.contains_key(&bias_name) {
                let bw = vec_w(b, &bias_name)?;
                Ok::<_, ModelError>(b.op("Add", &[&y, &bw], vec![]))
            } else {
                Ok(y)
            }
        };
        let q = project(&mut b, d, permuted.then_some(h), "attn_q")?;
        let k = project(&mut b, kv * hd, permuted.then_some(kv), "attn_k")?;
        let v = project(&mut b, kv * hd, None, "attn_v")?;
        let q = b.op("Reshape", &[&q, &heads_shape], vec![]);
        let q = b.op("Transpose", &[&q], vec![perm_heads.clone()]);
        let k = b.op("Reshape", &[&k, &kv_shape], vec![]);
        let k = b.op("Transpose", &[&k], vec![perm_heads.clone()]);
        let v = b.op("Reshape", &[&v, &kv_shape], vec![]);
        let v = b.op("Transpose", &[&v], vec![perm_heads.clone()]);

        // Pre-RoPE query statistics over the unmasked new tokens.
        let qm = b.op("Mul", &[&q, &m4], vec![]);
        let qsum = b.op("ReduceSum", &[&qm, &ax2], vec![Attr::int("keepdims", 0)]);
        let qmean = b.op("Div", &[&qsum, &count3], vec![]);
        let qmt = b.op("Transpose", &[&qm], vec![Attr::ints("perm", &[0, 1, 3, 2])]);
        let second = b.op("MatMul", &[&qmt, &q], vec![]);
        let second = b.op("Div", &[&second, &count], vec![]);
        let mcol = b.op("Unsqueeze", &[&qmean, &ax3], vec![]);
        let mrow = b.op("Unsqueeze", &[&qmean, &ax2], vec![]);
        let outer = b.op("Mul", &[&mcol, &mrow], vec![]);
        let qcov = b.op("Sub", &[&second, &outer], vec![]);
        outputs.push((qmean, format!("query_mean.{i}"), qcov, format!("query_cov.{i}")));

        let q = rope(&mut b, &q);
        let k = rope(&mut b, &k);
        let k_all = b.op("Concat", &[past_k, &k], vec![Attr::int("axis", 2)]);
        let v_all = b.op("Concat", &[past_v, &v], vec![Attr::int("axis", 2)]);
        b.output(&k_all, &format!("present.{i}.key"), dtype::FLOAT, &kv_dims("total_sequence_length"));
        b.output(&v_all, &format!("present.{i}.value"), dtype::FLOAT, &kv_dims("total_sequence_length"));

        // Grouped-query attention without repeating K/V: queries as [b, kv, group, s, hd].
        let qs = b.op("Mul", &[&q, &scale], vec![]);
        let q5 = b.op("Reshape", &[&qs, &q5_shape], vec![]);
        let k5 = b.op("Unsqueeze", &[&k_all, &ax2], vec![]);
        let k5t = b.op("Transpose", &[&k5], vec![Attr::ints("perm", &[0, 1, 2, 4, 3])]);
        let scores = b.op("MatMul", &[&q5, &k5t], vec![]);
        let scores = b.op("Add", &[&scores, &bias5], vec![]);
        let probs = b.op("Softmax", &[&scores], vec![Attr::int("axis", -1)]);
        let v5 = b.op("Unsqueeze", &[&v_all, &ax2], vec![]);
        let ctx = b.op("MatMul", &[&probs, &v5], vec![]);
        let ctx = b.op("Reshape", &[&ctx, &merge_shape], vec![]);
        let ctx = b.op("Transpose", &[&ctx], vec![perm_heads.clone()]);
        let ctx = b.op("Reshape", &[&ctx, &hidden_shape], vec![]);
        let o = lin(&mut b, &ctx, &p("attn_output.weight"), d, d, None)?;
        x = b.op("Add", &[&x, &o], vec![]);

        let ffn_norm = vec_w(&mut b, &p("ffn_norm.weight"))?;
        let hn = rmsnorm(&mut b, &x, &ffn_norm);
        let gate = lin(&mut b, &hn, &p("ffn_gate.weight"), ffn, d, None)?;
        let sig = b.op("Sigmoid", &[&gate], vec![]);
        let act = b.op("Mul", &[&gate, &sig], vec![]);
        let up = lin(&mut b, &hn, &p("ffn_up.weight"), ffn, d, None)?;
        let act = b.op("Mul", &[&act, &up], vec![]);
        let down = lin(&mut b, &act, &p("ffn_down.weight"), d, ffn, None)?;
        x = b.op("Add", &[&x, &down], vec![]);
        bar.inc(1);
    }

    let out_norm = vec_w(&mut b, "output_norm.weight")?;
    let last_idx = b.i64s(&[], &[-1])?;
    let last = b.op("Gather", &[&x, &last_idx], vec![Attr::int("axis", 1)]);
    let last = rmsnorm(&mut b, &last, &out_norm);
    let logits = if g.tensors.contains_key("output.weight") {
        lin(&mut b, &last, "output.weight", vocab, d, None)?
    } else {
        linear(&mut b, &last, &embed, "lm_head", vocab, d)?
    };
    drop(embed);
    b.output(&logits, "logits", dtype::FLOAT, &[Dim::Sym("batch_size"), Dim::Fixed(vocab as i64)]);
    for (qmean, qm_name, qcov, qc_name) in outputs {
        b.output(&qmean, &qm_name, dtype::FLOAT, &[Dim::Sym("batch_size"), Dim::Fixed(h64), Dim::Fixed(hd64)]);
        b.output(
            &qcov,
            &qc_name,
            dtype::FLOAT,
            &[Dim::Sym("batch_size"), Dim::Fixed(h64), Dim::Fixed(hd64), Dim::Fixed(hd64)],
        );
    }
    b.finish(model_path, &c.arch, &[("stretto.converter", CONVERTER_VERSION.to_string())])?;
    bar.finish_and_clear();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int8_kernel_features_are_read_from_the_first_flags_line() {
        let info = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512bw avx512_vnni sha_ni\nbugs\t\t: spectre\n\
                    processor\t: 1\nflags\t\t: amx_int8\n";
        assert_eq!(int8_kernel_features_in(info), ["avx2", "avx512bw", "avx512_vnni"]);
        // "flags" must be the key, not the end of another ("vmx flags" on Intel lists other names).
        assert!(int8_kernel_features_in("vmx flags\t: avx2 amx_int8\n").is_empty());
        assert!(int8_kernel_features_in("").is_empty());
    }

    /// Decodes [`quantize_int8_blocks`]' output the way `MatMulNBits` does: `(code − 128) · scale`.
    fn dequantize(codes: &[u8], scales: &[f32], rows: usize, cols: usize) -> Vec<f32> {
        let blocks = cols.div_ceil(INT8_BLOCK);
        let mut out = vec![0f32; rows * cols];
        for r in 0..rows {
            for c in 0..cols {
                let (b, j) = (c / INT8_BLOCK, c % INT8_BLOCK);
                let code = codes[(r * blocks + b) * INT8_BLOCK + j];
                out[r * cols + c] = (code as f32 - 128.0) * scales[r * blocks + b];
            }
        }
        out
    }

    #[test]
    fn int8_blocks_round_trip_within_half_a_step_and_pad_with_zeros() {
        // 3 rows of 200 inputs: one full block and one padded; a zero row; a row with one large outlier per block.
        let (rows, cols) = (3, 200);
        let mut w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
        w[cols..2 * cols].fill(0.0);
        w[2 * cols + 5] = 8.0;
        w[2 * cols + 150] = -3.0;
        let (codes, scales) = quantize_int8_blocks(&w, rows, cols);
        assert_eq!(codes.len(), rows * 2 * INT8_BLOCK);
        assert_eq!(scales.len(), rows * 2);
        assert_eq!(scales[2], 0.0, "an all-zero block has scale 0");
        assert!((scales[4] - 8.0 / 127.0).abs() < 1e-7 && (scales[5] - 3.0 / 127.0).abs() < 1e-7);
        let back = dequantize(&codes, &scales, rows, cols);
        for r in 0..rows {
            for c in 0..cols {
                let step = scales[r * 2 + c / INT8_BLOCK];
                let (a, b) = (w[r * cols + c], back[r * cols + c]);
                assert!((a - b).abs() <= step / 2.0 + 1e-6, "row {r} col {c}: {a} became {b} (step {step})");
            }
        }
        assert_eq!(back[2 * cols + 5], 8.0, "the block's largest value is exact");
        // The padding of the second block (inputs 200..256) decodes to 0, whatever the scale.
        for r in 0..rows {
            assert!(codes[(r * 2 + 1) * INT8_BLOCK + 72..(r * 2 + 2) * INT8_BLOCK].iter().all(|&c| c == 128));
        }
    }

    #[test]
    fn int8_channels_transpose_to_k_by_n_within_half_a_step() {
        // 2 output rows of 3 inputs, and an all-zero row.
        let w = [0.5, -1.27, 0.01, 0.0, 0.0, 0.0, 2.0, 0.5, -2.0];
        let (codes, scales) = quantize_int8_channels(&w, 3, 3, 127);
        assert_eq!(scales, vec![1.27 / 127.0, 0.0, 2.0 / 127.0]);
        // [K][N]: input c of output r at c * rows + r.
        assert_eq!(codes, vec![50, 0, 127, -127, 0, 32, 1, 0, -127]);
        for r in 0..3 {
            for c in 0..3 {
                let back = codes[c * 3 + r] as f32 * scales[r];
                assert!((back - w[r * 3 + c]).abs() <= scales[r] / 2.0 + 1e-6, "({r}, {c}): {back}");
            }
        }
        // 7-bit codes (x86-64 without VNNI): every code within ±63, each pair of u8 × s8 products within i16.
        let (codes, scales) = quantize_int8_channels(&w, 3, 3, 63);
        assert_eq!(scales, vec![1.27 / 63.0, 0.0, 2.0 / 63.0]);
        assert_eq!(codes, vec![25, 0, 63, -63, 0, 16, 0, 0, -63]);
        assert!(codes.iter().all(|&c| 2 * 255 * i32::from(c).abs() <= i32::from(i16::MAX)));
    }

    #[test]
    fn weights_parse_and_name_their_folder() {
        assert_eq!(Weights::parse("int8").unwrap(), Weights::Int8);
        assert_eq!(Weights::parse("int8-dyn").unwrap(), Weights::Int8Dyn);
        assert_eq!(Weights::parse("f32").unwrap().folder(), "onnx");
        assert_eq!(Weights::Int8.folder(), "onnx-int8");
        for w in Weights::ALL {
            assert_eq!(Weights::parse(w.as_str()).unwrap(), w);
        }
        assert_eq!(Weights::QUANTIZED[..], Weights::ALL[1..], "every variant but the f32 reference");
        // int8-dyn's folder follows the code range this CPU reads; both are among its folders.
        let dyn_folder = if int8_dyn_code_max() == 127 { "onnx-int8-dyn" } else { "onnx-int8-dyn7" };
        assert_eq!(Weights::Int8Dyn.folder(), dyn_folder);
        assert_eq!(Weights::Int8Dyn.folders(), ["onnx-int8-dyn", "onnx-int8-dyn7"]);
        for w in Weights::ALL {
            assert!(w.folders().contains(&w.folder()), "{w:?}");
        }
        assert_eq!(serde_json::to_string(&Weights::Int8Dyn).unwrap(), "\"int8-dyn\"");
        assert!(Weights::parse("int4").unwrap_err().to_string().contains("f32, int8, int8-dyn"));
        // Configs written before the field existed are f32 graphs.
        let old = r#"{"arch":"llama","layers":1,"hidden":8,"heads":2,"kv_heads":1,"head_dim":4,"ffn":16,"vocab":10,
            "rope_base":10000.0,"eps":1e-5,"stop_tokens":[2],"system_prompt":"s","converter":1}"#;
        assert_eq!(serde_json::from_str::<DecoderConfig>(old).unwrap().weights, Weights::F32);
    }
}
