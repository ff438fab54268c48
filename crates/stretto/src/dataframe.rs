//! The lazy semantic [`DataFrame`]: relational and semantic operations compose a logical plan; nothing runs until
//! [`DataFrame::collect`] (or [`DataFrame::profile`]) asks for it.

use std::collections::BTreeMap;
use std::path::Path;

use arrow::array::RecordBatch;
use stretto_core::expr::Expr;
use stretto_core::op::{Registry, ValueType};
use stretto_core::plan::{LogicalPlan, PlanBuilder, PulledUpPlan};
use stretto_optim::profile::Profile;
use stretto_optim::strategy::{Global, Strategy, Targets};

use crate::engine::{self, Profiled, QueryOptions, QueryReport, TruthLabels};
use crate::error::{Error, Result};
use crate::io::{self, FileFormat};
use crate::state::SessionState;

/// A lazily composed semantic query over a session's data.
#[derive(Clone)]
pub struct DataFrame {
    session: std::sync::Arc<SessionState>,
    plan: PlanBuilder,
    limit: Option<usize>,
    source: String,
    labels: Option<TruthLabels>,
}

impl std::fmt::Debug for DataFrame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataFrame").field("source", &self.source).field("plan", &self.plan).finish_non_exhaustive()
    }
}

impl DataFrame {
    pub(crate) fn scan(
        session: std::sync::Arc<SessionState>,
        table: &str,
        batch: &RecordBatch,
        source: &str,
    ) -> Result<Self> {
        Ok(Self {
            session,
            plan: PlanBuilder::scan(table, batch)?,
            limit: None,
            source: source.to_string(),
            labels: None,
        })
    }

    fn with(self, plan: PlanBuilder) -> Self {
        Self { plan, ..self }
    }

    /// Composes one more operation. After a limit on results (a limit placed after a semantic operation), any
    /// other operation would silently run before the truncation, so it is refused.
    fn compose(self, op: impl FnOnce(PlanBuilder) -> stretto_core::Result<PlanBuilder>) -> Result<Self> {
        if let Some(n) = self.limit {
            return Err(Error::Query(format!(
                "limit({n}) after a semantic operation keeps the first {n} results, so it must be the frame's last \
                 operation"
            )));
        }
        let plan = op(self.plan.clone())?;
        Ok(self.with(plan))
    }

    /// Keeps rows where a relational predicate holds (it runs before every semantic operator that does not feed it).
    pub fn filter(self, predicate: Expr) -> Result<Self> {
        self.compose(|p| p.filter(predicate))
    }

    /// Keeps only these columns (qualified `table.column` or bare names).
    pub fn select(self, columns: &[&str]) -> Result<Self> {
        self.compose(|p| p.project(columns))
    }

    /// Inner equi-join on (left column, right column) pairs.
    pub fn join(self, other: DataFrame, on: &[(&str, &str)]) -> Result<Self> {
        let other = other.into_input("join")?;
        self.compose(|p| p.join(other, on))
    }

    /// Cartesian product.
    pub fn cross_join(self, other: DataFrame) -> Result<Self> {
        let other = other.into_input("cross_join")?;
        self.compose(|p| p.cross_join(other))
    }

    /// Semantic filter: a natural-language predicate naming its columns as `{table.column}`.
    pub fn sem_filter(self, predicate: &str) -> Result<Self> {
        self.compose(|p| p.sem_filter(predicate))
    }

    /// Semantic map: adds `column` of type `ty` extracted by the instruction.
    pub fn sem_map(self, column: &str, instruction: &str, ty: ValueType) -> Result<Self> {
        self.compose(|p| p.sem_map(column, instruction, ty))
    }

    /// Semantic join: pairs of rows of both frames for which the predicate holds.
    pub fn sem_join(self, other: DataFrame, predicate: &str) -> Result<Self> {
        let other = other.into_input("sem_join")?;
        self.compose(|p| p.sem_join(other, predicate))
    }

    /// This frame's plan as another frame's input. A limit on its results would be lost there (the semantic
    /// operators of both frames run as one pipeline after the joins), so such a frame is refused.
    fn into_input(self, op: &str) -> Result<PlanBuilder> {
        match self.limit {
            Some(n) => Err(Error::Query(format!(
                "the frame given to {op} ends in limit({n}) after a semantic operation; its first {n} results are \
                 only known once the whole query has run, so it cannot feed a {op}; limit its input instead"
            ))),
            None => Ok(self.plan),
        }
    }

