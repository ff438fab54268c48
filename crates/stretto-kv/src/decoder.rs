//! The decoder runtime: a converted LLM on ONNX Runtime, run over cached KV pasts.
//!
//! A [`KvPast`] holds one item's keys and values (what the offline prefill computed). [`Decoder::run`] takes a batch
//! of (past, new tokens) rows of any lengths: pasts are left-padded to the longest, new tokens are left-padded too,
//! padding is masked out and every row keeps its own position ids, so a batch gives each row exactly what it would
//! get alone. On top of it: [`Decoder::log_odds`] (filters: log-odds of one answer token over another after a
//! question) and [`Decoder::generate`] (maps: greedy decoding with a per-answer confidence).

use std::path::Path;
use std::sync::Mutex;

use ort::session::{RunOptions, Session, SessionInputValue};
use ort::value::{Tensor, TensorRef};
use tokenizers::Tokenizer;

use crate::convert::{DecoderConfig, DecoderFiles};
use crate::error::{KvError, Result};
use crate::runtime::RuntimeOptions;

/// One item's cached keys and values, per layer `[kv_heads][len][head_dim]`, contiguous.
#[derive(Debug, Clone, PartialEq)]
pub struct KvPast {
    /// Keys per layer.
    pub keys: Vec<Vec<f32>>,
    /// Values per layer.
    pub values: Vec<Vec<f32>>,
    /// Cached tokens kept (after compression, fewer than were prefilled).
    pub len: usize,
    /// Position id of the next token: the prefilled length, whatever compression kept (kept keys keep their
    /// original positions).
    pub next_position: i64,
    /// KV heads.
    pub kv_heads: usize,
    /// Per-head size.
    pub head_dim: usize,
}

impl KvPast {
    /// An empty past for a model.
    pub fn empty(config: &DecoderConfig) -> Self {
        Self {
            keys: vec![Vec::new(); config.layers],
            values: vec![Vec::new(); config.layers],
            len: 0,
            next_position: 0,
            kv_heads: config.kv_heads,
            head_dim: config.head_dim,
        }
    }

    /// Bytes of the cached tensors in f32.
    pub fn bytes(&self) -> usize {
        self.keys.iter().chain(&self.values).map(|v| v.len() * 4).sum()
    }

    fn check(&self, config: &DecoderConfig) -> Result<()> {
        let per_layer = self.kv_heads * self.len * self.head_dim;
        let ok = self.keys.len() == config.layers
            && self.values.len() == config.layers
            && self.kv_heads == config.kv_heads
            && self.head_dim == config.head_dim
            && self.keys.iter().chain(&self.values).all(|v| v.len() == per_layer);
        if ok {
            Ok(())
        } else {
            Err(KvError::Runtime(format!(
                "a KV past does not fit this model ({} layers of {}×{}×{} expected)",
                config.layers, config.kv_heads, self.len, config.head_dim
            )))
        }
    }
}

/// Per-layer mean `[heads][head_dim]` and covariance `[heads][head_dim][head_dim]` of an item's pre-RoPE queries.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryStats {
    /// Means per layer.
    pub mean: Vec<Vec<f32>>,
    /// Covariances per layer.
    pub cov: Vec<Vec<f32>>,
}

/// One row of a batch: new tokens after an optional cached past.
#[derive(Debug, Clone, Copy)]
pub struct Step<'a> {
    /// The cached past, if any.
    pub past: Option<&'a KvPast>,
    /// New tokens (at least one).
    pub tokens: &'a [u32],
}

/// What a run should return besides the last logits.
#[derive(Debug, Clone, Copy, Default)]
pub struct Want {
    /// The extended past (past + new tokens).
    pub present: bool,
    /// Query statistics of the new tokens.
    pub query_stats: bool,
}

/// One row's result.
#[derive(Debug, Clone)]
pub struct StepOutput {
    /// Logits of the last new token.
    pub logits: Vec<f32>,
    /// The extended past, when asked for.
    pub present: Option<KvPast>,
    /// Query statistics, when asked for.
    pub query_stats: Option<QueryStats>,
}

/// A greedy generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Decoded text (special tokens removed).
    pub text: String,
    /// Generated token ids (without the stop token).
    pub tokens: Vec<u32>,
    /// Probability of the whole answer under the model (product of the chosen tokens' probabilities, the stop
    /// token included when it was reached).
    pub confidence: f64,
    /// Whether a stop token ended it (or, in [`Decoder::generate_line`], the end of its first line) rather than the
    /// token limit.
    pub stopped: bool,
}

/// A converted decoder on ONNX Runtime.
pub struct Decoder {
    name: String,
    config: DecoderConfig,
    tokenizer: Tokenizer,
    session: Mutex<Session>,
    graph: GraphShape,
}

