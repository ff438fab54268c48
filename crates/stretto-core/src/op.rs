//! Physical operators: the object-safe trait every implementation of a semantic operator provides, the task it is
//! asked to perform, and the link-time registry (`inventory`) through which plugin crates contribute them.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Schema};

use crate::context::OpContext;
use crate::error::{CoreError, Result};
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

    /// A semantic map adding `column` of type `ty`.
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

    fn bad(&self, message: &str) -> CoreError {
        CoreError::BadPredicate { text: self.prompt.clone(), message: message.into() }
    }
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

/// A cell rendered as text for prompts (null becomes empty).
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
}

/// One physical implementation of a semantic operator.
///
/// Object safe and shareable across threads: the executor holds `Arc<dyn PhysicalOp>` and may evaluate different
/// operators concurrently. Implementations must load heavy state (models, caches) lazily, on first evaluation,
/// because the registry builds every ladder instance just to list it.
pub trait PhysicalOp: Send + Sync + fmt::Debug {
    /// Unique name within the registry (`keyword`, `smollm2-135m@0.5`...).
    fn name(&self) -> &str;

    /// Static properties.
    fn properties(&self) -> &OpProperties;

    /// Evaluates the task on every row of `batch`. Must return exactly `batch.num_rows()` outputs: scores for a
    /// filter task, values and confidences for a map task.
    fn evaluate(&self, task: &SemanticTask, batch: &RecordBatch) -> Result<OpOutput>;

    /// The decoder model whose precomputed per-item KV caches this operator reads, if any. The engine builds those
    /// caches (once, offline, found by content) before profiling; operators without one need nothing prepared.
    fn kv_cache_model(&self) -> Option<&str> {
        None
    }

    /// Evaluates and reports what each tuple cost, in seconds.
    ///
    /// The default times [`PhysicalOp::evaluate`] and spreads the time evenly. Operators that answer tuples from a
    /// memo override it to report the cost measured when each answer was computed: profiles and plans must see
    /// what the operator costs, not how warm a cache happened to be.
    fn evaluate_timed(&self, task: &SemanticTask, batch: &RecordBatch) -> Result<(OpOutput, Vec<f64>)> {
        let start = std::time::Instant::now();
        let out = self.evaluate(task, batch)?;
        let n = batch.num_rows().max(1);
        let each = start.elapsed().as_secs_f64() / n as f64;
        Ok((out, vec![each; batch.num_rows()]))
    }
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
    operators: BTreeMap<String, (Arc<dyn PhysicalOp>, &'static str)>,
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
                let op = (f.build)(&config, context)?;
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
    pub fn operators(&self) -> impl Iterator<Item = (&Arc<dyn PhysicalOp>, &'static str)> + '_ {
        self.operators.values().map(|(op, f)| (op, *f))
    }

    /// The ladder operator called `name`.
    pub fn get(&self, name: &str) -> Result<Arc<dyn PhysicalOp>> {
        self.operators.get(name).map(|(op, _)| op.clone()).ok_or_else(|| CoreError::UnknownOperator {
            name: name.to_string(),
            known: self.operators.keys().cloned().collect::<Vec<_>>().join(", "),
        })
    }

    /// Builds an operator from a factory and an explicit configuration.
    pub fn build(&self, factory: &str, config: &serde_json::Value) -> Result<Arc<dyn PhysicalOp>> {
        let f = self.factories.get(factory).ok_or_else(|| CoreError::UnknownOperator {
            name: factory.to_string(),
            known: self.factories.keys().copied().collect::<Vec<_>>().join(", "),
        })?;
        (f.build)(config, &self.context)
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
}
