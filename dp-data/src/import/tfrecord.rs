//! TFRecord files of `tf.train.Example`: [`import_tfrecord`].
//!
//! A TFRecord file is a sequence of records, each framed as
//!
//! ```text
//! u64 length, u32 masked CRC32C of the length's 8 bytes, length bytes of data,
//! u32 masked CRC32C of the data                                   (all little-endian)
//! ```
//!
//! where `masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8` (wrapping). Each record's
//! data is a serialized `tf.train.Example` protocol buffer, decoded here by hand:
//!
//! ```text
//! Example  { Features features = 1; }
//! Features { map<string, Feature> feature = 1; }   // entries: { key = 1; value = 2; }
//! Feature  { oneof { BytesList bytes_list = 1; FloatList float_list = 2;
//!                    Int64List int64_list = 3; } }
//! BytesList { repeated bytes value = 1; }
//! FloatList { repeated float value = 1; }           // packed or not
//! Int64List { repeated int64 value = 1; }           // packed or not
//! ```
//!
//! with protobuf's merge rules: unknown fields are skipped, a repeated map key keeps its last
//! value, a message field that appears twice is merged, and a oneof keeps its last member.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::tfrecord_sparse::{SparseFeature, SparseRow, VarLenFeature};
use super::{Source, list_names, quote, quote_name};
use crate::image::{ImageFormat, decode::Decoder};
use crate::{DType, DatasetWriter, Error, Feature, Manifest, Result, Schema, Value, WriterOptions};

/// How [`import_tfrecord`] reads TFRecord files: their compression, and the keys to read as
/// sparse features, which the first Example alone cannot tell (TensorFlow's feature specs).
///
/// ```
/// use dp_data::{TfRecordOptions, VarLenFeature};
///
/// let options = TfRecordOptions {
///     var_len: vec![VarLenFeature { key: "words".into(), width: 50_000 }],
///     ..TfRecordOptions::default()
/// };
/// assert!(options.sparse.is_empty());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TfRecordOptions {
    /// Whether the files are GZIP-compressed (by default, decided per file).
    pub compression: TfRecordCompression,
    /// Keys read as `tf.io.VarLenFeature`.
    pub var_len: Vec<VarLenFeature>,
    /// Index and value keys read as `tf.io.SparseFeature`.
    pub sparse: Vec<SparseFeature>,
    /// Bytes keys read as encoded images (JPEG or PNG, as `tf.io.encode_jpeg` writes them)
    /// into an image feature. A bytes key whose value in the first Example is a JPEG or PNG
    /// is one without being named.
    pub images: Vec<String>,
}

impl TfRecordOptions {
    /// Whether `key` is declared sparse (then not inferred from the first Example).
    fn declares(&self, key: &[u8]) -> bool {
        self.var_len.iter().any(|v| v.key.as_bytes() == key)
            || self
                .sparse
                .iter()
                .any(|s| s.index_key.as_bytes() == key || s.value_key.as_bytes() == key)
    }

    /// Every declared key with the option and the words that declared it, in declaration
    /// order.
    fn declared_keys(&self) -> Vec<(&str, &'static str, String)> {
        let var_len =
            self.var_len.iter().map(|v| (v.key.as_str(), "var_len", "a VarLenFeature".to_string()));
        let sparse = self.sparse.iter().flat_map(|s| {
            let of = |which| format!("the {which} key of the SparseFeature `{}`", s.name);
            [
                (s.index_key.as_str(), "sparse", of("index")),
                (s.value_key.as_str(), "sparse", of("value")),
            ]
        });
        var_len.chain(sparse).collect()
    }

    /// The declared sparse features: their names and widths, in declaration order.
    fn features(&self) -> Vec<(String, usize)> {
        let var_len = self.var_len.iter().map(|v| (feature_name(v.key.as_bytes()), v.width));
        var_len.chain(self.sparse.iter().map(|s| (s.name.clone(), s.width))).collect()
    }

    fn check(&self) -> Result<()> {
        let widths = self.var_len.iter().map(|v| (&v.key, v.width));
        for (key, width) in widths.chain(self.sparse.iter().map(|s| (&s.name, s.width))) {
            if width == 0 {
                return Err(Error::Config {
                    field: "width",
                    what: format!("the sparse feature `{key}` must be at least 1 wide"),
                });
            }
        }
        Ok(())
    }
}

