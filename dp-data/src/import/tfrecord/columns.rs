//! The schema of an import, inferred from the first Example, and the check that every later
//! Example has the same features.

use std::collections::BTreeMap;

use super::example::{List, Parsed};
use super::feature_name::feature_name;
use super::options::TfRecordOptions;
use crate::error::{Error, Result};
use crate::image::ImageFormat;
use crate::import::{Source, list_names, quote_name};
use crate::schema::{DType, Feature, Schema};

/// One schema feature and the Example key and list it comes from.
pub(super) struct Column {
    pub(super) key: Vec<u8>,
    pub(super) list: List,
    pub(super) count: usize,
    /// A bytes key read as encoded images.
    pub(super) image: bool,
}

/// The schema inferred from the first Example, in feature-name order.
pub(super) fn infer_schema(
    example: &BTreeMap<&[u8], Parsed>,
    data: &[u8],
    tf: &TfRecordOptions,
    source: &Source,
    at: u64,
) -> Result<(Schema, Vec<Column>)> {
    let mut columns: Vec<(String, Column)> = Vec::with_capacity(example.len());
    for (key, parsed) in example.iter().filter(|(key, _)| !tf.declares(key)) {
        let name = feature_name(key);
        let shown = quote_name(key);
        let Some(list) = parsed.list else {
            return Err(source.corrupt(
                at,
                format!(
                    "the first Example's feature {shown} has no value list to infer a type from"
                ),
            ));
        };
        if list == List::Bytes && parsed.bytes.len() != 1 {
            return Err(source.corrupt(
                at,
                format!(
                    "the first Example's feature {shown} is a bytes_list of {} values; only \
                     bytes_lists of exactly one value can be imported",
                    parsed.bytes.len()
                ),
            ));
        }
        if columns.iter().any(|(n, _)| *n == name) {
            return Err(Error::Schema(format!(
                "two TFRecord feature keys become the feature name {} (one of them is \
                 {shown}): rename one",
                quote_name(name.as_bytes())
            )));
        }
        let named = tf.images.iter().any(|k| k.as_bytes() == *key);
        if named && list != List::Bytes {
            return Err(source.corrupt(
                at,
                format!("the image key {shown} is a {}, not a bytes_list", list.name()),
            ));
        }
        let image = list == List::Bytes && {
            let (a, b) = parsed.bytes[0];
            named || ImageFormat::sniff(&data[a..b]).is_some()
        };
        #[cfg(not(feature = "images"))]
        if image {
            return Err(Error::Config {
                field: "images",
                what: format!(
                    "the first Example's feature {shown} holds an image, which {}",
                    crate::image::IMAGES_LEFT_OUT
                ),
            });
        }
        let column = Column { key: key.to_vec(), list, count: parsed.count(), image };
        columns.push((name, column));
    }
    if let Some(key) = tf.images.iter().find(|k| !example.contains_key(k.as_bytes())) {
        let keys = list_names(example.keys().copied());
        return Err(source.corrupt(
            at,
            format!("the image key `{key}` is not in the first Example, whose keys are {keys}"),
        ));
    }
    let declared = tf.features();
    if columns.is_empty() && declared.is_empty() {
        return Err(source.corrupt(at, "the first Example has no features to infer a schema from"));
    }
    if let Some((name, _)) = declared.iter().find(|(n, _)| columns.iter().any(|(c, _)| c == n)) {
        return Err(Error::Schema(format!(
            "the sparse feature `{name}` has the name of a key of the Example: rename it"
        )));
    }
    columns.sort_by(|a, b| a.0.cmp(&b.0));
    // The inferred features by name, then the declared sparse ones in declaration order.
    let features = columns
        .iter()
        .map(|(name, c)| match c.list {
            List::Bytes if c.image => Feature::image(name.clone()),
            List::Bytes => Feature::bytes(name.clone()),
            List::Float => Feature::dense(name.clone(), DType::F32, &[c.count]),
            List::Int64 => Feature::dense(name.clone(), DType::I64, &[c.count]),
        })
        .chain(
            declared
                .iter()
                .map(|(name, width)| Feature::sparse(name.clone(), DType::F32, &[*width])),
        )
        .collect();
    Ok((Schema::new(features)?, columns.into_iter().map(|(_, c)| c).collect()))
}

/// Checks that an Example has exactly the features of the schema; `index` counts records in
/// this file.
pub(super) fn check_example(
    example: &BTreeMap<&[u8], Parsed>,
    columns: &[Column],
    tf: &TfRecordOptions,
    source: &Source,
    at: u64,
    index: u64,
) -> Result<()> {
    let fail = |what: String| source.corrupt(at, format!("record {index} of this file: {what}"));
    for column in columns {
        let shown = quote_name(&column.key);
        let expected = format!("{} of {} values", column.list.name(), column.count);
        match example.get(column.key.as_slice()) {
            None => {
                return Err(fail(format!(
                    "feature {shown} is missing (the first Example has it as {expected})"
                )));
            }
            Some(p) if p.list != Some(column.list) || p.count() != column.count => {
                return Err(fail(format!(
                    "feature {shown} is {}, but the first Example has it as {expected}",
                    p.describe()
                )));
            }
            Some(_) => {}
        }
    }
    let extra = example
        .keys()
        .find(|k| !tf.declares(k) && !columns.iter().any(|c| c.key.as_slice() == **k));
    if let Some(extra) = extra {
        let extra = quote_name(extra);
        return Err(fail(format!("feature {extra} is not in the first Example")));
    }
    Ok(())
}
