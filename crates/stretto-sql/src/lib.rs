//! # stretto-sql
//!
//! SQL over a Stretto [`Session`](stretto::Session), on Apache DataFusion. Semantic functions sit in ordinary SQL:
//!
//! - `sem_filter('<predicate naming {table.column}s>')` in WHERE (AND-ed with other conditions) or in the ON clause
//!   of an inner join (a semantic join);
//! - `sem_map('<instruction naming {table.column}s>' [, 'text' | 'integer' | 'float' | 'boolean'])` in the SELECT
//!   list, GROUP BY, HAVING, ORDER BY or a WHERE comparison (where the block groups, a HAVING or ORDER BY call must
//!   also be in the SELECT list or GROUP BY: the pipeline runs on the rows before grouping).
//!
//! Every semantic call of a query becomes **one** Stretto pipeline (an extension node of DataFusion's plan, placed
//! by [`SemanticPipelineRule`]): relational filters and joins run below it, aggregates, ordering and LIMIT above. The
//! pipeline is profiled on the session's seeded sample, optimized under the query's precision/recall targets
//! (`SET stretto.precision = 0.8`, `stretto.recall`, `stretto.credible`, `stretto.method`) and executed as the
//! certified cascade by [`SemanticPipelineExec`], a batch at a time, so a LIMIT stops it early.
//! `EXPLAIN` shows the relational plan and the pipeline; `EXPLAIN ANALYZE` runs the query and shows, on the
//! pipeline's line, the certified cascade (stages with their decision rules), its bounds and the tuples skipped.
//! A semantic call over a row where a column it names is NULL is answered as SQL answers a predicate or function of
//! NULL, without asking a model: `sem_filter` does not keep the row (nor a semantic join the pair), `sem_map` is NULL
//! (an image column excepted: its NULL is a tuple without an image). `COALESCE` in a subquery asks about a default.
//!
//! ```no_run
//! use stretto::Session;
//! use stretto_sql::SqlContext;
//!
//! let session = Session::builder("/var/cache/stretto").build()?;
//! session.register_csv("reviews", "reviews.csv", &Default::default())?;
//! let ctx = SqlContext::new(&session)?;
//! ctx.sql("SET stretto.recall = 0.8")?;
//! let result = ctx
//!     .sql(
//!         "SELECT reviewtext, sem_map('The movie title named in {reviews.reviewtext}') AS title
//!          FROM reviews
//!          WHERE istopcritic AND sem_filter('{reviews.reviewtext} is clearly positive')
//!          LIMIT 5",
//!     )?
//!     .collect()?;
//! println!("{}", result.to_pretty()?);
//! for run in result.pipelines() {
//!     println!("{}", run.summary());
//! }
//! # Ok::<(), stretto_sql::SqlError>(())
//! ```
//!
//! The API is synchronous like Stretto's `DataFrame` (it owns a small Tokio runtime, [`QueryRuntime`]) and may be
//! called from async code too (it then blocks the calling task's thread while the query runs); async code can also
//! use the DataFusion context itself ([`SqlContext::datafusion`]).

#![warn(missing_docs)]

pub mod exec;
pub mod functions;
pub mod node;
pub mod options;
pub mod rewrite;
mod schema;

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::error::DataFusionError;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{SessionConfig, SessionContext};

pub use exec::{PipelineRun, RunLog, SemanticPipelineExec, SemanticPlanner, StrettoQueryPlanner};
pub use node::SemanticPipelineNode;
pub use options::StrettoOptions;
pub use rewrite::SemanticPipelineRule;

