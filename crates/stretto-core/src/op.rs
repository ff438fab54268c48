//! Physical operators: the object-safe trait every implementation of a semantic operator provides, the task it is
//! asked to perform, and the link-time registry (`inventory`) through which plugin crates contribute them.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Schema};

use crate::context::{MemoPolicy, OpContext};
use crate::error::{CoreError, Result};
use crate::memo::{memo_key, CostRecord, Digest16, Memo, MemoEntry, RecordedCost};
use crate::table::resolve_column;

/// Which logical operator family an implementation serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogicalKind {
    /// Keeps or drops tuples; outputs a score per tuple.
    Filter,
    /// Extracts a value per tuple; outputs a value and a confidence.
    Map,
}

impl fmt::Display for LogicalKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogicalKind::Filter => "filter",
            LogicalKind::Map => "map",
        })
    }
}

/// What kind of column an operator reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Modality {
    /// Text columns.
    Text,
    /// Image columns.
    Image,
}

impl fmt::Display for Modality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Modality::Text => "text",
            Modality::Image => "image",
        })
    }
}

/// The type of the value a semantic map produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueType {
    /// Free text.
    String,
    /// A whole number.
    Integer,
    /// A real number.
    Float,
    /// `true` / `false`.
    Boolean,
}

impl ValueType {
    /// The Arrow type of the column a map of this type adds.
    pub fn data_type(self) -> DataType {
        match self {
            ValueType::String => DataType::Utf8,
            ValueType::Integer => DataType::Int64,
            ValueType::Float => DataType::Float64,
            ValueType::Boolean => DataType::Boolean,
        }
    }
}

/// Static properties of a physical operator, computed once when it is built.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OpProperties {
    /// Filter or map.
    pub kind: LogicalKind,
    /// The family (`keyword`, `llm-filter`, `embedding-filter`, `codegen-map`...).
    pub family: String,
    /// The column kind it reads.
    pub modality: Modality,
    /// The model it runs, if any.
    pub model: Option<String>,
    /// The KV-cache compression ratio it runs at, if it uses a compressed cache.
    pub compression: Option<f64>,
    /// Whether its thresholds can be tuned (filters with graded scores; maps with a confidence).
    pub tunable: bool,
    /// Whether it is the dearest, reference implementation of its family (a gold candidate).
    pub gold: bool,
    /// Expected seconds per tuple before profiling measures the real cost.
    pub cost_hint: f64,
    /// The box thresholds live in (e.g. [-10, 10] for log-odds, [-1, 1] for cosines).
    pub score_range: (f64, f64),
}

/// A semantic operator as a physical operator sees it: what to decide or extract, from which columns.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SemanticTask {
    /// Logical operator name (unique within a query).
    pub name: String,
    /// Filter or map.
    pub kind: LogicalKind,
    /// The predicate or instruction, with column references written `{table.column}`.
    pub prompt: String,
    /// For maps: the new column's name and type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<(String, ValueType)>,
}

impl SemanticTask {
    /// A semantic filter.
    pub fn filter(name: impl Into<String>, predicate: impl Into<String>) -> Self {
        Self { name: name.into(), kind: LogicalKind::Filter, prompt: predicate.into(), output: None }
    }

    /// A semantic map adding `column` of type `ty`. An instruction that lists its answers as a closed set (`(yes/no)`,
    /// `(positive or negative)`, `(choose from plot, acting, …)`) is answered with one of them by the LLM maps, spelled
    /// as listed (`stretto_kv::choice::closed_choices` says exactly what is read as such a list).
    pub fn map(
        name: impl Into<String>,
        instruction: impl Into<String>,
        column: impl Into<String>,
        ty: ValueType,
    ) -> Self {
        Self {
            name: name.into(),
            kind: LogicalKind::Map,
            prompt: instruction.into(),
            output: Some((column.into(), ty)),
        }
    }

    /// The column references of the prompt, in order of appearance, as written (`table.column`).
    pub fn references(&self) -> Result<Vec<String>> {
        parse_references(&self.prompt)
    }

    /// Resolves every reference against `schema`, returning column indices in order of appearance.
    pub fn resolve(&self, schema: &Schema) -> Result<Vec<usize>> {
        let refs = self.references()?;
        if refs.is_empty() {
            return Err(CoreError::BadPredicate {
                text: self.prompt.clone(),
                message: "it references no column; write the column as {table.column}".into(),
            });
        }
        refs.iter().map(|r| resolve_column(schema, r, &format!("semantic operator `{}`", self.prompt))).collect()
    }

    /// Which rows of `batch` the task cannot be asked about: those where a referenced cell is null, as after an
    /// unmatched `LEFT JOIN` or an empty CSV field. As in SQL, a predicate over a null is unknown and a function of
    /// a null is null: [`RegisteredOp::evaluate_timed`] answers such a row itself, asking no operator (a filter or
    /// join rejects it, a map gives no value). An image column is the exception: its empty cell is a tuple without
    /// an image, which the image operators judge as such.
    pub fn unknown_rows(&self, batch: &RecordBatch) -> Result<Vec<bool>> {
        let schema = batch.schema();
        let columns: Vec<usize> = self
            .resolve(&schema)?
            .into_iter()
            .filter(|&i| crate::table::ColumnKind::of_field(schema.field(i)) != crate::table::ColumnKind::Image)
            .collect();
        Ok((0..batch.num_rows()).map(|row| columns.iter().any(|&i| batch.column(i).is_null(row))).collect())
    }

    /// The items operators are asked about in `batch`: each row's item ([`Self::item_texts`]), or each pair's for a
    /// join predicate ([`Self::pair_items`]), leaving out the rows no operator is asked about
    /// ([`Self::unknown_rows`]); in row order.
    pub fn known_items(&self, batch: &RecordBatch) -> Result<Vec<String>> {
        let items = if self.is_join() { self.pair_items(batch)? } else { self.item_texts(batch)? };
        Ok(known(items, &self.unknown_rows(batch)?))
    }

