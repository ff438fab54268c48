//! The cascade executor: applies a `stretto.plan/v1` to a table, batch by batch.
//!
//! Semantics are exactly those of `docs/profile-format.md` §Plan. Every logical operator starts *unsure* and every
//! tuple *alive*. A stage only sees tuples that are alive and whose logical operator is still undecided; they pay
//! its cost. A filter stage accepts above `upper` (deciding the operator), rejects below `lower` (killing the
//! tuple) and leaves the rest unsure for later stages; a map stage decides the value when it has no thresholds or
//! its confidence exceeds `upper`. A tuple is in the result iff it is alive and every logical operator is decided.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray, UInt32Array};
use arrow::compute::{take, take_record_batch};
use arrow::datatypes::{Field, Schema};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::error::{CoreError, Result};
use crate::format::PlanFile;
use crate::op::{LogicalKind, OpOutput, RegisteredOp, SemanticTask, ValueType};

/// A plan stage bound to a live operator.
#[derive(Debug, Clone)]
pub struct BoundStage {
    /// `logical/implementation`.
    pub physical: String,
    /// Index of its logical operator in [`CascadePlan::tasks`].
    pub logical: usize,
    /// The operator.
    pub op: Arc<RegisteredOp>,
    /// Reject below (filters).
    pub lower: Option<f64>,
    /// Accept / decide above.
    pub upper: Option<f64>,
}

/// What one stage does to one tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The logical operator is decided (filter passed, or map value taken).
    Accept,
    /// The tuple dies.
    Reject,
    /// Passed on to the next stage of the same logical operator.
    Unsure,
}

/// The decision rule of a filter stage (a stage without thresholds applies the gold rule, `0`/`0`).
pub fn filter_decision(score: f64, lower: Option<f64>, upper: Option<f64>) -> Decision {
    if score > upper.unwrap_or(0.0) {
        Decision::Accept
    } else if score < lower.unwrap_or(0.0) {
        Decision::Reject
    } else {
        Decision::Unsure
    }
}

/// The decision rule of a map stage: take the value unless a threshold asks for more confidence.
pub fn map_decision(confidence: f64, upper: Option<f64>) -> Decision {
    match upper {
        None => Decision::Accept,
        Some(u) if confidence > u => Decision::Accept,
        Some(_) => Decision::Unsure,
    }
}

/// The semantic pipeline of a query bound to operators, ready to execute.
#[derive(Debug, Clone)]
pub struct CascadePlan {
    /// Logical operators.
    pub tasks: Vec<SemanticTask>,
    /// Stages in execution order.
    pub stages: Vec<BoundStage>,
}

impl CascadePlan {
    /// Binds a plan file's stages to operators.
    ///
    /// `resolve` maps an implementation name (the part after `/`) to an operator, usually `Registry::get`.
    /// Every stage must name one of `tasks`, with an operator of the task's kind, and every task needs a stage.
    pub fn bind(
        plan: &PlanFile,
        tasks: Vec<SemanticTask>,
        resolve: impl Fn(&str) -> Result<Arc<RegisteredOp>>,
    ) -> Result<Self> {
        let known = || tasks.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ");
        let mut stages = Vec::with_capacity(plan.stages.len());
        for s in &plan.stages {
            let (logical, implementation) = s.split()?;
            let idx = tasks.iter().position(|t| t.name == logical).ok_or_else(|| CoreError::UnknownStage {
                stage: s.physical.clone(),
                logical: logical.to_string(),
                known: known(),
            })?;
            let op = resolve(implementation)?;
            if op.properties().kind != tasks[idx].kind {
                return Err(CoreError::InvalidPlan {
                    context: format!("stage `{}`", s.physical),
                    message: format!(
                        "operator `{}` is a {} but `{logical}` is a {}",
                        op.name(),
                        op.properties().kind,
                        tasks[idx].kind
                    ),
                });
            }
            stages.push(BoundStage { physical: s.physical.clone(), logical: idx, op, lower: s.lower, upper: s.upper });
        }
        if let Some(t) = tasks.iter().enumerate().find(|(i, _)| !stages.iter().any(|s| s.logical == *i)).map(|(_, t)| t)
        {
            return Err(CoreError::InvalidPlan {
                context: format!("logical operator `{}`", t.name),
                message: "no stage implements it, so every tuple would be left out".into(),
            });
        }
        Ok(Self { tasks, stages })
    }
}

