//! The engine behind [`Session`](crate::Session) and the `stretto` CLI: for the semantic pipeline of a pulled-up
//! plan, prepare KV caches, profile every candidate physical operator on a seeded sample, optimize under
//! precision/recall targets, execute on the whole input, and (with `check`) run the gold plan to measure what the
//! plan achieved. The phases are callable one by one: [`profile_pipeline`] then [`finish_pipeline`] (which a
//! benchmark calls once per method and target on one profile).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{RecordBatch, UInt32Array};
use arrow::compute::kernels::take::take_record_batch;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use stretto_core::datasets::Dataset;
use stretto_core::exec::{CascadeExecutor, CascadePlan, PaidAnswers, StageStats};
use stretto_core::format::PlanFile;
use stretto_core::op::{LogicalKind, Modality, OpOutput, RegisteredOp, Registry, SemanticTask, ValueType};
use stretto_core::plan::PlanBuilder;
use stretto_core::table::{resolve_column, ColumnKind};
use stretto_kv::press::Positions;
use stretto_optim::problem::Problem;
use stretto_optim::profile::{LogicalEntry, PhysicalEntry, Profile, PROFILE_FORMAT};
use stretto_optim::strategy::{strategy, Certification, Global, Optimized, Strategy, Targets};

use crate::error::{Error, Result};

/// What to run.
#[derive(Debug, Clone)]
pub struct QueryOptions {
    /// Where the data came from (a bundled dataset's name, a file), for the report.
    pub dataset: String,
    /// Semantic operators joined by ` -- `.
    pub query: String,
    /// Precision target in (0, 1].
    pub precision: f64,
    /// Recall target in (0, 1].
    pub recall: f64,
    /// Credible level in (0, 1).
    pub credible: f64,
    /// Optimizer strategy.
    pub method: String,
    /// The hold-out rules of the strategy that will optimize, where it is not `method`'s default (a certified
    /// strategy built with its own [`Certification`]): the pay checks foresee its certificate. `None` takes
    /// [`strategy`]`(method)`'s. Only the pay checks read it: the strategy that optimizes is the one the caller
    /// passes ([`optimize`], [`crate::DataFrame::collect_with`]); [`run_pipeline`] optimizes with `method`'s.
    pub certification: Option<Certification>,
    /// Whether the pay checks price the profiling answers already in the memo at the seconds they once cost, as a
    /// cold run would pay them (the bench's replays of a cold memo need this), rather than as free: by default an
    /// answer an earlier query computed costs a profile nothing.
    pub price_memo_hits: bool,
    /// Seed of the sample and the optimizer.
    pub seed: u64,
    /// Fraction of the input profiled.
    pub sample_fraction: f64,
    /// Fewest tuples profiled (all of them when the input is smaller).
    pub min_sample: usize,
    /// Most tuples profiled, whatever the fraction: a certificate's strength comes from how many tuples it
    /// holds out, not from what share of the input they are, so the cross product of a semantic join (tens of
    /// thousands of pairs) is profiled on a sample of this size, not on 15% of it.
    pub max_sample: usize,
    /// Tuples of the first profiling stage, drawn outside the profiling sample: every candidate answers them, and
    /// candidates they show to be hopeless or dominated are not profiled on the sample ([`screen`]). 0 profiles
    /// every candidate on the whole sample.
    pub screen: usize,
    /// Rows read from each table.
    pub limit: Option<usize>,
    /// Result rows wanted, when the pipeline's consumer stops after that many (SQL's `LIMIT k` right above the
    /// pipeline, a frame's `limit(k)` after its semantic operations): the pay check then weighs profiling against
    /// the tuples gold needs to find `k` rows, not against the whole input, KV caches are built up front only for
    /// the screening tuples (the rest on demand), and [`execute`] stops once the first `k` result rows are known.
    pub fetch: Option<usize>,
    /// Whether only the tuples profiling reads are prefilled before it (their KV caches), the others left to
    /// execution, which prefills each as it reaches it (the prefill counted in its seconds, as the optimizer
    /// assumes): for a certification whose plan runs elsewhere, on a cluster's executors, which would otherwise
    /// find every cache built by one client. By default every input tuple's caches are built first, within the
    /// disk budget. With a [`fetch`](Self::fetch), only the screening tuples' caches are built first either way.
    pub prefill_profiled_only: bool,
    /// Models physical operators may use (operators without a model are always allowed).
    pub models: Vec<String>,
    /// Also run the gold plan on everything and measure precision and recall.
    pub check: bool,
    /// True labels of the input tuples: the result (and, with `check`, gold's) is then also scored against them.
    pub labels: Option<TruthLabels>,
    /// Where the profile and the plan are written (nowhere when `None`).
    pub run_dir: Option<PathBuf>,
    /// Progress bars.
    pub progress: bool,
}

impl QueryOptions {
    /// Defaults for a dataset and query: targets 0.9/0.9 at 95%, global, 15% sample (at least 40), SmolLM2 + MiniLM.
    pub fn new(dataset: &str, query: &str) -> Self {
        Self {
            dataset: dataset.into(),
            query: query.into(),
            precision: 0.9,
            recall: 0.9,
            credible: 0.95,
            method: "global".into(),
            certification: None,
            price_memo_hits: false,
            seed: 42,
            sample_fraction: 0.15,
            min_sample: 40,
            max_sample: DEFAULT_MAX_SAMPLE,
            screen: 20,
            limit: None,
            fetch: None,
            prefill_profiled_only: false,
            models: vec!["smollm2-135m".into(), "minilm".into(), "efficientnet-lite0".into()],
            check: false,
            labels: None,
            run_dir: None,
            progress: false,
        }
    }

    /// Checks what can be checked before any data is read or model run: the targets, the method, and the sample
    /// settings ([`check_sample`]).
    pub fn check(&self) -> Result<()> {
        Targets::new(self.precision, self.recall, self.credible)?;
        strategy(&self.method)?;
        check_sample(self.sample_fraction, self.max_sample)?;
        if self.check && self.fetch.is_some() {
            return Err(Error::Query(
                "check compares the result with gold's on every input tuple; it cannot run with a fetch (a limit on \
                 results), which stops execution early"
                    .into(),
            ));
        }
        if self.limit == Some(0) {
            return Err(Error::Query("limit 0 leaves no rows to query; give at least 1".into()));
        }
        Ok(())
    }
}

/// Checks that every model a query may use (`models`) is a catalog model or one of the user's, registered under
/// `home`: a misspelt name would otherwise leave its operators out of the query without a word, and gold to whatever
/// remains (the keyword filter, where no model is left).
pub fn check_models(home: &std::path::Path, models: &[String]) -> Result<()> {
    for m in models {
        if !stretto_kv::prepare::is_user_model(home, m) {
            stretto_kv::models::spec(m)?;
        }
    }
    Ok(())
}

/// Checks a profiling sample's settings: its `fraction` of the input in (0, 1], and a `max` of at least one tuple.
pub fn check_sample(fraction: f64, max: usize) -> Result<()> {
    if !(fraction > 0.0 && fraction <= 1.0) {
        return Err(Error::Query(format!("sample fraction {fraction} is outside (0, 1]")));
    }
    if max == 0 {
        return Err(Error::Query("the most tuples profiled (max sample) is 0; it must be at least 1".into()));
    }
    Ok(())
}

/// Parses the benchmark syntax: operators separated by ` -- `; an operator naming an output field in brackets
/// (`Extract the movie [title] mentioned in {reviews.reviewtext}`) is a map, any other a filter.
pub fn parse_query(query: &str) -> Result<Vec<SemanticTask>> {
    let mut tasks = Vec::new();
    let mut names = BTreeSet::new();
    for (i, part) in query.split(" -- ").map(str::trim).enumerate() {
        if part.is_empty() {
            return Err(Error::Query(format!(
                "operator {} of the query is empty (operators are separated by ` -- `)",
                i + 1
            )));
        }
        let refs = stretto_core::op::parse_references(part)?;
        if refs.is_empty() {
            return Err(Error::Query(format!(
                "operator `{part}` references no column; write columns as {{table.column}}"
            )));
        }
        let task = match (part.find('['), part.find(']')) {
            (Some(open), Some(close)) if close > open + 1 => {
                let written = part[open + 1..close].trim();
                // `[number of attachments]` names the column `number_of_attachments`.
                let field = written.split_whitespace().collect::<Vec<_>>().join("_");
                if field.is_empty() || !field.chars().all(|c| c.is_alphanumeric() || c == '_') {
                    return Err(Error::Query(format!(
                        "output field `[{written}]` must be a name (letters, digits, _ or spaces)"
                    )));
                }
                let prompt = format!("{}{}{}", &part[..open], written.replace('_', " "), &part[close + 1..]);
                let lower = part.to_lowercase();
                let ty = if field.starts_with("num") || lower.contains("number of") || lower.contains("how many") {
                    ValueType::Integer
                } else {
                    ValueType::String
                };
                SemanticTask::map(field.clone(), prompt, field, ty)
            }
            (None, None) => SemanticTask::filter(format!("f{}", i + 1), part),
            _ => return Err(Error::Query(format!("operator `{part}` has an unbalanced `[`/`]` output field"))),
        };
        if !names.insert(task.name.clone()) {
            return Err(Error::Query(format!("two operators are both named `{}`", task.name)));
        }
        tasks.push(task);
    }
    Ok(tasks)
}

/// A query's end-to-end cost in operator-reported seconds (each answer counted at what computing it cost, whether
/// it was computed now or read from the memo), so that runs compare whatever the memo already held.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct CostAccount {
    /// Screening and profiling on the sample (0 for a profile saved by an earlier run).
    pub profiling_seconds: f64,
    /// The plan's stages on the whole input.
    pub execution_seconds: f64,
    /// The part of `execution_seconds` whose answers profiling had already computed (execution reads them from the
    /// memo): counted once, in profiling.
    pub reused_seconds: f64,
    /// `profiling + execution − reused`.
    pub total_seconds: f64,
    /// The gold plan (its stages ordered) on every input tuple (with a fetch met early, on the tuples execution
    /// went through): what running gold directly, with no profiling, costs. Measured (the execution's cost) when the plan that ran is gold; otherwise estimated from gold's cost
    /// on the profiled tuples, which were timed beside the query's other operators and may read high.
    pub gold_estimate_seconds: f64,
    /// Whether `gold_estimate_seconds` is measured (the plan that ran is gold).
    pub gold_measured: bool,
}

/// Everything a query run reports.
#[derive(Debug, Clone, serde::Serialize)]
pub struct QueryReport {
    /// The query.
    pub query: String,
    /// Dataset and slice.
    pub dataset: String,
    /// Tuples the semantic operators ran on.
    pub input_rows: usize,
    /// Where execution stopped early, its fetch of result rows met ([`QueryOptions::fetch`]): the first tuples it
    /// went through. `None`: every input tuple.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub executed_rows: Option<usize>,
    /// Tuples profiled.
    pub sample_rows: usize,
    /// The optimized plan (stages in order, thresholds, prediction, warnings).
    pub plan: PlanFile,
    /// The targets.
    pub targets: serde_json::Value,
    /// Certified lower bounds of the plan.
    pub bounds: serde_json::Value,
    /// With `check`: precision and recall against the gold plan on every input tuple.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub achieved: Option<serde_json::Value>,
    /// With labels: precision, recall and F1 of the result (and, with `check`, of gold's) against the true labels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truth: Option<serde_json::Value>,
    /// Seconds per phase.
    pub timings: BTreeMap<String, f64>,
    /// What the query cost end to end in operator seconds, beside what the gold plan alone would have cost.
    pub cost: CostAccount,
    /// Per-stage counts and seconds.
    pub stages: Vec<StageStats>,
    /// Result columns, in order.
    pub columns: Vec<String>,
    /// Result rows (column → value).
    pub rows: Vec<serde_json::Map<String, serde_json::Value>>,
    /// Operators profiled per logical operator (gold first).
    pub candidates: BTreeMap<String, Vec<String>>,
    /// The first profiling stage, if it ran: the candidates it dropped and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub screening: Option<Screening>,
    /// Where only the tuples profiling reads were prefilled before it (execution prefilling the others as it
    /// reaches them), why: the whole input's KV caches would not fit the disk budget (with the figures), or
    /// execution runs elsewhere ([`QueryOptions::prefill_profiled_only`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_caches: Option<String>,
    /// Files written.
    pub files: Vec<String>,
    /// The result table: the semantic pipeline's output after post-filters and projection.
    #[serde(skip)]
    pub result: RecordBatch,
}

/// What a task's columns hold. An image operator reads the one image its item names, so a prompt (not a join
/// predicate, whose sides are read apart) that names an image column beside any other column is refused here,
/// before any model work: its item would be the paths and texts joined, which no operator can read.
fn modality_of(task: &SemanticTask, batch: &RecordBatch) -> Result<Modality> {
    let schema = batch.schema();
    let (mut images, mut others) = (Vec::new(), Vec::new());
    for r in task.references()? {
        let idx = resolve_column(&schema, &r, &format!("operator `{}`", task.prompt))?;
        if ColumnKind::of_field(schema.field(idx)) == ColumnKind::Image {
            images.push(r);
        } else {
            others.push(r);
        }
    }
    if images.is_empty() {
        return Ok(Modality::Text);
    }
    if images.len() + others.len() > 1 && !task.is_join() {
        let beside: Vec<String> = images[1..].iter().chain(&others).map(|r| format!("{{{r}}}")).collect();
        return Err(Error::Query(format!(
            "`{}` names the image column {{{}}} beside {}: an image operator judges one image alone. Ask about the \
             image in a semantic operator of its own (`{{{}}} shows …`) and about the other columns in another",
            task.prompt,
            images[0],
            beside.join(", "),
            images[0]
        )));
    }
    Ok(Modality::Image)
}

/// Candidate operators of a task, with the gold one first.
fn candidates(
    registry: &Registry,
    task: &SemanticTask,
    modality: Modality,
    models: &[String],
) -> Result<Vec<Arc<RegisteredOp>>> {
    let allowed = |m: &Option<String>| m.as_ref().is_none_or(|m| m.split('+').all(|p| models.iter().any(|a| a == p)));
    let mut ops: Vec<Arc<RegisteredOp>> = registry
        .operators()
        .map(|(op, _)| op.clone())
        .filter(|op| {
            let p = op.properties();
            op.serves(task) && p.modality == modality && allowed(&p.model)
        })
        .collect();
    if ops.is_empty() {
        return Err(Error::Query(format!(
            "no {} operator for {} columns{} among the allowed models ({})",
            task.kind,
            modality,
            if task.is_join() { " that judges the pairs of a join predicate" } else { "" },
            models.join(", ")
        )));
    }
    // Gold: a declared gold rung of the task if allowed; for a join predicate whose declared gold is not allowed,
    // the dearest allowed operator of that gold's family (the projection of each side stays the reference of a
    // predicate comparing one property of the sides, on a smaller model); else the dearest uncompressed LLM rung,
    // else the dearest operator.
    let gold_family = task
        .is_join()
        .then(|| {
            registry
                .operators()
                .map(|(op, _)| op)
                .find(|op| op.serves(task) && op.is_gold_for(task))
                .map(|op| op.properties().family.clone())
        })
        .flatten();
    let gold = ops
        .iter()
        .position(|o| o.is_gold_for(task))
        .or_else(|| {
            let family = gold_family.as_ref()?;
            ops.iter()
                .enumerate()
                .filter(|(_, o)| &o.properties().family == family)
                .max_by(|a, b| a.1.properties().cost_hint.total_cmp(&b.1.properties().cost_hint))
                .map(|(i, _)| i)
        })
        .or_else(|| {
            ops.iter()
                .enumerate()
                .filter(|(_, o)| o.properties().compression == Some(0.0))
                .max_by(|a, b| a.1.properties().cost_hint.total_cmp(&b.1.properties().cost_hint))
                .map(|(i, _)| i)
        })
        .or_else(|| {
            ops.iter()
                .enumerate()
                .max_by(|a, b| a.1.properties().cost_hint.total_cmp(&b.1.properties().cost_hint))
                .map(|(i, _)| i)
        })
        .unwrap_or(0);
    let g = ops.remove(gold);
    ops.insert(0, g);
    Ok(ops)
}

/// Why `task`'s gold, as [`candidates`] chose it among `models`, is not an LLM where the registry has an LLM rung that
/// judges the task but `models` allow none: `None` where gold is an LLM rung, is the task's declared gold, or no LLM
/// serves the task at all.
fn gold_not_an_llm(
    registry: &Registry,
    task: &SemanticTask,
    modality: Modality,
    gold: &RegisteredOp,
    models: &[String],
) -> Option<String> {
    let is_llm = |op: &RegisteredOp| op.properties().compression.is_some();
    if is_llm(gold) || gold.is_gold_for(task) {
        return None;
    }
    let llm = registry
        .operators()
        .map(|(op, _)| op)
        .find(|op| is_llm(op) && op.serves(task) && op.properties().modality == modality)?;
    Some(format!(
        "{}: the allowed models ({}) leave no LLM that judges it, so its gold is `{}` (of the {} family) and the \
         targets are met against its answers; allow a decoder (such as {}) in the query's models or ladder for an \
         LLM gold",
        task.name,
        models.join(", "),
        gold.name(),
        gold.properties().family,
        llm.properties().model.as_deref().unwrap_or("a ladder model")
    ))
}

/// The items whose KV caches a task's operators read: each row's item, or for a join predicate each side's text
/// once (its pair operators read the sides' caches, never a pair's), in order of first appearance; none of a row
/// no operator is asked about ([`SemanticTask::unknown_rows`]).
fn cached_items(task: &SemanticTask, batch: &RecordBatch) -> Result<Vec<String>> {
    let items = task.known_items(batch)?;
    if !task.is_join() {
        return Ok(items);
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for pair in items {
        let (left, right) = stretto_core::op::split_pair(&pair).unwrap_or((&pair, ""));
        for side in [left, right] {
            if seen.insert(side.to_string()) {
                out.push(side.to_string());
            }
        }
    }
    Ok(out)
}

/// Where model `m`'s KV pasts are found and stored, within the disk budget and the context's memory budget for one
/// prefill: the uncompressed profile, whose missing items' prefill also writes their records at every compression
/// ratio of the ladder ([`stretto_kv::cache::LADDER`]), which the compressed rungs read.
fn past_source(
    ctx: &stretto_core::OpContext,
    budget: &Arc<stretto_kv::budget::DiskBudget>,
    m: &str,
) -> stretto_kv::cache::PastSource {
    past_source_at(ctx, m, 0.0).with_budget(budget.clone())
}

/// Model `m`'s KV pasts at compression `ratio` (no disk budget: for looking records up), under the press its rungs
/// use ([`stretto_ops_text::llm::default_press`]: key-norm for a Hugging Face export, which returns no query
/// statistics).
fn past_source_at(ctx: &stretto_core::OpContext, m: &str, ratio: f64) -> stretto_kv::cache::PastSource {
    let press = stretto_ops_text::llm::default_press(ctx, m);
    let profile = stretto_kv::store::Profile { model: m.to_string(), press, ratio, positions: Positions::Keep };
    stretto_kv::cache::PastSource::new(profile, ctx.kv_dir.clone())
        .with_memory_budget(ctx.memory_budget.unwrap_or(stretto_kv::decoder::DEFAULT_MEMORY_BUDGET))
}

/// Per logical operator (by index into `cands`), the decoders whose item caches its candidates read; operators
/// none of whose candidates reads a cache are left out.
fn cache_jobs(
    ctx: &stretto_core::OpContext,
    cands: &[Vec<Arc<RegisteredOp>>],
) -> Result<Vec<(usize, Vec<Arc<stretto_kv::Decoder>>)>> {
    let mut jobs = Vec::new();
    for (t, ops) in cands.iter().enumerate() {
        let models: BTreeSet<String> = ops.iter().filter_map(|op| op.kv_cache_model().map(str::to_string)).collect();
        if models.is_empty() {
            continue;
        }
        let decs = models
            .iter()
            .map(|m| stretto_ops_text::decoder(ctx, m, stretto_kv::convert::Weights::F32))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        jobs.push((t, decs));
    }
    Ok(jobs)
}

/// What [`prefill_pipeline`] did, per model: how many items (per row and logical operator reading them, so an item
/// two operators read counts twice) it looked at, and how many of them it prefilled because no record of theirs was
/// stored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prefilled {
    /// Per model: (items looked at, items prefilled).
    pub models: BTreeMap<String, (usize, usize)>,
    /// Wall seconds it took.
    pub seconds: f64,
}

/// Builds, where missing, the KV caches of every input item for every LLM model a query's candidates read (their
/// records at every ratio of the compression ladder), as step 2 of [`profile_pipeline`] does with no fetch and no
/// deferral, and nothing else: no answer is asked, timed or memoised. The method prefills offline; this is that
/// offline step on its own, so that a timed run (`stretto bench all`, which prices answers at the seconds they
/// took) can start on built caches while the prefill itself ran on a machine busy with other work. Idempotent:
/// stored caches are found by content. An error if the disk budget (`STRETTO_DISK_BUDGET`) cannot hold them all,
/// naming how many items were left without a record: the timed run would prefill those inside its timed answers.
pub fn prefill_pipeline(
    registry: &Registry,
    pulled: &stretto_core::plan::PulledUpPlan,
    input: &RecordBatch,
    o: &QueryOptions,
) -> Result<Prefilled> {
    let started = Instant::now();
    let tasks = &pulled.semantic;
    let mut cands = Vec::new();
    for t in tasks {
        t.resolve(&input.schema())?;
        cands.push(candidates(registry, t, modality_of(t, input)?, &o.models)?);
    }
    let ctx = registry.context();
    let budget = disk_budget(ctx)?;
    let _lease = budget.lease()?;
    let _span = tracing::info_span!("kv_caches", tuples = input.num_rows()).entered();
    let mut out = Prefilled::default();
    for (t, decs) in cache_jobs(ctx, &cands)? {
        let items = cached_items(&tasks[t], input)?;
        for dec in decs {
            let seconds = past_source(ctx, &budget, dec.name()).ensure_timed(&dec, &items)?;
            let (looked, built) = out.models.entry(dec.name().to_string()).or_default();
            *looked += items.len();
            *built += seconds.iter().filter(|s| s.is_some()).count();
            // The prefill stops at the first record the budget cannot hold (and an earlier record may have been
            // evicted since): every item must now have its record at every ratio a rung reads.
            for ratio in stretto_kv::cache::LADDER {
                let stored = past_source_at(ctx, dec.name(), ratio);
                let mut missing = 0;
                for item in &items {
                    missing += usize::from(!stored.is_stored(&dec, item)?);
                }
                if missing > 0 {
                    return Err(Error::Query(format!(
                        "the disk budget ({}) did not hold the KV caches of {}: {missing} of its {} items have no \
                         record at compression {ratio}; raise STRETTO_DISK_BUDGET or free space in {}",
                        ctx.disk_budget.map_or("its default".to_string(), |b| format!("{:.1} GB", b as f64 / 1e9)),
                        dec.name(),
                        items.len(),
                        ctx.kv_dir.display()
                    )));
                }
            }
        }
    }
    out.seconds = started.elapsed().as_secs_f64();
    Ok(out)
}

/// The disk budget of the context's KV directory and memo, shared with its operators.
fn disk_budget(ctx: &stretto_core::OpContext) -> Result<std::sync::Arc<stretto_kv::budget::DiskBudget>> {
    Ok(stretto_kv::budget::shared(&ctx.kv_dir, ctx.memo_dir(), ctx.disk_budget)?)
}

/// The relational input of a query's semantic operators over a dataset (tables cross-joined when several), its
/// tables named in any case.
pub fn input_of(
    dataset: &str,
    tasks: &[SemanticTask],
    limit: Option<usize>,
) -> Result<(RecordBatch, stretto_core::plan::PulledUpPlan)> {
    let ds = Dataset::load(dataset)?;
    input_from(|t| Ok(ds.table(ds.table_spelling(t))?.clone()), tasks, limit)
}

/// The relational input of a query's semantic operators over the tables `table` gives by name (cross-joined when
/// the query references several), each cut to its first `limit` rows.
pub fn input_from(
    table: impl Fn(&str) -> Result<RecordBatch>,
    tasks: &[SemanticTask],
    limit: Option<usize>,
) -> Result<(RecordBatch, stretto_core::plan::PulledUpPlan)> {
    let mut tables = BTreeSet::new();
    for task in tasks {
        for r in task.references()? {
            let (table, _) = r
                .split_once('.')
                .ok_or_else(|| Error::Query(format!("reference {{{r}}} must be qualified as {{table.column}}")))?;
            tables.insert(table.to_string());
        }
    }
    // One table spelled two ways would be read twice and cross-joined with itself.
    let mut spellings: BTreeMap<String, &String> = BTreeMap::new();
    for t in &tables {
        if let Some(other) = spellings.insert(t.to_ascii_lowercase(), t) {
            return Err(Error::Query(format!(
                "the query spells one table two ways, `{other}` and `{t}`: spell it one way in every reference"
            )));
        }
    }
    let mut builder: Option<PlanBuilder> = None;
    for t in &tables {
        let full = table(t)?;
        let batch = match limit {
            Some(n) if n < full.num_rows() => full.slice(0, n),
            _ => full,
        };
        let scan = PlanBuilder::scan(t, &batch)?;
        builder = Some(match builder {
            None => scan,
            Some(b) => b.cross_join(scan)?,
        });
    }
    let mut builder = builder.ok_or_else(|| Error::Query("the query references no table".into()))?;
    for task in tasks {
        builder = match &task.output {
            None => builder.sem_filter_named(&task.name, &task.prompt)?,
            Some((column, ty)) => builder.sem_map(column, &task.prompt, *ty)?,
        };
    }
    let pulled = builder.build().pull_up()?;
    let input = pulled.relational.execute_relational()?;
    Ok((input, pulled))
}

/// Runs a query over a bundled dataset end to end.
pub fn run_query(registry: &Registry, o: &QueryOptions) -> Result<QueryReport> {
    // Checked before the data is even read: nothing else can go wrong cheaply.
    o.check()?;
    let tasks = parse_query(&o.query)?;
    let (input, pulled) = input_of(&o.dataset, &tasks, o.limit)?;
    run_pipeline(registry, &pulled, &input, o)
}

/// Runs the semantic part of a pulled-up plan (`pulled.semantic`) on `input` (the output of its relational part)
/// with the targets and settings of `o` (its `query` is only a label here): KV caches, profiling, optimization,
/// execution, and the gold check if asked.
pub fn run_pipeline(
    registry: &Registry,
    pulled: &stretto_core::plan::PulledUpPlan,
    input: &RecordBatch,
    o: &QueryOptions,
) -> Result<QueryReport> {
    o.check()?;
    check_models(&registry.context().model_home, &o.models)?;
    if input.num_rows() == 0 {
        return empty_input(pulled, input, o);
    }
    let profiled = profile_to_run(registry, pulled, input, o)?;
    finish_pipeline(registry, pulled, &profiled, o)
}

/// Checks that `o`'s true labels, if any, hold one value per input tuple of the `n`.
fn labels_align(o: &QueryOptions, n: usize) -> Result<()> {
    match &o.labels {
        Some(l) if l.values.len() != n => Err(Error::Query(format!(
            "labels `{}` hold {} values for {n} input tuples; they must align with the query's input",
            l.column,
            l.values.len()
        ))),
        _ => Ok(()),
    }
}

/// The report of a pipeline whose input has no rows (an empty file, or relational filters that keep none): an
/// empty result with the pipeline's columns, as SQL gives, and a plan with no stages that says why. No operator
/// runs, nothing is profiled or written, and the bounds hold trivially (the empty result is exactly gold's). The
/// prompts are still checked against the input's columns.
pub fn empty_input(
    pulled: &stretto_core::plan::PulledUpPlan,
    input: &RecordBatch,
    o: &QueryOptions,
) -> Result<QueryReport> {
    let tasks = pulled.semantic.clone();
    if tasks.is_empty() {
        return Err(Error::Query("the plan has no semantic operator".into()));
    }
    let mut fields: Vec<arrow::datatypes::FieldRef> = input.schema().fields().iter().cloned().collect();
    for t in &tasks {
        modality_of(t, input)?;
        if let Some((column, ty)) = &t.output {
            fields.push(Arc::new(arrow::datatypes::Field::new(column, ty.data_type(), true)));
        }
    }
    let schema = Arc::new(arrow::datatypes::Schema::new(fields));
    let result = pulled.finish(RecordBatch::new_empty(schema))?;
    let mut plan = PlanFile::new(Vec::new());
    plan.query = Some(o.query.clone());
    plan.logical = tasks;
    plan.warnings
        .push(format!("{} has no rows to query: no semantic operator ran, and the result is empty", o.dataset));
    labels_align(o, 0)?;
    let truth = o
        .labels
        .as_ref()
        .map(|l| serde_json::json!({"column": l.column, "labelled": 0, "positives": 0, "plan": l.score(&[])}));
    Ok(QueryReport {
        query: o.query.clone(),
        dataset: o.dataset.clone(),
        input_rows: 0,
        executed_rows: None,
        sample_rows: 0,
        plan,
        targets: serde_json::json!({"precision": o.precision, "recall": o.recall, "credible": o.credible}),
        bounds: serde_json::json!({"precision": 1.0, "recall": 1.0, "fell_back_to_gold": false}),
        achieved: None,
        truth,
        timings: BTreeMap::from([("total".to_string(), 0.0)]),
        cost: CostAccount {
            profiling_seconds: 0.0,
            execution_seconds: 0.0,
            reused_seconds: 0.0,
            total_seconds: 0.0,
            gold_estimate_seconds: 0.0,
            gold_measured: true,
        },
        stages: Vec::new(),
        columns: result.schema().fields().iter().map(|f| f.name().clone()).collect(),
        rows: Vec::new(),
        candidates: BTreeMap::new(),
        screening: None,
        kv_caches: None,
        files: Vec::new(),
        result,
    })
}

