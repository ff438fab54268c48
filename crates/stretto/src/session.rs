//! The [`Session`]: configuration, the operator registry, registered tables; the entry point for reading data and
//! building [`DataFrame`]s.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use arrow::array::RecordBatch;
use stretto_core::datasets::Dataset;
use stretto_core::op::{PhysicalOp, Registry};
use stretto_core::plan::PlanBuilder;
use stretto_core::{MemoPolicy, OpContext};
use stretto_kv::prepare::UserKind;

use crate::config::{ExecutionProvider, SessionConfig};
use crate::dataframe::DataFrame;
use crate::error::{Error, Result};
use crate::io::{self, CsvOptions, ReadOptions};
use crate::state::SessionState;

/// Builds a [`Session`]; every setting has a default under the model home.
#[derive(Debug, Clone)]
pub struct SessionBuilder {
    config: SessionConfig,
    /// Whether [`ladder`](Self::ladder) named the ladder (its models are then allowed in queries).
    ladder_named: bool,
}

impl SessionBuilder {
    /// Defaults under `model_home`: KV caches in `kv/`, memo in `memo/`, the SmolLM2-135M + Qwen2.5-Coder-0.5B
    /// ladder with SmolLM2-135M, MiniLM and EfficientNet-Lite0 allowed in queries, CPU, no progress bars, seed 42,
    /// 15% of the input profiled (at least 40 tuples, at most 600).
    pub fn new(model_home: impl Into<PathBuf>) -> Self {
        Self {
            config: SessionConfig {
                operators: OpContext::new(model_home),
                models: vec!["smollm2-135m".into(), "minilm".into(), "efficientnet-lite0".into()],
                progress: false,
                run_dir: None,
                seed: 42,
                sample_fraction: 0.15,
                min_sample: 40,
                max_sample: crate::engine::DEFAULT_MAX_SAMPLE,
                screen: 20,
                price_memo_hits: false,
                user_models: Vec::new(),
            },
            ladder_named: false,
        }
    }

    /// Every operator setting at once (model home, KV directory, memo, threads, execution provider, ladder,
    /// encoders): what a binary read from its environment with [`OpContext::from_env`].
    pub fn operators(mut self, operators: OpContext) -> Self {
        self.config.operators = operators;
        self
    }