/// How the TFRecord files given to [`import_tfrecord`] are compressed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TfRecordCompression {
    /// Decide per file: a file whose first 12 bytes are a valid record frame is uncompressed,
    /// one that starts with the gzip magic is GZIP.
    #[default]
    Auto,
    /// Uncompressed (TensorFlow's `compression_type=""`).
    None,
    /// GZIP (TensorFlow's `compression_type="GZIP"`).
    Gzip,
}

/// The largest record accepted: a sanity bound far above any real Example. Below it, a record
/// of an uncompressed file must also fit in what is left of the file, and a record of a
/// compressed one is read in chunks as its bytes arrive, so a lying length costs nothing.
const MAX_RECORD: u64 = 1 << 32;

/// TFRecord's CRC mask.
fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crate::checksum::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Reads the next record's data into `buf`; returns the offset of its frame, or `None` at the
/// end of the file.
fn next_record(source: &mut Source, buf: &mut Vec<u8>) -> Result<Option<u64>> {
    if source.at_end()? {
        return Ok(None);
    }
    let start = source.offset();
    let mut head = [0u8; 12];
    source.read_exact(&mut head, "a record's length and its CRC")?;
    let len = u64::from_le_bytes(head[..8].try_into().unwrap_or_default());
    let stored = u32::from_le_bytes(head[8..].try_into().unwrap_or_default());
    let expected = masked_crc(&head[..8]);
    if stored != expected {
        return Err(source.corrupt(
            start + 8,
            format!(
                "record length field: expected the masked CRC32C {expected:#010x} of the length \
                 bytes, found {stored:#010x} (not a TFRecord file, or a corrupt one)"
            ),
        ));
    }
    if len > MAX_RECORD || len.saturating_add(4) > source.max_remaining() {
        return Err(source.corrupt(
            start,
            format!(
                "record length {len} is more than the rest of the file can hold ({} bytes at most)",
                source.max_remaining().saturating_sub(4).min(MAX_RECORD)
            ),
        ));
    }
    source.read_into(buf, len, format_args!("the {len}-byte record starting at byte {start}"))?;
    let mut tail = [0u8; 4];
    source.read_exact(&mut tail, "the record's data CRC")?;
    let stored = u32::from_le_bytes(tail);
    let expected = masked_crc(buf);
    if stored != expected {
        return Err(source.corrupt(
            start + 12 + len,
            format!(
                "record data: expected the masked CRC32C {expected:#010x} of the {len} data bytes, \
                 found {stored:#010x}"
            ),
        ));
    }
    Ok(Some(start))
}

/// A parse error: the position in the record's data, and what was wrong.
type Parse<T> = std::result::Result<T, (usize, String)>;

/// Protobuf wire types.
const VARINT: u8 = 0;
const I64: u8 = 1;
const LEN: u8 = 2;
const I32: u8 = 5;

/// A reader of protobuf fields in `data[pos..end]`.
struct Wire<'a> {
    data: &'a [u8],
    pos: usize,
    end: usize,
}

impl<'a> Wire<'a> {
    fn new(data: &'a [u8], (pos, end): (usize, usize)) -> Self {
        Wire { data, pos, end }
    }

    fn done(&self) -> bool {
        self.pos >= self.end
    }

    fn varint(&mut self) -> Parse<u64> {
        let start = self.pos;
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            if self.pos >= self.end {
                return Err((start, "a varint runs past the end of its message".into()));
            }
            let byte = self.data[self.pos];
            self.pos += 1;
            if shift < 64 {
                value |= u64::from(byte & 0x7f) << shift;
            }
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err((start, "a varint is longer than 10 bytes".into()))
    }

    /// The next field's number and wire type.
    fn tag(&mut self) -> Parse<(u64, u8)> {
        let at = self.pos;
        let tag = self.varint()?;
        let (field, wire) = (tag >> 3, (tag & 7) as u8);
        if field == 0 {
            return Err((at, "field number 0 is invalid".into()));
        }
        Ok((field, wire))
    }