/// Per-stage counts and time.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct StageStats {
    /// `logical/implementation`.
    pub physical: String,
    /// Tuples that reached the stage (alive and undecided).
    pub tuples_in: usize,
    /// Tuples it decided (filter accepted or map value taken).
    pub accepted: usize,
    /// Tuples it killed.
    pub rejected: usize,
    /// Tuples it passed on.
    pub unsure: usize,
    /// Wall time spent in the operator.
    pub seconds: f64,
    /// The operator's own account of the tuples' cost (memoised answers count what computing them cost).
    pub cost_seconds: f64,
    /// The part of `cost_seconds` spent on tuples whose answers from this operator the same query had already
    /// paid for (in profiling, [`CascadeExecutor::with_paid`]): execution reads those from the memo, so an
    /// end-to-end account counts them once.
    pub reused_seconds: f64,
    /// How many of `tuples_in` those were: tuples whose answers from this operator the same query had already paid
    /// for, which execution read from the memo rather than computed.
    pub reused: usize,
}

/// What executing a cascade produced.
#[derive(Debug, Clone)]
pub struct CascadeOutput {
    /// The result rows, with one extra column per map.
    pub batch: RecordBatch,
    /// Row indices of the result in the input table.
    pub rows: Vec<usize>,
    /// Per-stage statistics, in stage order.
    pub stats: Vec<StageStats>,
    /// Input rows the cascade went through: every row, unless a [fetch](CascadeExecutor::with_fetch) stopped it
    /// early (then the first `executed` rows).
    pub executed: usize,
}

/// Runs cascade plans over tables.
#[derive(Debug, Clone)]
pub struct CascadeExecutor {
    batch_size: usize,
    progress: bool,
    paid: Option<std::sync::Arc<PaidAnswers>>,
    fetch: Option<usize>,
}

/// Which (operator, input row) answers a query already paid for before execution (its profiling sample and
/// screening tuples), keyed by the stage's `logical/implementation` name: the executor books their cost as
/// [`StageStats::reused_seconds`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PaidAnswers {
    /// Ordered, so that a slice's answers ([`PaidAnswers::window`]) are a range, not a scan of every paid row.
    rows: std::collections::HashMap<String, std::collections::BTreeSet<usize>>,
}

impl PaidAnswers {
    /// Records that `physical` (`logical/implementation`) answered the input rows `rows`.
    pub fn add(&mut self, physical: &str, rows: impl IntoIterator<Item = usize>) {
        self.rows.entry(physical.to_string()).or_default().extend(rows);
    }

    /// Whether `physical` answered input row `row`.
    pub fn contains(&self, physical: &str, row: usize) -> bool {
        self.rows.get(physical).is_some_and(|r| r.contains(&row))
    }

    /// The answers on input rows `start..end`, numbered from `start` (row `start` becomes 0): what an executor given
    /// that slice of the input books as paid for.
    pub fn window(&self, start: usize, end: usize) -> Self {
        let rows = self
            .rows
            .iter()
            .map(|(p, r)| (p.clone(), r.range(start..end.max(start)).map(|r| r - start).collect()))
            .collect();
        Self { rows }
    }
}

impl Default for CascadeExecutor {
    fn default() -> Self {
        Self { batch_size: 64, progress: std::io::stderr().is_terminal(), paid: None, fetch: None }
    }
}

impl CascadeExecutor {
    /// An executor with batches of `batch_size` tuples (at least 1) and a progress bar when stderr is a terminal.
    pub fn new(batch_size: usize) -> Self {
        Self { batch_size: batch_size.max(1), ..Self::default() }
    }

    /// Forces the progress bar on or off.
    pub fn with_progress(mut self, on: bool) -> Self {
        self.progress = on;
        self
    }

    /// Books the cost of answers already paid for (row indices of the input given to
    /// [`execute`](Self::execute)) as [`StageStats::reused_seconds`].
    pub fn with_paid(mut self, paid: std::sync::Arc<PaidAnswers>) -> Self {
        self.paid = Some(paid);
        self
    }

    /// Stops once `fetch` result rows are known: rows are executed in order, a batch of tuples through every stage
    /// before the next (the first batch twice `fetch`, each next one twice the last, up to the batch size), so the
    /// result is the first `fetch` result rows of the whole input, and the rows after the batch that completed them
    /// are never asked about.
    pub fn with_fetch(mut self, fetch: usize) -> Self {
        self.fetch = Some(fetch);
        self
    }