/// Why a query about to run with `o` on `n` input tuples should profile only its gold operators, if it should:
/// the method is gold (nothing else will run), or the sample would cover the whole input, so that profiling every
/// implementation would cost at least running gold on every tuple and no plan can win it back, or the method
/// certifies its plans and the sample could not hold out enough gold result rows to certify any plan but gold even
/// if every tuple were one (its [`Certification`]; unless screening is off, which profiles every candidate).
pub fn gold_only_reason(o: &QueryOptions, n: usize) -> Option<String> {
    if o.method == "gold" {
        return Some("the gold plan was asked for: only the gold operators were profiled".into());
    }
    let sample = sample_size(o, n);
    if sample >= n {
        return Some(format!(
            "the input has {n} tuples and the profiling sample ({sample}) would cover all of them: profiling every \
             implementation costs more than running gold on everything, so gold ran directly (a larger input, or \
             a smaller minimum sample, lets the optimizer look for a cheaper plan)"
        ));
    }
    // `screen 0` asks for every candidate to be profiled, whatever the pay checks say.
    if o.screen == 0 {
        return None;
    }
    uncertifiable(o, sample, 1.0, " (were every tuple one)").map(|why| format!("{why}, so gold ran directly"))
}

/// The hold-out rules the pay checks assume for `o`'s strategy: [`QueryOptions::certification`], or the
/// method's default strategy's. `None` when the strategy certifies nothing.
fn certification(o: &QueryOptions) -> Option<Certification> {
    match &o.certification {
        Some(c) => Some(c.clone()),
        None => strategy(&o.method).ok()?.certification().cloned(),
    }
}

/// Whether `o`'s method certifies with one test of the whole result on the hold-out
/// ([`tests_whole_result`](stretto_optim::strategy::Strategy::tests_whole_result): `global`).
fn tests_whole_result(o: &QueryOptions) -> bool {
    strategy(&o.method).is_ok_and(|s| s.tests_whole_result())
}

/// Why no plan but gold can be certified for `o` on a profiling sample of `sample` tuples whose share of gold
/// result rows is at most `share`: its hold-out would hold fewer gold result rows than even an error-free plan
/// needs ([`min_certifiable_positives`](stretto_optim::strategy::min_certifiable_positives)), or fewer tuples
/// than the strategy certifies on at all. `None` when a plan could be, or the strategy certifies nothing.
fn uncertifiable(o: &QueryOptions, sample: usize, share: f64, given: &str) -> Option<String> {
    let cert = certification(o)?;
    let targets = Targets::new(o.precision, o.recall, o.credible).ok()?;
    let needed = stretto_optim::strategy::min_certifiable_positives(&targets);
    // The stratified split rounds each part's count to the nearest tuple.
    let held_out = cert.most_held_out(sample);
    let most = (held_out * share + 0.5).floor();
    // Each class is rounded apart, so the split holds out at most one more than the share rounded down.
    let most_tuples = held_out.floor() as usize + 1;
    if most_tuples < cert.min_holdout {
        return Some(format!(
            "the {sample}-tuple profiling sample would hold out at most {most_tuples} tuples for certification, \
             fewer than the {} the strategy certifies on, so no plan but gold can be certified",
            cert.min_holdout
        ));
    }
    if needed.is_infinite() {
        return Some(format!(
            "no hold-out certifies a target of 1 (precision {}, recall {}), so no plan but gold can be certified",
            o.precision, o.recall
        ));
    }
    (most < needed).then(|| {
        format!(
            "the {sample}-tuple profiling sample would hold out at most {most:.0} gold result rows{given} for \
             certification, and no plan but gold can be certified at precision {} and recall {} ({:.0}% credible) \
             on fewer than {:.0} of them, not even one without an error",
            o.precision,
            o.recall,
            100.0 * o.credible,
            needed.ceil()
        )
    })
}

/// The default most tuples profiled ([`QueryOptions::max_sample`]): inputs up to 4,000 tuples are profiled at the
/// default 15% unchanged.
pub const DEFAULT_MAX_SAMPLE: usize = 600;

fn sample_size(o: &QueryOptions, n: usize) -> usize {
    ((n as f64 * o.sample_fraction).ceil() as usize).min(o.max_sample).max(o.min_sample).min(n)
}

/// Steps 1–3 of [`run_pipeline`] for a query about to run: [`profile_pipeline`], or only the gold operators when
/// [`gold_only_reason`] says nothing else can pay for its profiling. Their sample answers are memoised, so
/// execution reuses them.
pub fn profile_to_run(
    registry: &Registry,
    pulled: &stretto_core::plan::PulledUpPlan,
    input: &RecordBatch,
    o: &QueryOptions,
) -> Result<Profiled> {
    match gold_only_reason(o, input.num_rows()) {
        Some(why) => profile_candidates(registry, pulled, input, o, Some(why), false),
        None => profile_candidates(registry, pulled, input, o, None, true),
    }
}

/// A pipeline prepared and profiled: what every plan for it (any method, any targets) starts from.
#[derive(Debug, Clone)]
pub struct Profiled {
    /// Logical operators.
    pub tasks: Vec<SemanticTask>,
    /// The semantic pipeline's input.
    pub input: RecordBatch,
    /// The profile.
    pub profile: Profile,
    /// Where the profile was written, if it was.
    pub profile_path: Option<PathBuf>,
    /// Tuples profiled.
    pub sample_rows: usize,
    /// Candidates per logical operator, gold first.
    pub candidates: BTreeMap<String, Vec<String>>,
    /// Seconds of the phases so far.
    pub timings: BTreeMap<String, f64>,
    /// Why only the gold operators were profiled (`None`: every candidate was): then every strategy answers with
    /// the gold plan, and the plan's warnings say why.
    pub gold_only: Option<String>,
    /// The first profiling stage: what it answered, and which candidates it dropped and why.
    pub screening: Option<Screening>,
    /// Where gold's plan answered the profiling sample before gold-only profiling was decided, or answered the
    /// [`gold_order_tuples`] beyond a gold-only profile's [`GOLD_PROFILE_TUPLES`]: the logical filters in the order
    /// the ordering's DP gives on its figures there (each filter's cost, and pass share on the tuples it was asked
    /// about), which gold's execution keeps (empty otherwise): more tuples than the gold-only profile's few, whose
    /// ties the DP may break either way.
    pub gold_order: Vec<String>,
    /// The answers this profiling computed (every profiled operator on the sample, every screened candidate on the
    /// screening tuples): execution reads them from the memo, and books their cost as reused. Empty for a profile
    /// saved by an earlier run.
    pub paid: Arc<PaidAnswers>,
    /// Operator-reported seconds this profiling spent (screening and sample; 0 for a saved profile).
    pub spent_seconds: f64,
    /// Where only the tuples profiling reads were prefilled before it, why (the disk budget, or execution
    /// elsewhere).
    pub kv_note: Option<String>,
    /// Per logical operator whose gold is no LLM because the query's models allow none that judges it (the
    /// registry has one), what its gold is instead: the plan's warnings repeat it, since the targets are then met
    /// against that operator's answers.
    pub gold_notes: Vec<String>,
    /// Where those caches are deferred: per profiled entry whose operator reads one, the model and the seconds of
    /// its per-item prefill priced into the entry's cost, which execution pays once per tuple and model
    /// ([`Problem::share_costs`]). Empty otherwise, and for a saved profile.
    pub shared_costs: BTreeMap<String, (String, f64)>,
}

/// The first stage of adaptive profiling ([`QueryOptions::screen`]).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Screening {
    /// Tuples screened (none of them in the profiling sample).
    pub tuples: usize,
    /// Their rows in the pipeline's input.
    pub rows: Vec<usize>,
    /// Operator-reported seconds of every candidate on them, gold included.
    pub seconds: f64,
    /// Candidates other than gold that answered some of them (each until it was dropped; the first ones, the
    /// probe's, at least), over every logical operator. 0 where gold alone answered: the costs earlier queries
    /// recorded, or gold's own answers, showed that no other could pay.
    pub candidates: usize,
    /// Candidates not profiled further.
    pub dropped: Vec<Dropped>,
}

/// A candidate the screening stage dropped.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Dropped {
    /// Logical operator.
    pub logical: String,
    /// Physical operator.
    pub operator: String,
    /// Why.
    pub reason: String,
}

/// How a candidate did on the screening tuples, against gold's answers there.
#[derive(Debug, Clone, Copy)]
struct Screened {
    /// Seconds per tuple.
    cost: f64,
    /// Filter: AUC of its scores against gold's decisions; map: the share of gold's values it gave. `None` where
    /// gold's answers do not tell (a filter gold accepted all or none of).
    quality: Option<f64>,
}

/// Screening tuples every candidate answers first, to learn what it costs per tuple beside gold: candidates as
/// dear as gold, and a screening that cannot pay, stop there.
pub const PROBE_TUPLES: usize = 4;

/// The looks at the `tail` screening tuples after the probe, as ranges of positions in it: with a pay check and at
/// least two probes' worth of them, two halves, with the pay checks between them (a first look, then the rest); else
/// one.
fn screening_looks(tail: usize, pay_check: bool) -> Vec<(usize, usize)> {
    if pay_check && tail >= 2 * PROBE_TUPLES {
        vec![(0, tail / 2), (tail / 2, tail)]
    } else {
        vec![(0, tail)]
    }
}

/// What the first look's tuples are called in a hopeless map's reason ([`Hopeless::on`]).
const FIRST_LOOK: &str = "screening tuples so far";

/// Most tuples gold answers before execution when gold alone will run (asked for, or profiling cannot pay): enough
/// to order its stages, since no certificate is needed. Every gold filter answers the first
/// [`GOLD_PROFILE_TUPLES`] of them (the profile); gold's plan answers the rest, [`PROBE_TUPLES`] at a time, each
/// filter only the tuples the earlier ones let through ([`Profiled::gold_order`]).
pub const GOLD_ORDER_TUPLES: usize = 20;

/// Tuples of a gold-only profile ordering two filters or more: every gold filter answers them, so that each one's
/// cost is known before gold's plan answers the rest of the [`GOLD_ORDER_TUPLES`]. A later filter's answer on a
/// tuple an earlier one rejects is one execution does not reuse, so one tuple.
pub const GOLD_PROFILE_TUPLES: usize = 1;

/// Tuples gold answers before execution when gold alone will run: [`GOLD_ORDER_TUPLES`] to order its filters, or
/// one where the query has at most one filter, whose plan's order needs no figures (maps run after the filters
/// whatever the sample says, [`order_plan`](stretto_optim::order::order_plan)); an answer of a later filter on a
/// profiled tuple that an earlier filter rejects is one execution does not reuse.
pub fn gold_order_tuples(tasks: &[SemanticTask]) -> usize {
    if tasks.iter().filter(|t| t.kind != LogicalKind::Map).count() <= 1 {
        1
    } else {
        GOLD_ORDER_TUPLES
    }
}

/// The probe tuples `task`'s candidates answer: `head` for a filter; for a map, those of `maps` once set (the probe
/// tuples gold's filters let through).
fn probe_rows<'a>(
    task: &SemanticTask,
    head: &'a RecordBatch,
    maps: &'a std::sync::OnceLock<(Vec<usize>, RecordBatch)>,
) -> &'a RecordBatch {
    match (task.kind, maps.get()) {
        (LogicalKind::Map, Some((_, rows))) => rows,
        _ => head,
    }
}

/// A candidate's answers on the screening tuples so far.
#[derive(Clone)]
struct Tried {
    /// Its index among the logical operator's candidates (0 is gold).
    idx: usize,
    output: OpOutput,
    /// Seconds per tuple.
    secs: Vec<f64>,
}

impl Tried {
    /// Mean seconds per tuple.
    fn cost(&self) -> f64 {
        per_tuple(&self.secs)
    }
}

/// For one logical operator, what the memo leaves profiling to compute (see [`QueryOptions::price_memo_hits`]).
struct Fresh {
    /// Per candidate, the sample tuples whose answers the memo lacks.
    sample: Vec<f64>,
    /// Per candidate and screening tuple after the probe, whether the memo lacks its answer.
    screening: Vec<Vec<bool>>,
    /// Tuples of the sample.
    sample_rows: f64,
}

/// What a pay check's stop message adds where its cost left out `free` answers the memo holds; nothing where none.
fn memo_note(free: f64) -> String {
    if free > 0.0 {
        format!(" ({free:.0} candidate answers already in the memo counted free)")
    } else {
        String::new()
    }
}

impl Fresh {
    /// Tuples candidate `idx` still has to answer: the sample's, and those of the screening after the probe from
    /// position `screened` on (the screening tuples after the probe answered so far; none left past its end).
    fn ahead(&self, idx: usize, screened: usize) -> f64 {
        self.sample[idx] + self.screening[idx].iter().skip(screened).filter(|u| **u).count() as f64
    }

    /// [`Fresh::ahead`] for an operator of `kind` asked, in profiling, about a share `reach` of the tuples: a map
    /// only about the gold result rows ([`profiled_rows`]) of the sample and of the rest of the screening, whose
    /// share gold's plan gives (a filter about all).
    fn ahead_profiled(&self, idx: usize, screened: usize, kind: LogicalKind, reach: f64) -> f64 {
        let share = if kind == LogicalKind::Map { reach } else { 1.0 };
        share * self.ahead(idx, screened)
    }

    /// Gold's answers profiling asks that gold's own plan would not, for an operator of `kind` that a share `reach`
    /// of the tuples reaches in that plan: a filter's on the rest of the sample (and of the screening, where some
    /// is left); a map's on none (profiling asks it only the gold result rows, as gold's plan does).
    fn gold_beyond_plan(&self, screened: usize, kind: LogicalKind, reach: f64) -> f64 {
        if kind == LogicalKind::Map {
            return 0.0;
        }
        (1.0 - reach) * self.ahead(0, screened)
    }

    /// The answers among those [`Fresh::ahead`] would count that the memo already holds.
    fn known(&self, idx: usize, screened: usize) -> f64 {
        let left = self.screening[idx].len().saturating_sub(screened);
        self.sample_rows + left as f64 - self.ahead(idx, screened)
    }
}

/// Whether profiling may run a query's logical operators side by side: only where the cores (or a GPU) leave each
/// its own threads. Otherwise they contend, and every answer's recorded seconds, which plans are priced on, would
/// be those of a crowded machine rather than of the execution that runs its stages one after another (measured on
/// 2 cores: Qwen 0.5B's filter question at 0.52 s per review beside three map operators, 0.118 s alone).
fn side_by_side(ctx: &stretto_core::context::OpContext, tasks: usize) -> bool {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // 0 threads is ONNX Runtime's choice: one per core.
    let per_op = if ctx.threads == 0 { cores } else { ctx.threads };
    ctx.cuda() || tasks.saturating_mul(per_op) <= cores
}

/// `f(i, task, candidates)` for every logical operator, in parallel (one thread each) when `parallel`, else one
/// after another; results in order.
fn per_task<T: Send>(
    tasks: &[SemanticTask],
    cands: &[Vec<Arc<RegisteredOp>>],
    parallel: bool,
    f: impl Fn(usize, &SemanticTask, &[Arc<RegisteredOp>]) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    if !parallel {
        return tasks.iter().zip(cands).enumerate().map(|(i, (task, ops))| f(i, task, ops)).collect();
    }
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> =
            tasks.iter().zip(cands).enumerate().map(|(i, (task, ops))| s.spawn(move || f(i, task, ops))).collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| Error::Query("a profiling thread panicked".into()))?)
            .collect::<Result<Vec<_>>>()
    })
}

/// Below this screening quality (AUC against gold, or share of gold's map values) a candidate is hopeless.
pub const HOPELESS_QUALITY: f64 = 0.6;
/// A candidate costing at least this share of gold's cost per tuple is no cheaper stage in front of gold.
pub const NEAR_GOLD_COST: f64 = 0.9;

/// Drops, after the probe (or the first look: `probe` is the screening tuples answered so far), the candidates as
/// dear as gold and the compressed rungs no cheaper than their uncompressed parent, with their reasons (gold and what
/// was already kept stay).
fn probe_drops(
    tasks: &[SemanticTask],
    cands: &[Vec<Arc<RegisteredOp>>],
    tried: &mut [Vec<Tried>],
    probe: usize,
    dropped: &mut Vec<Dropped>,
) {
    for ((task, ops), tried) in tasks.iter().zip(cands).zip(tried.iter_mut()) {
        let Some(gold) = tried.first().filter(|t| t.idx == 0).map(Tried::cost) else { continue };
        let costs: Vec<(usize, f64)> = tried.iter().map(|t| (t.idx, t.cost())).collect();
        tried.retain(|t| {
            let reason = if t.idx == 0 {
                None
            } else if t.cost() >= NEAR_GOLD_COST * gold {
                Some(format!(
                    "costs {:.4} s per tuple, {:.0}% of gold's (on the first {probe} screening tuples)",
                    t.cost(),
                    100.0 * t.cost() / gold
                ))
            } else {
                uncompressed_parent(ops, &costs, t.idx).filter(|&(_, c)| t.cost() >= COMPRESSED_SAVING * c).map(
                    |(parent, c)| {
                        format!(
                            "costs {:.4} s per tuple, {:.0}% of its uncompressed parent {}'s, which it can only be \
                             less faithful than (items this short leave compression little to save; on the first \
                             {probe} screening tuples)",
                            t.cost(),
                            100.0 * t.cost() / c,
                            ops[parent].name()
                        )
                    },
                )
            };
            if let Some(reason) = &reason {
                dropped.push(Dropped {
                    logical: task.name.clone(),
                    operator: ops[t.idx].name().to_string(),
                    reason: reason.clone(),
                });
            }
            reason.is_none()
        });
    }
}

/// What the probe's tuples are called in a hopeless map's reason ([`Hopeless::on`]).
const PROBED: &str = "probe tuples";

/// A map candidate whose values matched gold's on the probe (or by the first look) so rarely that even the upper end
/// of the credible interval of their share is below [`HOPELESS_QUALITY`] ([`hopeless_on_probe`]).
struct Hopeless {
    /// Logical operator and candidate.
    task: usize,
    idx: usize,
    /// Tuples (of those `on` names) where it gave gold's value, of those where gold gave one.
    matched: usize,
    answered: usize,
    /// The upper end of its credible share, at `credible`.
    upper: f64,
    credible: f64,
    /// Which tuples it was judged on ([`PROBED`], [`FIRST_LOOK`]), as its reason names them.
    on: &'static str,
}

impl Hopeless {
    /// What it did on those tuples, as a drop's reason says it.
    fn what(&self) -> String {
        format!(
            "gave gold's value on {} of the {} {} where gold gave one (a share of at most {:.0}% at {:.0}% \
             credibility)",
            self.matched,
            self.answered,
            self.on,
            100.0 * self.upper,
            100.0 * self.credible
        )
    }
}

/// The map candidates hopeless on the answers in `tried`, which are to `on` (see [`probe_hopeless`]), counting only
/// the answers at the positions `counts` marks (every one where `None`): a map's value on a tuple gold's filters
/// reject never counts. Gold, filters, and candidates whose values are not known (figures from the cost record) never
/// are.
fn hopeless_on_probe(
    tasks: &[SemanticTask],
    tried: &[Vec<Tried>],
    credible: f64,
    on: &'static str,
    counts: Option<&[bool]>,
) -> Vec<Hopeless> {
    let counted = |k: usize| counts.is_none_or(|c| c.get(k).copied().unwrap_or(false));
    let mut out = Vec::new();
    for (task_idx, (task, tried)) in tasks.iter().zip(tried).enumerate() {
        if task.kind != LogicalKind::Map {
            continue;
        }
        let Some(OpOutput::Values { values: gold, .. }) = tried.first().filter(|t| t.idx == 0).map(|t| &t.output)
        else {
            continue;
        };
        for t in tried.iter().filter(|t| t.idx != 0) {
            let OpOutput::Values { values, .. } = &t.output else { continue };
            if values.len() != gold.len() {
                continue;
            }
            let (matched, answered) = gold_values_given(gold, values, counted);
            if answered == 0 {
                continue;
            }
            let upper =
                1.0 - stretto_optim::bounds::beta_lower_bound((answered - matched) as f64, matched as f64, credible);
            if upper < HOPELESS_QUALITY {
                out.push(Hopeless { task: task_idx, idx: t.idx, matched, answered, upper, credible, on });
            }
        }
    }
    out
}

/// Drops, after the probe, the map candidates whose values matched gold's there so rarely that even the upper end of
/// the credible interval of their share (at `credible`) is below [`HOPELESS_QUALITY`]: screening would drop them
/// as hopeless after the rest of its tuples anyway, but for a chance of at most about `1 − credible` each time the
/// test runs (after the probe, and again on the answers so far after the first look at the rest of the screening:
/// `on` names them, `counts` marks those that count, as in [`hopeless_on_probe`]). With their reasons; gold,
/// filters, and candidates whose values are not known (figures from the cost record) stay. Like every screening
/// drop, this looks only at tuples outside the profiling sample.
fn probe_hopeless(
    tasks: &[SemanticTask],
    cands: &[Vec<Arc<RegisteredOp>>],
    tried: &mut [Vec<Tried>],
    credible: f64,
    (on, counts): (&'static str, Option<&[bool]>),
    dropped: &mut Vec<Dropped>,
) {
    for h in hopeless_on_probe(tasks, tried, credible, on, counts) {
        tried[h.task].retain(|t| t.idx != h.idx);
        dropped.push(Dropped {
            logical: tasks[h.task].name.clone(),
            operator: cands[h.task][h.idx].name().to_string(),
            reason: format!("hopeless: {}", h.what()),
        });
    }
}

/// The compressed candidates `due(logical, candidate)` whose uncompressed parent is `hopeless`, each with its reason
/// as a screening drop: a compressed rung can only be less faithful than its parent, so it need not be asked on the
/// probe to be dropped there.
fn children_of_hopeless(
    tasks: &[SemanticTask],
    cands: &[Vec<Arc<RegisteredOp>>],
    hopeless: &[Hopeless],
    due: impl Fn(usize, usize) -> bool,
) -> Vec<(usize, usize, Dropped)> {
    unasked_drops(tasks, cands, |t, i| {
        let p = hopeless.iter().find(|h| h.task == t && is_parent_of(&cands[t], h.idx, i))?;
        due(t, i).then(|| {
            format!(
                "hopeless: its uncompressed parent {} {}, and a compressed rung can only be less faithful than its \
                 parent: not asked",
                cands[t][p.idx].name(),
                p.what()
            )
        })
    })
}

/// The candidates `due(logical, candidate)` that [`probe_drops`] dropped in `by_record` (run on figures that earlier
/// queries recorded, [`RegisteredOp::recorded_costs`]), each with its reason as a screening drop: they need not be
/// asked on the probe to be dropped there.
fn skipped_by_record(
    tasks: &[SemanticTask],
    cands: &[Vec<Arc<RegisteredOp>>],
    by_record: &[Dropped],
    due: impl Fn(usize, usize) -> bool,
) -> Vec<(usize, usize, Dropped)> {
    unasked_drops(tasks, cands, |t, i| {
        let d = by_record.iter().find(|d| d.logical == tasks[t].name && d.operator == cands[t][i].name())?;
        due(t, i).then(|| format!("{}, as earlier queries over the same items recorded it: not asked", d.reason))
    })
}

/// The candidates other than gold that have a `reason(logical, candidate)` to leave screening without being asked,
/// as (logical operator, candidate, drop).
fn unasked_drops(
    tasks: &[SemanticTask],
    cands: &[Vec<Arc<RegisteredOp>>],
    reason: impl Fn(usize, usize) -> Option<String>,
) -> Vec<(usize, usize, Dropped)> {
    let mut out = Vec::new();
    for (t, (task, ops)) in tasks.iter().zip(cands).enumerate() {
        for (i, op) in ops.iter().enumerate().skip(1) {
            if let Some(reason) = reason(t, i) {
                out.push((t, i, Dropped { logical: task.name.clone(), operator: op.name().to_string(), reason }));
            }
        }
    }
    out
}

/// A compressed rung costing at least this share of its uncompressed parent per tuple is not offered: compression
/// only loses information, so it must at least save time.
pub const COMPRESSED_SAVING: f64 = 0.95;

/// Compressed rungs are offered to a query only over items whose median length is at least this many characters
/// (about 128 tokens of English): a shorter past leaves compression little to save. Measured on the profiles
/// committed under `bench/results/` (a rung's cost per tuple over its uncompressed parent's, median per model and
/// ratio): over movie reviews (median 152 characters) 0.88–0.98, which never wins back profiling the rung; over
/// e-commerce descriptions (768) 0.68–1.02; over emails (2042) 0.37–0.80.
pub const COMPRESSED_MIN_ITEM_CHARS: usize = 512;

/// Removes from `ops` (a task's candidates, gold first) the compressed rungs whose uncompressed parent is a
/// candidate too when the median of `items` is shorter than [`COMPRESSED_MIN_ITEM_CHARS`], and says why: such a
/// rung would only cost its probe before [`probe_drops`] found it no cheaper than its parent.
fn drop_compressed_over_short_items(
    task: &SemanticTask,
    ops: &mut Vec<Arc<RegisteredOp>>,
    items: &[String],
) -> Vec<Dropped> {
    let mut lengths: Vec<usize> = items.iter().map(|i| i.chars().count()).collect();
    lengths.sort_unstable();
    let Some(&median) = lengths.get(lengths.len() / 2) else { return Vec::new() };
    if median >= COMPRESSED_MIN_ITEM_CHARS {
        return Vec::new();
    }
    // Gold (index 0) always stays.
    let short: Vec<usize> = (1..ops.len()).filter(|&i| (0..ops.len()).any(|j| is_parent_of(ops, j, i))).collect();
    let dropped: Vec<Dropped> = short
        .iter()
        .map(|&i| Dropped {
            logical: task.name.clone(),
            operator: ops[i].name().to_string(),
            reason: format!(
                "not offered over items this short (median {median} characters, under {COMPRESSED_MIN_ITEM_CHARS}): \
                 a compressed past this short leaves little to save over its uncompressed parent"
            ),
        })
        .collect();
    for d in &dropped {
        tracing::info!(operator = %d.operator, task = %d.logical, reason = %d.reason, "dropped");
    }
    let mut index = 0..;
    ops.retain(|_| !short.contains(&index.next().unwrap_or(usize::MAX)));
    dropped
}

/// The f32 compressed rungs among `ops` (a task's candidates, gold first) that read `model`'s caches and whose
/// uncompressed parent is a candidate too: those a calibration of `model` can drop ([`drop_compressed_by_calibration`]).
fn calibrated_rungs(ops: &[Arc<RegisteredOp>], model: &str) -> Vec<usize> {
    (1..ops.len())
        .filter(|&i| {
            ops[i].kv_cache_model() == Some(model)
                && ops[i].weights_variant().is_none()
                && (0..ops.len()).any(|j| is_parent_of(ops, j, i))
        })
        .collect()
}

/// The way `task`'s operators ask, as a calibration times it: a map's pass and steps, else a filter's pass.
fn calibration_pass(task: &SemanticTask) -> stretto_kv::calibration::Pass {
    match task.kind {
        LogicalKind::Map => stretto_kv::calibration::Pass::Map,
        _ => stretto_kv::calibration::Pass::Filter,
    }
}

/// Removes from `ops` (a task's candidates, gold first) the compressed rungs that their calibration over the
/// task's items ([`stretto_kv::calibration`], per model in `calibrated`) shows cannot pay for their profiling, and
/// says why. A rung can only be less faithful than its uncompressed parent, so what it adds is deciding in the
/// parent's place (as the screening's pay check prices it): where its pass costs a share `s` of the parent's, that
/// saves at most `(1 − s)` of the parent's cost on each of the `rest` tuples outside profiling, while profiling it
/// costs `s` of the parent's cost on each of the `answers(op)` tuples it would answer there. The parent's own cost
/// cancels out, so the share alone decides, before the probe asks anything. A rung costing at least
/// [`COMPRESSED_SAVING`] of its parent is dropped whatever the input's size.
fn drop_compressed_by_calibration(
    task: &SemanticTask,
    ops: &mut Vec<Arc<RegisteredOp>>,
    calibrated: &BTreeMap<String, stretto_kv::calibration::Calibration>,
    answers: impl Fn(&RegisteredOp) -> f64,
    rest: f64,
) -> Vec<Dropped> {
    use stretto_kv::calibration::Pass;
    let pass = calibration_pass(task);
    let mut out = Vec::new();
    let mut gone = BTreeSet::new();
    for (model, c) in calibrated {
        for i in calibrated_rungs(ops, model) {
            let Some(ratio) = ops[i].properties().compression else { continue };
            let Some(share) = c.share_of_parent(pass, ratio) else { continue };
            let profiling = share * answers(&ops[i]);
            let saving = (1.0 - share) * rest;
            if share < COMPRESSED_SAVING && profiling < saving {
                continue;
            }
            let reason = format!(
                "calibrated over {} of these items where their caches were built, its {} pass costs {:.0}% of its \
                 uncompressed parent's: profiling it would cost {profiling:.1} of the parent's answers, and deciding \
                 in the parent's place the other {rest:.0} tuples would save at most {saving:.1} of them{}",
                c.items,
                if pass == Pass::Map { "map" } else { "filter" },
                100.0 * share,
                if share >= COMPRESSED_SAVING { " (compression saves almost nothing here)" } else { "" }
            );
            tracing::info!(operator = %ops[i].name(), task = %task.name, reason = %reason, "dropped");
            out.push(Dropped { logical: task.name.clone(), operator: ops[i].name().to_string(), reason });
            gone.insert(i);
        }
    }
    let mut index = 0..;
    ops.retain(|_| !gone.contains(&index.next().unwrap_or(usize::MAX)));
    out
}

/// The uncompressed parent of candidate `idx` (same family, model and weights, compression 0) among the probed `costs`
/// (candidate index, seconds per tuple), with its cost; `None` for an uncompressed candidate or one whose parent
/// was not probed.
fn uncompressed_parent(ops: &[Arc<RegisteredOp>], costs: &[(usize, f64)], idx: usize) -> Option<(usize, f64)> {
    costs.iter().copied().find(|&(j, _)| is_parent_of(ops, j, idx))
}

/// Whether candidate `j` is the uncompressed parent of the compressed candidate `idx` (same family, model and
/// weights, compression 0): a quantized rung of the model is not the parent of its f32 compressed rungs.
fn is_parent_of(ops: &[Arc<RegisteredOp>], j: usize, idx: usize) -> bool {
    let (p, q) = (ops[idx].properties(), ops[j].properties());
    j != idx
        && p.compression.is_some_and(|r| r > 0.0)
        && q.family == p.family
        && q.model == p.model
        && q.compression.is_none_or(|r| r <= 0.0)
        && ops[j].weights_variant() == ops[idx].weights_variant()
}

/// How the cost record ([`stretto_core::memo::CostRecord`]) names the figures of item prefills measured before
/// profiling where caches are deferred: the operator `kv-prefill:<model>`, the task this text's digest.
const PREFILL_FIGURES: &str = "kv-prefill:";

/// The seconds a deferred prefill adds per tuple to an operator reading the caches of `model`, by the figures
/// measured before profiling (`per_item`, per model): 0 where the operator reads no cache or nothing was deferred.
fn deferred_prefill(per_item: &BTreeMap<String, f64>, model: Option<&str>) -> f64 {
    model.and_then(|m| per_item.get(m)).copied().unwrap_or(0.0)
}

/// How many tuples of `batch` need a prefill of some item of theirs where `readers` (the logical operators reading
/// one model's caches) read it, by `missing` (whether an item's cache is not stored). A join's pairs are not
/// resolved per tuple: a batch a join reads counts every tuple.
fn tuples_to_prefill(
    readers: &[&SemanticTask],
    batch: &RecordBatch,
    mut missing: impl FnMut(&String) -> Result<bool>,
) -> Result<usize> {
    let mut pays = vec![false; batch.num_rows()];
    let mut known: BTreeMap<String, bool> = BTreeMap::new();
    for task in readers {
        if task.is_join() {
            return Ok(batch.num_rows());
        }
        for ((pay, item), unknown) in pays.iter_mut().zip(task.item_texts(batch)?).zip(task.unknown_rows(batch)?) {
            // A row no operator is asked about needs no cache.
            if *pay || unknown {
                continue;
            }
            *pay = match known.get(&item) {
                Some(&m) => m,
                None => {
                    let m = missing(&item)?;
                    known.insert(item, m);
                    m
                }
            };
        }
    }
    Ok(pays.iter().filter(|&&p| p).count())
}

/// Adds to each physical entry of `profile` the seconds per tuple a deferred prefill costs it in execution
/// (`per_item`, per model; `model_of` names the model whose caches an entry's operator reads), and returns, per
/// entry so priced, the model and those seconds. Execution prefills an item's cache once per model, however many
/// stages read it: [`Problem::share_costs`] with what this returns makes the optimizer's hard evaluation charge it
/// so (its relaxation counts it in each stage).
fn price_deferred_prefill(
    profile: &mut Profile,
    per_item: &BTreeMap<String, f64>,
    model_of: impl Fn(&str) -> Option<String>,
) -> BTreeMap<String, (String, f64)> {
    let mut shared = BTreeMap::new();
    for e in &mut profile.physical {
        let model = model_of(&e.name);
        let secs = deferred_prefill(per_item, model.as_deref());
        e.cost += secs;
        if let Some(model) = model.filter(|_| secs > 0.0) {
            shared.insert(e.name.clone(), (model, secs));
        }
    }
    shared
}

/// Removes from `tried` the compressed rungs whose uncompressed parent is among `ops` but not in `tried`: the pay
/// checks cannot count them yet, since the parent may turn out as cheap (and drop them, [`probe_drops`]). Returns
/// whether it removed any.
fn drop_orphans(ops: &[Arc<RegisteredOp>], tried: &mut Vec<Tried>) -> bool {
    let have: Vec<usize> = tried.iter().map(|t| t.idx).collect();
    let before = tried.len();
    tried.retain(|t| !(0..ops.len()).any(|j| is_parent_of(ops, j, t.idx) && !have.contains(&j)));
    tried.len() < before
}

/// Which non-gold candidates (indices into `screened`, 0 is gold) are not worth profiling, and why: hopeless
/// (quality below [`HOPELESS_QUALITY`]), as dear as gold (cost at least [`NEAR_GOLD_COST`] of it), or dominated (another
/// non-gold candidate at most as dear with quality at least as good, and better in one of them by a margin: 5%
/// cheaper or 0.03 better). A candidate whose quality gold's answers cannot tell is kept unless it is as dear as gold.
fn screen_out(names: &[String], screened: &[Screened]) -> Vec<(usize, String)> {
    let Some(gold) = screened.first() else { return Vec::new() };
    let mut out = Vec::new();
    for (i, c) in screened.iter().enumerate().skip(1) {
        if c.cost >= NEAR_GOLD_COST * gold.cost {
            out.push((i, format!("costs {:.4} s per tuple, {:.0}% of gold's", c.cost, 100.0 * c.cost / gold.cost)));
            continue;
        }
        let Some(q) = c.quality else { continue };
        if q < HOPELESS_QUALITY {
            out.push((i, format!("hopeless: quality {q:.3} against gold on the screening tuples")));
            continue;
        }
        let better = screened.iter().enumerate().skip(1).find(|(j, d)| {
            let Some(dq) = d.quality else { return false };
            *j != i
                && d.cost <= c.cost
                && dq >= q
                && (d.cost <= 0.95 * c.cost || dq >= q + 0.03)
                && d.cost < NEAR_GOLD_COST * gold.cost
                && dq >= HOPELESS_QUALITY
        });
        if let Some((j, d)) = better {
            out.push((
                i,
                format!(
                    "dominated by {} (quality {:.3} vs {q:.3}, {:.4} vs {:.4} s per tuple)",
                    names[j],
                    d.quality.unwrap_or_default(),
                    d.cost,
                    c.cost
                ),
            ));
        }
    }
    out
}

/// The screening figures of one candidate's output against gold's.
fn screened(gold: &OpOutput, output: &OpOutput, secs: &[f64]) -> Screened {
    let cost = per_tuple(secs);
    let quality = match (gold, output) {
        (OpOutput::Scores(g), OpOutput::Scores(s)) => {
            let labels: Vec<bool> = g.iter().map(|&v| v > 0.0).collect();
            let pos = labels.iter().filter(|&&l| l).count();
            (pos > 0 && pos < labels.len()).then(|| stretto_core::metrics::auc(s, &labels))
        }
        (OpOutput::Values { values: g, .. }, OpOutput::Values { values, .. }) => {
            let (matched, answered) = gold_values_given(g, values, |_| true);
            (answered > 0).then(|| matched as f64 / answered as f64)
        }
        _ => None,
    };
    Screened { cost, quality }
}

/// Of the tuples where gold gave a map value, among the positions `counted` marks, (how many `values` gives the same
/// value on, how many there are).
fn gold_values_given(
    gold: &[Option<String>],
    values: &[Option<String>],
    counted: impl Fn(usize) -> bool,
) -> (usize, usize) {
    let answered = gold.iter().enumerate().filter(|(k, g)| counted(*k) && g.is_some()).count();
    let matched = gold.iter().zip(values).enumerate().filter(|(k, (g, v))| counted(*k) && g.is_some() && g == v);
    (matched.count(), answered)
}

/// One logical operator's candidates' answers on some tuples (gold's first), with their seconds per tuple; `None`
/// where it was not asked.
type Answers = Option<Vec<(OpOutput, Vec<f64>)>>;

/// Which of `n` tuples gold lets through every filter, from each logical operator's answers on them (a map's, or
/// those of an operator not asked, are `None`): a tuple passes where no gold filter scored it at most 0.
fn gold_passes(answers: &[Answers], n: usize) -> Vec<bool> {
    passing(n, answers.iter().flatten().filter_map(|a| a.first()).map(|(output, _)| output))
}

/// Which of the first `n` tuples every filter output among `gold` (gold's, one per logical operator; a map's values
/// are skipped) lets through: a score above 0.
fn passing<'a>(n: usize, gold: impl IntoIterator<Item = &'a OpOutput>) -> Vec<bool> {
    let mut through = vec![true; n];
    for output in gold {
        if let OpOutput::Scores(s) = output {
            for (a, v) in through.iter_mut().zip(s) {
                *a &= *v > 0.0;
            }
        }
    }
    through
}