    /// At most `n` rows. Before any semantic operation it bounds the rows the semantic operators see (a `Limit` in
    /// the logical plan, run with the relational part); after one, it keeps the first `n` result rows and must be
    /// the last operation: execution goes through the input in order and stops once they are known, and profiling
    /// weighs itself against the tuples gold needs to find them, as SQL's `LIMIT` does (unless a relational filter
    /// reads a map's output: then the whole input runs, and the first `n` rows are kept). Nothing runs until the
    /// frame is collected.
    pub fn limit(self, n: usize) -> Result<Self> {
        let has_semantic = !self.plan.clone().build().pull_up()?.semantic.is_empty();
        if has_semantic {
            let limit = Some(self.limit.map_or(n, |l| l.min(n)));
            return Ok(Self { limit, ..self });
        }
        self.compose(|p| Ok(p.limit(n)))
    }

    /// Scores results against true labels: one per tuple the semantic operators see (the frame's rows after its
    /// relational operations), in order. [`QueryResult::truth`] then holds precision, recall and F1 against them.
    /// A count that does not match is an error at collect time.
    pub fn with_labels(self, labels: TruthLabels) -> Self {
        Self { labels: Some(labels), ..self }
    }

    /// The logical plan as composed.
    pub fn logical_plan(&self) -> LogicalPlan {
        self.plan.clone().build()
    }

    fn options(&self, targets: &Targets, strategy: &dyn Strategy) -> QueryOptions {
        let c = &self.session.config;
        let mut o = QueryOptions::new(&self.source, &self.logical_plan().to_string());
        (o.precision, o.recall, o.credible) = (targets.precision, targets.recall, targets.credible);
        o.method = strategy.name().to_string();
        o.certification = strategy.certification().cloned();
        o.seed = c.seed;
        o.sample_fraction = c.sample_fraction;
        o.min_sample = c.min_sample;
        o.max_sample = c.max_sample;
        o.screen = c.screen;
        o.price_memo_hits = c.price_memo_hits;
        o.models = c.models.clone();
        o.run_dir = c.run_dir.clone();
        o.progress = c.progress;
        o.labels = self.labels.clone();
        o
    }

    /// The fetch a run of `pulled` (this frame's plan, pulled up) takes from a limit on results: profiling weighs
    /// itself against the tuples gold needs to find them, and execution stops once they are known. Not past a
    /// relational filter on a map's output, which could drop rows after the pipeline counted them.
    fn fetch(&self, pulled: &PulledUpPlan) -> Option<usize> {
        self.limit.filter(|_| pulled.post_filters.is_empty())
    }

    fn pulled(&self) -> Result<(PulledUpPlan, RecordBatch)> {
        let pulled = self.logical_plan().pull_up()?;
        if pulled.semantic.is_empty() {
            return Err(Error::Query("the frame has no semantic operation; add sem_filter or sem_map".into()));
        }
        let input = pulled.relational.execute_relational()?;
        Ok((pulled, input))
    }

    /// Profiles every candidate operator on the session's seeded sample: the profile any plan for this frame
    /// (any strategy, any targets) starts from.
    pub fn profile(&self) -> Result<ProfiledFrame> {
        // Targets do not matter to profiling; these pass validation. The profile is of the whole input's sample,
        // whatever limit the frame puts on its results (no fetch).
        let o = self.options(&Targets::new(0.9, 0.9, 0.95)?, &Global::default());
        self.profiled_by(&o, engine::profile_pipeline)
    }

    /// The frame's pipeline profiled by `profile` (every candidate, or what a run needs) under `o`.
    fn profiled_by(
        &self,
        o: &QueryOptions,
        profile: fn(&Registry, &PulledUpPlan, &RecordBatch, &QueryOptions) -> Result<Profiled>,
    ) -> Result<ProfiledFrame> {
        let (pulled, input) = self.pulled()?;
        self.profiled_from(pulled, input, o, profile)
    }

