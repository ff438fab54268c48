//! The physical node executors run: [`CascadeExec`], a certified cascade applied to each partition of its input.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use arrow::array::RecordBatch;
use arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{internal_err, DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties, SendableRecordBatchStream,
};
use futures::StreamExt;
use stretto::core::exec::CascadePlan;
use stretto::core::format::PlanFile;
use stretto::core::op::SemanticTask;
use stretto_sql::exec::{run_cascade, stretto_input};
use stretto_sql::node::PipelineSpec;

use crate::node::StageAnswers;

/// Where an executor notes each cascade task that ended without an error: one JSON line per partition
/// (`executor`, `partition`, `task`, `rows_in`, `rows_out`, `seconds`, and `ended`: `input` when it ran its whole
/// input, `fetch` when it stopped at its fetch, `dropped` when what read it stopped first, a cancelled task's
/// included), appended. Operators and tests read it to see which executor ran what.
#[derive(Debug, Clone)]
pub struct TaskLog {
    executor: String,
    path: PathBuf,
    file: Arc<Mutex<Option<std::fs::File>>>,
}

impl TaskLog {
    /// The log of executor `executor` at `path` (created on the first task).
    pub fn new(executor: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        Self { executor: executor.into(), path: path.into(), file: Arc::new(Mutex::new(None)) }
    }

    /// The log's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn note(&self, task: Option<&str>, partition: usize, done: (usize, usize, f64), ended: &str) {
        let (rows_in, rows_out, seconds) = done;
        let line = serde_json::json!({
            "executor": self.executor, "task": task, "partition": partition, "rows_in": rows_in,
            "rows_out": rows_out, "seconds": seconds, "ended": ended,
        });
        let mut guard = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            match std::fs::OpenOptions::new().create(true).append(true).open(&self.path) {
                Ok(f) => *guard = Some(f),
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), error = %e, "cannot open the task log");
                    return;
                }
            }
        }
        if let Some(f) = guard.as_mut() {
            // One write per line: lines of concurrent tasks never interleave.
            if let Err(e) = f.write_all(format!("{line}\n").as_bytes()) {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot write the task log");
            }
        }
    }
}

/// What every chunk of one partition's cascade needs.
struct PartitionRun {
    cascade: Arc<CascadePlan>,
    input_schema: SchemaRef,
    names: Vec<String>,
    maps: Vec<String>,
    output: SchemaRef,
    partition: usize,
    batch_rows: usize,
    fetch: Option<usize>,
    executed: Count,
    out_rows: Count,
}

/// Where a partition's cascade stands: its input, the rest of the input batch it is in, the size of its next chunk,
/// what it has done so far, how it ended, and where to note the task when its stream is dropped (unless it failed).
struct Chunks {
    run: Arc<PartitionRun>,
    input: SendableRecordBatchStream,
    pending: Option<RecordBatch>,
    chunk: usize,
    emitted: usize,
    rows_in: usize,
    seconds: f64,
    failed: bool,
    /// `input` or `fetch` once the stream has ended by itself.
    ended: Option<&'static str>,
    log: Option<(TaskLog, Option<String>)>,
}

impl Chunks {
    /// The cascade's output on the next chunk of the input (`None` at the end of the input or of the fetch). A
    /// chunk never spans two input batches.
    async fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        let run = self.run.clone();
        if run.fetch.is_some_and(|k| self.emitted >= k) {
            self.ended = Some("fetch");
            return Ok(None);
        }
        let batch = loop {
            match self.pending.take() {
                Some(b) if b.num_rows() > 0 => break b,
                Some(_) => {}
                None => match self.input.next().await {
                    Some(b) => self.pending = Some(b?),
                    None => {
                        self.ended = Some("input");
                        return Ok(None);
                    }
                },
            }
        };
        let rows = self.chunk.min(batch.num_rows());
        let chunk = batch.slice(0, rows);
        if rows < batch.num_rows() {
            self.pending = Some(batch.slice(rows, batch.num_rows() - rows));
        }
        let r = run.clone();
        let (out, secs) = tokio::task::spawn_blocking(move || {
            let _span = tracing::info_span!("cluster_cascade", partition = r.partition, rows).entered();
            let t0 = std::time::Instant::now();
            let input = stretto_input(&r.input_schema, &r.names, &chunk)?;
            let (batch, _) = run_cascade(&r.cascade, &input, &r.names, &r.maps, &r.output, None)?;
            Ok::<_, stretto::Error>((batch, t0.elapsed().as_secs_f64()))
        })
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)))?
        .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let out = match run.fetch {
            Some(k) if self.emitted + out.num_rows() > k => out.slice(0, k - self.emitted),
            _ => out,
        };
        run.executed.add(rows);
        run.out_rows.add(out.num_rows());
        self.rows_in += rows;
        self.seconds += secs;
        self.emitted += out.num_rows();
        if run.fetch.is_some_and(|k| self.emitted >= k) {
            // Done, whether or not the reader polls again.
            self.ended = Some("fetch");
        }
        self.chunk = self.chunk.saturating_mul(2).min(run.batch_rows);
        Ok(Some(out))
    }
}