/// How a decoder graph differs from Stretto's converted one (a Hugging Face export, see
/// [`stretto_models::export`]), read from the session's declared inputs and outputs.
#[derive(Debug, Clone, Copy)]
struct GraphShape {
    /// `logits` is `[batch, seq, vocab]` (every position) rather than `[batch, vocab]` (the last one).
    logits_per_position: bool,
    /// The graph returns `query_mean.{l}`/`query_cov.{l}`.
    query_stats: bool,
    /// A merged export's `use_cache_branch` input, set to true.
    cache_branch: bool,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder").field("name", &self.name).field("config", &self.config).finish()
    }
}

/// The cached part of an item's prompt for a model (see [`Decoder::item_prefix`]); needs only the model's config,
/// so caches can be checked without loading the model.
pub fn item_prefix(config: &DecoderConfig, item: &str) -> String {
    format!("<|im_start|>system\n{}<|im_end|>\n<|im_start|>user\n{item}", config.system_prompt)
}

/// What the KV records of an item whose cached prefix is `prefix` ([`item_prefix`]) are found by
/// ([`crate::store::RecordMeta::source_sha256`]): the prefix's SHA-256, and for a user's own model its registration's
/// too ([`DecoderConfig::registration`]), so another file registered under the same name never reads the records of
/// the one before. A catalog model's is the prefix's digest alone, as records have always been keyed.
pub fn item_source(config: &DecoderConfig, prefix: &str) -> String {
    match &config.registration {
        None => crate::store::sha256_text(prefix),
        Some(r) => crate::store::sha256_text(&format!("{prefix}\u{0}registration:{r}")),
    }
}

/// Tokens of a model's context kept free after an item's prefix for the question, the answer prefix and the answer
/// (a map answer takes 12 tokens by default; instructions are a few dozen).
pub const ANSWER_RESERVE: usize = 512;

/// The most tokens of an item's prefix ([`item_prefix`]) a model is given: its context length less
/// [`ANSWER_RESERVE`] (at least half the context); `None` where the model's config does not say its context length.
///
/// A longer item is cut to its first tokens ([`Decoder::encode_item`]): beyond its context a model attends at
/// positions it never saw in training, and the item's cache grows with every token (SmolLM2-135M: 45 KB a token,
/// 8,192 tokens of context; the bundled emails reach some 13,000 tokens).
pub fn item_token_limit(config: &DecoderConfig) -> Option<usize> {
    config.context_length.map(|n| n.saturating_sub(ANSWER_RESERVE).max(n / 2).max(1))
}

/// `tokens` to run after a past that ends at position `start`, cut to fit `config`'s context: where they would
/// run past it, their middle goes, keeping the head that fits and their last `tail` tokens (the question and the
/// answer's opening, which must stay whole). Unchanged where they fit or the context is unknown; never cut below
/// the tail (the model's context is then exceeded rather than the question lost).
pub fn fit_after(config: &DecoderConfig, start: usize, tokens: Vec<u32>, tail: usize) -> Vec<u32> {
    let Some(context) = config.context_length else { return tokens };
    if start + tokens.len() <= context {
        return tokens;
    }
    let tail = tail.min(tokens.len());
    let head = context.saturating_sub(start + tail).min(tokens.len() - tail);
    let mut out = tokens[..head].to_vec();
    out.extend_from_slice(&tokens[tokens.len() - tail..]);
    out
}

/// The fewest prefix tokens a memory budget cuts an item to ([`item_memory_limit`]): a budget too small for them
/// is exceeded rather than an item read by its first few sentences.
pub const MIN_ITEM_TOKENS: usize = 1024;

/// The most prefix tokens of an item that a prefill within `memory_budget` bytes can hold, at least
/// [`MIN_ITEM_TOKENS`]: the length at which even the smallest chunk's working memory ([`prefill_chunk`]'s estimate:
/// the item's cache three times over and one chunk's attention and activations) fills the budget. A longer item's
/// cache alone would take the process past its budget whatever the chunk (Qwen2.5-Coder-0.5B's f32 cache of the
/// longest bundled email, 26,089 tokens, is 641 MB, held three times over while it is prefilled).
pub fn item_memory_limit(config: &DecoderConfig, memory_budget: u64) -> usize {
    let kv_per_token = (config.layers * 2 * config.kv_heads * config.head_dim * 4) as u64;
    let per_token = 3 * kv_per_token + (12 * config.heads * MIN_PREFILL_CHUNK) as u64;
    let chunk = (MIN_PREFILL_CHUNK * 4 * (3 * config.ffn + 6 * config.hidden)) as u64;
    ((memory_budget.saturating_sub(chunk) / per_token.max(1)) as usize).max(MIN_ITEM_TOKENS)
}

/// The most prefix tokens of an item its caches hold under `memory_budget`: the smaller of the model's
/// [`item_token_limit`] and the budget's [`item_memory_limit`].
pub fn item_limit(config: &DecoderConfig, memory_budget: u64) -> usize {
    let memory = item_memory_limit(config, memory_budget);
    item_token_limit(config).map_or(memory, |context| context.min(memory))
}

/// Whether a cache of `tokens` prefix tokens was made within [`item_limit`] under `memory_budget`: caches made
/// before items were cut, or under a larger budget, may hold more, and are made again.
pub fn within_item_limit(config: &DecoderConfig, memory_budget: u64, tokens: usize) -> bool {
    tokens <= item_limit(config, memory_budget)
}