/// How many of the first `looked` screening tuples gold lets through every filter (gold's outputs come first in
/// each logical operator's `tried`; a map lets every tuple through).
fn gold_through(tried: &[Vec<Tried>], looked: usize) -> usize {
    passing(looked, tried.iter().filter_map(|t| t.first()).map(|t| &t.output)).iter().filter(|&&t| t).count()
}

/// The largest share of the tuples reaching a map that a plan could let the candidates `others` decide instead of
/// `gold`, by what they answered beside gold: a plan leaves a tuple to a cheaper stage only where that stage's value
/// is kept, and a kept value that is not gold's puts the tuple in the result with a false positive and a false
/// negative at once, so beyond the tuples where some candidate gave gold's value (their share at the upper end of its
/// credible interval, over every tuple all of them answered) a plan can keep at most the wrong values it may make
/// (`errors`, a share: [`MapErrors`]). 1 where that cannot be read: gold is no map, a candidate's values are not
/// known (its figures came from the cost record) or cover fewer tuples than gold's, or there is no tuple.
fn map_takeover_share(gold: &Tried, others: &[Tried], errors: f64, credible: f64) -> f64 {
    let OpOutput::Values { values: gold, .. } = &gold.output else { return 1.0 };
    let n = gold.len();
    if n == 0 {
        return 1.0;
    }
    let mut matched = vec![false; n];
    for c in others {
        let OpOutput::Values { values, .. } = &c.output else { return 1.0 };
        if values.len() < n {
            return 1.0;
        }
        for (m, (v, g)) in matched.iter_mut().zip(values.iter().zip(gold)) {
            *m |= v == g;
        }
    }
    let k = matched.iter().filter(|m| **m).count() as f64;
    let upper = 1.0 - stretto_optim::bounds::beta_lower_bound(n as f64 - k, k, credible);
    (upper + errors).clamp(0.0, 1.0)
}

/// The share of a map's tuples on which a plan for `o`, profiled on `sample` tuples, can keep a wrong value, and how
/// a reason names it. The `global` strategy tests a plan on the sample's hold-out, which holds at most as many gold
/// result rows as tuples: at most the share
/// [`max_certifiable_error_share`](stretto_optim::strategy::max_certifiable_error_share) gives for that many, and
/// none where even an error-free plan keeping a cheap map value would fail the joint test
/// ([`cheap_map_plans_certifiable`](stretto_optim::strategy::cheap_map_plans_certifiable): at targets of 0.9 on a
/// hold-out of fewer than 35 result rows). Then `certifiable` is false, and no cheap map stage can save anything.
/// Other methods (the per-operator tests of `local` and `independent` count a map's rows differently, and the
/// baselines certify nothing) keep the errors the targets allow, `1 − max(precision, recall)`.
struct MapErrors {
    share: f64,
    certifiable: bool,
    what: String,
}

impl MapErrors {
    /// The share of a map's tuples the candidates `others` could decide in `gold`'s place: none where no plan keeping
    /// a cheap map value can be certified, else [`map_takeover_share`] with this share of wrong values.
    fn takeover(&self, gold: &Tried, others: &[Tried], credible: f64) -> f64 {
        if self.certifiable {
            map_takeover_share(gold, others, self.share, credible)
        } else {
            0.0
        }
    }

    /// How a reason says which of a map's tuples a plan can leave to a cheaper candidate.
    fn left_to(&self) -> String {
        if self.certifiable {
            format!("left to a candidate at most where one gave gold's value, plus {}", self.what)
        } else {
            format!("left to no candidate, as {}", self.what)
        }
    }

    /// How a reason says why a map's candidate can decide in another's place at most the `share` of the tuples
    /// reaching its operator.
    fn keeps(&self, share: f64) -> String {
        if self.certifiable {
            format!(
                "it can keep at most {:.0}% of them: where its values matched gold's on the screening tuples, at the \
                 upper end of the credible interval, and {}",
                100.0 * share,
                self.what
            )
        } else {
            format!("it can keep none of them, as {}", self.what)
        }
    }
}

/// What a pay check's saving assumes, as a stop's reason says it: every tuple reaching an operator decided by its
/// cheapest candidate (`unknown`: how candidates without a figure count), and where the query has maps, which of
/// their tuples a cheap candidate can decide: those the filters let through, and `maps` (what
/// [`MapErrors::left_to`] says; empty where the reason says no more). A query without maps says nothing of them.
fn saving_terms(tasks: &[SemanticTask], unknown: &str, maps: &str) -> String {
    let mut terms = format!("every tuple reaching an operator decided by its cheapest candidate{unknown}");
    if !tasks.iter().any(|t| t.kind == LogicalKind::Map) {
        return terms;
    }
    if tasks.iter().any(|t| t.kind == LogicalKind::Filter) {
        terms.push_str("; maps reached by the tuples the filters let through");
        if !maps.is_empty() {
            terms.push_str(&format!(", and {maps}"));
        }
    } else if !maps.is_empty() {
        terms.push_str(&format!("; the maps' tuples {maps}"));
    }
    terms
}

fn map_errors(o: &QueryOptions, sample: usize) -> MapErrors {
    let loose = 1.0 - o.precision.max(o.recall);
    let targets = Targets::new(o.precision, o.recall, o.credible).ok();
    let certified = certification(o).zip(targets).filter(|_| tests_whole_result(o));
    match certified {
        Some((cert, targets)) => {
            // Each class is rounded apart, so the split holds out at most one more than the share rounded down.
            let most = cert.most_held_out(sample).floor() as usize + 1;
            if !stretto_optim::strategy::cheap_map_plans_certifiable(&targets, most) {
                return MapErrors {
                    share: 0.0,
                    certifiable: false,
                    what: format!(
                        "no plan keeping a cheap stage's map value can be certified on a hold-out of at most {most} \
                         result rows, not even one without an error"
                    ),
                };
            }
            let share = stretto_optim::strategy::max_certifiable_error_share(&targets, most);
            MapErrors {
                share,
                certifiable: true,
                what: format!(
                    "the wrong values a certified plan can keep ({:.1}% of a hold-out of at most {most} result rows)",
                    100.0 * share
                ),
            }
        }
        None => MapErrors {
            share: loose,
            certifiable: true,
            what: format!("the errors the targets allow ({:.1}%)", 100.0 * loose),
        },
    }
}

/// The logical operators whose gold is a filter that answered, in the order the ordering DP gives gold's plan
/// ([`best_order`](stretto_optim::order::best_order), on their costs and pass shares on the first `looked` screening
/// tuples), each with which of those tuples it lets through.
fn gold_filter_order(tried: &[Vec<Tried>], looked: usize) -> Vec<(usize, Vec<bool>)> {
    use stretto_optim::order::{best_order, OrderStage};
    let share = |n: usize| n as f64 / looked.max(1) as f64;
    // (operator, which tuples its gold lets through)
    let mut passes: Vec<(usize, Vec<bool>)> = Vec::new();
    let mut stages: Vec<OrderStage> = Vec::new();
    for (i, t) in tried.iter().enumerate() {
        if let Some(g @ Tried { idx: 0, output: OpOutput::Scores(s), .. }) = t.first() {
            let pass: Vec<bool> = s.iter().take(looked).map(|v| *v > 0.0).collect();
            let sel_inter = share(pass.iter().filter(|p| **p).count());
            stages.push(OrderStage { op: passes.len(), cost: g.cost(), sel_inter, sel_intra: 0.0 });
            passes.push((i, pass));
        }
    }
    best_order(&stages).into_iter().map(|f| passes[f].clone()).collect()
}

/// The share of the first `looked` screening tuples that reaches each logical operator when gold's plan runs them:
/// its filters in the order the ordering DP gives a plan ([`best_order`](stretto_optim::order::best_order), on their
/// costs and pass shares there), each on the tuples the earlier ones let through, and its maps on the tuples every
/// filter let through. 1 for an operator whose gold did not answer.
fn gold_reach(tried: &[Vec<Tried>], looked: usize) -> Vec<f64> {
    let mut reach = vec![1.0; tried.len()];
    if looked == 0 {
        return reach;
    }
    let share = |n: usize| n as f64 / looked as f64;
    let mut alive = vec![true; looked];
    for (op, pass) in gold_filter_order(tried, looked) {
        reach[op] = share(alive.iter().filter(|a| **a).count());
        for (a, p) in alive.iter_mut().zip(pass) {
            *a &= p;
        }
    }
    let through = share(alive.iter().filter(|a| **a).count());
    for (i, t) in tried.iter().enumerate() {
        if matches!(t.first(), Some(Tried { idx: 0, output: OpOutput::Values { .. }, .. })) {
            reach[i] = through;
        }
    }
    reach
}

/// An operator's answers on some tuples (`rows`, indices into the batch it was asked on: the profiling sample, or
/// the whole input), with its seconds.
#[derive(Clone)]
struct Asked {
    rows: Vec<usize>,
    output: OpOutput,
    secs: Vec<f64>,
}

impl Asked {
    /// Operator seconds spent on them.
    fn seconds(&self) -> f64 {
        self.secs.iter().sum()
    }
}

/// `op` on the tuples `rows` of `batch` (the profiling sample, or the whole input).
fn ask(op: &RegisteredOp, task: &SemanticTask, batch: &RecordBatch, rows: &[usize]) -> stretto_core::Result<Asked> {
    let ids = UInt32Array::from_iter_values(rows.iter().map(|&r| r as u32));
    let part =
        take_record_batch(batch, &ids).map_err(|e| stretto_core::CoreError::operator(op.name(), e.to_string()))?;
    let (output, secs) = op.evaluate_timed(task, &part)?;
    Ok(Asked { rows: rows.to_vec(), output, secs })
}

/// What gold's plan runs over: the query's logical operators, their candidates (gold first) and the input.
#[derive(Clone, Copy)]
struct GoldOver<'a> {
    tasks: &'a [SemanticTask],
    cands: &'a [Vec<Arc<RegisteredOp>>],
    input: &'a RecordBatch,
}

/// Where gold's plan books its answers: their seconds and which `logical/physical` answered which rows (execution
/// reuses them), and each answer's verdict.
struct GoldBook<'a> {
    spent: &'a mut (f64, Vec<(String, Vec<usize>)>),
    known: &'a mut GoldVerdicts,
}

/// Gold's plan over `rows` of the input, [`PROBE_TUPLES`] at a time: per chunk, gold's operators of the logical
/// filters `filters` (task indices; `figures` theirs, in the same order) in the order the figures so far give
/// ([`order_on_figures`]), each on the chunk's tuples the earlier ones let through. Where the first figures put first
/// a filter that later ones show dearer or less selective, the rows after run in the better order, and gold's
/// execution, which reorders on the final figures, finds more of its answers there. A single filter has no order to
/// learn: it answers all of `rows` in one call, which its operator batches as execution would (a decoder's batch is
/// larger than a probe's worth of tuples). Adds each filter's seconds,
/// tuples asked and tuples passed to `figures`, books every answer in `book` (its seconds, and which
/// `logical/physical` answered which rows: execution reuses them; and its verdict), and returns the rows every filter
/// let through.
fn gold_plan_in_chunks(
    gold: &GoldOver<'_>,
    filters: &[usize],
    rows: &[usize],
    figures: &mut [(f64, usize, usize)],
    book: &mut GoldBook<'_>,
) -> Result<Vec<usize>> {
    let GoldOver { tasks, cands, input } = *gold;
    let mut through = Vec::new();
    let chunk = if filters.len() > 1 { PROBE_TUPLES } else { rows.len().max(1) };
    for chunk in rows.chunks(chunk) {
        let mut alive = chunk.to_vec();
        for k in order_on_figures(figures) {
            let t = filters[k];
            if alive.is_empty() {
                break;
            }
            let answers = ask(&cands[t][0], &tasks[t], input, &alive)?;
            let seconds = answers.seconds();
            book.spent.0 += seconds;
            book.spent.1.push((format!("{}/{}", tasks[t].name, cands[t][0].name()), alive.clone()));
            let asked = alive.len();
            if let OpOutput::Scores(s) = answers.output {
                for (&r, v) in alive.iter().zip(&s) {
                    book.known.entry(r).or_default().insert(t, *v > 0.0);
                }
                alive = alive.into_iter().zip(s).filter(|(_, v)| *v > 0.0).map(|(r, _)| r).collect();
            }
            let f = &mut figures[k];
            *f = (f.0 + seconds, f.1 + asked, f.2 + alive.len());
        }
        through.extend(alive);
    }
    Ok(through)
}

/// The order (indices into `figures`) the ordering DP gives filters whose gold answered as `figures` say: per
/// filter, seconds, tuples asked and tuples passed. Each filter's cost is its seconds per tuple asked, its pass
/// share the passed ones with a pseudo-count each way, so that a filter asked about a handful of tuples, all
/// rejected, does not pass for the most selective. (A later filter is asked only about what the earlier ones let
/// through, so its share there is conditional on theirs; the DP takes the filters for independent, where the two
/// agree.)
fn order_on_figures(figures: &[(f64, usize, usize)]) -> Vec<usize> {
    stretto_optim::order::best_order(&figure_stages(figures))
}

/// The ordering's stages of [`order_on_figures`]: one per filter, its figures as cost and pass share.
fn figure_stages(figures: &[(f64, usize, usize)]) -> Vec<stretto_optim::order::OrderStage> {
    figures
        .iter()
        .enumerate()
        .map(|(k, &(secs, asked, passed))| stretto_optim::order::OrderStage {
            op: k,
            cost: secs / asked.max(1) as f64,
            sel_inter: (passed as f64 + 1.0) / (asked as f64 + 2.0),
            sel_intra: 0.0,
        })
        .collect()
}

/// Gold's verdicts so far, per input row: for each logical filter (task index) gold answered there, whether it let
/// the row through.
type GoldVerdicts = BTreeMap<usize, BTreeMap<usize, bool>>;

/// Filters at most this many are ordered counting gold's answers execution reuses ([`gold_execution_order`]); more
/// are ordered on the figures alone.
const MAX_REUSE_ORDERED_FILTERS: usize = 6;

/// The order (indices into `figures`, whose filters are the task indices `filters`) gold's execution runs its
/// filters in, counting what gold already answered (#21). Each order is priced as execution will pay it: on each
/// row of `known`, the answers it still lacks there (a filter's verdict known is free, and a known rejection ends
/// the row), at the figures' cost and pass shares where unknown; on each of the `rest` rows nobody asked, the
/// figures' expected cost ([`model_cost`](stretto_optim::order::model_cost)). The cheapest wins, the figures' own
/// order ([`order_on_figures`]) on ties: where gold's plan answered the sample in another order, reordering
/// execution pays again for the answers the new order needs there and leaves unused some it already paid for, and
/// that is only worth it where the rows outside the sample make up for it.
fn gold_execution_order(
    figures: &[(f64, usize, usize)],
    filters: &[usize],
    known: &GoldVerdicts,
    rest: f64,
) -> Vec<usize> {
    let by_figures = order_on_figures(figures);
    if known.is_empty() || figures.len() > MAX_REUSE_ORDERED_FILTERS || figures.len() != filters.len() {
        return by_figures;
    }
    let stages = figure_stages(figures);
    let cost = |order: &[usize]| -> f64 {
        let mut total = rest * stretto_optim::order::model_cost(&stages, order);
        for verdicts in known.values() {
            let mut reach = 1.0;
            for &k in order {
                match verdicts.get(&filters[k]) {
                    Some(true) => {}
                    Some(false) => break,
                    None => {
                        total += reach * stages[k].cost;
                        reach *= stages[k].sel_inter;
                    }
                }
            }
        }
        total
    };
    let mut best = (cost(&by_figures), by_figures);
    let mut order: Vec<usize> = (0..figures.len()).collect();
    let on_figures = best.0;
    permutations(&mut order, 0, &mut |o| {
        let c = cost(o);
        if c < best.0 - 1e-9 {
            best = (c, o.to_vec());
        }
    });
    tracing::debug!(rest, known = known.len(), on_figures, chosen = best.0, order = ?best.1, "gold's execution order");
    best.1
}

/// How many of the input's `n` rows gold's execution reaches knowing no verdict of gold's there: those neither in
/// `free` (tuples every filter answered, free in any order) nor among the rows of `known` (each counted once, also
/// where it is in both).
fn rows_nobody_asked(n: usize, free: &[usize], known: &GoldVerdicts) -> f64 {
    let free_only = free.iter().collect::<BTreeSet<_>>().into_iter().filter(|r| !known.contains_key(r)).count();
    n.saturating_sub(free_only + known.len()) as f64
}

/// Calls `f` with every permutation of `items[k..]` (after `items[..k]`), in place.
fn permutations(items: &mut [usize], k: usize, f: &mut impl FnMut(&[usize])) {
    if k + 1 >= items.len() {
        f(items);
        return;
    }
    for i in k..items.len() {
        items.swap(k, i);
        permutations(items, k + 1, f);
        items.swap(k, i);
    }
}

/// Which sample tuples the gold result holds (every gold filter accepts them), from gold's answers per logical
/// operator (`None` for one not answered, a map's); `None` where the query has no filter.
fn gold_result(n: usize, gold: &[Option<&Asked>]) -> Option<Vec<bool>> {
    let mut positive = None;
    for a in gold.iter().flatten() {
        if let OpOutput::Scores(s) = &a.output {
            let p = positive.get_or_insert_with(|| vec![true; n]);
            let mut accepted = vec![false; n];
            for (&r, v) in a.rows.iter().zip(s) {
                accepted[r] = *v > 0.0;
            }
            p.iter_mut().zip(accepted).for_each(|(p, a)| *p &= a);
        }
    }
    positive
}

/// The tuples among `rows` that profiling asks an operator of `kind` about: all of them for a filter; for a map,
/// those of the gold result (`positive`; all where the query has no filter), or, where none of them is, the first
/// (for its cost per tuple). A map's value on a tuple outside the gold result never counts: any plan that lets
/// that tuple through has a false positive there, whatever the value (`docs/profile-format.md`), so answers there
/// would be paid for and never read.
fn profiled_rows(kind: LogicalKind, rows: &[usize], positive: Option<&[bool]>) -> Vec<usize> {
    match (kind, positive) {
        (LogicalKind::Map, Some(p)) => {
            let inside: Vec<usize> = rows.iter().copied().filter(|&r| p[r]).collect();
            if inside.is_empty() {
                rows.iter().copied().take(1).collect()
            } else {
                inside
            }
        }
        _ => rows.to_vec(),
    }
}

/// A profile entry of `op` (gold where `gold`) for `task` over the `n` sample tuples, from its answers on parts of
/// them: a tuple no part answered is unasked (`null`), which only a map may leave (outside the gold result). Its
/// cost is the mean seconds per tuple asked. Parts of different kinds are an error.
fn entry_from(
    task: &SemanticTask,
    op: &RegisteredOp,
    n: usize,
    parts: Vec<Asked>,
    gold: bool,
) -> Result<PhysicalEntry> {
    let mut parts = parts.into_iter();
    let Some(Asked { mut rows, mut output, mut secs }) = parts.next() else {
        return Err(Error::Query(format!("`{}` answered no tuple of the profiling sample", op.name())));
    };
    for p in parts {
        rows.extend(p.rows);
        output.append(p.output, op.name())?;
        secs.extend(p.secs);
    }
    let cost = per_tuple(&secs);
    let mut scores: Vec<Option<f64>> = vec![None; n];
    let values = match output {
        OpOutput::Scores(s) => {
            rows.iter().zip(s).for_each(|(&r, v)| scores[r] = Some(v));
            None
        }
        OpOutput::Values { values, confidences } => {
            let mut placed: Vec<Option<String>> = vec![None; n];
            for ((&r, v), c) in rows.iter().zip(values).zip(confidences) {
                placed[r] = v;
                scores[r] = Some(c);
            }
            Some(placed)
        }
    };
    Ok(PhysicalEntry {
        name: format!("{}/{}", task.name, op.name()),
        logical: task.name.clone(),
        cost: cost.max(1e-9),
        scores: Some(scores),
        values,
        gold,
    })
}

/// An entry of `op`'s cost per tuple alone, from its answers `asked` about tuples outside the `n`-tuple profiling
/// sample (a gold-only profile's maps, asked about a tuple gold's filters let through): no score or value there.
fn entry_priced_elsewhere(
    task: &SemanticTask,
    op: &RegisteredOp,
    n: usize,
    asked: &Asked,
    gold: bool,
) -> PhysicalEntry {
    PhysicalEntry {
        name: format!("{}/{}", task.name, op.name()),
        logical: task.name.clone(),
        cost: per_tuple(&asked.secs).max(1e-9),
        scores: Some(vec![None; n]),
        values: matches!(asked.output, OpOutput::Values { .. }).then(|| vec![None; n]),
        gold,
    }
}

/// Mean seconds per answer (0 for none).
fn per_tuple(secs: &[f64]) -> f64 {
    secs.iter().sum::<f64>() / secs.len().max(1) as f64
}

/// The sample tuples an entry has answers for (a map leaves those outside the gold result unasked).
fn asked_rows(e: &PhysicalEntry) -> Vec<usize> {
    match &e.scores {
        Some(s) => s.iter().enumerate().filter(|(_, v)| v.is_some()).map(|(r, _)| r).collect(),
        None => (0..e.values.as_ref().map_or(0, Vec::len)).collect(),
    }
}

