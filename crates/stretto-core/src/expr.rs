//! Relational expressions over plain columns: comparisons, boolean logic and null tests.
//!
//! They are evaluated with Arrow's vectorised kernels. Operands of different types are coerced the way a user
//! expects: numbers compare as `Float64`, anything compared with text compares as text.

use std::fmt;
use std::sync::Arc;

use arrow::array::{new_null_array, Array, ArrayRef, BooleanArray, Float64Array, RecordBatch, StringArray};
use arrow::compute::kernels::{boolean, cmp};
use arrow::compute::{cast, is_null};
use arrow::datatypes::{DataType, Schema};

use crate::error::{CoreError, Result};
use crate::table::resolve_column;

/// A literal value.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum Literal {
    /// A boolean.
    Bool(bool),
    /// A whole number.
    Int(i64),
    /// A real number.
    Float(f64),
    /// A string.
    Str(String),
}

impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Literal::Bool(b) => write!(f, "{b}"),
            Literal::Int(i) => write!(f, "{i}"),
            Literal::Float(x) => write!(f, "{x}"),
            Literal::Str(s) => write!(f, "{s:?}"),
        }
    }
}

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    /// `=`
    Eq,
    /// `!=`
    NotEq,
    /// `<`
    Lt,
    /// `<=`
    LtEq,
    /// `>`
    Gt,
    /// `>=`
    GtEq,
}

impl fmt::Display for CmpOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CmpOp::Eq => "=",
            CmpOp::NotEq => "!=",
            CmpOp::Lt => "<",
            CmpOp::LtEq => "<=",
            CmpOp::Gt => ">",
            CmpOp::GtEq => ">=",
        })
    }
}

/// A relational expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// A column, qualified (`reviews.reviewid`) or bare when unambiguous.
    Column(String),
    /// A constant.
    Literal(Literal),
    /// A comparison.
    Cmp(Box<Expr>, CmpOp, Box<Expr>),
    /// Both true.
    And(Box<Expr>, Box<Expr>),
    /// Either true.
    Or(Box<Expr>, Box<Expr>),
    /// Negation.
    Not(Box<Expr>),
    /// True where the operand is null.
    IsNull(Box<Expr>),
}

/// A column reference.
pub fn col(name: impl Into<String>) -> Expr {
    Expr::Column(name.into())
}

/// A literal.
pub fn lit(value: impl Into<Literal>) -> Expr {
    Expr::Literal(value.into())
}

impl From<bool> for Literal {
    fn from(v: bool) -> Self {
        Literal::Bool(v)
    }
}
impl From<i64> for Literal {
    fn from(v: i64) -> Self {
        Literal::Int(v)
    }
}
impl From<i32> for Literal {
    fn from(v: i32) -> Self {
        Literal::Int(v.into())
    }
}
impl From<f64> for Literal {
    fn from(v: f64) -> Self {
        Literal::Float(v)
    }
}
impl From<&str> for Literal {
    fn from(v: &str) -> Self {
        Literal::Str(v.to_string())
    }
}
impl From<String> for Literal {
    fn from(v: String) -> Self {
        Literal::Str(v)
    }
}

macro_rules! cmp_builder {
    ($($name:ident => $op:ident),*) => {$(
        #[doc = concat!("`self ", stringify!($name), " other`")]
        pub fn $name(self, other: Expr) -> Expr {
            Expr::Cmp(Box::new(self), CmpOp::$op, Box::new(other))
        }
    )*};
}

impl Expr {
    cmp_builder!(eq => Eq, not_eq => NotEq, lt => Lt, lt_eq => LtEq, gt => Gt, gt_eq => GtEq);

    /// Both `self` and `other`.
    pub fn and(self, other: Expr) -> Expr {
        Expr::And(Box::new(self), Box::new(other))
    }

    /// Either `self` or `other`.
    pub fn or(self, other: Expr) -> Expr {
        Expr::Or(Box::new(self), Box::new(other))
    }

    /// Negation.
    #[allow(clippy::should_implement_trait)]
    pub fn not(self) -> Expr {
        Expr::Not(Box::new(self))
    }

    /// Null test.
    pub fn is_null(self) -> Expr {
        Expr::IsNull(Box::new(self))
    }

    /// The column references in this expression, as written.
    pub fn columns(&self) -> Vec<&str> {
        let mut out = Vec::new();
        self.visit_columns(&mut out);
        out
    }

