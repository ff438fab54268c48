//! Tables as Arrow record batches, and CSV loading with a declared schema.
//!
//! Stretto keeps the column *kind* a user thinks in (text, integer, number, boolean, image) in each Arrow field's
//! metadata under [`KIND_KEY`], because an image column is physically a string (a path or URL) or binary (bytes)
//! and operators must be able to tell it from text.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use crate::error::{CoreError, Result};

/// Field-metadata key that records a column's [`ColumnKind`].
pub const KIND_KEY: &str = "stretto.kind";

/// What a column holds, as a user of semantic queries sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ColumnKind {
    /// Free text (`Utf8`).
    Text,
    /// Whole numbers (`Int64`).
    Integer,
    /// Real numbers (`Float64`).
    Number,
    /// Booleans; CSV accepts `true`/`false` in any case.
    Boolean,
    /// An image: a local path or URL (`Utf8`) or the encoded bytes (`Binary`). The image operators read local paths;
    /// Stretto's readers refuse bytes.
    Image,
}

impl ColumnKind {
    /// The Arrow type a CSV column of this kind is parsed into.
    pub fn data_type(self) -> DataType {
        match self {
            ColumnKind::Text | ColumnKind::Image => DataType::Utf8,
            ColumnKind::Integer => DataType::Int64,
            ColumnKind::Number => DataType::Float64,
            ColumnKind::Boolean => DataType::Boolean,
        }
    }

    /// The name stored in field metadata.
    pub fn as_str(self) -> &'static str {
        match self {
            ColumnKind::Text => "text",
            ColumnKind::Integer => "integer",
            ColumnKind::Number => "number",
            ColumnKind::Boolean => "boolean",
            ColumnKind::Image => "image",
        }
    }

    /// Parses the name stored in field metadata.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "text" => ColumnKind::Text,
            "integer" => ColumnKind::Integer,
            "number" => ColumnKind::Number,
            "boolean" => ColumnKind::Boolean,
            "image" => ColumnKind::Image,
            _ => return None,
        })
    }

    /// The kind of an Arrow field: its metadata if present, else derived from the Arrow type.
    pub fn of_field(field: &Field) -> Self {
        if let Some(kind) = field.metadata().get(KIND_KEY).and_then(|k| Self::parse(k)) {
            return kind;
        }
        match field.data_type() {
            DataType::Boolean => ColumnKind::Boolean,
            DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => ColumnKind::Integer,
            DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => ColumnKind::Integer,
            DataType::Float16 | DataType::Float32 | DataType::Float64 => ColumnKind::Number,
            DataType::Binary | DataType::LargeBinary => ColumnKind::Image,
            _ => ColumnKind::Text,
        }
    }

    /// An Arrow field of this kind, with the kind recorded in its metadata.
    pub fn field(self, name: impl Into<String>) -> Field {
        Field::new(name, self.data_type(), true)
            .with_metadata(HashMap::from([(KIND_KEY.to_string(), self.as_str().to_string())]))
    }
}

/// The declared schema of a CSV table: the kind of each column that is not plain text.
///
/// Columns the file has but the schema does not name are loaded as [`ColumnKind::Text`], so a schema only has to
/// mention what needs parsing; a declared column that the file lacks is an error naming it.
#[derive(Debug, Clone, Default)]
pub struct TableSchema {
    columns: Vec<(String, ColumnKind)>,
}

impl TableSchema {
    /// An empty schema: every column is text.
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares the kind of one column.
    pub fn with(mut self, column: impl Into<String>, kind: ColumnKind) -> Self {
        self.columns.push((column.into(), kind));
        self
    }

    /// The declared kind of `column`, if any.
    pub fn kind_of(&self, column: &str) -> Option<ColumnKind> {
        self.columns.iter().find(|(c, _)| c == column).map(|(_, k)| *k)
    }

    /// The declared columns.
    pub fn columns(&self) -> &[(String, ColumnKind)] {
        &self.columns
    }
}