    /// Where item KV caches live.
    pub fn kv_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.config.operators.kv_dir = dir.into();
        self
    }

    /// Keep operator answers in `dir`.
    pub fn memo_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.config.operators.memo = MemoPolicy::Dir(dir.into());
        self
    }

    /// Memoise nothing: every answer is computed.
    pub fn memo_off(mut self) -> Self {
        self.config.operators.memo = MemoPolicy::Off;
        self
    }

    /// Decoder models of the LLM ladder, smallest first (the last, uncompressed, is the gold candidate). They are
    /// allowed in queries whatever [`models`](Self::models) says: a ladder whose models are not allowed would give
    /// no LLM rung at all.
    pub fn ladder<S: Into<String>>(mut self, models: impl IntoIterator<Item = S>) -> Self {
        self.config.operators.ladder = models.into_iter().map(Into::into).collect();
        self.ladder_named = true;
        self
    }

    /// Sentence encoders of the embedding filters, one filter each (default: `minilm`); models registered with
    /// [`model`](Self::model) that are encoders join them.
    pub fn encoders<S: Into<String>>(mut self, models: impl IntoIterator<Item = S>) -> Self {
        self.config.operators.encoders = models.into_iter().map(Into::into).collect();
        self
    }

    /// Models operators may use in queries (models brought with [`model`](Self::model) are added to them).
    pub fn models<S: Into<String>>(mut self, models: impl IntoIterator<Item = S>) -> Self {
        self.config.models = models.into_iter().map(Into::into).collect();
        self
    }

    /// Bytes the KV directory and the memo may hold together (default: what they hold when first measured plus
    /// half of the free space of the KV directory's file system). Queries evict least-recently-used ad-hoc caches
    /// to stay within it, never one a running query uses; a cache the budget cannot hold is used from memory.
    pub fn disk_budget(mut self, bytes: u64) -> Self {
        self.config.operators.disk_budget = Some(bytes);
        self
    }

    /// Bytes of working memory one model run may take beyond the model's weights (default 1 GiB): a long item is
    /// prefilled in chunks that fit it, so peak memory stays bounded whatever the input's lengths.
    pub fn memory_budget(mut self, bytes: u64) -> Self {
        self.config.operators.memory_budget = Some(bytes);
        self
    }

    /// Whether the LLM ladder also offers both weight-quantized rungs of every catalog model (`int8`: 8-bit
    /// `MatMulNBits` weights; `int8-dyn`: 8-bit activations too, but for the down-projection; over the f32 model's
    /// caches, converted on first use; default off). The optimizer profiles and certifies them like any other rung.
    pub fn int8_rungs(mut self, on: bool) -> Self {
        self.config.operators.int8_rungs = on;
        self
    }

    /// Intra-op threads per model session (0: ONNX Runtime's choice).
    pub fn threads(mut self, threads: usize) -> Self {
        self.config.operators.threads = threads;
        self
    }

    /// Where this session's models run (default: the CPU). Chosen per session: in a build with the `cuda` feature,
    /// one session can run on the GPU beside another on the CPU; without the feature, CUDA is an error at `build`.
    pub fn execution_provider(mut self, provider: ExecutionProvider) -> Self {
        self.config.operators.provider = provider;
        self
    }

    /// Progress bars on long work.
    pub fn progress(mut self, on: bool) -> Self {
        self.config.progress = on;
        self
    }

    /// Write the profile and the executed plan of a query under `dir` (`profile.json`, `plan.json`; the next query
    /// replaces them).
    pub fn run_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.config.run_dir = Some(dir.into());
        self
    }

    /// Seed of the profiling sample and the optimizer.
    pub fn seed(mut self, seed: u64) -> Self {
        self.config.seed = seed;
        self
    }

    /// Profile `fraction` of the input, at least `min` tuples.
    pub fn sample(mut self, fraction: f64, min: usize) -> Self {
        self.config.sample_fraction = fraction;
        self.config.min_sample = min;
        self
    }

    /// Profile at most `max` tuples, whatever the fraction (a semantic join's cross product is large; a
    /// certificate's strength is in the number of tuples it holds out, not their share).
    pub fn max_sample(mut self, max: usize) -> Self {
        self.config.max_sample = max;
        self
    }

    /// Screen every candidate on `tuples` tuples outside the profiling sample first, and profile only those that
    /// are neither hopeless nor dominated there (0: profile every candidate on the whole sample).
    pub fn screen(mut self, tuples: usize) -> Self {
        self.config.screen = tuples;
        self
    }

    /// Price the profiling answers already in the memo at the seconds they once cost, as a cold run would pay
    /// them, when deciding whether profiling pays (off by default: an earlier query's answers cost nothing).
    /// Benchmarks that share one memo between runs they compare as cold need it on.
    pub fn price_memo_hits(mut self, on: bool) -> Self {
        self.config.price_memo_hits = on;
        self
    }

    /// Brings your own model, by path, as model `name`, prepared and cached under the model home like a catalog model
    /// and allowed in queries:
    /// - a GGUF decoder (llama or qwen2, a chat model in the ChatML format, as Stretto's prompts are), converted
    ///   once; or a Hugging Face ONNX export folder of such a decoder with KV-past I/O (`optimum-cli export onnx
    ///   --task text-generation-with-past`), used in place. Put it in the
    ///   [`ladder`](Self::ladder) to make it a rung (the last ladder model, uncompressed, is the gold candidate);
    /// - a Hugging Face ONNX export folder of a sentence encoder (`--task feature-extraction`): it joins the
    ///   [`encoders`](Self::encoders) of embedding filters.
    pub fn model(mut self, name: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        let name = name.into();
        add_missing(&mut self.config.models, [&name]);
        self.config.user_models.push((name, path.into()));
        self
    }

    /// The session: links the operator plugins and builds the registry under this configuration.
    pub fn build(self) -> Result<Session> {
        let c = &self.config;
        if c.operators.provider == ExecutionProvider::Cuda && !cfg!(feature = "cuda") {
            return Err(Error::Query("the CUDA execution provider needs Stretto built with `--features cuda`".into()));
        }
        crate::engine::check_sample(c.sample_fraction, c.max_sample)?;
        if c.operators.ladder.is_empty() {
            return Err(Error::Query("the LLM ladder names no model".into()));
        }
        let home = c.operators.model_home.clone();
        let mut encoders = Vec::new();
        for (name, path) in &c.user_models {
            if stretto_kv::prepare::register_model(&home, name, path)? == UserKind::Encoder {
                encoders.push(name.clone());
            }
        }
        let home = &home;
        let mut config = self.config;
        if self.ladder_named {
            add_missing(&mut config.models, &config.operators.ladder);
        }
        // A model brought with `model` is allowed, whatever `models` set before or after it.
        let user: Vec<String> = config.user_models.iter().map(|(n, _)| n.clone()).collect();
        add_missing(&mut config.models, &user);
        add_missing(&mut config.operators.encoders, &encoders);
        let c = &config;
        for m in &c.operators.ladder {
            stretto_kv::prepare::check_decoder_name(home, m)?;
        }
        for m in &c.operators.encoders {
            stretto_kv::prepare::check_encoder_name(home, m)?;
        }
        crate::engine::check_models(home, &c.models)?;
        // What answers cost is kept beside the memo, so that a later session's pay checks can read it.
        config.operators = config.operators.with_persisted_costs()?;
        let registry = crate::registry_for(&config.operators)?;
        Ok(Session {
            inner: Arc::new(SessionState { config, registry: RwLock::new(registry), tables: RwLock::default() }),
        })
    }
}