    /// Applies `plan` to every row of `input` (or, with a fetch, to the rows in order until it is met).
    pub fn execute(&self, plan: &CascadePlan, input: &RecordBatch) -> Result<CascadeOutput> {
        let n = input.num_rows();
        let span = tracing::info_span!("cascade", rows = n, stages = plan.stages.len());
        let _enter = span.enter();
        for t in &plan.tasks {
            t.resolve(&input.schema())?;
        }
        let n_ops = plan.tasks.len();
        let mut alive = vec![true; n];
        let mut decided = vec![false; n * n_ops];
        let mut values: Vec<Vec<Option<String>>> = vec![vec![None; n]; n_ops];
        let mut stats: Vec<StageStats> =
            plan.stages.iter().map(|s| StageStats { physical: s.physical.clone(), ..Default::default() }).collect();

        let bar = if self.progress {
            ProgressBar::new(n as u64)
        } else {
            ProgressBar::with_draw_target(Some(n as u64), ProgressDrawTarget::hidden())
        };
        bar.set_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} tuples ({eta})")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_message("executing");

        let complete =
            |alive: &[bool], decided: &[bool], r: usize| alive[r] && (0..n_ops).all(|l| decided[r * n_ops + l]);
        let (mut executed, mut found) = (n, 0usize);
        // With a fetch, the first batch is twice the rows wanted and each next one twice the last (up to the batch
        // size), as SQL's chunks are: a limit of 5 over a filter that keeps half its input stops after about 10
        // tuples, not after a whole batch.
        let mut size = self.fetch.map_or(self.batch_size, |k| k.saturating_mul(2).clamp(1, self.batch_size));
        let mut start = 0;
        while start < n {
            if self.fetch.is_some_and(|k| found >= k) {
                executed = start;
                break;
            }
            let end = (start + size).min(n);
            size = size.saturating_mul(2).min(self.batch_size);
            for (si, stage) in plan.stages.iter().enumerate() {
                let rows: Vec<usize> =
                    (start..end).filter(|&r| alive[r] && !decided[r * n_ops + stage.logical]).collect();
                if rows.is_empty() {
                    continue;
                }
                let sub = take_record_batch(input, &UInt32Array::from_iter_values(rows.iter().map(|&r| r as u32)))
                    .map_err(|e| CoreError::arrow(format!("selecting tuples for stage {}", stage.physical), e))?;
                let task = &plan.tasks[stage.logical];
                let t0 = Instant::now();
                let out = {
                    let _s = tracing::debug_span!("stage", physical = %stage.physical, tuples = rows.len()).entered();
                    stage.op.evaluate_timed(task, &sub)?
                };
                let (out, costs) = out;
                let st = &mut stats[si];
                st.seconds += t0.elapsed().as_secs_f64();
                st.cost_seconds += costs.iter().sum::<f64>();
                if let Some(paid) = &self.paid {
                    for (_, c) in rows.iter().zip(&costs).filter(|(&r, _)| paid.contains(&stage.physical, r)) {
                        st.reused_seconds += c;
                        st.reused += 1;
                    }
                }
                st.tuples_in += rows.len();
                if out.len() != rows.len() {
                    return Err(CoreError::operator(
                        stage.op.name(),
                        format!("returned {} outputs for {} tuples", out.len(), rows.len()),
                    ));
                }
                match (task.kind, out) {
                    (LogicalKind::Filter, OpOutput::Scores(scores)) => {
                        for (&r, &s) in rows.iter().zip(&scores) {
                            match filter_decision(s, stage.lower, stage.upper) {
                                Decision::Accept => {
                                    decided[r * n_ops + stage.logical] = true;
                                    st.accepted += 1;
                                }
                                Decision::Reject => {
                                    alive[r] = false;
                                    st.rejected += 1;
                                }
                                Decision::Unsure => st.unsure += 1,
                            }
                        }
                    }
                    (LogicalKind::Map, OpOutput::Values { values: vals, confidences }) => {
                        if confidences.len() != vals.len() {
                            return Err(CoreError::operator(stage.op.name(), "returned fewer confidences than values"));
                        }
                        for ((&r, v), &c) in rows.iter().zip(vals).zip(&confidences) {
                            if map_decision(c, stage.upper) == Decision::Accept {
                                decided[r * n_ops + stage.logical] = true;
                                values[stage.logical][r] = v;
                                st.accepted += 1;
                            } else {
                                st.unsure += 1;
                            }
                        }
                    }
                    (kind, _) => {
                        return Err(CoreError::operator(
                            stage.op.name(),
                            format!("returned the wrong output kind for a {kind}"),
                        ))
                    }
                }
            }
            if self.fetch.is_some() {
                found += (start..end).filter(|&r| complete(&alive, &decided, r)).count();
            }
            bar.inc((end - start) as u64);
            start = end;
        }
        bar.finish_and_clear();

