//! The physical side: [`SemanticPipelineExec`], the DataFusion `ExecutionPlan` that profiles, optimizes and runs
//! one query's certified cascade, and the planners that put it in DataFusion's physical plans.
//!
//! On its first poll the node reads its whole input (profiling samples from all of it), profiles every candidate
//! operator on the session's seeded sample, optimizes under the query's targets and binds the certified cascade.
//! Then it executes the cascade `stretto.batch_rows` tuples at a time (under a LIMIT k, chunks of 2k, 4k, … up to
//! that), yielding a record batch each time: a LIMIT above it stops pulling once it has its rows, and the tuples
//! never pulled are never run ([`PipelineRun`] counts them).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use arrow::array::{ArrayRef, RecordBatch};
use arrow::compute::{cast, concat_batches};
use arrow::datatypes::{DataType, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{internal_err, DataFusionError, Result};
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{LogicalPlan, UserDefinedLogicalNode};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, Partitioning, PlanProperties, SendableRecordBatchStream,
};
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use stretto::core::exec::{CascadeExecutor, CascadePlan, PaidAnswers, StageStats};
use stretto::core::plan::PlanBuilder;
use stretto::engine::{self, QueryOptions};

use crate::node::{stretto_names, PipelineSpec, SemanticPipelineNode};

/// What one pipeline did in a query: its plan and certified bounds, and how much of its input it ran.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PipelineRun {
    /// The pipeline in Stretto's query syntax.
    pub pipeline: String,
    /// Tuples the relational part gave the pipeline.
    pub input_rows: usize,
    /// Tuples profiled.
    pub sample_rows: usize,
    /// The result rows the pipeline's consumer wanted at most (a `LIMIT` right above it: its offset plus its count),
    /// as its certification knew it: profiling was weighed against the tuples gold needs to find them. On a
    /// cluster each partition stops at that many.
    pub fetch: Option<usize>,
    /// Tuples the certified cascade ran on.
    pub executed_rows: usize,
    /// Rows it produced.
    pub output_rows: usize,
    /// The certified plan (`stretto.plan/v1`), once optimized.
    pub plan: Option<stretto::core::format::PlanFile>,
    /// Certified lower bounds on precision and recall, and whether the optimizer fell back to gold.
    pub bounds: Option<serde_json::Value>,
    /// Per-stage counts and time over the executed tuples.
    pub stages: Vec<StageStats>,
    /// Seconds per phase (`kv_caches`, `profiling`, `optimization`, `execution`).
    pub timings: BTreeMap<String, f64>,
    /// Whether every input tuple was executed (false when a LIMIT above stopped it early).
    pub finished: bool,
    /// Why only gold was profiled and run, when profiling could not pay (a small input, or a LIMIT that gold
    /// reaches within a few tuples).
    pub gold_only: Option<String>,
    /// Whether a cluster's executors ran the certified cascade (`stretto-ballista`): its execution counts
    /// (`executed_rows`, `output_rows`, `stages`, `finished`) are theirs, not known here, and stay empty.
    pub on_cluster: bool,
    /// On a cluster: per stage of the plan (`logical/implementation`), how many of its operator's answers on the
    /// input, known here (those profiling paid for first, up to a size limit), were shipped with the plan for the
    /// executors to read rather than compute.
    pub shipped_answers: BTreeMap<String, usize>,
}

impl PipelineRun {
    /// Input tuples the cascade never ran because nothing above asked for more rows (none known of a cluster run).
    pub fn skipped_rows(&self) -> usize {
        if self.on_cluster {
            return 0;
        }
        self.input_rows.saturating_sub(self.executed_rows)
    }

    /// One line for a plan display: tuples in, profiled, executed and skipped, rows out, the certified cascade's
    /// stages with their decision rules, and the certified bounds.
    pub fn summary(&self) -> String {
        format!("{}: {}", self.pipeline, self.details())
    }

