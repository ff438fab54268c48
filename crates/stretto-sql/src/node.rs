//! The logical extension node: one query's semantic pipeline over its relational input.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::datatypes::{Field, Schema};
use datafusion::common::{plan_err, DFSchema, DFSchemaRef, Result};
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};
use stretto::core::op::SemanticTask;
use stretto::ValueType;

/// One semantic map of a pipeline.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct MapSpec {
    /// The output's name in Stretto (the SQL alias when there is one): models read it as the label of the value.
    pub column: String,
    /// The instruction, naming its columns as `{table.column}`.
    pub prompt: String,
    /// The declared type, as written (`text`, `integer`, `float`, `boolean`).
    pub ty: String,
    /// The column's name in the node's output (unique in the output schema).
    pub field: String,
}

impl MapSpec {
    /// The declared type.
    pub fn value_type(&self) -> ValueType {
        crate::functions::parse_type(&self.ty).unwrap_or(ValueType::String)
    }
}

/// What the pipeline computes and under which settings.
#[derive(Debug, Clone)]
pub struct PipelineSpec {
    /// Semantic filter predicates (WHERE and JOIN ... ON conjuncts), in query order.
    pub filters: Vec<String>,
    /// Semantic maps, in query order.
    pub maps: Vec<MapSpec>,
    /// The settings (`stretto.*`) at planning time.
    pub options: crate::options::StrettoOptions,
}

impl PipelineSpec {
    /// The logical operators, named as Stretto's profiles and plans name them (`filter_1`, ..., then each map after
    /// its output column).
    pub fn tasks(&self) -> Vec<SemanticTask> {
        let mut tasks: Vec<SemanticTask> = self
            .filters
            .iter()
            .enumerate()
            .map(|(i, p)| SemanticTask::filter(format!("filter_{}", i + 1), p.as_str()))
            .collect();
        tasks.extend(self.maps.iter().map(|m| SemanticTask::map(&m.column, &m.prompt, &m.column, m.value_type())));
        tasks
    }

    /// The pipeline as Stretto's query syntax writes it (operators joined by ` -- `): the query label of profiles
    /// and plans.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self.filters.clone();
        parts.extend(self.maps.iter().map(|m| format!("{} := {} ({})", m.column, m.prompt, m.ty)));
        parts.join(" -- ")
    }

    /// A text that differs whenever the operators or the settings differ.
    pub fn key(&self) -> String {
        let o = &self.options;
        format!(
            "{:?}|{:?}|{}|{}|{}|{}|{}",
            self.filters,
            self.maps,
            o.precision.to_bits(),
            o.recall.to_bits(),
            o.credible.to_bits(),
            o.method,
            o.batch_rows
        )
    }
}

/// The names Stretto gives the input's columns: `table.column` (the table part of the qualifier, so
/// `movie.reviews` reads as `{reviews.text}`), or the bare name of an unqualified column.
pub fn stretto_names(schema: &DFSchema) -> Result<Vec<String>> {
    let names: Vec<String> = schema
        .iter()
        .map(|(q, f)| match q {
            Some(q) => format!("{}.{}", q.table(), f.name()),
            None => f.name().clone(),
        })
        .collect();
    for (i, n) in names.iter().enumerate() {
        if names[..i].contains(n) {
            return plan_err!(
                "two input columns are both `{n}` to the semantic functions; give one of their tables an alias \
                 (FROM ... AS other)"
            );
        }
    }
    Ok(names)
}

/// An Arrow schema of the input under [`stretto_names`], field metadata (column kinds) kept.
pub fn stretto_schema(schema: &DFSchema) -> Result<Schema> {
    let names = stretto_names(schema)?;
    Ok(Schema::new(
        schema.fields().iter().zip(names).map(|(f, n)| f.as_ref().clone().with_name(n)).collect::<Vec<Field>>(),
    ))
}

/// The semantic pipeline of one query: its semantic filters and maps over `input` (the query's relational part:
/// scans, relational filters, joins). Output: the input's columns, then one column per map.
#[derive(Clone)]
pub struct SemanticPipelineNode {
    /// The relational input.
    pub input: LogicalPlan,
    /// Filters, maps and settings.
    pub spec: Arc<PipelineSpec>,
    schema: DFSchemaRef,
}