/// How many rows of `batch` `op` would compute an answer to `task` for: those whose answer the memo lacks, or every
/// row where `look_up` is off (no memo lookup, or memo hits priced as a cold run would).
fn unanswered(op: &RegisteredOp, task: &SemanticTask, batch: &RecordBatch, look_up: bool) -> usize {
    unanswered_rows(op, task, batch, look_up).iter().filter(|u| **u).count()
}

/// Which rows of `batch` `op` would compute an answer to `task` for ([`unanswered`]).
fn unanswered_rows(op: &RegisteredOp, task: &SemanticTask, batch: &RecordBatch, look_up: bool) -> Vec<bool> {
    let every = || vec![true; batch.num_rows()];
    if !look_up {
        return every();
    }
    op.memoised_rows(task, batch).map_or_else(|_| every(), |known| known.iter().map(|k| !k).collect())
}

/// What [`profile_in_two_phases`] profiled.
struct Phased {
    /// Per logical operator: gold, and the candidates profiled on the whole sample.
    entries: Vec<Vec<PhysicalEntry>>,
    /// Operator seconds spent.
    spent: f64,
    /// Why gold runs, where the test sequence planned on the fit part is empty (then `entries` are gold's alone).
    stop: Option<String>,
    /// Candidates profiled on the fit part only.
    dropped: Vec<Dropped>,
}

/// Prices the answers of a candidate with a one-off setup ([`RegisteredOp::one_off_setup`]) at its cost hint per
/// tuple: what the probe measured of it, or what earlier queries recorded, is mostly the setup (spread over the
/// batch that paid it, once per task), while its answers after it cost little (a generated program matches in
/// microseconds). Taken for the cost per tuple, the setup would drop it as dear as gold on any input it could pay
/// for. Other candidates' seconds are left alone.
fn price_past_setup(op: &RegisteredOp, secs: &mut [f64]) {
    if op.one_off_setup() {
        secs.fill(op.properties().cost_hint);
    }
}

/// The candidates' answers on the screening tuples, as screening left them.
struct ScreeningAnswers<'a> {
    /// Per logical operator, gold's answers first, then those of the candidates left.
    tried: &'a [Vec<Tried>],
    /// The screening tuples a map's candidates answered (the probe's, and those of the rest gold let through).
    map_positions: &'a [usize],
    /// Per logical operator and candidate, the seconds per tuple a deferred prefill adds outside profiling.
    prefill_of: &'a [Vec<f64>],
}

/// A test sequence planned on the screening tuples ([`screening_forecast`]).
#[derive(Debug, Clone, Copy)]
struct Forecast {
    /// What testing it is expected to save per tuple over gold, in seconds.
    expected_saving: f64,
    /// Plans in it.
    sequence: usize,
    /// The sample's hold-out it was planned for.
    held: stretto_optim::strategy::HoldOut,
}

/// The certified search's test sequence as it can be foreseen before the sample's candidates answer: planned
/// ([`Global::plan_tests`]) on the screening tuples in the fit part's place, for the hold-out the sample's split
/// will make (fixed by gold's answers on the sample alone, `sample_result`, [`Certification::split_sample`]). What
/// it is expected to save tells whether profiling the candidates can pay. The screening tuples are outside the
/// sample, and the forecast only decides whether gold runs, so the certificate stands as before: a plan still
/// certifies only on held-out sample tuples that no solver fitted on.
fn screening_forecast(
    tasks: &[SemanticTask],
    cands: &[Vec<Arc<RegisteredOp>>],
    on: &ScreeningAnswers<'_>,
    sample_result: &[bool],
    o: &QueryOptions,
    global: &Global,
) -> Result<Forecast> {
    use stretto_optim::strategy::HoldOut;
    let targets = Targets::new(o.precision, o.recall, o.credible)?;
    let n = on.tried.iter().flatten().filter(|t| t.idx == 0).map(|t| t.secs.len()).max().unwrap_or(0);
    // The screening tuples gold lets through every filter: a map's answer elsewhere never counts, and a profile
    // leaves it unasked (the probe asked the maps about every probe tuple).
    let through = passing(n, on.tried.iter().filter_map(|t| t.first()).map(|t| &t.output));
    let mut physical = Vec::new();
    let mut shared = BTreeMap::new();
    for (t, (task, ops)) in tasks.iter().zip(cands).enumerate() {
        if on.tried[t].first().is_none_or(|g| g.idx != 0) {
            return Err(Error::Query(format!("gold did not answer `{}` on the screening tuples", task.name)));
        }
        for c in &on.tried[t] {
            let rows: Vec<usize> = match task.kind {
                LogicalKind::Map => on.map_positions.to_vec(),
                _ => (0..n).collect(),
            };
            if rows.len() != c.secs.len() {
                return Err(Error::Query(format!(
                    "`{}` answered {} of the {} screening tuples it was asked",
                    ops[c.idx].name(),
                    c.secs.len(),
                    rows.len()
                )));
            }
            let asked = Asked { rows, output: c.output.clone(), secs: c.secs.clone() };
            let mut entry = entry_from(task, &ops[c.idx], n, vec![asked], c.idx == 0)?;
            if task.kind == LogicalKind::Map {
                for r in (0..n).filter(|&r| !through[r]) {
                    entry.scores.iter_mut().for_each(|s| s[r] = None);
                    entry.values.iter_mut().for_each(|v| v[r] = None);
                }
            }
            // Outside profiling, a tuple pays its deferred prefill where the candidate decides it, once per model.
            let prefill = on.prefill_of[t][c.idx];
            entry.cost += prefill;
            if let Some(model) = ops[c.idx].kv_cache_model().filter(|_| prefill > 0.0) {
                shared.insert(entry.name.clone(), (model.to_string(), prefill));
            }
            physical.push(entry);
        }
    }
    let profile = Profile {
        format: PROFILE_FORMAT.into(),
        query: o.query.clone(),
        population: n as u64,
        tuples: (0..n).map(|r| r.to_string()).collect(),
        logical: tasks.iter().map(logical_entry).collect(),
        physical,
        sample_digest: None,
    };
    let mut problem = Problem::from_profile(&profile)?;
    problem.share_costs(&shared);
    let (_, hold) = global.certification.split_sample(sample_result, &targets, targets.credible, o.seed);
    let held = HoldOut { tuples: hold.len(), positives: hold.iter().filter(|&&r| sample_result[r]).count() as f64 };
    let planned = global.plan_tests(&problem, held, &targets, o.seed)?;
    tracing::debug!(
        expected_per_tuple = planned.expected_saving,
        sequence = planned.sequence.len(),
        candidates = planned.candidates,
        held_out = held.tuples,
        positives = held.positives,
        "test sequence forecast on the screening tuples"
    );
    Ok(Forecast { expected_saving: planned.expected_saving, sequence: planned.sequence.len(), held })
}

