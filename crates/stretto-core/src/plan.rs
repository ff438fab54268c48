//! Logical plans, the builder API that composes them, semantic pull-up, and execution of the relational part.
//!
//! ```
//! use stretto_core::plan::PlanBuilder;
//! use stretto_core::expr::{col, lit};
//! use stretto_core::op::ValueType;
//! # use std::sync::Arc;
//! # use arrow::array::{RecordBatch, StringArray, Int64Array};
//! # use arrow::datatypes::{Schema, Field, DataType};
//! # let reviews = RecordBatch::try_new(Arc::new(Schema::new(vec![
//! #     Field::new("reviewtext", DataType::Utf8, true), Field::new("year", DataType::Int64, true)])),
//! #     vec![Arc::new(StringArray::from(vec!["Great!"])), Arc::new(Int64Array::from(vec![2020]))]).unwrap();
//! let plan = PlanBuilder::scan("reviews", &reviews)?
//!     .sem_filter("{reviews.reviewtext} is clearly positive")?
//!     .filter(col("year").gt_eq(lit(2010)))?
//!     .sem_map("title", "Extract the movie title from {reviews.reviewtext}", ValueType::String)?
//!     .build();
//! let pulled = plan.pull_up()?;
//! // The relational filter now runs first; both semantic operators sit above it, in their order.
//! assert_eq!(pulled.semantic.len(), 2);
//! assert!(pulled.relational.is_relational());
//! # Ok::<(), stretto_core::CoreError>(())
//! ```

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use arrow::compute::{cast, filter_record_batch, take};
use arrow::datatypes::{Field, Schema, SchemaRef};
use arrow::row::{RowConverter, SortField};

use crate::error::{CoreError, Result};
use crate::expr::{null_as_false, Expr};
use crate::op::{SemanticTask, ValueType};
use crate::table::{canonical_references, qualify, resolve_column};

/// Largest cross product we materialise; beyond it a query should filter relationally first.
pub const MAX_CROSS_ROWS: usize = 20_000_000;

/// A logical plan: relational operators over plain columns and semantic operators over text and image columns.
#[derive(Debug, Clone)]
pub enum LogicalPlan {
    /// A table; its columns are qualified `table.column`.
    Scan {
        /// Table name.
        table: String,
        /// The data, with qualified column names.
        batch: RecordBatch,
    },
    /// Keeps rows where the predicate is true.
    Filter {
        /// Input.
        input: Box<LogicalPlan>,
        /// Relational predicate.
        predicate: Expr,
    },
    /// Keeps the named columns.
    Project {
        /// Input.
        input: Box<LogicalPlan>,
        /// Columns to keep, as resolved field names.
        columns: Vec<String>,
    },
    /// Inner equi-join on plain columns.
    Join {
        /// Left input.
        left: Box<LogicalPlan>,
        /// Right input.
        right: Box<LogicalPlan>,
        /// (left column, right column) pairs, as resolved field names.
        on: Vec<(String, String)>,
    },
    /// Cartesian product.
    CrossJoin {
        /// Left input.
        left: Box<LogicalPlan>,
        /// Right input.
        right: Box<LogicalPlan>,
    },
    /// Semantic filter.
    SemFilter {
        /// Input.
        input: Box<LogicalPlan>,
        /// The filter task.
        task: SemanticTask,
    },
    /// Semantic map: adds a typed column.
    SemMap {
        /// Input.
        input: Box<LogicalPlan>,
        /// The map task.
        task: SemanticTask,
    },
    /// Semantic join: cross product, then a semantic filter over the pair.
    SemJoin {
        /// Left input.
        left: Box<LogicalPlan>,
        /// Right input.
        right: Box<LogicalPlan>,
        /// The filter task over both sides' columns.
        task: SemanticTask,
    },
    /// The first `fetch` rows of a relational input (a limit cannot move past a semantic operator, so it is
    /// refused above one: [`LogicalPlan::pull_up`] says so).
    Limit {
        /// Input.
        input: Box<LogicalPlan>,
        /// Rows kept.
        fetch: usize,
    },
}

impl LogicalPlan {
    /// The output schema.
    pub fn schema(&self) -> SchemaRef {
        match self {
            LogicalPlan::Scan { batch, .. } => batch.schema(),
            LogicalPlan::Filter { input, .. }
            | LogicalPlan::SemFilter { input, .. }
            | LogicalPlan::Limit { input, .. } => input.schema(),
            LogicalPlan::Project { input, columns } => {
                let s = input.schema();
                Arc::new(Schema::new(
                    columns.iter().filter_map(|c| s.field_with_name(c).ok().cloned()).collect::<Vec<Field>>(),
                ))
            }
            LogicalPlan::Join { left, right, .. }
            | LogicalPlan::CrossJoin { left, right }
            | LogicalPlan::SemJoin { left, right, .. } => concat_schemas(&left.schema(), &right.schema()),
            LogicalPlan::SemMap { input, task } => {
                let s = input.schema();
                let mut fields: Vec<Field> = s.fields().iter().map(|f| f.as_ref().clone()).collect();
                if let Some((name, ty)) = &task.output {
                    fields.push(Field::new(name, ty.data_type(), true));
                }
                Arc::new(Schema::new(fields))
            }
        }
    }

