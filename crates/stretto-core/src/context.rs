//! The settings a physical operator runs under: where models, KV caches and memoised answers live, how many
//! threads a model may use, and which decoders make up the LLM ladder.
//!
//! A [`Registry`](crate::op::Registry) is built for one context, and every operator it builds keeps that context,
//! so two registries (two sessions) with different settings work side by side in one process. Nothing here reads
//! the environment except [`OpContext::from_env`], which binaries and tests call at their edge.
//!
//! ```
//! use stretto_core::context::{MemoPolicy, OpContext};
//! let ctx = OpContext::new("/tmp/stretto-home").with_memo(MemoPolicy::Off).with_threads(2);
//! assert_eq!(ctx.kv_dir, std::path::Path::new("/tmp/stretto-home/kv"));
//! assert!(ctx.open_memo("keyword").is_none());
//! ```

use std::path::{Path, PathBuf};

use crate::memo::Memo;
use crate::{CoreError, Result};

/// Environment variable: the model home.
pub const HOME_ENV: &str = "STRETTO_HOME";
/// Environment variable: the KV cache directory (default: `kv` under the model home).
pub const KV_DIR_ENV: &str = "STRETTO_KV_DIR";
/// Environment variable: the memo directory (default: `memo` under the model home); `off` disables memoisation.
pub const MEMO_DIR_ENV: &str = "STRETTO_MEMO_DIR";
/// Environment variable: decoder models of the LLM ladder, comma-separated.
pub const LADDER_ENV: &str = "STRETTO_LADDER";
/// Environment variable: intra-op threads of every model session (0 or unset: ONNX Runtime's choice).
pub const THREADS_ENV: &str = "STRETTO_THREADS";
/// Environment variable: the disk budget in bytes of the KV directory and the memo together.
pub const DISK_BUDGET_ENV: &str = "STRETTO_DISK_BUDGET";
/// Environment variable: bytes of working memory a model run may take (see [`OpContext::memory_budget`]).
pub const MEMORY_BUDGET_ENV: &str = "STRETTO_MEMORY_BUDGET";

/// The decoders of the LLM ladder when nothing else is said.
pub const DEFAULT_LADDER: &[&str] = &["smollm2-135m", "qwen2.5-coder-0.5b"];

/// The sentence encoders of embedding filters when nothing else is said.
pub const DEFAULT_ENCODERS: &[&str] = &["minilm"];

/// Whether and where operators memoise their answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoPolicy {
    /// Answers are kept in one JSON-lines file per operator in this directory.
    Dir(PathBuf),
    /// Nothing is memoised: every answer is computed.
    Off,
}

/// Where models run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum ExecutionProvider {
    /// ONNX Runtime's CPU kernels.
    #[default]
    Cpu,
    /// ONNX Runtime's CUDA execution provider, with the CPU for what it does not run (needs Stretto built with the
    /// `cuda` feature and onnxruntime-gpu's libraries). Set per registry: two sessions of one process can run one
    /// on the GPU and one on the CPU.
    Cuda,
}

/// Settings shared by every operator of a registry.
#[derive(Debug, Clone, PartialEq)]
pub struct OpContext {
    /// Where prepared models live.
    pub model_home: PathBuf,
    /// Where item KV caches live.
    pub kv_dir: PathBuf,
    /// Memoisation of operator answers.
    pub memo: MemoPolicy,
    /// Intra-op threads of each model session (0: ONNX Runtime's choice).
    pub threads: usize,
    /// Decoder models of the LLM ladder, smallest first; the last one uncompressed is the gold candidate.
    pub ladder: Vec<String>,
    /// Sentence encoders, one embedding filter each.
    pub encoders: Vec<String>,
    /// Where this registry's models run.
    pub provider: ExecutionProvider,
    /// Bytes the KV directory and the memo may hold together; queries evict least-recently-used ad-hoc caches to
    /// stay within it. `None`: what they hold now plus half of the free space of the KV directory's file system.
    pub disk_budget: Option<u64>,
    /// Bytes of working memory one model run may take beyond the model's weights: a long item's prefill runs in
    /// chunks that fit it, so peak memory does not grow with the square of an item's length. `None`: 1 GiB
    /// (`stretto_kv::decoder::DEFAULT_MEMORY_BUDGET`).
    pub memory_budget: Option<u64>,
    /// Whether the LLM ladder also offers every catalog model's weight-quantized rungs, both variants (`int8`:
    /// 8-bit `MatMulNBits` weights; `int8-dyn`: 8-bit weights and activations but for the down-projection), over
    /// the f32 model's caches. Off by default: no quantized rung has yet paid for its profiling end to end
    /// (`bench/results/quant/`, `bench/results/totals/int8-dyn/`).
    pub int8_rungs: bool,
    /// What operators' answers cost per item, recorded by every evaluation of the registries built from this
    /// context (and its clones), for pay checks to read before asking a candidate.
    pub costs: std::sync::Arc<crate::memo::CostRecord>,
    /// The models the operators built from this context (and its clones) loaded, held for as long as one of them
    /// lives: a session's models are freed when the session is dropped, unless another context holds them too.
    pub models: std::sync::Arc<ModelHold>,
}