/// What can go wrong running SQL.
#[derive(Debug, thiserror::Error)]
pub enum SqlError {
    /// Parsing, planning or executing the query (a bad query names its offending part).
    #[error(transparent)]
    DataFusion(#[from] DataFusionError),
    /// Stretto's own work: models, operators, the optimizer, reading files.
    #[error(transparent)]
    Stretto(#[from] stretto::Error),
    /// The runtime that drives DataFusion (or the thread it needs inside another runtime) could not start.
    #[error("cannot start the query runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

/// A result of this crate.
pub type Result<T, E = SqlError> = std::result::Result<T, E>;

/// The name of [`SemanticPipelineRule`], the analyzer rule that gathers the semantic functions.
const RULE_NAME: &str = "stretto_semantic_pipeline";

impl SqlError {
    /// A DataFusion error, with Stretto's own errors inside it brought back out as themselves.
    pub fn from_datafusion(e: DataFusionError) -> Self {
        unwrap_df(e)
    }
}

/// Stretto's errors come back out of DataFusion as themselves, so callers can match on them.
fn unwrap_df(e: DataFusionError) -> SqlError {
    match e {
        DataFusionError::External(b) => match b.downcast::<stretto::Error>() {
            Ok(s) => SqlError::Stretto(*s),
            Err(b) => SqlError::DataFusion(DataFusionError::External(b)),
        },
        // DataFusion labels an analyzer rule's error with the rule's name, which says nothing to a user: the error
        // itself names the semantic function at fault.
        DataFusionError::Context(c, inner) if c == RULE_NAME => unwrap_df(*inner),
        DataFusionError::Context(c, inner) => match unwrap_df(*inner) {
            SqlError::DataFusion(d) => SqlError::DataFusion(DataFusionError::Context(c, Box::new(d))),
            other => other,
        },
        other => SqlError::DataFusion(other),
    }
}

/// Teaches a DataFusion context Stretto's SQL: the semantic functions and the rule that gathers them into one
/// pipeline. The context's configuration needs the [`StrettoOptions`] extension.
pub fn install(ctx: &SessionContext) {
    ctx.add_analyzer_rule(Arc::new(SemanticPipelineRule));
    for udf in functions::udfs() {
        ctx.register_udf(udf);
    }
}

/// The `stretto.*` settings of `ctx` as they stand (after any `SET`).
pub fn options_of(ctx: &SessionContext) -> StrettoOptions {
    ctx.state().config().options().extensions.get::<StrettoOptions>().cloned().unwrap_or_default()
}

/// The statements of `sql` (one or more, separated by `;`), parsed with the dialect and limits of `state`; no
/// statement at all is an error.
pub fn parse_statements(
    state: &datafusion::execution::session_state::SessionState,
    sql: &str,
) -> Result<std::collections::VecDeque<datafusion::sql::parser::Statement>> {
    let options = state.config().options();
    let name = options.sql_parser.dialect;
    let dialect = datafusion::sql::sqlparser::dialect::dialect_from_str(name)
        .ok_or_else(|| SqlError::DataFusion(DataFusionError::Plan(format!("unsupported SQL dialect {name}"))))?;
    let statements = datafusion::sql::parser::DFParserBuilder::new(sql)
        .with_dialect(dialect.as_ref())
        .with_recursion_limit(options.sql_parser.recursion_limit.get())
        .build()
        .and_then(|mut p| p.parse_statements())
        .map_err(SqlError::DataFusion)?;
    if statements.is_empty() {
        return Err(SqlError::DataFusion(DataFusionError::Plan("the SQL text holds no statement".into())));
    }
    Ok(statements)
}

/// The small Tokio runtime a synchronous SQL front end drives DataFusion with (see [`query_runtime`]).
///
/// Its synchronous calls work from plain code and from inside another Tokio runtime alike (a `#[tokio::main]`
/// program, an async web handler): there, where `Runtime::block_on` would panic, the work runs on a thread of its
/// own while the caller's thread waits, as any blocking call makes it wait. Dropping it inside an async context does
/// not panic either (it shuts down in the background).
#[derive(Debug)]
pub struct QueryRuntime {
    runtime: Option<tokio::runtime::Runtime>,
}

impl QueryRuntime {
    /// Runs `future` to completion on this runtime and returns its output; `Err` only when the thread it needs
    /// (inside another runtime) cannot start.
    pub fn block_on<F>(&self, future: F) -> std::io::Result<F::Output>
    where
        F: std::future::Future + Send,
        F::Output: Send,
    {
        let runtime = self.runtime.as_ref().expect("the runtime lives until the value is dropped");
        if tokio::runtime::Handle::try_current().is_err() {
            return Ok(runtime.block_on(future));
        }
        // Inside a runtime this thread may not block on another one: a scoped thread (which may borrow what the
        // future borrows) does, and this one waits for it.
        std::thread::scope(|scope| {
            let worker = std::thread::Builder::new()
                .name("stretto-sql-block-on".into())
                .spawn_scoped(scope, || runtime.block_on(future))?;
            Ok(worker.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
        })
    }
}

impl Drop for QueryRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                // Dropping a runtime where blocking is not allowed panics; this does not wait.
                runtime.shutdown_background();
            }
        }
    }
}

/// The small Tokio runtime a synchronous SQL front end drives DataFusion with: two worker threads named
/// `thread_name`.
pub fn query_runtime(thread_name: &str) -> std::io::Result<Arc<QueryRuntime>> {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name(thread_name).enable_all().build()?;
    Ok(Arc::new(QueryRuntime { runtime: Some(runtime) }))
}