    /// Whether the plan holds no semantic operator.
    pub fn is_relational(&self) -> bool {
        match self {
            LogicalPlan::Scan { .. } => true,
            LogicalPlan::Filter { input, .. }
            | LogicalPlan::Project { input, .. }
            | LogicalPlan::Limit { input, .. } => input.is_relational(),
            LogicalPlan::Join { left, right, .. } | LogicalPlan::CrossJoin { left, right } => {
                left.is_relational() && right.is_relational()
            }
            LogicalPlan::SemFilter { .. } | LogicalPlan::SemMap { .. } | LogicalPlan::SemJoin { .. } => false,
        }
    }

    /// Pulls every semantic operator above the relational ones.
    ///
    /// LLM calls cost orders of magnitude more than relational work, and relational filters and joins shrink
    /// their input, so the relational part runs first. Two things cannot move below a semantic map and stay above
    /// it instead: relational filters that read the map's output (`post_filters`), and projections, which are
    /// applied last so that semantic operators still see every column they reference. A semantic filter (or join
    /// predicate) whose words an earlier one already states is dropped: a conjunction holds a predicate once.
    pub fn pull_up(self) -> Result<PulledUpPlan> {
        let mut pulled = pull(self)?;
        let mut seen = std::collections::HashSet::new();
        for t in &pulled.semantic {
            if !seen.insert(t.name.clone()) {
                return Err(CoreError::InvalidLogicalPlan(format!(
                    "two semantic operators are named `{}`; give each a unique name",
                    t.name
                )));
            }
        }
        // A conjunction holds a predicate once: a semantic filter (or join predicate) that an earlier one states word
        // for word adds nothing but its cost, so it is dropped. (Execution resolves every task's references against
        // the pipeline's input, so the same words ask the same question wherever they stand.)
        let mut stated: HashMap<String, String> = HashMap::new();
        pulled.semantic.retain(|t| {
            if t.kind != crate::op::LogicalKind::Filter {
                return true;
            }
            match stated.get(&t.prompt) {
                Some(first) => {
                    tracing::info!(dropped = %t.name, kept = %first, prompt = %t.prompt, "the same semantic filter twice: asked once");
                    false
                }
                None => {
                    stated.insert(t.prompt.clone(), t.name.clone());
                    true
                }
            }
        });
        pulled.post_filters.shrink_to_fit();
        Ok(pulled)
    }

    /// Executes a purely relational plan.
    pub fn execute_relational(&self) -> Result<RecordBatch> {
        match self {
            LogicalPlan::Scan { batch, .. } => Ok(batch.clone()),
            LogicalPlan::Filter { input, predicate } => {
                let batch = input.execute_relational()?;
                apply_filter(&batch, predicate)
            }
            LogicalPlan::Project { input, columns } => project(&input.execute_relational()?, columns),
            LogicalPlan::Limit { input, fetch } => {
                let batch = input.execute_relational()?;
                Ok(batch.slice(0, (*fetch).min(batch.num_rows())))
            }
            LogicalPlan::Join { left, right, on } => {
                hash_join(&left.execute_relational()?, &right.execute_relational()?, on)
            }
            LogicalPlan::CrossJoin { left, right } => {
                cross_join(&left.execute_relational()?, &right.execute_relational()?)
            }
            LogicalPlan::SemFilter { .. } | LogicalPlan::SemMap { .. } | LogicalPlan::SemJoin { .. } => {
                Err(CoreError::InvalidLogicalPlan(
                    "semantic operators need a physical plan; call pull_up() and run them through the cascade executor"
                        .into(),
                ))
            }
        }
    }

    fn fmt_indent(&self, f: &mut fmt::Formatter<'_>, depth: usize) -> fmt::Result {
        let pad = "  ".repeat(depth);
        match self {
            LogicalPlan::Scan { table, batch } => writeln!(f, "{pad}Scan {table} ({} rows)", batch.num_rows()),
            LogicalPlan::Filter { input, predicate } => {
                writeln!(f, "{pad}Filter {predicate}")?;
                input.fmt_indent(f, depth + 1)
            }
            LogicalPlan::Project { input, columns } => {
                writeln!(f, "{pad}Project {}", columns.join(", "))?;
                input.fmt_indent(f, depth + 1)
            }
            LogicalPlan::Limit { input, fetch } => {
                writeln!(f, "{pad}Limit {fetch}")?;
                input.fmt_indent(f, depth + 1)
            }
            LogicalPlan::Join { left, right, on } => {
                let on: Vec<String> = on.iter().map(|(l, r)| format!("{l} = {r}")).collect();
                writeln!(f, "{pad}Join {}", on.join(" AND "))?;
                left.fmt_indent(f, depth + 1)?;
                right.fmt_indent(f, depth + 1)
            }
            LogicalPlan::CrossJoin { left, right } => {
                writeln!(f, "{pad}CrossJoin")?;
                left.fmt_indent(f, depth + 1)?;
                right.fmt_indent(f, depth + 1)
            }
            LogicalPlan::SemFilter { input, task } => {
                writeln!(f, "{pad}SemFilter[{}] {}", task.name, task.prompt)?;
                input.fmt_indent(f, depth + 1)
            }
            LogicalPlan::SemMap { input, task } => {
                writeln!(f, "{pad}SemMap[{}] {}", task.name, task.prompt)?;
                input.fmt_indent(f, depth + 1)
            }
            LogicalPlan::SemJoin { left, right, task } => {
                writeln!(f, "{pad}SemJoin[{}] {}", task.name, task.prompt)?;
                left.fmt_indent(f, depth + 1)?;
                right.fmt_indent(f, depth + 1)
            }
        }
    }
}

