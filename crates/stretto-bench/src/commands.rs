//! The logic of the CLI's subcommands, as library functions that return data (the binary only prints).

use std::collections::BTreeSet;
use std::path::Path;

use arrow::array::RecordBatch;
use stretto_core::datasets::{Dataset, DATASETS};
use stretto_core::exec::{CascadeExecutor, CascadeOutput, CascadePlan};
use stretto_core::format::PlanFile;
use stretto_core::plan::PlanBuilder;
use stretto_core::{CoreError, Result};

/// One line of `stretto datasets`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DatasetRow {
    /// Dataset name.
    pub name: String,
    /// Main table.
    pub table: String,
    /// Rows of the main table.
    pub rows: usize,
    /// Every table with its row count.
    pub tables: Vec<(String, usize)>,
    /// What it is.
    pub about: String,
}

/// Loads every bundled dataset and counts its rows.
pub fn dataset_rows() -> Result<Vec<DatasetRow>> {
    DATASETS
        .iter()
        .map(|spec| {
            let ds = Dataset::load(spec.name)?;
            let (table, batch) = ds.main_table();
            Ok(DatasetRow {
                name: spec.name.to_string(),
                table: table.to_string(),
                rows: batch.num_rows(),
                tables: ds.table_names().iter().map(|t| (t.clone(), ds.tables[t].num_rows())).collect(),
                about: spec.about.to_string(),
            })
        })
        .collect()
}

/// One line of `stretto ops`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct OpRow {
    /// Operator name (what a plan stage names after `logical/`).
    pub name: String,
    /// Factory that built it.
    pub factory: String,
    /// Plugin crate.
    pub plugin: String,
    /// Filter or map.
    pub kind: String,
    /// Operator family.
    pub family: String,
    /// Modality.
    pub modality: String,
    /// Model, if any.
    pub model: Option<String>,
    /// KV compression ratio, if any.
    pub compression: Option<f64>,
}

/// Every registered operator.
pub fn op_rows(context: &stretto::OpContext) -> Result<Vec<OpRow>> {
    let registry = stretto::registry_for(context)?;
    let plugin_of = |factory: &str| registry.factories().find(|f| f.name == factory).map(|f| f.plugin).unwrap_or("?");
    Ok(registry
        .operators()
        .map(|(op, factory)| {
            let p = op.properties();
            OpRow {
                name: op.name().to_string(),
                factory: factory.to_string(),
                plugin: plugin_of(factory).to_string(),
                kind: p.kind.to_string(),
                family: p.family.clone(),
                modality: p.modality.to_string(),
                model: p.model.clone(),
                compression: p.compression,
            }
        })
        .collect())
}

/// Result of `stretto run-plan`.
#[derive(Debug)]
pub struct RunPlanOutput {
    /// Rows the cascade saw after the relational part.
    pub input_rows: usize,
    /// The cascade's output (result rows, stats).
    pub cascade: CascadeOutput,
}