    /// The prompt for one row, with each reference replaced by the row's value (null becomes an empty string).
    pub fn render(&self, batch: &RecordBatch, row: usize) -> Result<String> {
        let schema = batch.schema();
        let mut out = String::with_capacity(self.prompt.len() + 64);
        let mut rest = self.prompt.as_str();
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let close = rest[open..].find('}').map(|c| open + c).ok_or_else(|| self.bad("unclosed `{`"))?;
            let idx = resolve_column(&schema, &rest[open + 1..close], &format!("semantic operator `{}`", self.prompt))?;
            out.push_str(&cell_text(batch.column(idx).as_ref(), row));
            rest = &rest[close + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }

    /// The referenced cells of one row, joined by newlines: the *item* an operator caches or embeds.
    pub fn item_text(&self, batch: &RecordBatch, row: usize) -> Result<String> {
        let idx = self.resolve(&batch.schema())?;
        Ok(item_of(batch, &idx, row))
    }

    /// The items of every row of `batch` (references resolved once for the batch).
    pub fn item_texts(&self, batch: &RecordBatch) -> Result<Vec<String>> {
        let idx = self.resolve(&batch.schema())?;
        Ok((0..batch.num_rows()).map(|row| item_of(batch, &idx, row)).collect())
    }

    /// The two sides of a *join predicate*: a prompt whose column references name exactly two tables
    /// (`{a.text} and {b.text} express the same sentiment`), each side's references in order of appearance, the
    /// first-named table's first. `None` for a prompt over one table (or over three or more, read as one item).
    pub fn join_sides(&self) -> Result<Option<JoinSides>> {
        let refs = self.references()?;
        let table = |r: &str| r.rsplit_once('.').map(|(t, _)| t.to_string());
        let mut tables: Vec<String> = Vec::new();
        for r in &refs {
            let Some(t) = table(r) else { return Ok(None) };
            if !tables.contains(&t) {
                tables.push(t);
            }
        }
        if tables.len() != 2 {
            return Ok(None);
        }
        let side = |t: &str| refs.iter().filter(|r| table(r).as_deref() == Some(t)).cloned().collect();
        Ok(Some(JoinSides { left: side(&tables[0]), right: side(&tables[1]) }))
    }

    /// Whether the prompt is a join predicate ([`SemanticTask::join_sides`]).
    pub fn is_join(&self) -> bool {
        matches!(self.join_sides(), Ok(Some(_)))
    }

    /// The items of a join predicate's rows as pairs ([`pair_item`]: each side's referenced cells joined by
    /// newlines, the two sides apart), what an operator that [`PhysicalOp::reads_pairs`] is given; an error for a
    /// prompt over one table.
    pub fn pair_items(&self, batch: &RecordBatch) -> Result<Vec<String>> {
        let sides = self.join_sides()?.ok_or_else(|| {
            self.bad("it names columns of one table; a pair operator needs a join predicate over two tables")
        })?;
        let schema = batch.schema();
        let what = format!("semantic operator `{}`", self.prompt);
        let resolve = |refs: &[String]| -> Result<Vec<usize>> {
            refs.iter().map(|r| resolve_column(&schema, r, &what)).collect()
        };
        let (left, right) = (resolve(&sides.left)?, resolve(&sides.right)?);
        Ok((0..batch.num_rows())
            .map(|row| pair_item(&item_of(batch, &left, row), &item_of(batch, &right, row)))
            .collect())
    }

    fn bad(&self, message: &str) -> CoreError {
        CoreError::BadPredicate { text: self.prompt.clone(), message: message.into() }
    }
}

/// The references of each side of a join predicate ([`SemanticTask::join_sides`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinSides {
    /// References to the first-named table's columns.
    pub left: Vec<String>,
    /// References to the other table's columns.
    pub right: Vec<String>,
}

/// What separates the two sides of a pair item (ASCII's record separator, which text cells do not hold: any in
/// a cell is read as a space).
pub const PAIR_SEPARATOR: char = '\u{1e}';

/// The item of one pair: the left side's text, [`PAIR_SEPARATOR`], the right side's.
pub fn pair_item(left: &str, right: &str) -> String {
    let clean = |s: &str| s.replace(PAIR_SEPARATOR, " ");
    format!("{}{PAIR_SEPARATOR}{}", clean(left), clean(right))
}

/// The two sides of a [`pair_item`]; `None` for an item that is not one.
pub fn split_pair(item: &str) -> Option<(&str, &str)> {
    item.split_once(PAIR_SEPARATOR)
}

fn item_of(batch: &RecordBatch, columns: &[usize], row: usize) -> String {
    columns.iter().map(|i| cell_text(batch.column(*i).as_ref(), row)).collect::<Vec<_>>().join("\n")
}

/// The `{table.column}` references of a prompt.
pub fn parse_references(prompt: &str) -> Result<Vec<String>> {
    let bad = |m: &str| CoreError::BadPredicate { text: prompt.to_string(), message: m.to_string() };
    let mut refs = Vec::new();
    let mut rest = prompt;
    while let Some(open) = rest.find('{') {
        let close = rest[open..].find('}').map(|c| open + c).ok_or_else(|| bad("unclosed `{`"))?;
        let r = rest[open + 1..close].trim();
        if r.is_empty() || r.contains('{') {
            return Err(bad("empty or nested column reference"));
        }
        if !refs.iter().any(|x: &String| x == r) {
            refs.push(r.to_string());
        }
        rest = &rest[close + 1..];
    }
    if rest.contains('}') {
        return Err(bad("unmatched `}`"));
    }
    Ok(refs)
}

/// A cell rendered as text for prompts (null becomes empty; no operator is asked about a null text cell:
/// [`SemanticTask::unknown_rows`]).
pub fn cell_text(array: &dyn Array, row: usize) -> String {
    if array.is_null(row) {
        return String::new();
    }
    if let Some(s) = array.as_string_opt::<i32>() {
        return s.value(row).to_string();
    }
    arrow::util::display::array_value_to_string(array, row).unwrap_or_default()
}

/// What a physical operator returns for a batch: one entry per input tuple, aligned with the batch.
#[derive(Debug, Clone, PartialEq)]
pub enum OpOutput {
    /// Filter scores (log-odds, cosine, hit counts...); larger means more likely to pass.
    Scores(Vec<f64>),
    /// Map values (`None` = no value) and a confidence per value.
    Values {
        /// Extracted values.
        values: Vec<Option<String>>,
        /// Confidence of each value; larger is surer.
        confidences: Vec<f64>,
    },
}

impl OpOutput {
    /// Number of tuples covered.
    pub fn len(&self) -> usize {
        match self {
            OpOutput::Scores(s) => s.len(),
            OpOutput::Values { values, .. } => values.len(),
        }
    }

    /// Whether it covers no tuple.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `other`'s tuples (the output of the same operator, named `operator`, on the tuples that follow);
    /// outputs of different kinds are an error.
    pub fn append(&mut self, other: OpOutput, operator: &str) -> Result<()> {
        match (self, other) {
            (OpOutput::Scores(a), OpOutput::Scores(b)) => a.extend(b),
            (OpOutput::Values { values, confidences }, OpOutput::Values { values: v, confidences: c }) => {
                values.extend(v);
                confidences.extend(c);
            }
            _ => {
                return Err(CoreError::operator(
                    operator,
                    "returned a filter's scores for some tuples, a map's values for others",
                ))
            }
        }
        Ok(())
    }
}

/// One physical implementation of a semantic operator: what is its own, and nothing else.
///
/// The framework does the shared work around it: a [`RegisteredOp`] (what a [`Registry`] holds and the executor
/// runs) checks the task's kind, asks [`PhysicalOp::accept`] whether the operator serves the task, extracts the
/// items (the referenced cells of each row), answers what the memo already knows, calls
/// [`PhysicalOp::evaluate_items`] for the rest, memoises what it returns, and reports each tuple's cost.
///
/// Object safe and shareable across threads. Implementations must load heavy state (models, caches) lazily, on
/// first evaluation, because the registry builds every ladder instance just to list it.
pub trait PhysicalOp: Send + Sync + fmt::Debug {
    /// Unique name within the registry (`keyword`, `llm:smollm2-135m@expected-attention-0.50`...).
    fn name(&self) -> &str;

    /// Static properties.
    fn properties(&self) -> &OpProperties;

    /// The decoder model whose precomputed per-item KV caches this operator reads, if any. The engine builds those
    /// caches (once, offline, found by content) before profiling; operators without one need nothing prepared.
    fn kv_cache_model(&self) -> Option<&str> {
        None
    }

    /// The variant of its model's weights it runs (`int8`, `int8-dyn`), or `None` for the model's own (default). A
    /// compressed rung's uncompressed parent, the rung it must be cheaper than, runs the same weights.
    fn weights_variant(&self) -> Option<&str> {
        None
    }

    /// Whether it judges *pairs*: the join predicates of a semantic join ([`SemanticTask::join_sides`]), each item a
    /// [`pair_item`] with the two sides apart, so that it can work on each side once (its cached past, its
    /// embedding, its projected value) rather than on every pair. Such an operator serves join predicates only;
    /// every other operator serves prompts over one table, and planners keep the two apart (default: no).
    fn reads_pairs(&self) -> bool {
        false
    }