impl Drop for Chunks {
    fn drop(&mut self) {
        // A failed task is not noted (it runs again elsewhere, or the query fails), nor one unwinding from a panic.
        if self.failed || std::thread::panicking() {
            return;
        }
        if let Some((log, task)) = &self.log {
            let done = (self.rows_in, self.emitted, self.seconds);
            log.note(task.as_deref(), self.run.partition, done, self.ended.unwrap_or("dropped"));
        }
    }
}

/// What an executor needs to run cascades: the Stretto session whose operators the plans name, and where to note
/// its tasks.
#[derive(Debug, Clone)]
pub struct ExecutorResources {
    /// Operators, model pool, KV store and memo of this executor.
    pub session: stretto::Session,
    /// Where finished tasks are noted, if anywhere.
    pub task_log: Option<TaskLog>,
}

/// Runs a certified cascade on every partition of its input, independently: no profiling, no optimization, no
/// exchange between partitions. Rows keep their partition and order; output is the input's columns and then one
/// column per map. With a fetch (a `LIMIT` DataFusion pushed into it) each partition stops once it has produced
/// that many rows, asking its operators about a few more tuples than it needs at first and twice as many each time
/// after (as the single-process pipeline does).
pub struct CascadeExec {
    input: Arc<dyn ExecutionPlan>,
    spec: Arc<PipelineSpec>,
    plan: Arc<PlanFile>,
    tasks: Arc<Vec<SemanticTask>>,
    input_names: Vec<String>,
    answers: Arc<Vec<StageAnswers>>,
    fetch: Option<usize>,
    resources: Option<ExecutorResources>,
    bound: Arc<OnceLock<std::result::Result<Arc<CascadePlan>, String>>>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl CascadeExec {
    /// The cascade `plan` (stages naming `tasks`) over `input`, whose columns Stretto reads as `input_names`.
    /// Without `resources` the node can be planned and shipped but not executed (a scheduler's copy).
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        spec: Arc<PipelineSpec>,
        plan: Arc<PlanFile>,
        tasks: Arc<Vec<SemanticTask>>,
        input_names: Vec<String>,
        resources: Option<ExecutorResources>,
    ) -> Result<Self> {
        let in_schema = input.schema();
        if in_schema.fields().len() != input_names.len() {
            return internal_err!(
                "CascadeExec: {} input columns but {} names",
                in_schema.fields().len(),
                input_names.len()
            );
        }
        let mut fields: Vec<Field> = in_schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.extend(spec.maps.iter().map(|m| Field::new(&m.field, m.value_type().data_type(), true)));
        let schema: SchemaRef = Arc::new(Schema::new(fields));
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema),
            input.output_partitioning().clone(),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(Self {
            input,
            spec,
            plan,
            tasks,
            input_names,
            answers: Arc::new(Vec::new()),
            fetch: None,
            resources,
            bound: Arc::new(OnceLock::new()),
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// The same cascade carrying `answers` the client knows (those its profiling paid for first): the executor
    /// takes them into its operators' memos when it binds the plan, and reads them rather than asking again.
    pub fn with_answers(mut self, answers: Arc<Vec<StageAnswers>>) -> Self {
        self.answers = answers;
        self
    }

    /// The answers travelling with the cascade.
    pub fn answers(&self) -> &Arc<Vec<StageAnswers>> {
        &self.answers
    }

    /// The same cascade stopping each partition after `fetch` result rows (`None`: every input row).
    pub fn with_partition_fetch(mut self, fetch: Option<usize>) -> Self {
        self.fetch = fetch;
        self
    }

    /// Filters, maps and settings.
    pub fn spec(&self) -> &Arc<PipelineSpec> {
        &self.spec
    }

    /// The certified plan.
    pub fn plan(&self) -> &Arc<PlanFile> {
        &self.plan
    }

    /// The logical operators.
    pub fn tasks(&self) -> &Arc<Vec<SemanticTask>> {
        &self.tasks
    }

    /// Stretto's names of the input columns.
    pub fn input_names(&self) -> &[String] {
        &self.input_names
    }

    /// The plan bound to this process's operators (once per node).
    fn cascade(&self) -> Result<Arc<CascadePlan>> {
        let Some(res) = &self.resources else {
            return internal_err!(
                "CascadeExec runs on Stretto executors (stretto-executor); this process has no Stretto session"
            );
        };
        let bound = self.bound.get_or_init(|| {
            let registry = res.session.registry();
            let cascade = CascadePlan::bind(&self.plan, self.tasks.as_ref().clone(), |n| registry.get(n))
                .map_err(|e| format!("binding the certified plan to this executor's operators: {e}"))?;
            for shipped in self.answers.iter() {
                // Stages name their operators as the answers do; answers of a stage the plan lacks are ignored.
                if let Some(stage) = cascade.stages.iter().find(|s| s.physical == shipped.physical) {
                    let new = stage.op.remember(shipped.answers.clone());
                    tracing::debug!(stage = %shipped.physical, new, "answers from the client's profiling taken in");
                }
            }
            Ok(Arc::new(cascade))
        });
        bound.clone().map_err(DataFusionError::Execution)
    }
}

impl fmt::Debug for CascadeExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CascadeExec: {}", self.spec.describe())
    }
}