/// The loaded models a context holds. The process keeps one loaded copy of each model (per model home and
/// runtime options), shared by every context that holds it, and frees it once none does
/// (`stretto_ops_text::{decoder, embedder, classifier}` look models up in `stretto_kv::pool` and hold what they hand
/// out in the asking context's `ModelHold`).
///
/// ```
/// use std::sync::Arc;
/// use stretto_core::context::ModelHold;
/// let hold = ModelHold::default();
/// let model = Arc::new(String::from("a loaded model"));
/// hold.hold(&model);
/// hold.hold(&model); // held once
/// assert_eq!(hold.len(), 1);
/// let weak = Arc::downgrade(&model);
/// drop(model);
/// assert!(weak.upgrade().is_some(), "the hold keeps it");
/// hold.release();
/// assert!(weak.upgrade().is_none(), "freed with the last holder");
/// ```
#[derive(Default)]
pub struct ModelHold {
    held: std::sync::Mutex<Vec<std::sync::Arc<dyn std::any::Any + Send + Sync>>>,
}

impl ModelHold {
    /// Holds `model` (once, however often it is handed out).
    pub fn hold<T: std::any::Any + Send + Sync>(&self, model: &std::sync::Arc<T>) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let ptr = std::sync::Arc::as_ptr(model) as *const ();
        if !held.iter().any(|m| std::sync::Arc::as_ptr(m) as *const () == ptr) {
            held.push(model.clone());
        }
    }

    /// How many models are held.
    pub fn len(&self) -> usize {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no model is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Lets go of every model held: those no other context (nor a running operator) holds are freed now, and
    /// loaded again on next use.
    pub fn release(&self) {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

impl std::fmt::Debug for ModelHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelHold").field("models", &self.len()).finish()
    }
}

/// What is loaded is not a setting: contexts that differ only in it compare equal.
impl PartialEq for ModelHold {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// The ladder `STRETTO_LADDER` names (comma-separated model names), when it names one: binaries that let a named
/// ladder's models into a query whatever else restricts them ask this, not only [`OpContext::from_env`].
pub fn ladder_from_env() -> Option<Vec<String>> {
    let v = std::env::var(LADDER_ENV).ok()?;
    let models: Vec<String> = v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
    (!models.is_empty()).then_some(models)
}

impl OpContext {
    /// Everything under `model_home`: KV caches in `kv/`, answers memoised in `memo/`, the default ladder.
    pub fn new(model_home: impl Into<PathBuf>) -> Self {
        let model_home = model_home.into();
        Self {
            kv_dir: model_home.join("kv"),
            memo: MemoPolicy::Dir(model_home.join("memo")),
            model_home,
            threads: 0,
            ladder: DEFAULT_LADDER.iter().map(|s| s.to_string()).collect(),
            encoders: DEFAULT_ENCODERS.iter().map(|s| s.to_string()).collect(),
            provider: ExecutionProvider::Cpu,
            disk_budget: None,
            memory_budget: None,
            int8_rungs: false,
            costs: Default::default(),
            models: Default::default(),
        }
    }

    /// The context the environment describes (`STRETTO_HOME`, `STRETTO_KV_DIR`, `STRETTO_MEMO_DIR`,
    /// `STRETTO_LADDER`, `STRETTO_THREADS`, `STRETTO_DISK_BUDGET`, `STRETTO_MEMORY_BUDGET`), for binaries and
    /// tests; libraries take a context instead. A number that does not parse (`STRETTO_DISK_BUDGET=10G`) is an
    /// error naming the variable, not a setting silently left at its default.
    pub fn from_env() -> Result<Self> {
        let mut ctx = Self::new(default_home());
        if let Some(d) = std::env::var_os(KV_DIR_ENV) {
            ctx.kv_dir = PathBuf::from(d);
        }
        match std::env::var_os(MEMO_DIR_ENV) {
            Some(v) if v == "off" => ctx.memo = MemoPolicy::Off,
            Some(v) => ctx.memo = MemoPolicy::Dir(PathBuf::from(v)),
            None => {}
        }
        if let Some(models) = ladder_from_env() {
            ctx.ladder = models;
        }
        if let Some(t) = env_number(THREADS_ENV, "a number of threads (0: ONNX Runtime's default)")? {
            ctx.threads = t;
        }
        ctx.disk_budget = env_number(DISK_BUDGET_ENV, "a number of bytes, such as 10000000000")?;
        ctx.memory_budget = env_number(MEMORY_BUDGET_ENV, "a number of bytes, such as 1073741824")?;
        Ok(ctx)
    }