/// Working memory one prefill may take by default ([`Decoder::prefill`]): 1 GiB.
pub const DEFAULT_MEMORY_BUDGET: u64 = 1 << 30;

/// The smallest prefill chunk: below it, per-run overhead (the past copied in and out) dominates. An item whose
/// cache alone is larger than the budget is prefilled in chunks of this size.
pub const MIN_PREFILL_CHUNK: usize = 128;

/// The largest prefill chunk. Chunks are faster than one whole run as well as smaller: on 2 CPU cores (debug build
/// of `examples/prefill_memory.rs`), a 2,534-token email prefilled by SmolLM2-135M in 8.8 s whole and 3.3 s in
/// chunks of 256; an 11,689-token one in 244 s whole (17.4 GB peak resident) and 29 s in chunks of 256 (2.3 GB).
/// One chunk's attention scores stay in cache, where a whole long item's are gigabytes of memory traffic.
pub const MAX_PREFILL_CHUNK: usize = 256;

/// Tokens per prefill chunk for an item of `len` tokens, so that a chunk's working memory stays within
/// `memory_budget` bytes: at most [`MAX_PREFILL_CHUNK`], at least [`MIN_PREFILL_CHUNK`] (or `len`, if shorter).
///
/// The estimate, at the last chunk (the longest context `len`): the item's cache three times over (the past going
/// in, the present coming out, the copy kept), plus per chunk token the attention scores and probabilities of one
/// layer (f32, `heads × len`, three buffers) and its projections and feed-forward activations.
pub fn prefill_chunk(config: &DecoderConfig, len: usize, memory_budget: u64) -> usize {
    let kv_per_token = (config.layers * 2 * config.kv_heads * config.head_dim * 4) as u64;
    let fixed = 3 * kv_per_token * len as u64;
    let per_chunk_token = (12 * config.heads * len + 4 * (3 * config.ffn + 6 * config.hidden)) as u64;
    let chunk = memory_budget.saturating_sub(fixed) / per_chunk_token.max(1);
    let len = len.max(1);
    (chunk as usize).clamp(MIN_PREFILL_CHUNK, MAX_PREFILL_CHUNK).min(len)
}

/// Running count-weighted first and second moments of chunked query statistics, per layer (f64).
struct Moments {
    heads: usize,
    head_dim: usize,
    count: usize,
    sum: Vec<Vec<f64>>,
    second: Vec<Vec<f64>>,
}

impl Moments {
    fn new(c: &DecoderConfig) -> Self {
        Self {
            heads: c.heads,
            head_dim: c.head_dim,
            count: 0,
            sum: vec![vec![0.0; c.heads * c.head_dim]; c.layers],
            second: vec![vec![0.0; c.heads * c.head_dim * c.head_dim]; c.layers],
        }
    }

    /// Adds a chunk of `n` tokens whose statistics are `s` (covariance = second moment − mean meanᵀ).
    fn add(&mut self, s: &QueryStats, n: usize) {
        let (h, d, w) = (self.heads, self.head_dim, n as f64);
        for l in 0..self.sum.len() {
            let (mean, cov) = (&s.mean[l], &s.cov[l]);
            for (acc, &m) in self.sum[l].iter_mut().zip(mean) {
                *acc += w * m as f64;
            }
            for head in 0..h {
                for i in 0..d {
                    for j in 0..d {
                        let k = (head * d + i) * d + j;
                        let outer = mean[head * d + i] as f64 * mean[head * d + j] as f64;
                        self.second[l][k] += w * (cov[k] as f64 + outer);
                    }
                }
            }
        }
        self.count += n;
    }

    fn finish(self) -> QueryStats {
        let (h, d, n) = (self.heads, self.head_dim, self.count.max(1) as f64);
        let mut out = QueryStats { mean: Vec::new(), cov: Vec::new() };
        for (sum, second) in self.sum.iter().zip(&self.second) {
            let mean: Vec<f64> = sum.iter().map(|v| v / n).collect();
            let mut cov = vec![0f32; h * d * d];
            for head in 0..h {
                for i in 0..d {
                    for j in 0..d {
                        let k = (head * d + i) * d + j;
                        cov[k] = (second[k] / n - mean[head * d + i] * mean[head * d + j]) as f32;
                    }
                }
            }
            out.mean.push(mean.iter().map(|&v| v as f32).collect());
            out.cov.push(cov);
        }
        out
    }
}

/// Log-softmax probability of `token` in `logits`.
pub fn token_probability(logits: &[f32], token: u32) -> f64 {
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = logits.iter().map(|&l| (l as f64 - m).exp()).sum();
    logits.get(token as usize).map(|&l| ((l as f64 - m).exp()) / z).unwrap_or(0.0)
}

fn layer_of(p: &KvPast, l: usize, pick: usize) -> &[f32] {
    if pick == 0 {
        &p.keys[l]
    } else {
        &p.values[l]
    }
}

/// The index of the largest logit (the greedy token).
pub(crate) fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i as u32).unwrap_or(0)
}