    /// [`summary`](Self::summary) without the pipeline's text.
    pub fn details(&self) -> String {
        let stages = self.plan.as_ref().map(|p| p.describe_stages());
        let bounds = self.bounds.as_ref().map(|b| {
            format!(
                "certified precision >= {:.3}, recall >= {:.3}{}",
                b["precision"].as_f64().unwrap_or(f64::NAN),
                b["recall"].as_f64().unwrap_or(f64::NAN),
                if b["fell_back_to_gold"].as_bool() == Some(true) { " (gold fallback)" } else { "" }
            )
        });
        let mut s = format!("{} input tuples, {} profiled", self.input_rows, self.sample_rows);
        if let Some(k) = self.fetch {
            s.push_str(&format!(" for the first {k} result row{}", if k == 1 { "" } else { "s" }));
        }
        if self.on_cluster {
            s.push_str(", executed by the cluster's executors (their logs hold the counts)");
            let shipped: usize = self.shipped_answers.values().sum();
            if shipped > 0 {
                s.push_str(&format!(", {shipped} known answers shipped to them"));
            }
        } else {
            s.push_str(&format!(", {} executed", self.executed_rows));
            if self.skipped_rows() > 0 {
                s.push_str(&format!(", {} skipped (LIMIT reached before they were needed)", self.skipped_rows()));
            }
            s.push_str(&format!(", {} rows out", self.output_rows));
        }
        if let Some(st) = stages {
            s.push_str(&format!("; plan {st}"));
        }
        if let Some(b) = bounds {
            s.push_str(&format!("; {b}"));
        }
        if let Some(why) = &self.gold_only {
            s.push_str(&format!("; {why}"));
        }
        s
    }
}

/// A pipeline profiled, optimized and bound: ready to run on slices of its input.
struct Prepared {
    input: RecordBatch,
    cascade: CascadePlan,
    input_names: Vec<String>,
    map_columns: Vec<String>,
    output: SchemaRef,
    /// Which stages' answers on which input rows profiling paid for (read from the memo in execution).
    paid: Arc<PaidAnswers>,
}

impl Prepared {
    fn rows(&self) -> usize {
        self.input.num_rows()
    }

    fn execute(&self, start: usize, end: usize) -> stretto::Result<(RecordBatch, Vec<StageStats>, f64)> {
        let t0 = std::time::Instant::now();
        let chunk = self.input.slice(start, end - start);
        let paid = Some(Arc::new(self.paid.window(start, end)));
        let (batch, stats) =
            run_cascade(&self.cascade, &chunk, &self.input_names, &self.map_columns, &self.output, paid)?;
        Ok((batch, stats, t0.elapsed().as_secs_f64()))
    }
}

/// Runs a bound cascade over `chunk` (columns under Stretto's names, as [`stretto_input`] gives them) and shapes
/// its output as the pipeline's: the input columns (`input_names`, in order), then the maps' columns, cast to
/// `output`'s types. `paid` (rows of `chunk`) are the answers this query's profiling paid for, which the stage
/// statistics book as reused.
pub fn run_cascade(
    cascade: &CascadePlan,
    chunk: &RecordBatch,
    input_names: &[String],
    map_columns: &[String],
    output: &SchemaRef,
    paid: Option<Arc<PaidAnswers>>,
) -> stretto::Result<(RecordBatch, Vec<StageStats>)> {
    let executor = CascadeExecutor::default();
    let executor = match paid {
        Some(p) => executor.with_paid(p),
        None => executor,
    };
    let out = executor.execute(cascade, chunk)?;
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(output.fields().len());
    for (name, field) in input_names.iter().chain(map_columns).zip(output.fields()) {
        let col = out
            .batch
            .column_by_name(name)
            .ok_or_else(|| stretto::Error::Query(format!("the cascade's output lacks column `{name}`")))?;
        columns.push(if col.data_type() == field.data_type() {
            col.clone()
        } else {
            cast(col, field.data_type()).map_err(stretto::Error::Arrow)?
        });
    }
    let batch = RecordBatch::try_new(output.clone(), columns).map_err(stretto::Error::Arrow)?;
    Ok((batch, out.stats))
}