impl DisplayAs for CascadeExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let stages = self.plan.stages.iter().map(|s| s.physical.as_str()).collect::<Vec<_>>().join(" → ");
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                write!(f, "CascadeExec: {}; certified plan {stages}", self.spec.describe())?;
                match self.fetch {
                    Some(k) => write!(f, "; fetch {k} per partition"),
                    None => Ok(()),
                }
            }
            DisplayFormatType::TreeRender => write!(f, "{stages}"),
        }
    }
}

impl ExecutionPlan for CascadeExec {
    fn name(&self) -> &str {
        "CascadeExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
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
            return internal_err!("CascadeExec takes one input, got {}", children.len());
        }
        Ok(Arc::new(
            Self::try_new(
                children.swap_remove(0),
                self.spec.clone(),
                self.plan.clone(),
                self.tasks.clone(),
                self.input_names.clone(),
                self.resources.clone(),
            )?
            .with_answers(self.answers.clone())
            .with_partition_fetch(self.fetch),
        ))
    }

    fn fetch(&self) -> Option<usize> {
        self.fetch
    }

    /// A `LIMIT k` above the cascade becomes each partition's fetch: a partition stops once it has k rows (what
    /// merges the partitions above, DataFusion's limit or a merge with a fetch, still keeps k of them all).
    fn with_fetch(&self, limit: Option<usize>) -> Option<Arc<dyn ExecutionPlan>> {
        Some(Arc::new(Self {
            input: self.input.clone(),
            spec: self.spec.clone(),
            plan: self.plan.clone(),
            tasks: self.tasks.clone(),
            input_names: self.input_names.clone(),
            answers: self.answers.clone(),
            fetch: limit,
            resources: self.resources.clone(),
            bound: Arc::new(OnceLock::new()),
            properties: self.properties.clone(),
            metrics: ExecutionPlanMetricsSet::new(),
        }))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let cascade = self.cascade()?;
        let task = context.task_id();
        let input = self.input.execute(partition, context)?;
        let batch_rows = self.spec.options.batch_rows.max(1);
        let run = Arc::new(PartitionRun {
            cascade,
            input_schema: self.input.schema(),
            names: self.input_names.clone(),
            maps: self.spec.maps.iter().map(|m| m.column.clone()).collect(),
            output: self.schema(),
            partition,
            batch_rows,
            fetch: self.fetch,
            executed: MetricBuilder::new(&self.metrics).counter("tuples_executed", partition),
            out_rows: MetricBuilder::new(&self.metrics).output_rows(partition),
        });
        // With a fetch, the first chunk is twice the rows wanted and each next one twice the last (up to
        // batch_rows).
        let chunk = self.fetch.map_or(batch_rows, |k| k.saturating_mul(2).clamp(1, batch_rows));
        let log = self.resources.as_ref().and_then(|r| r.task_log.clone()).map(|l| (l, task));
        let state = Chunks {
            run,
            input,
            pending: None,
            chunk,
            emitted: 0,
            rows_in: 0,
            seconds: 0.0,
            failed: false,
            ended: None,
            log,
        };
        let stream = futures::stream::try_unfold(state, |mut st| async move {
            match st.next_batch().await {
                Ok(Some(batch)) => Ok(Some((batch, st))),
                Ok(None) => Ok(None),
                Err(e) => {
                    // Dropped here, unnoted.
                    st.failed = true;
                    drop(st);
                    Err(e)
                }
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema(), stream)))
    }
}