    /// [`DataFrame::profiled_by`] on the frame's pulled-up plan and its relational part's output.
    fn profiled_from(
        &self,
        pulled: PulledUpPlan,
        input: RecordBatch,
        o: &QueryOptions,
        profile: fn(&Registry, &PulledUpPlan, &RecordBatch, &QueryOptions) -> Result<Profiled>,
    ) -> Result<ProfiledFrame> {
        let profiled = {
            let _span = tracing::info_span!("profile", source = %self.source).entered();
            profile(&self.session.registry(), &pulled, &input, o)?
        };
        Ok(ProfiledFrame { frame: self.clone(), pulled, profiled })
    }

    /// This frame with a profile saved earlier ([`ProfiledFrame::save_profile`]), so it can be re-optimized under
    /// other targets or strategies without profiling again. The profile must be of this frame's pipeline.
    pub fn with_profile(&self, path: impl AsRef<Path>) -> Result<ProfiledFrame> {
        let path = path.as_ref();
        let (pulled, input) = self.pulled()?;
        let profile = Profile::read(path)?;
        let profiled = engine::reuse_profile(&pulled, &input, profile, path.to_path_buf())?;
        Ok(ProfiledFrame { frame: self.clone(), pulled, profiled })
    }

    /// Profiles, optimizes with the certified global strategy under `targets`, and executes.
    pub fn collect(&self, targets: Targets) -> Result<QueryResult> {
        self.collect_with(targets, &Global::default())
    }

    /// Profiles, optimizes with `strategy` under `targets`, and executes. Only the gold operators are profiled
    /// when nothing else can pay for its profiling (the gold strategy; an input no larger than the sample), and
    /// the result's plan then says so.
    ///
    /// An input with no rows (an empty file, or relational filters that keep none) gives an empty result with the
    /// pipeline's columns, and a plan with no stages that says so: nothing runs.
    pub fn collect_with(&self, targets: Targets, strategy: &dyn Strategy) -> Result<QueryResult> {
        let mut o = self.options(&targets, strategy);
        let (pulled, input) = self.pulled()?;
        o.fetch = self.fetch(&pulled);
        if input.num_rows() == 0 {
            return Ok(QueryResult { report: engine::empty_input(&pulled, &input, &o)? });
        }
        self.profiled_from(pulled, input, &o, engine::profile_to_run)?.collect_with(targets, strategy)
    }
}

/// A frame whose semantic pipeline is profiled: optimize and execute it under any targets and strategy.
#[derive(Debug, Clone)]
pub struct ProfiledFrame {
    frame: DataFrame,
    pulled: PulledUpPlan,
    profiled: Profiled,
}

impl ProfiledFrame {
    /// The profile (`stretto.profile/v1`).
    pub fn profile(&self) -> &Profile {
        &self.profiled.profile
    }

    /// The first, screening stage of profiling, if it ran: which candidates it kept out of the profile, and why.
    pub fn screening(&self) -> Option<&crate::engine::Screening> {
        self.profiled.screening.as_ref()
    }

    /// Saves the profile, so it can be re-optimized offline (`stretto optimize --profile`).
    pub fn save_profile(&self, path: impl AsRef<Path>) -> Result<()> {
        let mut profile = self.profiled.profile.clone();
        // What the profiled tuples hold, so that a frame reusing the profile over other data is refused.
        if profile.sample_digest.is_none() {
            profile.sample_digest =
                Some(engine::sample_digest(&self.profiled.tasks, &self.profiled.input, &profile.tuples)?);
        }
        Ok(profile.write(path.as_ref())?)
    }

    /// Optimizes with the certified global strategy under `targets` and executes.
    pub fn collect(&self, targets: Targets) -> Result<QueryResult> {
        self.collect_with(targets, &Global::default())
    }

    /// Optimizes with `strategy` under `targets` and executes.
    pub fn collect_with(&self, targets: Targets, strategy: &dyn Strategy) -> Result<QueryResult> {
        self.execute(&self.optimize(targets, strategy)?)
    }

    /// Optimizes with `strategy` under `targets`: the plan, its certified bounds and warnings, before anything runs.
    pub fn optimize(&self, targets: Targets, strategy: &dyn Strategy) -> Result<OptimizedPlan> {
        let mut options = self.frame.options(&targets, strategy);
        options.fetch = self.frame.fetch(&self.pulled);
        let planned = engine::optimize(&self.profiled, &options, strategy)?;
        Ok(OptimizedPlan { planned, options })
    }