fn external(e: stretto::Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

fn arrow_err(what: &str, e: arrow::error::ArrowError) -> stretto::Error {
    stretto::Error::Core(stretto::core::CoreError::arrow(what.to_string(), e))
}

/// The pipeline's input as Stretto reads it: the columns under Stretto's names (`input_names`, see
/// [`stretto_names`](crate::node::stretto_names)), column kinds kept, text in any Arrow string layout as Utf8.
pub fn stretto_input(
    input_schema: &SchemaRef,
    input_names: &[String],
    batch: &RecordBatch,
) -> stretto::Result<RecordBatch> {
    let mut fields = Vec::with_capacity(input_names.len());
    let mut columns = Vec::with_capacity(input_names.len());
    for ((f, name), col) in input_schema.fields().iter().zip(input_names).zip(batch.columns()) {
        let (ty, col) = match f.data_type() {
            DataType::Utf8View | DataType::LargeUtf8 => {
                // Utf8 holds at most 2 GiB of text per column, and Arrow's cast to it panics (not errs) past that
                // from Utf8View.
                let bytes = text_bytes(col.as_ref());
                if bytes > i32::MAX as usize {
                    return Err(arrow_err(
                        "reading text",
                        arrow::error::ArrowError::InvalidArgumentError(format!(
                            "column `{name}` of the semantic pipeline's input holds {:.1} GiB of text, more than the \
                             2 GiB a pipeline's text column can hold: narrow the input (a WHERE or LIMIT below the \
                             semantic functions) or split the table",
                            bytes as f64 / (1u64 << 30) as f64
                        )),
                    ));
                }
                (DataType::Utf8, cast(col, &DataType::Utf8).map_err(|e| arrow_err("reading text", e))?)
            }
            t => (t.clone(), col.clone()),
        };
        fields.push(f.as_ref().clone().with_name(name.as_str()).with_data_type(ty));
        columns.push(col);
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|e| arrow_err("naming the pipeline input", e))
}

/// Bytes of text in a Utf8View or LargeUtf8 column (0 for other types), nulls counting none.
fn text_bytes(col: &dyn arrow::array::Array) -> usize {
    use arrow::array::AsArray;
    match col.data_type() {
        DataType::Utf8View => col.as_string_view().iter().flatten().map(str::len).sum(),
        DataType::LargeUtf8 => col.as_string::<i64>().iter().flatten().map(str::len).sum(),
        _ => 0,
    }
}

/// A pipeline's certified plan over one input, and the logical operators it binds to.
#[derive(Debug, Clone)]
pub struct Certified {
    /// The certified plan (`stretto.plan/v1`).
    pub plan: stretto::core::format::PlanFile,
    /// The logical operators the plan's stages name.
    pub tasks: Vec<stretto::core::op::SemanticTask>,
    /// Which operators' answers on which input rows profiling paid for (they are in the session's memo).
    pub paid: Arc<stretto::core::exec::PaidAnswers>,
}

/// What a certification should expect of the execution that follows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExecutionScope {
    /// How many result rows the pipeline's consumer wants at most (a `LIMIT` right above it): profiling is then
    /// weighed against the tuples gold needs to find them ([`stretto::engine::QueryOptions::fetch`]).
    pub fetch: Option<usize>,
    /// Whether other processes execute the plan (a cluster's executors): the certification then prefills only
    /// the KV caches of the tuples profiling reads, and the executors prefill the others as they reach them
    /// ([`stretto::engine::QueryOptions::prefill_profiled_only`]), rather than one process all of them first.
    pub elsewhere: bool,
}