impl fmt::Display for LogicalPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_indent(f, 0)
    }
}

/// A plan after pull-up: relational part first, then the semantic pipeline, then what must follow it.
#[derive(Debug, Clone)]
pub struct PulledUpPlan {
    /// Scans, relational filters and joins (no semantic operator).
    pub relational: LogicalPlan,
    /// Semantic operators in pipeline order (the optimizer may reorder their stages), each filter predicate once.
    pub semantic: Vec<SemanticTask>,
    /// Relational filters that read semantic map outputs.
    pub post_filters: Vec<Expr>,
    /// Final projection, if the query had one.
    pub projection: Option<Vec<String>>,
}

impl PulledUpPlan {
    /// Applies the post-filters and the projection to the semantic pipeline's output.
    pub fn finish(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let mut batch = batch;
        for p in &self.post_filters {
            batch = apply_filter(&batch, p)?;
        }
        match &self.projection {
            Some(cols) => project(&batch, cols),
            None => Ok(batch),
        }
    }
}

fn pull(plan: LogicalPlan) -> Result<PulledUpPlan> {
    Ok(match plan {
        LogicalPlan::Scan { .. } => {
            PulledUpPlan { relational: plan, semantic: vec![], post_filters: vec![], projection: None }
        }
        LogicalPlan::Filter { input, predicate } => {
            let mut p = pull(*input)?;
            let outputs = map_outputs(&p.semantic);
            if predicate.columns().iter().any(|c| outputs.iter().any(|o| o == c)) {
                p.post_filters.push(predicate);
            } else {
                p.relational = LogicalPlan::Filter { input: Box::new(p.relational), predicate };
            }
            p
        }
        LogicalPlan::Project { input, columns } => {
            let mut p = pull(*input)?;
            p.projection = Some(columns);
            p
        }
        LogicalPlan::Limit { input, fetch } => {
            let mut p = pull(*input)?;
            if let Some(t) = p.semantic.first() {
                return Err(CoreError::InvalidLogicalPlan(format!(
                    "limit {fetch} stands above the semantic operator `{}`: the rows it keeps depend on that \
                     operator's answers, so it cannot run before it; limit the input instead, or keep the first \
                     {fetch} rows of the result",
                    t.name
                )));
            }
            p.relational = LogicalPlan::Limit { input: Box::new(p.relational), fetch };
            p
        }
        LogicalPlan::Join { left, right, on } => {
            let (l, r) = (pull(*left)?, pull(*right)?);
            let outputs = [map_outputs(&l.semantic), map_outputs(&r.semantic)].concat();
            if let Some((a, b)) = on.iter().find(|(a, b)| outputs.contains(a) || outputs.contains(b)) {
                return Err(CoreError::InvalidLogicalPlan(format!(
                    "join key {a} = {b} reads a semantic map's output; join on plain columns, or filter after the map"
                )));
            }
            combine(l, r, |left, right| LogicalPlan::Join { left, right, on }, None)
        }
        LogicalPlan::CrossJoin { left, right } => {
            combine(pull(*left)?, pull(*right)?, |left, right| LogicalPlan::CrossJoin { left, right }, None)
        }
        LogicalPlan::SemJoin { left, right, task } => {
            combine(pull(*left)?, pull(*right)?, |left, right| LogicalPlan::CrossJoin { left, right }, Some(task))
        }
        LogicalPlan::SemFilter { input, task } | LogicalPlan::SemMap { input, task } => {
            let mut p = pull(*input)?;
            // A map above a projection adds its column to what the projection keeps.
            if let (Some(cols), Some((out, _))) = (p.projection.as_mut(), task.output.as_ref()) {
                cols.push(out.clone());
            }
            p.semantic.push(task);
            p
        }
    })
}