/// SQL over a Stretto session: DataFusion with the semantic functions, the pipeline rule and planner, the
/// session's registered tables (schema `public`) and every bundled dataset as a schema (`movie.reviews`).
pub struct SqlContext {
    session: stretto::Session,
    ctx: SessionContext,
    runtime: Arc<QueryRuntime>,
    log: RunLog,
}

impl std::fmt::Debug for SqlContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlContext").field("session", &self.session).finish_non_exhaustive()
    }
}

impl SqlContext {
    /// A SQL context over `session`: its tables as registered now (later ones: [`Self::register_batch`]).
    ///
    /// DataFusion runs with one target partition, so results keep their input order and a LIMIT can stop the
    /// semantic pipeline early (`SET datafusion.execution.target_partitions` changes it).
    pub fn new(session: &stretto::Session) -> Result<Self> {
        let mut config = SessionConfig::new().with_target_partitions(1).with_information_schema(true);
        config.options_mut().extensions.insert(StrettoOptions::default());
        let planner = StrettoQueryPlanner::new(session.clone());
        let log = planner.log();
        let state = SessionStateBuilder::new()
            .with_config(config)
            .with_default_features()
            .with_query_planner(Arc::new(planner))
            .build();
        let ctx = SessionContext::new_with_state(state);
        install(&ctx);
        for (name, batch) in session.tables() {
            ctx.register_batch(&name, batch)?;
        }
        schema::register_bundled(&ctx)?;
        let runtime = query_runtime("stretto-sql").map_err(SqlError::Runtime)?;
        Ok(Self { session: session.clone(), ctx, runtime, log })
    }

    /// The Stretto session.
    pub fn session(&self) -> &stretto::Session {
        &self.session
    }

    /// The DataFusion context (for async use, more tables, other functions).
    pub fn datafusion(&self) -> &SessionContext {
        &self.ctx
    }

    /// The `stretto.*` settings as they stand (after any `SET`).
    pub fn options(&self) -> StrettoOptions {
        options_of(&self.ctx)
    }

    /// Registers `batch` as table `name`, in the Stretto session too.
    pub fn register_batch(&self, name: &str, batch: RecordBatch) -> Result<()> {
        self.session.register_batch(name, batch.clone())?;
        self.ctx.deregister_table(name)?;
        self.ctx.register_batch(name, batch)?;
        Ok(())
    }

    /// Reads a CSV, TSV, Parquet or NDJSON file (by extension) with Stretto's readers and registers it as `name`.
    pub fn register_file(&self, name: &str, path: impl AsRef<std::path::Path>) -> Result<()> {
        self.register_file_with(name, path, &Default::default())
    }

    /// [`register_file`](Self::register_file) with read options: the columns that hold images, which the image
    /// operators then judge.
    pub fn register_file_with(
        &self,
        name: &str,
        path: impl AsRef<std::path::Path>,
        options: &stretto::io::ReadOptions,
    ) -> Result<()> {
        let batch = stretto::io::read_path_with(path.as_ref(), options)?;
        self.register_batch(name, batch)
    }

    /// Plans `sql` (one statement, or several separated by `;`: each runs in turn, and the last one's result is
    /// returned). `SET` and DDL statements take effect at once, and so does an `INSERT` or `COPY` before the last
    /// statement; a query before the last is refused (nothing would return its result). The last statement is
    /// checked (semantic functions included) but runs only when collected. The semantic pipelines that statements
    /// before it ran (`CREATE TABLE ... AS SELECT ... sem_filter(...)`) are reported in the result's [`pipelines`](SqlResult::pipelines) too.
    pub fn sql(&self, sql: &str) -> Result<SqlFrame> {
        let statements = parse_statements(&self.ctx.state(), sql)?;
        self.log.clear();
        let mut last = None;
        let count = statements.len();
        for (i, statement) in statements.into_iter().enumerate() {
            let frame = self.runtime.block_on(async {
                let plan = self.ctx.state().statement_to_plan(statement).await?;
                if i + 1 == count {
                    return Ok(Some(self.ctx.execute_logical_plan(plan).await?));
                }
                // Before the last statement: SET and DDL take effect when planned, an INSERT or COPY when collected,
                // and a query's result nothing would return.
                let dml = matches!(plan, LogicalPlan::Dml(_) | LogicalPlan::Copy(_));
                if !dml && !matches!(plan, LogicalPlan::Ddl(_) | LogicalPlan::Statement(_)) {
                    return Err(DataFusionError::Plan(format!(
                        "statement {} of {count} is a query, and only the last statement's result is returned: run it \
                         on its own, or make it a CREATE TABLE ... AS or an INSERT",
                        i + 1
                    )));
                }
                let frame = self.ctx.execute_logical_plan(plan).await?;
                if dml {
                    frame.collect().await?;
                }
                Ok(None)
            });
            if let Some(frame) = frame.map_err(SqlError::Runtime)?.map_err(unwrap_df)? {
                last = Some(frame);
            }
        }
        let df = last.expect("at least one statement");
        let earlier = self.log.runs();
        // Analysis now, so a misplaced semantic function is reported before anything runs.
        self.ctx.state().optimize(df.logical_plan()).map_err(unwrap_df)?;
        Ok(SqlFrame { df, runtime: self.runtime.clone(), earlier })
    }
}