/// Profiles every candidate operator of `spec` on the session's seeded sample of `input` (under Stretto's names,
/// see [`stretto_input`]) and optimizes under the spec's targets: steps 1–4 of a pipeline, without executing it.
/// `run` receives the sample size, timings, bounds and plan. `None` when the input is empty.
///
/// `scope` says what execution will follow: how many rows it is wanted for, and where it runs.
pub fn certify(
    session: &stretto::Session,
    spec: &PipelineSpec,
    input: &RecordBatch,
    run: &Mutex<PipelineRun>,
    scope: ExecutionScope,
) -> stretto::Result<Option<Certified>> {
    {
        let mut r = run.lock().unwrap_or_else(|p| p.into_inner());
        (r.input_rows, r.fetch) = (input.num_rows(), scope.fetch);
    }
    if input.num_rows() == 0 {
        return Ok(None);
    }
    let mut b =
        PlanBuilder::from_plan(stretto::core::plan::LogicalPlan::Scan { table: "sql".into(), batch: input.clone() });
    for t in spec.tasks() {
        b = match &t.output {
            None => b.sem_filter_named(&t.name, &t.prompt)?,
            Some((column, ty)) => b.sem_map(column, &t.prompt, *ty)?,
        };
    }
    let pulled = b.build().pull_up()?;
    let c = session.config();
    let o = spec.options.clone();
    let mut q = QueryOptions::new("sql", &spec.describe());
    (q.precision, q.recall, q.credible, q.method) = (o.precision, o.recall, o.credible, o.method.clone());
    (q.seed, q.sample_fraction, q.min_sample, q.screen) = (c.seed, c.sample_fraction, c.min_sample, c.screen);
    (q.max_sample, q.price_memo_hits) = (c.max_sample, c.price_memo_hits);
    (q.models, q.run_dir, q.progress) = (c.models.clone(), c.run_dir.clone(), c.progress);
    (q.fetch, q.prefill_profiled_only) = (scope.fetch, scope.elsewhere);
    let strategy = stretto::optim::strategy::strategy(&q.method)?;
    let registry = session.registry();
    let profiled = engine::profile_to_run(&registry, &pulled, input, &q)?;
    let planned = engine::optimize(&profiled, &q, strategy.as_ref())?;
    {
        let mut r = run.lock().unwrap_or_else(|p| p.into_inner());
        r.sample_rows = profiled.sample_rows;
        r.gold_only = profiled.gold_only.clone();
        r.timings = profiled.timings.clone();
        r.timings.remove("prepare_total");
        r.timings.insert("optimization".into(), planned.seconds);
        r.bounds = Some(serde_json::json!({
            "precision": planned.optimized.precision_lower_bound,
            "recall": planned.optimized.recall_lower_bound,
            "fell_back_to_gold": planned.optimized.fell_back_to_gold,
        }));
        r.plan = Some(planned.plan.clone());
    }
    Ok(Some(Certified { plan: planned.plan, tasks: profiled.tasks, paid: profiled.paid }))
}

/// Profiles, optimizes and binds the pipeline over all of its input `batch` (`None` when the input is empty).
fn prepare(
    session: &stretto::Session,
    spec: &PipelineSpec,
    input_names: &[String],
    output: SchemaRef,
    batch: RecordBatch,
    run: &Mutex<PipelineRun>,
    fetch: Option<usize>,
) -> stretto::Result<Option<Prepared>> {
    let input = stretto_input(&batch.schema(), input_names, &batch)?;
    let Some(certified) = certify(session, spec, &input, run, ExecutionScope { fetch, elsewhere: false })? else {
        return Ok(None);
    };
    let registry = session.registry();
    let cascade = CascadePlan::bind(&certified.plan, certified.tasks, |n| registry.get(n))?;
    Ok(Some(Prepared {
        input,
        cascade,
        input_names: input_names.to_vec(),
        map_columns: spec.maps.iter().map(|m| m.column.clone()).collect(),
        output,
        paid: certified.paid,
    }))
}

/// Runs one query's semantic pipeline: see the module doc.
pub struct SemanticPipelineExec {
    input: Arc<dyn ExecutionPlan>,
    spec: Arc<PipelineSpec>,
    input_names: Vec<String>,
    session: stretto::Session,
    properties: Arc<PlanProperties>,
    run: Arc<Mutex<PipelineRun>>,
    metrics: ExecutionPlanMetricsSet,
    /// At most this many rows out (a `LIMIT` DataFusion pushed into the pipeline): execution stops there.
    fetch: Option<usize>,
}

