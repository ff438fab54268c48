//! Reading user tables (CSV, TSV, Parquet, JSON lines or arrays) with Arrow's and Parquet's own readers, and
//! writing results atomically: a result file appears whole or not at all.

use std::fs::File;
use std::io::Seek;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use stretto_core::table::ColumnKind;

use crate::error::{Error, Result};

/// How to read a CSV file.
#[derive(Debug, Clone)]
pub struct CsvOptions {
    /// Field delimiter.
    pub delimiter: u8,
    /// Whether the first line names the columns (otherwise they are `column_1`, `column_2`...).
    pub has_header: bool,
    /// Columns that hold image paths (relative paths resolve against the file's folder).
    pub image_columns: Vec<String>,
}

impl Default for CsvOptions {
    fn default() -> Self {
        Self { delimiter: b',', has_header: true, image_columns: Vec::new() }
    }
}

impl CsvOptions {
    /// Marks `column` as holding image paths.
    pub fn with_image_column(mut self, column: impl Into<String>) -> Self {
        self.image_columns.push(column.into());
        self
    }

    /// Another delimiter (`b'\t'` for TSV).
    pub fn with_delimiter(mut self, delimiter: u8) -> Self {
        self.delimiter = delimiter;
        self
    }
}

/// How to read Parquet or NDJSON files.
#[derive(Debug, Clone, Default)]
pub struct ReadOptions {
    /// Columns that hold image paths (relative paths resolve against the file's folder; image bytes are refused,
    /// since the image operators read files).
    pub image_columns: Vec<String>,
}

impl ReadOptions {
    /// Marks `column` as holding images.
    pub fn with_image_column(mut self, column: impl Into<String>) -> Self {
        self.image_columns.push(column.into());
        self
    }
}

fn open(path: &Path) -> Result<File> {
    File::open(path).map_err(|e| {
        let what = if e.kind() == std::io::ErrorKind::NotFound { "no such file" } else { "cannot open it" };
        Error::Read { path: path.into(), location: None, message: what.into(), source: Some(Box::new(e)) }
    })
}

fn arrow_read(path: &Path, e: arrow::error::ArrowError) -> Error {
    // Arrow's CSV and JSON readers name the line in their message ("... for line 3 ..."). Some quote the whole
    // value they choke on, which may be the whole file: the message is cut short (the source keeps it all).
    const LONGEST: usize = 400;
    let mut message = e.to_string();
    if message.len() > LONGEST {
        let cut = (0..=LONGEST).rev().find(|&i| message.is_char_boundary(i)).unwrap_or(0);
        message.truncate(cut);
        message.push_str(" …");
    }
    Error::Read { path: path.into(), location: None, message, source: Some(Box::new(e)) }
}