fn combine(
    l: PulledUpPlan,
    r: PulledUpPlan,
    join: impl FnOnce(Box<LogicalPlan>, Box<LogicalPlan>) -> LogicalPlan,
    task: Option<SemanticTask>,
) -> PulledUpPlan {
    let projection = if l.projection.is_some() || r.projection.is_some() {
        let side = |p: &PulledUpPlan| {
            p.projection.clone().unwrap_or_else(|| {
                let mut cols: Vec<String> = p.relational.schema().fields().iter().map(|f| f.name().clone()).collect();
                cols.extend(map_outputs(&p.semantic));
                cols
            })
        };
        Some([side(&l), side(&r)].concat())
    } else {
        None
    };
    let mut semantic = [l.semantic, r.semantic].concat();
    semantic.extend(task);
    PulledUpPlan {
        relational: join(Box::new(l.relational), Box::new(r.relational)),
        semantic,
        post_filters: [l.post_filters, r.post_filters].concat(),
        projection,
    }
}

fn map_outputs(tasks: &[SemanticTask]) -> Vec<String> {
    tasks.iter().filter_map(|t| t.output.as_ref().map(|(c, _)| c.clone())).collect()
}

fn concat_schemas(a: &Schema, b: &Schema) -> SchemaRef {
    let fields: Vec<Field> = a.fields().iter().chain(b.fields().iter()).map(|f| f.as_ref().clone()).collect();
    Arc::new(Schema::new(fields))
}

fn apply_filter(batch: &RecordBatch, predicate: &Expr) -> Result<RecordBatch> {
    let mask = null_as_false(&predicate.evaluate_predicate(batch)?);
    filter_record_batch(batch, &mask).map_err(|e| CoreError::arrow(format!("filter {predicate}"), e))
}

fn project(batch: &RecordBatch, columns: &[String]) -> Result<RecordBatch> {
    let schema = batch.schema();
    let idx = columns.iter().map(|c| resolve_column(&schema, c, "projection")).collect::<Result<Vec<_>>>()?;
    batch.project(&idx).map_err(|e| CoreError::arrow("projection", e))
}

fn take_both(left: &RecordBatch, right: &RecordBatch, li: &UInt32Array, ri: &UInt32Array) -> Result<RecordBatch> {
    let schema = concat_schemas(&left.schema(), &right.schema());
    let mut cols: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for c in left.columns() {
        cols.push(take(c, li, None).map_err(|e| CoreError::arrow("join (left side)", e))?);
    }
    for c in right.columns() {
        cols.push(take(c, ri, None).map_err(|e| CoreError::arrow("join (right side)", e))?);
    }
    RecordBatch::try_new(schema, cols).map_err(|e| CoreError::arrow("join output", e))
}

fn check_disjoint(left: &Schema, right: &Schema) -> Result<()> {
    if let Some(f) = left.fields().iter().find(|f| right.field_with_name(f.name()).is_ok()) {
        return Err(CoreError::InvalidLogicalPlan(format!(
            "both join inputs have a column `{}`; scan one side under another name (PlanBuilder::scan_as)",
            f.name()
        )));
    }
    Ok(())
}

/// Inner equi-join; null keys never match. Keys are compared in Arrow's row format after casting the right key
/// to the left key's type, so `Int64 = Float64` joins work as a user expects.
fn hash_join(left: &RecordBatch, right: &RecordBatch, on: &[(String, String)]) -> Result<RecordBatch> {
    let _span = tracing::debug_span!("hash_join", left = left.num_rows(), right = right.num_rows()).entered();
    let mut lk: Vec<ArrayRef> = Vec::new();
    let mut rk: Vec<ArrayRef> = Vec::new();
    for (l, r) in on {
        let la = left.column(resolve_column(&left.schema(), l, "join key")?).clone();
        let ra = right.column(resolve_column(&right.schema(), r, "join key")?).clone();
        let ra = cast(&ra, la.data_type()).map_err(|e| CoreError::arrow(format!("join key {l} = {r}"), e))?;
        lk.push(la);
        rk.push(ra);
    }
    let conv = RowConverter::new(lk.iter().map(|a| SortField::new(a.data_type().clone())).collect())
        .map_err(|e| CoreError::arrow("join keys", e))?;
    let lrows = conv.convert_columns(&lk).map_err(|e| CoreError::arrow("join keys", e))?;
    let rrows = conv.convert_columns(&rk).map_err(|e| CoreError::arrow("join keys", e))?;
    let has_null = |keys: &[ArrayRef], i: usize| keys.iter().any(|k| k.is_null(i));
    let mut table: HashMap<&[u8], Vec<u32>> = HashMap::new();
    for i in 0..left.num_rows() {
        if !has_null(&lk, i) {
            table.entry(lrows.row(i).data()).or_default().push(i as u32);
        }
    }
    let (mut li, mut ri) = (Vec::new(), Vec::new());
    for j in 0..right.num_rows() {
        if has_null(&rk, j) {
            continue;
        }
        if let Some(ls) = table.get(rrows.row(j).data()) {
            for &i in ls {
                li.push(i);
                ri.push(j as u32);
            }
        }
    }
    take_both(left, right, &UInt32Array::from(li), &UInt32Array::from(ri))
}

