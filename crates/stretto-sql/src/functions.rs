//! The semantic functions as SQL sees them: `sem_filter(prompt)` and `sem_map(prompt [, type])`.
//!
//! They are declarations for DataFusion's planner (names, argument and return types), never evaluated row by row:
//! the [`SemanticPipelineRule`](crate::rewrite::SemanticPipelineRule) lifts every call of a query into one semantic
//! pipeline before DataFusion plans execution. A call that reaches evaluation (it was somewhere the rule does not
//! lift from) is an error that says so.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::{plan_err, Result, ScalarValue};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    ColumnarValue, Expr, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature,
    Volatility,
};
use stretto::ValueType;

/// Name of the semantic filter function.
pub const SEM_FILTER: &str = "sem_filter";
/// Name of the semantic map function.
pub const SEM_MAP: &str = "sem_map";

/// `sem_filter('<predicate naming {table.column}s>')`: true for the rows the predicate holds for.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct SemFilter {
    signature: Signature,
}

/// `sem_map('<instruction naming {table.column}s>' [, 'text' | 'integer' | 'float' | 'boolean'])`: the value the
/// instruction extracts, of the declared type (text when omitted).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct SemMap {
    signature: Signature,
}

fn string_args(n: usize) -> TypeSignature {
    TypeSignature::Exact(vec![DataType::Utf8; n])
}

impl Default for SemFilter {
    fn default() -> Self {
        // Volatile: the planner must neither fold nor deduplicate a call away before the rule lifts it.
        Self { signature: Signature::one_of(vec![string_args(1)], Volatility::Volatile) }
    }
}

impl Default for SemMap {
    fn default() -> Self {
        Self { signature: Signature::one_of(vec![string_args(1), string_args(2)], Volatility::Volatile) }
    }
}

fn not_lifted(name: &str) -> Result<ColumnarValue> {
    plan_err!(
        "{name}(...) is evaluated by Stretto's semantic pipeline, not row by row; this call was not lifted into it \
         (semantic functions belong in one SELECT block, the query's or a CTE's, derived table's or UNION branch's: \
         its WHERE, JOIN ... ON, SELECT list, GROUP BY, HAVING or ORDER BY)"
    )
}

impl ScalarUDFImpl for SemFilter {
    fn name(&self) -> &str {
        SEM_FILTER
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        not_lifted(SEM_FILTER)
    }
}

impl ScalarUDFImpl for SemMap {
    fn name(&self) -> &str {
        SEM_MAP
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let ty = match args.scalar_arguments.get(1) {
            None => ValueType::String,
            Some(Some(v)) => match literal_text(v) {
                Some(t) => parse_type(t)?,
                None => return plan_err!("the second argument of sem_map must be a type name in quotes, got {v}"),
            },
            Some(None) => {
                return plan_err!(
                    "the second argument of sem_map must be a literal type name ('text', 'integer', 'float' or \
                     'boolean'), not a column"
                )
            }
        };
        Ok(Arc::new(Field::new(SEM_MAP, ty.data_type(), true)))
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        not_lifted(SEM_MAP)
    }
}

/// The text of a string literal.
pub(crate) fn literal_text(v: &ScalarValue) -> Option<&str> {
    match v {
        ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) | ScalarValue::Utf8View(Some(s)) => Some(s),
        _ => None,
    }
}

/// A declared map type: `text` (or `string`, `varchar`), `integer` (`int`, `bigint`), `float` (`double`, `real`,
/// `number`), `boolean` (`bool`).
pub fn parse_type(name: &str) -> Result<ValueType> {
    Ok(match name.trim().to_ascii_lowercase().as_str() {
        "text" | "string" | "varchar" | "utf8" => ValueType::String,
        "integer" | "int" | "bigint" | "int64" => ValueType::Integer,
        "float" | "double" | "real" | "number" | "float64" => ValueType::Float,
        "boolean" | "bool" => ValueType::Boolean,
        other => {
            return plan_err!("sem_map type '{other}' is not one of 'text', 'integer', 'float', 'boolean'");
        }
    })
}

/// Both functions, to register with a DataFusion session.
pub fn udfs() -> Vec<ScalarUDF> {
    vec![ScalarUDF::new_from_impl(SemFilter::default()), ScalarUDF::new_from_impl(SemMap::default())]
}

/// Which semantic function `e` calls, if it is a call of one.
pub(crate) fn semantic_call(e: &Expr) -> Option<(&'static str, &ScalarFunction)> {
    match e {
        Expr::ScalarFunction(f) if f.func.name() == SEM_FILTER => Some((SEM_FILTER, f)),
        Expr::ScalarFunction(f) if f.func.name() == SEM_MAP => Some((SEM_MAP, f)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_types_parse_and_bad_ones_are_named() {
        assert_eq!(parse_type("Integer").unwrap(), ValueType::Integer);
        assert_eq!(parse_type(" text ").unwrap(), ValueType::String);
        assert_eq!(parse_type("double").unwrap(), ValueType::Float);
        assert_eq!(parse_type("bool").unwrap(), ValueType::Boolean);
        let e = parse_type("date").unwrap_err().to_string();
        assert!(e.contains("'date'") && e.contains("'integer'"), "{e}");
    }
}
