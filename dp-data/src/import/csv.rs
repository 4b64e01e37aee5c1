//! CSV files with a header row: [`import_csv`].
//!
//! The reader handles what numeric CSV needs: a delimiter, fields optionally in double quotes
//! (with `""` for a quote inside), spaces around fields, `\r\n` line ends, a UTF-8 byte-order
//! mark and blank lines (skipped). A quoted field cannot span lines. The file is read twice,
//! streaming both times: once to check every row and decide the label's dtype, once to write,
//! so a malformed row is reported before the output is created.

use std::path::Path;

use super::Source;
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

/// One field of a split line: where it starts in the line (for errors) and its unquoted
/// text in the row's cell buffer.
#[derive(Debug, Clone, Copy)]
struct Field {
    at: usize,
    start: usize,
    end: usize,
}

/// Splits `line` (without its line end) at `delimiter` into `fields`, unquoting into `cells`.
/// On error returns the position in the line and what was wrong.
fn split_line(
    line: &[u8],
    delimiter: u8,
    fields: &mut Vec<Field>,
    cells: &mut Vec<u8>,
) -> std::result::Result<(), (usize, String)> {
    fields.clear();
    cells.clear();
    let space = |c: u8| (c == b' ' || c == b'\t') && c != delimiter;
    let mut pos = 0;
    loop {
        let at = pos;
        while line.get(pos).is_some_and(|&c| space(c)) {
            pos += 1;
        }
        let start = cells.len();
        if line.get(pos) == Some(&b'"') {
            let quote = pos;
            pos += 1;
            loop {
                match line.get(pos) {
                    None => {
                        return Err((
                            quote,
                            "expected a closing `\"` on the same line (quoted fields cannot span \
                             lines)"
                                .into(),
                        ));
                    }
                    Some(b'"') if line.get(pos + 1) == Some(&b'"') => {
                        cells.push(b'"');
                        pos += 2;
                    }
                    Some(b'"') => {
                        pos += 1;
                        break;
                    }
                    Some(&c) => {
                        cells.push(c);
                        pos += 1;
                    }
                }
            }
            while line.get(pos).is_some_and(|&c| space(c)) {
                pos += 1;
            }
            if pos < line.len() && line[pos] != delimiter {
                return Err((
                    pos,
                    format!(
                        "expected `{}` or the end of the line after a quoted field, found `{}`",
                        [delimiter].escape_ascii(),
                        [line[pos]].escape_ascii()
                    ),
                ));
            }
        } else {
            let end =
                line[pos..].iter().position(|&c| c == delimiter).map_or(line.len(), |e| pos + e);
            let mut text = &line[pos..end];
            while let [rest @ .., last] = text {
                if !space(*last) {
                    break;
                }
                text = rest;
            }
            cells.extend_from_slice(text);
            pos = end;
        }
        fields.push(Field { at, start, end: cells.len() });
        if pos >= line.len() {
            return Ok(());
        }
        pos += 1; // the delimiter
    }
}

/// Reads a CSV file row by row.
struct Rows {
    source: Source,
    delimiter: u8,
    line: Vec<u8>,
    fields: Vec<Field>,
    cells: Vec<u8>,
    /// 1-based number of the current line.
    line_number: u64,
    /// Offset of the current line's first byte.
    line_offset: u64,
}

impl Rows {
    fn open(path: &Path, delimiter: u8) -> Result<Rows> {
        Ok(Rows {
            source: Source::open(path, None)?,
            delimiter,
            line: Vec::new(),
            fields: Vec::new(),
            cells: Vec::new(),
            line_number: 0,
            line_offset: 0,
        })
    }

    /// Moves to the next non-blank line and splits it; `false` at the end of the file.
    fn next(&mut self) -> Result<bool> {
        loop {
            self.line_offset = self.source.offset();
            if self.source.read_line(&mut self.line)? == 0 {
                return Ok(false);
            }
            self.line_number += 1;
            let mut line = self.line.as_slice();
            let mut skipped = 0;
            if self.line_number == 1 && line.starts_with(b"\xEF\xBB\xBF") {
                line = &line[3..];
                skipped = 3;
            }
            while let [rest @ .., b'\n' | b'\r'] = line {
                line = rest;
            }
            if line.iter().all(|c| c.is_ascii_whitespace()) {
                continue;
            }
            return match split_line(line, self.delimiter, &mut self.fields, &mut self.cells) {
                Ok(()) => Ok(true),
                Err((pos, what)) => Err(self.source.corrupt(
                    self.line_offset + (skipped + pos) as u64,
                    format!("line {}: {what}", self.line_number),
                )),
            };
        }
    }