fn cross_join(left: &RecordBatch, right: &RecordBatch) -> Result<RecordBatch> {
    let n = left.num_rows().saturating_mul(right.num_rows());
    if n > MAX_CROSS_ROWS {
        return Err(CoreError::InvalidLogicalPlan(format!(
            "cross product of {} × {} rows exceeds {MAX_CROSS_ROWS}; filter the inputs relationally first",
            left.num_rows(),
            right.num_rows()
        )));
    }
    let li: UInt32Array = (0..left.num_rows() as u32).flat_map(|i| std::iter::repeat_n(i, right.num_rows())).collect();
    let ri: UInt32Array = (0..left.num_rows()).flat_map(|_| 0..right.num_rows() as u32).collect();
    take_both(left, right, &li, &ri)
}

/// Composes a logical plan step by step, validating column references as it goes.
#[derive(Debug, Clone)]
pub struct PlanBuilder {
    plan: LogicalPlan,
    filters: usize,
}

impl PlanBuilder {
    /// Starts from a table; its columns become `table.column`.
    pub fn scan(table: &str, batch: &RecordBatch) -> Result<Self> {
        Self::scan_as(table, batch)
    }

    /// Starts from a table under an alias (needed to join a table with itself).
    pub fn scan_as(alias: &str, batch: &RecordBatch) -> Result<Self> {
        if alias.is_empty() || alias.contains(['.', '{', '}']) {
            return Err(CoreError::InvalidLogicalPlan(format!(
                "table name `{alias}` must be non-empty without '.', '{{' or '}}'"
            )));
        }
        Ok(Self { plan: LogicalPlan::Scan { table: alias.to_string(), batch: qualify(alias, batch)? }, filters: 0 })
    }

    /// Starts from an existing plan.
    pub fn from_plan(plan: LogicalPlan) -> Self {
        Self { plan, filters: 0 }
    }

    /// Relational filter on plain columns.
    pub fn filter(self, predicate: Expr) -> Result<Self> {
        predicate.validate(&self.plan.schema())?;
        Ok(self.wrap(|input| LogicalPlan::Filter { input, predicate }))
    }

    /// Keeps only these columns (qualified or bare names).
    pub fn project(self, columns: &[&str]) -> Result<Self> {
        let schema = self.plan.schema();
        let columns = columns
            .iter()
            .map(|c| resolve_column(&schema, c, "projection").map(|i| schema.field(i).name().clone()))
            .collect::<Result<Vec<_>>>()?;
        Ok(self.wrap(|input| LogicalPlan::Project { input, columns }))
    }

    /// The first `fetch` rows. It must stand below every semantic operator: the rows a limit above one keeps
    /// depend on that operator's answers, so [`LogicalPlan::pull_up`] refuses it there.
    pub fn limit(self, fetch: usize) -> Self {
        self.wrap(|input| LogicalPlan::Limit { input, fetch })
    }

    /// Inner equi-join with another plan on (left column, right column) pairs.
    pub fn join(self, other: PlanBuilder, on: &[(&str, &str)]) -> Result<Self> {
        let (ls, rs) = (self.plan.schema(), other.plan.schema());
        check_disjoint(&ls, &rs)?;
        if on.is_empty() {
            return Err(CoreError::InvalidLogicalPlan(
                "join needs at least one key pair; use cross_join for a product".into(),
            ));
        }
        let on = on
            .iter()
            .map(|(l, r)| {
                let li = resolve_column(&ls, l, "join key (left)")?;
                let ri = resolve_column(&rs, r, "join key (right)")?;
                Ok((ls.field(li).name().clone(), rs.field(ri).name().clone()))
            })
            .collect::<Result<Vec<_>>>()?;
        let filters = self.filters + other.filters;
        let right = other.renamed_apart_from(&self.plan);
        Ok(Self { plan: LogicalPlan::Join { left: Box::new(self.plan), right: Box::new(right), on }, filters })
    }

    /// Cartesian product with another plan.
    pub fn cross_join(self, other: PlanBuilder) -> Result<Self> {
        check_disjoint(&self.plan.schema(), &other.plan.schema())?;
        let filters = self.filters + other.filters;
        let right = other.renamed_apart_from(&self.plan);
        Ok(Self { plan: LogicalPlan::CrossJoin { left: Box::new(self.plan), right: Box::new(right) }, filters })
    }

    /// Semantic filter with a generated name (`filter_1`, `filter_2`, ...).
    pub fn sem_filter(self, predicate: &str) -> Result<Self> {
        let name = format!("filter_{}", self.filters + 1);
        self.sem_filter_named(&name, predicate)
    }

    /// Semantic filter with an explicit logical name.
    pub fn sem_filter_named(mut self, name: &str, predicate: &str) -> Result<Self> {
        let task = SemanticTask::filter(name, canonical_references(predicate, &self.plan.schema()));
        task.resolve(&self.plan.schema())?;
        self.filters += 1;
        Ok(self.wrap(|input| LogicalPlan::SemFilter { input, task }))
    }