impl SemanticPipelineExec {
    fn new(
        input: Arc<dyn ExecutionPlan>,
        spec: Arc<PipelineSpec>,
        input_names: Vec<String>,
        schema: SchemaRef,
        session: stretto::Session,
        run: Arc<Mutex<PipelineRun>>,
    ) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Self {
            input,
            spec,
            input_names,
            session,
            properties,
            run,
            metrics: ExecutionPlanMetricsSet::new(),
            fetch: None,
        }
    }

    /// This pipeline over `input`, stopping after `fetch` rows (fresh metrics; the same run report).
    fn rebuilt(&self, input: Arc<dyn ExecutionPlan>, fetch: Option<usize>) -> Self {
        let (spec, names, session, run) =
            (self.spec.clone(), self.input_names.clone(), self.session.clone(), self.run.clone());
        Self { fetch, ..Self::new(input, spec, names, self.schema(), session, run) }
    }

    /// What the pipeline did so far (complete once the query's stream is drained or dropped).
    pub fn run(&self) -> PipelineRun {
        self.run.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The pipeline's filters, maps and settings.
    pub fn spec(&self) -> &PipelineSpec {
        &self.spec
    }
}

impl fmt::Debug for SemanticPipelineExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SemanticPipelineExec: {}", self.spec.describe())
    }
}

impl DisplayAs for SemanticPipelineExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let o = &self.spec.options;
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                write!(
                    f,
                    "SemanticPipelineExec: {}, targets precision >= {} and recall >= {} at {}%, method {}, {} tuples per \
                     batch",
                    self.spec.describe(),
                    o.precision,
                    o.recall,
                    o.credible * 100.0,
                    o.method,
                    o.batch_rows
                )?;
                if let Some(k) = self.fetch {
                    write!(f, ", fetch {k}")?;
                }
                // After a run (EXPLAIN ANALYZE), what the optimizer certified and what the cascade did.
                let run = self.run.lock().unwrap_or_else(|p| p.into_inner());
                if run.plan.is_some() {
                    write!(f, "; ran: {}", run.details())?;
                }
                Ok(())
            }
            DisplayFormatType::TreeRender => write!(f, "{}", self.spec.describe()),
        }
    }
}