/// Loads a CSV file with a header row into one record batch, parsing columns as `schema` declares.
pub fn load_csv(path: impl AsRef<Path>, schema: &TableSchema) -> Result<RecordBatch> {
    let path = path.as_ref();
    let open = || File::open(path).map_err(|source| CoreError::Io { path: path.to_path_buf(), source });
    let csv_err = |e: arrow::error::ArrowError| CoreError::Csv { path: path.to_path_buf(), message: e.to_string() };

    let header = read_header(path)?;
    for (declared, _) in schema.columns() {
        if !header.iter().any(|h| h == declared) {
            return Err(CoreError::MissingColumn {
                column: declared.clone(),
                context: format!("CSV header of {}", path.display()),
                available: header.join(", "),
            });
        }
    }
    let fields: Vec<Field> =
        header.iter().map(|h| schema.kind_of(h).unwrap_or(ColumnKind::Text).field(h.clone())).collect();
    let arrow_schema: SchemaRef = Arc::new(Schema::new(fields));
    let reader = arrow::csv::ReaderBuilder::new(arrow_schema.clone())
        .with_header(true)
        .with_batch_size(8192)
        .build(open()?)
        .map_err(csv_err)?;
    let mut batches = Vec::new();
    for batch in reader {
        batches.push(batch.map_err(csv_err)?);
    }
    arrow::compute::concat_batches(&arrow_schema, &batches).map_err(csv_err)
}

/// Reads the header row with the same CSV dialect arrow uses, so quoted names are handled.
fn read_header(path: &Path) -> Result<Vec<String>> {
    let file = File::open(path).map_err(|source| CoreError::Io { path: path.to_path_buf(), source })?;
    let (schema, _) = arrow::csv::reader::Format::default()
        .with_header(true)
        .infer_schema(file, Some(0))
        .map_err(|e| CoreError::Csv { path: path.to_path_buf(), message: e.to_string() })?;
    let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
    if names.is_empty() {
        return Err(CoreError::Csv { path: path.to_path_buf(), message: "no header row".into() });
    }
    Ok(names)
}

/// Resolves a user's column reference against a schema.
///
/// `reference` may be qualified (`table.column`, matched exactly) or bare (`column`, matched against the part after
/// the last qualifier when unique). `context` says where the reference appeared, for the error message.
pub fn resolve_column(schema: &Schema, reference: &str, context: &str) -> Result<usize> {
    if let Ok(i) = schema.index_of(reference) {
        return Ok(i);
    }
    let matches: Vec<usize> = schema
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| f.name().rsplit_once('.').is_some_and(|(_, bare)| bare == reference))
        .map(|(i, _)| i)
        .collect();
    match matches.as_slice() {
        [i] => Ok(*i),
        [] => Err(CoreError::MissingColumn {
            column: reference.to_string(),
            context: context.to_string(),
            available: schema.fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>().join(", "),
        }),
        many => Err(CoreError::AmbiguousColumn {
            column: reference.to_string(),
            context: context.to_string(),
            candidates: many.iter().map(|i| schema.field(*i).name().as_str()).collect::<Vec<_>>().join(", "),
        }),
    }
}

/// The first two columns of `schema` with the same name, as 0-based positions (`None`: every name is unique). A
/// table naming two columns alike cannot be queried: a prompt's `{table.column}` could not say which it means.
pub fn repeated_column(schema: &Schema) -> Option<(usize, usize)> {
    let fields = schema.fields();
    (1..fields.len()).find_map(|j| fields[..j].iter().position(|f| f.name() == fields[j].name()).map(|i| (i, j)))
}

/// What [`repeated_column`] finds, said the one way every reader and writer says it: "columns 1 and 3 are both named
/// `a`" (1-based, as a user counts).
pub fn repeated_column_note(schema: &Schema) -> Option<String> {
    repeated_column(schema)
        .map(|(i, j)| format!("columns {} and {} are both named `{}`", i + 1, j + 1, schema.field(j).name()))
}

/// `prompt` with each `{reference}` that names no column as written, but one column when read as SQL reads an
/// unquoted identifier (case-insensitively: `FROM MyT` is table `myt`), written as that column's name. So
/// `sem_filter('{MyT.text} is positive')` asks about `myt.text`, as `SELECT MyT.text` reads it, and a frame over
/// `Reviews.csv` answers `{reviews.text}`. A reference that
/// resolves as written (exactly, or as a unique bare column name), or matches no column or several, is kept, and
/// the check that follows names the problem.
pub fn canonical_references(prompt: &str, schema: &Schema) -> String {
    let canonical = |r: &str| -> Option<String> {
        if resolve_column(schema, r, "").is_ok() {
            return None;
        }
        let matching = |name: &str| {
            name.eq_ignore_ascii_case(r) || name.rsplit_once('.').is_some_and(|(_, bare)| bare.eq_ignore_ascii_case(r))
        };
        let mut found = schema.fields().iter().filter(|f| matching(f.name()));
        match (found.next(), found.next()) {
            (Some(f), None) => Some(f.name().clone()),
            _ => None,
        }
    };
    let mut out = String::with_capacity(prompt.len());
    let mut rest = prompt;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}').map(|c| open + c) else { break };
        out.push_str(&rest[..open]);
        match canonical(rest[open + 1..close].trim()) {
            Some(name) => out.push_str(&format!("{{{name}}}")),
            None => out.push_str(&rest[open..=close]),
        }
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