    /// Whether it is the reference implementation of `task`, the gold its cascades are certified against (default:
    /// its [`OpProperties::gold`]). A family may be the reference for some tasks only: a semantic join's LLM reading
    /// the pair is gold for most join predicates, and its projection of each side for those that compare one
    /// property of the two sides.
    fn is_gold_for(&self, task: &SemanticTask) -> bool {
        let _ = task;
        self.properties().gold
    }

    /// Shown the items of the whole input of a query's `task` before the operator is profiled on a sample of them
    /// (default: nothing). An operator whose work is per *piece* of an item rather than per item (a pair operator's
    /// work is per side, and one side is in many pairs) counts how many items share each piece, so that the cost
    /// it reports per item spreads that work over all of them: what a run over this input pays per tuple.
    fn observe_input(&self, task: &SemanticTask, items: &[String]) {
        let _ = (task, items);
    }

    /// Whether its answers are worth memoising (default yes; an operator that answers in microseconds says no).
    fn memoise(&self) -> bool {
        true
    }

    /// Whether its first call on a task pays a one-off setup that only many tuples amortise (a program generated
    /// for the task), which the seconds it reports spread over that call's tuples. The engine sets such an operator
    /// up only once profiling can pay without it (default: no).
    fn one_off_setup(&self) -> bool {
        false
    }

    /// Whether it serves `task` (of its own kind): the identity its answers to `task` are memoised under (default:
    /// its name), or [`CoreError::NotApplicable`] to decline the task, which planners then drop it from.
    fn accept(&self, task: &SemanticTask) -> Result<String> {
        let _ = task;
        Ok(self.name().to_string())
    }

    /// Evaluates `task` on `items` (each the referenced cells of one row, joined by newlines; image columns hold
    /// paths). Returns exactly one output per item (scores for a filter, values and confidences for a map) and the
    /// seconds each item cost ([`time_evenly`] measures that for operators that do not measure it themselves).
    fn evaluate_items(&self, task: &SemanticTask, items: &[String]) -> Result<(OpOutput, Vec<f64>)>;
}

/// Runs `f` and spreads its wall time evenly over `n` items: the cost report of an operator that does not measure
/// per item.
pub fn time_evenly(n: usize, f: impl FnOnce() -> Result<OpOutput>) -> Result<(OpOutput, Vec<f64>)> {
    let start = std::time::Instant::now();
    let out = f()?;
    let each = (start.elapsed().as_secs_f64() / n.max(1) as f64).max(1e-9);
    Ok((out, vec![each; n]))
}

/// An operator as the framework runs it: the [`PhysicalOp`] plus the memo of its answers under a [`MemoPolicy`].
///
/// ```
/// use std::sync::Arc;
/// use arrow::array::{RecordBatch, StringArray};
/// use arrow::datatypes::{DataType, Field, Schema};
/// use stretto_core::op::{time_evenly, LogicalKind, Modality, OpOutput, OpProperties, PhysicalOp, RegisteredOp, SemanticTask};
///
/// /// Scores an item by its length: all an operator has to say.
/// #[derive(Debug)]
/// struct Length(OpProperties);
/// impl PhysicalOp for Length {
///     fn name(&self) -> &str { "length" }
///     fn properties(&self) -> &OpProperties { &self.0 }
///     fn evaluate_items(&self, _: &SemanticTask, items: &[String]) -> stretto_core::Result<(OpOutput, Vec<f64>)> {
///         time_evenly(items.len(), || Ok(OpOutput::Scores(items.iter().map(|t| t.len() as f64 - 3.0).collect())))
///     }
/// }
/// let op = RegisteredOp::new(Arc::new(Length(OpProperties {
///     kind: LogicalKind::Filter, family: "length".into(), modality: Modality::Text, model: None,
///     compression: None, tunable: true, gold: true, cost_hint: 1e-7, score_range: (-10.0, 10.0),
/// })), stretto_core::MemoPolicy::Off);
/// let batch = RecordBatch::try_new(
///     Arc::new(Schema::new(vec![Field::new("t.text", DataType::Utf8, true)])),
///     vec![Arc::new(StringArray::from(vec!["hi", "hello"]))],
/// )?;
/// let (out, seconds) = op.evaluate_timed(&SemanticTask::filter("long", "{t.text} is long"), &batch)?;
/// assert_eq!(out, OpOutput::Scores(vec![-1.0, 2.0]));
/// assert_eq!(seconds.len(), 2);
/// // A map task is not this filter's: the framework says so before the operator is asked.
/// assert!(op.evaluate(&SemanticTask::map("m", "{t.text}", "m", stretto_core::op::ValueType::String), &batch).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RegisteredOp {
    op: Arc<dyn PhysicalOp>,
    policy: MemoPolicy,
    memo: std::sync::OnceLock<Option<Memo>>,
    /// Where what its answers cost per item is recorded, if anywhere.
    costs: Option<Arc<CostRecord>>,
}

impl fmt::Debug for RegisteredOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredOp").field("op", &self.op).field("memo", &self.policy).finish()
    }
}

impl RegisteredOp {
    /// `op`, its answers memoised under `policy` (in a file named after the operator).
    pub fn new(op: Arc<dyn PhysicalOp>, policy: MemoPolicy) -> Self {
        Self { op, policy, memo: std::sync::OnceLock::new(), costs: None }
    }

    /// The same, recording what its answers cost per item in `costs` ([`RegisteredOp::recorded_costs`] reads it).
    pub fn recording(mut self, costs: Arc<CostRecord>) -> Self {
        self.costs = Some(costs);
        self
    }

    /// `op` as a registry built under `context` runs it: answers memoised under its memo policy, costs recorded in
    /// its cost record.
    pub fn in_context(op: Arc<dyn PhysicalOp>, context: &OpContext) -> Self {
        Self::new(op, context.memo.clone()).recording(context.costs.clone())
    }

    /// The same operator without a memo: every answer computed (what determinism checks need).
    pub fn unmemoised(&self) -> Self {
        Self { costs: self.costs.clone(), ..Self::new(self.op.clone(), MemoPolicy::Off) }
    }

    /// The operator itself.
    pub fn inner(&self) -> &Arc<dyn PhysicalOp> {
        &self.op
    }

    /// Its name.
    pub fn name(&self) -> &str {
        self.op.name()
    }

    /// Its static properties.
    pub fn properties(&self) -> &OpProperties {
        self.op.properties()
    }

    /// The decoder whose item KV caches it reads, if any.
    pub fn kv_cache_model(&self) -> Option<&str> {
        self.op.kv_cache_model()
    }

    /// The variant of its model's weights it runs, if not the model's own ([`PhysicalOp::weights_variant`]).
    pub fn weights_variant(&self) -> Option<&str> {
        self.op.weights_variant()
    }

    /// Whether it is the reference implementation of `task` ([`PhysicalOp::is_gold_for`]).
    pub fn is_gold_for(&self, task: &SemanticTask) -> bool {
        self.op.is_gold_for(task)
    }

    /// Whether its first call on a task pays a one-off setup ([`PhysicalOp::one_off_setup`]).
    pub fn one_off_setup(&self) -> bool {
        self.op.one_off_setup()
    }

    /// Whether it judges the pairs of join predicates ([`PhysicalOp::reads_pairs`]).
    pub fn reads_pairs(&self) -> bool {
        self.op.reads_pairs()
    }

    /// Shows the operator the items of the whole input of `task` ([`PhysicalOp::observe_input`]), if it serves it.
    pub fn observe_input(&self, task: &SemanticTask, batch: &RecordBatch) -> Result<()> {
        // `serves`: the operator reads pairs exactly when the task is a join predicate.
        if self.serves(task) {
            self.op.observe_input(task, &task.known_items(batch)?);
        }
        Ok(())
    }

