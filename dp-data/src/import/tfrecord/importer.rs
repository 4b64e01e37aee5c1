//! Importing TFRecord files of `tf.train.Example` as one dataset.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::columns::{Column, check_example, infer_schema};
use super::example::{List, Parsed, parse_example};
use super::frame::{next_record, open};
use super::options::TfRecordOptions;
use super::sparse::SparseRow;
use crate::error::{Error, Result};
#[cfg(feature = "images")]
use crate::image::decode::Decoder;
use crate::import::{list_names, quote_name};
use crate::manifest::Manifest;
use crate::value::Value;
use crate::writer::{DatasetWriter, WriterOptions};

/// Imports TFRecord files of `tf.train.Example` as one dataset at `out`, records in file
/// order. The schema comes from the first Example: an `int64_list` of n values becomes
/// `i64[n]`, a `float_list` `f32[n]`, a `bytes_list` of one value a bytes feature; features are
/// ordered by name, and characters a feature name cannot hold (like the `/` in
/// `image/encoded`) become `_`. Every later Example must have the same features with the same
/// lists and lengths, or the import fails naming the file, the record's offset and the feature.
///
/// Keys declared in `tf` as variable-length or sparse (see [`VarLenFeature`](crate::VarLenFeature) and
/// [`SparseFeature`](crate::SparseFeature)) become sparse `f32` features after the inferred ones, and may be
/// missing from an Example (an empty row), though not from every one (a declared key that no
/// record has is refused, naming it and the keys the records have); an id or index outside
/// the declared width, a repeated index, or index and value lists of different lengths fail
/// naming the file, the record's offset and the key.
///
/// Every record's length and data CRC32C are checked. `tf.compression` says whether the files
/// are GZIP-compressed; [`TfRecordCompression::Auto`](crate::TfRecordCompression::Auto) decides per file.
///
/// ```no_run
/// use std::path::{Path, PathBuf};
/// use dp_data::{TfRecordOptions, WriterOptions, import_tfrecord};
///
/// let files = [PathBuf::from("train-00000-of-00002.tfrecord.gz"), PathBuf::from("train-00001-of-00002.tfrecord.gz")];
/// let manifest =
///     import_tfrecord(&files, Path::new("train"), &TfRecordOptions::default(), WriterOptions::default())?;
/// # Ok::<(), dp_data::Error>(())
/// ```
pub fn import_tfrecord(
    paths: &[PathBuf],
    out: &Path,
    tf: &TfRecordOptions,
    options: WriterOptions,
) -> Result<Manifest> {
    tf.check()?;
    let compression = tf.compression;
    if paths.is_empty() {
        return Err(Error::Config {
            field: "paths",
            what: "at least one TFRecord file is needed".into(),
        });
    }
    let mut options = Some(options);
    let mut writer: Option<(DatasetWriter, Vec<Column>)> = None;
    let mut data = Vec::new();
    let mut rows: Vec<SparseRow> =
        (0..tf.var_len.len() + tf.sparse.len()).map(|_| SparseRow::default()).collect();
    // Whether some record has each declared key: a key that none has (misspelt, or another
    // dataset's) would otherwise import as a feature that is empty in every record.
    let declared = tf.declared_keys();
    let mut seen = vec![false; declared.len()];
    // Each image column's value as stored (its header, then its bytes), reused record to record,
    // once the pipeline's decoder has read it whole (a record cut short fails here, named).
    let mut stored: Vec<Vec<u8>> = Vec::new();
    #[cfg(feature = "images")]
    let mut decoder = Decoder::default();
    for path in paths {
        let mut source = open(path, compression)?;
        let mut index = 0u64;
        while let Some(at) = next_record(&mut source, &mut data)? {
            let mut example = BTreeMap::new();
            parse_example(&data, &mut example).map_err(|(pos, what)| {
                source.corrupt(
                    at + 12 + pos as u64,
                    format!("record {index} of this file: malformed tf.train.Example: {what}"),
                )
            })?;
            let (writer, columns) = match &mut writer {
                Some((writer, columns)) => {
                    check_example(&example, columns, tf, &source, at, index)?;
                    (writer, &*columns)
                }
                None => {
                    let (schema, columns) = infer_schema(&example, &data, tf, &source, at)?;
                    let created =
                        DatasetWriter::create(out, schema, options.take().unwrap_or_default())?;
                    let (writer, columns) = writer.insert((created, columns));
                    (writer, &*columns)
                }
            };
            for (seen, (key, ..)) in seen.iter_mut().zip(&declared) {
                *seen |= example.contains_key(key.as_bytes());
            }
            let in_record =
                |what: String| source.corrupt(at, format!("record {index} of this file: {what}"));
            read_sparse_rows(&example, tf, &mut rows).map_err(in_record)?;
            stored.resize_with(columns.len(), Vec::new);
            #[cfg(feature = "images")]
            for (column, stored) in columns.iter().zip(&mut stored).filter(|(c, _)| c.image) {
                let (a, b) = example[column.key.as_slice()].bytes[0];
                let info = decoder.check(&data[a..b]).map_err(|what| {
                    in_record(format!("feature {}: the image {what}", quote_name(&column.key)))
                })?;
                info.store(&data[a..b], stored);
            }
            let mut values = Vec::with_capacity(columns.len() + rows.len());
            for (column, stored) in columns.iter().zip(&stored) {
                let parsed = &example[column.key.as_slice()];
                values.push(match column.list {
                    List::Bytes if column.image => Value::Bytes(stored),
                    List::Bytes => {
                        let (a, b) = parsed.bytes[0];
                        Value::Bytes(&data[a..b])
                    }
                    List::Float => Value::dense(&parsed.floats),
                    List::Int64 => Value::dense(&parsed.ints),
                });
            }
            values.extend(rows.iter().map(|row| Value::sparse(&row.positions, &row.values)));
            writer.append(&values)?;
            index += 1;
        }
    }
    let Some((writer, columns)) = writer else {
        return Err(Error::Schema(format!(
            "the TFRecord files ({}) hold no Example to infer a schema from",
            show_files(paths)
        )));
    };
    check_declared_keys_seen(&declared, &seen, &columns, paths)?;
    writer.finish()
}