/// Executes a plan file on a bundled dataset.
///
/// The plan must carry its logical operators (`logical`); the tables they reference are scanned and, when there
/// are several, combined by a cross product (the meaning of a semantic join). `limit` bounds the rows read from
/// each table, for quick runs.
pub fn run_plan(
    context: &stretto::OpContext,
    dataset: &str,
    plan_path: &Path,
    limit: Option<usize>,
    progress: bool,
) -> Result<RunPlanOutput> {
    let plan = PlanFile::read(plan_path)?;
    if plan.logical.is_empty() {
        return Err(CoreError::InvalidPlan {
            context: plan_path.display().to_string(),
            message: "`logical` is empty: run-plan needs the query's logical operators (name, kind, prompt)".into(),
        });
    }
    let registry = stretto::registry_for(context)?;
    let ds = Dataset::load(dataset)?;

    let mut tables = BTreeSet::new();
    for task in &plan.logical {
        for r in task.references()? {
            let (table, _) = r.split_once('.').ok_or_else(|| CoreError::BadPredicate {
                text: task.prompt.clone(),
                message: format!("reference {{{r}}} must be qualified as {{table.column}}"),
            })?;
            tables.insert(table.to_string());
        }
    }
    let mut builder: Option<PlanBuilder> = None;
    for t in &tables {
        let batch = limited(ds.table(t)?, limit);
        let scan = PlanBuilder::scan(t, &batch)?;
        builder = Some(match builder {
            None => scan,
            Some(b) => b.cross_join(scan)?,
        });
    }
    let mut builder = builder.ok_or_else(|| CoreError::InvalidPlan {
        context: plan_path.display().to_string(),
        message: "no logical operator references a column".into(),
    })?;
    for task in &plan.logical {
        builder = match &task.output {
            None => builder.sem_filter_named(&task.name, &task.prompt)?,
            Some((column, ty)) => builder.sem_map(column, &task.prompt, *ty)?,
        };
    }
    let pulled = builder.build().pull_up()?;
    let input = pulled.relational.execute_relational()?;
    let cascade = CascadePlan::bind(&plan, plan.logical.clone(), |name| registry.get(name))?;
    let mut out = CascadeExecutor::default().with_progress(progress).execute(&cascade, &input)?;
    out.batch = pulled.finish(out.batch)?;
    Ok(RunPlanOutput { input_rows: input.num_rows(), cascade: out })
}

fn limited(batch: &RecordBatch, limit: Option<usize>) -> RecordBatch {
    match limit {
        Some(n) if n < batch.num_rows() => batch.slice(0, n),
        _ => batch.clone(),
    }
}

/// What `stretto optimize` did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct OptimizeSummary {
    /// Number of stages.
    pub stages: usize,
    /// Predicted cost per tuple.
    pub cost_per_tuple: f64,
    /// The gold plan's cost per tuple on the same profile.
    pub gold_cost_per_tuple: f64,
    /// Precision lower bound the plan stands behind.
    pub precision_lower_bound: f64,
    /// Recall lower bound.
    pub recall_lower_bound: f64,
    /// Whether the plan is the gold fallback.
    pub fell_back_to_gold: bool,
    /// Warnings (also stored in the plan).
    pub warnings: Vec<String>,
}

/// Optimizes a plan for a profile and writes it to `out`.
pub fn optimize(
    profile: &Path,
    precision: f64,
    recall: f64,
    credible: f64,
    method: &str,
    seed: u64,
    out: &Path,
) -> std::result::Result<OptimizeSummary, stretto::optim::OptimError> {
    use stretto::optim::problem::Problem;
    use stretto::optim::profile::Profile;
    use stretto::optim::strategy::{strategy, Targets};
    let targets = Targets::new(precision, recall, credible)?;
    let strategy = strategy(method)?;
    let profile = Profile::read(profile)?;
    let problem = Problem::from_profile(&profile)?;
    let optimized = {
        let _span = tracing::info_span!("optimize", method, tuples = problem.n).entered();
        strategy.optimize(&problem, &targets, seed)?
    };
    optimized.to_plan_file(&problem).write(out)?;
    let gold = problem.evaluate(&problem.gold_plan(), &problem.all_rows()).cost_per_tuple();
    Ok(OptimizeSummary {
        stages: optimized.plan.stages.len(),
        cost_per_tuple: optimized.cost_per_tuple,
        gold_cost_per_tuple: gold,
        precision_lower_bound: optimized.precision_lower_bound,
        recall_lower_bound: optimized.recall_lower_bound,
        fell_back_to_gold: optimized.fell_back_to_gold,
        warnings: optimized.warnings,
    })
}

/// Replays a plan file on a profile.
pub fn replay(
    profile: &Path,
    plan: &Path,
) -> std::result::Result<stretto::optim::replay::ReplayResult, stretto::optim::OptimError> {
    let profile = stretto::optim::profile::Profile::read(profile)?;
    let plan = PlanFile::read(plan)?;
    stretto::optim::replay::replay(&profile, &plan)
}