/// Reads a CSV file into one batch. Column types are inferred from every row (a value late in the file that is not
/// a number keeps its column text), and a numeric-looking column with a value written with a leading zero (`02134`,
/// `007`) stays text: read as a number it would lose the zero, in the prompts and in the result.
pub fn read_csv(path: &Path, options: &CsvOptions) -> Result<RecordBatch> {
    let mut file = open(path)?;
    let format =
        arrow::csv::reader::Format::default().with_header(options.has_header).with_delimiter(options.delimiter);
    let (inferred, _) = format.infer_schema(&mut file, None).map_err(|e| arrow_read(path, e))?;
    if inferred.fields().is_empty() {
        return Err(Error::read(path, None, "the file has no columns"));
    }
    // Numbers are read as text first, then cast unless a value has a leading zero.
    let numeric = |t: &DataType| matches!(t, DataType::Int64 | DataType::Float64);
    let schema = Schema::new(
        inferred
            .fields()
            .iter()
            .map(|f| {
                if numeric(f.data_type()) {
                    f.as_ref().clone().with_data_type(DataType::Utf8)
                } else {
                    f.as_ref().clone()
                }
            })
            .collect::<Vec<_>>(),
    );
    file.rewind().map_err(|e| Error::Read {
        path: path.into(),
        location: None,
        message: "cannot rewind".into(),
        source: Some(Box::new(e)),
    })?;
    let schema = Arc::new(schema);
    let reader = arrow::csv::ReaderBuilder::new(schema.clone())
        .with_format(format)
        .with_batch_size(8192)
        .build(file)
        .map_err(|e| arrow_read(path, e))?;
    let batches = reader.collect::<std::result::Result<Vec<_>, _>>().map_err(|e| arrow_read(path, e))?;
    let batch = arrow::compute::concat_batches(&schema, &batches)?;
    // A failed cast (a whole number too long for 64 bits: an account number) keeps the column text too; a safe cast
    // would have made such values null.
    let strict = arrow::compute::CastOptions { safe: false, ..Default::default() };
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for (i, f) in inferred.fields().iter().enumerate() {
        let read = batch.column(i);
        let number = (numeric(f.data_type()) && !read.as_string::<i32>().iter().flatten().any(leading_zero))
            .then(|| arrow::compute::cast_with_options(read, f.data_type(), &strict).ok())
            .flatten();
        match number {
            Some(number) => {
                fields.push(f.as_ref().clone());
                columns.push(number);
            }
            None => {
                fields.push(schema.field(i).clone());
                columns.push(read.clone());
            }
        }
    }
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?;
    mark_images(path, batch, &options.image_columns)
}

/// A number written with a leading zero (`007`, `-01.5`), which reading it as a number would drop.
fn leading_zero(value: &str) -> bool {
    let digits = value.trim().trim_start_matches(['-', '+']).as_bytes();
    digits.len() > 1 && digits[0] == b'0' && digits[1].is_ascii_digit()
}

/// Reads a Parquet file into one batch.
///
/// A damaged file is an error, never a panic: the `parquet` crate's decoders assert on some corrupt encodings
/// (`num_bits <= size_of::<T>() * 8` in its RLE reader, found by the fuzz tests), so a panic while decoding is
/// caught here and reported as a read error of the file.
pub fn read_parquet(path: &Path, options: &ReadOptions) -> Result<RecordBatch> {
    let file = open(path)?;
    let batch = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decode_parquet(path, file))) {
        Ok(r) => r?,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".into());
            return Err(Error::read(path, None, format!("the Parquet file is damaged (its decoder failed: {what})")));
        }
    };
    mark_images(path, batch, &options.image_columns)
}

fn decode_parquet(path: &Path, file: std::fs::File) -> Result<RecordBatch> {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let parquet_err = |location: Option<String>, e: Box<dyn std::error::Error + Send + Sync>| Error::Read {
        path: path.into(),
        location,
        message: e.to_string(),
        source: Some(e),
    };
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| parquet_err(None, Box::new(e)))?;
    let schema = builder.schema().clone();
    let groups = builder.metadata().num_row_groups();
    let reader = builder.with_batch_size(8192).build().map_err(|e| parquet_err(None, Box::new(e)))?;
    let mut batches = Vec::new();
    for batch in reader {
        // The reader goes group by group; a failure names how far it got.
        let at = Some(format!(
            "after {} rows in {groups} row groups",
            batches.iter().map(RecordBatch::num_rows).sum::<usize>()
        ));
        batches.push(batch.map_err(|e| parquet_err(at, Box::new(e)))?);
    }
    Ok(arrow::compute::concat_batches(&schema, &batches)?)
}