    /// Executes an optimized plan of this frame on its whole input.
    pub fn execute(&self, plan: &OptimizedPlan) -> Result<QueryResult> {
        let session = &self.frame.session;
        let registry = session.registry();
        let mut report = engine::execute(&registry, &self.pulled, &self.profiled, &plan.options, &plan.planned)?;
        if let Some(n) = self.frame.limit {
            report.result = report.result.slice(0, n.min(report.result.num_rows()));
            report.rows.truncate(n);
        }
        Ok(QueryResult { report })
    }
}

/// A plan a strategy chose for a profiled frame, not yet executed.
#[derive(Debug, Clone)]
pub struct OptimizedPlan {
    planned: engine::Planned,
    options: QueryOptions,
}

impl OptimizedPlan {
    /// The plan (`stretto.plan/v1`): stages in order, thresholds, predicted bounds, warnings.
    pub fn plan(&self) -> &stretto_core::format::PlanFile {
        &self.planned.plan
    }

    /// Certified lower bounds of precision and recall on the profiled tuples (1/1 for the gold plan).
    pub fn bounds(&self) -> (f64, f64) {
        (self.planned.optimized.precision_lower_bound, self.planned.optimized.recall_lower_bound)
    }

    /// Whether the strategy fell back to the gold plan (the plan's warnings say why).
    pub fn fell_back_to_gold(&self) -> bool {
        self.planned.optimized.fell_back_to_gold
    }

    /// Predicted cost per tuple, in seconds, on the profiled tuples.
    pub fn cost_per_tuple(&self) -> f64 {
        self.planned.optimized.cost_per_tuple
    }
}

/// What a query returned: the result table, the certified plan and what running it cost.
#[derive(Debug, Clone)]
pub struct QueryResult {
    report: QueryReport,
}

impl QueryResult {
    /// The result rows.
    pub fn batch(&self) -> &RecordBatch {
        &self.report.result
    }

    /// The plan that ran (`stretto.plan/v1`: stages in order, thresholds, predicted bounds, warnings).
    pub fn plan(&self) -> &stretto_core::format::PlanFile {
        &self.report.plan
    }

    /// Certified lower bounds of precision and recall (1/1 for the gold plan).
    pub fn bounds(&self) -> (f64, f64) {
        let b = &self.report.bounds;
        (b["precision"].as_f64().unwrap_or(0.0), b["recall"].as_f64().unwrap_or(0.0))
    }

    /// Whether the optimizer fell back to the gold plan.
    pub fn fell_back_to_gold(&self) -> bool {
        self.report.bounds["fell_back_to_gold"] == true
    }

    /// Per-stage counts and seconds.
    pub fn stages(&self) -> &[stretto_core::exec::StageStats] {
        &self.report.stages
    }

    /// Seconds per phase (`kv_caches`, `profiling`, `optimization`, `execution`, `total`).
    pub fn timings(&self) -> &BTreeMap<String, f64> {
        &self.report.timings
    }

    /// The operators' own account of what execution cost, in seconds (memoised answers count what computing them
    /// cost).
    pub fn cost_seconds(&self) -> f64 {
        self.report.stages.iter().map(|s| s.cost_seconds).sum()
    }

    /// What the query cost end to end in operator seconds (profiling + execution − the answers execution reused
    /// from profiling), beside an estimate of what the gold plan alone would have cost.
    pub fn cost(&self) -> &crate::engine::CostAccount {
        &self.report.cost
    }

    /// Precision, recall and F1 against the true labels given with [`DataFrame::with_labels`] (`plan`, and
    /// `gold` when the gold plan was run), with the counts behind them.
    pub fn truth(&self) -> Option<&serde_json::Value> {
        self.report.truth.as_ref()
    }

    /// The full report, as the CLI prints it.
    pub fn report(&self) -> &QueryReport {
        &self.report
    }

    /// Writes the result rows as CSV, atomically.
    pub fn write_csv(&self, path: impl AsRef<Path>) -> Result<()> {
        io::write(self.batch(), path.as_ref(), FileFormat::Csv)
    }

    /// Writes the result rows as Parquet, atomically.
    pub fn write_parquet(&self, path: impl AsRef<Path>) -> Result<()> {
        io::write(self.batch(), path.as_ref(), FileFormat::Parquet)
    }

    /// Writes the result rows in the format `path`'s extension names (CSV, TSV, Parquet, NDJSON), atomically.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        io::write(self.batch(), path, FileFormat::of(path)?)
    }
}