    /// The bounds of a length-delimited field's payload.
    fn bytes(&mut self) -> Parse<(usize, usize)> {
        let at = self.pos;
        let len = self.varint()?;
        let left = (self.end - self.pos) as u64;
        if len > left {
            return Err((
                at,
                format!("a field declares {len} bytes, only {left} remain in its message"),
            ));
        }
        let start = self.pos;
        self.pos += len as usize;
        Ok((start, self.pos))
    }

    fn fixed<const N: usize>(&mut self) -> Parse<[u8; N]> {
        if self.end - self.pos < N {
            return Err((self.pos, format!("a {N}-byte field runs past the end of its message")));
        }
        let mut out = [0u8; N];
        out.copy_from_slice(&self.data[self.pos..self.pos + N]);
        self.pos += N;
        Ok(out)
    }

    fn skip(&mut self, wire: u8) -> Parse<()> {
        match wire {
            VARINT => self.varint().map(drop),
            I64 => self.fixed::<8>().map(drop),
            LEN => self.bytes().map(drop),
            I32 => self.fixed::<4>().map(drop),
            _ => Err((self.pos, format!("wire type {wire} is not supported (groups or invalid)"))),
        }
    }

    fn wrong(&self, at: usize, field: &str, wire: u8) -> (usize, String) {
        (at, format!("{field} has wire type {wire}, which does not fit its type"))
    }
}

/// Which list a feature holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum List {
    Bytes,
    Float,
    Int64,
}

impl List {
    fn name(self) -> &'static str {
        match self {
            List::Bytes => "bytes_list",
            List::Float => "float_list",
            List::Int64 => "int64_list",
        }
    }
}

/// One decoded feature of an Example.
#[derive(Debug, Default)]
pub(crate) struct Parsed {
    pub(crate) list: Option<List>,
    /// Bounds of the byte strings in the record's data.
    pub(crate) bytes: Vec<(usize, usize)>,
    pub(crate) floats: Vec<f32>,
    pub(crate) ints: Vec<i64>,
}

impl Parsed {
    pub(crate) fn count(&self) -> usize {
        match self.list {
            Some(List::Bytes) => self.bytes.len(),
            Some(List::Float) => self.floats.len(),
            Some(List::Int64) => self.ints.len(),
            None => 0,
        }
    }

    /// Switches the oneof to `list`, clearing the other member as protobuf does.
    fn switch(&mut self, list: List) {
        if self.list != Some(list) {
            self.bytes.clear();
            self.floats.clear();
            self.ints.clear();
            self.list = Some(list);
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self.list {
            Some(list) => format!("{} of {} values", list.name(), self.count()),
            None => "no value list".into(),
        }
    }
}

/// Decodes an Example into its features, keyed by name.
fn parse_example<'a>(data: &'a [u8], out: &mut BTreeMap<&'a [u8], Parsed>) -> Parse<()> {
    out.clear();
    let mut wire = Wire::new(data, (0, data.len()));
    while !wire.done() {
        let at = wire.pos;
        match wire.tag()? {
            (1, LEN) => {
                let features = wire.bytes()?;
                parse_features(data, features, out)?;
            }
            (1, w) => return Err(wire.wrong(at, "Example.features", w)),
            (_, w) => wire.skip(w)?,
        }
    }
    Ok(())
}

fn parse_features<'a>(
    data: &'a [u8],
    bounds: (usize, usize),
    out: &mut BTreeMap<&'a [u8], Parsed>,
) -> Parse<()> {
    let mut wire = Wire::new(data, bounds);
    while !wire.done() {
        let at = wire.pos;
        match wire.tag()? {
            (1, LEN) => {
                let entry = wire.bytes()?;
                let (key, feature) = parse_entry(data, entry)?;
                out.insert(key, feature);
            }
            (1, w) => return Err(wire.wrong(at, "Features.feature", w)),
            (_, w) => wire.skip(w)?,
        }
    }
    Ok(())
}