/// Reads a JSON file into one batch: newline-delimited objects (one per line), or an array of objects (what
/// `json.dump(records)` or pandas' `to_json(orient='records')` writes). Types are inferred from every row.
pub fn read_json(path: &Path, options: &ReadOptions) -> Result<RecordBatch> {
    use std::io::Read;
    let mut bytes = Vec::new();
    open(path)?.read_to_end(&mut bytes).map_err(|e| Error::Read {
        path: path.into(),
        location: None,
        message: "cannot read it".into(),
        source: Some(Box::new(e)),
    })?;
    let text = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&bytes);
    let array = text.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[');
    let batch = if array { read_json_array(path, text)? } else { read_ndjson(path, text)? };
    // pandas' default `to_json()` writes one object of columns, each an object of row → value: read as lines, that is
    // one row of structs, nothing like the table.
    if batch.num_rows() == 1 && batch.columns().iter().all(|c| matches!(c.data_type(), DataType::Struct(_))) {
        return Err(Error::read(
            path,
            None,
            "one JSON object whose every field is an object: columns, as pandas' default to_json() writes them? Write \
             one object per row: to_json(orient='records', lines=True)",
        ));
    }
    mark_images(path, batch, &options.image_columns)
}

fn read_ndjson(path: &Path, text: &[u8]) -> Result<RecordBatch> {
    let (schema, _) = arrow::json::reader::infer_json_schema_from_seekable(std::io::Cursor::new(text), None)
        .map_err(|e| arrow_read(path, e))?;
    if schema.fields().is_empty() {
        return Err(Error::read(path, None, "no JSON object with fields"));
    }
    let schema = Arc::new(schema);
    let reader = arrow::json::ReaderBuilder::new(schema.clone())
        .with_batch_size(8192)
        .build(std::io::Cursor::new(text))
        .map_err(|e| arrow_read(path, e))?;
    let batches = reader.collect::<std::result::Result<Vec<_>, _>>().map_err(|e| arrow_read(path, e))?;
    Ok(arrow::compute::concat_batches(&schema, &batches)?)
}

/// An array of objects, read without a `serde_json::Value` of the whole file: the array is split into its elements'
/// texts (borrowed from `text`), types are inferred from one parsed element at a time, and Arrow's decoder reads the
/// elements' texts as it reads JSON lines. Beside the file's bytes, memory holds 16 bytes per element, one parsed
/// element, and the batches (twice, at their concatenation).
fn read_json_array(path: &Path, text: &[u8]) -> Result<RecordBatch> {
    use serde_json::value::RawValue;
    let elements: Vec<&RawValue> = serde_json::from_slice(text)
        .map_err(|e| Error::read(path, None, format!("not a JSON array of objects: {e}")))?;
    if let Some(i) = elements.iter().position(|v| !v.get().starts_with('{')) {
        return Err(Error::read(path, None, format!("element {} of the JSON array is not an object", i + 1)));
    }
    let parsed = elements.iter().map(|v| {
        serde_json::from_str::<serde_json::Value>(v.get())
            .map_err(|e| arrow::error::ArrowError::JsonError(e.to_string()))
    });
    let schema = arrow::json::reader::infer_json_schema_from_iterator(parsed).map_err(|e| arrow_read(path, e))?;
    if schema.fields().is_empty() {
        return Err(Error::read(path, None, "no JSON object with fields"));
    }
    let schema = Arc::new(schema);
    let mut decoder = arrow::json::ReaderBuilder::new(schema.clone())
        .with_batch_size(8192)
        .build_decoder()
        .map_err(|e| arrow_read(path, e))?;
    let mut batches = Vec::new();
    for element in &elements {
        let mut rest = element.get().as_bytes();
        loop {
            let read = decoder.decode(rest).map_err(|e| arrow_read(path, e))?;
            rest = &rest[read..];
            if rest.is_empty() {
                break;
            }
            // The decoder holds a full batch: take it and carry on where it stopped.
            match decoder.flush().map_err(|e| arrow_read(path, e))? {
                Some(batch) => batches.push(batch),
                None if read == 0 => return Err(Error::read(path, None, "Arrow's JSON decoder stopped reading")),
                None => {}
            }
        }
    }
    batches.extend(decoder.flush().map_err(|e| arrow_read(path, e))?);
    Ok(arrow::compute::concat_batches(&schema, &batches)?)
}