impl Decoder {
    /// Loads catalog model `name` from `home`, preparing and converting it first if needed.
    pub fn load(home: &Path, name: &str, options: impl Into<RuntimeOptions>) -> Result<Self> {
        Self::load_with(home, name, crate::convert::Weights::F32, options)
    }

    /// [`Decoder::load`] of the conversion whose linear layers store `weights` (an int8 variant is converted from
    /// the catalog model's GGUF on first use).
    pub fn load_with(
        home: &Path,
        name: &str,
        weights: crate::convert::Weights,
        options: impl Into<RuntimeOptions>,
    ) -> Result<Self> {
        let files = crate::prepare::ensure_decoder_with(home, name, weights)?;
        Self::from_files(home, name, &files, options)
    }

    /// Loads a converted decoder folder (ONNX Runtime's library comes from `home`).
    pub fn from_files(
        home: &Path,
        name: &str,
        files: &DecoderFiles,
        options: impl Into<RuntimeOptions>,
    ) -> Result<Self> {
        let _span = tracing::info_span!("load_decoder", model = name).entered();
        let session = crate::runtime::load_session(home, options, &files.model)?;
        let tokenizer = Tokenizer::from_file(&files.tokenizer)
            .map_err(|e| KvError::Format { file: files.tokenizer.display().to_string(), message: e.to_string() })?;
        let graph = Self::graph_shape(&session, &files.config, &files.model)?;
        Ok(Self { name: name.into(), config: files.config.clone(), tokenizer, session: Mutex::new(session), graph })
    }

    /// Checks that the session has the KV-past inputs and outputs of every layer and reads how its outputs are laid
    /// out; an error names the model file.
    fn graph_shape(session: &Session, c: &DecoderConfig, model: &Path) -> Result<GraphShape> {
        let bad = |message: String| KvError::Format { file: model.display().to_string(), message };
        let has_input = |n: &str| session.inputs().iter().any(|o| o.name() == n);
        let output = |n: &str| session.outputs().iter().find(|o| o.name() == n);
        for n in ["input_ids", "attention_mask", "position_ids"] {
            if !has_input(n) {
                return Err(bad(format!("no `{n}` input: not a decoder graph with KV-past I/O")));
            }
        }
        for l in 0..c.layers {
            for which in ["key", "value"] {
                if !has_input(&format!("past_key_values.{l}.{which}"))
                    || output(&format!("present.{l}.{which}")).is_none()
                {
                    return Err(bad(format!("no KV-past input or output for layer {l} ({} expected)", c.layers)));
                }
            }
        }
        let logits = output("logits").ok_or_else(|| bad("no `logits` output".into()))?;
        let rank = logits.dtype().tensor_shape().map_or(0, |s| s.len());
        if rank != 2 && rank != 3 {
            return Err(bad(format!("`logits` has rank {rank}; [batch, vocab] or [batch, seq, vocab] expected")));
        }
        Ok(GraphShape {
            logits_per_position: rank == 3,
            query_stats: (0..c.layers).all(|l| output(&format!("query_mean.{l}")).is_some()),
            cache_branch: has_input("use_cache_branch"),
        })
    }

    /// Whether the graph returns the query statistics the expected-attention press needs (Stretto's converted
    /// graphs do; Hugging Face exports do not).
    pub fn has_query_stats(&self) -> bool {
        self.graph.query_stats
    }

    /// The catalog name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What what it derives (a contrast rung's opposites) is kept under: its name, and a user's own model's
    /// registration ([`DecoderConfig::registration`]).
    pub fn identity(&self) -> String {
        crate::prepare::with_registration(self.name.clone(), self.config.registration.as_deref())
    }