fn parse_entry(data: &[u8], bounds: (usize, usize)) -> Parse<(&[u8], Parsed)> {
    let mut wire = Wire::new(data, bounds);
    let mut key: &[u8] = &[];
    let mut feature = Parsed::default();
    while !wire.done() {
        let at = wire.pos;
        match wire.tag()? {
            (1, LEN) => {
                let (a, b) = wire.bytes()?;
                key = &data[a..b];
                if std::str::from_utf8(key).is_err() {
                    return Err((a, format!("feature key {} is not UTF-8", quote(key))));
                }
            }
            (2, LEN) => {
                let value = wire.bytes()?;
                parse_feature(data, value, &mut feature)?;
            }
            (1, w) => return Err(wire.wrong(at, "the feature map's key", w)),
            (2, w) => return Err(wire.wrong(at, "the feature map's value", w)),
            (_, w) => wire.skip(w)?,
        }
    }
    Ok((key, feature))
}

fn parse_feature(data: &[u8], bounds: (usize, usize), out: &mut Parsed) -> Parse<()> {
    let mut wire = Wire::new(data, bounds);
    while !wire.done() {
        let at = wire.pos;
        let (field, w) = wire.tag()?;
        let list = match field {
            1 => List::Bytes,
            2 => List::Float,
            3 => List::Int64,
            _ => {
                wire.skip(w)?;
                continue;
            }
        };
        if w != LEN {
            return Err(wire.wrong(at, list.name(), w));
        }
        let bounds = wire.bytes()?;
        out.switch(list);
        parse_list(data, bounds, list, out)?;
    }
    Ok(())
}

fn parse_list(data: &[u8], bounds: (usize, usize), list: List, out: &mut Parsed) -> Parse<()> {
    let mut wire = Wire::new(data, bounds);
    while !wire.done() {
        let at = wire.pos;
        match (wire.tag()?, list) {
            ((1, LEN), List::Bytes) => out.bytes.push(wire.bytes()?),
            ((1, LEN), List::Float) => {
                let (a, b) = wire.bytes()?;
                if (b - a) % 4 != 0 {
                    return Err((
                        a,
                        format!("packed floats: {} bytes is not a multiple of 4", b - a),
                    ));
                }
                out.floats.extend(
                    data[a..b]
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes(c.try_into().unwrap_or_default())),
                );
            }
            ((1, I32), List::Float) => out.floats.push(f32::from_le_bytes(wire.fixed::<4>()?)),
            ((1, LEN), List::Int64) => {
                let packed = wire.bytes()?;
                let mut values = Wire::new(data, packed);
                while !values.done() {
                    out.ints.push(values.varint()? as i64);
                }
            }
            ((1, VARINT), List::Int64) => out.ints.push(wire.varint()? as i64),
            ((1, w), _) => return Err(wire.wrong(at, list.name(), w)),
            ((_, w), _) => wire.skip(w)?,
        }
    }
    Ok(())
}

/// A schema feature name for a TFRecord key: characters a schema does not allow (TensorFlow
/// keys often hold `/`, as in `image/encoded`) become `_`.
fn feature_name(key: &[u8]) -> String {
    String::from_utf8_lossy(key)
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "_-.".contains(c) { c } else { '_' })
        .collect()
}

/// One schema feature and the Example key and list it comes from.
struct Column {
    key: Vec<u8>,
    list: List,
    count: usize,
    /// A bytes key read as encoded images.
    image: bool,
}