/// Renames every column of `batch` to `table.column`, keeping metadata, so columns of joined tables stay distinct.
/// A batch naming two columns alike is refused ([`repeated_column`]).
pub fn qualify(table: &str, batch: &RecordBatch) -> Result<RecordBatch> {
    if let Some(note) = repeated_column_note(batch.schema_ref()) {
        return Err(CoreError::InvalidLogicalPlan(format!(
            "in table {table}, {note}: a prompt could not say which it means; rename one"
        )));
    }
    let fields: Vec<Field> =
        batch.schema().fields().iter().map(|f| f.as_ref().clone().with_name(format!("{table}.{}", f.name()))).collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), batch.columns().to_vec())
        .map_err(|e| CoreError::arrow(format!("qualifying table {table}"), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::Int64Type;
    use std::io::Write;

    fn write(content: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(content.as_bytes()).unwrap();
        f
    }

    #[test]
    fn qualifying_a_batch_that_names_two_columns_alike_is_refused() {
        use arrow::array::Int64Array;
        use arrow::datatypes::DataType;
        let schema = Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("b", DataType::Int64, true),
            Field::new("a", DataType::Int64, true),
        ]);
        let col = Arc::new(Int64Array::from(vec![1])) as arrow::array::ArrayRef;
        let batch = RecordBatch::try_new(Arc::new(schema), vec![col.clone(), col.clone(), col]).unwrap();
        let e = qualify("t", &batch).unwrap_err().to_string();
        assert!(e.contains("table t, columns 1 and 3 are both named `a`"), "{e}");
        assert_eq!(repeated_column(batch.schema_ref()), Some((0, 2)));
        assert_eq!(qualify("t", &batch.project(&[0, 1]).unwrap()).unwrap().schema().field(1).name(), "t.b");
    }

    #[test]
    fn loads_kinds_and_multiline_text() {
        let f = write("id,text,ok,score\n1,\"two\nlines\",True,0.5\n2,plain,false,\n");
        let schema = TableSchema::new()
            .with("id", ColumnKind::Integer)
            .with("ok", ColumnKind::Boolean)
            .with("score", ColumnKind::Number);
        let batch = load_csv(f.path(), &schema).unwrap();
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(batch.column(0).as_primitive::<Int64Type>().value(1), 2);
        assert_eq!(batch.column(1).as_string::<i32>().value(0), "two\nlines");
        assert!(batch.column(2).as_boolean().value(0));
        assert!(batch.column(3).is_null(1));
        assert_eq!(ColumnKind::of_field(batch.schema().field(1)), ColumnKind::Text);
    }

    #[test]
    fn malformed_csv_names_the_file() {
        let f = write("a,b\n1,2\n3,4,5\n");
        let err = load_csv(f.path(), &TableSchema::new()).unwrap_err();
        assert!(matches!(err, CoreError::Csv { .. }), "{err}");
        assert!(err.to_string().contains(&f.path().display().to_string()));
    }

    #[test]
    fn unparseable_number_is_a_csv_error() {
        let f = write("a\n1\nx\n");
        let err = load_csv(f.path(), &TableSchema::new().with("a", ColumnKind::Integer)).unwrap_err();
        assert!(matches!(err, CoreError::Csv { .. }), "{err}");
    }

    #[test]
    fn declared_column_missing_from_header() {
        let f = write("a,b\n1,2\n");
        let err = load_csv(f.path(), &TableSchema::new().with("c", ColumnKind::Integer)).unwrap_err();
        match err {
            CoreError::MissingColumn { column, available, .. } => {
                assert_eq!(column, "c");
                assert_eq!(available, "a, b");
            }
            other => panic!("unexpected {other}"),
        }
    }

    #[test]
    fn resolves_bare_and_qualified_names() {
        let schema = Schema::new(vec![
            Field::new("r.id", DataType::Int64, true),
            Field::new("r.text", DataType::Utf8, true),
            Field::new("m.id", DataType::Int64, true),
        ]);
        assert_eq!(resolve_column(&schema, "text", "t").unwrap(), 1);
        assert_eq!(resolve_column(&schema, "m.id", "t").unwrap(), 2);
        assert!(matches!(resolve_column(&schema, "id", "t"), Err(CoreError::AmbiguousColumn { .. })));
        assert!(matches!(resolve_column(&schema, "nope", "t"), Err(CoreError::MissingColumn { .. })));
    }
}