    /// The architecture.
    pub fn config(&self) -> &DecoderConfig {
        &self.config
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Token ids of `text` (no special tokens added; ChatML markers in the text are recognised).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self
            .tokenizer
            .encode(text, false)
            .map_err(|e| KvError::Runtime(format!("tokenizer: {e}")))?
            .get_ids()
            .to_vec())
    }

    /// Token ids of an item's prefix ([`Decoder::item_prefix`]), cut to the model's [`item_token_limit`]: the
    /// tokens every cache of the item holds. The item is identified by its whole prompt (the caches' source hash);
    /// what the model sees of it is the head that fits its context, and a cut is reported.
    pub fn encode_item(&self, prompt: &str) -> Result<Vec<u32>> {
        self.encode_item_within(prompt, u64::MAX)
    }

    /// [`Decoder::encode_item`], cut to the item's [`item_limit`] under `memory_budget` as well: the tokens every
    /// cache prefilled within that budget holds, so that an item's cache never outgrows it.
    pub fn encode_item_within(&self, prompt: &str, memory_budget: u64) -> Result<Vec<u32>> {
        let mut tokens = self.encode_item_in_context(prompt)?;
        let limit = item_memory_limit(&self.config, memory_budget);
        if tokens.len() > limit {
            tracing::warn!(
                model = %self.name,
                tokens = tokens.len(),
                kept = limit,
                memory_budget,
                "an item's cache would outgrow the memory budget: only its first {limit} tokens are used (a larger \
                 --memory-budget reads more)"
            );
            tokens.truncate(limit);
        }
        Ok(tokens)
    }

    /// The item's prefix tokens cut to the model's context.
    fn encode_item_in_context(&self, prompt: &str) -> Result<Vec<u32>> {
        let mut tokens = self.encode(prompt)?;
        if let Some(limit) = item_token_limit(&self.config) {
            if tokens.len() > limit {
                tracing::warn!(
                    model = %self.name,
                    tokens = tokens.len(),
                    kept = limit,
                    "an item is longer than the model's context: only its first {limit} tokens are used"
                );
                tokens.truncate(limit);
            }
        }
        Ok(tokens)
    }

    /// Text of token ids, special tokens removed.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer.decode(ids, true).map_err(|e| KvError::Runtime(format!("tokenizer: {e}")))
    }

    /// The id of a single-token string, e.g. `"1"`.
    pub fn token_id(&self, token: &str) -> Result<u32> {
        match self.encode(token)?.as_slice() {
            [id] => Ok(*id),
            other => Err(KvError::Runtime(format!("`{token}` is {} tokens for {}, not one", other.len(), self.name))),
        }
    }

    /// The model's ChatML prompt for one user turn, ready for the assistant's answer.
    pub fn chat_prompt(&self, user: &str) -> String {
        format!(
            "<|im_start|>system\n{}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n",
            self.config.system_prompt
        )
    }

    /// The cached part of an item's prompt: the chat prefix and the user turn's opening, then the item. The
    /// question ([`Decoder::question_suffix`]) continues the same user turn later.
    pub fn item_prefix(&self, item: &str) -> String {
        item_prefix(&self.config, item)
    }

    /// The question part of a prompt: the instruction closing the user turn, the assistant header and an answer
    /// prefix (without it a small model puts little mass on the answer tokens).
    pub fn question_suffix(&self, instruction: &str) -> String {
        self.answer_suffix(instruction, "")
    }

    /// [`Decoder::question_suffix`] with the answer already begun by `lead` (a contrastive question's shared words,
    /// see [`crate::contrast`]).
    pub fn answer_suffix(&self, instruction: &str, lead: &str) -> String {
        format!("\n{instruction}<|im_end|>\n<|im_start|>assistant\nAnswer: {lead}")
    }

    /// The question part of a map prompt: the instruction as a question closing the user turn, then the assistant's
    /// answer opened with the field's label (`Title:`), which keeps a small model to the value itself.
    pub fn map_suffix(&self, instruction: &str, label: &str) -> String {
        format!("\n\nQuestion: {instruction}<|im_end|>\n<|im_start|>assistant\n{label}:")
    }

    /// Runs a batch of rows; see the module docs for how rows of different lengths are combined.
    pub fn run(&self, steps: &[Step<'_>], want: Want) -> Result<Vec<StepOutput>> {
        let c = &self.config;
        if steps.is_empty() {
            return Ok(Vec::new());
        }
        if want.query_stats && !self.graph.query_stats {
            return Err(KvError::Usage(format!(
                "{} returns no query statistics (a Hugging Face export): compress its caches with the key-norm or \
                 streaming press, not expected-attention",
                self.name
            )));
        }
        let empty = KvPast::empty(c);
        for s in steps {
            if s.tokens.is_empty() {
                return Err(KvError::Runtime("a decoder step needs at least one new token".into()));
            }
            if let Some(&t) = s.tokens.iter().find(|&&t| t as usize >= c.vocab) {
                return Err(KvError::Runtime(format!("token id {t} is outside the vocabulary of {}", c.vocab)));
            }
            s.past.unwrap_or(&empty).check(c)?;
        }
        let b = steps.len();
        let p_max = steps.iter().map(|s| s.past.map_or(0, |p| p.len)).max().unwrap_or(0);
        let s_max = steps.iter().map(|s| s.tokens.len()).max().unwrap_or(0);
        let total = p_max + s_max;
        let (kv, hd) = (c.kv_heads, c.head_dim);

        let mut ids = vec![0i64; b * s_max];
        let mut mask = vec![0i64; b * total];
        let mut pos = vec![0i64; b * s_max];
        for (r, s) in steps.iter().enumerate() {
            let past = s.past.unwrap_or(&empty);
            let pad_q = s_max - s.tokens.len();
            for (k, &t) in s.tokens.iter().enumerate() {
                ids[r * s_max + pad_q + k] = t as i64;
                pos[r * s_max + pad_q + k] = past.next_position + k as i64;
            }
            for j in p_max - past.len..p_max {
                mask[r * total + j] = 1;
            }
            for j in p_max + pad_q..total {
                mask[r * total + j] = 1;
            }
        }

        // A single row with nothing to pad passes its cache without a copy.
        let borrow = b == 1;
        let mut inputs: Vec<(String, SessionInputValue<'_>)> = vec![
            ("input_ids".into(), Tensor::from_array((vec![b, s_max], ids))?.into()),
            ("attention_mask".into(), Tensor::from_array((vec![b, total], mask))?.into()),
            ("position_ids".into(), Tensor::from_array((vec![b, s_max], pos))?.into()),
        ];
        if self.graph.cache_branch {
            inputs.push(("use_cache_branch".into(), Tensor::from_array((vec![1usize], vec![true]))?.into()));
        }
        for l in 0..c.layers {
            for (which, pick) in [("key", 0usize), ("value", 1)] {
                let name = format!("past_key_values.{l}.{which}");
                if borrow {
                    let past = steps[0].past.unwrap_or(&empty);
                    let view = TensorRef::from_array_view((vec![1, kv, p_max, hd], layer_of(past, l, pick)))?;
                    inputs.push((name, view.into()));
                } else {
                    let mut data = vec![0f32; b * kv * p_max * hd];
                    for (r, s) in steps.iter().enumerate() {
                        let Some(past) = s.past else { continue };
                        let src = layer_of(past, l, pick);
                        let off = p_max - past.len;
                        for h in 0..kv {
                            let from = &src[h * past.len * hd..(h + 1) * past.len * hd];
                            let to = ((r * kv + h) * p_max + off) * hd;
                            data[to..to + past.len * hd].copy_from_slice(from);
                        }
                    }
                    inputs.push((name, Tensor::from_array((vec![b, kv, p_max, hd], data))?.into()));
                }
            }
        }

        let mut selector = ort::session::OutputSelector::no_default().with("logits");
        for l in 0..c.layers {
            if want.present {
                selector = selector.with(format!("present.{l}.key")).with(format!("present.{l}.value"));
            }
            if want.query_stats {
                selector = selector.with(format!("query_mean.{l}")).with(format!("query_cov.{l}"));
            }
        }
        let options = RunOptions::new()?.with_outputs(selector);
        let mut session = self.session.lock().map_err(|_| KvError::Runtime("decoder session poisoned".into()))?;
        let outputs = session.run_with_options(inputs, &options)?;

        let (_, logits) = outputs["logits"].try_extract_tensor::<f32>()?;
        let vocab = c.vocab;
        // Rows are left-padded, so every row's last token is at position s_max - 1.
        let (row_len, last) =
            if self.graph.logits_per_position { (s_max * vocab, (s_max - 1) * vocab) } else { (vocab, 0) };
        if logits.len() != b * row_len {
            return Err(KvError::Runtime(format!(
                "{} returned {} logits for {b} rows of {s_max} tokens over a vocabulary of {vocab}",
                self.name,
                logits.len()
            )));
        }
        let mut results: Vec<StepOutput> = (0..b)
            .map(|r| StepOutput {
                logits: logits[r * row_len + last..r * row_len + last + vocab].to_vec(),
                present: None,
                query_stats: None,
            })
            .collect();
        if want.present {
            for (r, s) in steps.iter().enumerate() {
                let past = s.past.unwrap_or(&empty);
                let pad_q = s_max - s.tokens.len();
                let len = past.len + s.tokens.len();
                let mut out = KvPast {
                    keys: Vec::with_capacity(c.layers),
                    values: Vec::with_capacity(c.layers),
                    len,
                    next_position: past.next_position + s.tokens.len() as i64,
                    kv_heads: kv,
                    head_dim: hd,
                };
                for l in 0..c.layers {
                    for which in ["key", "value"] {
                        let (_, data) = outputs[format!("present.{l}.{which}").as_str()].try_extract_tensor::<f32>()?;
                        let mut v = Vec::with_capacity(kv * len * hd);
                        for h in 0..kv {
                            let base = (r * kv + h) * total * hd;
                            v.extend_from_slice(&data[base + (p_max - past.len) * hd..base + p_max * hd]);
                            v.extend_from_slice(&data[base + (p_max + pad_q) * hd..base + total * hd]);
                        }
                        if which == "key" {
                            out.keys.push(v);
                        } else {
                            out.values.push(v);
                        }
                    }
                }
                results[r].present = Some(out);
            }
        }
        if want.query_stats {
            let (h, m, cv) = (c.heads, c.heads * hd, c.heads * hd * hd);
            let _ = h;
            let mut stats: Vec<QueryStats> = (0..b).map(|_| QueryStats { mean: Vec::new(), cov: Vec::new() }).collect();
            for l in 0..c.layers {
                let (_, mean) = outputs[format!("query_mean.{l}").as_str()].try_extract_tensor::<f32>()?;
                let (_, cov) = outputs[format!("query_cov.{l}").as_str()].try_extract_tensor::<f32>()?;
                for (r, st) in stats.iter_mut().enumerate() {
                    st.mean.push(mean[r * m..(r + 1) * m].to_vec());
                    st.cov.push(cov[r * cv..(r + 1) * cv].to_vec());
                }
            }
            for (res, st) in results.iter_mut().zip(stats) {
                res.query_stats = Some(st);
            }
        }
        Ok(results)
    }

    /// Prefills `tokens` from scratch: the item's cache (and its query statistics when `query_stats`), within
    /// [`DEFAULT_MEMORY_BUDGET`] of working memory ([`Decoder::prefill_within`]).
    pub fn prefill(&self, tokens: &[u32], query_stats: bool) -> Result<(KvPast, Option<QueryStats>)> {
        self.prefill_within(tokens, query_stats, DEFAULT_MEMORY_BUDGET)
    }

    /// [`Decoder::prefill`] in chunks of [`prefill_chunk`] tokens, so that one run's working memory stays within
    /// `memory_budget` bytes whatever the item's length (a whole 13,000-token email at once needs gigabytes for its
    /// attention scores alone).
    pub fn prefill_within(
        &self,
        tokens: &[u32],
        query_stats: bool,
        memory_budget: u64,
    ) -> Result<(KvPast, Option<QueryStats>)> {
        self.prefill_chunked(tokens, query_stats, prefill_chunk(&self.config, tokens.len(), memory_budget))
    }

    /// Prefills `tokens` `chunk` at a time, each chunk over the past the previous ones left: the same cache as one
    /// run over all of them (causal attention sees only earlier tokens either way), up to float rounding. Query
    /// statistics are merged exactly: per chunk, the count-weighted mean and second moment.
    pub fn prefill_chunked(
        &self,
        tokens: &[u32],
        query_stats: bool,
        chunk: usize,
    ) -> Result<(KvPast, Option<QueryStats>)> {
        let _span = tracing::debug_span!("prefill", model = %self.name, tokens = tokens.len(), chunk).entered();
        if tokens.is_empty() {
            return Err(KvError::Runtime("a prefill needs at least one token".into()));
        }
        let mut past: Option<KvPast> = None;
        let mut moments = query_stats.then(|| Moments::new(&self.config));
        for piece in tokens.chunks(chunk.max(1)) {
            let mut out =
                self.run(&[Step { past: past.as_ref(), tokens: piece }], Want { present: true, query_stats })?;
            let row = out.pop().ok_or_else(|| KvError::Runtime("empty decoder output".into()))?;
            past = Some(row.present.ok_or_else(|| KvError::Runtime("missing present".into()))?);
            if let Some(m) = moments.as_mut() {
                let s = row.query_stats.ok_or_else(|| KvError::Runtime("missing query statistics".into()))?;
                m.add(&s, piece.len());
            }
        }
        let past = past.ok_or_else(|| KvError::Runtime("empty prefill".into()))?;
        Ok((past, moments.map(Moments::finish)))
    }

    /// For each past: the log-odds `logit(yes) − logit(no)` of the token after `question`, in batches of `batch`.
    pub fn log_odds(&self, pasts: &[&KvPast], question: &[u32], yes: u32, no: u32, batch: usize) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(pasts.len());
        for chunk in pasts.chunks(batch.max(1)) {
            let steps: Vec<Step<'_>> = chunk.iter().map(|p| Step { past: Some(p), tokens: question }).collect();
            for row in self.run(&steps, Want::default())? {
                out.push(row.logits[yes as usize] - row.logits[no as usize]);
            }
        }
        Ok(out)
    }

    /// Greedy decoding of each row (a past, possibly empty, then prompt tokens), batched, up to `max_tokens`.
    pub fn generate(&self, rows: &[Step<'_>], max_tokens: usize) -> Result<Vec<Generation>> {
        self.generate_until(rows, max_tokens, false)
    }

    /// [`Decoder::generate`] for callers that read only the first non-empty line of each answer (a map's value, a
    /// derived opposite): a row stops at the token that ends that line, as at a stop token, so a model that goes on
    /// after its answer ("Running\nThe shoe is…") does not pay decode steps whose text is thrown away. The text up to
    /// that token is what [`Decoder::generate`] gives up to it, and the confidence is the product over the tokens
    /// kept, the line's end included.
    pub fn generate_line(&self, rows: &[Step<'_>], max_tokens: usize) -> Result<Vec<Generation>> {
        self.generate_until(rows, max_tokens, true)
    }

    fn generate_until(&self, rows: &[Step<'_>], max_tokens: usize, first_line: bool) -> Result<Vec<Generation>> {
        let _span = tracing::info_span!("generate", model = %self.name, rows = rows.len(), first_line).entered();
        let n = rows.len();
        let mut gens: Vec<Generation> = (0..n)
            .map(|_| Generation { text: String::new(), tokens: Vec::new(), confidence: 1.0, stopped: false })
            .collect();
        if max_tokens == 0 || n == 0 {
            return Ok(gens);
        }
        let mut active: Vec<usize> = (0..n).collect();
        let mut pasts: Vec<Option<KvPast>> = vec![None; n];
        let mut next: Vec<u32> = vec![0; n];
        let mut first = true;
        while !active.is_empty() {
            let outs = {
                let steps: Vec<Step<'_>> = active
                    .iter()
                    .map(|&i| {
                        if first {
                            rows[i]
                        } else {
                            Step { past: pasts[i].as_ref(), tokens: std::slice::from_ref(&next[i]) }
                        }
                    })
                    .collect();
                self.run(&steps, Want { present: true, query_stats: false })?
            };
            first = false;
            let mut still = Vec::with_capacity(active.len());
            for (&i, out) in active.iter().zip(outs) {
                let tok = argmax(&out.logits);
                gens[i].confidence *= token_probability(&out.logits, tok);
                if self.config.stop_tokens.contains(&tok) {
                    gens[i].stopped = true;
                    continue;
                }
                gens[i].tokens.push(tok);
                if first_line && self.decode(&gens[i].tokens)?.trim_start().contains('\n') {
                    gens[i].stopped = true;
                    continue;
                }
                if gens[i].tokens.len() >= max_tokens {
                    continue;
                }
                next[i] = tok;
                pasts[i] = out.present;
                still.push(i);
            }
            active = still;
        }
        for g in &mut gens {
            g.text = self.decode(&g.tokens)?;
        }
        Ok(gens)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A one-layer config for tests that need no model.
    pub(crate) fn tiny_config(context_length: Option<usize>) -> DecoderConfig {
        DecoderConfig {
            arch: "llama".into(),
            layers: 1,
            hidden: 8,
            heads: 2,
            kv_heads: 1,
            head_dim: 4,
            ffn: 8,
            vocab: 10,
            rope_base: 10000.0,
            eps: 1e-5,
            stop_tokens: vec![],
            system_prompt: String::new(),
            converter: crate::convert::CONVERTER_VERSION,
            weights: Default::default(),
            context_length,
            registration: None,
        }
    }

    /// SmolLM2-135M's shape (30 layers, 3 KV heads of 64: 46,080 bytes of f32 keys and values a token), with the
    /// tiny config's other fields and `context_length`.
    pub(crate) fn smollm2_shape(context_length: Option<usize>) -> DecoderConfig {
        DecoderConfig {
            layers: 30,
            hidden: 576,
            heads: 9,
            kv_heads: 3,
            head_dim: 64,
            ffn: 1536,
            ..tiny_config(context_length)
        }
    }

    #[test]
    fn an_item_keeps_the_context_less_the_answers_room() {
        assert_eq!(item_token_limit(&tiny_config(None)), None, "an unknown context cuts nothing");
        assert_eq!(item_token_limit(&tiny_config(Some(8192))), Some(8192 - ANSWER_RESERVE));
        assert_eq!(item_token_limit(&tiny_config(Some(32768))), Some(32768 - ANSWER_RESERVE));
        // A short context keeps at least half of it for the item.
        assert_eq!(item_token_limit(&tiny_config(Some(600))), Some(300));
        assert_eq!(item_token_limit(&tiny_config(Some(1))), Some(1));
    }

    /// The memory limit is the longest item whose smallest-chunk prefill fits the budget ([`prefill_chunk`]'s
    /// estimate), never below [`MIN_ITEM_TOKENS`]; the item limit is the smaller of it and the context's.
    #[test]
    fn an_item_is_cut_to_what_the_memory_budget_can_prefill() {
        let c = smollm2_shape(Some(8192));
        let estimate = |len: usize| {
            let kv = (c.layers * 2 * c.kv_heads * c.head_dim * 4) as u64;
            3 * kv * len as u64
                + MIN_PREFILL_CHUNK as u64 * (12 * c.heads * len + 4 * (3 * c.ffn + 6 * c.hidden)) as u64
        };
        for budget in [512u64 << 20, 1 << 30, 3 << 30] {
            let limit = item_memory_limit(&c, budget);
            assert!(estimate(limit) <= budget && estimate(limit + 1) > budget, "budget {budget}: limit {limit}");
        }
        assert_eq!(item_memory_limit(&c, 512 << 20), 3503);
        assert_eq!(item_memory_limit(&c, 0), MIN_ITEM_TOKENS, "a tiny budget still reads an item's head");
        assert_eq!(item_limit(&c, 1 << 30), 7033, "the budget binds before the context");
        assert_eq!(item_limit(&c, 16 << 30), 8192 - ANSWER_RESERVE, "the context binds before a large budget");
        assert!(within_item_limit(&c, 1 << 30, 7033) && !within_item_limit(&c, 1 << 30, 7034));
    }

    #[test]
    fn a_continuation_loses_its_middle_to_fit_the_context_and_keeps_its_question() {
        let c = tiny_config(Some(100));
        let t: Vec<u32> = (0..50).collect();
        assert_eq!(fit_after(&c, 50, t.clone(), 10), t, "fits exactly");
        assert_eq!(fit_after(&tiny_config(None), 90, t.clone(), 10), t, "no known context");
        // After 80 positions, 20 are left: the first 10 tokens and the last 10.
        let cut = fit_after(&c, 80, t.clone(), 10);
        assert_eq!(cut, (0..10).chain(40..50).collect::<Vec<u32>>());
        // No room at all: the question stays.
        assert_eq!(fit_after(&c, 100, t.clone(), 10), (40..50).collect::<Vec<u32>>());
        assert_eq!(fit_after(&c, 100, t.clone(), 80), t, "a tail longer than the tokens keeps them all");
    }
}