/// Refuses a file that names two columns alike (a CSV header can): a prompt's `{table.column}` could not say
/// which it means, and the result's rows (column → value) would keep one. Then records the image kind of `columns`
/// in their metadata; path columns get relative paths resolved against the file's folder, and every path must
/// exist.
fn mark_images(path: &Path, batch: RecordBatch, columns: &[String]) -> Result<RecordBatch> {
    if let Some(note) = stretto_core::table::repeated_column_note(batch.schema_ref()) {
        return Err(Error::read(path, None, format!("{note}; rename one")));
    }
    if columns.is_empty() {
        return Ok(batch);
    }
    let schema = batch.schema();
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut arrays: Vec<ArrayRef> = batch.columns().to_vec();
    for c in columns {
        let idx = schema.index_of(c).map_err(|_| {
            let available: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            Error::read(
                path,
                Some(format!("column {c}")),
                format!("no such column to read images from; columns: {}", available.join(", ")),
            )
        })?;
        let kind = ColumnKind::Image.field(c.clone());
        // Paths in any of Arrow's string layouts (pandas' and polars' `large_string`, views, dictionaries) read alike.
        let text = |t: &DataType| matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View);
        let other_layout = match arrays[idx].data_type() {
            DataType::Dictionary(_, values) => text(values),
            t => text(t) && *t != DataType::Utf8,
        };
        if other_layout {
            arrays[idx] = arrow::compute::cast(&arrays[idx], &DataType::Utf8)?;
        }
        match arrays[idx].data_type() {
            DataType::Utf8 => {
                let strings = arrays[idx].as_string::<i32>();
                let mut resolved = Vec::with_capacity(strings.len());
                for row in 0..strings.len() {
                    if strings.is_null(row) || strings.value(row).is_empty() {
                        resolved.push(None);
                        continue;
                    }
                    let value = strings.value(row);
                    if value.starts_with("http://") || value.starts_with("https://") {
                        return Err(Error::read(
                            path,
                            Some(format!("row {}, column {c}", row + 1)),
                            format!(
                                "image {value} is a URL: the image operators read local files and Stretto downloads \
                                 nothing; fetch the images and give their paths"
                            ),
                        ));
                    }
                    let p = PathBuf::from(value);
                    // Absolute, whatever the working directory: the path is the image's memo key, and the value a
                    // written result holds.
                    let full =
                        if p.is_absolute() { p } else { std::path::absolute(base.join(&p)).unwrap_or(base.join(p)) };
                    if !full.is_file() {
                        return Err(Error::read(
                            path,
                            Some(format!("row {}, column {c}", row + 1)),
                            format!("image {} does not exist", full.display()),
                        ));
                    }
                    resolved.push(Some(full.display().to_string()));
                }
                arrays[idx] = Arc::new(StringArray::from(resolved));
                fields[idx] = kind;
            }
            // The image operators read image files; bytes would reach them as text and fail there, tuple by tuple.
            DataType::Binary | DataType::LargeBinary => {
                return Err(Error::read(
                    path,
                    Some(format!("column {c}")),
                    "holds image bytes, and the image operators read image files: write the images to files and \
                     give their paths",
                ))
            }
            other => {
                return Err(Error::read(
                    path,
                    Some(format!("column {c}")),
                    format!("an image column holds paths (text) or bytes, not {other}"),
                ))
            }
        }
    }
    let schema: SchemaRef = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
    Ok(RecordBatch::try_new(schema, arrays)?)
}

/// The format of a file, from its extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    /// Comma-separated values with a header row.
    Csv,
    /// Tab-separated values with a header row.
    Tsv,
    /// Apache Parquet.
    Parquet,
    /// Newline-delimited JSON.
    Json,
}