impl SemanticPipelineNode {
    /// Checks every prompt against the input's columns and computes the output schema.
    pub fn try_new(input: LogicalPlan, spec: PipelineSpec) -> Result<Self> {
        spec.options.validate()?;
        if spec.filters.is_empty() && spec.maps.is_empty() {
            return plan_err!("a semantic pipeline needs a sem_filter or a sem_map");
        }
        let arrow = stretto_schema(input.schema())?;
        let mut spec = spec;
        for f in spec.filters.iter_mut() {
            *f = stretto::core::table::canonical_references(f, &arrow);
        }
        for m in spec.maps.iter_mut() {
            m.prompt = stretto::core::table::canonical_references(&m.prompt, &arrow);
        }
        let mut seen = std::collections::HashSet::new();
        spec.filters.retain(|p| seen.insert(p.clone()));
        // A map's name is a column the pipeline adds (and the label its model reads): an input column of that name
        // would be shadowed, which the pipeline refuses when it runs.
        if let Some(m) = spec.maps.iter().find(|m| arrow.field_with_name(&m.column).is_ok()) {
            return plan_err!(
                "sem_map('{}') is named `{}`, as a column of its input is: give it another name with AS",
                m.prompt,
                m.column
            );
        }
        for t in spec.tasks() {
            if let Err(e) = t.resolve(&arrow) {
                let call = match t.output {
                    Some(_) => format!("sem_map('{}')", t.prompt),
                    None => format!("sem_filter('{}')", t.prompt),
                };
                return plan_err!("in {call}: {e}");
            }
        }
        let maps: Vec<Field> =
            spec.maps.iter().map(|m| Field::new(&m.field, m.value_type().data_type(), true)).collect();
        let extra = DFSchema::from_unqualified_fields(maps.into(), Default::default())?;
        let schema = Arc::new(input.schema().as_ref().join(&extra)?);
        Ok(Self { input, spec: Arc::new(spec), schema })
    }

    /// Columns of the input.
    pub fn input_width(&self) -> usize {
        self.input.schema().fields().len()
    }
}

impl fmt::Debug for SemanticPipelineNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        UserDefinedLogicalNodeCore::fmt_for_explain(self, f)
    }
}

impl PartialEq for SemanticPipelineNode {
    fn eq(&self, other: &Self) -> bool {
        self.spec.key() == other.spec.key() && self.input == other.input
    }
}

impl Eq for SemanticPipelineNode {}

impl Hash for SemanticPipelineNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.spec.key().hash(state);
        self.input.hash(state);
    }
}

impl PartialOrd for SemanticPipelineNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        match self.spec.key().cmp(&other.spec.key()) {
            Ordering::Equal => self.input.partial_cmp(&other.input),
            o => Some(o),
        }
    }
}

impl UserDefinedLogicalNodeCore for SemanticPipelineNode {
    fn name(&self) -> &str {
        "SemanticPipeline"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        // Prompts name columns by text; `necessary_children_exprs` keeps them in the input.
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let o = &self.spec.options;
        write!(f, "SemanticPipeline: ")?;
        for (i, p) in self.spec.filters.iter().enumerate() {
            write!(f, "filter_{}: '{p}', ", i + 1)?;
        }
        for m in &self.spec.maps {
            write!(f, "{} := '{}' ({}), ", m.column, m.prompt, m.ty)?;
        }
        write!(
            f,
            "targets precision >= {} and recall >= {} at {}% credibility, method {}",
            o.precision,
            o.recall,
            o.credible * 100.0,
            o.method
        )
    }

    fn with_exprs_and_inputs(&self, _exprs: Vec<Expr>, mut inputs: Vec<LogicalPlan>) -> Result<Self> {
        if inputs.len() != 1 {
            return plan_err!("SemanticPipeline takes one input, got {}", inputs.len());
        }
        Self::try_new(inputs.swap_remove(0), self.spec.as_ref().clone())
    }

    fn necessary_children_exprs(&self, output_columns: &[usize]) -> Option<Vec<Vec<usize>>> {
        // The input columns the parent reads, and every column a prompt names.
        let width = self.input_width();
        let mut needed: Vec<usize> = output_columns.iter().copied().filter(|&i| i < width).collect();
        let arrow = stretto_schema(self.input.schema()).ok()?;
        for t in self.spec.tasks() {
            needed.extend(t.resolve(&arrow).ok()?);
        }
        needed.sort_unstable();
        needed.dedup();
        Some(vec![needed])
    }
}