/// A planned statement; [`collect`](Self::collect) runs it.
pub struct SqlFrame {
    df: datafusion::dataframe::DataFrame,
    runtime: Arc<QueryRuntime>,
    /// Pipelines the statements before this one ran.
    earlier: Vec<PipelineRun>,
}

impl std::fmt::Debug for SqlFrame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlFrame").field("plan", self.df.logical_plan()).finish_non_exhaustive()
    }
}

impl SqlFrame {
    /// The output schema.
    pub fn schema(&self) -> SchemaRef {
        Arc::new(self.df.schema().as_arrow().clone())
    }

    /// The optimized logical plan and the physical plan, as EXPLAIN shows them.
    pub fn explain(&self) -> Result<String> {
        let state = self.df.clone().into_parts().0;
        let logical = state.optimize(self.df.logical_plan()).map_err(unwrap_df)?;
        let physical = self
            .runtime
            .block_on(self.df.clone().create_physical_plan())
            .map_err(SqlError::Runtime)?
            .map_err(unwrap_df)?;
        Ok(format!(
            "{}\n\n{}",
            logical.display_indent(),
            datafusion::physical_plan::displayable(physical.as_ref()).indent(true)
        ))
    }

    /// Runs the statement: the relational part, the certified semantic pipeline, and what is above it.
    pub fn collect(self) -> Result<SqlResult> {
        let schema = self.schema();
        let task = Arc::new(self.df.task_ctx());
        let physical: Arc<dyn ExecutionPlan> =
            self.runtime.block_on(self.df.create_physical_plan()).map_err(SqlError::Runtime)?.map_err(unwrap_df)?;
        let batches = self
            .runtime
            .block_on(datafusion::physical_plan::collect(physical.clone(), task))
            .map_err(SqlError::Runtime)?
            .map_err(unwrap_df)?;
        let mut pipelines = self.earlier;
        pipelines.extend(exec::pipeline_runs(&physical));
        Ok(SqlResult { schema, batches, pipelines })
    }
}

/// A statement's result and what its semantic pipeline did.
#[derive(Debug, Clone)]
pub struct SqlResult {
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    pipelines: Vec<PipelineRun>,
}

impl SqlResult {
    /// A result of `batches` (rows in `schema`) and the pipelines that produced them.
    pub fn new(schema: SchemaRef, batches: Vec<RecordBatch>, pipelines: Vec<PipelineRun>) -> Self {
        Self { schema, batches, pipelines }
    }

    /// The rows, as DataFusion produced them.
    pub fn batches(&self) -> &[RecordBatch] {
        &self.batches
    }

    /// The rows in one batch.
    pub fn batch(&self) -> Result<RecordBatch> {
        arrow::compute::concat_batches(&self.schema, &self.batches)
            .map_err(|e| SqlError::DataFusion(DataFusionError::ArrowError(Box::new(e), None)))
    }

    /// Rows in the result.
    pub fn num_rows(&self) -> usize {
        self.batches.iter().map(|b| b.num_rows()).sum()
    }

    /// The semantic pipelines' runs, in the order they ran: those of the statements before the last (a `CREATE
    /// TABLE ... AS` with a semantic function), then the query's own (none without semantic functions).
    pub fn pipelines(&self) -> &[PipelineRun] {
        &self.pipelines
    }

    /// The rows as a text table.
    pub fn to_pretty(&self) -> Result<String> {
        arrow::util::pretty::pretty_format_batches(&self.batches)
            .map(|t| t.to_string())
            .map_err(|e| SqlError::DataFusion(DataFusionError::ArrowError(Box::new(e), None)))
    }

    /// Writes the rows to a CSV, TSV, Parquet or newline-delimited JSON file (by extension), atomically.
    pub fn write(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let path = path.as_ref();
        let format = stretto::FileFormat::of(path)?;
        Ok(stretto::io::write(&self.batch()?, path, format)?)
    }
}
