//! CSV files with a header row: [`import_csv`].
//!
//! Records are split by `csv-core`, the parser under the `csv` crate: fields optionally in
//! double quotes (with `""` for a quote inside) that may span lines, `\r\n` or `\n` line ends,
//! a UTF-8 byte-order mark, and empty lines (skipped). Spaces around an unquoted field are
//! trimmed, so `1, 2.5` reads as two numbers; a line of only spaces is skipped. csv-core is used
//! directly, not through the `csv` crate's reader, because it says where every field starts,
//! so an error names the byte offset of the field at fault, not only of its record. The file is
//! read twice, streaming both times: once to check every row and decide the label's dtype, once
//! to write, so a malformed row is reported before the output is created.

use std::path::Path;

use std::io::BufRead;

use super::{MAX_LINE, Source, list_names, quote, quote_name};
use crate::{DType, DatasetWriter, Error, Feature, Manifest, Result, Schema, Value, WriterOptions};

/// How [`import_csv`] reads a CSV file and which columns become which features.
///
/// ```
/// use dp_data::CsvOptions;
///
/// let options = CsvOptions {
///     label: Some("species".into()),
///     columns: Some(vec!["petal_length".into(), "petal_width".into()]),
///     ..CsvOptions::default()
/// };
/// assert_eq!(options.delimiter, b',');
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvOptions {
    /// The field separator (default `b','`; `b'\t'` for TSV).
    pub delimiter: u8,
    /// The column that becomes the scalar feature `label`; `None` imports no label.
    pub label: Option<String>,
    /// The label's dtype: `None` infers it (`i64` if every label is an integer, `f32`
    /// otherwise); `Some` of `i32`, `i64`, `f32` or `f64` forces it.
    pub label_dtype: Option<DType>,
    /// The columns that become the vector feature `features: f32[n]`, in this order; `None`
    /// takes every column except the label, in file order.
    pub columns: Option<Vec<String>>,
}

impl Default for CsvOptions {
    fn default() -> Self {
        CsvOptions { delimiter: b',', label: None, label_dtype: None, columns: None }
    }
}

/// One field of the current record: where it starts in the file (for errors) and its unquoted
/// text in the record's cell buffer.
#[derive(Debug, Clone, Copy)]
struct Field {
    at: u64,
    start: usize,
    end: usize,
}

/// Reads a CSV file record by record.
struct Rows {
    source: Source,
    parser: csv_core::Reader,
    fields: Vec<Field>,
    cells: Vec<u8>,
    /// 1-based number of the line the current record starts on, and of the next byte's line.
    line_number: u64,
    next_line: u64,
    /// Offset of the current record's first byte.
    line_offset: u64,
    /// Whether the current record holds anything but spaces (a quote counts).
    written: bool,
}

impl Rows {
    fn open(path: &Path, delimiter: u8) -> Result<Rows> {
        Ok(Rows {
            source: Source::open(path, None)?,
            parser: csv_core::ReaderBuilder::new().delimiter(delimiter).build(),
            fields: Vec::new(),
            cells: Vec::new(),
            line_number: 0,
            next_line: 1,
            line_offset: 0,
            written: false,
        })
    }

    /// Moves to the next record that is not blank; `false` at the end of the file.
    fn next(&mut self) -> Result<bool> {
        loop {
            if !self.read_record()? {
                return Ok(false);
            }
            // A line of spaces; `""` alone is an empty field, which is an error later.
            let blank = self.fields.len() == 1 && !self.written;
            if !blank {
                return Ok(true);
            }
        }
    }