    fn visit_columns<'a>(&'a self, out: &mut Vec<&'a str>) {
        match self {
            Expr::Column(c) => out.push(c),
            Expr::Literal(_) => {}
            Expr::Cmp(a, _, b) | Expr::And(a, b) | Expr::Or(a, b) => {
                a.visit_columns(out);
                b.visit_columns(out);
            }
            Expr::Not(a) | Expr::IsNull(a) => a.visit_columns(out),
        }
    }

    /// Checks that every column resolves in `schema`.
    pub fn validate(&self, schema: &Schema) -> Result<()> {
        for c in self.columns() {
            resolve_column(schema, c, &format!("expression {self}"))?;
        }
        Ok(())
    }

    /// Evaluates a predicate to a boolean mask (null counts as false when filtering).
    pub fn evaluate_predicate(&self, batch: &RecordBatch) -> Result<BooleanArray> {
        let value = self.evaluate(batch)?;
        value
            .as_any()
            .downcast_ref::<BooleanArray>()
            .cloned()
            .ok_or_else(|| self.err(format!("is of type {}, not a boolean predicate", value.data_type())))
    }

    /// Evaluates the expression to one array of `batch.num_rows()` values.
    pub fn evaluate(&self, batch: &RecordBatch) -> Result<ArrayRef> {
        let n = batch.num_rows();
        match self {
            Expr::Column(c) => {
                Ok(batch.column(resolve_column(&batch.schema(), c, &format!("expression {self}"))?).clone())
            }
            Expr::Literal(l) => Ok(literal_array(l, n)),
            Expr::Cmp(a, op, b) => {
                let (a, b) = coerce(a.evaluate(batch)?, b.evaluate(batch)?).map_err(|m| self.err(m))?;
                let r = match op {
                    CmpOp::Eq => cmp::eq(&a, &b),
                    CmpOp::NotEq => cmp::neq(&a, &b),
                    CmpOp::Lt => cmp::lt(&a, &b),
                    CmpOp::LtEq => cmp::lt_eq(&a, &b),
                    CmpOp::Gt => cmp::gt(&a, &b),
                    CmpOp::GtEq => cmp::gt_eq(&a, &b),
                };
                Ok(Arc::new(r.map_err(|e| self.err(e.to_string()))?))
            }
            Expr::And(a, b) | Expr::Or(a, b) => {
                let a = a.evaluate_predicate(batch)?;
                let b = b.evaluate_predicate(batch)?;
                let r = if matches!(self, Expr::And(..)) {
                    boolean::and_kleene(&a, &b)
                } else {
                    boolean::or_kleene(&a, &b)
                };
                Ok(Arc::new(r.map_err(|e| self.err(e.to_string()))?))
            }
            Expr::Not(a) => {
                Ok(Arc::new(boolean::not(&a.evaluate_predicate(batch)?).map_err(|e| self.err(e.to_string()))?))
            }
            Expr::IsNull(a) => {
                let v = a.evaluate(batch)?;
                Ok(Arc::new(is_null(&v).map_err(|e| self.err(e.to_string()))?))
            }
        }
    }

    fn err(&self, message: impl Into<String>) -> CoreError {
        CoreError::Expr { expr: self.to_string(), message: message.into() }
    }
}

/// Drops nulls from a mask so filtering treats unknown as false.
pub fn null_as_false(mask: &BooleanArray) -> BooleanArray {
    mask.iter().map(|v| Some(v.unwrap_or(false))).collect()
}

fn literal_array(l: &Literal, n: usize) -> ArrayRef {
    match l {
        Literal::Bool(b) => Arc::new(BooleanArray::from(vec![*b; n])),
        Literal::Int(i) => Arc::new(arrow::array::Int64Array::from(vec![*i; n])),
        Literal::Float(x) => Arc::new(Float64Array::from(vec![*x; n])),
        Literal::Str(s) => Arc::new(StringArray::from(vec![s.as_str(); n])),
    }
}

fn is_numeric(t: &DataType) -> bool {
    t.is_numeric()
}

/// Brings two operands to one comparable type.
fn coerce(a: ArrayRef, b: ArrayRef) -> std::result::Result<(ArrayRef, ArrayRef), String> {
    let (ta, tb) = (a.data_type().clone(), b.data_type().clone());
    if ta == tb {
        return Ok((a, b));
    }
    let target = if ta == DataType::Null {
        tb.clone()
    } else if tb == DataType::Null {
        ta.clone()
    } else if is_numeric(&ta) && is_numeric(&tb) {
        DataType::Float64
    } else if matches!(ta, DataType::Utf8 | DataType::LargeUtf8) || matches!(tb, DataType::Utf8 | DataType::LargeUtf8) {
        DataType::Utf8
    } else {
        return Err(format!("cannot compare {ta} with {tb}"));
    };
    let conv = |x: ArrayRef| -> std::result::Result<ArrayRef, String> {
        if *x.data_type() == DataType::Null {
            Ok(new_null_array(&target, x.len()))
        } else {
            cast(&x, &target).map_err(|e| e.to_string())
        }
    };
    Ok((conv(a)?, conv(b)?))
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Column(c) => write!(f, "{c}"),
            Expr::Literal(l) => write!(f, "{l}"),
            Expr::Cmp(a, op, b) => write!(f, "({a} {op} {b})"),
            Expr::And(a, b) => write!(f, "({a} AND {b})"),
            Expr::Or(a, b) => write!(f, "({a} OR {b})"),
            Expr::Not(a) => write!(f, "NOT {a}"),
            Expr::IsNull(a) => write!(f, "{a} IS NULL"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;
    use arrow::datatypes::Field;

    fn batch() -> RecordBatch {
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("t.n", DataType::Int64, true),
                Field::new("t.s", DataType::Utf8, true),
            ])),
            vec![
                Arc::new(Int64Array::from(vec![Some(1), Some(5), None])),
                Arc::new(StringArray::from(vec!["a", "b", "c"])),
            ],
        )
        .unwrap()
    }

    #[test]
    fn compares_with_coercion_and_kleene_logic() {
        let b = batch();
        let m = col("n").gt(lit(1.5)).or(col("t.s").eq(lit("a"))).evaluate_predicate(&b).unwrap();
        assert_eq!(null_as_false(&m).iter().collect::<Vec<_>>(), vec![Some(true), Some(true), Some(false)]);
        let m = col("n").is_null().evaluate_predicate(&b).unwrap();
        assert_eq!(m.iter().collect::<Vec<_>>(), vec![Some(false), Some(false), Some(true)]);
    }

    #[test]
    fn non_boolean_predicate_is_an_error() {
        let err = col("n").evaluate_predicate(&batch()).unwrap_err();
        assert!(matches!(err, CoreError::Expr { .. }), "{err}");
    }

    #[test]
    fn unknown_column_is_named() {
        let err = col("missing").eq(lit(1)).evaluate(&batch()).unwrap_err().to_string();
        assert!(err.contains("missing") && err.contains("t.n"), "{err}");
    }
}
