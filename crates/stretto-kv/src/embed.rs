//! Sentence embeddings on ONNX Runtime: a BERT encoder converted by [`stretto_models::bert`], whose graph returns
//! unit-length `sentence_embedding`s, so the cosine similarity of two texts is the dot product of their embeddings.

use std::path::Path;
use std::sync::Mutex;

use ort::session::Session;
use ort::value::Tensor;
pub use stretto_models::bert::MAX_TOKENS;
use stretto_models::bert::{open_encoder, EncoderConfig};
use tokenizers::Tokenizer;

use crate::error::{KvError, Result};

fn bad(file: &Path, message: impl Into<String>) -> KvError {
    KvError::Format { file: file.display().to_string(), message: message.into() }
}

/// A sentence embedder on ONNX Runtime.
pub struct Embedder {
    config: EncoderConfig,
    tokenizer: Tokenizer,
    session: Mutex<Session>,
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
    /// Loads catalog model `name` (`minilm`) from `home`, preparing and converting it first if needed.
    pub fn load(home: &Path, name: &str, threads: usize) -> Result<Self> {
        let dir = crate::prepare::ensure_encoder(home, name)?;
        let _span = tracing::info_span!("load_encoder", model = name).entered();
        let config = open_encoder(&dir)?;
        let mut builder = crate::runtime::session_builder(home, threads)?;
        let model = dir.join("encoder.onnx");
        let session = builder
            .commit_from_file(&model)
            .map_err(|e| KvError::Runtime(format!("cannot load {}: {e}", model.display())))?;
        let tpath = dir.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&tpath).map_err(|e| bad(&tpath, e.to_string()))?;
        Ok(Self { config, tokenizer, session: Mutex::new(session) })
    }

    /// Embedding size.
    pub fn dim(&self) -> usize {
        self.config.hidden_size
    }

    /// Unit-length embeddings of `texts`, `batch` at a time (texts are truncated to [`MAX_TOKENS`] tokens).
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
            let inputs = ort::inputs![
                "input_ids" => Tensor::from_array((vec![b, s], ids))?,
                "attention_mask" => Tensor::from_array((vec![b, s], mask))?,
            ];
            let mut session = self.session.lock().map_err(|_| KvError::Runtime("encoder session poisoned".into()))?;
            let outputs = session.run(inputs)?;
            let (_, emb) = outputs["sentence_embedding"].try_extract_tensor::<f32>()?;
            let d = self.config.hidden_size;
            out.extend((0..b).map(|r| emb[r * d..(r + 1) * d].to_vec()));
        }
        Ok(out)
    }
}