    /// Reads one record's fields into `fields` and `cells`; `false` at the end of the file.
    fn read_record(&mut self) -> Result<bool> {
        self.fields.clear();
        self.written = false;
        // Bytes of `cells` the record's fields fill; the rest is room for the parser to write.
        let mut used = 0;
        let mut field_at = None;
        loop {
            let input = match self.source.reader.fill_buf() {
                Ok(input) => input,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.source.read_error(e, "a CSV record")),
            };
            // What the record has taken of the file so far, delimiters and quotes included.
            if self.source.offset.saturating_sub(self.line_offset) > MAX_LINE {
                return Err(self.source.corrupt(
                    self.line_offset,
                    format!("line {}: a record longer than {MAX_LINE} bytes", self.line_number),
                ));
            }
            if self.cells.len() < used + 64 {
                let room = (self.cells.len() * 2).max(used + 4096);
                self.cells.resize(room, 0);
            }
            let (result, nin, nout) = self.parser.read_field(input, &mut self.cells[used..]);
            used += nout;
            // Where this read began, before consuming: a field's first byte.
            let here = self.source.offset;
            let newlines = input[..nin].iter().filter(|&&c| c == b'\n').count() as u64;
            if field_at.is_none() && (nin > 0 || nout > 0) {
                let mut skipped = 0;
                if self.fields.is_empty() {
                    // What csv-core skips before a record: the byte-order mark, empty lines.
                    if here == 0 && input.starts_with(b"\xEF\xBB\xBF") {
                        skipped = 3.min(nin);
                    }
                    let blank =
                        input[skipped..nin].iter().take_while(|&&c| c == b'\r' || c == b'\n');
                    let (blank, lines) =
                        blank.fold((0, 0), |(n, l), &c| (n + 1, l + u64::from(c == b'\n')));
                    skipped += blank;
                    self.line_number = self.next_line + lines;
                    self.line_offset = here + skipped as u64;
                }
                field_at = Some(here + skipped as u64);
            }
            let mut consumed = &input[..nin];
            if here == 0 {
                consumed = consumed.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(consumed);
            }
            self.written |= consumed.iter().any(|c| !c.is_ascii_whitespace());
            self.source.reader.consume(nin);
            self.source.offset += nin as u64;
            self.next_line += newlines;
            match result {
                csv_core::ReadFieldResult::InputEmpty | csv_core::ReadFieldResult::OutputFull => {}
                csv_core::ReadFieldResult::Field { record_end } => {
                    let start = self.fields.last().map_or(0, |f| f.end);
                    let at = field_at.take().unwrap_or(here);
                    self.fields.push(Field { at, start, end: used });
                    if record_end {
                        return Ok(true);
                    }
                }
                csv_core::ReadFieldResult::End => return Ok(false),
            }
        }
    }

    /// Field `field` of the current record, without the spaces around it.
    fn text(&self, field: usize) -> &[u8] {
        let f = self.fields[field];
        self.cells[f.start..f.end].trim_ascii()
    }

    /// A corrupt-input error about `field` of the current record.
    fn fail(&self, field: usize, what: impl std::fmt::Display) -> Error {
        let at = self.fields.get(field).map_or(self.line_offset, |f| f.at);
        self.source.corrupt(at, format!("line {}: {what}", self.line_number))
    }

    /// Parses `field` as a number of type `T`, naming `column` in errors.
    fn number<T: std::str::FromStr>(&self, field: usize, column: &str, kind: &str) -> Result<T> {
        let text = self.text(field);
        std::str::from_utf8(text).ok().and_then(|s| s.parse().ok()).ok_or_else(|| {
            self.fail(
                field,
                format!(
                    "column {}: expected {kind}, found {}",
                    quote_name(column.as_bytes()),
                    quote(text)
                ),
            )
        })
    }
}

/// The position of the column called `name`, which must appear exactly once.
fn find_column(names: &[String], name: &str, field: &'static str, path: &Path) -> Result<usize> {
    let mut found = names.iter().enumerate().filter(|(_, n)| *n == name).map(|(i, _)| i);
    match (found.next(), found.next()) {
        (Some(i), None) => Ok(i),
        (None, _) => Err(Error::Config {
            field,
            what: format!(
                "{} has no column `{name}` (its columns are: {})",
                path.display(),
                list_names(names)
            ),
        }),
        (Some(_), Some(_)) => Err(Error::Config {
            field,
            what: format!("{} has more than one column called `{name}`", path.display()),
        }),
    }
}

/// The label column and how it is parsed.
struct Label {
    column: usize,
    name: String,
    dtype: DType,
}

impl Label {
    /// Parses the label of the current row into `out` (little-endian bytes of `dtype`).
    fn parse(&self, rows: &Rows, out: &mut Vec<u8>) -> Result<()> {
        out.clear();
        let (c, name) = (self.column, self.name.as_str());
        match self.dtype {
            DType::I32 => {
                out.extend_from_slice(&rows.number::<i32>(c, name, "an i32")?.to_le_bytes())
            }
            DType::I64 => {
                out.extend_from_slice(&rows.number::<i64>(c, name, "an i64")?.to_le_bytes())
            }
            DType::F32 => {
                out.extend_from_slice(&rows.number::<f32>(c, name, "a number")?.to_le_bytes())
            }
            _ => out.extend_from_slice(&rows.number::<f64>(c, name, "a number")?.to_le_bytes()),
        }
        Ok(())
    }
}