impl ExecutionPlan for SemanticPipelineExec {
    fn name(&self) -> &str {
        "SemanticPipelineExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        // Profiling samples the whole input, so one partition reads all of it.
        vec![Distribution::SinglePartition]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, mut children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return internal_err!("SemanticPipelineExec takes one input, got {}", children.len());
        }
        Ok(Arc::new(self.rebuilt(children.swap_remove(0), self.fetch)))
    }

    fn fetch(&self) -> Option<usize> {
        self.fetch
    }

    /// A `LIMIT k` right above the pipeline becomes its fetch: it stops executing once k rows are out, and its
    /// pay check knows that gold need only find k ([`certify`]).
    fn with_fetch(&self, limit: Option<usize>) -> Option<Arc<dyn ExecutionPlan>> {
        Some(Arc::new(self.rebuilt(self.input.clone(), limit)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return internal_err!("SemanticPipelineExec has one partition, asked for {partition}");
        }
        let input = self.input.execute(0, context)?;
        let input_schema = self.input.schema();
        let (session, spec, names, run) =
            (self.session.clone(), self.spec.clone(), self.input_names.clone(), self.run.clone());
        let output = self.schema();
        let executed = MetricBuilder::new(&self.metrics).counter("tuples_executed", partition);
        let out_rows = MetricBuilder::new(&self.metrics).output_rows(partition);
        let batch_rows = spec.options.batch_rows.max(1);
        let fetch = self.fetch;
        {
            let mut r = run.lock().unwrap_or_else(|p| p.into_inner());
            *r = PipelineRun { pipeline: spec.describe(), ..Default::default() };
        }
        let schema = output.clone();
        let prepared = async move {
            let batches: Vec<RecordBatch> = input.try_collect().await?;
            let run2 = run.clone();
            let p = tokio::task::spawn_blocking(move || {
                let _span = tracing::info_span!("sql_pipeline_prepare", pipeline = %spec.describe()).entered();
                let batch =
                    concat_batches(&input_schema, &batches).map_err(|e| arrow_err("reading the pipeline input", e))?;
                prepare(&session, &spec, &names, output, batch, &run2, fetch)
            })
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?
            .map_err(external)?;
            Ok::<_, DataFusionError>((p, run))
        };
        let stream = stream::once(prepared)
            .map_ok(move |(p, run)| -> BoxStream<'static, Result<RecordBatch>> {
                let Some(p) = p else {
                    run.lock().unwrap_or_else(|p| p.into_inner()).finished = true;
                    return stream::empty().boxed();
                };
                let p = Arc::new(p);
                let (executed, out_rows) = (executed.clone(), out_rows.clone());
                // With a fetch, the first chunk is twice the rows wanted and each next one twice the last (up to
                // batch_rows): a LIMIT 5 over a filter that keeps half its input stops after about 10 tuples, not
                // after a whole batch.
                let first = fetch.map_or(batch_rows, |k| k.saturating_mul(2).clamp(1, batch_rows));
                stream::try_unfold((0usize, 0usize, first), move |(start, emitted, chunk)| {
                    let (p, run, executed, out_rows) = (p.clone(), run.clone(), executed.clone(), out_rows.clone());
                    async move {
                        if fetch.is_some_and(|k| emitted >= k) {
                            return Ok(None);
                        }
                        if start >= p.rows() {
                            run.lock().unwrap_or_else(|p| p.into_inner()).finished = true;
                            return Ok(None);
                        }
                        let end = (start + chunk).min(p.rows());
                        let p2 = p.clone();
                        let (batch, stats, secs) = tokio::task::spawn_blocking(move || {
                            let _span = tracing::info_span!("sql_pipeline_execute", start, end).entered();
                            p2.execute(start, end)
                        })
                        .await
                        .map_err(|e| DataFusionError::External(Box::new(e)))?
                        .map_err(external)?;
                        let batch = match fetch {
                            Some(k) if emitted + batch.num_rows() > k => batch.slice(0, k - emitted),
                            _ => batch,
                        };
                        executed.add(end - start);
                        out_rows.add(batch.num_rows());
                        let mut r = run.lock().unwrap_or_else(|p| p.into_inner());
                        r.executed_rows = end;
                        r.output_rows += batch.num_rows();
                        *r.timings.entry("execution".into()).or_default() += secs;
                        if r.stages.is_empty() {
                            r.stages = stats;
                        } else {
                            for (acc, s) in r.stages.iter_mut().zip(stats) {
                                acc.tuples_in += s.tuples_in;
                                acc.accepted += s.accepted;
                                acc.rejected += s.rejected;
                                acc.unsure += s.unsure;
                                acc.seconds += s.seconds;
                                acc.cost_seconds += s.cost_seconds;
                                acc.reused_seconds += s.reused_seconds;
                                acc.reused += s.reused;
                            }
                        }
                        drop(r);
                        let emitted = emitted + batch.num_rows();
                        Ok(Some((batch, (end, emitted, chunk.saturating_mul(2).min(batch_rows)))))
                    }
                })
                .boxed()
            })
            .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// Every pipeline a planner has planned, in order: the runs of statements whose physical plan the caller never sees
/// (`CREATE TABLE ... AS SELECT`, `INSERT INTO ... SELECT`) are read from here.
#[derive(Debug, Clone, Default)]
pub struct RunLog(Arc<Mutex<Vec<Arc<Mutex<PipelineRun>>>>>);

impl RunLog {
    /// Records a pipeline a planner has planned (its run fills in as it runs).
    pub fn push(&self, run: Arc<Mutex<PipelineRun>>) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(run);
    }

    /// Forgets what was planned so far.
    pub fn clear(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// What each pipeline planned since the last [`clear`](Self::clear) did, in planning order.
    pub fn runs(&self) -> Vec<PipelineRun> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|r| r.lock().unwrap_or_else(|p| p.into_inner()).clone())
            .collect()
    }
}