    /// Semantic map adding `column` of type `ty`; the logical operator is named after the column.
    pub fn sem_map(self, column: &str, instruction: &str, ty: ValueType) -> Result<Self> {
        let schema = self.plan.schema();
        if schema.fields().iter().any(|f| f.name() == column) {
            return Err(CoreError::InvalidLogicalPlan(format!("sem_map output `{column}` already exists")));
        }
        let task = SemanticTask::map(column, canonical_references(instruction, &schema), column, ty);
        task.resolve(&schema)?;
        Ok(self.wrap(|input| LogicalPlan::SemMap { input, task }))
    }

    /// Semantic join: cross product with `other`, then a semantic filter over the pair.
    pub fn sem_join(self, other: PlanBuilder, predicate: &str) -> Result<Self> {
        check_disjoint(&self.plan.schema(), &other.plan.schema())?;
        let filters = self.filters + other.filters + 1;
        let right = other.renamed_apart_from(&self.plan);
        let mut names = BTreeSet::new();
        task_names(&self.plan, &mut names);
        task_names(&right, &mut names);
        let pair = concat_schemas(&self.plan.schema(), &right.schema());
        let task = SemanticTask::filter(fresh_name("join", filters, &names), canonical_references(predicate, &pair));
        task.resolve(&pair)?;
        Ok(Self { plan: LogicalPlan::SemJoin { left: Box::new(self.plan), right: Box::new(right), task }, filters })
    }

    /// The composed plan.
    pub fn build(self) -> LogicalPlan {
        self.plan
    }

    fn wrap(self, f: impl FnOnce(Box<LogicalPlan>) -> LogicalPlan) -> Self {
        Self { plan: f(Box::new(self.plan)), filters: self.filters }
    }

    /// This plan to be joined with `left`: each of its semantic operators whose generated name (`filter_1`,
    /// `join_2`) `left` already uses is renamed to the next free one, so two frames filtered apart can be joined.
    /// A name the user gave is kept (a clash there is reported by [`LogicalPlan::pull_up`]).
    fn renamed_apart_from(self, left: &LogicalPlan) -> LogicalPlan {
        let mut left_names = BTreeSet::new();
        task_names(left, &mut left_names);
        let mut taken = left_names.clone();
        task_names(&self.plan, &mut taken);
        let mut plan = self.plan;
        for_each_task_mut(&mut plan, &mut |task| {
            let generated = task.name.rsplit_once('_').filter(|(prefix, n)| {
                matches!(*prefix, "filter" | "join") && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
            });
            if let Some((prefix, _)) = generated.filter(|_| left_names.contains(&task.name)) {
                let name = fresh_name(prefix, 1, &taken);
                taken.insert(name.clone());
                task.name = name;
            }
        });
        plan
    }
}

/// `prefix_n` for the smallest `n` from `from` that `taken` does not hold.
fn fresh_name(prefix: &str, from: usize, taken: &BTreeSet<String>) -> String {
    (from..).map(|n| format!("{prefix}_{n}")).find(|name| !taken.contains(name)).expect("a free number")
}

/// The names of `plan`'s semantic operators, added to `out`.
fn task_names(plan: &LogicalPlan, out: &mut BTreeSet<String>) {
    match plan {
        LogicalPlan::Scan { .. } => {}
        LogicalPlan::Filter { input, .. } | LogicalPlan::Project { input, .. } | LogicalPlan::Limit { input, .. } => {
            task_names(input, out)
        }
        LogicalPlan::SemFilter { input, task } | LogicalPlan::SemMap { input, task } => {
            out.insert(task.name.clone());
            task_names(input, out);
        }
        LogicalPlan::Join { left, right, .. } | LogicalPlan::CrossJoin { left, right } => {
            task_names(left, out);
            task_names(right, out);
        }
        LogicalPlan::SemJoin { left, right, task } => {
            out.insert(task.name.clone());
            task_names(left, out);
            task_names(right, out);
        }
    }
}