    fn text(&self, field: usize) -> &[u8] {
        let f = self.fields[field];
        &self.cells[f.start..f.end]
    }

    /// A corrupt-input error about `field` of the current line.
    fn fail(&self, field: usize, what: impl std::fmt::Display) -> Error {
        let at = self.fields.get(field).map_or(0, |f| f.at);
        self.source
            .corrupt(self.line_offset + at as u64, format!("line {}: {what}", self.line_number))
    }

    /// Parses `field` as a number of type `T`, naming `column` in errors.
    fn number<T: std::str::FromStr>(&self, field: usize, column: &str, kind: &str) -> Result<T> {
        let text = self.text(field);
        std::str::from_utf8(text).ok().and_then(|s| s.parse().ok()).ok_or_else(|| {
            self.fail(
                field,
                format!("column `{column}`: expected {kind}, found \"{}\"", text.escape_ascii()),
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
                names.join(", ")
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
    let columns: Vec<usize> = match &csv.columns {
        Some(chosen) => {
            let mut columns = Vec::with_capacity(chosen.len());
            for name in chosen {
                let column = find_column(&names, name, "columns", path)?;
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn split(line: &str, delimiter: u8) -> std::result::Result<Vec<String>, (usize, String)> {
        let (mut fields, mut cells) = (Vec::new(), Vec::new());
        split_line(line.as_bytes(), delimiter, &mut fields, &mut cells)?;
        Ok(fields
            .iter()
            .map(|f| String::from_utf8(cells[f.start..f.end].to_vec()).unwrap())
            .collect())
    }

    #[test]
    fn splits_plain_quoted_and_spaced_fields() {
        assert_eq!(split("a,b,c", b',').unwrap(), ["a", "b", "c"]);
        assert_eq!(split(" 1 , 2.5 ,\t-3 ", b',').unwrap(), ["1", "2.5", "-3"]);
        assert_eq!(
            split("\"x, y\",\"say \"\"hi\"\"\" ,", b',').unwrap(),
            ["x, y", "say \"hi\"", ""]
        );
        assert_eq!(split("1\t2\t\t3", b'\t').unwrap(), ["1", "2", "", "3"]);
        assert_eq!(split(",", b',').unwrap(), ["", ""]);
        assert_eq!(split("a;b", b';').unwrap(), ["a", "b"]);
    }

    #[test]
    fn reports_unterminated_quotes_and_junk_after_quotes() {
        let (at, what) = split("1,\"2,3", b',').unwrap_err();
        assert_eq!(at, 2);
        assert!(what.contains("closing"), "{what}");
        let (at, what) = split("1,\"2\"x,3", b',').unwrap_err();
        assert_eq!(at, 5);
        assert!(what.contains("after a quoted field"), "{what}");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

        #[test]
        fn split_never_panics_and_fields_stay_in_bounds(
            line in proptest::collection::vec(
                prop::sample::select(vec![b'a', b'1', b',', b'"', b' ', b'\t', b'.', 0xff]), 0..40),
            delimiter in prop::sample::select(vec![b',', b'\t', b' ', b'a']),
        ) {
            let (mut fields, mut cells) = (Vec::new(), Vec::new());
            match split_line(&line, delimiter, &mut fields, &mut cells) {
                Ok(()) => {
                    prop_assert!(!fields.is_empty());
                    for f in &fields {
                        prop_assert!(f.start <= f.end && f.end <= cells.len() && f.at <= line.len());
                    }
                    // Without quotes, splitting is exactly `split` on the delimiter.
                    if !line.contains(&b'"') {
                        prop_assert_eq!(fields.len(), line.split(|&c| c == delimiter).count());
                    }
                }
                Err((at, _)) => prop_assert!(at <= line.len()),
            }
        }
    }
}