    /// Whether it can serve `task` at all: of the task's kind, and a pair operator exactly when the task is a join
    /// predicate. (It may still decline the task in [`PhysicalOp::accept`].)
    pub fn serves(&self, task: &SemanticTask) -> bool {
        self.op.properties().kind == task.kind && self.op.reads_pairs() == task.is_join()
    }

    fn memo(&self) -> Option<&Memo> {
        self.memo
            .get_or_init(|| {
                if !self.op.memoise() {
                    return None;
                }
                let dir = match &self.policy {
                    MemoPolicy::Dir(d) => d,
                    MemoPolicy::Off => return None,
                };
                Memo::open(dir, self.op.name())
                    .inspect_err(|e| tracing::warn!(operator = self.op.name(), error = %e, "memo unavailable; answers are not kept"))
                    .ok()
            })
            .as_ref()
    }

    /// Evaluates `task` on every row of `batch`: exactly `batch.num_rows()` outputs and the seconds each tuple
    /// cost (a memoised answer reports what computing it cost: profiles and plans must see what the operator
    /// costs, not how warm a cache happened to be).
    pub fn evaluate_timed(&self, task: &SemanticTask, batch: &RecordBatch) -> Result<(OpOutput, Vec<f64>)> {
        let props = self.op.properties();
        if task.kind != props.kind {
            return Err(CoreError::operator(
                self.op.name(),
                format!("is a {} operator and cannot run the {} `{}`", props.kind, task.kind, task.name),
            ));
        }
        let is_join = task.is_join();
        if self.op.reads_pairs() != is_join {
            return Err(CoreError::NotApplicable {
                operator: self.op.name().to_string(),
                reason: if is_join {
                    format!("`{}` is a join predicate over two tables, and this operator reads one item", task.prompt)
                } else {
                    format!("this operator judges pairs of a join predicate, and `{}` names one table", task.prompt)
                },
            });
        }
        let (identity, items, unknown) = self.identity_and_items(task, batch)?;
        let prompt = memo_prompt(task);
        let items = known(items, &unknown);
        let (out, seconds) = memoised(self.memo(), &identity, task, &prompt, &items, |missing| {
            let todo: Vec<String> = missing.iter().map(|&i| items[i].clone()).collect();
            let (out, seconds) = self.op.evaluate_items(task, &todo)?;
            match (&out, task.kind) {
                (OpOutput::Scores(_), LogicalKind::Filter) | (OpOutput::Values { .. }, LogicalKind::Map) => {}
                _ => {
                    return Err(CoreError::operator(
                        self.op.name(),
                        format!("answered a {} with the wrong kind of output", task.kind),
                    ))
                }
            }
            Ok((out, seconds))
        })?;
        // An operator not worth memoising answers in microseconds: asking it is cheaper than keeping its figures.
        if let Some(costs) = self.costs.as_ref().filter(|_| self.op.memoise()) {
            costs.record(self.op.name(), Digest16::of(&prompt), &items, &seconds);
        }
        Ok(self.answer_unknown(&unknown, out, seconds))
    }

    /// Spreads `out` and `seconds`, answered on the rows `unknown` leaves known, over every row, with the answer to
    /// a row the task cannot be asked about ([`SemanticTask::unknown_rows`]) on the others, at no cost: a filter's
    /// or join's score below its box and below gold's rule (so every stage rejects it), a map's missing value, sure.
    fn answer_unknown(&self, unknown: &[bool], out: OpOutput, seconds: Vec<f64>) -> (OpOutput, Vec<f64>) {
        if !unknown.contains(&true) {
            return (out, seconds);
        }
        let (low, high) = self.op.properties().score_range;
        let mut secs = seconds.into_iter();
        let seconds = unknown.iter().map(|&u| if u { 0.0 } else { secs.next().unwrap_or(0.0) }).collect();
        let out = match out {
            OpOutput::Scores(scores) => {
                let mut s = scores.into_iter();
                let unknown_score = low.min(0.0) - 1.0;
                OpOutput::Scores(
                    unknown.iter().map(|&u| if u { unknown_score } else { s.next().unwrap_or(f64::NAN) }).collect(),
                )
            }
            OpOutput::Values { values, confidences } => {
                let (mut v, mut c) = (values.into_iter(), confidences.into_iter());
                let (values, confidences) = unknown
                    .iter()
                    .map(|&u| if u { (None, high) } else { (v.next().flatten(), c.next().unwrap_or(0.0)) })
                    .unzip();
                OpOutput::Values { values, confidences }
            }
        };
        (out, seconds)
    }

    /// Whether its costs are recorded, and its answers memoised (an operator answering in microseconds is simply
    /// asked again).
    pub fn records_costs(&self) -> bool {
        self.costs.is_some() && self.op.memoise()
    }

    /// What its answers on the rows of `batch` cost per tuple as earlier evaluations recorded them: to `task`
    /// where recorded, else to another task of its kind over the same items (see [`CostRecord`]); those of earlier
    /// processes too where `earlier_processes`. Asks the operator nothing. `None` unless every row has a figure,
    /// without a record, or where the operator does not serve the task; the operator's
    /// [`CoreError::NotApplicable`] where it declines the task.
    pub fn recorded_costs(
        &self,
        task: &SemanticTask,
        batch: &RecordBatch,
        earlier_processes: bool,
    ) -> Result<Option<Vec<RecordedCost>>> {
        let Some(costs) = self.costs.as_ref() else { return Ok(None) };
        if !self.serves(task) {
            return Ok(None);
        }
        let (_, items, unknown) = self.identity_and_items(task, batch)?;
        let digest = Self::task_digest(task);
        let Some(figures) = costs.lookup(self.op.name(), digest, &known(items, &unknown), earlier_processes) else {
            return Ok(None);
        };
        // A row the task cannot be asked about costs nothing (`answer_unknown`).
        let mut figures = figures.into_iter();
        Ok(unknown
            .iter()
            .map(|&u| if u { Some(RecordedCost { seconds: 0.0, task: digest }) } else { figures.next() })
            .collect())
    }

    /// What its answers on the rows of `batch` (the items of `task`) cost as recorded, each to the task the
    /// figures of `like` name (what [`RegisteredOp::recorded_costs`] of another operator returned for the same
    /// rows); `None` per row without one.
    pub fn recorded_costs_like(
        &self,
        task: &SemanticTask,
        batch: &RecordBatch,
        like: &[RecordedCost],
        earlier_processes: bool,
    ) -> Result<Vec<Option<f64>>> {
        let Some(costs) = self.costs.as_ref() else { return Ok(vec![None; like.len()]) };
        let (_, items, unknown) = self.identity_and_items(task, batch)?;
        Ok(items
            .iter()
            .zip(like)
            .zip(unknown)
            .map(
                |((item, c), u)| {
                    if u {
                        Some(0.0)
                    } else {
                        costs.figure(self.op.name(), c.task, item, earlier_processes)
                    }
                },
            )
            .collect())
    }

    /// The digest a [`CostRecord`] names `task` by.
    pub fn task_digest(task: &SemanticTask) -> Digest16 {
        Digest16::of(&memo_prompt(task))
    }

    /// Which rows of `batch` already have an answer to `task` in the memo: what [`RegisteredOp::evaluate_timed`]
    /// would read rather than compute. Asks the operator nothing; all `false` without a memo, or where the operator
    /// does not serve the task.
    pub fn memoised_rows(&self, task: &SemanticTask, batch: &RecordBatch) -> Result<Vec<bool>> {
        let none = vec![false; batch.num_rows()];
        let Some(memo) = self.memo() else { return Ok(none) };
        if !self.serves(task) {
            return Ok(none);
        }
        let (identity, items, unknown) = self.identity_and_items(task, batch)?;
        let prompt = memo_prompt(task);
        // A row the task cannot be asked about is answered without the operator (`answer_unknown`).
        Ok(items.iter().zip(unknown).map(|(i, u)| u || memo.contains(&memo_key(&identity, &prompt, i))).collect())
    }