impl FileFormat {
    /// The format `path`'s extension names (`.csv`, `.tsv`, `.parquet`/`.pq`, `.json`/`.jsonl`/`.ndjson`).
    pub fn of(path: &Path) -> Result<Self> {
        let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("csv") => Ok(FileFormat::Csv),
            Some("tsv") => Ok(FileFormat::Tsv),
            Some("parquet" | "pq") => Ok(FileFormat::Parquet),
            Some("json" | "jsonl" | "ndjson") => Ok(FileFormat::Json),
            _ => Err(Error::Query(format!(
                "cannot tell the format of {} from its extension; use .csv, .tsv, .parquet or .jsonl/.ndjson/.json",
                path.display()
            ))),
        }
    }
}

/// The table name of a file: its stem, with characters a table name cannot hold replaced by `_`.
pub fn table_name(path: &Path) -> Result<String> {
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .ok_or_else(|| Error::Query(format!("{} has no file name to name its table after", path.display())))?;
    Ok(stem.chars().map(|c| if c.is_alphanumeric() || c == '_' { c } else { '_' }).collect())
}

/// Reads a CSV, TSV, Parquet or JSON file, by its extension, with default options.
pub fn read_path(path: &Path) -> Result<RecordBatch> {
    read_path_with(path, &ReadOptions::default())
}

/// Reads a CSV, TSV, Parquet or JSON file, by its extension, with `options`' image columns (a CSV's delimiter and
/// header stay the defaults).
pub fn read_path_with(path: &Path, options: &ReadOptions) -> Result<RecordBatch> {
    match FileFormat::of(path)? {
        FileFormat::Csv => {
            read_csv(path, &CsvOptions { image_columns: options.image_columns.clone(), ..CsvOptions::default() })
        }
        FileFormat::Tsv => read_csv(
            path,
            &CsvOptions { image_columns: options.image_columns.clone(), ..CsvOptions::default().with_delimiter(b'\t') },
        ),
        FileFormat::Parquet => read_parquet(path, options),
        FileFormat::Json => read_json(path, options),
    }
}