/// Appends to `list` each of `names` it lacks, in order.
fn add_missing<'a>(list: &mut Vec<String>, names: impl IntoIterator<Item = &'a String>) {
    for n in names {
        if !list.contains(n) {
            list.push(n.clone());
        }
    }
}

/// A Stretto session: owns its configuration, operator registry, registered tables and the models its operators
/// load. Cheap to clone (shared).
///
/// Two sessions with different settings (model homes, memo directories, ladders) work side by side in one process.
/// A model stays loaded between a session's queries and is freed when the last session holding it is dropped
/// (with its clones and the frames built from it); sessions alive at once with the same model home and runtime
/// settings share one loaded copy.
#[derive(Clone)]
pub struct Session {
    inner: Arc<SessionState>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("config", &self.inner.config).finish_non_exhaustive()
    }
}

impl Session {
    /// A builder with defaults under `model_home`.
    pub fn builder(model_home: impl Into<PathBuf>) -> SessionBuilder {
        SessionBuilder::new(model_home)
    }

    /// The configuration.
    pub fn config(&self) -> &SessionConfig {
        &self.inner.config
    }

    /// The operator registry (read access).
    pub fn registry(&self) -> RwLockReadGuard<'_, Registry> {
        self.inner.registry()
    }

    /// Adds an operator built at run time; queries of this session may then use it like a linked one.
    pub fn register(&self, op: Arc<dyn PhysicalOp>) -> Result<()> {
        let mut r = self.inner.registry.write().unwrap_or_else(|p| p.into_inner());
        Ok(r.register(op, "session")?)
    }

    /// What the model home, KV directory and memo of this session hold, and (with `verify`) whether every model
    /// artifact and KV record still checks out; see [`crate::doctor`].
    pub fn doctor(&self, verify: bool) -> Result<crate::doctor::DoctorReport> {
        crate::doctor::examine(&self.config().operators, verify)
    }

    /// Registers `batch` as table `name`.
    pub fn register_batch(&self, name: &str, batch: RecordBatch) -> Result<()> {
        // Validates the name the way plans do.
        PlanBuilder::scan(name, &batch)?;
        self.inner.tables.write().unwrap_or_else(|p| p.into_inner()).insert(name.to_string(), batch);
        Ok(())
    }

    /// Reads a CSV file and registers it as `name`.
    pub fn register_csv(&self, name: &str, path: impl AsRef<Path>, options: &CsvOptions) -> Result<()> {
        self.register_batch(name, io::read_csv(path.as_ref(), options)?)
    }

    /// Reads a Parquet file and registers it as `name`.
    pub fn register_parquet(&self, name: &str, path: impl AsRef<Path>, options: &ReadOptions) -> Result<()> {
        self.register_batch(name, io::read_parquet(path.as_ref(), options)?)
    }

    /// The registered tables, by name.
    pub fn tables(&self) -> Vec<(String, RecordBatch)> {
        let tables = self.inner.tables.read().unwrap_or_else(|p| p.into_inner());
        tables.iter().map(|(n, b)| (n.clone(), b.clone())).collect()
    }

    /// A registered table as a frame.
    pub fn table(&self, name: &str) -> Result<DataFrame> {
        let tables = self.inner.tables.read().unwrap_or_else(|p| p.into_inner());
        let batch = tables.get(name).ok_or_else(|| {
            Error::Query(format!(
                "no table `{name}` is registered; registered: {}",
                tables.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })?;
        DataFrame::scan(self.inner.clone(), name, batch, name)
    }

    /// A frame over a CSV file; the table is named after the file stem.
    pub fn read_csv(&self, path: impl AsRef<Path>, options: &CsvOptions) -> Result<DataFrame> {
        let path = path.as_ref();
        let batch = io::read_csv(path, options)?;
        DataFrame::scan(self.inner.clone(), &io::table_name(path)?, &batch, &path.display().to_string())
    }

    /// A frame over a Parquet file; the table is named after the file stem.
    pub fn read_parquet(&self, path: impl AsRef<Path>, options: &ReadOptions) -> Result<DataFrame> {
        let path = path.as_ref();
        let batch = io::read_parquet(path, options)?;
        DataFrame::scan(self.inner.clone(), &io::table_name(path)?, &batch, &path.display().to_string())
    }

    /// A frame over a JSON file (one object per line, or an array of objects); the table is named after the file stem.
    pub fn read_json(&self, path: impl AsRef<Path>, options: &ReadOptions) -> Result<DataFrame> {
        let path = path.as_ref();
        let batch = io::read_json(path, options)?;
        DataFrame::scan(self.inner.clone(), &io::table_name(path)?, &batch, &path.display().to_string())
    }

    /// A frame over a file whose format its extension names (CSV, TSV, Parquet, JSON), as table `table` (default: the
    /// file stem).
    pub fn read_file(&self, path: impl AsRef<Path>, table: Option<&str>) -> Result<DataFrame> {
        let path = path.as_ref();
        let batch = io::read_path(path)?;
        let name = match table {
            Some(t) => t.to_string(),
            None => io::table_name(path)?,
        };
        DataFrame::scan(self.inner.clone(), &name, &batch, &path.display().to_string())
    }

    /// A table of a bundled dataset (`session.dataset("movie")?.table("reviews")`).
    pub fn dataset(&self, name: &str) -> Result<BundledDataset> {
        Ok(BundledDataset { session: self.clone(), dataset: Dataset::load(name)? })
    }
}

/// A bundled dataset, opened through a session.
#[derive(Debug)]
pub struct BundledDataset {
    session: Session,
    dataset: Dataset,
}

impl BundledDataset {
    /// Its table `name` as a frame.
    pub fn table(&self, name: &str) -> Result<DataFrame> {
        let batch = self.dataset.table(name)?;
        DataFrame::scan(self.session.inner.clone(), name, batch, &format!("{} ({name})", self.dataset.name))
    }

    /// Its table names.
    pub fn table_names(&self) -> &[String] {
        self.dataset.table_names()
    }
}