/// Reads the declared sparse keys of `example` into `rows`, the var-len keys' rows first;
/// an error names the key and says what is wrong with its lists.
fn read_sparse_rows(
    example: &BTreeMap<&[u8], Parsed>,
    tf: &TfRecordOptions,
    rows: &mut [SparseRow],
) -> std::result::Result<(), String> {
    for (row, v) in rows.iter_mut().zip(&tf.var_len) {
        row.var_len(example.get(v.key.as_bytes()), v.width)
            .map_err(|what| format!("feature `{}`: {what}", v.key))?;
    }
    for (row, s) in rows[tf.var_len.len()..].iter_mut().zip(&tf.sparse) {
        let (index, value) =
            (example.get(s.index_key.as_bytes()), example.get(s.value_key.as_bytes()));
        row.indexed(index, value, s.width).map_err(|what| {
            format!("sparse feature `{}` ({}, {}): {what}", s.name, s.index_key, s.value_key)
        })?;
    }
    Ok(())
}

/// Refuses declared keys that no record has (misspelt, or another dataset's), naming them and
/// the keys the records have.
fn check_declared_keys_seen(
    declared: &[(&str, &'static str, String)],
    seen: &[bool],
    columns: &[Column],
    paths: &[PathBuf],
) -> Result<()> {
    let missing: Vec<_> = declared.iter().zip(seen).filter(|(_, seen)| !**seen).collect();
    if let Some(((_, field, _), _)) = missing.first() {
        let shown: Vec<String> = missing
            .iter()
            .map(|((key, _, what), _)| format!("{} ({what})", quote_name(key.as_bytes())))
            .collect();
        let found = list_names(columns.iter().map(|c| c.key.as_slice()).chain(
            declared.iter().zip(seen).filter(|(_, s)| **s).map(|((k, ..), _)| k.as_bytes()),
        ));
        let found = if found.is_empty() { "none".to_string() } else { found };
        Err(Error::Config {
            field,
            what: format!(
                "declared key{} {} in no record of {}: every record would hold an empty \
                 feature for {}; the records' keys are {found}",
                if missing.len() == 1 { " is" } else { "s are" },
                shown.join(", "),
                show_files(paths),
                if missing.len() == 1 { "it" } else { "them" },
            ),
        })
    } else {
        Ok(())
    }
}

/// The files of an import for a message: the first few, and how many more.
fn show_files(paths: &[PathBuf]) -> String {
    const SHOWN: usize = 5;
    let mut shown: Vec<String> =
        paths.iter().take(SHOWN).map(|p| p.display().to_string()).collect();
    if paths.len() > SHOWN {
        shown.push(format!("and {} more", paths.len() - SHOWN));
    }
    shown.join(", ")
}