/// Plans [`SemanticPipelineNode`]s as [`SemanticPipelineExec`]s running on `session`.
#[derive(Debug)]
pub struct SemanticPlanner {
    session: stretto::Session,
    log: RunLog,
}

impl SemanticPlanner {
    /// A planner whose pipelines run with `session`'s operators and settings.
    pub fn new(session: stretto::Session) -> Self {
        Self { session, log: RunLog::default() }
    }

    /// The same, recording every pipeline it plans in `log`.
    pub fn with_log(session: stretto::Session, log: RunLog) -> Self {
        Self { session, log }
    }
}

#[async_trait]
impl ExtensionPlanner for SemanticPlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        _state: &dyn datafusion::catalog::Session,
        _planning: &PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(n) = node.as_any().downcast_ref::<SemanticPipelineNode>() else { return Ok(None) };
        let [input] = physical_inputs else {
            return internal_err!("SemanticPipeline has one input, got {}", physical_inputs.len());
        };
        let names = stretto_names(n.input.schema())?;
        let schema: SchemaRef = Arc::new(n.schema().as_arrow().clone());
        let run = Arc::new(Mutex::new(PipelineRun::default()));
        self.log.push(run.clone());
        Ok(Some(Arc::new(SemanticPipelineExec::new(
            input.clone(),
            n.spec.clone(),
            names,
            schema,
            self.session.clone(),
            run,
        ))))
    }
}

/// DataFusion's default physical planner, taught [`SemanticPlanner`].
#[derive(Debug)]
pub struct StrettoQueryPlanner {
    session: stretto::Session,
    log: RunLog,
}

impl StrettoQueryPlanner {
    /// A query planner whose semantic pipelines run with `session`.
    pub fn new(session: stretto::Session) -> Self {
        Self { session, log: RunLog::default() }
    }

    /// Every pipeline this planner planned (see [`RunLog`]).
    pub fn log(&self) -> RunLog {
        self.log.clone()
    }
}

#[async_trait]
impl QueryPlanner for StrettoQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        state: &dyn datafusion::catalog::Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let planner = SemanticPlanner::with_log(self.session.clone(), self.log.clone());
        DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(planner)])
            .create_physical_plan(logical_plan, state)
            .await
    }
}

/// Every pipeline run in a physical plan, in plan order.
pub fn pipeline_runs(plan: &Arc<dyn ExecutionPlan>) -> Vec<PipelineRun> {
    let mut runs = Vec::new();
    let any: &dyn std::any::Any = plan.as_ref();
    if let Some(p) = any.downcast_ref::<SemanticPipelineExec>() {
        runs.push(p.run());
    }
    for c in plan.children() {
        runs.extend(pipeline_runs(c));
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringViewArray;
    use arrow::buffer::{Buffer, ScalarBuffer};
    use arrow::datatypes::Field;

    #[test]
    fn text_past_two_gib_is_an_error_not_a_panic() {
        // 3,000 views of one 1 MiB string: 2.9 GiB of text in 1 MiB of memory.
        let mib = 1u32 << 20;
        let data = Buffer::from_vec(vec![b'a'; mib as usize]);
        let view = arrow::array::ByteView::new(mib, b"aaaa").as_u128();
        let views = ScalarBuffer::from(vec![view; 3000]);
        let text = StringViewArray::try_new(views, vec![data], None).unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("t", DataType::Utf8View, false)]));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(text) as ArrayRef]).unwrap();
        let err = stretto_input(&schema, &["reviews.text".to_string()], &batch).unwrap_err().to_string();
        assert!(err.contains("`reviews.text`") && err.contains("2.9 GiB") && err.contains("narrow the input"), "{err}");

        // Under the limit the column is read as Utf8.
        let small = batch.slice(0, 3);
        let input = stretto_input(&schema, &["reviews.text".to_string()], &small).unwrap();
        assert_eq!(input.schema().field(0).data_type(), &DataType::Utf8);
        assert_eq!(input.column(0).len(), 3);
    }
}
