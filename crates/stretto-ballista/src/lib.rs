//! # stretto-ballista
//!
//! Stretto's semantic SQL on a cluster: Apache DataFusion **Ballista**'s scheduler and executors with Stretto's
//! operators linked in. The split is the method's:
//!
//! - the **client** ([`ClusterContext`]) plans the SQL, has the cluster compute each semantic pipeline's relational
//!   input, then profiles and optimizes the pipeline on the session's seeded sample under the query's targets,
//!   exactly as on one machine (a `LIMIT` right above it included), prefilling only the KV caches of the tuples it
//!   profiles, and replaces it by its certified plan ([`CertifiedPipelineNode`]), which carries the answers the
//!   client knows of the plan's stages ([`StageAnswers`]: what profiling paid for first);
//! - the **scheduler** ([`process::run_scheduler`], the `stretto-scheduler` binary) plans the query, the certified
//!   pipeline as a [`CascadeExec`] over its input's partitions, and hands out tasks;
//! - the **executors** ([`process::run_executor`], `stretto-executor`) decode the cascade with [`StrettoPhysicalCodec`],
//!   bind it to their own operators (model home, KV store, memo of the node) and run it on their partitions: no
//!   profiling, no optimization. The sample's answers are read from what the plan carries, not asked again; missing
//!   KV caches are built by the executor that needs them; a partition stops at a `LIMIT`'s rows.
//!
//! ```no_run
//! use stretto::Session;
//! use stretto_ballista::ClusterContext;
//!
//! // A scheduler at localhost:50050 and executors started with `stretto-scheduler` / `stretto-executor`.
//! let session = Session::builder("/var/cache/stretto").ladder(["smollm2-135m"]).build()?;
//! let ctx = ClusterContext::connect(&session, "localhost:50050")?;
//! ctx.register_file("reviews", "data/reviews/")?; // a directory of CSV files: one partition per file
//! let result = ctx.sql(
//!     "SELECT reviewid, sem_map('The movie title named in {reviews.reviewtext}') AS title
//!      FROM reviews WHERE sem_filter('{reviews.reviewtext} is clearly positive')",
//! )?;
//! println!("{}", result.to_pretty()?);
//! # Ok::<(), stretto_ballista::ClusterError>(())
//! ```

#![warn(missing_docs)]

pub mod codec;
pub mod exec;
pub mod node;
pub mod planner;
pub mod process;