/// Writes `batch` to `path` in `format`, atomically: the data goes to a temporary file in the same folder, which
/// replaces `path` only once complete; on any error nothing is left behind. A batch naming two columns alike is
/// refused, as the readers refuse such a file: name them apart (SQL's `AS`).
pub fn write(batch: &RecordBatch, path: &Path, format: FileFormat) -> Result<()> {
    if let Some(note) = stretto_core::table::repeated_column_note(batch.schema_ref()) {
        return Err(Error::write(path, format!("{note} in the result; name them apart (in SQL, with AS)"), None));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        return Err(Error::write(path, format!("folder {} does not exist", dir.display()), None));
    }
    if path.is_dir() {
        return Err(Error::write(path, "it is a folder", None));
    }
    let boxed = |e: Box<dyn std::error::Error + Send + Sync>| Error::Write {
        path: path.into(),
        message: e.to_string(),
        source: Some(e),
    };
    // A result file is created as any file is (0666 less the umask; a temporary file's default is owner-only), and
    // one it replaces keeps its permissions.
    let mut builder = tempfile::Builder::new();
    builder.prefix(".stretto-write-");
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    let tmp = builder.tempfile_in(&dir).map_err(|e| boxed(Box::new(e)))?;
    if let Ok(existing) = std::fs::metadata(path) {
        std::fs::set_permissions(tmp.path(), existing.permissions()).map_err(|e| boxed(Box::new(e)))?;
    }
    let file = tmp.as_file().try_clone().map_err(|e| boxed(Box::new(e)))?;
    // Types a plain file cannot hold as they are (dictionary text) are written as their values.
    match format {
        FileFormat::Csv | FileFormat::Tsv => {
            let delimiter = if format == FileFormat::Tsv { b'\t' } else { b',' };
            let mut w = arrow::csv::WriterBuilder::new().with_header(true).with_delimiter(delimiter).build(file);
            w.write(batch).map_err(|e| boxed(Box::new(e)))?;
        }
        FileFormat::Json => {
            let mut w = arrow::json::LineDelimitedWriter::new(file);
            w.write(batch).map_err(|e| boxed(Box::new(e)))?;
            w.finish().map_err(|e| boxed(Box::new(e)))?;
        }
        FileFormat::Parquet => {
            let props = parquet::file::properties::WriterProperties::builder()
                .set_compression(parquet::basic::Compression::SNAPPY)
                .build();
            let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(props))
                .map_err(|e| boxed(Box::new(e)))?;
            w.write(batch).map_err(|e| boxed(Box::new(e)))?;
            w.close().map_err(|e| boxed(Box::new(e)))?;
        }
    }
    tmp.as_file().sync_all().map_err(|e| boxed(Box::new(e)))?;
    tmp.persist(path).map_err(|e| boxed(Box::new(e.error)))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;

    #[test]
    fn a_file_naming_two_columns_alike_is_refused_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dup.csv");
        std::fs::write(&p, "id,text,text\n1,a,b\n").unwrap();
        let e = read_csv(&p, &CsvOptions::default()).unwrap_err().to_string();
        assert!(e.contains("dup.csv") && e.contains("columns 2 and 3 are both named `text`"), "{e}");
        std::fs::write(&p, "id,text,note\n1,a,b\n").unwrap();
        assert_eq!(read_csv(&p, &CsvOptions::default()).unwrap().num_columns(), 3);
    }

    #[test]
    fn csv_columns_that_numbers_would_change_stay_text() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.csv");
        let mut late =
            String::from("zip,n,big,x,late,ratio\n02134,1,12345678901234567890123,1.5,1,1\n00501,2,1,-2,2,2\n");
        for i in 3..=1200 {
            late.push_str(&format!("1{i},{i},{i},0.5,{i},{i}\n"));
        }
        late.push_str("9,9,9,9,N/A,2.5\n");
        std::fs::write(&p, late).unwrap();
        let b = read_csv(&p, &CsvOptions::default()).unwrap();
        let kind = |c: &str| b.schema().field_with_name(c).unwrap().data_type().clone();
        // Zip codes keep their zeros, a number too long for 64 bits its digits, a late `N/A` its column.
        for c in ["zip", "big", "late"] {
            assert_eq!(kind(c), DataType::Utf8, "{c}");
        }
        assert_eq!(b.column(0).as_string::<i32>().value(1), "00501");
        assert_eq!(b.column(2).as_string::<i32>().value(0), "12345678901234567890123");
        assert_eq!(b.column(4).as_string::<i32>().value(1200), "N/A");
        // Numbers stay numbers.
        assert_eq!((kind("n"), kind("x")), (DataType::Int64, DataType::Float64));
        // Types come from every row: whole numbers up to row 1200, then 2.5.
        assert_eq!(kind("ratio"), DataType::Float64);
        assert_eq!(b.column(3).as_primitive::<arrow::datatypes::Float64Type>().value(1), -2.0);
        assert_eq!(b.num_rows(), 1201);
        assert!(leading_zero(" -007") && !leading_zero("0") && !leading_zero("0.5") && !leading_zero("10"));
    }

    #[test]
    fn a_json_array_of_objects_is_read_and_a_pandas_column_object_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        // One line, pretty-printed, or after a byte-order mark: the same table.
        for text in [
            "[{\"id\":1,\"text\":\"a\"},{\"id\":2}]",
            "\n[\n  {\"id\": 1, \"text\": \"a\"},\n  {\"id\": 2}\n]\n",
            "\u{feff}[{\"id\":1,\"text\":\"a\"},{\"id\":2}]",
        ] {
            let b = read_json(&file("a.json", text), &ReadOptions::default()).unwrap();
            assert_eq!((b.num_rows(), b.schema().field(0).name().as_str()), (2, "id"), "{text}");
            assert!(b.column(1).is_null(1));
        }
        let e = read_json(&file("m.json", "[{\"id\":1}, 3]"), &ReadOptions::default()).unwrap_err().to_string();
        assert!(e.contains("element 2 of the JSON array is not an object"), "{e}");
        let pandas = file("p.json", r#"{"id":{"0":1,"1":2},"text":{"0":"a","1":"b"}}"#);
        let e = read_json(&pandas, &ReadOptions::default()).unwrap_err().to_string();
        assert!(e.contains("orient='records', lines=True"), "{e}");
        // Lines still read as lines.
        let lines = read_json(&file("l.jsonl", "{\"id\":1}\n{\"id\":2}\n"), &ReadOptions::default()).unwrap();
        assert_eq!(lines.num_rows(), 2);
        // An array read element by element is the table its records read as lines give: past one batch of the
        // decoder, with nested values, strings that hold brackets, commas, quotes, escapes and line breaks, and a
        // field that appears late.
        let records: Vec<serde_json::Value> = (0..20_000)
            .map(|i| {
                let mut r = serde_json::json!({
                    "id": i,
                    "text": format!("[{{\"n\": {i}}}], \\ \u{e9}\n}}{{"),
                    "tags": [i % 3, i % 5],
                    "meta": {"even": i % 2 == 0, "score": f64::from(i) / 7.0},
                });
                if i > 15_000 {
                    r["late"] = serde_json::json!(format!("l{i}"));
                }
                r
            })
            .collect();
        let ndjson: String = records.iter().map(|r| format!("{r}\n")).collect();
        let by_lines = read_json(&file("r.jsonl", &ndjson), &ReadOptions::default()).unwrap();
        let pretty = serde_json::to_string_pretty(&records).unwrap();
        let by_array = read_json(&file("r.json", &pretty), &ReadOptions::default()).unwrap();
        assert_eq!(by_array.num_rows(), 20_000);
        assert_eq!(by_array, by_lines);
        // A broken array is an error that says where.
        let e = read_json(&file("t.json", &pretty[..pretty.len() / 2]), &ReadOptions::default()).unwrap_err();
        assert!(e.to_string().contains("not a JSON array of objects") && e.to_string().contains("line"), "{e}");
        let e = read_json(&file("n.json", "[{\"id\":1}, [2]]"), &ReadOptions::default()).unwrap_err().to_string();
        assert!(e.contains("element 2 of the JSON array is not an object"), "{e}");
        // A reader's message quoting a whole file is cut short.
        let long = arrow_read(Path::new("x.json"), arrow::error::ArrowError::JsonError("é".repeat(5000)));
        assert!(long.to_string().len() < 500 && long.to_string().ends_with(" …"), "{}", long.to_string().len());
    }

    #[test]
    fn a_tsv_file_is_read_and_written_tab_separated() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("notes.tsv");
        std::fs::write(&p, "id\ttext\n1\tgood, not great\n2\tbad\n").unwrap();
        assert_eq!(FileFormat::of(&p).unwrap(), FileFormat::Tsv);
        let b = read_path(&p).unwrap();
        assert_eq!((b.num_rows(), b.num_columns()), (2, 2));
        assert_eq!(b.column(1).as_string::<i32>().value(0), "good, not great");
        let out = dir.path().join("out.tsv");
        write(&b, &out, FileFormat::of(&out).unwrap()).unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "id\ttext\n1\tgood, not great\n2\tbad\n");
    }

    #[test]
    fn a_ragged_csv_row_names_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ragged.csv");
        std::fs::write(&p, "id,text\n1,ok\n2,too,many\n3,fine\n").unwrap();
        let e = read_csv(&p, &CsvOptions::default()).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::Read { .. }), "{e:?}");
        assert!(msg.contains("ragged.csv") && msg.contains("line"), "{msg}");
    }

    #[test]
    fn writing_into_a_missing_folder_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)])),
            vec![Arc::new(Int64Array::from(vec![1, 2]))],
        )
        .unwrap();
        let out = dir.path().join("nope").join("out.parquet");
        let e = write(&batch, &out, FileFormat::Parquet).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        assert!(!out.exists());
        // A good write leaves exactly the file, no temporary beside it.
        let ok = dir.path().join("out.parquet");
        write(&batch, &ok, FileFormat::Parquet).unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("out.parquet")]);
        assert_eq!(read_parquet(&ok, &ReadOptions::default()).unwrap().num_rows(), 2);
    }

    #[cfg(unix)]
    #[test]
    fn a_result_file_has_a_plain_files_permissions_and_a_replaced_one_keeps_its_own() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)])),
            vec![Arc::new(Int64Array::from(vec![1]))],
        )
        .unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        // What the umask makes of a file any program creates (not a temporary file's owner-only 0600).
        let plain = dir.path().join("plain");
        std::fs::File::create(&plain).unwrap();
        let out = dir.path().join("out.csv");
        write(&batch, &out, FileFormat::Csv).unwrap();
        assert_eq!(mode(&out), mode(&plain));
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o640)).unwrap();
        write(&batch, &out, FileFormat::Csv).unwrap();
        assert_eq!(mode(&out), 0o640);
    }

    #[test]
    fn image_bytes_are_refused_naming_the_column() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("photos.parquet");
        let schema = Schema::new(vec![Field::new("photo", DataType::Binary, true)]);
        let bytes: ArrayRef = Arc::new(arrow::array::BinaryArray::from(vec![&b"\xff\xd8\xff"[..]]));
        write(&RecordBatch::try_new(Arc::new(schema), vec![bytes]).unwrap(), &p, FileFormat::Parquet).unwrap();
        let e = read_parquet(&p, &ReadOptions::default().with_image_column("photo")).unwrap_err().to_string();
        assert!(e.contains("column photo") && e.contains("image bytes") && e.contains("paths"), "{e}");
        // Unmarked, it is just a column.
        assert_eq!(read_parquet(&p, &ReadOptions::default()).unwrap().num_rows(), 1);
    }

    #[test]
    fn image_paths_resolve_against_the_file_and_must_exist() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.jpg"), b"x").unwrap();
        let p = dir.path().join("t.csv");
        std::fs::write(&p, "id,photo\n1,a.jpg\n").unwrap();
        let b = read_csv(&p, &CsvOptions::default().with_image_column("photo")).unwrap();
        assert_eq!(ColumnKind::of_field(b.schema().field(1)), ColumnKind::Image);
        assert_eq!(b.column(1).as_string::<i32>().value(0), dir.path().join("a.jpg").display().to_string());
        std::fs::write(&p, "id,photo\n1,a.jpg\n2,missing.jpg\n").unwrap();
        let e = read_csv(&p, &CsvOptions::default().with_image_column("photo")).unwrap_err().to_string();
        assert!(e.contains("missing.jpg") && e.contains("row 2"), "{e}");
        // A URL is named as one: nothing is downloaded.
        std::fs::write(&p, "id,photo\n1,a.jpg\n2,https://example.org/b.jpg\n").unwrap();
        let e = read_csv(&p, &CsvOptions::default().with_image_column("photo")).unwrap_err().to_string();
        assert!(e.contains("https://example.org/b.jpg is a URL") && e.contains("row 2"), "{e}");
        // Paths in another string layout (pandas' `large_string`, a dictionary) are read alike.
        let large: ArrayRef = Arc::new(arrow::array::LargeStringArray::from(vec!["a.jpg"]));
        let dict: ArrayRef =
            Arc::new(arrow::array::DictionaryArray::<arrow::datatypes::Int32Type>::from_iter(["a.jpg"]));
        for paths in [large, dict] {
            let schema = Schema::new(vec![Field::new("photo", paths.data_type().clone(), true)]);
            let pq = dir.path().join("t.parquet");
            write(&RecordBatch::try_new(Arc::new(schema), vec![paths]).unwrap(), &pq, FileFormat::Parquet).unwrap();
            let b = read_parquet(&pq, &ReadOptions::default().with_image_column("photo")).unwrap();
            assert_eq!(ColumnKind::of_field(b.schema().field(0)), ColumnKind::Image);
            assert_eq!(b.column(0).as_string::<i32>().value(0), dir.path().join("a.jpg").display().to_string());
        }
    }
}