/// Calls `f` on each of `plan`'s semantic operators, inputs first.
fn for_each_task_mut(plan: &mut LogicalPlan, f: &mut dyn FnMut(&mut SemanticTask)) {
    match plan {
        LogicalPlan::Scan { .. } => {}
        LogicalPlan::Filter { input, .. } | LogicalPlan::Project { input, .. } | LogicalPlan::Limit { input, .. } => {
            for_each_task_mut(input, f)
        }
        LogicalPlan::SemFilter { input, task } | LogicalPlan::SemMap { input, task } => {
            for_each_task_mut(input, f);
            f(task);
        }
        LogicalPlan::Join { left, right, .. } | LogicalPlan::CrossJoin { left, right } => {
            for_each_task_mut(left, f);
            for_each_task_mut(right, f);
        }
        LogicalPlan::SemJoin { left, right, task } => {
            for_each_task_mut(left, f);
            for_each_task_mut(right, f);
            f(task);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::{col, lit};
    use arrow::array::{AsArray, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Int64Type};

    fn table(ids: &[i64], texts: &[&str]) -> RecordBatch {
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int64, true),
                Field::new("text", DataType::Utf8, true),
            ])),
            vec![Arc::new(Int64Array::from(ids.to_vec())), Arc::new(StringArray::from(texts.to_vec()))],
        )
        .unwrap()
    }

    #[test]
    fn a_limit_runs_with_the_relational_part_and_is_refused_above_a_semantic_operator() {
        let r = table(&[1, 2, 3, 4, 5], &["a", "b", "c", "d", "e"]);
        let plan = PlanBuilder::scan("r", &r)
            .unwrap()
            .filter(col("r.id").gt(lit(1)))
            .unwrap()
            .limit(2)
            .sem_filter("{r.text} is nice")
            .unwrap()
            .build();
        assert!(plan.to_string().contains("Limit 2"), "{plan}");
        let pulled = plan.pull_up().unwrap();
        assert_eq!(pulled.semantic.len(), 1);
        let input = pulled.relational.execute_relational().unwrap();
        let ids: Vec<i64> = input.column(0).as_primitive::<Int64Type>().values().to_vec();
        assert_eq!(ids, vec![2, 3], "the filter runs first, then the limit");

        // Above a semantic filter, the rows a limit keeps depend on its answers: it cannot be pulled below it.
        let above = PlanBuilder::scan("r", &r).unwrap().sem_filter("{r.text} is nice").unwrap().limit(2).build();
        let e = above.pull_up().unwrap_err().to_string();
        assert!(e.contains("limit 2") && e.contains("filter_1"), "{e}");
    }

    #[test]
    fn pull_up_moves_semantic_operators_above_relational_ones() {
        let r = table(&[1, 2, 3], &["a", "b", "c"]);
        let m = table(&[1, 3], &["x", "y"]);
        let plan = PlanBuilder::scan("r", &r)
            .unwrap()
            .sem_filter("{r.text} is nice")
            .unwrap()
            .project(&["r.id", "r.text"])
            .unwrap()
            .sem_map("label", "label of {r.text}", ValueType::Integer)
            .unwrap()
            .filter(col("label").gt(lit(2)))
            .unwrap()
            .join(PlanBuilder::scan("m", &m).unwrap().filter(col("m.id").gt(lit(0))).unwrap(), &[("r.id", "m.id")])
            .unwrap()
            .sem_join(PlanBuilder::scan("o", &m).unwrap(), "{r.text} matches {o.text}")
            .unwrap()
            .build();
        assert!(!plan.is_relational());
        let pulled = plan.pull_up().unwrap();
        assert!(pulled.relational.is_relational());
        let names: Vec<_> = pulled.semantic.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, vec!["filter_1", "label", "join_2"]);
        assert_eq!(pulled.post_filters, vec![col("label").gt(lit(2))]);
        // The projection waits until the end and keeps the map output and the joined sides' columns.
        let proj = pulled.projection.clone().unwrap();
        assert_eq!(proj, vec!["r.id", "r.text", "label", "m.id", "m.text", "o.id", "o.text"]);
        let rel = pulled.relational.execute_relational().unwrap();
        // Join keeps ids 1 and 3, cross join with o doubles.
        assert_eq!(rel.num_rows(), 4);
        let text = format!("{}", pulled.relational);
        assert!(
            text.starts_with("CrossJoin") && text.contains("Join r.id = m.id") && text.contains("Filter (m.id > 0)"),
            "{text}"
        );
    }

    #[test]
    fn plans_filtered_apart_are_joined_with_their_generated_names_kept_apart() {
        let r = table(&[1, 2, 3], &["a", "b", "c"]);
        let filtered = |t: &str| {
            let p = PlanBuilder::scan(t, &r).unwrap().sem_filter(&format!("{{{t}.text}} is nice")).unwrap();
            p.sem_filter(&format!("{{{t}.text}} is short")).unwrap()
        };
        let names = |p: PlanBuilder| -> Vec<String> {
            p.build().pull_up().unwrap().semantic.iter().map(|t| format!("{}: {}", t.name, t.prompt)).collect()
        };
        let joined = filtered("a").join(filtered("b"), &[("a.id", "b.id")]).unwrap();
        let joined = joined.sem_filter("{a.text} is long").unwrap();
        assert_eq!(
            names(joined),
            [
                "filter_1: {a.text} is nice",
                "filter_2: {a.text} is short",
                "filter_3: {b.text} is nice",
                "filter_4: {b.text} is short",
                "filter_5: {a.text} is long"
            ]
        );
        let pair = filtered("a").sem_join(filtered("b"), "{a.text} matches {b.text}").unwrap();
        let crossed = pair.cross_join(filtered("c")).unwrap();
        let names = names(crossed);
        assert_eq!(names.len(), 7);
        assert!(names.contains(&"join_5: {a.text} matches {b.text}".to_string()), "{names:?}");
        assert!(names.contains(&"filter_6: {c.text} is short".to_string()), "{names:?}");
        // A name the user gave stays theirs, and a clash there is reported.
        let named =
            |t: &str| PlanBuilder::scan(t, &r).unwrap().sem_filter_named("nice", &format!("{{{t}.text}} is nice"));
        let e = named("a").unwrap().cross_join(named("b").unwrap()).unwrap().build().pull_up().unwrap_err();
        assert!(e.to_string().contains("two semantic operators are named `nice`"), "{e}");
    }

    #[test]
    fn prompts_name_columns_in_any_case_and_are_written_as_the_columns_are() {
        let r = table(&[1, 2], &["a", "b"]);
        let p = PlanBuilder::scan("Reviews", &r).unwrap().sem_filter("{reviews.TEXT} is nice").unwrap();
        let p = p.sem_map("mood", "The mood of {REVIEWS.text}", ValueType::String).unwrap();
        let p = p.sem_join(PlanBuilder::scan("o", &r).unwrap(), "{Reviews.text} matches {O.Text}").unwrap();
        let prompts: Vec<String> = p.build().pull_up().unwrap().semantic.iter().map(|t| t.prompt.clone()).collect();
        assert_eq!(
            prompts,
            ["{Reviews.text} is nice", "The mood of {Reviews.text}", "{Reviews.text} matches {o.text}"]
        );
        // A reference two columns answer in any case stays as written, and is an error.
        let one = table(&[1], &["a"]);
        let two = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int64, false),
                Field::new("text", DataType::Utf8, false),
                Field::new("Text", DataType::Utf8, false),
            ])),
            vec![one.column(0).clone(), one.column(1).clone(), one.column(1).clone()],
        )
        .unwrap();
        let e = PlanBuilder::scan("r", &two).unwrap().sem_filter("{r.TEXT} is nice").unwrap_err();
        assert!(e.to_string().contains("r.TEXT"), "{e}");
    }

    #[test]
    fn a_semantic_filter_stated_twice_is_pulled_up_once() {
        let r = table(&[1, 2, 3], &["a", "b", "c"]);
        let pulled = PlanBuilder::scan("r", &r)
            .unwrap()
            .sem_filter("{r.text} is nice")
            .unwrap()
            .sem_map("label", "label of {r.text}", ValueType::Integer)
            .unwrap()
            .sem_filter("{r.text} is short")
            .unwrap()
            .sem_filter("{r.text} is nice")
            .unwrap()
            .build()
            .pull_up()
            .unwrap();
        let names: Vec<_> = pulled.semantic.iter().map(|t| t.name.as_str()).collect();
        // The first statement stays where it stood, and the names the builder gave stay as they were.
        assert_eq!(names, vec!["filter_1", "label", "filter_2"]);
        // Names are still checked before the twin is dropped.
        let twice = PlanBuilder::scan("r", &r).unwrap().sem_filter_named("a", "{r.text} is nice").unwrap();
        let e = twice.sem_filter_named("a", "{r.text} is nice").unwrap().build().pull_up().unwrap_err();
        assert!(e.to_string().contains("two semantic operators are named `a`"), "{e}");
    }

    #[test]
    fn join_matches_keys_and_skips_nulls() {
        let l = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true)])),
            vec![Arc::new(Int64Array::from(vec![Some(1), None, Some(2), Some(1)]))],
        )
        .unwrap();
        let r = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("k", DataType::Float64, true)])),
            vec![Arc::new(arrow::array::Float64Array::from(vec![Some(1.0), None, Some(3.0)]))],
        )
        .unwrap();
        let out = PlanBuilder::scan("l", &l)
            .unwrap()
            .join(PlanBuilder::scan("r", &r).unwrap(), &[("l.k", "r.k")])
            .unwrap()
            .build()
            .execute_relational()
            .unwrap();
        assert_eq!(out.num_rows(), 2);
        assert!(out.column(0).as_primitive::<Int64Type>().iter().all(|v| v == Some(1)));
    }

    #[test]
    fn builder_rejects_bad_references() {
        let r = table(&[1], &["a"]);
        let b = PlanBuilder::scan("r", &r).unwrap();
        assert!(matches!(b.clone().sem_filter("{r.nope} is nice"), Err(CoreError::MissingColumn { .. })));
        assert!(matches!(b.clone().filter(col("nope").eq(lit(1))), Err(CoreError::MissingColumn { .. })));
        assert!(matches!(b.clone().project(&["nope"]), Err(CoreError::MissingColumn { .. })));
        assert!(matches!(
            b.clone().join(PlanBuilder::scan("r", &r).unwrap(), &[("id", "id")]),
            Err(CoreError::InvalidLogicalPlan(_))
        ));
        assert!(matches!(b.sem_map("r.id", "{r.text}", ValueType::String), Err(CoreError::InvalidLogicalPlan(_))));
    }
}