        let mut rows: Vec<usize> = (0..executed).filter(|&r| complete(&alive, &decided, r)).collect();
        if let Some(k) = self.fetch {
            rows.truncate(k);
        }
        let batch = self.assemble(plan, input, &rows, &values)?;
        for s in &stats {
            tracing::info!(stage = %s.physical, tuples_in = s.tuples_in, accepted = s.accepted, rejected = s.rejected, unsure = s.unsure, seconds = s.seconds, "stage done");
        }
        if executed < n {
            tracing::info!(executed, rows = n, fetch = self.fetch, "stopped early: the fetch was met");
        }
        Ok(CascadeOutput { batch, rows, stats, executed })
    }

    /// Takes the result rows and appends one typed column per map.
    fn assemble(
        &self,
        plan: &CascadePlan,
        input: &RecordBatch,
        rows: &[usize],
        values: &[Vec<Option<String>>],
    ) -> Result<RecordBatch> {
        let idx = UInt32Array::from_iter_values(rows.iter().map(|&r| r as u32));
        let mut fields: Vec<Field> = input.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(fields.len() + plan.tasks.len());
        for c in input.columns() {
            columns.push(take(c, &idx, None).map_err(|e| CoreError::arrow("assembling result", e))?);
        }
        for (l, task) in plan.tasks.iter().enumerate() {
            let Some((name, ty)) = &task.output else { continue };
            let cells: Vec<Option<&str>> = rows.iter().map(|&r| values[l][r].as_deref()).collect();
            fields.push(Field::new(name, ty.data_type(), true));
            columns.push(typed_column(name, *ty, &cells));
        }
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
            .map_err(|e| CoreError::arrow("assembling result", e))
    }
}

/// Converts extracted strings to the map's type; a value that does not parse becomes null, with a warning,
/// rather than failing the whole query.
fn typed_column(name: &str, ty: ValueType, cells: &[Option<&str>]) -> ArrayRef {
    let warn = |v: &str| tracing::warn!(column = name, value = v, "map value does not parse as {ty:?}; stored as null");
    match ty {
        ValueType::String => Arc::new(StringArray::from(cells.to_vec())),
        ValueType::Integer => Arc::new(
            cells
                .iter()
                .map(|c| {
                    c.and_then(|v| {
                        v.trim().parse::<i64>().ok().or_else(|| {
                            warn(v);
                            None
                        })
                    })
                })
                .collect::<Int64Array>(),
        ),
        ValueType::Float => Arc::new(
            cells
                .iter()
                .map(|c| {
                    c.and_then(|v| {
                        v.trim().parse::<f64>().ok().or_else(|| {
                            warn(v);
                            None
                        })
                    })
                })
                .collect::<Float64Array>(),
        ),
        ValueType::Boolean => Arc::new(
            cells
                .iter()
                .map(|c| {
                    c.and_then(|v| match v.trim().to_ascii_lowercase().as_str() {
                        "true" | "yes" | "1" => Some(true),
                        "false" | "no" | "0" => Some(false),
                        _ => {
                            warn(v);
                            None
                        }
                    })
                })
                .collect::<BooleanArray>(),
        ),
    }
}

impl CascadeOutput {
    /// Total operator seconds over all stages.
    pub fn seconds(&self) -> f64 {
        self.stats.iter().map(|s| s.seconds).sum()
    }

    /// Number of result rows.
    pub fn len(&self) -> usize {
        self.batch.num_rows()
    }

    /// Whether the result is empty.
    pub fn is_empty(&self) -> bool {
        self.batch.num_rows() == 0
    }
}