/// The schema inferred from the first Example, in feature-name order.
fn infer_schema(
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
fn check_example(
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

/// Opens a TFRecord file under `compression`.
fn open(path: &Path, compression: TfRecordCompression) -> Result<Source> {
    let gzip = match compression {
        TfRecordCompression::None => false,
        TfRecordCompression::Gzip => true,
        TfRecordCompression::Auto => {
            let mut file = File::open(path).map_err(|e| Error::io(path, "open", e))?;
            let mut head = Vec::with_capacity(12);
            file.by_ref()
                .take(12)
                .read_to_end(&mut head)
                .map_err(|e| Error::io(path, "read", e))?;
            let framed = head.len() == 12 && masked_crc(&head[..8]).to_le_bytes() == head[8..12];
            !framed && head.starts_with(&[0x1f, 0x8b])
        }
    };
    Source::open(path, Some(gzip))
}

/// Imports TFRecord files of `tf.train.Example` as one dataset at `out`, records in file
/// order. The schema comes from the first Example: an `int64_list` of n values becomes
/// `i64[n]`, a `float_list` `f32[n]`, a `bytes_list` of one value a bytes feature; features are
/// ordered by name, and characters a feature name cannot hold (like the `/` in
/// `image/encoded`) become `_`. Every later Example must have the same features with the same
/// lists and lengths, or the import fails naming the file, the record's offset and the feature.
///
/// Keys declared in `tf` as variable-length or sparse (see [`VarLenFeature`] and
/// [`SparseFeature`]) become sparse `f32` features after the inferred ones, and may be
/// missing from an Example (an empty row), though not from every one (a declared key that no
/// record has is refused, naming it and the keys the records have); an id or index outside
/// the declared width, a repeated index, or index and value lists of different lengths fail
/// naming the file, the record's offset and the key.
///
/// Every record's length and data CRC32C are checked. `tf.compression` says whether the files
/// are GZIP-compressed; [`TfRecordCompression::Auto`] decides per file.
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
    let (mut stored, mut decoder): (Vec<Vec<u8>>, _) = (Vec::new(), Decoder::default());
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
            for (row, v) in rows.iter_mut().zip(&tf.var_len) {
                row.var_len(example.get(v.key.as_bytes()), v.width)
                    .map_err(|what| in_record(format!("feature `{}`: {what}", v.key)))?;
            }
            for (row, s) in rows[tf.var_len.len()..].iter_mut().zip(&tf.sparse) {
                let (index, value) =
                    (example.get(s.index_key.as_bytes()), example.get(s.value_key.as_bytes()));
                row.indexed(index, value, s.width).map_err(|what| {
                    in_record(format!(
                        "sparse feature `{}` ({}, {}): {what}",
                        s.name, s.index_key, s.value_key
                    ))
                })?;
            }
            stored.resize_with(columns.len(), Vec::new);
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
    let missing: Vec<_> = declared.iter().zip(&seen).filter(|(_, seen)| !**seen).collect();
    if let Some(((_, field, _), _)) = missing.first() {
        let shown: Vec<String> = missing
            .iter()
            .map(|((key, _, what), _)| format!("{} ({what})", quote_name(key.as_bytes())))
            .collect();
        let found = list_names(columns.iter().map(|c| c.key.as_slice()).chain(
            declared.iter().zip(&seen).filter(|(_, s)| **s).map(|((k, ..), _)| k.as_bytes()),
        ));
        let found = if found.is_empty() { "none".to_string() } else { found };
        return Err(Error::Config {
            field,
            what: format!(
                "declared key{} {} in no record of {}: every record would hold an empty \
                 feature for {}; the records' keys are {found}",
                if missing.len() == 1 { " is" } else { "s are" },
                shown.join(", "),
                show_files(paths),
                if missing.len() == 1 { "it" } else { "them" },
            ),
        });
    }
    writer.finish()
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn masked_crc_matches_known_values() {
        // CRC32C("123456789") = 0xe3069283 (RFC 3720's check value), masked by hand:
        // ((0xe3069283 >> 15) | (0xe3069283 << 17)) + 0xa282ead8 (mod 2^32) = 0xc78ab0e5.
        assert_eq!(crate::checksum::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(masked_crc(b"123456789"), 0xc78a_b0e5);
    }

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }

    fn field(number: u64, payload: &[u8], out: &mut Vec<u8>) {
        varint(number << 3 | 2, out);
        varint(payload.len() as u64, out);
        out.extend_from_slice(payload);
    }

    fn entry(key: &str, feature: &[u8]) -> Vec<u8> {
        let mut e = Vec::new();
        field(1, key.as_bytes(), &mut e);
        field(2, feature, &mut e);
        let mut f = Vec::new();
        field(1, &e, &mut f);
        f
    }

    fn example(entries: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        field(1, &entries.concat(), &mut out);
        out
    }

    fn parse(data: &[u8]) -> Parse<BTreeMap<&[u8], Parsed>> {
        let mut map = BTreeMap::new();
        parse_example(data, &mut map)?;
        Ok(map)
    }

    #[test]
    fn decodes_packed_and_unpacked_lists() {
        // int64_list unpacked: 3, -1; float_list packed: 1.5, -2; bytes_list: "ab", "".
        let mut ints = Vec::new();
        varint(8, &mut ints); // field 1, varint
        varint(3, &mut ints);
        varint(8, &mut ints);
        varint(u64::MAX, &mut ints); // -1 as int64
        let mut floats = Vec::new();
        field(1, &[1.5f32.to_le_bytes(), (-2f32).to_le_bytes()].concat(), &mut floats);
        floats.push(1 << 3 | 5); // field 1, fixed32
        floats.extend_from_slice(&4f32.to_le_bytes());
        let mut bytes = Vec::new();
        field(1, b"ab", &mut bytes);
        field(1, b"", &mut bytes);
        let feature = |n: u64, list: &[u8]| {
            let mut f = Vec::new();
            field(n, list, &mut f);
            f
        };
        let data = example(&[
            entry("i", &feature(3, &ints)),
            entry("f", &feature(2, &floats)),
            entry("b", &feature(1, &bytes)),
        ]);
        let map = parse(&data).unwrap();
        assert_eq!(map[&b"i"[..]].ints, [3, -1]);
        assert_eq!(map[&b"f"[..]].floats, [1.5, -2.0, 4.0]);
        let b = &map[&b"b"[..]];
        assert_eq!(
            b.bytes.iter().map(|&(x, y)| &data[x..y]).collect::<Vec<_>>(),
            [&b"ab"[..], b""]
        );
    }

    #[test]
    fn follows_protobuf_merge_rules() {
        let mut list = Vec::new();
        field(1, &[varint_bytes(5), varint_bytes(6)].concat(), &mut list);
        let mut ints = Vec::new();
        field(3, &list, &mut ints);
        let mut floats = Vec::new();
        field(2, &[], &mut floats);
        // The same key twice: the last wins. A oneof set twice: the last member wins.
        let data = example(&[entry("k", &floats), entry("k", &[ints.clone(), floats].concat())]);
        let map = parse(&data).unwrap();
        assert_eq!(map[&b"k"[..]].list, Some(List::Float));
        // A list field twice in one Feature: merged.
        let data = example(&[entry("k", &[ints.clone(), ints].concat())]);
        assert_eq!(parse(&data).unwrap()[&b"k"[..]].ints, [5, 6, 5, 6]);
        // Unknown fields are skipped.
        let mut data = vec![0x10, 0x01, 0x1d, 1, 2, 3, 4];
        data.extend(example(&[entry("x", &[])]));
        assert_eq!(parse(&data).unwrap()[&b"x"[..]].list, None);
    }

    fn varint_bytes(v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        varint(v, &mut out);
        out
    }

    #[test]
    fn rejects_malformed_messages_with_positions() {
        let cases: [(&[u8], usize, &str); 6] = [
            (&[0x0a, 0x05, 0x0a], 1, "declares 5 bytes"),
            (&[0x08, 0x01], 0, "wire type 0"),
            (&[0x00], 0, "field number 0"),
            (&[0x0b], 0, "wire type 3"),
            (&[0x10, 0x80, 0x80], 1, "varint runs past"),
            (
                &[0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
                1,
                "longer than 10",
            ),
        ];
        for (data, at, expect) in cases {
            let (pos, what) = parse(data).unwrap_err();
            assert_eq!(pos, at, "{data:?}: {what}");
            assert!(what.contains(expect), "{data:?}: {what}");
        }
        let mut floats = Vec::new();
        field(1, &[0; 5], &mut floats);
        let mut feature = Vec::new();
        field(2, &floats, &mut feature);
        let (_, what) = parse(&example(&[entry("f", &feature)])).unwrap_err();
        assert!(what.contains("multiple of 4"), "{what}");
        let (_, what) = parse(&example(&[entry("\u{80}", &feature)].map(|mut e| {
            // Corrupt the key's UTF-8.
            let at = e.iter().position(|&b| b == 0xc2).unwrap();
            e[at] = 0xff;
            e
        })))
        .unwrap_err();
        assert!(what.contains("UTF-8"), "{what}");
    }

    #[test]
    fn names_are_sanitized() {
        assert_eq!(feature_name(b"image/encoded"), "image_encoded");
        assert_eq!(feature_name(b"a.b-c_d9"), "a.b-c_d9");
    }

    fn frame(data: &[u8]) -> Vec<u8> {
        let mut out = (data.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&masked_crc(&out.clone()).to_le_bytes());
        out.extend_from_slice(data);
        out.extend_from_slice(&masked_crc(data).to_le_bytes());
        out
    }

    #[test]
    fn reads_frames_and_checks_their_crcs() {
        let file = [frame(b"hello"), frame(b""), frame(b"world!")].concat();
        let mut source = Source::from_bytes(file.clone(), false);
        let mut buf = Vec::new();
        assert_eq!(next_record(&mut source, &mut buf).unwrap(), Some(0));
        assert_eq!(buf, b"hello");
        assert_eq!(next_record(&mut source, &mut buf).unwrap(), Some(21));
        assert_eq!(buf, b"");
        assert_eq!(next_record(&mut source, &mut buf).unwrap(), Some(37));
        assert_eq!(buf, b"world!");
        assert_eq!(next_record(&mut source, &mut buf).unwrap(), None);

        let corrupt = |file: Vec<u8>| -> (u64, String) {
            let mut source = Source::from_bytes(file, false);
            let mut buf = Vec::new();
            loop {
                match next_record(&mut source, &mut buf) {
                    Ok(Some(_)) => continue,
                    Err(Error::Corrupt { offset, what, .. }) => return (offset, what),
                    other => panic!("{other:?}"),
                }
            }
        };
        let mut bad = file.clone();
        bad[21 + 3] ^= 1; // the second record's length
        assert_eq!(corrupt(bad).0, 21 + 8);
        let mut bad = file.clone();
        bad[12] ^= 1; // the first record's data
        let (at, what) = corrupt(bad);
        assert_eq!(at, 12 + 5);
        assert!(what.contains("record data"), "{what}");
        let (at, what) = corrupt(file[..file.len() - 2].to_vec());
        assert_eq!(at, 37);
        assert!(what.contains("more than the rest"), "{what}");
        // Cut after the third record's length: the CRC is missing at 45.
        let (at, what) = corrupt(file[..file.len() - 14].to_vec());
        assert_eq!(at, 45);
        assert!(what.contains("ends 8 bytes into"), "{what}");
        // A length that lies, with a valid CRC, is refused before reading.
        let mut lie = u64::MAX.to_le_bytes().to_vec();
        lie.extend_from_slice(&masked_crc(&lie.clone()).to_le_bytes());
        let (at, what) = corrupt(lie);
        assert_eq!(at, 0);
        assert!(what.contains("more than the rest"), "{what}");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

        #[test]
        fn mutated_examples_never_panic(
            ints in proptest::collection::vec(any::<i64>(), 0..4),
            floats in proptest::collection::vec(any::<f32>(), 0..4),
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
            cut in any::<Option<usize>>(),
        ) {
            let mut i = Vec::new();
            field(1, &ints.iter().flat_map(|&v| varint_bytes(v as u64)).collect::<Vec<_>>(), &mut i);
            let mut f = Vec::new();
            field(1, &floats.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(), &mut f);
            let mut b = Vec::new();
            field(1, b"bytes", &mut b);
            let (mut fi, mut ff, mut fb) = (Vec::new(), Vec::new(), Vec::new());
            field(3, &i, &mut fi);
            field(2, &f, &mut ff);
            field(1, &b, &mut fb);
            let mut data = example(&[entry("i", &fi), entry("f", &ff), entry("b", &fb)]);
            for (at, byte) in edits {
                let at = at % data.len();
                data[at] = byte;
            }
            if let Some(cut) = cut {
                data.truncate(cut % (data.len() + 1));
            }
            if let Ok(map) = parse(&data) {
                for parsed in map.values() {
                    for &(a, b) in &parsed.bytes {
                        prop_assert!(a <= b && b <= data.len());
                    }
                    prop_assert!(parsed.floats.len() + parsed.ints.len() <= data.len());
                }
            }
        }
    }
}
