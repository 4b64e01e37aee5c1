//! svmlight / libsvm text files: [`import_svmlight`].
//!
//! One record per line, as scikit-learn's `load_svmlight_file` reads them:
//!
//! ```text
//! <label> [qid:<query>] <index>:<value> <index>:<value> ... [# comment]
//! ```
//!
//! Indices are strictly increasing within a line (sorted and distinct). Blank lines and lines
//! holding only a comment are skipped. The files are read twice, streaming both times: once to
//! check every line and decide the index base, the feature count and the label's dtype, once
//! to write, so a malformed line is reported before the output is created.

use std::path::Path;

use super::{Source, quote};
use crate::{DType, DatasetWriter, Error, Feature, Manifest, Result, Schema, Value, WriterOptions};

/// How [`import_svmlight`] reads svmlight files.
///
/// ```
/// use dp_data::SvmlightOptions;
///
/// // scikit-learn's defaults: the index base and the width from the data.
/// let options = SvmlightOptions { features: Some(1 << 20), ..SvmlightOptions::default() };
/// assert_eq!(options.zero_based, None);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SvmlightOptions {
    /// The width of the sparse feature `x`; `None` infers it from the largest index of the
    /// files imported together (import a train and a test file with
    /// [`import_svmlight_splits`], or give the width, so that both get the same one).
    pub features: Option<usize>,
    /// Whether the first feature is index 0 (`Some(true)`) or 1 (`Some(false)`, libsvm's
    /// convention); `None` decides as scikit-learn's `zero_based="auto"`: 1-based unless some
    /// index is 0.
    pub zero_based: Option<bool>,
    /// The label's dtype: `None` infers it (`i64` if every label is an integer, `f32`
    /// otherwise); `Some` of `i64` or `f32` forces it.
    pub label_dtype: Option<DType>,
}

/// One parsed line: its label, query id and non-zeros (in the caller's buffers).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Line {
    label: f64,
    qid: Option<i64>,
}

/// What went wrong where in a line: the byte position and the message.
type LineError = (usize, String);

/// Parses one line (without its line end) into `indices` and `values` (raw indices, as
/// written); `None` for a blank or comment-only line.
fn parse_line(
    line: &[u8],
    indices: &mut Vec<u64>,
    values: &mut Vec<f32>,
) -> std::result::Result<Option<Line>, LineError> {
    indices.clear();
    values.clear();
    let end = line.iter().position(|&c| c == b'#').unwrap_or(line.len());
    let mut tokens = tokens(&line[..end]);
    let Some((at, label)) = tokens.next() else { return Ok(None) };
    let label = parse::<f64>(label)
        .filter(|l| l.is_finite())
        .ok_or_else(|| (at, format!("expected a finite label, found {}", quote(label))))?;
    let mut qid = None;
    for (k, (at, token)) in tokens.enumerate() {
        let Some(colon) = token.iter().position(|&c| c == b':') else {
            return Err((at, format!("expected index:value, found {}", quote(token))));
        };
        let (key, value) = (&token[..colon], &token[colon + 1..]);
        if key == b"qid" {
            if k != 0 {
                return Err((at, "qid must come right after the label".into()));
            }
            qid = Some(parse::<i64>(value).ok_or_else(|| {
                (at, format!("expected an integer query id, found {}", quote(value)))
            })?);
            continue;
        }
        let index = parse::<u64>(key).ok_or_else(|| {
            (at, format!("expected a non-negative integer index, found {}", quote(key)))
        })?;
        let value = parse::<f32>(value).filter(|v| v.is_finite()).ok_or_else(|| {
            (at, format!("index {index}: expected a finite value, found {}", quote(value)))
        })?;
        if let Some(&previous) = indices.last()
            && index <= previous
        {
            let what = if index == previous { "repeats" } else { "comes after" };
            return Err((
                at,
                format!(
                    "index {index} {what} index {previous}: indices must be sorted and distinct"
                ),
            ));
        }
        indices.push(index);
        values.push(value);
    }
    Ok(Some(Line { label, qid }))
}

/// The whitespace-separated tokens of `text` with their positions.
fn tokens(text: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let mut pos = 0;
    std::iter::from_fn(move || {
        while text.get(pos).is_some_and(u8::is_ascii_whitespace) {
            pos += 1;
        }
        let start = pos;
        while text.get(pos).is_some_and(|c| !c.is_ascii_whitespace()) {
            pos += 1;
        }
        (pos > start).then(|| (start, &text[start..pos]))
    })
}

