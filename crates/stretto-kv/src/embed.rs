//! Sentence embeddings on ONNX Runtime: a BERT encoder converted by [`stretto_models::bert`] (whose graph returns
//! unit-length `sentence_embedding`s) or a user's Hugging Face export ([`stretto_models::export`], whose
//! `last_hidden_state` is mean-pooled over the real tokens here, as sentence-transformers does). Embeddings come out
//! unit length either way, so the cosine similarity of two texts is the dot product of their embeddings.

use std::path::Path;
use std::sync::Mutex;

use ort::session::Session;
use ort::value::Tensor;
pub use stretto_models::bert::MAX_TOKENS;
use stretto_models::bert::{EncoderConfig, EncoderFiles};
use tokenizers::Tokenizer;
use tokenizers::TruncationParams;

use crate::error::{KvError, Result};
use crate::runtime::RuntimeOptions;

fn bad(file: &Path, message: impl Into<String>) -> KvError {
    KvError::Format { file: file.display().to_string(), message: message.into() }
}

/// A sentence embedder on ONNX Runtime.
pub struct Embedder {
    config: EncoderConfig,
    tokenizer: Tokenizer,
    session: Mutex<Session>,
    /// What the graph returns: a pooled `sentence_embedding`, or `last_hidden_state` to pool here.
    pooled: bool,
    /// The graph takes `token_type_ids` (all zeros: one segment).
    token_types: bool,
    /// Outputs are scaled to unit length here (an export's); a converted graph normalises inside.
    normalize: bool,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder").field("config", &self.config).finish()
    }
}

/// Cosine similarity of two vectors.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na * nb)
    }
}

impl Embedder {
    /// Loads catalog model `name` (`minilm`) from `home`, preparing and converting it first if needed, or the
    /// encoder export a user registered as `name`.
    pub fn load(home: &Path, name: &str, options: impl Into<RuntimeOptions>) -> Result<Self> {
        let files = crate::prepare::ensure_encoder(home, name)?;
        Self::from_files(home, name, &files, options)
    }

    /// Loads an encoder folder (ONNX Runtime's library comes from `home`).
    pub fn from_files(
        home: &Path,
        name: &str,
        files: &EncoderFiles,
        options: impl Into<RuntimeOptions>,
    ) -> Result<Self> {
        let _span = tracing::info_span!("load_encoder", model = name).entered();
        let session = crate::runtime::load_session(home, options, &files.model)?;
        let mut tokenizer = Tokenizer::from_file(&files.tokenizer).map_err(|e| bad(&files.tokenizer, e.to_string()))?;
        if let Some(max_length) = files.truncate {
            // An export's tokenizer may pad to a fixed length or not truncate: batches are padded here, and texts
            // longer than the position table are cut to fit it.
            tokenizer.with_padding(None);
            tokenizer
                .with_truncation(Some(TruncationParams { max_length, ..Default::default() }))
                .map_err(|e| bad(&files.tokenizer, e.to_string()))?;
        }
        let has_input = |n: &str| session.inputs().iter().any(|o| o.name() == n);
        let has_output = |n: &str| session.outputs().iter().any(|o| o.name() == n);
        if !has_input("input_ids") || !has_input("attention_mask") {
            return Err(bad(&files.model, "a sentence encoder takes `input_ids` and `attention_mask`"));
        }
        let pooled = has_output("sentence_embedding");
        if !pooled && !has_output("last_hidden_state") {
            return Err(bad(&files.model, "no `sentence_embedding` or `last_hidden_state` output"));
        }
        let token_types = has_input("token_type_ids");
        let normalize = files.truncate.is_some() || !pooled;
        Ok(Self {
            config: files.config.clone(),
            tokenizer,
            session: Mutex::new(session),
            pooled,
            token_types,
            normalize,
        })
    }

    /// Embedding size.
    pub fn dim(&self) -> usize {
        self.config.hidden_size
    }

    /// Unit-length embeddings of `texts`, `batch` at a time (texts are truncated to the encoder's
    /// [`max_tokens`](EncoderConfig::max_tokens)).
    pub fn embed(&self, texts: &[&str], batch: usize) -> Result<Vec<Vec<f32>>> {
        let _span = tracing::info_span!("embed", texts = texts.len()).entered();
        let mut out = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(batch.max(1)) {
            let encs = self
                .tokenizer
                .encode_batch(chunk.to_vec(), true)
                .map_err(|e| KvError::Runtime(format!("tokenizer: {e}")))?;
            let b = encs.len();
            let s = encs.iter().map(|e| e.get_ids().len()).max().unwrap_or(0).max(1);
            let mut ids = vec![0i64; b * s];
            let mut mask = vec![0i64; b * s];
            for (r, e) in encs.iter().enumerate() {
                for (k, &t) in e.get_ids().iter().enumerate() {
                    ids[r * s + k] = t as i64;
                    mask[r * s + k] = 1;
                }
            }
            let mut inputs = ort::inputs![
                "input_ids" => Tensor::from_array((vec![b, s], ids))?,
                "attention_mask" => Tensor::from_array((vec![b, s], mask.clone()))?,
            ];
            if self.token_types {
                inputs.push(("token_type_ids".into(), Tensor::from_array((vec![b, s], vec![0i64; b * s]))?.into()));
            }
            let mut session = self.session.lock().map_err(|_| KvError::Runtime("encoder session poisoned".into()))?;
            let outputs = session.run(inputs)?;
            let d = self.config.hidden_size;
            let name = if self.pooled { "sentence_embedding" } else { "last_hidden_state" };
            let (_, data) = outputs[name].try_extract_tensor::<f32>()?;
            let per_row = if self.pooled { d } else { s * d };
            if data.len() != b * per_row {
                return Err(KvError::Runtime(format!(
                    "`{name}` holds {} values for {b} texts of {s} tokens and hidden size {d}",
                    data.len()
                )));
            }
            for r in 0..b {
                let row = &data[r * per_row..(r + 1) * per_row];
                let v = if self.pooled { row.to_vec() } else { mean_pool(row, &mask[r * s..(r + 1) * s], d) };
                out.push(if self.normalize { normalized(v) } else { v });
            }
        }
        Ok(out)
    }
}

/// The mean of the hidden states `[s][d]` over the tokens whose mask is 1.
fn mean_pool(hidden: &[f32], mask: &[i64], d: usize) -> Vec<f32> {
    let mut sum = vec![0f32; d];
    let mut n = 0f32;
    for (t, &m) in mask.iter().enumerate() {
        if m == 1 {
            for (acc, x) in sum.iter_mut().zip(&hidden[t * d..(t + 1) * d]) {
                *acc += x;
            }
            n += 1.0;
        }
    }
    sum.iter_mut().for_each(|x| *x /= n.max(1.0));
    sum
}

/// `v` scaled to unit length (a zero vector stays zero).
fn normalized(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}