    /// The memoised answers to `task` on the rows of `batch`, each item's once, in row order, at most `max`: what
    /// another process running the same operator can [`remember`](Self::remember) rather than compute (a cluster's
    /// executors, given the answers the client's profiling paid for). Rows without an answer, and rows the task cannot
    /// be asked about, are left out; empty without a memo, or where the operator does not serve the task.
    pub fn memoised_answers(&self, task: &SemanticTask, batch: &RecordBatch, max: usize) -> Result<Vec<MemoEntry>> {
        let Some(memo) = self.memo() else { return Ok(Vec::new()) };
        if max == 0 || !self.serves(task) {
            return Ok(Vec::new());
        }
        let (identity, items, unknown) = self.identity_and_items(task, batch)?;
        let prompt = memo_prompt(task);
        let mut seen = std::collections::HashSet::new();
        Ok(known(items, &unknown)
            .iter()
            .map(|i| memo_key(&identity, &prompt, i))
            .filter(|k| seen.insert(k.clone()))
            .filter_map(|k| memo.get(&k))
            .take(max)
            .collect())
    }

    /// Takes `answers` that this operator memoised in another process ([`RegisteredOp::memoised_answers`]) into
    /// this process's memo, in memory only (see [`Memo::remember`]): evaluation then reads them rather than asking
    /// the operator. Returns how many were new; none without a memo (an operator not worth memoising, or a
    /// registry built with the memo off).
    pub fn remember(&self, answers: Vec<MemoEntry>) -> usize {
        self.memo().map_or(0, |m| m.remember(answers))
    }

    /// What the memo keys an answer by (with [`memo_prompt`]): the operator's identity for `task` (its accept), and
    /// the items of `batch` it judges (each row's text, or each pair's for a join predicate); with the rows the
    /// task cannot be asked about ([`SemanticTask::unknown_rows`]). Shared by evaluation and
    /// [`RegisteredOp::memoised_rows`], so that a lookup finds exactly what evaluation stores.
    fn identity_and_items(&self, task: &SemanticTask, batch: &RecordBatch) -> Result<(String, Vec<String>, Vec<bool>)> {
        let identity = self.op.accept(task)?;
        let items = if task.is_join() { task.pair_items(batch)? } else { task.item_texts(batch)? };
        Ok((identity, items, task.unknown_rows(batch)?))
    }

    /// [`RegisteredOp::evaluate_timed`] without the costs.
    pub fn evaluate(&self, task: &SemanticTask, batch: &RecordBatch) -> Result<OpOutput> {
        Ok(self.evaluate_timed(task, batch)?.0)
    }
}

/// The items of the rows `unknown` leaves known, in order.
fn known(items: Vec<String>, unknown: &[bool]) -> Vec<String> {
    if !unknown.contains(&true) {
        return items;
    }
    items.into_iter().zip(unknown).filter(|(_, &u)| !u).map(|(i, _)| i).collect()
}

/// The part of a memo key that says which task an answer is to.
fn memo_prompt(task: &SemanticTask) -> String {
    serde_json::to_string(task).unwrap_or_else(|_| task.prompt.clone())
}

/// Evaluates `task` on `items` through `memo`: memoised answers are reused, the rest are computed by `compute`
/// (given the indices of the missing items, it returns their output and per-item seconds, in that order) and then
/// memoised. An item that occurs several times is computed once (a review listed twice, a pair met again). Returns
/// the output for every item and each item's cost in seconds.
fn memoised(
    memo: Option<&Memo>,
    operator: &str,
    task: &SemanticTask,
    prompt: &str,
    items: &[String],
    compute: impl FnOnce(&[usize]) -> Result<(OpOutput, Vec<f64>)>,
) -> Result<(OpOutput, Vec<f64>)> {
    let keys: Vec<String> = items.iter().map(|i| memo_key(operator, prompt, i)).collect();
    let mut hits: Vec<Option<MemoEntry>> = keys.iter().map(|k| memo.and_then(|m| m.get(k))).collect();
    // The first occurrence of each item the memo does not know.
    let mut seen = std::collections::HashSet::new();
    let missing: Vec<usize> =
        (0..items.len()).filter(|&i| hits[i].is_none() && seen.insert(keys[i].as_str())).collect();
    let mut new_entries = Vec::new();
    if !missing.is_empty() {
        let (out, secs) = compute(&missing)?;
        if out.len() != missing.len() || secs.len() != missing.len() {
            return Err(CoreError::operator(
                operator,
                format!("returned {} outputs and {} costs for {} tuples", out.len(), secs.len(), missing.len()),
            ));
        }
        let entry = |i: usize, score, value, confidence, seconds| MemoEntry {
            key: keys[i].clone(),
            score,
            value,
            confidence,
            seconds,
        };
        new_entries = match (task.kind, out) {
            (LogicalKind::Filter, OpOutput::Scores(s)) => {
                missing.iter().zip(s).zip(secs).map(|((&i, v), t)| entry(i, Some(v), None, None, t)).collect()
            }
            (LogicalKind::Map, OpOutput::Values { values, confidences }) => missing
                .iter()
                .zip(values)
                .zip(confidences)
                .zip(secs)
                .map(|(((&i, v), c), t)| entry(i, None, v, Some(c), t))
                .collect(),
            (LogicalKind::Filter, _) => return Err(CoreError::operator(operator, "a filter returned map values")),
            (LogicalKind::Map, _) => return Err(CoreError::operator(operator, "a map returned filter scores")),
        };
        let fresh: std::collections::HashMap<&str, &MemoEntry> =
            new_entries.iter().map(|e| (e.key.as_str(), e)).collect();
        for (hit, key) in hits.iter_mut().zip(&keys) {
            if hit.is_none() {
                *hit = fresh.get(key.as_str()).map(|e| (*e).clone());
            }
        }
    }
    let hits: Vec<MemoEntry> = hits
        .into_iter()
        .map(|h| h.ok_or_else(|| CoreError::operator(operator, "an item was left without an answer")))
        .collect::<Result<_>>()?;
    let seconds = hits.iter().map(|h| h.seconds).collect();
    let out = match task.kind {
        LogicalKind::Filter => OpOutput::Scores(hits.iter().map(|h| h.score.unwrap_or(f64::NAN)).collect()),
        LogicalKind::Map => OpOutput::Values {
            values: hits.iter().map(|h| h.value.clone()).collect(),
            confidences: hits.iter().map(|h| h.confidence.unwrap_or(0.0)).collect(),
        },
    };
    if let Some(m) = memo {
        // The memo is a cache: answers it cannot keep (a full disk) are still this call's answers.
        if let Err(e) = m.put(new_entries) {
            tracing::warn!(operator, error = %e, "answers not memoised; they will be computed again");
        }
    }
    Ok((out, seconds))
}

/// A factory that a plugin crate submits with `inventory::submit!`.
///
/// `ladder` lists the configurations of the standard ladder (one physical operator each, e.g. one per model and
/// compression ratio); `build` makes an operator from any configuration, so users can add rungs without code. Both
/// see the [`OpContext`] of the registry being built: where models, caches and memoised answers live, and which
/// models the ladder holds. Factories parse their configuration with [`parse_config`] into a typed `serde` struct.
pub struct OperatorFactory {
    /// Factory name (`keyword`, `llm-filter`...).
    pub name: &'static str,
    /// The crate that submitted it (`stretto-ops-text`).
    pub plugin: &'static str,
    /// One line on what it does.
    pub about: &'static str,
    /// Configurations of the standard ladder.
    pub ladder: fn(&OpContext) -> Vec<serde_json::Value>,
    /// Builds an operator from a configuration; must be cheap (see [`PhysicalOp`]).
    pub build: fn(&serde_json::Value, &OpContext) -> Result<Arc<dyn PhysicalOp>>,
}

