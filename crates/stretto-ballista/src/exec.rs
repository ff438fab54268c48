//! The physical node executors run: [`CascadeExec`], a certified cascade applied to each partition of its input.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{internal_err, DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties, SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};
use stretto::core::exec::CascadePlan;
use stretto::core::format::PlanFile;
use stretto::core::op::SemanticTask;
use stretto_sql::exec::{run_cascade, stretto_input};
use stretto_sql::node::PipelineSpec;

use crate::node::StageAnswers;

/// Where an executor notes each cascade task it finished: one JSON line per partition (`executor`, `partition`,
/// `task`, `rows_in`, `rows_out`, `seconds`), appended. Operators and tests read it to see which executor ran what.
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

    fn note(&self, task: Option<&str>, partition: usize, rows_in: usize, rows_out: usize, seconds: f64) {
        let line = serde_json::json!({
            "executor": self.executor, "task": task, "partition": partition, "rows_in": rows_in,
            "rows_out": rows_out, "seconds": seconds,
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
/// column per map.
pub struct CascadeExec {
    input: Arc<dyn ExecutionPlan>,
    spec: Arc<PipelineSpec>,
    plan: Arc<PlanFile>,
    tasks: Arc<Vec<SemanticTask>>,
    input_names: Vec<String>,
    answers: Arc<Vec<StageAnswers>>,
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
                write!(f, "CascadeExec: {}; certified plan {stages}", self.spec.describe())
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
            .with_answers(self.answers.clone()),
        ))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let cascade = self.cascade()?;
        let task = context.task_id();
        let input = self.input.execute(partition, context)?;
        let input_schema = self.input.schema();
        let output = self.schema();
        let names = Arc::new(self.input_names.clone());
        let maps: Arc<Vec<String>> = Arc::new(self.spec.maps.iter().map(|m| m.column.clone()).collect());
        let batch_rows = self.spec.options.batch_rows.max(1);
        let executed = MetricBuilder::new(&self.metrics).counter("tuples_executed", partition);
        let out_rows = MetricBuilder::new(&self.metrics).output_rows(partition);
        let log = self.resources.as_ref().and_then(|r| r.task_log.clone());
        let totals = Arc::new(Mutex::new((0usize, 0usize, 0f64)));
        let totals_end = totals.clone();
        let schema = output.clone();
        let stream = input
            .map_ok(move |batch| {
                // The cascade runs `batch_rows` tuples at a time, like the single-process pipeline.
                let n = batch.num_rows();
                let chunks: Vec<_> =
                    (0..n).step_by(batch_rows).map(|s| batch.slice(s, batch_rows.min(n - s))).collect();
                futures::stream::iter(chunks.into_iter().map(Ok::<_, DataFusionError>))
            })
            .try_flatten()
            .and_then(move |chunk| {
                let (cascade, input_schema, names, maps, output) =
                    (cascade.clone(), input_schema.clone(), names.clone(), maps.clone(), output.clone());
                let (executed, out_rows, totals) = (executed.clone(), out_rows.clone(), totals.clone());
                async move {
                    let rows = chunk.num_rows();
                    let (batch, secs) = tokio::task::spawn_blocking(move || {
                        let _span = tracing::info_span!("cluster_cascade", partition, rows).entered();
                        let t0 = std::time::Instant::now();
                        let input = stretto_input(&input_schema, &names, &chunk)?;
                        let (batch, _) = run_cascade(&cascade, &input, &names, &maps, &output)?;
                        Ok::<_, stretto::Error>((batch, t0.elapsed().as_secs_f64()))
                    })
                    .await
                    .map_err(|e| DataFusionError::External(Box::new(e)))?
                    .map_err(|e| DataFusionError::External(Box::new(e)))?;
                    executed.add(rows);
                    out_rows.add(batch.num_rows());
                    let mut t = totals.lock().unwrap_or_else(|p| p.into_inner());
                    (t.0, t.1, t.2) = (t.0 + rows, t.1 + batch.num_rows(), t.2 + secs);
                    Ok(batch)
                }
            })
            .chain(
                futures::stream::once(async move {
                    // The partition is complete (a failed one is never polled this far): note the task.
                    if let Some(log) = log {
                        let t = *totals_end.lock().unwrap_or_else(|p| p.into_inner());
                        log.note(task.as_deref(), partition, t.0, t.1, t.2);
                    }
                })
                .filter_map(|()| futures::future::ready(None)),
            );
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}