/// Imports a CSV file with a header row as a dataset at `out`. The column named by
/// `csv.label` becomes the scalar feature `label` and the chosen numeric columns (by default
/// all the others) the vector feature `features: f32[n]`; unchosen columns may hold anything.
///
/// The label's dtype is `i64` when every label parses as an integer and `f32` otherwise
/// (`"3.0"` makes it `f32`), unless `csv.label_dtype` fixes it. Every row must have as many
/// fields as the header, and every chosen field must be a number (Rust's float syntax, so
/// `nan` and `inf` are accepted); an empty field is an error, not a zero.
///
/// ```no_run
/// use std::path::Path;
/// use dp_data::{CsvOptions, WriterOptions, import_csv};
///
/// let csv = CsvOptions { label: Some("target".into()), ..CsvOptions::default() };
/// let manifest = import_csv(Path::new("train.csv"), Path::new("train"), &csv, WriterOptions::default())?;
/// # Ok::<(), dp_data::Error>(())
/// ```
pub fn import_csv(
    path: &Path,
    out: &Path,
    csv: &CsvOptions,
    options: WriterOptions,
) -> Result<Manifest> {
    if matches!(csv.delimiter, b'"' | b'\n' | b'\r') {
        return Err(Error::Config {
            field: "delimiter",
            what: format!("`{}` cannot separate fields", [csv.delimiter].escape_ascii()),
        });
    }
    if let Some(dtype) = csv.label_dtype
        && !matches!(dtype, DType::I32 | DType::I64 | DType::F32 | DType::F64)
    {
        return Err(Error::Config {
            field: "label_dtype",
            what: format!("{dtype} is not a label dtype (expected i32, i64, f32 or f64)"),
        });
    }

    // Pass 1: the header, then check every row and find the label's dtype.
    let mut rows = Rows::open(path, csv.delimiter)?;
    if !rows.next()? {
        return Err(Error::corrupt(path, 0, "expected a header row, found an empty file"));
    }
    let names: Vec<String> = (0..rows.fields.len())
        .map(|i| String::from_utf8_lossy(rows.text(i)).into_owned())
        .collect();
    let label = match &csv.label {
        Some(name) => Some(find_column(&names, name, "label", path)?),
        None => None,
    };
    let columns = feature_columns(&names, csv, label, path)?;
    let mut label = label.map(|column| Label {
        column,
        name: names[column].clone(),
        dtype: csv.label_dtype.unwrap_or(DType::I64),
    });
    let infer = csv.label_dtype.is_none();
    let mut records = 0u64;
    let mut label_bytes = Vec::with_capacity(8);
    while rows.next()? {
        check_width(&rows, names.len())?;
        if let Some(label) = &mut label {
            if infer && label.dtype == DType::I64 && label.parse(&rows, &mut label_bytes).is_err() {
                label.dtype = DType::F32;
            }
            label.parse(&rows, &mut label_bytes)?;
        }
        for &column in &columns {
            rows.number::<f32>(column, &names[column], "a number")?;
        }
        records += 1;
    }

    // Pass 2: write.
    let mut schema = Vec::with_capacity(2);
    if let Some(label) = &label {
        schema.push(Feature::dense("label", label.dtype, &[]));
    }
    if !columns.is_empty() {
        schema.push(Feature::dense("features", DType::F32, &[columns.len()]));
    }
    let schema = Schema::new(schema)?;
    let mut rows = Rows::open(path, csv.delimiter)?;
    rows.next()?;
    let mut writer = DatasetWriter::create(out, schema, options)?;
    let mut vector = Vec::with_capacity(columns.len());
    for _ in 0..records {
        if !rows.next()? {
            return Err(rows.source.corrupt(
                rows.line_offset,
                format!(
                    "the file ended before its {records} rows (did it change while importing?)"
                ),
            ));
        }
        check_width(&rows, names.len())?;
        vector.clear();
        for &column in &columns {
            vector.push(rows.number::<f32>(column, &names[column], "a number")?);
        }
        let mut values = [Value::Dense(&[]), Value::Dense(&[])];
        let mut n = 0;
        if let Some(label) = &label {
            label.parse(&rows, &mut label_bytes)?;
            values[n] = Value::Dense(&label_bytes);
            n += 1;
        }
        if !columns.is_empty() {
            values[n] = Value::dense(&vector);
            n += 1;
        }
        writer.append(&values[..n])?;
    }
    writer.finish()
}

/// The feature columns `csv` chooses (by default every column but the label's), checked
/// to leave something to import.
fn feature_columns(
    names: &[String],
    csv: &CsvOptions,
    label: Option<usize>,
    path: &Path,
) -> Result<Vec<usize>> {
    let columns: Vec<usize> = match &csv.columns {
        Some(chosen) => {
            let mut columns = Vec::with_capacity(chosen.len());
            for name in chosen {
                let column = find_column(names, name, "columns", path)?;
                if Some(column) == label {
                    return Err(Error::Config {
                        field: "columns",
                        what: format!("column `{name}` is the label and cannot also be a feature"),
                    });
                }
                columns.push(column);
            }
            columns
        }
        None => (0..names.len()).filter(|&i| Some(i) != label).collect(),
    };
    if label.is_none() && columns.is_empty() {
        return Err(Error::Config {
            field: "columns",
            what: format!(
                "nothing to import from {}: no label and no feature columns",
                path.display()
            ),
        });
    }
    Ok(columns)
}

/// Checks that the current row has as many fields as the header.
fn check_width(rows: &Rows, width: usize) -> Result<()> {
    if rows.fields.len() == width {
        Ok(())
    } else {
        Err(rows.fail(
            0,
            format!("expected {width} fields as in the header, found {}", rows.fields.len()),
        ))
    }
}