/// The one adapter from an untyped configuration to a factory's typed `serde` configuration: a configuration that
/// does not fit is a [`CoreError::OperatorConfig`] naming the factory and what is wrong.
pub fn parse_config<C: serde::de::DeserializeOwned>(factory: &str, config: &serde_json::Value) -> Result<C> {
    C::deserialize(config).map_err(|e| CoreError::OperatorConfig { factory: factory.into(), message: e.to_string() })
}

inventory::collect!(OperatorFactory);

/// Marker each plugin crate submits, so a crate with no operators yet is still seen as linked.
pub struct PluginCrate {
    /// Crate name (`stretto-ops-text`).
    pub name: &'static str,
}

inventory::collect!(PluginCrate);

/// Every operator reachable in this binary: the ladder instances of every linked factory.
pub struct Registry {
    context: OpContext,
    factories: BTreeMap<&'static str, &'static OperatorFactory>,
    plugins: Vec<&'static str>,
    operators: BTreeMap<String, (Arc<RegisteredOp>, &'static str)>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("plugins", &self.plugins)
            .field("factories", &self.factories.keys().collect::<Vec<_>>())
            .field("operators", &self.operators.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Registry {
    /// Collects every factory linked into this binary and builds its ladder under `context`.
    ///
    /// Fails on duplicate factory or operator names, which would make plans ambiguous.
    pub fn discover(context: &OpContext) -> Result<Self> {
        let mut factories = BTreeMap::new();
        for f in inventory::iter::<OperatorFactory> {
            if factories.insert(f.name, f).is_some() {
                return Err(CoreError::OperatorConfig { factory: f.name.into(), message: "registered twice".into() });
            }
        }
        let mut plugins: Vec<&'static str> = inventory::iter::<PluginCrate>.into_iter().map(|p| p.name).collect();
        plugins.sort_unstable();
        plugins.dedup();
        let mut operators = BTreeMap::new();
        for f in factories.values() {
            for config in (f.ladder)(context) {
                let op = Arc::new(RegisteredOp::in_context((f.build)(&config, context)?, context));
                let name = op.name().to_string();
                if let Some((_, other)) = operators.insert(name.clone(), (op, f.name)) {
                    return Err(CoreError::OperatorConfig {
                        factory: f.name.into(),
                        message: format!("operator name `{name}` is also produced by factory `{other}`"),
                    });
                }
            }
        }
        Ok(Self { context: context.clone(), factories, plugins, operators })
    }

    /// The settings its operators run under.
    pub fn context(&self) -> &OpContext {
        &self.context
    }

    /// Adds an operator built at run time (not by a linked factory), under `factory` as its origin. Fails if an
    /// operator of the same name is already registered.
    pub fn register(&mut self, op: Arc<dyn PhysicalOp>, factory: &'static str) -> Result<()> {
        let op = Arc::new(RegisteredOp::in_context(op, &self.context));
        let name = op.name().to_string();
        if let Some((_, other)) = self.operators.get(&name) {
            return Err(CoreError::OperatorConfig {
                factory: factory.into(),
                message: format!("operator name `{name}` is already registered by `{other}`"),
            });
        }
        self.operators.insert(name, (op, factory));
        Ok(())
    }

    /// Keeps only the ladder operators `keep` accepts: a narrower candidate set for the same query (an experiment
    /// comparing plans with and without a family of rungs, say). Operators built later from a factory
    /// ([`Registry::build`]) are not affected.
    pub fn retain_operators(&mut self, keep: impl Fn(&RegisteredOp) -> bool) {
        self.operators.retain(|_, (op, _)| keep(op));
    }

    /// Fails, naming them, if any of `expected` plugin crates is not linked into this binary.
    pub fn require_plugins(&self, expected: &[&str]) -> Result<()> {
        let missing: Vec<&str> = expected.iter().copied().filter(|e| !self.plugins.contains(e)).collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(CoreError::PluginNotLinked { missing: missing.join(", ") })
        }
    }

    /// Linked plugin crates.
    pub fn plugins(&self) -> &[&'static str] {
        &self.plugins
    }

    /// Linked factories by name.
    pub fn factories(&self) -> impl Iterator<Item = &'static OperatorFactory> + '_ {
        self.factories.values().copied()
    }

    /// Every ladder operator, by name, with the factory that made it.
    pub fn operators(&self) -> impl Iterator<Item = (&Arc<RegisteredOp>, &'static str)> + '_ {
        self.operators.values().map(|(op, f)| (op, *f))
    }

    /// The ladder operator called `name`.
    pub fn get(&self, name: &str) -> Result<Arc<RegisteredOp>> {
        self.operators.get(name).map(|(op, _)| op.clone()).ok_or_else(|| CoreError::UnknownOperator {
            name: name.to_string(),
            known: self.operators.keys().cloned().collect::<Vec<_>>().join(", "),
        })
    }

    /// Builds an operator from a factory and an explicit configuration, memoised under the registry's policy.
    pub fn build(&self, factory: &str, config: &serde_json::Value) -> Result<Arc<RegisteredOp>> {
        let f = self.factories.get(factory).ok_or_else(|| CoreError::UnknownOperator {
            name: factory.to_string(),
            known: self.factories.keys().copied().collect::<Vec<_>>().join(", "),
        })?;
        Ok(Arc::new(RegisteredOp::in_context((f.build)(config, &self.context)?, &self.context)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::Field;

    #[test]
    fn parses_and_renders_references() {
        let task = SemanticTask::filter("f", "{r.text} by {r.n} and again {r.text}");
        assert_eq!(task.references().unwrap(), vec!["r.text", "r.n"]);
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("r.text", DataType::Utf8, true),
                Field::new("r.n", DataType::Int64, true),
            ])),
            vec![Arc::new(StringArray::from(vec![Some("hi"), None])), Arc::new(Int64Array::from(vec![7, 8]))],
        )
        .unwrap();
        assert_eq!(task.render(&batch, 0).unwrap(), "hi by 7 and again hi");
        assert_eq!(task.render(&batch, 1).unwrap(), " by 8 and again ");
        assert_eq!(task.item_text(&batch, 0).unwrap(), "hi\n7");
        assert_eq!(task.item_texts(&batch).unwrap(), vec!["hi\n7".to_string(), "\n8".to_string()]);
    }

    #[test]
    fn malformed_predicates_are_errors() {
        for bad in ["{r.text is good", "{} x", "x }", "{a{b}}"] {
            assert!(matches!(parse_references(bad), Err(CoreError::BadPredicate { .. })), "{bad}");
        }
        let schema = Schema::new(vec![Field::new("r.text", DataType::Utf8, true)]);
        assert!(matches!(SemanticTask::filter("f", "no refs").resolve(&schema), Err(CoreError::BadPredicate { .. })));
        assert!(matches!(SemanticTask::filter("f", "{r.nope}").resolve(&schema), Err(CoreError::MissingColumn { .. })));
    }

    #[test]
    fn a_prompt_over_two_tables_is_a_join_predicate_with_its_sides_apart() {
        let task = SemanticTask::filter("j", "{a.text} and {b.text} say the same, by {a.n}");
        let sides = task.join_sides().unwrap().unwrap();
        assert_eq!(sides, JoinSides { left: vec!["a.text".into(), "a.n".into()], right: vec!["b.text".into()] });
        assert!(task.is_join());
        // One table, three tables, or an unqualified column: no join predicate.
        for one in ["{a.text} is long", "{a.x} {b.y} {c.z}", "{text} and {b.text}"] {
            assert_eq!(SemanticTask::filter("f", one).join_sides().unwrap(), None, "{one}");
        }
        // Aliases of one table are two tables: a self-join's predicate is a join predicate.
        let q = SemanticTask::filter("q", "{r1.reviewtext} matches {r2.reviewtext}");
        assert!(q.is_join());
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("a.text", DataType::Utf8, true),
                Field::new("b.text", DataType::Utf8, true),
                Field::new("a.n", DataType::Int64, true),
            ])),
            vec![
                Arc::new(StringArray::from(vec![Some("left\u{1e}side"), None])),
                Arc::new(StringArray::from(vec!["right", "r"])),
                Arc::new(Int64Array::from(vec![1, 2])),
            ],
        )
        .unwrap();
        let items = task.pair_items(&batch).unwrap();
        assert_eq!(items, vec!["left side\n1\u{1e}right".to_string(), "\n2\u{1e}r".to_string()]);
        assert_eq!(split_pair(&items[0]), Some(("left side\n1", "right")));
        assert_eq!(split_pair("no pair"), None);
        // The items one-item operators read are unchanged.
        assert_eq!(task.item_texts(&batch).unwrap()[0], "left\u{1e}side\nright\n1");
        assert!(matches!(
            SemanticTask::filter("f", "{a.text}").pair_items(&batch),
            Err(CoreError::BadPredicate { .. })
        ));
    }

    /// Scores an item by its length; counts the items it is asked about; fails on an item "boom".
    #[derive(Debug)]
    struct Counting {
        props: OpProperties,
        asked: std::sync::Mutex<Vec<String>>,
    }

    impl PhysicalOp for Counting {
        fn name(&self) -> &str {
            "counting"
        }
        fn properties(&self) -> &OpProperties {
            &self.props
        }
        fn accept(&self, task: &SemanticTask) -> Result<String> {
            if task.prompt.contains("colour") {
                return Err(CoreError::NotApplicable { operator: "counting".into(), reason: "no colours".into() });
            }
            Ok(format!("counting#{}", task.prompt.len()))
        }
        fn evaluate_items(&self, _: &SemanticTask, items: &[String]) -> Result<(OpOutput, Vec<f64>)> {
            self.asked.lock().unwrap().extend(items.iter().cloned());
            if items.iter().any(|i| i == "boom") {
                return Err(CoreError::operator("counting", "boom"));
            }
            Ok((OpOutput::Scores(items.iter().map(|i| i.len() as f64).collect()), vec![0.25; items.len()]))
        }
    }

    fn texts(v: &[&str]) -> RecordBatch {
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("r.text", DataType::Utf8, true)])),
            vec![Arc::new(StringArray::from(v.to_vec()))],
        )
        .unwrap()
    }

    #[test]
    fn a_row_with_a_null_referenced_cell_is_answered_without_the_operator() {
        let dir = tempfile::tempdir().unwrap();
        let props = |kind| OpProperties {
            kind,
            family: "counting".into(),
            modality: Modality::Text,
            model: None,
            compression: None,
            tunable: true,
            gold: true,
            cost_hint: 1e-6,
            score_range: (-1.0, 1.0),
        };
        let counting = Arc::new(Counting { props: props(LogicalKind::Filter), asked: Default::default() });
        let costs = Arc::new(CostRecord::open(&dir.path().join("costs.jsonl")).unwrap());
        let op = RegisteredOp::new(counting.clone(), MemoPolicy::Dir(dir.path().to_path_buf())).recording(costs);
        let schema = Schema::new(vec![
            Field::new("r.text", DataType::Utf8, true),
            Field::new("r.n", DataType::Int64, true),
            crate::table::ColumnKind::Image.field("r.photo"),
        ]);
        let batch = RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(StringArray::from(vec![Some("ab"), None, Some("abcd"), Some("")])),
                Arc::new(Int64Array::from(vec![Some(1), Some(2), None, Some(4)])),
                Arc::new(StringArray::from(vec![None::<&str>, None, None, None])),
            ],
        )
        .unwrap();
        // Any null among the referenced cells leaves the task unknown; an empty string is a value.
        let task = SemanticTask::filter("f", "{r.text} by {r.n} is long");
        assert_eq!(task.unknown_rows(&batch).unwrap(), [false, true, true, false]);
        assert_eq!(task.known_items(&batch).unwrap(), ["ab\n1", "\n4"]);
        let (out, secs) = op.evaluate_timed(&task, &batch).unwrap();
        assert_eq!(std::mem::take(&mut *counting.asked.lock().unwrap()), ["ab\n1", "\n4"], "only known rows are asked");
        let OpOutput::Scores(scores) = out else { panic!("scores") };
        assert_eq!(&scores[..], &[4.0, -2.0, -2.0, 2.0]);
        for s in [scores[1], scores[2]] {
            // Gold's rule rejects it, and so does a stage at the bottom of the box.
            assert_eq!(crate::exec::filter_decision(s, None, None), crate::exec::Decision::Reject);
            assert_eq!(crate::exec::filter_decision(s, Some(-1.0), Some(1.0)), crate::exec::Decision::Reject);
        }
        assert_eq!(secs, [0.25, 0.0, 0.0, 0.25], "a row not asked costs nothing");
        // The framework's other views of the same rows agree.
        assert_eq!(op.memoised_rows(&task, &batch).unwrap(), [true; 4]);
        let recorded = op.recorded_costs(&task, &batch, false).unwrap().expect("every row has a figure");
        assert_eq!(recorded.iter().map(|c| c.seconds).collect::<Vec<_>>(), [0.25, 0.0, 0.0, 0.25]);
        assert_eq!(
            op.recorded_costs_like(&task, &batch, &recorded, false).unwrap(),
            [Some(0.25), Some(0.0), Some(0.0), Some(0.25)]
        );
        // Every row unknown: the operator is not asked at all.
        let only_missing = batch.slice(1, 2);
        let (out, _) = op.evaluate_timed(&task, &only_missing).unwrap();
        assert_eq!(out, OpOutput::Scores(vec![-2.0, -2.0]));
        assert!(counting.asked.lock().unwrap().is_empty());
        // An image column's empty cell is a tuple without an image, which its operators judge.
        let photo = SemanticTask::filter("p", "{r.photo} shows a cat");
        assert_eq!(photo.unknown_rows(&batch).unwrap(), [false; 4]);

        // A map gives no value, sure of it.
        #[derive(Debug)]
        struct Echo(OpProperties);
        impl PhysicalOp for Echo {
            fn name(&self) -> &str {
                "echo"
            }
            fn properties(&self) -> &OpProperties {
                &self.0
            }
            fn evaluate_items(&self, _: &SemanticTask, items: &[String]) -> Result<(OpOutput, Vec<f64>)> {
                let values = items.iter().map(|i| Some(i.clone())).collect();
                Ok((OpOutput::Values { values, confidences: vec![0.5; items.len()] }, vec![0.1; items.len()]))
            }
        }
        let map = RegisteredOp::new(Arc::new(Echo(props(LogicalKind::Map))), MemoPolicy::Off);
        let task = SemanticTask::map("m", "Say {r.text}", "said", ValueType::String);
        let (out, secs) = map.evaluate_timed(&task, &batch).unwrap();
        let values = vec![Some("ab".to_string()), None, Some("abcd".to_string()), Some(String::new())];
        assert_eq!(out, OpOutput::Values { values, confidences: vec![0.5, 1.0, 0.5, 0.5] });
        assert_eq!(secs, [0.1, 0.0, 0.1, 0.1]);
    }

    #[test]
    fn the_framework_memoises_checks_kinds_declines_and_never_keeps_failures() {
        let dir = tempfile::tempdir().unwrap();
        let counting = Arc::new(Counting {
            props: OpProperties {
                kind: LogicalKind::Filter,
                family: "counting".into(),
                modality: Modality::Text,
                model: None,
                compression: None,
                tunable: true,
                gold: false,
                cost_hint: 1e-6,
                score_range: (-10.0, 10.0),
            },
            asked: Default::default(),
        });
        let op = RegisteredOp::new(counting.clone(), MemoPolicy::Dir(dir.path().to_path_buf()));
        let task = SemanticTask::filter("f", "{r.text} is long");
        let asked = || std::mem::take(&mut *counting.asked.lock().unwrap());

        // First call computes everything; a second over a superset asks only for what is new, in row order.
        let (out, secs) = op.evaluate_timed(&task, &texts(&["ab", "abc"])).unwrap();
        assert_eq!((out, secs), (OpOutput::Scores(vec![2.0, 3.0]), vec![0.25, 0.25]));
        assert_eq!(asked(), ["ab", "abc"]);
        let (out, secs) = op.evaluate_timed(&task, &texts(&["abcd", "ab", "abc"])).unwrap();
        assert_eq!(out, OpOutput::Scores(vec![4.0, 2.0, 3.0]));
        assert_eq!(secs, vec![0.25; 3], "memoised answers report what computing them cost");
        assert_eq!(asked(), ["abcd"]);
        // A fresh handle on the same directory reads the answers back (keyed by the accepted identity).
        let again = RegisteredOp::new(counting.clone(), MemoPolicy::Dir(dir.path().to_path_buf()));
        again.evaluate(&task, &texts(&["abc"])).unwrap();
        assert!(asked().is_empty());
        // Another prompt is another identity: nothing is reused across tasks.
        again.evaluate(&SemanticTask::filter("g", "{r.text} is longer"), &texts(&["abc"])).unwrap();
        assert_eq!(asked(), ["abc"]);

        // Answers travel to another process's memo: read there, not asked again, and not written to its file.
        let elsewhere = tempfile::tempdir().unwrap();
        let there = RegisteredOp::new(counting.clone(), MemoPolicy::Dir(elsewhere.path().to_path_buf()));
        let shipped = op.memoised_answers(&task, &texts(&["abc", "never", "ab", "abc"]), 10).unwrap();
        assert_eq!(op.memoised_answers(&task, &texts(&["abc", "never", "ab", "abc"]), 1).unwrap(), shipped[..1]);
        assert_eq!(shipped.iter().map(|e| e.score).collect::<Vec<_>>(), [Some(3.0), Some(2.0)], "each known item once");
        assert_eq!(there.remember(shipped.clone()), 2);
        assert_eq!(there.remember(shipped), 0, "known answers stay as they are");
        let (out, secs) = there.evaluate_timed(&task, &texts(&["ab", "abc", "never"])).unwrap();
        assert_eq!((out, secs), (OpOutput::Scores(vec![2.0, 3.0, 5.0]), vec![0.25; 3]));
        assert_eq!(asked(), ["never"], "remembered answers are not asked again");
        let written = std::fs::read_to_string(there.memo().unwrap().path()).unwrap();
        assert_eq!(written.lines().count(), 1, "only the answer computed here is written: {written}");
        assert!(op.unmemoised().memoised_answers(&task, &texts(&["ab"]), 10).unwrap().is_empty());
        assert_eq!(op.unmemoised().remember(op.memoised_answers(&task, &texts(&["ab"]), 10).unwrap()), 0);

        // A failure is reported and nothing of its batch is kept.
        assert!(op.evaluate(&task, &texts(&["xyz", "boom"])).is_err());
        asked();
        assert!(op.evaluate(&task, &texts(&["xyz"])).is_ok());
        assert_eq!(asked(), ["xyz"], "an answer of a failed batch was memoised");

        // The framework checks the task's kind and the operator's acceptance before asking it anything.
        let map = SemanticTask::map("m", "{r.text}", "m", ValueType::String);
        assert!(op.evaluate(&map, &texts(&["a"])).unwrap_err().to_string().contains("cannot run the map"));
        let colour = SemanticTask::filter("c", "{r.text} names a colour");
        assert!(matches!(op.evaluate(&colour, &texts(&["a"])), Err(CoreError::NotApplicable { .. })));
        assert!(asked().is_empty());

        // With the memo off, everything is computed every time, but an item repeated in one batch only once.
        let off = op.unmemoised();
        off.evaluate(&task, &texts(&["ab"])).unwrap();
        assert_eq!(asked(), ["ab"]);
        let (out, secs) = off.evaluate_timed(&task, &texts(&["ab", "c", "ab", "ab"])).unwrap();
        assert_eq!(out, OpOutput::Scores(vec![2.0, 1.0, 2.0, 2.0]));
        assert_eq!(secs, vec![0.25; 4], "a repeated item reports what computing it cost");
        assert_eq!(asked(), ["ab", "c"]);

        // A one-item operator does not serve a join predicate (a pair operator does), and says so.
        let join = SemanticTask::filter("j", "{r.text} matches {s.text}");
        assert!(!op.serves(&join) && op.serves(&task));
        let e = op.evaluate(&join, &texts(&["a"])).unwrap_err();
        assert!(matches!(&e, CoreError::NotApplicable { reason, .. } if reason.contains("join predicate")), "{e}");
    }

    /// Judges pairs: the score is the left side's length minus the right's.
    #[derive(Debug)]
    struct PairLength(OpProperties);

    impl PhysicalOp for PairLength {
        fn name(&self) -> &str {
            "pair-length"
        }
        fn properties(&self) -> &OpProperties {
            &self.0
        }
        fn reads_pairs(&self) -> bool {
            true
        }
        fn evaluate_items(&self, _: &SemanticTask, items: &[String]) -> Result<(OpOutput, Vec<f64>)> {
            let score = |i: &String| {
                let (l, r) = split_pair(i).expect("a pair item");
                l.len() as f64 - r.len() as f64
            };
            time_evenly(items.len(), || Ok(OpOutput::Scores(items.iter().map(score).collect())))
        }
    }

    #[test]
    fn a_pair_operator_sees_both_sides_and_serves_join_predicates_only() {
        let op = RegisteredOp::new(
            Arc::new(PairLength(OpProperties {
                kind: LogicalKind::Filter,
                family: "pair-length".into(),
                modality: Modality::Text,
                model: None,
                compression: None,
                tunable: true,
                gold: false,
                cost_hint: 1e-6,
                score_range: (-10.0, 10.0),
            })),
            MemoPolicy::Off,
        );
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("r.text", DataType::Utf8, true),
                Field::new("s.text", DataType::Utf8, true),
            ])),
            vec![Arc::new(StringArray::from(vec!["abcd", "a"])), Arc::new(StringArray::from(vec!["ab", "abc"]))],
        )
        .unwrap();
        let join = SemanticTask::filter("j", "{r.text} is longer than {s.text}");
        assert!(op.serves(&join));
        assert_eq!(op.evaluate(&join, &batch).unwrap(), OpOutput::Scores(vec![2.0, -2.0]));
        let one = SemanticTask::filter("f", "{r.text} is long");
        assert!(!op.serves(&one));
        assert!(matches!(op.evaluate(&one, &batch), Err(CoreError::NotApplicable { .. })));
    }
}