fn parse<T: std::str::FromStr>(text: &[u8]) -> Option<T> {
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// Reads svmlight files line by line, every error naming the file, offset and line.
struct Lines {
    source: Source,
    line: Vec<u8>,
    line_number: u64,
    line_offset: u64,
    indices: Vec<u64>,
    values: Vec<f32>,
}

impl Lines {
    fn open(path: &Path) -> Result<Lines> {
        Ok(Lines {
            source: Source::open(path, None)?,
            line: Vec::new(),
            line_number: 0,
            line_offset: 0,
            indices: Vec::new(),
            values: Vec::new(),
        })
    }

    /// The next record's line, parsed into `self.indices` and `self.values`.
    fn next(&mut self) -> Result<Option<Line>> {
        loop {
            self.line_offset = self.source.offset();
            if self.source.read_line(&mut self.line)? == 0 {
                return Ok(None);
            }
            self.line_number += 1;
            match parse_line(&self.line, &mut self.indices, &mut self.values) {
                Ok(Some(line)) => return Ok(Some(line)),
                Ok(None) => {}
                Err((at, what)) => return Err(self.fail(at, what)),
            }
        }
    }

    /// A corrupt-input error at byte `at` of the current line.
    fn fail(&self, at: usize, what: impl std::fmt::Display) -> Error {
        self.source
            .corrupt(self.line_offset + at as u64, format!("line {}: {what}", self.line_number))
    }

    /// A corrupt-input error about the current line's `k`-th index.
    fn fail_index(&self, k: usize, what: impl std::fmt::Display) -> Error {
        let at = self.position_of(k);
        self.fail(at, what)
    }

    /// The byte position of the current line's `k`-th index (for errors only).
    fn position_of(&self, k: usize) -> usize {
        let end = self.line.iter().position(|&c| c == b'#').unwrap_or(self.line.len());
        tokens(&self.line[..end])
            .skip(1)
            .filter(|(_, t)| !t.starts_with(b"qid:"))
            .nth(k)
            .map_or(0, |(at, _)| at)
    }
}

/// What the first pass learns about the files.
#[derive(Debug, Default)]
struct Survey {
    records: u64,
    /// The smallest and largest index written.
    min_index: Option<u64>,
    max_index: u64,
    integer_labels: bool,
    /// Whether some line has a query id, and whether some has none.
    some_qid: bool,
    some_without_qid: bool,
    /// The labels are the binary -1/+1 convention.
    plus_minus_one: bool,
    /// A negative integer label, an error unless the labels are -1/+1 (which the whole files
    /// decide).
    negative: Option<Error>,
    /// An index past a given width, for a 0-based and a 1-based file: whether it is past
    /// depends on the base, which (by default) only the whole files decide.
    past_width: [Option<Error>; 2],
}

/// How pass 2 writes each line, from what pass 1 learnt.
struct Encoding {
    /// The index of the first feature (0 or 1).
    base: u64,
    width: usize,
    label_dtype: DType,
    /// Labels -1/+1 become classes 0/1.
    map_plus_minus: bool,
    /// Whether the records have a query id.
    qid: bool,
}

/// Imports svmlight / libsvm files (in order, as one dataset) at `out`, with the features
/// `x: sparse f32[n]` (CSR in the shards), `label` (`i64` or `f32`, see
/// [`SvmlightOptions::label_dtype`]) and, when the lines have query ids, `qid: i64[]`.
///
/// Integer labels -1 and +1 (svmlight's binary convention, when they are the only labels)
/// become classes 0 and 1; other negative integer labels are an error, since a class is an
/// index. Errors name the file, the offset, the line and what was expected: an index that is
/// not above the previous one (unsorted or repeated), an index 0 in a 1-based file, an index
/// at or past `features`, a value or label that is not a finite number, or a query id on some
/// lines but not others. Files may be gzip-compressed.
///
/// ```no_run
/// use std::path::Path;
/// use dp_data::{SvmlightOptions, WriterOptions, import_svmlight};
///
/// let files = [Path::new("train.svm")];
/// let manifest = import_svmlight(&files, Path::new("train"), &SvmlightOptions::default(),
///     WriterOptions::default())?;
/// # Ok::<(), dp_data::Error>(())
/// ```
pub fn import_svmlight(
    paths: &[&Path],
    out: &Path,
    svm: &SvmlightOptions,
    options: WriterOptions,
) -> Result<Manifest> {
    let mut manifests = import_svmlight_splits(&[(out, paths)], svm, options)?;
    Ok(manifests.remove(0))
}

/// Imports several datasets from svmlight files at one width, as scikit-learn's
/// `load_svmlight_files` loads several files: each split is an output directory and its input
/// files (read in order, as one dataset, like [`import_svmlight`]). The index base, the width,
/// the label's dtype and whether there are query ids are decided from all the files together,
/// so a train and a test file whose largest indices differ still get the same schema (imported
/// one at a time, each would get the width of its own largest index). Returns the manifests
/// in the order of `splits`.
///
/// Every split's output is checked before anything is written, and a split with no line is
/// an error. Should writing fail part way, the splits finished before stay complete and the
/// others are not written.
///
/// ```no_run
/// use std::path::Path;
/// use dp_data::{SvmlightOptions, WriterOptions, import_svmlight_splits};
///
/// let (train, test) = ([Path::new("a9a.svm")], [Path::new("a9a.t.svm")]);
/// let splits = [(Path::new("data/a9a/train"), &train[..]), (Path::new("data/a9a/test"), &test[..])];
/// let manifests =
///     import_svmlight_splits(&splits, &SvmlightOptions::default(), WriterOptions::default())?;
/// assert_eq!(manifests[0].schema, manifests[1].schema);
/// # Ok::<(), dp_data::Error>(())
/// ```
pub fn import_svmlight_splits(
    splits: &[(&Path, &[&Path])],
    svm: &SvmlightOptions,
    options: WriterOptions,
) -> Result<Vec<Manifest>> {
    check_splits(splits, svm)?;
    let mut survey = survey_splits(splits, svm)?;
    let label_dtype =
        svm.label_dtype.unwrap_or(if survey.integer_labels { DType::I64 } else { DType::F32 });
    let map_plus_minus = label_dtype == DType::I64 && survey.plus_minus_one;
    if label_dtype == DType::I64 {
        if !survey.integer_labels {
            return Err(Error::Config {
                field: "label_dtype",
                what: "is i64, but some labels are not integers".into(),
            });
        }
        if let Some(error) = survey.negative.take().filter(|_| !map_plus_minus) {
            return Err(error);
        }
    }
    let zero_based = svm.zero_based.unwrap_or(survey.min_index == Some(0));
    let base = u64::from(!zero_based);
    if let Some(error) = survey.past_width[base as usize].take() {
        return Err(error);
    }
    let width = match svm.features {
        Some(n) => n,
        None => (survey.max_index - base.min(survey.max_index))
            .checked_add(1)
            .and_then(|w| usize::try_from(w).ok())
            .ok_or_else(|| Error::Config {
                field: "features",
                what: format!("the largest index, {}, is too large for a width", survey.max_index),
            })?,
    };
    let encoding = Encoding { base, width, label_dtype, map_plus_minus, qid: survey.some_qid };
    let mut features =
        vec![Feature::sparse("x", DType::F32, &[width]), Feature::dense("label", label_dtype, &[])];
    if survey.some_qid {
        features.push(Feature::dense("qid", DType::I64, &[]));
    }
    let schema = Schema::new(features)?;
    write_splits(splits, &schema, options, &encoding)
}

/// Refuses splits without files or with the same output, and options that cannot hold.
fn check_splits(splits: &[(&Path, &[&Path])], svm: &SvmlightOptions) -> Result<()> {
    if splits.is_empty() {
        return Err(Error::Config { field: "inputs", what: "no svmlight file given".into() });
    }
    for (k, (out, paths)) in splits.iter().enumerate() {
        if paths.is_empty() {
            return Err(Error::Config {
                field: "inputs",
                what: format!("no svmlight file given for {}", out.display()),
            });
        }
        if splits[..k].iter().any(|(other, _)| other == out) {
            return Err(Error::Config {
                field: "out",
                what: format!("{} is the output of two splits", out.display()),
            });
        }
    }
    if let Some(dtype) = svm.label_dtype
        && !matches!(dtype, DType::I64 | DType::F32)
    {
        return Err(Error::Config {
            field: "label_dtype",
            what: format!("{dtype} is not a label dtype for svmlight (expected i64 or f32)"),
        });
    }
    if svm.features == Some(0) {
        return Err(Error::Config { field: "features", what: "must be at least 1".into() });
    }
    Ok(())
}

/// Pass 1: checks every line, finds the index range, the labels' kind and the query ids.
fn survey_splits(splits: &[(&Path, &[&Path])], svm: &SvmlightOptions) -> Result<Survey> {
    let mut survey = Survey { integer_labels: true, plus_minus_one: true, ..Survey::default() };
    // An index past a given width is found in pass 1, so that nothing is written.
    for (out, paths) in splits {
        let before = survey.records;
        for path in *paths {
            let mut lines = Lines::open(path)?;
            while let Some(line) = lines.next()? {
                survey.records += 1;
                if svm.zero_based == Some(false) && lines.indices.first() == Some(&0) {
                    return Err(
                        lines.fail_index(0, "index 0 in a file read as 1-based (set zero_based)")
                    );
                }
                if let (Some(width), Some(&last)) = (svm.features, lines.indices.last()) {
                    for (base, slot) in survey.past_width.iter_mut().enumerate() {
                        if slot.is_none() && last >= width as u64 + base as u64 {
                            let k = lines.indices.len() - 1;
                            let largest = width as u64 - 1 + base as u64;
                            *slot = Some(lines.fail_index(
                            k,
                            format!("index {last} is past the {width} features (the largest is {largest})"),
                        ));
                        }
                    }
                }
                if let (Some(&first), Some(&last)) = (lines.indices.first(), lines.indices.last()) {
                    survey.min_index = Some(survey.min_index.map_or(first, |m| m.min(first)));
                    survey.max_index = survey.max_index.max(last);
                }
                let integer = line.label.fract() == 0.0 && line.label.abs() < 2f64.powi(53);
                survey.integer_labels &= integer;
                survey.plus_minus_one &= line.label == 1.0 || line.label == -1.0;
                if integer && line.label < 0.0 && survey.negative.is_none() {
                    survey.negative = Some(lines.fail(0, format!(
                    "label {} is negative: classes are 0, 1, ... (only -1/+1 binary labels are mapped to 0/1)",
                    line.label
                )));
                }
                survey.some_qid |= line.qid.is_some();
                survey.some_without_qid |= line.qid.is_none();
                if survey.some_qid && survey.some_without_qid {
                    return Err(lines.fail(0, "some lines have a qid and others none"));
                }
            }
        }
        if survey.records == before {
            let what = if splits.len() == 1 {
                "expected at least one svmlight line, found none".to_string()
            } else {
                format!("expected at least one svmlight line for {}, found none", out.display())
            };
            return Err(Error::corrupt(paths[0], 0, what));
        }
    }
    Ok(survey)
}

/// Pass 2: writes each split as `encoding` says. The checks of pass 1 hold unless a file
/// changed meanwhile. Every output is claimed first, so that one that cannot be written is
/// refused before any is.
fn write_splits(
    splits: &[(&Path, &[&Path])],
    schema: &Schema,
    options: WriterOptions,
    encoding: &Encoding,
) -> Result<Vec<Manifest>> {
    let mut writers = Vec::with_capacity(splits.len());
    for (out, _) in splits {
        writers.push(DatasetWriter::create(out, schema.clone(), options.clone())?);
    }
    let mut positions = Vec::new();
    for ((_, paths), writer) in splits.iter().zip(&mut writers) {
        for path in *paths {
            let mut lines = Lines::open(path)?;
            while let Some(line) = lines.next()? {
                positions.clear();
                for (k, &index) in lines.indices.iter().enumerate() {
                    let position = index.checked_sub(encoding.base).ok_or_else(|| {
                        lines.fail_index(k, "index 0 in a file read as 1-based (set zero_based)")
                    })?;
                    if position >= encoding.width as u64 {
                        return Err(lines.fail_index(
                            k,
                            format!(
                                "index {index} is past the {} features (the largest is {})",
                                encoding.width,
                                encoding.width as u64 - 1 + encoding.base
                            ),
                        ));
                    }
                    positions.push(position);
                }
                let mut label = [0u8; 8];
                let label_len = match encoding.label_dtype {
                    DType::I64 => {
                        let class = if encoding.map_plus_minus {
                            i64::from(line.label > 0.0)
                        } else {
                            line.label as i64
                        };
                        label = class.to_le_bytes();
                        8
                    }
                    _ => {
                        label[..4].copy_from_slice(&(line.label as f32).to_le_bytes());
                        4
                    }
                };
                let qid = line.qid.unwrap_or(0).to_le_bytes();
                let record = [
                    Value::sparse(&positions, &lines.values),
                    Value::Dense(&label[..label_len]),
                    Value::Dense(&qid),
                ];
                writer.append(&record[..if encoding.qid { 3 } else { 2 }])?;
            }
        }
    }
    writers.into_iter().map(DatasetWriter::finish).collect()
}
