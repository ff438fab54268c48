//! Typed errors of the core crate.
//!
//! Every variant names the thing a user has to fix (the file, the column, the operator, the stage) so that the
//! message alone is enough to act on.

use std::path::PathBuf;

/// Errors raised while loading data, building plans, resolving operators and executing cascades.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// A file could not be written (its folder is missing or read-only, the disk is full).
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// A CSV file is malformed (ragged row, unparseable value, bad quoting).
    #[error("malformed CSV {path}: {message}")]
    Csv {
        /// The file.
        path: PathBuf,
        /// What the CSV reader reported (it names the line where it can).
        message: String,
    },
    /// A column named by a schema, an expression or a predicate does not exist.
    #[error("unknown column `{column}` in {context}; available: {available}")]
    MissingColumn {
        /// The column as the user wrote it.
        column: String,
        /// Where it was referenced (a file, a predicate, an expression).
        context: String,
        /// Comma-separated list of the columns that do exist.
        available: String,
    },
    /// A column reference matches several columns (e.g. `id` after a join of two tables with an `id`).
    #[error("ambiguous column `{column}` in {context}: matches {candidates}; qualify it as table.column")]
    AmbiguousColumn {
        /// The column as the user wrote it.
        column: String,
        /// Where it was referenced.
        context: String,
        /// The qualified names it could mean.
        candidates: String,
    },
    /// A dataset name is not bundled.
    #[error("unknown dataset `{name}`; bundled datasets: {known}")]
    UnknownDataset {
        /// The requested name.
        name: String,
        /// The bundled names.
        known: String,
    },
    /// A table is not part of a dataset.
    #[error("dataset `{dataset}` has no table `{table}`; tables: {known}")]
    UnknownTable {
        /// The dataset.
        dataset: String,
        /// The requested table.
        table: String,
        /// The dataset's tables.
        known: String,
    },
    /// No registered operator has this name.
    #[error("unknown physical operator `{name}`; registered: {known}")]
    UnknownOperator {
        /// The requested operator.
        name: String,
        /// Registered operator names.
        known: String,
    },
    /// An operator plugin crate that the binary expects is not linked into it.
    #[error(
        "operator plugin crate(s) not linked: {missing}. A crate that is a dependency but never referenced in \
         code is dropped by rustc together with its inventory registrations; call `stretto::link()` (or the \
         crate's own `link()`) from the binary"
    )]
    PluginNotLinked {
        /// The missing crate names.
        missing: String,
    },
    /// A plan file is not a valid `stretto.plan/v1`.
    #[error("invalid plan {context}: {message}")]
    InvalidPlan {
        /// The file or stage concerned.
        context: String,
        /// What is wrong.
        message: String,
    },
    /// A plan stage refers to a logical operator the query does not have.
    #[error("plan stage `{stage}` names logical operator `{logical}`, which the query does not define; logical operators: {known}")]
    UnknownStage {
        /// The stage's physical name.
        stage: String,
        /// The logical operator it refers to.
        logical: String,
        /// The query's logical operators.
        known: String,
    },
    /// A logical plan is not well formed.
    #[error("invalid logical plan: {0}")]
    InvalidLogicalPlan(String),
    /// A semantic predicate or instruction could not be parsed.
    #[error("cannot parse semantic operator `{text}`: {message}")]
    BadPredicate {
        /// The predicate text.
        text: String,
        /// What is wrong.
        message: String,
    },
    /// A relational expression has mismatched types or cannot be evaluated.
    #[error("cannot evaluate expression {expr}: {message}")]
    Expr {
        /// The expression, displayed.
        expr: String,
        /// What went wrong.
        message: String,
    },
    /// A physical operator failed on some input.
    #[error("operator `{operator}` failed: {message}")]
    Operator {
        /// The physical operator.
        operator: String,
        /// What went wrong.
        message: String,
    },
    /// A physical operator failed in a layer below it (a model, a cache, ONNX Runtime); that error is kept as the
    /// source, so callers can walk the chain down to, say, the missing file.
    #[error("operator `{operator}` failed: {source}")]
    OperatorFailed {
        /// The physical operator.
        operator: String,
        /// The underlying error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// An operator declines a task it cannot serve, e.g. a contrast filter whose model derives no opposite of the
    /// predicate. Planners drop it from that task's candidates instead of failing the query.
    #[error("operator `{operator}` does not apply to this task: {reason}")]
    NotApplicable {
        /// The physical operator.
        operator: String,
        /// Why it does not apply.
        reason: String,
    },
    /// An operator's configuration is invalid.
    #[error("bad configuration for operator factory `{factory}`: {message}")]
    OperatorConfig {
        /// The factory.
        factory: String,
        /// What is wrong.
        message: String,
    },
    /// An Arrow kernel failed (type mismatch, overflow...).
    #[error("arrow error in {context}: {source}")]
    Arrow {
        /// What we were doing.
        context: String,
        /// The Arrow error.
        source: arrow::error::ArrowError,
    },
    /// A JSON document could not be parsed.
    #[error("invalid JSON in {context}: {source}")]
    Json {
        /// The file or document.
        context: String,
        /// The parser's error (with line and column).
        source: serde_json::Error,
    },
    /// An environment variable holds a value its setting cannot take.
    #[error("environment variable {variable}={value:?}: {message}")]
    Environment {
        /// The variable.
        variable: String,
        /// What it holds.
        value: String,
        /// What it should hold.
        message: String,
    },
}

/// Result alias for the core crate.
pub type Result<T, E = CoreError> = std::result::Result<T, E>;

impl CoreError {
    /// Wraps an Arrow error with what we were doing when it happened.
    pub fn arrow(context: impl Into<String>, source: arrow::error::ArrowError) -> Self {
        CoreError::Arrow { context: context.into(), source }
    }

    /// An I/O failure on `path`.
    pub fn io(path: impl Into<std::path::PathBuf>, source: std::io::Error) -> Self {
        CoreError::Io { path: path.into(), source }
    }

    /// An operator failure.
    pub fn operator(operator: impl Into<String>, message: impl Into<String>) -> Self {
        CoreError::Operator { operator: operator.into(), message: message.into() }
    }

    /// An operator failure caused by `source` (kept as the error's source).
    pub fn operator_failed(
        operator: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        CoreError::OperatorFailed { operator: operator.into(), source: Box::new(source) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operator_failure_keeps_its_cause_as_the_source() {
        let cause = std::io::Error::new(std::io::ErrorKind::NotFound, "decoder.onnx is missing");
        let e = CoreError::operator_failed("llm:x", cause);
        assert!(e.to_string().contains("llm:x") && e.to_string().contains("decoder.onnx is missing"), "{e}");
        let source = std::error::Error::source(&e).expect("the cause is the source");
        assert_eq!(source.downcast_ref::<std::io::Error>().map(|io| io.kind()), Some(std::io::ErrorKind::NotFound));
    }
}