use std::path::Path;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use ballista_core::extension::SessionConfigExt;
use ballista_core::planner::BallistaQueryPlanner;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::prelude::{CsvReadOptions, JsonReadOptions, ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_proto::protobuf::LogicalPlanNode;
use stretto_sql::{RunLog, SqlError, SqlResult, StrettoOptions};

pub use codec::{StrettoLogicalCodec, StrettoPhysicalCodec};
pub use exec::{CascadeExec, ExecutorResources, TaskLog};
pub use node::{CertifiedPipelineNode, StageAnswers};
pub use planner::{CertifyingPlanner, SchedulerQueryPlanner};

/// What can go wrong on a cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// Planning or running the query (on the client, the scheduler or an executor), or Stretto's own work.
    #[error(transparent)]
    Sql(#[from] SqlError),
    /// Starting or running a scheduler or an executor.
    #[error("ballista: {0}")]
    Ballista(#[from] ballista_core::error::BallistaError),
    /// A setting that cannot work (an address, a file type).
    #[error("{0}")]
    Config(String),
    /// The client's runtime could not start.
    #[error("cannot start the client runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

impl From<datafusion::error::DataFusionError> for ClusterError {
    fn from(e: datafusion::error::DataFusionError) -> Self {
        ClusterError::Sql(SqlError::from_datafusion(e))
    }
}

impl From<stretto::Error> for ClusterError {
    fn from(e: stretto::Error) -> Self {
        ClusterError::Sql(SqlError::Stretto(e))
    }
}

/// A result of this crate.
pub type Result<T, E = ClusterError> = std::result::Result<T, E>;

/// The session configuration every party uses: Ballista's, with the `stretto.*` settings.
pub fn session_config() -> SessionConfig {
    let mut config = SessionConfig::new_with_ballista()
        .with_information_schema(true)
        .with_ballista_logical_extension_codec(Arc::new(StrettoLogicalCodec::default()))
        .with_ballista_physical_extension_codec(Arc::new(StrettoPhysicalCodec::default()));
    config.options_mut().extensions.insert(StrettoOptions::default());
    // A file is one partition, never split in byte ranges (`ClusterContext::register_file`).
    config.options_mut().optimizer.repartition_file_scans = false;
    config
}

/// The file `path` names, or for a directory its first data file, and how many data files it holds: hidden files and
/// `_`-prefixed ones are not data, and the data files must share one extension. Errors name the path and the rule.
fn data_files(path: &Path) -> Result<(std::path::PathBuf, usize)> {
    let meta =
        std::fs::metadata(path).map_err(|e| ClusterError::Config(format!("cannot read {}: {e}", path.display())))?;
    if !meta.is_dir() {
        return Ok((path.to_path_buf(), 1));
    }
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(path)
        .map_err(|e| ClusterError::Config(format!("cannot list {}: {e}", path.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| !n.starts_with(['.', '_'])))
        .collect();
    files.sort();
    let Some(first) = files.first().cloned() else {
        return Err(ClusterError::Config(format!(
            "{} holds no data file (files directly in it, not in subfolders; hidden and `_` files are skipped)",
            path.display()
        )));
    };
    let ext = |p: &Path| p.extension().map(|e| e.to_os_string());
    if let Some(other) = files.iter().find(|p| ext(p) != ext(&first)) {
        return Err(ClusterError::Config(format!(
            "{} holds files of two extensions ({} and {}); a table is listed by one: rename or move them apart",
            path.display(),
            first.display(),
            other.display()
        )));
    }
    Ok((first, files.len()))
}

/// SQL with Stretto's semantic functions on a Ballista cluster (see the crate doc): certification here, execution
/// on the executors.
pub struct ClusterContext {
    session: stretto::Session,
    scheduler: String,
    ctx: SessionContext,
    runtime: Arc<stretto_sql::QueryRuntime>,
    log: RunLog,
}

impl std::fmt::Debug for ClusterContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterContext").field("session", &self.session).finish_non_exhaustive()
    }
}

impl ClusterContext {
    /// A client of the scheduler at `scheduler` (`HOST:PORT`), certifying pipelines with `session` (its models,
    /// sample and seed). Tables: [`register_file`](Self::register_file). Nothing is contacted until a query runs.
    pub fn connect(session: &stretto::Session, scheduler: &str) -> Result<Self> {
        let (host, port) = scheduler
            .rsplit_once(':')
            .filter(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
            .ok_or_else(|| ClusterError::Config(format!("the scheduler address `{scheduler}` is not HOST:PORT")))?;
        let url = format!("df://{host}:{port}");
        let config = session_config().with_target_partitions(4);
        let ballista = BallistaQueryPlanner::<LogicalPlanNode>::with_extension(
            url,
            config.ballista_config(),
            Arc::new(StrettoLogicalCodec::default()),
        );
        let log = RunLog::default();
        let planner = CertifyingPlanner::new(session.clone(), Arc::new(ballista), log.clone());
        let state = SessionStateBuilder::new()
            .with_config(config)
            .with_default_features()
            .with_query_planner(Arc::new(planner))
            .build();
        let ctx = SessionContext::new_with_state(state);
        stretto_sql::install(&ctx);
        let runtime = stretto_sql::query_runtime("stretto-cluster").map_err(ClusterError::Runtime)?;
        Ok(Self { session: session.clone(), scheduler: format!("{host}:{port}"), ctx, runtime, log })
    }

    /// The DataFusion context (Ballista client state).
    pub fn datafusion(&self) -> &SessionContext {
        &self.ctx
    }

    /// Registers a CSV, TSV, Parquet or NDJSON file, or a directory of them (one partition per file), as `name`. The
    /// executors read the same path, so it must be on a file system they share with the client. In a directory,
    /// hidden files and those whose name starts with `_` (`_SUCCESS`, `.part-0.crc`, as Spark and Hadoop write them)
    /// are not data; the data files must share one extension, which DataFusion lists them by.
    pub fn register_file(&self, name: &str, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let (probe, files) = data_files(path)?;
        // Stretto's rule for a file's format; DataFusion lists the files with the same extension.
        let format = stretto::FileFormat::of(&probe)?;
        let ext = format!(".{}", probe.extension().and_then(|e| e.to_str()).unwrap_or_default());
        // One partition per file: DataFusion groups the files into at most `target_partitions` partitions (and file
        // scans are never split: `session_config`), so the setting grows to the file count, never shrinks.
        let partitions = self.ctx.state().config().target_partitions();
        if files > partitions {
            self.ctx.state_ref().write().config_mut().options_mut().execution.target_partitions = files;
        }
        let location = path
            .to_str()
            .ok_or_else(|| ClusterError::Config(format!("{} is not a UTF-8 path", path.display())))?
            .to_string();
        let location = if path.is_dir() && !location.ends_with('/') { format!("{location}/") } else { location };
        let registered = self.runtime.block_on(async {
            match format {
                stretto::FileFormat::Csv => {
                    self.ctx.register_csv(name, &location, CsvReadOptions::new().file_extension(&ext)).await
                }
                stretto::FileFormat::Tsv => {
                    let options = CsvReadOptions::new().file_extension(&ext).delimiter(b'\t');
                    self.ctx.register_csv(name, &location, options).await
                }
                stretto::FileFormat::Parquet => {
                    let options = ParquetReadOptions { file_extension: &ext, ..Default::default() };
                    self.ctx.register_parquet(name, &location, options).await
                }
                stretto::FileFormat::Json => {
                    let options = JsonReadOptions { file_extension: &ext, ..Default::default() };
                    self.ctx.register_json(name, &location, options).await
                }
            }
        });
        registered.map_err(ClusterError::Runtime)??;
        Ok(())
    }

    /// The `stretto.*` settings as they stand (after any `SET`).
    pub fn options(&self) -> StrettoOptions {
        stretto_sql::options_of(&self.ctx)
    }

    /// Runs `sql` (statements separated by `;`, each in turn; the last one's rows are returned) on the cluster.
    /// The result reports each semantic pipeline's certification (profiled tuples, plan, bounds, timings); its
    /// execution counts live on the executors.
    pub fn sql(&self, sql: &str) -> Result<SqlResult> {
        self.log.clear();
        let state = self.ctx.state();
        let statements = stretto_sql::parse_statements(&state, sql)?;
        let mut last = None;
        for statement in statements {
            let out = self.runtime.block_on(async {
                let plan = self.ctx.state().statement_to_plan(statement).await?;
                let df = self.ctx.execute_logical_plan(plan).await?;
                let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
                let batches = df.collect().await?;
                Ok::<_, datafusion::error::DataFusionError>((schema, batches))
            });
            let out = out
                .map_err(ClusterError::Runtime)?
                .map_err(|e| e.context(format!("running on the cluster of the scheduler at {}", self.scheduler)))?;
            last = Some(out);
        }
        let (schema, batches) = last.expect("parse_statements gives at least one statement");
        Ok(SqlResult::new(schema, batches, self.log.runs()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folders_data_files_skip_markers_and_share_one_extension() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let err = |p: &Path| data_files(p).unwrap_err().to_string();
        assert!(err(&d.join("missing.csv")).contains("cannot read"), "{}", err(&d.join("missing.csv")));
        assert!(err(d).contains("holds no data file"), "{}", err(d));
        // Spark's markers sort before the data and are not data.
        for f in ["_SUCCESS", ".part-00000.csv.crc", "part-00000.csv", "part-00001.csv"] {
            std::fs::write(d.join(f), "id\n1\n").unwrap();
        }
        std::fs::create_dir(d.join("sub")).unwrap();
        assert_eq!(data_files(d).unwrap(), (d.join("part-00000.csv"), 2));
        assert_eq!(data_files(&d.join("part-00001.csv")).unwrap(), (d.join("part-00001.csv"), 1));
        // A file DataFusion would not list is refused, not dropped without a word.
        std::fs::write(d.join("part-00002.tsv"), "id\n2\n").unwrap();
        let e = err(d);
        assert!(e.contains("two extensions") && e.contains("part-00002.tsv"), "{e}");
    }

    #[test]
    fn a_folder_of_files_is_one_partition_per_file() {
        let dir = tempfile::tempdir().unwrap();
        let session = stretto::Session::builder(dir.path().join("home")).build().unwrap();
        // Nothing is contacted before a query runs.
        let ctx = ClusterContext::connect(&session, "localhost:1").unwrap();
        let partitions = || ctx.datafusion().state().config().target_partitions();
        let folder = |name: &str, files: usize| {
            let d = dir.path().join(name);
            std::fs::create_dir(&d).unwrap();
            for i in 0..files {
                std::fs::write(d.join(format!("part-{i}.csv")), format!("id\n{i}\n")).unwrap();
            }
            d
        };
        assert_eq!(partitions(), 4);
        ctx.register_file("two", folder("two", 2)).unwrap();
        assert_eq!(partitions(), 4, "never shrinks");
        ctx.register_file("seven", folder("seven", 7)).unwrap();
        assert_eq!(partitions(), 7);
        assert!(!ctx.datafusion().state().config().options().optimizer.repartition_file_scans, "a file is never split");
    }

    #[test]
    fn the_client_runs_inside_an_async_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let session = stretto::Session::builder(dir.path().join("home")).build().unwrap();
        let csv = dir.path().join("t.csv");
        std::fs::write(&csv, "id\n1\n").unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let ctx = ClusterContext::connect(&session, "localhost:1").unwrap();
            ctx.register_file("t", &csv).unwrap();
            assert!(ctx.datafusion().table_exist("t").unwrap());
            drop(ctx);
        });
    }
}