/// Step 3 for a query the certified global search will plan (#21): gold answers the whole sample, which fixes the
/// search's split into a fit part and a hold-out ([`Certification::split_sample`], stratified by gold's answers
/// alone); the candidates answer the fit part (a map, here and below, only the gold result rows: [`profiled_rows`]);
/// the test sequence is planned there ([`Global::plan_tests`]); and
/// only the candidates some plan of that sequence uses answer the hold-out. Where the sequence is empty, none
/// does and gold runs; so it does where what testing the sequence is expected to save on the `rest` tuples
/// execution will run outside profiling ([`TestPlan::expected_saving`](stretto_optim::strategy::TestPlan), each
/// plan's chance of passing times what it saves) is no more than what the hold-out's answers would cost. The search
/// that then optimizes the profile plans again on the same fit part, over the candidates kept, and tests on the
/// hold-out as always: which candidates were kept depends on the fit part and on gold's answers only, so the test
/// keeps its level (the argument is in the `stretto_optim::strategy` docs).
#[allow(clippy::too_many_arguments)]
fn profile_in_two_phases(
    tasks: &[SemanticTask],
    cands: &[Vec<Arc<RegisteredOp>>],
    parallel: bool,
    batch: &RecordBatch,
    sample: &[usize],
    population: u64,
    rest: f64,
    o: &QueryOptions,
    global: &Global,
) -> Result<Phased> {
    use stretto_optim::strategy::HoldOut;
    let targets = Targets::new(o.precision, o.recall, o.credible)?;
    let n = sample.len();
    let all: Vec<usize> = (0..n).collect();
    // Gold on the whole sample: its filters first (their answers are memoised from gold's plan on it), then its
    // maps on the gold result rows they give.
    let gold_filters: Vec<Option<Asked>> = per_task(tasks, cands, parallel, |_, task, ops| {
        Ok((task.kind == LogicalKind::Filter).then(|| ask(&ops[0], task, batch, &all)).transpose()?)
    })?;
    let positive = gold_result(n, &gold_filters.iter().map(Option::as_ref).collect::<Vec<_>>());
    let gold: Vec<Asked> = per_task(tasks, cands, parallel, |t, task, ops| match &gold_filters[t] {
        Some(a) => Ok(a.clone()),
        None => Ok(ask(&ops[0], task, batch, &profiled_rows(task.kind, &all, positive.as_deref()))?),
    })?;
    let mut spent: f64 = gold.iter().map(Asked::seconds).sum();
    let gold_entries: Vec<PhysicalEntry> = tasks
        .iter()
        .zip(cands)
        .zip(&gold)
        .map(|((task, ops), asked)| entry_from(task, &ops[0], n, vec![asked.clone()], true))
        .collect::<Result<_>>()?;
    let gold_profile = Profile {
        format: PROFILE_FORMAT.into(),
        query: o.query.clone(),
        population,
        tuples: sample.iter().map(|r| r.to_string()).collect(),
        logical: tasks.iter().map(logical_entry).collect(),
        physical: gold_entries.clone(),
        sample_digest: None,
    };
    let positives: Vec<bool> = positive.clone().unwrap_or_else(|| vec![true; n]);
    let (fit, hold) = global.certification.split_sample(&positives, &targets, targets.credible, o.seed);
    let held = HoldOut { tuples: hold.len(), positives: hold.iter().filter(|&&r| positives[r]).count() as f64 };
    let gold_only = |why: String, spent: f64| Phased {
        entries: gold_entries.iter().map(|e| vec![e.clone()]).collect(),
        spent,
        stop: Some(why),
        dropped: Vec::new(),
    };
    if let Some(why) = global.certification.too_small(&fit, &hold) {
        return Ok(gold_only(format!("{why}, so gold ran directly"), spent));
    }
    // The candidates on the fit part (maps on its gold result rows).
    let on_fit: Vec<Vec<(usize, Asked)>> = per_task(tasks, cands, parallel, |_, task, ops| {
        let rows = profiled_rows(task.kind, &fit, positive.as_deref());
        let mut out = Vec::new();
        for (i, op) in ops.iter().enumerate().skip(1) {
            match ask(op, task, batch, &rows) {
                Ok(asked) => out.push((i, asked)),
                Err(stretto_core::CoreError::NotApplicable { reason, .. }) => {
                    tracing::info!(operator = op.name(), task = %task.name, %reason, "dropped");
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(out)
    })?;
    spent += on_fit.iter().flatten().map(|(_, a)| a.seconds()).sum::<f64>();
    let mut fitted = gold_profile.clone();
    for ((task, ops), answers) in tasks.iter().zip(cands).zip(&on_fit) {
        for (i, asked) in answers {
            fitted.physical.push(entry_from(task, &ops[*i], n, vec![asked.clone()], false)?);
        }
    }
    let fit_problem = Problem::from_profile(&fitted.subset(&fit, population))?;
    let planned = global.plan_tests(&fit_problem, held, &targets, o.seed)?;
    let needed: BTreeSet<String> = planned
        .sequence
        .iter()
        .flat_map(|p| p.stages.iter())
        .map(|s| fit_problem.ops[s.op].impls[s.imp].physical.clone())
        .collect();
    tracing::debug!(
        candidates = planned.candidates,
        sequence = planned.sequence.len(),
        needed = needed.len(),
        fit = fit.len(),
        held_out = hold.len(),
        "test sequence planned on the fit part"
    );
    if planned.sequence.is_empty() {
        let why = stretto_optim::strategy::nothing_to_test(planned.candidates, &targets, fit.len(), held);
        return Ok(gold_only(
            format!(
                "planned on the profiling sample's fit part, {why} (credible level {}), so no other candidate \
                 answered the held-out tuples and gold ran directly",
                o.credible
            ),
            spent,
        ));
    }
    let name = |task: &SemanticTask, op: &RegisteredOp| format!("{}/{}", task.name, op.name());
    // What the hold-out's answers would cost: each candidate a planned plan uses, on the held-out tuples it would be
    // asked about (maps on their gold result rows) whose answers the memo lacks (all of them, pricing memo hits), at
    // its seconds per tuple on the fit part.
    let mut hold_cost = 0.0;
    for ((task, ops), answers) in tasks.iter().zip(cands).zip(&on_fit) {
        let rows = profiled_rows(task.kind, &hold, positive.as_deref());
        let rows_batch = take_record_batch(batch, &UInt32Array::from_iter_values(rows.iter().map(|&r| r as u32)))?;
        for (i, asked) in answers.iter().filter(|(i, _)| needed.contains(&name(task, &ops[*i]))) {
            let lacking = unanswered(&ops[*i], task, &rows_batch, !o.price_memo_hits);
            hold_cost += asked.seconds() / asked.rows.len().max(1) as f64 * lacking as f64;
        }
    }
    let expected = planned.expected_saving * rest;
    tracing::debug!(expected_per_tuple = planned.expected_saving, expected, rest, hold_cost, "hold-out pay check");
    if expected <= hold_cost {
        return Ok(gold_only(
            format!(
                "planned on the profiling sample's fit part ({} tuples), the test sequence ({} {}) is expected to save \
                 {expected:.1} s on the other {rest} tuples (each plan's chance of passing the test on the {} held-out \
                 tuples times what it saves over the plan before it, {:.4} s per tuple), no more than the \
                 {hold_cost:.1} s the held-out tuples' answers of the {} candidates it uses would cost, so none \
                 answered them and gold ran directly",
                fit.len(),
                planned.sequence.len(),
                if planned.sequence.len() == 1 { "plan" } else { "plans" },
                hold.len(),
                planned.expected_saving,
                needed.len()
            ),
            spent,
        ));
    }
    // The candidates a planned plan uses, on the hold-out (maps on its gold result rows).
    let on_hold: Vec<Vec<(usize, Asked)>> = per_task(tasks, cands, parallel, |t, task, ops| {
        let rows = profiled_rows(task.kind, &hold, positive.as_deref());
        let mut out = Vec::new();
        for (i, _) in on_fit[t].iter().filter(|(i, _)| needed.contains(&name(task, &ops[*i]))) {
            out.push((*i, ask(&ops[*i], task, batch, &rows)?));
        }
        Ok(out)
    })?;
    spent += on_hold.iter().flatten().map(|(_, a)| a.seconds()).sum::<f64>();
    let mut entries = Vec::with_capacity(tasks.len());
    let mut dropped = Vec::new();
    for (((task, ops), gold), (fitted, held_out)) in
        tasks.iter().zip(cands).zip(gold_entries).zip(on_fit.into_iter().zip(on_hold))
    {
        let mut list = vec![gold];
        let mut held_out = held_out.into_iter().peekable();
        for (i, on_fit) in fitted {
            match held_out.next_if(|(j, _)| *j == i) {
                Some((_, on_hold)) => list.push(entry_from(task, &ops[i], n, vec![on_fit, on_hold], false)?),
                None => dropped.push(Dropped {
                    logical: task.name.clone(),
                    operator: ops[i].name().to_string(),
                    reason: format!(
                        "in no plan of the test sequence planned on the {} fitted tuples of the profiling sample: not \
                         profiled on its {} held-out tuples",
                        fit.len(),
                        hold.len()
                    ),
                }),
            }
        }
        entries.push(list);
    }
    Ok(Phased { entries, spent, stop: None, dropped })
}

/// Validation, KV caches and profiling of every candidate operator: the profile any strategy can be optimized
/// on (a query about to run uses [`profile_to_run`], which may profile less).
pub fn profile_pipeline(
    registry: &Registry,
    pulled: &stretto_core::plan::PulledUpPlan,
    input: &RecordBatch,
    o: &QueryOptions,
) -> Result<Profiled> {
    profile_candidates(registry, pulled, input, o, None, false)
}

/// [`profile_pipeline`], of every candidate or (with `gold_only`, its reason) of the gold operators alone.
fn profile_candidates(
    registry: &Registry,
    pulled: &stretto_core::plan::PulledUpPlan,
    input: &RecordBatch,
    o: &QueryOptions,
    mut gold_only: Option<String>,
    pay_check: bool,
) -> Result<Profiled> {
    let total = Instant::now();
    let mut timings = BTreeMap::new();
    Targets::new(o.precision, o.recall, o.credible)?;
    let tasks = pulled.semantic.clone();
    if tasks.is_empty() {
        return Err(Error::Query("the plan has no semantic operator".into()));
    }
    let input = input.clone();
    if input.num_rows() == 0 {
        return Err(Error::Query(format!("{} gives no rows to query", o.dataset)));
    }
    for t in &tasks {
        t.resolve(&input.schema())?;
    }
    let mut cands = Vec::new();
    let mut gold_notes = Vec::new();
    // What each task's columns hold, worked out (and checked) once.
    let modalities: Vec<Modality> = tasks.iter().map(|t| modality_of(t, &input)).collect::<Result<_>>()?;
    for (t, &modality) in tasks.iter().zip(&modalities) {
        let mut ops = candidates(registry, t, modality, &o.models)?;
        gold_notes.extend(gold_not_an_llm(registry, t, modality, &ops[0], &o.models));
        if gold_only.is_some() {
            ops.truncate(1);
        }
        cands.push(ops);
    }
    // A query about to run is not offered compressed rungs over items too short for compression to save anything
    // (their reasons join the screening's).
    let mut short_items = Vec::new();
    if pay_check {
        for ((t, ops), modality) in tasks.iter().zip(cands.iter_mut()).zip(&modalities) {
            // Over text only: an image item is a path, and a join's pairs are judged side by side.
            if !t.is_join() && *modality == Modality::Text {
                // The items operators are asked about: a row with a null cell is answered without them.
                short_items.extend(drop_compressed_over_short_items(t, ops, &t.known_items(&input)?));
            }
        }
    }
    // Pair operators see the whole input first: what they do once per side is then priced per pair as a run over
    // this input pays it, on the screening tuples and the sample alike.
    for (t, ops) in tasks.iter().zip(&cands) {
        for op in ops.iter().filter(|op| op.reads_pairs()) {
            op.observe_input(t, &input)?;
        }
    }
    let ctx = registry.context();
    let parallel = side_by_side(ctx, tasks.len());
    // While it runs, no query (here or in another process) evicts the caches this one uses.
    let budget = disk_budget(ctx)?;
    let _lease = budget.lease()?;

    // The seeded sample (step 3) and the screening tuples (3a), drawn first so that a fetch knows what to cache.
    let n = input.num_rows();
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(o.seed));
    let want = sample_size(o, n);
    let map_errors = map_errors(o, want);
    let left_to = map_errors.left_to();
    // What the pay checks' savings assume, as their stops say it.
    let assumed = saving_terms(&tasks, "", &left_to);
    let mut sample: Vec<usize> = order[..want].to_vec();
    let screen_rows = if gold_only.is_none() && cands.iter().any(|c| c.len() > 2) { o.screen.min(n - want) } else { 0 };
    sample.sort_unstable();
    if gold_only.is_some() {
        // Gold alone will run: its plan needs no certificate, only an order of its stages, which a few tuples give
        // (with a fetch, the first ones, which execution reads anyway); execution reuses their answers.
        let k = want.min(gold_order_tuples(&tasks));
        sample = if o.fetch.is_some() { (0..k).collect() } else { order[..k].to_vec() };
        sample.sort_unstable();
    }

    // 2. KV caches of every item for every LLM model in play (with a fetch, of the screening tuples), found
    //    by content (built once, reused by every later query over the same texts), within the disk budget. Where
    //    the whole input's would not fit the budget, only the tuples profiling reads are prefilled now, and of the
    //    sample only gold's: the other models' sample caches wait until screening shows that profiling can pay.
    let t0 = Instant::now();
    let mut kv_note = None;
    let source = |m: &str| past_source(ctx, &budget, m);
    // Deferred: per logical operator, the decoders whose sample caches wait until screening.
    let mut sample_later: Vec<(usize, Vec<Arc<stretto_kv::Decoder>>)> = Vec::new();
    // Where deferred, per model, the mean seconds a prefill of one item took (the sample is drawn at random, so its
    // items stand for the rest).
    let prefill_per_item: BTreeMap<String, f64>;
    {
        let _span = tracing::info_span!("kv_caches").entered();
        let jobs = cache_jobs(ctx, &cands)?;
        // The rows whose items are prefilled now: with a fetch, execution may stop long before the end, and the
        // pay check may decide that the sample is not worth profiling, so only the screening tuples are.
        let rows_of = |rows: &mut dyn Iterator<Item = usize>| -> Result<RecordBatch> {
            Ok(take_record_batch(&input, &UInt32Array::from_iter_values(rows.map(|r| r as u32)))?)
        };
        let mut batch = match o.fetch {
            Some(_) => rows_of(&mut order[want..want + screen_rows].iter().copied())?,
            None => input.clone(),
        };
        // Where deferred, the screening tuples: all that models other than gold's prefill now (gold's prefills
        // `batch`, the sample too).
        let mut deferred: Option<RecordBatch> = None;
        if o.fetch.is_none() && !jobs.is_empty() {
            let mut rows: Vec<usize> = sample.iter().chain(&order[want..want + screen_rows]).copied().collect();
            rows.sort_unstable();
            rows.dedup();
            let why = if o.prefill_profiled_only {
                Some(
                    "execution runs elsewhere (a cluster's executors): only the tuples profiling reads were \
                     prefilled before it, and execution prefills the others as it reaches them (their prefill \
                     counted in its seconds)"
                        .to_string(),
                )
            } else {
                // What every item's records would add on disk, against what the budget leaves free: per model, each
                // item once, however many logical operators read it (their caches are the same records).
                let mut per_model: BTreeMap<&str, (&Arc<stretto_kv::Decoder>, BTreeSet<String>)> = BTreeMap::new();
                for (t, decs) in &jobs {
                    let texts = cached_items(&tasks[*t], &input)?;
                    for dec in decs {
                        per_model
                            .entry(dec.name())
                            .or_insert_with(|| (dec, BTreeSet::new()))
                            .1
                            .extend(texts.iter().cloned());
                    }
                }
                let mut missing = 0u64;
                for (name, (dec, texts)) in per_model {
                    missing += source(name).missing_bytes(dec, &texts.into_iter().collect::<Vec<_>>())?.1;
                }
                let free = budget.limit()?.saturating_sub(budget.usage()?);
                (missing > free).then(|| {
                    format!(
                        "the KV caches of all {n} tuples would take about {:.1} GB more on disk than the {:.1} GB \
                         the disk budget leaves free: only the tuples profiling reads were prefilled before it, and \
                         execution prefills the others as it reaches them (their prefill counted in its seconds), \
                         keeping what the budget holds",
                        missing as f64 / 1e9,
                        free as f64 / 1e9,
                    )
                })
            };
            if let (Some(note), true) = (why, rows.len() < n) {
                let mut screen: Vec<usize> = order[want..want + screen_rows].to_vec();
                screen.sort_unstable();
                deferred = Some(rows_of(&mut screen.into_iter())?);
                batch = rows_of(&mut rows.into_iter())?;
                if !o.prefill_profiled_only {
                    tracing::warn!("{note}");
                }
                kv_note = Some(note);
            }
        }
        // Per model, the tuples whose caches were looked at now (prefilled where missing), and where deferred, the
        // seconds their prefills took (as recorded) and how many.
        let mut prefilled: Vec<String> = Vec::new();
        let mut timed: BTreeMap<String, (f64, usize)> = BTreeMap::new();
        for (t, decs) in &jobs {
            for dec in decs {
                let gold_model = cands[*t][0].kv_cache_model() == Some(dec.name());
                let (rows, mut later) = match &deferred {
                    // Gold's model reads the sample whatever screening decides (gold's plan answers it).
                    Some(_) if gold_model => (&batch, false),
                    Some(screen) => (screen, true),
                    None => (&batch, false),
                };
                // Where deferred, `texts` are also the items whose figures price the prefills: all those looked
                // at now, including any whose prefill an earlier run did (and recorded).
                let texts = cached_items(&tasks[*t], rows)?;
                // The items prefilled now, where fewer than `texts`.
                let mut fewer: Option<Vec<String>> = None;
                let (op, task) =
                    (format!("{PREFILL_FIGURES}{}", dec.name()), stretto_core::memo::Digest16::of(PREFILL_FIGURES));
                let mut answered = 0;
                let timed_before = deferred.is_some()
                    && gold_model
                    && texts.iter().all(|i| ctx.costs.figure(&op, task, i, true).is_some());
                if let (Some(screen), true, false) = (&deferred, timed_before, tasks[*t].is_join()) {
                    // A rerun after an interruption, where an earlier run prefilled (and timed) all these items,
                    // does not prefill again the sample tuples whose gold answers are memoised: nothing reads their
                    // caches unless profiling goes on, and then they follow the others' after screening. The
                    // screening tuples are prefilled whatever (every rung reads them). Where the earlier run did not
                    // time them all (a disk budget too small for them), the rerun prefills as it did, so that it
                    // prices its prefills on the same figures.
                    let known = cands[*t][0].memoised_rows(&tasks[*t], rows)?;
                    let screening: BTreeSet<String> = cached_items(&tasks[*t], screen)?.into_iter().collect();
                    let kept: Vec<String> = texts
                        .iter()
                        .zip(known)
                        .filter(|(text, known)| !known || screening.contains(*text))
                        .map(|(text, _)| text.clone())
                        .collect();
                    answered = texts.len() - kept.len();
                    later = answered > 0;
                    fewer = Some(kept);
                }
                let asked = fewer.as_deref().unwrap_or(&texts);
                let seconds = source(dec.name()).ensure_timed(dec, asked)?;
                if deferred.is_some() {
                    // Recorded beside the memo, so that a rerun after an interruption (whose caches are stored,
                    // or were evicted and prefilled again) prices its prefills as the interrupted run did.
                    // The first figure of an item stands: a rerun's prefills are not recorded over it.
                    let (items, secs): (Vec<String>, Vec<f64>) = asked
                        .iter()
                        .zip(&seconds)
                        .filter_map(|(i, s)| s.map(|s| (i.clone(), s)))
                        .filter(|(i, _)| ctx.costs.figure(&op, task, i, true).is_none())
                        .unzip();
                    ctx.costs.record(&op, task, &items, &secs);
                    for s in texts.iter().filter_map(|i| ctx.costs.figure(&op, task, i, true)) {
                        let (sum, count) = timed.entry(dec.name().to_string()).or_insert((0.0, 0));
                        *sum += s;
                        *count += 1;
                    }
                }
                prefilled.push(match answered {
                    0 => format!("{} {} tuples", dec.name(), rows.num_rows()),
                    _ => format!(
                        "{} {} tuples, not the {answered} sample tuples whose gold answers are memoised",
                        dec.name(),
                        rows.num_rows() - answered
                    ),
                });
                if later {
                    match sample_later.iter_mut().find(|(u, _)| u == t) {
                        Some((_, d)) => d.push(dec.clone()),
                        None => sample_later.push((*t, vec![dec.clone()])),
                    }
                }
            }
        }
        prefill_per_item = timed.into_iter().map(|(m, (secs, items))| (m, secs / items as f64)).collect();
        if let Some(note) = kv_note.as_mut() {
            note.push_str(&format!(
                " (before profiling, items read and prefilled where missing: {})",
                prefilled.join(", ")
            ));
            if !prefill_per_item.is_empty() {
                let each: Vec<String> = prefill_per_item.iter().map(|(m, s)| format!("{m} {s:.3} s")).collect();
                note.push_str(&format!(
                    "; a prefill took per item {}, priced into the pay checks and the profiled costs",
                    each.join(", ")
                ));
            }
        }
        // What compression saves over these items, per model, as calibrated where their caches were built (measured
        // now where no earlier query or build did): a compressed rung that cannot pay for its profiling by deciding
        // in its uncompressed parent's place is not offered, so the probe does not ask it.
        if pay_check && gold_only.is_none() && o.fetch.is_none() {
            let rest = n.saturating_sub(want + screen_rows) as f64;
            let look_up = !o.price_memo_hits;
            // The rows profiling would read (sample and screening), taken only where some rung can be dropped.
            let mut profiled: Option<RecordBatch> = None;
            for (t, decs) in &jobs {
                let task = &tasks[*t];
                if task.is_join() || modalities[*t] != Modality::Text {
                    continue;
                }
                let mut calibrated: BTreeMap<String, stretto_kv::calibration::Calibration> = BTreeMap::new();
                let mut items: Option<Vec<String>> = None;
                for dec in decs {
                    let ratios: Vec<f64> = calibrated_rungs(&cands[*t], dec.name())
                        .into_iter()
                        .filter_map(|i| cands[*t][i].properties().compression)
                        .collect();
                    if ratios.is_empty() {
                        continue;
                    }
                    let items = match &mut items {
                        Some(items) => items,
                        None => items.insert(cached_items(task, &input)?),
                    };
                    let s = source(dec.name());
                    // Only the way this task's operators ask: a first query over new items pays for its own
                    // figures, not for another kind's.
                    let rungs = stretto_kv::calibration::Rungs {
                        base: s.profile(),
                        ratios: &ratios,
                        passes: &[calibration_pass(task)],
                    };
                    match stretto_kv::calibration::calibrate(
                        dec,
                        &ctx.kv_dir,
                        &rungs,
                        items,
                        s.memory_budget(),
                        Some(budget.clone()),
                    ) {
                        Ok(c) => {
                            calibrated.insert(dec.name().to_string(), c);
                        }
                        Err(e) => tracing::warn!(model = dec.name(), error = %e, "compression not calibrated"),
                    }
                }
                if calibrated.is_empty() {
                    continue;
                }
                let profiled = match &mut profiled {
                    Some(b) => b,
                    None => {
                        let mut rows: Vec<usize> =
                            sample.iter().chain(&order[want..want + screen_rows]).copied().collect();
                        rows.sort_unstable();
                        profiled.insert(rows_of(&mut rows.into_iter())?)
                    }
                };
                let answers = |op: &RegisteredOp| unanswered(op, task, profiled, look_up) as f64;
                short_items.extend(drop_compressed_by_calibration(task, &mut cands[*t], &calibrated, answers, rest));
            }
        }
    }
    // Per logical operator and candidate, the seconds per tuple a deferred prefill adds to its answers outside
    // what profiling reads (0 where nothing is deferred, or the candidate reads no cache).
    let prefill_of: Vec<Vec<f64>> = cands
        .iter()
        .map(|ops| ops.iter().map(|op| deferred_prefill(&prefill_per_item, op.kv_cache_model())).collect())
        .collect();
    timings.insert("kv_caches".into(), t0.elapsed().as_secs_f64());

    // 3. Profile every candidate on the sample; logical operators side by side where the cores allow.
    let t0 = Instant::now();
    // 3a. Screening: every candidate on tuples outside the sample; the hopeless and the dominated go no further.
    //     Only tuples the optimizer never sees decide which candidates it gets, so its fit and its certificate
    //     stand as they would on a profile of those candidates alone.
    // What gold's plan on the profiling sample spent after gold answered the probe (3a-i'), and which answers it
    // asked (as `logical/physical` and rows), where it then stops profiling: booked as spent and as paid for.
    let mut gold_sample: (f64, Vec<(String, Vec<usize>)>) = (0.0, Vec::new());
    // Gold's plan's verdicts there, per row: execution reuses them, so gold's order counts them.
    let mut gold_known = GoldVerdicts::new();
    // The logical filters in the order gold's execution runs them where gold then runs ([`Profiled::gold_order`]).
    let mut gold_order: Vec<String> = Vec::new();
    // Whether the sample is profiled in two phases ([`profile_in_two_phases`]), with the tuples execution will run
    // outside profiling as the pay check after screening counted them: set where screening passed every check and
    // the certified global search will plan.
    let mut split_first: Option<f64> = None;
    // Whether gold's maps answered the probe: not where gold's filters alone stopped profiling there.
    let mut maps_probed = true;
    let mut screening = if screen_rows >= 8 {
        let t1 = Instant::now();
        let mut rows: Vec<usize> = order[want..want + screen_rows].to_vec();
        rows.sort_unstable();
        let batch = take_record_batch(&input, &UInt32Array::from_iter_values(rows.iter().map(|&r| r as u32)))?;
        let probe = PROBE_TUPLES.min(rows.len());
        let _span = tracing::info_span!("screening", tuples = rows.len(), probe).entered();
        let mut screening = Screening {
            tuples: rows.len(),
            rows: rows.clone(),
            dropped: std::mem::take(&mut short_items),
            ..Screening::default()
        };

        // 3a-i. Every candidate on the first `probe` screening tuples: what each costs per tuple beside gold. Those
        //       as dear as gold go no further, and the pay check runs before the rest of the screening is spent.
        //       Gold answers first, its filters before its maps: where the filters' answers alone show that no plan
        //       but gold can be certified, nothing else is asked, not even gold's maps (a map's answer on a tuple
        //       the filters reject never counts, and execution asks the maps about the rest). Otherwise the maps'
        //       candidates answer only the probe tuples gold's filters let through (`map_head`).
        let head = batch.slice(0, probe);
        // The probe tuples a map's candidates answer, once gold's filters have: those the filters let through (a
        // map's value elsewhere never counts: profiling asks a map only the gold result rows, and gold's plan only
        // the tuples its filters pass), or the first where none is (for its cost per tuple); as positions in `head`.
        let map_head: std::sync::OnceLock<(Vec<usize>, RecordBatch)> = std::sync::OnceLock::new();
        // Candidates with a one-off setup (a generated program) are probed only once profiling can pay without
        // them: they add to what profiling costs, and a plan can save no more with them than with the cheapest of
        // the others deciding every tuple, which the pay check already assumes.
        // `asked(t, i, setup)`: whether candidate `i` of logical operator `t` (with or without a one-off setup)
        // answers in this pass.
        let probe_pass = |asked: &(dyn Fn(usize, usize, bool) -> bool + Sync)| {
            per_task(&tasks, &cands, parallel, |t, task, ops| {
                let mut out = Vec::new();
                for (i, op) in ops.iter().enumerate() {
                    if !asked(t, i, op.one_off_setup()) {
                        continue;
                    }
                    match op.evaluate_timed(task, probe_rows(task, &head, &map_head)) {
                        Ok((output, secs)) => out.push(Tried { idx: i, output, secs }),
                        // A decline is dropped again, with its reason, at the profiling stage.
                        Err(stretto_core::CoreError::NotApplicable { .. }) if i > 0 => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok(out)
            })
        };
        let spent = |tried: &[Vec<Tried>]| tried.iter().flatten().map(|t| t.secs.iter().sum::<f64>()).sum::<f64>();
        // The share of tuples gold lets through every filter, at the upper end of its credible interval, on the
        // first `looked` screening tuples (1 for a query of maps alone).
        let through_share = |tried: &[Vec<Tried>], looked: usize| -> (usize, f64) {
            let through = gold_through(tried, looked);
            let low = stretto_optim::bounds::beta_lower_bound((looked - through) as f64, through as f64, o.credible);
            (through, 1.0 - low)
        };
        // A certified plan needs enough gold result rows held out: the share of tuples gold lets through on the
        // screening tuples, at the upper end of its credible interval, bounds how many the sample can hold out.
        let cannot_certify = |tried: &[Vec<Tried>], looked: usize| -> Option<String> {
            let (through, share) = through_share(tried, looked);
            uncertifiable(o, want, share, "").map(|why| {
                format!(
                    "gold let {through} of {looked} screening tuples through (a share of at most {:.0}% at {:.0}% \
                     credibility): {why}, so gold ran directly",
                    100.0 * share,
                    100.0 * o.credible
                )
            })
        };
        let is_map = |t: usize| tasks[t].kind == LogicalKind::Map;
        // Whether the maps' values on the probe can be judged ([`probe_hopeless`]): they answered probe tuples gold's
        // filters let through, not the first probe tuple, which they answer for their cost alone where none is.
        let maps_judged = |tried: &[Vec<Tried>]| gold_through(tried, probe) > 0;
        let mut tried: Vec<Vec<Tried>> = probe_pass(&|t, i, _| i == 0 && !is_map(t))?;
        // Gold's filters alone decide this check (a map lets every tuple through): where it fails, no other
        // candidate is probed, nor gold's maps.
        let mut uncertified = if pay_check {
            cannot_certify(&tried, probe).map(|why| format!("on the first {probe} screening tuples {why}"))
        } else {
            None
        };
        if uncertified.is_none() {
            if (0..tasks.len()).any(is_map) {
                let through = passing(probe, tried.iter().filter_map(|t| t.first()).map(|t| &t.output));
                let all: Vec<usize> = (0..probe).collect();
                let rows = profiled_rows(LogicalKind::Map, &all, Some(&through));
                let b = take_record_batch(&head, &UInt32Array::from_iter_values(rows.iter().map(|&r| r as u32)))?;
                tracing::debug!(
                    through = rows.len(),
                    probe,
                    "the probe's maps on the tuples gold's filters let through"
                );
                map_head.set((rows, b)).ok();
            }
            let maps = probe_pass(&|t, i, _| i == 0 && is_map(t))?;
            for (tried, more) in tried.iter_mut().zip(maps) {
                tried.extend(more);
            }
        } else {
            maps_probed = false;
        }
        // 3a-i'. Gold's plan on the profiling sample: its filters in the order they would run (on the probe's
        //        figures), each on the tuples the earlier ones let through. That counts the sample's gold result
        //        rows, which the stratified split holds out at a fixed share, for answers that profiling asks next
        //        anyway and that gold's execution reuses where it runs instead. Too few for any certificate, and no
        //        other candidate is asked anything.
        let certify_on_sample = pay_check && o.fetch.is_none() && certification(o).is_some();
        // Which sample tuples (in the sample's order) gold's plan on it let through: the sample's gold result, which
        // fixes the certified search's hold-out before any other candidate answers ([`screening_forecast`]).
        let mut sample_result: Option<Vec<bool>> = None;
        if certify_on_sample && uncertified.is_none() {
            let filters = gold_filter_order(&tried, probe);
            // Per filter: seconds, tuples asked, tuples passed; the probe tuples first.
            let mut figures: Vec<(f64, usize, usize)> = filters
                .iter()
                .map(|(t, pass)| {
                    let secs = tried[*t].first().map_or(0.0, |g| g.secs.iter().take(probe).sum::<f64>());
                    (secs, pass.len(), pass.iter().filter(|p| **p).count())
                })
                .collect();
            let in_order: Vec<usize> = filters.iter().map(|(t, _)| *t).collect();
            let gold = GoldOver { tasks: &tasks, cands: &cands, input: &input };
            let mut book = GoldBook { spent: &mut gold_sample, known: &mut gold_known };
            let alive = gold_plan_in_chunks(&gold, &in_order, &sample, &mut figures, &mut book)?;
            // Gold's execution, where gold runs, orders its filters on these figures, far more than the probe's,
            // counting the verdicts it reuses on the sample (the probe's tuples, every filter answered there, are
            // free in any order).
            let rest = rows_nobody_asked(n, &rows[..probe], &gold_known);
            gold_order = gold_execution_order(&figures, &in_order, &gold_known, rest)
                .iter()
                .map(|&k| tasks[in_order[k]].name.clone())
                .collect();
            let through = alive.len();
            let passed: BTreeSet<usize> = alive.iter().copied().collect();
            sample_result = Some(sample.iter().map(|r| passed.contains(r)).collect());
            tracing::debug!(through, sample = want, "gold's plan on the profiling sample");
            if let Some(why) =
                (!filters.is_empty()).then(|| uncertifiable(o, want, through as f64 / want as f64, "")).flatten()
            {
                uncertified = Some(format!(
                    "gold's plan let {through} of the {want} profiling sample tuples through: {why}, so gold ran \
                     directly"
                ));
            }
        }
        // The tuples whose answers a plan could still save on: those neither profiled nor screened (with a fetch,
        // about those gold needs to find the rows wanted: twice k over the share of tuples gold lets through, so
        // that a low estimate does not talk the optimizer out of a plan that would have paid).
        let rest_of = |tried: &[Vec<Tried>], looked: usize| -> (f64, String) {
            let mut rest = (n - want - rows.len()) as f64;
            let mut note = String::new();
            if let Some(k) = o.fetch {
                let share = (gold_through(tried, looked) as f64).max(1.0) / looked as f64;
                let needed = 2.0 * k as f64 / share;
                if needed < rest {
                    rest = needed.ceil();
                    note = format!(
                        " (LIMIT {k}: gold let {:.0}% of the screening tuples through, so about {rest} tuples are needed)",
                        100.0 * share
                    );
                }
            }
            (rest, note)
        };
        // What profiling will compute rather than read from the memo: per logical operator and candidate, the
        // tuples of the sample and of the screening after the probe whose answers the memo lacks. (The saving side
        // stays priced at recorded seconds even where gold's answers are known: a query rerun after an interruption
        // must choose as the interrupted run did, and the answers that run's execution left would talk it out of
        // its plan.)
        // (Without a pay check, or pricing memo hits, nothing is looked up: every tuple counts.)
        let look_up = pay_check && !o.price_memo_hits;
        let sample_batch = if look_up {
            take_record_batch(&input, &UInt32Array::from_iter_values(sample.iter().map(|&r| r as u32)))?
        } else {
            input.slice(0, sample.len())
        };
        let tail = batch.slice(probe, rows.len() - probe);
        let unknown = |op: &RegisteredOp, task: &SemanticTask, b: &RecordBatch| unanswered_rows(op, task, b, look_up);
        let fresh: Vec<Fresh> = tasks
            .iter()
            .zip(&cands)
            .map(|(task, ops)| Fresh {
                sample: ops
                    .iter()
                    .map(|op| unknown(op, task, &sample_batch).iter().filter(|u| **u).count() as f64)
                    .collect(),
                screening: ops.iter().map(|op| unknown(op, task, &tail)).collect(),
                sample_rows: sample_batch.num_rows() as f64,
            })
            .collect();
        // Profiling pays only if some plan could save more than it costs: at best the cheapest candidate decides
        // every tuple outside the sample and the screening (whose gold answers execution reuses) that reaches its
        // operator. A map rejects nothing, so a plan runs it after the filters (the ordering's DP places it there),
        // on the tuples they let through: at most the gold result rows over the precision target. Also returned:
        // the answers the cost counted free because the memo holds them, for the stop messages.
        // The cost also counts gold's answers that profiling asks and gold's own plan would not: profiling asks gold
        // of every operator on every tuple, gold's plan only of the tuples its earlier filters let through.
        // The tuples outside the sample and the screening that reach `task`'s operator at most: all `rest` for a
        // filter; for a map, those gold's filters let through over the precision target.
        let seen_by = |task: &SemanticTask, tried: &[Vec<Tried>], rest: f64, looked: usize| -> f64 {
            match task.kind {
                LogicalKind::Map => rest * (through_share(tried, looked).1 / o.precision).min(1.0),
                _ => rest,
            }
        };
        // `unasked[t]`: logical operator `t` has candidates not asked yet, which could cost nothing (its saving is
        // then every tuple's gold answer); empty where every candidate was asked.
        let pays_with = |tried: &[Vec<Tried>], rest: f64, screened: usize, looked: usize, unasked: &[bool]| {
            let gold_reach = gold_reach(tried, looked);
            let (mut cost, mut saving, mut free) = (0.0, 0.0, 0.0);
            for (t_idx, (((task, t), fresh), gold_reach)) in
                tasks.iter().zip(tried).zip(&fresh).zip(gold_reach).enumerate()
            {
                let Some((gold, others)) = t.split_first() else { continue };
                cost += others
                    .iter()
                    .map(|c| c.cost() * fresh.ahead_profiled(c.idx, screened, task.kind, gold_reach))
                    .sum::<f64>();
                if gold.idx == 0 {
                    cost += gold.cost() * fresh.gold_beyond_plan(screened, task.kind, gold_reach);
                }
                // Deferred caches: the sample's of every other model still in play lie ahead of profiling, and a
                // tuple outside it pays its decider's prefill.
                let prefill = &prefill_of[t_idx];
                let gold_model = cands[t_idx][gold.idx].kv_cache_model();
                let models: BTreeMap<&str, f64> = others
                    .iter()
                    .filter_map(|c| cands[t_idx][c.idx].kv_cache_model().map(|m| (m, prefill[c.idx])))
                    .filter(|(m, _)| Some(*m) != gold_model)
                    .collect();
                cost += models.values().sum::<f64>() * fresh.sample_rows;
                free += others.iter().map(|c| fresh.known(c.idx, screened)).sum::<f64>();
                let gold_total = gold.cost() + prefill[gold.idx];
                let unasked = unasked.get(t_idx).copied().unwrap_or(false);
                let floor = if unasked { 0.0 } else { gold_total };
                let cheapest = others.iter().map(|c| c.cost() + prefill[c.idx]).fold(floor, f64::min);
                // A map's candidates take over from gold at most where their values can stand for gold's (all of
                // its tuples where some candidate is neither asked nor recorded).
                // Where no cheap map plan can be certified, not even unasked candidates take over.
                let share = match task.kind {
                    LogicalKind::Map if !map_errors.certifiable || (!unasked && gold.idx == 0) => {
                        map_errors.takeover(gold, others, o.credible)
                    }
                    _ => 1.0,
                };
                saving += seen_by(task, tried, rest, looked) * (share * gold_total - cheapest).max(0.0);
            }
            (cost, saving, free)
        };
        let pays = |tried: &[Vec<Tried>], rest: f64, screened: usize, looked: usize| -> (f64, f64, f64) {
            pays_with(tried, rest, screened, looked, &[])
        };
        let kept = |tried: &[Vec<Tried>]| tried.iter().map(|t| t.len().saturating_sub(1)).sum::<usize>();
        // The other candidates' costs on the probe tuples as earlier queries over the same items recorded them: to
        // this task where recorded, else to another one, scaled per tuple by gold's cost now over its recorded cost
        // on that other task (another task's answers cost about the same per item: mostly a question pass over the
        // item's cached past), for every candidate (but those with a one-off setup, unless `with_setup`) with a
        // figure for every probe tuple; also, per logical operator, whether some candidate had none. `None` where
        // gold has not answered or the record cannot be read. Their outputs are not known, so they serve the pay
        // check only. Operators keeping no figures (answering in microseconds) are asked where `live` (else left
        // out); `asked_live` adds up what they spent. The record includes this process's figures, so a candidate
        // that answered the probe for another logical operator over the same items stands in for itself here.
        let asked_live = std::sync::Mutex::new(0.0f64);
        let recorded = |tried: &[Vec<Tried>], with_setup: bool, live: bool| -> Option<(Vec<Vec<Tried>>, Vec<bool>)> {
            let mut out = Vec::new();
            let mut lacking = Vec::new();
            for ((task, ops), t) in tasks.iter().zip(&cands).zip(tried) {
                let gold = t.first().filter(|g| g.idx == 0)?;
                let this_task = RegisteredOp::task_digest(task);
                let mut list = vec![Tried { idx: 0, output: gold.output.clone(), secs: gold.secs.clone() }];
                let mut lacks = false;
                for (i, op) in ops.iter().enumerate().skip(1).filter(|(_, op)| with_setup || !op.one_off_setup()) {
                    if !op.records_costs() {
                        if !live {
                            continue;
                        }
                        // An operator answering in microseconds (no figures kept) is asked.
                        match op.evaluate_timed(task, probe_rows(task, &head, &map_head)) {
                            Ok((_, secs)) => {
                                asked_live.lock().map(|mut s| *s += secs.iter().sum::<f64>()).ok()?;
                                list.push(Tried { idx: i, output: OpOutput::Scores(Vec::new()), secs });
                                continue;
                            }
                            Err(stretto_core::CoreError::NotApplicable { .. }) => continue,
                            Err(_) => return None,
                        }
                    }
                    let rows = probe_rows(task, &head, &map_head);
                    let figures = match op.recorded_costs(task, rows, !o.price_memo_hits) {
                        Ok(Some(figures)) => figures,
                        Ok(None) => {
                            lacks = true;
                            continue;
                        }
                        Err(stretto_core::CoreError::NotApplicable { .. }) => continue,
                        Err(_) => return None,
                    };
                    let gold_then = ops[0].recorded_costs_like(task, rows, &figures, !o.price_memo_hits).ok()?;
                    let mut secs: Vec<f64> = figures
                        .iter()
                        .zip(gold_then)
                        .zip(&gold.secs)
                        .map(|((f, then), now)| match then {
                            Some(then) if f.task != this_task && then > 0.0 => f.seconds * now / then,
                            _ => f.seconds,
                        })
                        .collect();
                    // (A set-up candidate's records hold its setup's share: nothing on a rerun, whose program is
                    // memoised.)
                    price_past_setup(op, &mut secs);
                    list.push(Tried { idx: i, output: OpOutput::Scores(Vec::new()), secs });
                }
                lacks |= drop_orphans(ops, &mut list);
                out.push(list);
                lacking.push(lacks);
            }
            Some((out, lacking))
        };
        // Where the recorded costs already show that profiling cannot pay, the other candidates are not asked
        // (those with a one-off setup left out: the probe sets them up only where profiling pays without them).
        // Candidates without a figure could cost nothing: the check can then only stop a query whose recorded
        // candidates alone cost more to profile than any plan could save.
        let recorded_check = |figures: Option<(Vec<Vec<Tried>>, Vec<bool>)>| {
            figures.and_then(|(mut est, lacking)| {
                probe_drops(&tasks, &cands, &mut est, probe, &mut Vec::new());
                let (rest, note) = rest_of(&est, probe);
                let (cost, saving, free) = pays_with(&est, rest, 0, probe, &lacking);
                tracing::debug!(cost, saving, candidates = kept(&est), "pay check on recorded costs");
                (cost >= saving).then(|| {
                    let unknown =
                        if lacking.iter().any(|l| *l) { ", at no cost where a candidate had no figure" } else { "" };
                    format!(
                        "on the first {probe} screening tuples gold answered, and what earlier queries over the same \
                         items recorded the {} candidates cheaper than gold to cost there (another task's figures \
                         scaled by gold's cost now over its cost then) showed that screening and profiling them on \
                         {want} tuples would cost {cost:.1} s{} (with gold's answers its own plan would not need), \
                         and no plan can save more than {saving:.1} s on the other {rest} tuples{note} ({}), so gold \
                         ran directly without asking them",
                        kept(&est),
                        memo_note(free),
                        saving_terms(&tasks, unknown, if map_errors.certifiable { "" } else { &left_to })
                    )
                })
            })
        };
        let rec = if pay_check && uncertified.is_none() { recorded(&tried, false, true) } else { None };
        // (Without the candidates with a one-off setup: their recorded figures hold the setup's share, which a
        // profiling that sets them up again in this process pays once, as the setup pass below counts it.)
        let recorded_stop = if pay_check && uncertified.is_none() { recorded_check(rec.clone()) } else { None };
        // With a pay check, the candidates answer in rounds, one per logical operator each (uncompressed rungs
        // before compressed ones, so that a compressed rung's parent has answered before it): once those asked
        // (and those whose costs are recorded) would cost more to profile than any plan could save, whatever the
        // others cost, no more are asked. A candidate's figures for another logical operator of the query over the
        // same items stand in for it as an earlier query's would ([`CostRecord`]), so logical operators over the same
        // items ask different candidates in a round: where two filters ask about the same column, each round
        // prices two candidates for both.
        let mut probe_stop = None;
        // Candidates not asked at all because what is recorded of their cost on these very tuples already drops
        // them ([`probe_drops`]: as dear as gold, or no cheaper than their uncompressed parent), with the reason
        // (logical operator, candidate).
        let mut not_asked: Vec<(usize, usize)> = Vec::new();
        if uncertified.is_none() && recorded_stop.is_none() {
            if pay_check {
                // What earlier queries recorded stands in for the candidates not asked yet, where it has figures.
                let rec = rec.map(|(est, _)| est);
                // Within each, those whose costs no earlier query recorded first: the others already count.
                let has_figure = |t: usize, i: usize| rec.as_ref().is_some_and(|est| est[t].iter().any(|c| c.idx == i));
                let order: Vec<Vec<usize>> = cands
                    .iter()
                    .enumerate()
                    .map(|(t, ops)| {
                        let mut order: Vec<usize> = (1..ops.len()).filter(|&i| !ops[i].one_off_setup()).collect();
                        order.sort_by_key(|&i| {
                            (ops[i].properties().compression.is_some_and(|r| r > 0.0), has_figure(t, i), i)
                        });
                        order
                    })
                    .collect();
                // Which logical operators' candidates see the same items (same kind, same item texts on the probe
                // tuples): their figures stand in for one another.
                let items: Vec<Option<Vec<String>>> = tasks.iter().map(|task| task.item_texts(&head).ok()).collect();
                let siblings = |t: usize, u: usize| {
                    t != u && tasks[t].kind == tasks[u].kind && items[t].is_some() && items[t] == items[u]
                };
                let askable: usize = order.iter().map(Vec::len).sum();
                let rounds = order.iter().map(Vec::len).max().unwrap_or(0);
                // Per logical operator, the candidates asked so far (or not asked on their record).
                let mut done: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); order.len()];
                for _ in 0..rounds {
                    // The record as it stands, this query's earlier rounds included (operators keeping no figures
                    // from the first look, which asked them).
                    let now = recorded(&tried, false, false).map(|(est, _)| est);
                    let figure = |t: usize, i: usize| {
                        now.as_ref()
                            .and_then(|r| r[t].iter().find(|c| c.idx == i))
                            .or_else(|| rec.as_ref().and_then(|r| r[t].iter().find(|c| c.idx == i)))
                    };
                    // Compressed rungs whose uncompressed parent answered the probe hopelessly are not asked: a
                    // compressed rung can only be less faithful than its parent (its past keeps less of the item), so
                    // it would leave as hopeless too, after costing its answers.
                    if maps_judged(&tried) {
                        let hopeless = hopeless_on_probe(&tasks, &tried, o.credible, PROBED, None);
                        let due = |t: usize, i: usize| order[t].contains(&i) && !done[t].contains(&i);
                        for (t, i, d) in children_of_hopeless(&tasks, &cands, &hopeless, due) {
                            done[t].insert(i);
                            not_asked.push((t, i));
                            screening.dropped.push(d);
                        }
                    }
                    let mut est = tried.clone();
                    let mut unasked = Vec::with_capacity(order.len());
                    let mut from_record = 0;
                    for (t, order) in order.iter().enumerate() {
                        let left = order.iter().filter(|i| !done[t].contains(i));
                        est[t].extend(left.clone().filter_map(|&i| figure(t, i)).cloned());
                        est[t].sort_by_key(|c| c.idx);
                        let orphans = drop_orphans(&cands[t], &mut est[t]);
                        from_record += est[t].len() - tried[t].len();
                        unasked.push(orphans || left.clone().any(|&i| figure(t, i).is_none()));
                    }
                    let mut by_record = Vec::new();
                    probe_drops(&tasks, &cands, &mut est, probe, &mut by_record);
                    if maps_judged(&est) {
                        probe_hopeless(&tasks, &cands, &mut est, o.credible, (PROBED, None), &mut Vec::new());
                    }
                    let (rest, note) = rest_of(&est, probe);
                    let (cost, saving, free) = pays_with(&est, rest, 0, probe, &unasked);
                    let asked: usize = done.iter().map(BTreeSet::len).sum::<usize>() - not_asked.len();
                    tracing::debug!(cost, saving, asked, askable, "pay check while probing");
                    if cost >= saving {
                        let recorded = if from_record > 0 {
                            format!(
                                " (and what {from_record} others cost there was recorded: by earlier queries over the \
                                 same items, or by this query's other operators over them)"
                            )
                        } else {
                            String::new()
                        };
                        probe_stop = Some(format!(
                            "on the first {probe} screening tuples gold and {asked} of the {askable} other candidates \
                             answered{recorded}, and screening and profiling the {} of them cheaper than gold on {want} \
                             tuples would already cost {cost:.1} s{} (with gold's answers its own plan would not need), \
                             while no plan can save more than {saving:.1} s on the other {rest} tuples{note} ({}), so \
                             gold ran directly without asking the other {}",
                            kept(&est),
                            memo_note(free),
                            saving_terms(
                                &tasks,
                                ", at no cost where some were neither asked nor recorded",
                                &left_to
                            ),
                            askable - asked
                        ));
                        break;
                    }
                    // This round's candidate per logical operator: the first in its order with no figure yet that no
                    // operator over the same items asks this round, else the first with no figure, else the first.
                    let mut pick: Vec<Option<usize>> = vec![None; order.len()];
                    for (t, order) in order.iter().enumerate() {
                        let taken = |i: usize| {
                            (0..t).any(|u| {
                                siblings(t, u) && pick[u].is_some_and(|j| cands[u][j].name() == cands[t][i].name())
                            })
                        };
                        let left: Vec<usize> = order.iter().copied().filter(|i| !done[t].contains(i)).collect();
                        pick[t] = left
                            .iter()
                            .find(|&&i| figure(t, i).is_none() && !taken(i))
                            .or_else(|| left.iter().find(|&&i| figure(t, i).is_none()))
                            .or_else(|| left.first())
                            .copied();
                    }
                    // This round's candidates that their recorded costs already drop are not asked: the probe would
                    // measure on the same tuples what was recorded there and drop them on it (a cost, never an
                    // answer, so the certificate's argument is untouched).
                    let skip = skipped_by_record(&tasks, &cands, &by_record, |t, i| {
                        pick[t] == Some(i) && figure(t, i).is_some()
                    });
                    for (t, i, d) in skip.iter().cloned() {
                        not_asked.push((t, i));
                        screening.dropped.push(d);
                    }
                    for (t, pick) in pick.iter().enumerate() {
                        done[t].extend(*pick);
                    }
                    let more = probe_pass(&|t, i, setup| !setup && pick[t] == Some(i) && !not_asked.contains(&(t, i)))?;
                    for (tried, more) in tried.iter_mut().zip(more) {
                        tried.extend(more);
                        tried.sort_by_key(|t| t.idx);
                    }
                }
            } else {
                let more = probe_pass(&|_, i, setup| i > 0 && !setup)?;
                for (tried, more) in tried.iter_mut().zip(more) {
                    tried.extend(more);
                }
            }
        }
        let recorded_stop = recorded_stop.or(probe_stop);
        screening.seconds = spent(&tried) + asked_live.lock().map_or(0.0, |s| *s);
        screening.candidates = kept(&tried);
        // Which candidates answered the probe (a decline is not among them).
        let mut ran: Vec<BTreeSet<usize>> = tried.iter().map(|t| t.iter().map(|t| t.idx).collect()).collect();
        // (Those dropped on their recorded costs leave with the rest.)
        for &(t, i) in &not_asked {
            ran[t].insert(i);
        }
        probe_drops(&tasks, &cands, &mut tried, probe, &mut screening.dropped);
        if maps_judged(&tried) {
            probe_hopeless(&tasks, &cands, &mut tried, o.credible, (PROBED, None), &mut screening.dropped);
        }
        let with_setup: Vec<(usize, usize)> = cands
            .iter()
            .enumerate()
            .flat_map(|(t, ops)| {
                ops.iter().enumerate().skip(1).filter(|(_, op)| op.one_off_setup()).map(move |(i, _)| (t, i))
            })
            .collect();
        if !with_setup.is_empty() {
            let (rest, _) = rest_of(&tried, probe);
            let (cost, saving, _) = pays(&tried, rest, 0, probe);
            if pay_check && (cost >= saving || uncertified.is_some() || recorded_stop.is_some()) {
                for &(t, i) in &with_setup {
                    screening.dropped.push(Dropped {
                        logical: tasks[t].name.clone(),
                        operator: cands[t][i].name().to_string(),
                        reason: "never set up: profiling could not pay even without its one-off setup".into(),
                    });
                }
            } else {
                // As in the rounds: a candidate whose recorded costs on these tuples (its one-off setup's share
                // included) already drop it is not set up again.
                let mut by_record = Vec::new();
                if let Some((mut est, _)) = pay_check.then(|| recorded(&tried, true, true)).flatten() {
                    probe_drops(&tasks, &cands, &mut est, probe, &mut by_record);
                }
                let skip = skipped_by_record(&tasks, &cands, &by_record, |t, i| cands[t][i].one_off_setup());
                for (t, i, d) in skip {
                    ran[t].insert(i);
                    not_asked.push((t, i));
                    screening.dropped.push(d);
                }
                let more = probe_pass(&|t, i, setup| i > 0 && setup && !not_asked.contains(&(t, i)))?;
                screening.seconds += spent(&more);
                screening.candidates += kept(&more);
                for (t, ((tried, ran), more)) in tried.iter_mut().zip(ran.iter_mut()).zip(more).enumerate() {
                    ran.extend(more.iter().map(|t| t.idx));
                    // (The setup is counted in the screening's seconds above.)
                    tried.extend(more.into_iter().map(|mut c| {
                        price_past_setup(&cands[t][c.idx], &mut c.secs);
                        c
                    }));
                    tried.sort_by_key(|t| t.idx);
                }
                probe_drops(&tasks, &cands, &mut tried, probe, &mut screening.dropped);
                if maps_judged(&tried) {
                    probe_hopeless(&tasks, &cands, &mut tried, o.credible, (PROBED, None), &mut screening.dropped);
                }
            }
        }
        // A candidate is worth profiling only if it could save more than its own profiling costs: at best it
        // decides, in gold's place, every tuple outside the sample and the screening that reaches its operator
        // (a plan with it in front of gold costs at least what gold's plan with that operator first would, less
        // that saving).
        let unpaying = |tried: &mut [Vec<Tried>], screened: usize, looked: usize, dropped: &mut Vec<Dropped>| {
            let (rest, _) = rest_of(tried, looked);
            let seen: Vec<f64> = tasks.iter().map(|task| seen_by(task, tried, rest, looked)).collect();
            let reach = gold_reach(tried, looked);
            for (t_idx, (((((task, ops), t), fresh), seen), reach)) in
                tasks.iter().zip(&cands).zip(tried.iter_mut()).zip(&fresh).zip(seen).zip(reach).enumerate()
            {
                let prefill = &prefill_of[t_idx];
                // Seconds per tuple outside profiling: the answer's, and where deferred, the prefill's.
                let Some(gold) = t.first().filter(|g| g.idx == 0).map(|g| g.cost() + prefill[0]) else { continue };
                let costs: Vec<(usize, f64)> = t.iter().map(|c| (c.idx, c.cost() + prefill[c.idx])).collect();
                // A map candidate decides in another's place at most where its values can stand for gold's.
                let shares: Vec<f64> = t
                    .iter()
                    .map(|c| match (task.kind, t.first()) {
                        (LogicalKind::Map, Some(g)) if c.idx != 0 => {
                            map_errors.takeover(g, std::slice::from_ref(c), o.credible)
                        }
                        _ => 1.0,
                    })
                    .collect();
                let mut share = shares.into_iter();
                t.retain(|c| {
                    let share = share.next().unwrap_or(1.0);
                    let cost = c.cost() * fresh.ahead_profiled(c.idx, screened, task.kind, reach);
                    // A compressed rung can only be less faithful than its uncompressed parent: where the parent
                    // is a candidate too, what the rung adds is deciding in the parent's place, not gold's.
                    let parent = uncompressed_parent(ops, &costs, c.idx).filter(|&(_, p)| p < gold);
                    let (versus, instead) = match parent {
                        Some((j, p)) => (p, format!("its uncompressed parent {}'s", ops[j].name())),
                        None => (gold, "gold's".to_string()),
                    };
                    let saving = seen * (share * versus - c.cost() - prefill[c.idx]).max(0.0);
                    tracing::debug!(logical = %task.name, operator = %ops[c.idx].name(), per_tuple = c.cost(), versus, share, cost, saving, screened, looked, "worth profiling?");
                    if c.idx == 0 || cost < saving {
                        return true;
                    }
                    dropped.push(Dropped {
                        logical: task.name.clone(),
                        operator: ops[c.idx].name().to_string(),
                        reason: if share < 1.0 {
                            format!(
                                "profiling it would cost {cost:.1} s, and deciding in {instead} place the other {rest} \
                                 tuples that reach its operator would save at most {saving:.1} s ({})",
                                map_errors.keeps(share)
                            )
                        } else {
                            format!(
                                "profiling it would cost {cost:.1} s, and deciding in {instead} place every one of the \
                                 other {rest} tuples that reach its operator would save at most {saving:.1} s"
                            )
                        },
                    });
                    false
                });
            }
        };
        let (rest, note) = rest_of(&tried, probe);
        let (cost, saving, free) = pays(&tried, rest, 0, probe);
        let stop = if !pay_check {
            None
        } else if uncertified.is_some() {
            uncertified
        } else if recorded_stop.is_some() {
            recorded_stop
        } else if cost >= saving {
            Some(format!(
                "on the first {probe} screening tuples the {} candidates cheaper than gold showed that screening and \
                 profiling them on {want} tuples would cost {cost:.1} s{} (with gold's answers its own plan would \
                 not need), and no plan can save more than \
                 {saving:.1} s on the other {rest} tuples{note} ({assumed}), so gold ran directly",
                kept(&tried),
                memo_note(free)
            ))
        } else {
            None
        };
        if stop.is_none() && pay_check {
            unpaying(&mut tried, 0, probe, &mut screening.dropped);
        }
        if let Some(why) = stop {
            // 3a-ii skipped: only the probed tuples were screened.
            screening.tuples = probe;
            screening.rows.truncate(probe);
            gold_only = Some(why);
        } else {
            // 3a-ii. The candidates left on the rest of the screening tuples; the hopeless and the dominated go no
            //        further. Only tuples the optimizer never sees decide which candidates it gets, so its fit and
            //        its certificate stand as they would on a profile of those candidates alone.
            //        Filters first, then maps only on the tuples gold's filters let through: a map's value counts
            //        nowhere else (profiling asks it only the gold result rows of the sample, and gold's plan only
            //        the tuples its filters pass), so its answers elsewhere would be paid for and never used.
            //        With a pay check, the rest is screened in two looks ([`screening_looks`]). After the first, the
            //        tests that hold on few tuples run on the answers so far: the candidates as dear as gold or no
            //        cheaper than their uncompressed parent, the maps hopeless at the upper end of their credible
            //        interval, and those that cannot pay for their own profiling leave; and the pay check runs as
            //        after the whole screening, so that where it already shows that profiling cannot pay, gold runs
            //        without the second look's answers. (The quality tests on point figures, [`screen_out`], and the
            //        test sequence's forecast wait for every screening tuple.)
            let ask_of_kind = |tried: &[Vec<Tried>], maps: bool, rows: &RecordBatch| {
                per_task(&tasks, &cands, parallel, |i, task, ops| {
                    if (task.kind == LogicalKind::Map) != maps {
                        return Ok(None);
                    }
                    // (No tuple through: a map answers nothing, and its operators are not called.)
                    if maps && rows.num_rows() == 0 {
                        let empty = OpOutput::Values { values: Vec::new(), confidences: Vec::new() };
                        return Ok(Some(tried[i].iter().map(|_| (empty.clone(), Vec::new())).collect::<Vec<_>>()));
                    }
                    tried[i]
                        .iter()
                        .map(|t| Ok(ops[t.idx].evaluate_timed(task, rows)?))
                        .collect::<Result<Vec<_>>>()
                        .map(Some)
                })
            };
            // The test sequence planned on the screening tuples (`map_positions`: those the maps' candidates
            // answered), where the certified global search will plan on the sample's hold-out.
            let forecast_on = |tried: &[Vec<Tried>], map_positions: &[usize]| -> Option<Forecast> {
                let result = sample_result.as_ref().filter(|_| tests_whole_result(o))?;
                let global = Global { certification: certification(o).unwrap_or_default() };
                let on = ScreeningAnswers { tried, map_positions, prefill_of: &prefill_of };
                screening_forecast(&tasks, &cands, &on, result, o, &global)
                    .map_err(|e| tracing::warn!(error = %e, "no forecast of the test sequence"))
                    .ok()
            };
            // Why gold runs on forecast `f`, planned on the first `looked` screening tuples, where profiling the
            // candidates left on the sample (and the rest of the screening, if any) would cost `cost` and the plans
            // can save on `rest` tuples.
            let forecast_stop = |f: &Forecast, tried: &[Vec<Tried>], looked: usize, rest: f64, cost: f64| {
                let planned = format!(
                    "planned on the {looked} screening tuples with the sample's hold-out ({} tuples, {} of them gold \
                     result rows)",
                    f.held.tuples, f.held.positives
                );
                if f.sequence == 0 {
                    Some(format!(
                        "{planned}, no plan but gold is expected to be certifiable at these targets, so the {} \
                         candidates left were not profiled on {want} tuples and gold ran directly",
                        kept(tried)
                    ))
                } else if f.expected_saving * rest <= cost {
                    Some(format!(
                        "{planned}, the test sequence ({} {}) is expected to save {:.1} s on the other {rest} tuples \
                         ({:.4} s per tuple), no more than the {cost:.1} s profiling the {} candidates left on {want} \
                         tuples would cost, so gold ran directly",
                        f.sequence,
                        if f.sequence == 1 { "plan" } else { "plans" },
                        f.expected_saving * rest,
                        f.expected_saving,
                        kept(tried)
                    ))
                } else {
                    None
                }
            };
            // The screening tuples a map's candidates answered: the probe's gold's filters let through (or its
            // first), and those of the rest gold lets through.
            let mut map_positions: Vec<usize> =
                map_head.get().map_or_else(|| (0..probe).collect(), |(rows, _)| rows.clone());
            let looks = screening_looks(tail.num_rows(), pay_check);
            for (k, &(from, to)) in looks.iter().enumerate() {
                let part = tail.slice(from, to - from);
                let filtered = ask_of_kind(&tried, false, &part)?;
                let through = gold_passes(&filtered, part.num_rows());
                map_positions.extend((0..part.num_rows()).filter(|&r| through[r]).map(|r| probe + from + r));
                let map_rows = take_record_batch(
                    &part,
                    &UInt32Array::from_iter_values((0..part.num_rows()).filter(|&r| through[r]).map(|r| r as u32)),
                )?;
                tracing::debug!(
                    through = map_rows.num_rows(),
                    asked = part.num_rows(),
                    look = k + 1,
                    "screening's maps on the tuples gold's filters let through"
                );
                let mapped = ask_of_kind(&tried, true, &map_rows)?;
                let more: Vec<Vec<(OpOutput, Vec<f64>)>> =
                    filtered.into_iter().zip(mapped).map(|(f, m)| f.or(m).unwrap_or_default()).collect();
                for (ops, (tried, more)) in cands.iter().zip(tried.iter_mut().zip(more)) {
                    for (t, (output, secs)) in tried.iter_mut().zip(more) {
                        screening.seconds += secs.iter().sum::<f64>();
                        t.output.append(output, ops[t.idx].name())?;
                        t.secs.extend(secs);
                    }
                }
                if k + 1 == looks.len() {
                    break;
                }
                // The first look's check, on the `looked` screening tuples answered so far.
                let looked = probe + to;
                let _span = tracing::info_span!("first look", looked).entered();
                probe_drops(&tasks, &cands, &mut tried, looked, &mut screening.dropped);
                if gold_through(&tried, looked) > 0 {
                    // (Where gold's filters let no probe tuple through, the maps answered the first for its cost: a
                    // value there does not count.)
                    let through = passing(looked, tried.iter().filter_map(|t| t.first()).map(|t| &t.output));
                    let counts: Vec<bool> =
                        map_positions.iter().map(|&p| through.get(p).copied().unwrap_or(false)).collect();
                    let judged = (FIRST_LOOK, Some(counts.as_slice()));
                    probe_hopeless(&tasks, &cands, &mut tried, o.credible, judged, &mut screening.dropped);
                }
                unpaying(&mut tried, to, looked, &mut screening.dropped);
                let (rest, note) = rest_of(&tried, looked);
                let (cost, saving, free) = pays(&tried, rest, to, looked);
                tracing::debug!(cost, saving, looked, "pay check after the first look");
                let why = if cost >= saving {
                    Some(format!(
                        "on the first {looked} of the {} screening tuples the {} candidates left showed that screening \
                         the rest and profiling them on {want} tuples would cost {cost:.1} s{} (with gold's answers \
                         its own plan would not need), and no plan can save more than {saving:.1} s on the other \
                         {rest} tuples{note} ({assumed}), so gold ran directly",
                        rows.len(),
                        kept(&tried),
                        memo_note(free)
                    ))
                } else if certify_on_sample {
                    // (The test sequence's forecast waits for every screening tuple: planned on the first look's, it
                    // sent to gold queries whose plans pay, where its fit on fewer tuples left no plan certifiable.)
                    None
                } else {
                    cannot_certify(&tried, looked).map(|why| format!("halfway through screening, {why}"))
                };
                if let Some(why) = why {
                    screening.tuples = looked;
                    screening.rows.truncate(looked);
                    gold_only = Some(why);
                    break;
                }
            }
            if gold_only.is_none() {
                for ((task, ops), tried) in tasks.iter().zip(&cands).zip(tried.iter_mut()) {
                    let Some(gold) = tried.first().map(|t| t.output.clone()) else { continue };
                    let names: Vec<String> = tried.iter().map(|t| ops[t.idx].name().to_string()).collect();
                    let figures: Vec<Screened> = tried.iter().map(|t| screened(&gold, &t.output, &t.secs)).collect();
                    let out: BTreeSet<usize> = screen_out(&names, &figures)
                        .into_iter()
                        .map(|(k, reason)| {
                            screening.dropped.push(Dropped {
                                logical: task.name.clone(),
                                operator: names[k].clone(),
                                reason,
                            });
                            k
                        })
                        .collect();
                    let mut k = 0;
                    tried.retain(|_| {
                        k += 1;
                        !out.contains(&(k - 1))
                    });
                }
                let screened = tail.num_rows();
                if pay_check {
                    unpaying(&mut tried, screened, rows.len(), &mut screening.dropped);
                }
                let (rest, note) = rest_of(&tried, rows.len());
                let (cost, saving, free) = pays(&tried, rest, screened, rows.len());
                tracing::debug!(
                    cost,
                    saving,
                    through = gold_through(&tried, rows.len()),
                    looked = rows.len(),
                    sample = want,
                    "pay check after screening"
                );
                if pay_check && cost < saving {
                    if certify_on_sample {
                        // Gold's plan answered the sample (3a-i'), whose exact count of gold result rows passed: the
                        // candidates are profiled on it in two phases.
                        // Before the sample's candidates answer, the test sequence is forecast on the screening
                        // tuples: where what it is expected to save cannot pay for profiling, gold runs.
                        match forecast_on(&tried, &map_positions)
                            .and_then(|f| forecast_stop(&f, &tried, rows.len(), rest, cost))
                        {
                            Some(why) => gold_only = Some(why),
                            None => split_first = tests_whole_result(o).then_some(rest),
                        }
                    } else if let Some(why) = cannot_certify(&tried, rows.len()) {
                        gold_only = Some(format!("after screening, {why}"));
                    }
                } else if pay_check {
                    gold_only = Some(format!(
                        "profiling the {} candidates left after screening on {want} tuples would cost {cost:.1} s{} \
                         (with gold's answers its own plan would not need), and no plan can save more than \
                         {saving:.1} s on the other {rest} tuples{note} ({assumed}), so gold ran directly",
                        kept(&tried),
                        memo_note(free)
                    ));
                }
            }
        }
        for d in &screening.dropped {
            tracing::info!(logical = %d.logical, operator = %d.operator, reason = %d.reason, "not profiled");
        }
        // What goes on to profiling: the candidates screening kept (and any that declined it, which decline again
        // there), or gold alone.
        for ((ops, tried), ran) in cands.iter_mut().zip(&tried).zip(&ran) {
            let dropped: BTreeSet<usize> = ran.iter().copied().filter(|i| !tried.iter().any(|t| t.idx == *i)).collect();
            let all = std::mem::take(ops);
            *ops = all.into_iter().enumerate().filter(|(i, _)| !dropped.contains(i)).map(|(_, op)| op).collect();
        }
        timings.insert("screening".into(), t1.elapsed().as_secs_f64());
        if let Some(why) = &gold_only {
            tracing::info!(%why, "profiling cannot pay");
            for ops in cands.iter_mut() {
                ops.truncate(1);
            }
            if o.fetch.is_some() {
                let (rest, _) = rest_of(&tried, screening.tuples);
                // Execution reads the input in order and stops at the fetch: gold is profiled on the first tuples it
                // will read anyway, whose memoised answers execution then reuses, not on a sample it may never reach.
                sample = (0..want.min(rest as usize).max(1)).collect();
            } else {
                // Gold needs no certificate, only an order of its stages: the screening tuples it has answered give
                // one at no further cost (the profile is then of screening tuples, which no certificate reads).
                sample = screening.rows.clone();
            }
        }
        Some(screening)
    } else {
        None
    };
    // Gold's plan on the sample counts as spent where it stopped profiling (else the profile's gold entries count
    // its answers).
    let mut gold_sample = if gold_only.is_some() { gold_sample } else { (0.0, Vec::new()) };
    // Gold alone from the start with two filters or more to order: every gold filter answers the sample's first
    // [`GOLD_PROFILE_TUPLES`] (the profile: what each costs), and gold's plan answers the rest for the ordering's
    // figures, [`PROBE_TUPLES`] at a time in the order the figures so far give, each filter only on the tuples the
    // earlier ones let through. Execution reuses every answer: gold's own plan would have asked all of them but the
    // later filters' on the profile's tuples, and those a chunk asked in an order the figures then overturned.
    let gold_filters: Vec<usize> = (0..tasks.len()).filter(|&t| tasks[t].kind != LogicalKind::Map).collect();
    let order_rest: Vec<usize> =
        if gold_only.is_some() && screening.is_none() && gold_filters.len() > 1 && sample.len() > GOLD_PROFILE_TUPLES {
            sample.split_off(GOLD_PROFILE_TUPLES)
        } else {
            Vec::new()
        };
    let sample_batch = take_record_batch(&input, &UInt32Array::from_iter_values(sample.iter().map(|&r| r as u32)))?;
    // Deferred caches: the other models' sample caches, now that screening has shown profiling can pay (of the
    // models some candidate left still reads), before profiling times anything.
    let t2 = Instant::now();
    if !sample_later.is_empty() {
        let mut asked = Vec::new();
        if gold_only.is_none() {
            let _span = tracing::info_span!("kv_caches", tuples = sample.len()).entered();
            for (t, decs) in &sample_later {
                // Gold's answers on the sample are in hand (a rerun's memoised ones, where gold's model waits too).
                for dec in
                    decs.iter().filter(|d| cands[*t].iter().skip(1).any(|op| op.kv_cache_model() == Some(d.name())))
                {
                    source(dec.name()).ensure(dec, &cached_items(&tasks[*t], &sample_batch)?)?;
                    asked.push(format!("{} {} tuples", dec.name(), sample_batch.num_rows()));
                }
            }
        }
        if let Some(note) = kv_note.as_mut() {
            note.push_str(&if asked.is_empty() {
                "; the other models' sample caches were never prefilled: no candidate reading them was profiled".into()
            } else {
                format!("; after screening, the sample's: {}", asked.join(", "))
            });
        }
    }
    let sample_prefill = t2.elapsed().as_secs_f64();
    if let Some(s) = timings.get_mut("kv_caches") {
        *s += sample_prefill;
    }
    // The entries, and the operator seconds they cost (not those of every entry on every tuple).
    let (entries, profiled): (Vec<Vec<PhysicalEntry>>, f64) = if let Some(rest) = split_first {
        let _span = tracing::info_span!("profiling", tuples = sample.len(), phased = true).entered();
        let global = Global { certification: certification(o).unwrap_or_default() };
        let phased =
            profile_in_two_phases(&tasks, &cands, parallel, &sample_batch, &sample, n as u64, rest, o, &global)?;
        if let Some(why) = phased.stop {
            tracing::info!(%why, "profiling cannot pay");
            gold_only = Some(why);
        }
        for d in &phased.dropped {
            tracing::info!(logical = %d.logical, operator = %d.operator, reason = %d.reason, "not profiled");
        }
        if let Some(sc) = screening.as_mut() {
            sc.dropped.extend(phased.dropped);
        }
        (phased.entries, phased.spent)
    } else {
        let _span = tracing::info_span!("profiling", tuples = sample.len()).entered();
        let batch = &sample_batch;
        let n = sample.len();
        let all: Vec<usize> = (0..n).collect();
        // Every candidate of `kind`'s operators on `rows` of the sample.
        let ask_all = |kind: LogicalKind, rows: &[usize]| {
            per_task(&tasks, &cands, parallel, |_, task, ops| -> Result<Vec<(usize, Asked)>> {
                let mut out = Vec::new();
                if task.kind != kind {
                    return Ok(out);
                }
                for (i, op) in ops.iter().enumerate() {
                    match ask(op, task, batch, rows) {
                        Ok(asked) => out.push((i, asked)),
                        // An operator that declines the task is no candidate for it; gold must answer.
                        Err(stretto_core::CoreError::NotApplicable { reason, .. }) if i > 0 => {
                            tracing::info!(operator = op.name(), task = %task.name, %reason, "dropped");
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok(out)
            })
        };
        // The filters first: gold's answers give the gold result rows, the only ones the maps are asked about.
        let filters = ask_all(LogicalKind::Filter, &all)?;
        let gold: Vec<Option<&Asked>> =
            filters.iter().map(|f| f.first().filter(|(i, _)| *i == 0).map(|(_, a)| a)).collect();
        let positive = gold_result(n, &gold);
        // Per gold filter (in `gold_filters`' order): seconds, tuples asked and tuples passed, the profile's tuples
        // first, then whatever gold's plan asks next.
        let mut figures: Vec<(f64, usize, usize)> = gold_filters
            .iter()
            .map(|&t| {
                gold[t].map_or((0.0, 0, 0), |a| {
                    let passed = match &a.output {
                        OpOutput::Scores(s) => s.iter().filter(|v| **v > 0.0).count(),
                        _ => 0,
                    };
                    (a.seconds(), a.rows.len(), passed)
                })
            })
            .collect();
        let over = GoldOver { tasks: &tasks, cands: &cands, input: &input };
        // Gold's plan on the rest of the sample (gold alone from the start, two filters or more), a probe's worth at
        // a time, its filters in the order the figures so far give: the rows it lets through.
        let order_through = if order_rest.is_empty() {
            Vec::new()
        } else {
            let _span = tracing::info_span!("gold_order", tuples = order_rest.len()).entered();
            let mut book = GoldBook { spent: &mut gold_sample, known: &mut gold_known };
            gold_plan_in_chunks(&over, &gold_filters, &order_rest, &mut figures, &mut book)?
        };
        // A gold-only profile whose tuples gold's filters all reject: its maps answer, for their cost per tuple, a
        // tuple outside it that gold's plan lets through: the first of the sample's rest that did, whose answers
        // gold's plan asked anyway; else one looked for a probe's worth at a time among the next of the seeded
        // order (at most [`GOLD_ORDER_TUPLES`]). Execution reuses every answer either asks, where a map's answer on
        // a rejected tuple is one it never would (#21).
        let mut beyond: Option<usize> = None;
        let map_tasks = tasks.iter().any(|t| t.kind == LogicalKind::Map);
        if gold_only.is_some() && map_tasks && positive.as_ref().is_some_and(|p| !p.contains(&true)) {
            beyond = order_through.first().copied();
            if beyond.is_none() && o.fetch.is_none() {
                let _span = tracing::info_span!("gold_map_row").entered();
                let taken: BTreeSet<usize> = sample
                    .iter()
                    .chain(&order_rest)
                    .chain(screening.as_ref().map_or(&[][..], |s| &s.rows[..]))
                    .copied()
                    .collect();
                let spare: Vec<usize> =
                    order.iter().copied().filter(|r| !taken.contains(r)).take(GOLD_ORDER_TUPLES).collect();
                for chunk in spare.chunks(PROBE_TUPLES) {
                    let mut book = GoldBook { spent: &mut gold_sample, known: &mut gold_known };
                    let alive = gold_plan_in_chunks(&over, &gold_filters, chunk, &mut figures, &mut book)?;
                    if let Some(&r) = alive.first() {
                        beyond = Some(r);
                        break;
                    }
                }
                tracing::debug!(found = ?beyond, looked = spare.len(), "a tuple gold's filters let through, for its maps");
            }
        }
        if !order_rest.is_empty() {
            // Gold's execution orders its filters on every figure gold's plan gave, counting the verdicts it reuses
            // (the profile's tuples, every filter answered there, are free in any order).
            let rest = rows_nobody_asked(n, &sample, &gold_known);
            gold_order = gold_execution_order(&figures, &gold_filters, &gold_known, rest)
                .iter()
                .map(|&k| tasks[gold_filters[k]].name.clone())
                .collect();
        }
        let maps = match beyond {
            // Gold's maps on that tuple, booked with gold's plan's answers (execution reuses them); the entry keeps
            // their cost per tuple, and no value on the profile's tuples, none of which is in the gold result.
            Some(r) => {
                let mut maps = Vec::with_capacity(tasks.len());
                for (task, ops) in tasks.iter().zip(&cands) {
                    if task.kind != LogicalKind::Map {
                        maps.push(Vec::new());
                        continue;
                    }
                    let asked = ask(&ops[0], task, &input, &[r])?;
                    gold_sample.0 += asked.seconds();
                    gold_sample.1.push((format!("{}/{}", task.name, ops[0].name()), vec![r]));
                    maps.push(vec![(0, asked)]);
                }
                maps
            }
            None => ask_all(LogicalKind::Map, &profiled_rows(LogicalKind::Map, &all, positive.as_deref()))?,
        };
        // Operator seconds, but on tuples screening already paid for (the screening tuples gold-only profiling
        // reuses; a map's only where gold's maps answered the probe).
        let screened: BTreeSet<usize> =
            screening.as_ref().map(|s| s.rows.iter().copied().collect()).unwrap_or_default();
        let mut fresh_seconds = 0.0;
        let mut entries = Vec::with_capacity(tasks.len());
        for ((task, ops), (f, m)) in tasks.iter().zip(&cands).zip(filters.into_iter().zip(maps)) {
            let mut list = Vec::new();
            let paid_by_screening = task.kind != LogicalKind::Map || maps_probed;
            let elsewhere = task.kind == LogicalKind::Map && beyond.is_some();
            for (i, asked) in f.into_iter().chain(m) {
                if elsewhere {
                    // (Asked outside the profile, and booked with gold's plan's answers.)
                    list.push(entry_priced_elsewhere(task, &ops[i], n, &asked, i == 0));
                    continue;
                }
                fresh_seconds += asked
                    .rows
                    .iter()
                    .zip(&asked.secs)
                    .filter(|(r, _)| !(paid_by_screening && screened.contains(&sample[**r])))
                    .map(|(_, s)| s)
                    .sum::<f64>();
                list.push(entry_from(task, &ops[i], n, vec![asked], i == 0)?);
            }
            entries.push(list);
        }
        (entries, fresh_seconds)
    };
    let mut profile = Profile {
        format: PROFILE_FORMAT.into(),
        query: o.query.clone(),
        population: n as u64,
        tuples: sample.iter().map(|r| r.to_string()).collect(),
        logical: tasks.iter().map(logical_entry).collect(),
        physical: entries.into_iter().flatten().collect(),
        sample_digest: None,
    };
    // Deferred caches: a tuple outside profiling pays its prefill where an operator reads it.
    let mut shared_costs = BTreeMap::new();
    if !prefill_per_item.is_empty() {
        let model_of = |entry: &str| {
            tasks.iter().zip(&cands).find_map(|(t, ops)| {
                let op = entry.strip_prefix(&format!("{}/", t.name))?;
                ops.iter().find(|o| o.name() == op)?.kv_cache_model().map(str::to_string)
            })
        };
        // Execution pays a prefill only on the tuples profiling did not read (there every answer a plan asks is
        // memoised) whose item has no stored cache now (one kept from an earlier query is read as it is).
        let profiled: BTreeSet<usize> = sample.iter().chain(&order[want..want + screen_rows]).copied().collect();
        let outside = (0..n).filter(|r| !profiled.contains(r)).map(|r| r as u32);
        let outside = take_record_batch(&input, &UInt32Array::from_iter_values(outside))?;
        let mut per_tuple = BTreeMap::new();
        let mut counted = Vec::new();
        for (m, secs) in &prefill_per_item {
            let dec = stretto_ops_text::decoder(ctx, m, stretto_kv::convert::Weights::F32)?;
            let readers: Vec<&SemanticTask> = tasks
                .iter()
                .zip(&cands)
                .filter(|(_, ops)| ops.iter().any(|op| op.kv_cache_model() == Some(m.as_str())))
                .map(|(t, _)| t)
                .collect();
            let stored = source(m);
            let pays = tuples_to_prefill(&readers, &outside, |item| Ok(!stored.is_stored(&dec, item)?))?;
            per_tuple.insert(m.clone(), secs * pays as f64 / n.max(1) as f64);
            counted.push(format!("{m} {pays} of {n}"));
        }
        if let Some(note) = kv_note.as_mut() {
            let memoised = if o.prefill_profiled_only {
                "those profiling read have their answers memoised here, and shipped to the executors with the plan up \
                 to a size limit; those whose caches are stored in this KV directory read them, where the executors \
                 share it"
            } else {
                "those profiling read have their answers memoised; those whose caches are stored read them"
            };
            note.push_str(&format!(
                "; execution prefills, of the tuples, {} ({memoised}), and the plans' costs price only those",
                counted.join(", ")
            ));
        }
        shared_costs = price_deferred_prefill(&mut profile, &per_tuple, model_of);
    }
    let profile_path = match run_file(o, "profile.json")? {
        Some(path) => {
            profile.sample_digest = Some(sample_digest(&tasks, &input, &profile.tuples)?);
            profile.write(&path)?;
            Some(path)
        }
        None => None,
    };
    timings.insert("profiling".into(), t0.elapsed().as_secs_f64() - sample_prefill);
    timings.insert("prepare_total".into(), total.elapsed().as_secs_f64());
    // What this profiling paid for: every profiled operator on the sample, and (having passed screening) on the
    // screening tuples.
    let mut paid = PaidAnswers::default();
    let screened_rows = screening.as_ref().map(|s| s.rows.as_slice()).unwrap_or_default();
    for e in &profile.physical {
        paid.add(&e.name, asked_rows(e).into_iter().map(|r| sample[r]).chain(screened_rows.iter().copied()));
    }
    for (name, rows) in &gold_sample.1 {
        paid.add(name, rows.iter().copied());
    }
    let spent_seconds = profiled + screening.as_ref().map_or(0.0, |s| s.seconds) + gold_sample.0;
    Ok(Profiled {
        // The operators profiled, which leaves out any that declined its task.
        candidates: tasks
            .iter()
            .map(|t| {
                let prefix = format!("{}/", t.name);
                let names = profile.physical.iter().filter_map(|e| e.name.strip_prefix(&prefix)).map(str::to_string);
                (t.name.clone(), names.collect())
            })
            .collect(),
        tasks,
        input,
        profile,
        profile_path,
        sample_rows: sample.len(),
        timings,
        gold_only,
        screening,
        gold_order,
        paid: Arc::new(paid),
        spent_seconds,
        kv_note,
        gold_notes,
        shared_costs,
    })
}

/// A digest of what `tasks` read on the tuples `tuples` (row numbers of `input`) names: a profile records it, so a
/// pipeline reusing the profile can tell whether its input holds the same data there. A tuple id that is no row of
/// `input` is an error.
pub fn sample_digest(tasks: &[SemanticTask], input: &RecordBatch, tuples: &[String]) -> Result<String> {
    let mut rows = Vec::with_capacity(tuples.len());
    for t in tuples {
        match t.parse::<u32>() {
            Ok(r) if (r as usize) < input.num_rows() => rows.push(r),
            _ => return Err(Error::Query(format!("profiled tuple `{t}` is no row of this input"))),
        }
    }
    let sample = arrow::compute::take_record_batch(input, &arrow::array::UInt32Array::from(rows))?;
    let mut text = String::new();
    for task in tasks {
        let items = if task.is_join() { task.pair_items(&sample)? } else { task.item_texts(&sample)? };
        for (item, unknown) in items.into_iter().zip(task.unknown_rows(&sample)?) {
            // A null cell is no empty text: the one is answered without a model, the other is asked.
            if unknown {
                text.push('\u{0}');
            } else {
                text.push_str(&item);
            }
            text.push('\u{1f}');
        }
        text.push('\u{1e}');
    }
    Ok(stretto_core::memo::Digest16::of(&text).hex())
}

/// A profile's record of `task`: its name, kind and prompt.
fn logical_entry(task: &SemanticTask) -> LogicalEntry {
    LogicalEntry { name: task.name.clone(), kind: task.kind, prompt: Some(task.prompt.clone()) }
}

/// A profile saved earlier for this pipeline, ready to be re-optimized without profiling again. Its logical
/// operators must be the pipeline's (and ask what it asks, where the profile recorded it) and its population the
/// input's size, or it describes another query.
pub fn reuse_profile(
    pulled: &stretto_core::plan::PulledUpPlan,
    input: &RecordBatch,
    profile: Profile,
    path: PathBuf,
) -> Result<Profiled> {
    let tasks = pulled.semantic.clone();
    let want: Vec<(&str, _)> = tasks.iter().map(|t| (t.name.as_str(), t.kind)).collect();
    let have: Vec<(&str, _)> = profile.logical.iter().map(|l| (l.name.as_str(), l.kind)).collect();
    if want != have {
        return Err(Error::Query(format!(
            "profile {} is of logical operators {:?}, this pipeline has {:?}",
            path.display(),
            have.iter().map(|h| h.0).collect::<Vec<_>>(),
            want.iter().map(|w| w.0).collect::<Vec<_>>()
        )));
    }
    for (task, entry) in tasks.iter().zip(&profile.logical) {
        if let Some(prompt) = entry.prompt.as_ref().filter(|p| **p != task.prompt) {
            return Err(Error::Query(format!(
                "profile {} asked operator `{}` \"{prompt}\"; this pipeline asks \"{}\" (profile it anew)",
                path.display(),
                task.name,
                task.prompt
            )));
        }
    }
    if profile.population != input.num_rows() as u64 {
        return Err(Error::Query(format!(
            "profile {} was made on {} tuples; this pipeline's input has {}",
            path.display(),
            profile.population,
            input.num_rows()
        )));
    }
    if let Some(recorded) = &profile.sample_digest {
        let read = sample_digest(&tasks, input, &profile.tuples)
            .map_err(|e| Error::Query(format!("profile {}: {e}", path.display())))?;
        if read != *recorded {
            return Err(Error::Query(format!(
                "profile {} was made on other data: the profiled tuples do not hold what this pipeline's input holds \
                 there (profile it anew)",
                path.display()
            )));
        }
    }
    let candidates = tasks
        .iter()
        .map(|t| {
            let prefix = format!("{}/", t.name);
            let names = profile.physical.iter().filter_map(|e| e.name.strip_prefix(&prefix)).map(str::to_string);
            (t.name.clone(), names.collect())
        })
        .collect();
    Ok(Profiled {
        sample_rows: profile.tuples.len(),
        tasks,
        input: input.clone(),
        profile,
        profile_path: Some(path),
        candidates,
        timings: BTreeMap::new(),
        gold_only: None,
        screening: None,
        gold_order: Vec::new(),
        paid: Arc::default(),
        spent_seconds: 0.0,
        kv_note: None,
        gold_notes: Vec::new(),
        shared_costs: BTreeMap::new(),
    })
}

/// Steps 4–6 of [`run_pipeline`] for the method, targets and `check` of `o`: optimize, execute, check.
pub fn finish_pipeline(
    registry: &Registry,
    pulled: &stretto_core::plan::PulledUpPlan,
    p: &Profiled,
    o: &QueryOptions,
) -> Result<QueryReport> {
    finish_with(registry, pulled, p, o, strategy(&o.method)?.as_ref())
}

/// [`finish_pipeline`] with an explicit strategy (`o.method` is then only a label).
pub fn finish_with(
    registry: &Registry,
    pulled: &stretto_core::plan::PulledUpPlan,
    p: &Profiled,
    o: &QueryOptions,
    strat: &dyn Strategy,
) -> Result<QueryReport> {
    let planned = optimize(p, o, strat)?;
    execute(registry, pulled, p, o, &planned)
}

/// Step 4 of [`run_pipeline`]: what a strategy made of a profiled pipeline.
#[derive(Debug, Clone)]
pub struct Planned {
    /// The plan with the strategy's prediction and warnings.
    pub optimized: Optimized,
    /// The plan as a `stretto.plan/v1` document (stages, thresholds, predicted bounds, warnings, logical operators).
    pub plan: PlanFile,
    /// The relaxation the plan was optimized on (its gold plan is what `check` compares with).
    pub problem: Problem,
    /// Seconds the optimizer took.
    pub seconds: f64,
}

/// Where a run keeps its file `name` (`profile.json`, `plan.json`): in [`QueryOptions::run_dir`], created if
/// missing; `None` where the run keeps no files.
fn run_file(o: &QueryOptions, name: &str) -> Result<Option<PathBuf>> {
    let Some(dir) = &o.run_dir else { return Ok(None) };
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::write(dir, "cannot create the run directory", Some(Box::new(e))))?;
    Ok(Some(dir.join(name)))
}

/// Step 4 of [`run_pipeline`]: optimizes the profiled pipeline with `strat` under the targets of `o`.
pub fn optimize(p: &Profiled, o: &QueryOptions, strat: &dyn Strategy) -> Result<Planned> {
    let t0 = Instant::now();
    let targets = Targets::new(o.precision, o.recall, o.credible)?;
    let mut problem = Problem::from_profile(&p.profile)?;
    problem.share_costs(&p.shared_costs);
    let mut optimized = {
        let _span = tracing::info_span!("optimize", method = strat.name()).entered();
        match &p.gold_only {
            // Only gold was profiled: gold is the answer, a fallback unless gold was asked for.
            Some(why) if strat.name() != "gold" => {
                let mut gold = stretto_optim::strategy::Gold.optimize(&problem, &targets, o.seed)?;
                gold.fell_back_to_gold = true;
                gold.warnings.push(why.clone());
                keep_gold_order(&mut gold.plan, &problem, &p.gold_order);
                gold
            }
            // Gold asked for: its stages in the order gold's plan on the ordering tuples gave, where it ran.
            Some(_) => {
                let mut gold = strat.optimize(&problem, &targets, o.seed)?;
                keep_gold_order(&mut gold.plan, &problem, &p.gold_order);
                gold
            }
            None => strat.optimize(&problem, &targets, o.seed)?,
        }
    };
    optimized.warnings.extend(p.gold_notes.iter().cloned());
    let mut plan = optimized.to_plan_file(&problem);
    plan.query = Some(o.query.clone());
    plan.logical = p.tasks.clone();
    Ok(Planned { optimized, plan, problem, seconds: t0.elapsed().as_secs_f64() })
}

/// Puts the stages of the filters named in `order` ([`Profiled::gold_order`]) first, in that order, then the others
/// as they were.
fn keep_gold_order(plan: &mut stretto_optim::problem::HardPlan, problem: &Problem, order: &[String]) {
    if order.is_empty() {
        return;
    }
    let rank = |s: &stretto_optim::problem::Stage| {
        order.iter().position(|n| *n == problem.ops[s.op].name).unwrap_or(order.len())
    };
    plan.stages.sort_by_key(rank);
}

/// Steps 5–6 of [`run_pipeline`]: executes a planned cascade on the whole input and, with `o.check`, the gold plan.
pub fn execute(
    registry: &Registry,
    pulled: &stretto_core::plan::PulledUpPlan,
    p: &Profiled,
    o: &QueryOptions,
    planned: &Planned,
) -> Result<QueryReport> {
    let total = Instant::now();
    let _lease = disk_budget(registry.context())?.lease()?;
    let (tasks, input) = (p.tasks.clone(), &p.input);
    let n = input.num_rows();
    let mut timings = p.timings.clone();
    let profile_path = p.profile_path.clone();
    timings.insert("optimization".into(), planned.seconds);
    let (optimized, plan, problem) = (&planned.optimized, planned.plan.clone(), &planned.problem);
    // The plan that runs is the one the run directory keeps (several may be optimized from one profile).
    let plan_path = match run_file(o, "plan.json")? {
        Some(path) => {
            plan.write(&path)?;
            Some(path)
        }
        None => None,
    };

    // 5. Execute on everything.
    let t0 = Instant::now();
    let resolve = |name: &str| registry.get(name);
    let cascade = CascadePlan::bind(&plan, tasks.clone(), resolve)?;
    let mut executor = CascadeExecutor::default().with_progress(o.progress).with_paid(p.paid.clone());
    if let Some(k) = o.fetch {
        executor = executor.with_fetch(k);
    }
    let out = executor.execute(&cascade, input)?;
    let result = pulled.finish(out.batch.clone())?;
    timings.insert("execution".into(), t0.elapsed().as_secs_f64());
    // With a fetch met early, what execution went through: gold's estimate covers those tuples.
    let executed = out.executed;

    labels_align(o, n)?;
    // With a fetch met, the result is the first k result rows: the labels are scored up to the last of them (a
    // true row after it was never meant to be returned), so recall says whether any true row before it was missed.
    let scored = match (o.fetch, out.rows.last()) {
        (Some(k), Some(&last)) if out.rows.len() == k => last + 1,
        _ => executed,
    };
    let mut truth = o.labels.as_ref().map(|l| {
        let l = TruthLabels { column: l.column.clone(), values: l.values[..scored].to_vec() };
        serde_json::json!({
            "column": l.column,
            "labelled": l.values.iter().flatten().count(),
            "positives": l.values.iter().flatten().filter(|v| **v).count(),
            "plan": l.score(&out.rows),
        })
    });

    // 6. Optionally, the gold plan on everything.
    let achieved = if o.check {
        let t0 = Instant::now();
        let mut gold = problem.to_plan_file(&problem.gold_plan());
        gold.logical = tasks.clone();
        let gcascade = CascadePlan::bind(&gold, tasks.clone(), resolve)?;
        let gout = CascadeExecutor::default().with_progress(o.progress).execute(&gcascade, input)?;
        let map_cols: Vec<String> = tasks.iter().filter_map(|t| t.output.as_ref().map(|(c, _)| c.clone())).collect();
        let key = |batch: &RecordBatch, i: usize, row: usize| -> String {
            let mut k = row.to_string();
            for c in &map_cols {
                if let Some(col) = batch.column_by_name(c) {
                    k.push('\u{1f}');
                    if col.is_null(i) {
                        k.push('\u{0}');
                    } else {
                        k.push_str(&stretto_core::op::cell_text(col.as_ref(), i));
                    }
                }
            }
            k
        };
        if let (Some(t), Some(l)) = (truth.as_mut(), &o.labels) {
            t["gold"] = l.score(&gout.rows);
        }
        let got: BTreeSet<String> = out.rows.iter().enumerate().map(|(i, &r)| key(&out.batch, i, r)).collect();
        let truth: BTreeSet<String> = gout.rows.iter().enumerate().map(|(i, &r)| key(&gout.batch, i, r)).collect();
        let tp = got.intersection(&truth).count() as f64;
        let precision = if got.is_empty() { 1.0 } else { tp / got.len() as f64 };
        let recall = if truth.is_empty() { 1.0 } else { tp / truth.len() as f64 };
        timings.insert("gold_check".into(), t0.elapsed().as_secs_f64());
        Some(serde_json::json!({
            "precision": precision, "recall": recall, "result_rows": got.len(), "gold_rows": truth.len(),
            "met": precision >= o.precision && recall >= o.recall,
        }))
    } else {
        None
    };
    let prepare = p.timings.get("prepare_total").copied().unwrap_or(0.0);
    timings.insert("total".into(), total.elapsed().as_secs_f64() + planned.seconds + prepare);
    timings.remove("prepare_total");

    let execution_seconds: f64 = out.stats.iter().map(|s| s.cost_seconds).sum();
    let plan_is_gold = optimized.plan.stages.iter().all(|s| s.imp == problem.ops[s.op].gold());
    let targets = Targets::new(o.precision, o.recall, o.credible)?;
    let reused_seconds: f64 = out.stats.iter().map(|s| s.reused_seconds).sum();
    let cost = CostAccount {
        profiling_seconds: p.spent_seconds,
        execution_seconds,
        reused_seconds,
        total_seconds: p.spent_seconds + execution_seconds - reused_seconds,
        gold_estimate_seconds: if plan_is_gold {
            // Gold ran: what it cost is measured, not estimated.
            execution_seconds
        } else {
            stretto_optim::strategy::Gold.optimize(problem, &targets, o.seed)?.cost_per_tuple * executed as f64
        },
        gold_measured: plan_is_gold,
    };
    let rows = batch_rows(&result);
    Ok(QueryReport {
        query: o.query.clone(),
        dataset: match o.limit {
            Some(l) => format!("{} (first {l} rows of each table)", o.dataset),
            None => o.dataset.clone(),
        },
        input_rows: n,
        executed_rows: (executed < n).then_some(executed),
        sample_rows: p.sample_rows,
        targets: serde_json::json!({"precision": o.precision, "recall": o.recall, "credible": o.credible}),
        bounds: serde_json::json!({
            "precision": optimized.precision_lower_bound,
            "recall": optimized.recall_lower_bound,
            "fell_back_to_gold": optimized.fell_back_to_gold,
        }),
        plan,
        achieved,
        truth,
        timings,
        cost,
        stages: out.stats,
        columns: {
            // Map outputs and the columns the query reads first: what a reader wants to see.
            let mut first: Vec<String> =
                tasks.iter().filter_map(|t| t.output.as_ref().map(|(c, _)| c.clone())).collect();
            for t in &tasks {
                for r in t.references().unwrap_or_default() {
                    if !first.contains(&r) {
                        first.push(r);
                    }
                }
            }
            let all: Vec<String> = result.schema().fields().iter().map(|f| f.name().clone()).collect();
            let mut cols: Vec<String> = first.into_iter().filter(|c| all.contains(c)).collect();
            let rest: Vec<String> = all.into_iter().filter(|c| !cols.contains(c)).collect();
            cols.extend(rest);
            cols
        },
        rows,
        candidates: p.candidates.clone(),
        screening: p.screening.clone(),
        kv_caches: p.kv_note.clone(),
        files: [profile_path, plan_path].into_iter().flatten().map(|p| p.display().to_string()).collect(),
        result,
    })
}

/// True labels of a query's input tuples, in input order: `Some(true)` where the tuple belongs in the answer,
/// `Some(false)` where it does not, `None` where it is unlabelled (left out of the figures).
#[derive(Debug, Clone, PartialEq)]
pub struct TruthLabels {
    /// The label column.
    pub column: String,
    /// One label per input tuple.
    pub values: Vec<Option<bool>>,
}

impl TruthLabels {
    /// Labels for the tuples of a one-table query over `table` (its first `rows` rows, as a `limit` reads them)
    /// from column `column` of `labels`: matched by its `_index_<table>` column (the bundled label tables' row
    /// index) when it has one, else row by row. Values must be 0/1 or true/false; a missing column, other values,
    /// or too few rows are errors naming the culprit.
    pub fn from_batch(labels: &RecordBatch, column: &str, table: &str, rows: usize, source: &str) -> Result<Self> {
        let available = || labels.schema().fields().iter().map(|f| f.name().clone()).collect::<Vec<_>>().join(", ");
        let col = labels.column_by_name(column).ok_or_else(|| {
            Error::Query(format!("{source} has no label column `{column}` (columns: {})", available()))
        })?;
        let value = |i: usize| -> Result<Option<bool>> {
            if col.is_null(i) {
                return Ok(None);
            }
            match stretto_core::op::cell_text(col.as_ref(), i).trim().to_ascii_lowercase().as_str() {
                "1" | "1.0" | "true" => Ok(Some(true)),
                "0" | "0.0" | "false" => Ok(Some(false)),
                "" => Ok(None),
                other => Err(Error::Query(format!(
                    "label column `{column}` of {source} is not binary: `{other}` at row {} (0/1 or true/false \
                     expected)",
                    i + 1
                ))),
            }
        };
        let mut values = vec![None; rows];
        let index = format!("_index_{table}");
        if let Some(ix) = labels.column_by_name(&index) {
            for i in 0..labels.num_rows() {
                let at = stretto_core::op::cell_text(ix.as_ref(), i)
                    .parse::<usize>()
                    .map_err(|_| Error::Query(format!("{source}: `{index}` at row {} is not a row number", i + 1)))?;
                if at < rows {
                    values[at] = value(i)?;
                }
            }
        } else {
            if labels.num_rows() < rows {
                return Err(Error::Query(format!(
                    "{source} has {} rows for {rows} input tuples; give one label per row, or a `{index}` column",
                    labels.num_rows()
                )));
            }
            for (i, v) in values.iter_mut().enumerate() {
                *v = value(i)?;
            }
        }
        Ok(Self { column: column.into(), values })
    }

    /// The bundled label column `column` for table `table` of dataset `dataset` (a side table with
    /// `_index_<table>` and that column), for its first `rows` rows.
    pub fn bundled(dataset: &Dataset, table: &str, column: &str, rows: usize) -> Result<Self> {
        // The query may name the table in any case, as `input_of` reads it.
        let table = dataset.table_spelling(table);
        let index = format!("_index_{table}");
        let mut columns = Vec::new();
        for name in dataset.table_names() {
            let t = dataset.table(name)?;
            if t.column_by_name(&index).is_some() {
                if t.column_by_name(column).is_some() {
                    return Self::from_batch(t, column, table, rows, &format!("table `{name}` of {}", dataset.name));
                }
                columns.extend(t.schema().fields().iter().map(|f| f.name().clone()).filter(|c| !c.starts_with('_')));
            }
        }
        Err(Error::Query(format!(
            "dataset {} has no label column `{column}` for table `{table}` (label columns: {})",
            dataset.name,
            if columns.is_empty() { "none".to_string() } else { columns.join(", ") }
        )))
    }

    /// Precision, recall and F1 of the answer `rows` (input tuple positions) over the labelled tuples.
    pub fn score(&self, rows: &[usize]) -> serde_json::Value {
        let chosen: BTreeSet<usize> = rows.iter().copied().collect();
        let (mut tp, mut fp, mut fn_) = (0usize, 0usize, 0usize);
        for (i, v) in self.values.iter().enumerate() {
            match (v, chosen.contains(&i)) {
                (Some(true), true) => tp += 1,
                (Some(false), true) => fp += 1,
                (Some(true), false) => fn_ += 1,
                _ => {}
            }
        }
        let ratio = |a: usize, b: usize| if b == 0 { None } else { Some(a as f64 / b as f64) };
        let (p, r) = (ratio(tp, tp + fp), ratio(tp, tp + fn_));
        let f1 = match (p, r) {
            (Some(p), Some(r)) if p + r > 0.0 => Some(2.0 * p * r / (p + r)),
            (Some(_), Some(_)) => Some(0.0),
            _ => None,
        };
        serde_json::json!({"precision": p, "recall": r, "f1": f1, "true_positives": tp, "false_positives": fp,
                           "false_negatives": fn_})
    }
}

/// Rows of a batch as JSON objects (text shortened to 200 characters; a null cell is `null`).
fn batch_rows(batch: &RecordBatch) -> Vec<serde_json::Map<String, serde_json::Value>> {
    let schema = batch.schema();
    (0..batch.num_rows())
        .map(|i| {
            schema
                .fields()
                .iter()
                .enumerate()
                .map(|(c, f)| {
                    if batch.column(c).is_null(i) {
                        return (f.name().clone(), serde_json::Value::Null);
                    }
                    let mut v = stretto_core::op::cell_text(batch.column(c).as_ref(), i);
                    if v.chars().count() > 200 {
                        v = v.chars().take(200).collect::<String>() + "…";
                    }
                    (f.name().clone(), serde_json::Value::String(v))
                })
                .collect()
        })
        .collect()
}

/// The text report `stretto query` prints.
pub fn render(r: &QueryReport, show: usize) -> String {
    let mut s = String::new();
    let mut line = |t: String| {
        s.push_str(&t);
        s.push('\n');
    };
    line(format!("query: {}", r.query));
    if r.input_rows == 0 {
        // Nothing ran: no stages, times or costs to show.
        line(format!("data: {}; no rows", r.dataset));
        for w in &r.plan.warnings {
            line(format!("  warning: {w}"));
        }
        line(format!("result: 0 rows (columns {})", r.columns.join(", ")));
        return s;
    }
    // With gold's operators alone profiled (gold ran directly, or no other candidate exists), the profile is what
    // each costs, on a tuple or a few whose answers execution reuses: not a sample other plans were fitted on.
    if !r.candidates.is_empty() && r.candidates.values().all(|c| c.len() <= 1) {
        line(format!(
            "data: {}; {} tuples; gold's operators alone profiled, on {} (answers execution reuses)",
            r.dataset, r.input_rows, r.sample_rows
        ));
    } else {
        line(format!("data: {}; {} tuples, {} profiled", r.dataset, r.input_rows, r.sample_rows));
    }
    if let Some(note) = &r.kv_caches {
        line(format!("kv caches: {note}"));
    }
    if let Some(sc) = &r.screening {
        let who = match sc.candidates {
            0 => "gold alone".to_string(),
            1 => "gold and 1 other candidate".to_string(),
            k => format!("gold and {k} other candidates"),
        };
        line(format!(
            "screening: {who} on {} other tuples ({}{:.1} s of operator time); {} not profiled further",
            sc.tuples,
            if sc.candidates > 0 { "each until it was dropped; " } else { "" },
            sc.seconds,
            sc.dropped.len()
        ));
        for d in &sc.dropped {
            line(format!("  {}/{}: {}", d.logical, d.operator, d.reason));
        }
    }
    for (name, ops) in &r.candidates {
        line(format!("  {name}: {} candidates (gold: {})", ops.len(), ops.first().map(String::as_str).unwrap_or("-")));
    }
    line("plan (stages in execution order):".into());
    for st in &r.plan.stages {
        line(format!("  {:<60} {}", st.physical, st.rule()));
    }
    for w in &r.plan.warnings {
        line(format!("  warning: {w}"));
    }
    line(format!(
        "targets: precision {} recall {} at credibility {}",
        r.targets["precision"], r.targets["recall"], r.targets["credible"]
    ));
    line(format!(
        "certified lower bounds: precision {:.3}, recall {:.3}{}",
        r.bounds["precision"].as_f64().unwrap_or(0.0),
        r.bounds["recall"].as_f64().unwrap_or(0.0),
        if r.bounds["fell_back_to_gold"] == true { " (gold fallback)" } else { "" }
    ));
    if let Some(a) = &r.achieved {
        line(format!(
            "achieved vs gold on all {} tuples: precision {:.3}, recall {:.3} ({} result rows, {} gold rows) — targets {}",
            r.input_rows,
            a["precision"].as_f64().unwrap_or(0.0),
            a["recall"].as_f64().unwrap_or(0.0),
            a["result_rows"],
            a["gold_rows"],
            if a["met"] == true { "met" } else { "MISSED" }
        ));
    }
    if let Some(e) = r.executed_rows {
        line(format!(
            "execution stopped after {e} of {} tuples: the first {} result rows were known",
            r.input_rows,
            r.rows.len()
        ));
    }
    line(format!("{:<62} {:>6} {:>7} {:>7} {:>7} {:>9}", "stage", "in", "accept", "reject", "unsure", "seconds"));
    for st in &r.stages {
        line(format!(
            "{:<62} {:>6} {:>7} {:>7} {:>7} {:>9.2}",
            st.physical, st.tuples_in, st.accepted, st.rejected, st.unsure, st.seconds
        ));
    }
    if let Some(t) = &r.truth {
        let fig = |k: &str| {
            let v = |m: &str| t[k][m].as_f64().map_or("-".to_string(), |x| format!("{x:.3}"));
            format!("precision {}, recall {}, F1 {}", v("precision"), v("recall"), v("f1"))
        };
        line(format!(
            "against the true labels `{}` ({} labelled, {} positive): result {}",
            t["column"].as_str().unwrap_or_default(),
            t["labelled"],
            t["positives"],
            fig("plan")
        ));
        if t.get("gold").is_some() {
            line(format!("  gold plan against the same labels: {}", fig("gold")));
        }
    }
    let t = |k: &str| r.timings.get(k).copied().unwrap_or(0.0);
    line(format!(
        "time: kv caches {:.1} s, profiling {:.1} s, optimizer {:.2} s, execution {:.1} s{}, total {:.1} s",
        t("kv_caches"),
        t("profiling"),
        t("optimization"),
        t("execution"),
        r.timings.get("gold_check").map(|g| format!(", gold check {g:.1} s")).unwrap_or_default(),
        t("total")
    ));
    let c = &r.cost;
    line(format!(
        "operator time: profiling {:.1} s + execution {:.1} s − {:.1} s of profiled answers reused = {:.1} s end to \
         end; the gold plan alone {} {:.1} s ({:.2}×)",
        c.profiling_seconds,
        c.execution_seconds,
        c.reused_seconds,
        c.total_seconds,
        if c.gold_measured { "(it ran) =" } else { "≈ (estimated from the profile)" },
        c.gold_estimate_seconds,
        c.total_seconds / c.gold_estimate_seconds.max(f64::MIN_POSITIVE)
    ));
    line(format!("result: {} rows", r.rows.len()));
    let shown: Vec<&String> = r.columns.iter().take(3).collect();
    for row in r.rows.iter().take(show) {
        let cells: Vec<String> = shown
            .iter()
            .map(|c| {
                let v = row.get(*c).and_then(|v| v.as_str()).unwrap_or_default();
                let v: String =
                    if v.chars().count() > 70 { v.chars().take(70).collect::<String>() + "…" } else { v.into() };
                format!("{c}={v}")
            })
            .collect();
        line(format!("  {}", cells.join(" | ")));
    }
    line(format!("files: {}", r.files.join(", ")));
    s
}

/// The demo query over the bundled movie reviews: a filter, then a map whose answers the data itself can check
/// (every review carries its critic's `scoresentiment`, POSITIVE or NEGATIVE; the prompt never sees it).
pub const DEMO_QUERY: &str = "{reviews.reviewtext} discusses the story or the plot -- Say whether the [sentiment] of {reviews.reviewtext} is positive or negative";

/// Models the demo allows: the ladder SmolLM2-135M → Qwen2.5-Coder-0.5B (its gold, #17: SmolLM2's answers are near
/// chance against the labels) and MiniLM's embedding filter.
pub const DEMO_MODELS: [&str; 3] = ["smollm2-135m", "qwen2.5-coder-0.5b", "minilm"];

/// Rows of the demo's bounded slice.
pub const DEMO_ROWS: usize = 200;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundled_table_is_named_in_any_case_but_one_way_in_a_query() {
        let tasks = parse_query("{Reviews.reviewtext} is positive").unwrap();
        let (input, _) = input_of("movie", &tasks, Some(5)).unwrap();
        assert_eq!(input.num_rows(), 5);
        assert!(input.schema().field_with_name("Reviews.reviewtext").is_ok(), "{:?}", input.schema());
        let ds = Dataset::load("movie").unwrap();
        let labels = TruthLabels::bundled(&ds, "REVIEWS", "is_positive", 5).unwrap();
        assert_eq!(labels.values, TruthLabels::bundled(&ds, "reviews", "is_positive", 5).unwrap().values);
        // One table spelled two ways would be cross-joined with itself.
        let tasks = parse_query("{reviews.reviewtext} is positive -- {Reviews.reviewtext} is long").unwrap();
        let e = input_of("movie", &tasks, Some(5)).unwrap_err().to_string();
        assert!(e.contains("`Reviews` and `reviews`"), "{e}");
    }

    #[test]
    fn gold_keeps_the_order_its_answers_were_asked_in_unless_the_unasked_rows_win_the_reordering_back() {
        // Two filters of 1 s a tuple, the first (task 10) asked about 60 sample rows and passing 7, the second
        // (task 11) asked about those 7 and the 4 probe rows, passing none.
        let figures = [(64.0, 64, 7), (11.0, 11, 0)];
        let filters = [10, 11];
        let mut known = GoldVerdicts::new();
        for r in 0..60 {
            known.entry(r).or_default().insert(10, r < 7);
        }
        for r in 0..7 {
            known.entry(r).or_default().insert(11, false);
        }
        // On the figures alone the second filter goes first.
        assert_eq!(order_on_figures(&figures), vec![1, 0]);
        // With 336 rows left it saves about 17 s there, less than the 53 answers it would ask again on the sample.
        assert_eq!(gold_execution_order(&figures, &filters, &known, 336.0), vec![0, 1]);
        // With 3,360 left it saves more.
        assert_eq!(gold_execution_order(&figures, &filters, &known, 3360.0), vec![1, 0]);
        // Nothing known: the figures' order.
        assert_eq!(gold_execution_order(&figures, &filters, &GoldVerdicts::new(), 336.0), vec![1, 0]);
        // Three filters: every order is weighed, and on the figures alone the DP's stands.
        let three = [(10.0, 10, 9), (10.0, 10, 1), (30.0, 10, 5)];
        assert_eq!(gold_execution_order(&three, &[0, 1, 2], &GoldVerdicts::new(), 100.0), order_on_figures(&three));
    }

    use stretto_core::op::{OpProperties, PhysicalOp};

    /// A rung of model `m` for the calibration tests: compressed at `ratio` (0 for the parent).
    #[derive(Debug)]
    struct Rung(String, OpProperties, Option<&'static str>);

    impl PhysicalOp for Rung {
        fn name(&self) -> &str {
            &self.0
        }
        fn properties(&self) -> &OpProperties {
            &self.1
        }
        fn kv_cache_model(&self) -> Option<&str> {
            Some("m")
        }
        fn weights_variant(&self) -> Option<&str> {
            self.2
        }
        fn evaluate_items(&self, _: &SemanticTask, items: &[String]) -> stretto_core::Result<(OpOutput, Vec<f64>)> {
            Ok((OpOutput::Scores(vec![0.0; items.len()]), vec![0.0; items.len()]))
        }
    }

    fn rung(name: &str, ratio: f64, gold: bool, weights: Option<&'static str>) -> Arc<RegisteredOp> {
        let props = OpProperties {
            kind: LogicalKind::Filter,
            family: "llm-filter".into(),
            modality: Modality::Text,
            model: Some(if gold { "big".into() } else { "m".into() }),
            compression: Some(ratio),
            tunable: true,
            gold,
            cost_hint: 1.0,
            score_range: (-10.0, 10.0),
        };
        Arc::new(RegisteredOp::new(Arc::new(Rung(name.into(), props, weights)), stretto_core::MemoPolicy::Off))
    }

    #[test]
    fn a_compressed_rung_is_dropped_before_the_probe_where_its_calibrated_share_cannot_pay() {
        use stretto_kv::calibration::{Calibration, Pass};
        let task = SemanticTask::filter("f", "{t.text} is long");
        let ladder = || {
            vec![
                rung("gold", 0.0, true, None),
                rung("m@0", 0.0, false, None),
                rung("m@0.5", 0.5, false, None),
                rung("m@0.8", 0.8, false, None),
                rung("m@0.8+int8", 0.8, false, Some("int8")),
            ]
        };
        let calibration = |half: f64, most: f64| {
            let seconds =
                vec![(Pass::Filter, 0.0, 0.2), (Pass::Filter, 0.5, 0.2 * half), (Pass::Filter, 0.8, 0.2 * most)];
            BTreeMap::from([("m".to_string(), Calibration { items: 8, seconds })])
        };
        let names = |ops: &[Arc<RegisteredOp>]| ops.iter().map(|o| o.name().to_string()).collect::<Vec<_>>();
        // 60 answers in profiling, 324 tuples after it: a rung pays only under 324 / 384 = 84% of its parent.
        let mut ops = ladder();
        let dropped = drop_compressed_by_calibration(&task, &mut ops, &calibration(0.9, 0.6), |_| 60.0, 324.0);
        assert_eq!(names(&ops), ["gold", "m@0", "m@0.8", "m@0.8+int8"]);
        assert_eq!(dropped.len(), 1);
        assert!(dropped[0].reason.contains("costs 90% of its uncompressed parent's"), "{}", dropped[0].reason);
        // Fewer tuples after profiling: the 60% rung no longer pays (60 × 0.6 = 36 > 0.4 × 40 = 16).
        let mut ops = ladder();
        drop_compressed_by_calibration(&task, &mut ops, &calibration(0.9, 0.6), |_| 60.0, 40.0);
        assert_eq!(names(&ops), ["gold", "m@0", "m@0.8+int8"], "the quantized rung is not calibrated by f32 figures");
        // No saving at all: dropped whatever the input.
        let mut ops = ladder();
        let dropped = drop_compressed_by_calibration(&task, &mut ops, &calibration(0.97, 0.5), |_| 1.0, 1e6);
        assert_eq!(names(&ops), ["gold", "m@0", "m@0.8", "m@0.8+int8"]);
        assert!(dropped[0].reason.contains("compression saves almost nothing"), "{}", dropped[0].reason);
        // Without a calibration, or without the parent among the candidates, nothing is dropped.
        let mut ops = ladder();
        assert!(drop_compressed_by_calibration(&task, &mut ops, &BTreeMap::new(), |_| 60.0, 40.0).is_empty());
        let mut orphans: Vec<_> = ladder().into_iter().filter(|o| o.name() != "m@0").collect();
        assert!(
            drop_compressed_by_calibration(&task, &mut orphans, &calibration(0.99, 0.99), |_| 60.0, 40.0).is_empty()
        );
    }

    #[test]
    fn a_map_candidate_is_hopeless_after_the_probe_only_where_even_its_credible_best_misses_gold() {
        let map = SemanticTask::map("m", "Extract the [sport] of {t.text}", "sport", ValueType::String);
        let filter = SemanticTask::filter("f", "{t.text} is long");
        let ops: Vec<Arc<RegisteredOp>> =
            ["gold", "never", "once", "short", "unknown"].iter().map(|n| rung(n, 0.0, *n == "gold", None)).collect();
        let v = |xs: &[Option<&str>]| OpOutput::Values {
            values: xs.iter().map(|x| x.map(String::from)).collect(),
            confidences: vec![1.0; xs.len()],
        };
        let tried = |idx: usize, output: OpOutput| Tried { idx, output, secs: vec![0.1; 4] };
        let gold = [Some("run"), Some("swim"), Some("golf"), Some("ski")];
        let answers = || {
            vec![
                tried(0, v(&gold)),
                // Gold's value on none of the 4: at most 45% at 95% credibility.
                tried(1, v(&[Some("running"), None, Some("golf course"), Some("skiing")])),
                // Once: at most 66%, kept.
                tried(2, v(&[Some("run"), None, None, None])),
                // Answers on fewer tuples than gold's: not judged.
                tried(3, v(&[None, None])),
                // Figures from the cost record: no values.
                tried(4, OpOutput::Scores(Vec::new())),
            ]
        };
        let names = |t: &[Tried]| t.iter().map(|t| ops[t.idx].name().to_string()).collect::<Vec<_>>();
        // The candidates `task`'s hopeless test at `credible` drops from `t`, judged as `judged` says.
        let judge = |task: &SemanticTask,
                     t: &mut [Vec<Tried>],
                     credible: f64,
                     judged: (&'static str, Option<&[bool]>)| {
            let mut dropped = Vec::new();
            probe_hopeless(std::slice::from_ref(task), std::slice::from_ref(&ops), t, credible, judged, &mut dropped);
            dropped
        };
        let mut t = vec![answers()];
        let dropped = judge(&map, &mut t, 0.95, (PROBED, None));
        assert_eq!(names(&t[0]), ["gold", "once", "short", "unknown"]);
        assert_eq!(dropped.len(), 1);
        assert!(dropped[0].reason.contains("on 0 of the 4 probe tuples"), "{}", dropped[0].reason);
        // Only the positions that count are judged: on the first alone, gold's value on none of 1 is no evidence.
        let mut t = vec![answers()];
        let first = [true, false, false, false];
        let judged = (FIRST_LOOK, Some(first.as_slice()));
        judge(&map, &mut t, 0.95, judged);
        assert_eq!(names(&t[0]), ["gold", "never", "once", "short", "unknown"]);
        // At a lower credibility its best is lower still; a filter's candidates are never judged here; nor where
        // gold answered no tuple.
        let mut t = vec![answers()];
        judge(&map, &mut t, 0.5, (PROBED, None));
        assert_eq!(names(&t[0]), ["gold", "short", "unknown"], "once in 4 is at most 31% at 50%");
        let mut t = vec![answers()];
        judge(&filter, &mut t, 0.95, (PROBED, None));
        assert_eq!(t[0].len(), 5);
        let mut t = vec![answers()];
        t[0][0] = tried(0, v(&[None, None, None, None]));
        judge(&map, &mut t, 0.95, (PROBED, None));
        assert_eq!(t[0].len(), 5);
    }

    #[test]
    fn the_compressed_rungs_of_a_hopeless_parent_leave_unasked() {
        let map = SemanticTask::map("m", "Extract the [sport] of {t.text}", "sport", ValueType::String);
        let ops = vec![
            rung("gold", 0.0, true, None),
            rung("m@0", 0.0, false, None),
            rung("m@0.5", 0.5, false, None),
            rung("m@0.8", 0.8, false, None),
            rung("m@0.8+int8", 0.8, false, Some("int8")),
        ];
        // Parent `idx` of logical operator `task` gave gold's value on 0 of 4.
        let hopeless = |idx: usize, task: usize| Hopeless {
            task,
            idx,
            matched: 0,
            answered: 4,
            upper: 0.45,
            credible: 0.95,
            on: PROBED,
        };
        let children = |dropped: &[Hopeless], due: &dyn Fn(usize, usize) -> bool| {
            children_of_hopeless(std::slice::from_ref(&map), std::slice::from_ref(&ops), dropped, due)
                .into_iter()
                .map(|(t, i, d)| {
                    assert_eq!((t, d.logical.as_str()), (0, "m"));
                    assert_eq!(d.operator, ops[i].name());
                    assert!(
                        d.reason.starts_with("hopeless: its uncompressed parent m@0 gave gold's value on 0 of the 4"),
                        "{}",
                        d.reason
                    );
                    i
                })
                .collect::<Vec<_>>()
        };
        // The f32 compressed rungs of the hopeless parent, not its int8 one (another parent's).
        assert_eq!(children(&[hopeless(1, 0)], &|_, _| true), [2, 3]);
        assert_eq!(children(&[hopeless(1, 0)], &|_, i| i != 2), [3], "only those still due");
        // A hopeless compressed rung has no children; another logical operator's drop is not this one's.
        assert!(children(&[hopeless(2, 0)], &|_, _| true).is_empty());
        assert!(children(&[hopeless(1, 1)], &|_, _| true).is_empty());
    }

    #[test]
    fn rows_nobody_asked_counts_each_row_gold_answered_once() {
        let mut known = GoldVerdicts::new();
        // Gold's plan on rows 1..20 of the sample and, looking further, on rows 100..104 outside it.
        for r in (1..20).chain(100..104) {
            known.entry(r).or_default().insert(0, false);
        }
        // Row 0, every filter answered there, is free; the 23 rows gold's plan asked about are known: 376 of 400 left.
        assert_eq!(rows_nobody_asked(400, &[0], &known), 376.0);
        // A free row gold's plan also asked about counts once, and so does a free row listed twice.
        assert_eq!(rows_nobody_asked(400, &[0, 0, 5], &known), 376.0);
        assert_eq!(rows_nobody_asked(10, &[0], &known), 0.0);
    }

    #[test]
    fn permutations_visits_every_order_once() {
        let mut seen = BTreeSet::new();
        let mut items = vec![0, 1, 2, 3];
        permutations(&mut items, 0, &mut |o| {
            seen.insert(o.to_vec());
        });
        assert_eq!(seen.len(), 24);
        assert_eq!(items, vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_tuple_pays_a_prefill_where_an_item_some_reader_reads_has_no_stored_cache() {
        use arrow::array::StringArray;
        let col = |v: [&str; 4]| Arc::new(StringArray::from(v.to_vec())) as arrow::array::ArrayRef;
        let batch = RecordBatch::try_from_iter([
            ("reviews.text", col(["kept", "gone", "kept", "kept"])),
            ("reviews.title", col(["t1", "t1", "t2", "gone"])),
        ])
        .unwrap();
        let tasks = parse_query("{reviews.text} is positive -- [title] the title of {reviews.title}").unwrap();
        let asked = std::cell::RefCell::new(Vec::new());
        let mut missing = |item: &String| {
            asked.borrow_mut().push(item.clone());
            Ok(item.contains("gone") || item.contains("t2"))
        };
        // The filter alone: the one tuple whose text is gone; each distinct item looked up once.
        assert_eq!(tuples_to_prefill(&[&tasks[0]], &batch, &mut missing).unwrap(), 1);
        assert_eq!(asked.borrow().len(), 2, "{asked:?}");
        // Both readers: a tuple pays where either of its items is missing (rows 1, 2 and 3), once.
        assert_eq!(tuples_to_prefill(&[&tasks[0], &tasks[1]], &batch, &mut missing).unwrap(), 3);
        assert_eq!(tuples_to_prefill(&[], &batch, &mut missing).unwrap(), 0);
        // A lookup that fails is an error, not a guess.
        let failing = |_: &String| Err(Error::Query("index unreadable".into()));
        assert!(tuples_to_prefill(&[&tasks[0]], &batch, failing).is_err());
    }

    #[test]
    fn deferred_prefill_is_added_to_the_cost_of_the_entries_reading_that_models_caches() {
        let text = r#"{"format":"stretto.profile/v1","population":10,"tuples":["0","1"],
            "logical":[{"name":"a","kind":"filter"}],
            "physical":[{"name":"a/llm:big","logical":"a","cost":0.25,"scores":[1,-1],"gold":true},
                        {"name":"a/llm:small","logical":"a","cost":0.125,"scores":[1,1]},
                        {"name":"a/embed","logical":"a","cost":0.01,"scores":[1,-1]}]}"#;
        let mut profile = Profile::parse(text, "t").unwrap();
        let per_item: BTreeMap<String, f64> = [("big".to_string(), 4.0), ("small".to_string(), 1.0)].into();
        let model_of = |entry: &str| entry.strip_prefix("a/llm:").map(str::to_string);
        let shared = price_deferred_prefill(&mut profile, &per_item, model_of);
        let costs: Vec<f64> = profile.physical.iter().map(|e| e.cost).collect();
        assert_eq!(costs, vec![4.25, 1.125, 0.01]);
        // What execution pays once per tuple and model, for the optimizer's hard evaluation.
        let expected: BTreeMap<String, (String, f64)> = [
            ("a/llm:big".to_string(), ("big".to_string(), 4.0)),
            ("a/llm:small".to_string(), ("small".to_string(), 1.0)),
        ]
        .into();
        assert_eq!(shared, expected);
        assert_eq!(deferred_prefill(&per_item, Some("other")), 0.0);
        assert_eq!(deferred_prefill(&BTreeMap::new(), Some("big")), 0.0);
    }

    #[test]
    fn a_gold_fallback_keeps_the_filter_order_its_plan_on_the_sample_ran() {
        let text = r#"{"format":"stretto.profile/v1","population":10,"tuples":["0","1"],
            "logical":[{"name":"a","kind":"filter"},{"name":"b","kind":"filter"},{"name":"m","kind":"map"}],
            "physical":[{"name":"a/g","logical":"a","cost":1,"scores":[-1,-1],"gold":true},
                        {"name":"b/g","logical":"b","cost":2,"scores":[-1,-1],"gold":true},
                        {"name":"m/g","logical":"m","cost":1,"values":[null,null],"scores":[null,null],"gold":true}]}"#;
        let problem = Problem::from_profile(&Profile::parse(text, "t").unwrap()).unwrap();
        let mut plan = problem.gold_plan();
        let names = |plan: &stretto_optim::problem::HardPlan| -> Vec<String> {
            plan.stages.iter().map(|s| problem.ops[s.op].name.clone()).collect()
        };
        assert_eq!(names(&plan), ["a", "b", "m"]);
        keep_gold_order(&mut plan, &problem, &[]);
        assert_eq!(names(&plan), ["a", "b", "m"]);
        keep_gold_order(&mut plan, &problem, &["b".to_string(), "a".to_string()]);
        assert_eq!(names(&plan), ["b", "a", "m"]);
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("op{i}")).collect()
    }

    #[test]
    fn a_stop_counts_free_only_the_memoised_answers_its_cost_left_out() {
        // 10 sample and 6 screening tuples; the candidate lacks 7 + 5 of its answers.
        let lacks = |n: usize| (0..6).map(|r| r < n).collect::<Vec<bool>>();
        let f = Fresh { sample: vec![0.0, 7.0], screening: vec![lacks(0), lacks(5)], sample_rows: 10.0 };
        assert_eq!(f.known(1, 0), 4.0, "3 sample and 1 screening answers");
        assert_eq!(f.known(1, 6), 3.0, "screening done: its answers are in no cost");
        assert_eq!(f.known(0, 0), 16.0);
        // Halfway through the screening, 3 tuples are left: 2 of them lacking (positions 3 and 4), 1 known.
        assert_eq!(f.known(1, 3), 4.0);
        assert_eq!(f.ahead(1, 3), 9.0);
        assert_eq!(memo_note(4.0), " (4 candidate answers already in the memo counted free)");
        assert_eq!(memo_note(0.0), "", "nothing known, nothing said");
    }

    #[test]
    fn screening_drops_the_hopeless_the_dear_and_the_dominated_only() {
        let c = |cost: f64, quality: Option<f64>| Screened { cost, quality };
        let figures = [
            c(1.0, Some(1.0)),   // 0 gold
            c(0.1, Some(0.9)),   // 1 good and cheap: kept
            c(0.2, Some(0.85)),  // 2 dearer and worse than 1: dominated
            c(0.05, Some(0.5)),  // 3 cheapest but hopeless
            c(0.95, Some(0.99)), // 4 as dear as gold
            c(0.05, None),       // 5 gold's answers cannot tell: kept
            c(0.1, Some(0.89)),  // 6 ties 1 on cost, within the quality margin: kept
        ];
        let out = screen_out(&names(figures.len()), &figures);
        let dropped: Vec<usize> = out.iter().map(|(i, _)| *i).collect();
        assert_eq!(dropped, vec![2, 3, 4], "{out:?}");
        assert!(out[0].1.contains("dominated by op1"), "{}", out[0].1);
        assert!(out[1].1.contains("hopeless"), "{}", out[1].1);
        assert!(out[2].1.contains("of gold's"), "{}", out[2].1);
        // A hopeless candidate dominates nothing.
        let out = screen_out(&names(3), &[c(1.0, Some(1.0)), c(0.05, Some(0.55)), c(0.1, Some(0.6))]);
        assert_eq!(out.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![1], "{out:?}");
    }

    #[test]
    fn gold_reach_follows_golds_cheapest_order_of_filters_and_puts_maps_last() {
        let filter = |idx: usize, secs: f64, pass: &[bool]| Tried {
            idx,
            output: OpOutput::Scores(pass.iter().map(|&p| if p { 1.0 } else { -1.0 }).collect()),
            secs: vec![secs; pass.len()],
        };
        let (t, f) = (true, false);
        // f1 is dear and lets 3 of 4 through; f2 is cheap and lets 1 of 4 through: gold's plan runs f2 first, so
        // f1 sees a quarter of the tuples. The map sees the one both let through.
        let map = Tried {
            idx: 0,
            output: OpOutput::Values { values: vec![None; 4], confidences: vec![0.0; 4] },
            secs: vec![0.1; 4],
        };
        let tried = vec![
            vec![filter(0, 1.0, &[t, t, t, f])],
            vec![filter(0, 0.1, &[t, f, f, f]), filter(1, 0.01, &[t, t, f, f])],
            vec![map],
        ];
        assert_eq!(gold_reach(&tried, 4), vec![0.25, 1.0, 0.25]);
        // Swap the costs and f1 goes first.
        let tried2 = vec![vec![filter(0, 0.1, &[t, t, t, f])], vec![filter(0, 1.0, &[t, f, f, f])]];
        assert_eq!(gold_reach(&tried2, 4), vec![1.0, 0.75]);
        // A candidate that is not gold, or nothing looked at, reaches everything.
        assert_eq!(gold_reach(&[vec![filter(2, 0.1, &[f, f])]], 2), vec![1.0]);
        assert_eq!(gold_reach(&tried, 0), vec![1.0, 1.0, 1.0]);
    }

    #[test]
    fn screening_figures_compare_with_gold() {
        let gold = OpOutput::Scores(vec![1.0, 2.0, -1.0, -2.0]);
        let s = screened(&gold, &OpOutput::Scores(vec![0.9, 0.8, 0.1, 0.2]), &[0.1, 0.3, 0.2, 0.2]);
        assert_eq!(s.quality, Some(1.0));
        assert!((s.cost - 0.2).abs() < 1e-12);
        let inverted = screened(&gold, &OpOutput::Scores(vec![0.1, 0.2, 0.9, 0.8]), &[0.1]);
        assert_eq!(inverted.quality, Some(0.0));
        // Gold accepted everything: no AUC to tell.
        let all = OpOutput::Scores(vec![1.0, 1.0]);
        assert_eq!(screened(&all, &OpOutput::Scores(vec![0.0, 1.0]), &[0.1]).quality, None);
        let v = |x: &[Option<&str>]| OpOutput::Values {
            values: x.iter().map(|v| v.map(str::to_string)).collect(),
            confidences: vec![0.5; x.len()],
        };
        let m = screened(&v(&[Some("a"), Some("b"), None]), &v(&[Some("a"), Some("c"), Some("d")]), &[0.1]);
        assert_eq!(m.quality, Some(0.5));
    }

    #[test]
    fn a_map_candidate_takes_over_from_gold_at_most_where_its_values_match_plus_the_allowed_errors() {
        let map = |idx: usize, values: &[Option<&str>]| Tried {
            idx,
            output: OpOutput::Values {
                values: values.iter().map(|v| v.map(str::to_string)).collect(),
                confidences: vec![0.5; values.len()],
            },
            secs: vec![0.1; values.len()],
        };
        let gold = map(0, &[Some("Puma"), None, Some("Nike"), Some("Adidas")].repeat(5));
        // Never gold's value on 20 tuples: at 95%, at most 1 − 0.05^(1/21) = 13.3% of matches, plus the wrong values
        // a plan may keep (30% here).
        let wrong = map(1, &[Some("x"); 20]);
        let share = map_takeover_share(&gold, std::slice::from_ref(&wrong), 0.3, 0.95);
        let expected = 1.0 - 0.05f64.powf(1.0 / 21.0) + 0.3;
        assert!((share - expected).abs() < 1e-6, "{share} vs {expected}");
        // Where no wrong value may be kept, the matches alone.
        let strict = map_takeover_share(&gold, std::slice::from_ref(&wrong), 0.0, 0.95);
        assert!((strict - (expected - 0.3)).abs() < 1e-6, "{strict}");
        // Gold's values everywhere (a null included): the upper end of the credible interval of 20 of 20,
        // 0.95^(1/21), even where no wrong value may be kept.
        let all = 0.95f64.powf(1.0 / 21.0);
        assert!((map_takeover_share(&gold, std::slice::from_ref(&gold), 0.0, 0.95) - all).abs() < 1e-9);
        assert_eq!(map_takeover_share(&gold, std::slice::from_ref(&gold), 0.1, 0.95), 1.0);
        // Two candidates matching on different tuples: a cascade of both could keep either's, so the union counts.
        let first = map(1, &[Some("Puma"), None, Some("x"), Some("x")].repeat(5));
        let second = map(2, &[Some("x"), Some("x"), Some("Nike"), Some("Adidas")].repeat(5));
        let alone = map_takeover_share(&gold, std::slice::from_ref(&first), 0.1, 0.95);
        assert!(alone < 0.9, "half the values matched: {alone}");
        assert!((map_takeover_share(&gold, &[first, second], 0.0, 0.95) - all).abs() < 1e-9);
        // Values not known (a figure from the cost record), or covering fewer tuples: no bound.
        let recorded = Tried { idx: 1, output: OpOutput::Scores(Vec::new()), secs: vec![0.1; 20] };
        assert_eq!(map_takeover_share(&gold, &[wrong.clone(), recorded], 0.0, 0.95), 1.0);
        assert_eq!(map_takeover_share(&gold, &[map(1, &[Some("x"); 3])], 0.0, 0.95), 1.0);
        // Gold is no map: no bound.
        let filter = Tried { idx: 0, output: OpOutput::Scores(vec![1.0; 20]), secs: vec![0.1; 20] };
        assert_eq!(map_takeover_share(&filter, &[wrong], 0.0, 0.95), 1.0);
    }

    #[test]
    fn a_certified_plan_keeps_only_the_wrong_map_values_its_hold_out_can_certify() {
        let at = |t: f64, method: &str| {
            let mut o = QueryOptions::new("movie", "Extract the [title] of {reviews.reviewtext}");
            (o.precision, o.recall, o.method) = (t, t, method.into());
            o
        };
        // A 60-tuple sample holds out at most 31 result rows. At 0.8, 1 of 25 rows may be wrong (the joint test).
        let some = map_errors(&at(0.8, "global"), 60);
        assert!(some.certifiable && (some.share - 1.0 / 25.0).abs() < 1e-12, "{}", some.share);
        assert!(some.what.contains("4.0% of a hold-out of at most 31 result rows"), "{}", some.what);
        // At 0.9 none may, and no plan keeping a cheap map value passes the joint test, even an error-free one.
        let none = map_errors(&at(0.9, "global"), 60);
        assert!(!none.certifiable && none.share == 0.0);
        assert!(none.what.contains("no plan keeping a cheap stage's map value can be certified"), "{}", none.what);
        // Reasons say so, rather than adding it to a share.
        assert!(none.left_to().starts_with("left to no candidate, as no plan keeping"), "{}", none.left_to());
        assert!(none.keeps(0.0).starts_with("it can keep none of them, as no plan keeping"), "{}", none.keeps(0.0));
        assert!(some.left_to().starts_with("left to a candidate at most where one gave gold's value, plus the wrong"));
        assert!(some.keeps(0.42).starts_with("it can keep at most 42% of them"), "{}", some.keeps(0.42));
        // A larger sample holds out enough rows.
        assert!(map_errors(&at(0.9, "global"), 600).certifiable);
        // At 0.7 fewer than the 30% the targets leave; more on a larger sample, never above 30%.
        let (few, more) = (map_errors(&at(0.7, "global"), 60).share, map_errors(&at(0.7, "global"), 600).share);
        assert!(0.0 < few && few < more && more <= 0.3, "{few} {more}");
        // Methods whose tests are per operator, or that certify nothing, keep the errors the targets allow.
        for method in ["independent", "local", "lotus"] {
            let loose = map_errors(&at(0.9, method), 60);
            assert!(loose.certifiable && (loose.share - 0.1).abs() < 1e-12, "{method}: {}", loose.share);
            assert!(loose.what.contains("the errors the targets allow (10.0%)"), "{}", loose.what);
        }
    }

    /// A stop's reason says what its bound assumes of maps only where the query has them.
    #[test]
    fn a_pay_check_stop_speaks_of_maps_only_in_a_query_with_maps() {
        let filter = SemanticTask::filter("f", "{t.text} is long");
        let map = SemanticTask::map("m", "Extract the [sport] of {t.text}", "sport", ValueType::String);
        let cheapest = "every tuple reaching an operator decided by its cheapest candidate";
        assert_eq!(saving_terms(std::slice::from_ref(&filter), "", "left to no candidate, as x"), cheapest);
        let both = [filter.clone(), map.clone()];
        assert_eq!(
            saving_terms(&both, ", at no cost", "left to no candidate, as x"),
            format!(
                "{cheapest}, at no cost; maps reached by the tuples the filters let through, and left to no \
                     candidate, as x"
            )
        );
        assert_eq!(
            saving_terms(&both, "", ""),
            format!("{cheapest}; maps reached by the tuples the filters let through")
        );
        assert_eq!(
            saving_terms(std::slice::from_ref(&map), "", "left to no candidate, as x"),
            format!("{cheapest}; the maps' tuples left to no candidate, as x")
        );
        assert_eq!(saving_terms(&[map], "", ""), cheapest);
    }
}