    /// Whether models run on the CUDA execution provider.
    pub fn cuda(&self) -> bool {
        self.provider == ExecutionProvider::Cuda
    }

    /// With another KV cache directory.
    pub fn with_kv_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.kv_dir = dir.into();
        self
    }

    /// With another memo policy.
    pub fn with_memo(mut self, memo: MemoPolicy) -> Self {
        self.memo = memo;
        self
    }

    /// With `threads` intra-op threads per model session.
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// With a disk budget of `bytes` for the KV directory and the memo together.
    pub fn with_disk_budget(mut self, bytes: u64) -> Self {
        self.disk_budget = Some(bytes);
        self
    }

    /// With `bytes` of working memory per model run (see [`OpContext::memory_budget`]).
    pub fn with_memory_budget(mut self, bytes: u64) -> Self {
        self.memory_budget = Some(bytes);
        self
    }

    /// With (or without) both weight-quantized rungs of every ladder model (see [`OpContext::int8_rungs`]).
    pub fn with_int8_rungs(mut self, on: bool) -> Self {
        self.int8_rungs = on;
        self
    }

    /// With another LLM ladder.
    pub fn with_ladder<S: Into<String>>(mut self, models: impl IntoIterator<Item = S>) -> Self {
        self.ladder = models.into_iter().map(Into::into).collect();
        self
    }

    /// This context with its cost record kept beside the memo (`<memo dir>/costs.jsonl`,
    /// [`crate::memo::CostRecord::open`]): what earlier processes recorded is read, and what this one records is
    /// kept for later ones. Unchanged without a memo directory.
    pub fn with_persisted_costs(mut self) -> crate::Result<Self> {
        if let Some(dir) = self.memo_dir() {
            let record = crate::memo::CostRecord::open(&dir.join(crate::memo::COSTS_FILE))?;
            self.costs = std::sync::Arc::new(record);
        }
        Ok(self)
    }

    /// The memo directory, `None` when memoisation is off.
    pub fn memo_dir(&self) -> Option<&Path> {
        match &self.memo {
            MemoPolicy::Dir(d) => Some(d),
            MemoPolicy::Off => None,
        }
    }

    /// The memo called `name` under this context's policy; `None` when memoisation is off or the memo cannot be
    /// opened (a warning says why: answers are then recomputed, never wrong).
    pub fn open_memo(&self, name: &str) -> Option<Memo> {
        let dir = self.memo_dir()?;
        Memo::open(dir, name)
            .inspect_err(|e| tracing::warn!(memo = name, error = %e, "memo unavailable; answers are not kept"))
            .ok()
    }
}

/// The number environment variable `variable` holds, if it is set; `what` says what it should hold when it does
/// not parse.
fn env_number<T: std::str::FromStr>(variable: &str, what: &str) -> Result<Option<T>> {
    let Some(value) = std::env::var_os(variable) else { return Ok(None) };
    let value = value.to_string_lossy().into_owned();
    value.trim().parse().map(Some).map_err(|_| CoreError::Environment {
        variable: variable.into(),
        value,
        message: format!("it must be {what}"),
    })
}

/// The model home the environment names: `STRETTO_HOME`, else `$XDG_CACHE_HOME/stretto`, else `~/.cache/stretto`.
/// For binaries and tests; libraries take a path.
pub fn default_home() -> PathBuf {
    if let Some(h) = std::env::var_os(HOME_ENV) {
        return PathBuf::from(h);
    }
    if let Some(c) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(c).join("stretto");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".cache").join("stretto"),
        None => std::env::temp_dir().join("stretto"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memo_policy_decides_where_answers_go() {
        let dir = tempfile::tempdir().unwrap();
        let on = OpContext::new(dir.path());
        assert_eq!(on.memo_dir(), Some(dir.path().join("memo").as_path()));
        let m = on.open_memo("op@1").expect("memo opens");
        assert!(m.path().starts_with(dir.path().join("memo")));
        assert!(on.clone().with_memo(MemoPolicy::Off).open_memo("op@1").is_none());
        let other = on.with_memo(MemoPolicy::Dir(dir.path().join("elsewhere")));
        assert!(other.open_memo("op@1").unwrap().path().starts_with(dir.path().join("elsewhere")));
    }
}
