//! One block of records: how records are laid out column-wise before compression, and the
//! decoded block that readers serve typed views from.
//!
//! Layout of an uncompressed block (all integers little-endian; see FORMAT.md):
//!
//! ```text
//! u32 records, u32 features, features x u64 column offset (from the block start)
//! then one column per feature, each starting at a multiple of 64:
//!   dense:  records x element bytes x elements
//!   bytes:  (records + 1) x u64 end offsets (the first is 0), then the bytes
//!   sparse: (records + 1) x u64 end offsets into the non-zeros (the first is 0),
//!           non-zeros x u64 positions, then non-zeros x element bytes
//! ```

use std::path::Path;
use std::sync::Arc;

use dp_mem::{Pool, PoolBuf, Tag};
use ndarray::{ArrayViewD, IxDyn};

use crate::element::Element;
use crate::error::{Error, Result};
use crate::image::ImageInfo;
use crate::schema::{Feature, Kind, Schema};
use crate::value::Value;

/// Columns start at multiples of this, so typed views of a 64-aligned buffer are aligned.
const COLUMN_ALIGN: usize = 64;

/// Accumulates records column-wise until a block is full.
pub(crate) struct BlockBuilder {
    columns: Vec<ColumnBuilder>,
    records: usize,
}

enum ColumnBuilder {
    Dense(Vec<u8>),
    Bytes { ends: Vec<u64>, data: Vec<u8> },
    Sparse { ends: Vec<u64>, indices: Vec<u64>, values: Vec<u8> },
}

impl ColumnBuilder {
    fn bytes(&self) -> usize {
        match self {
            ColumnBuilder::Dense(data) => data.len(),
            ColumnBuilder::Bytes { ends, data } => 8 * (ends.len() + 1) + data.len(),
            ColumnBuilder::Sparse { ends, indices, values } => {
                8 * (ends.len() + 1) + 8 * indices.len() + values.len()
            }
        }
    }
}

impl BlockBuilder {
    pub(crate) fn new(schema: &Schema) -> Self {
        let columns = schema
            .features()
            .iter()
            .map(|f| match f.kind {
                Kind::Dense { .. } => ColumnBuilder::Dense(Vec::new()),
                Kind::Bytes | Kind::Image => {
                    ColumnBuilder::Bytes { ends: Vec::new(), data: Vec::new() }
                }
                Kind::Sparse { .. } => ColumnBuilder::Sparse {
                    ends: Vec::new(),
                    indices: Vec::new(),
                    values: Vec::new(),
                },
            })
            .collect();
        BlockBuilder { columns, records: 0 }
    }

    pub(crate) fn records(&self) -> usize {
        self.records
    }

    /// Appends a record whose values were checked against the schema.
    pub(crate) fn push(&mut self, record: &[Value<'_>]) {
        for (column, value) in self.columns.iter_mut().zip(record) {
            match (column, value) {
                (ColumnBuilder::Dense(data), Value::Dense(bytes)) => data.extend_from_slice(bytes),
                (ColumnBuilder::Bytes { ends, data }, Value::Bytes(bytes)) => {
                    data.extend_from_slice(bytes);
                    ends.push(data.len() as u64);
                }
                (
                    ColumnBuilder::Sparse { ends, indices, values },
                    Value::Sparse { indices: i, values: v },
                ) => {
                    indices.extend_from_slice(i);
                    values.extend_from_slice(v);
                    ends.push(indices.len() as u64);
                }
                _ => unreachable!("values are checked against the schema before they are pushed"),
            }
        }
        self.records += 1;
    }

    /// The size of the encoded block.
    pub(crate) fn encoded_len(&self) -> usize {
        let mut end = 8 + 8 * self.columns.len();
        for column in &self.columns {
            end = end.next_multiple_of(COLUMN_ALIGN) + column.bytes();
        }
        end
    }

    /// Writes the block into `out` (cleared first) and empties the builder, keeping its
    /// capacity for the next block.
    pub(crate) fn encode_into(&mut self, out: &mut Vec<u8>) {
        out.clear();
        out.reserve(self.encoded_len());
        out.extend_from_slice(&(self.records as u32).to_le_bytes());
        out.extend_from_slice(&(self.columns.len() as u32).to_le_bytes());
        let table = out.len();
        out.resize(table + 8 * self.columns.len(), 0);
        for (i, column) in self.columns.iter_mut().enumerate() {
            out.resize(out.len().next_multiple_of(COLUMN_ALIGN), 0);
            let start = out.len() as u64;
            out[table + 8 * i..table + 8 * i + 8].copy_from_slice(&start.to_le_bytes());
            match column {
                ColumnBuilder::Dense(data) => {
                    out.extend_from_slice(data);
                    data.clear();
                }
                ColumnBuilder::Bytes { ends, data } => {
                    out.extend_from_slice(&0u64.to_le_bytes());
                    out.extend_from_slice(bytemuck::cast_slice(ends));
                    out.extend_from_slice(data);
                    ends.clear();
                    data.clear();
                }
                ColumnBuilder::Sparse { ends, indices, values } => {
                    out.extend_from_slice(&0u64.to_le_bytes());
                    out.extend_from_slice(bytemuck::cast_slice(ends));
                    out.extend_from_slice(bytemuck::cast_slice(indices));
                    out.extend_from_slice(values);
                    ends.clear();
                    indices.clear();
                    values.clear();
                }
            }
        }
        self.records = 0;
    }
}

/// Where one feature's data lies in a decoded block.
#[derive(Debug, Clone, Copy)]
enum ColumnView {
    Dense { start: usize, end: usize },
    Bytes { ends: usize, data: usize },
    Sparse { ends: usize, indices: usize, values: usize },
}

/// A decompressed, validated block: the records `first_record..first_record + len()` of a
/// dataset, with typed access to each feature. Its buffer comes from a dp-mem pool under the
/// `Data` tag.
// Aligned to a cache line so that, in an `Arc`, the reference counts have a line of their own:
// workers clone and drop a block's `Arc` for every batch, and the fields read for every record
// would otherwise keep being taken from the core that counted last.
#[repr(align(64))]
pub struct Block {
    data: PoolBuf<u8>,
    /// Bytes of `data` the block occupies (the buffer may be a little larger).
    bytes: usize,
    records: usize,
    first_record: u64,
    schema: Arc<Schema>,
    columns: Vec<ColumnView>,
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("first_record", &self.first_record)
            .field("records", &self.records)
            .field("bytes", &self.bytes)
            .finish()
    }
}

/// Reads little-endian `u64`s out of untrusted bytes.
fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at.checked_add(8)?)?.try_into().ok()?))
}

impl Block {
    /// A copy of this block in a buffer from `pool`, so that its bytes count (and are
    /// budgeted) where the copy is held.
    pub(crate) fn copy_to(&self, pool: &Pool) -> Result<Block> {
        let mut data = pool.alloc::<u8>(self.bytes, Tag::Data)?;
        data.copy_from_slice(&self.data[..self.bytes]);
        Ok(Block {
            data,
            bytes: self.bytes,
            records: self.records,
            first_record: self.first_record,
            schema: Arc::clone(&self.schema),
            columns: self.columns.clone(),
        })
    }

    /// Validates `data[..len]` as a block of `schema` holding `records` records. `path` and
    /// `offset` (the block's position in its shard) only name the block in errors.
    pub(crate) fn decode(
        data: PoolBuf<u8>,
        len: usize,
        records: usize,
        first_record: u64,
        schema: Arc<Schema>,
        path: &Path,
        offset: u64,
    ) -> Result<Block> {
        let bytes = &data[..len];
        let fail = |what: String| Error::corrupt(path, offset, format!("block: {what}"));
        let header = |at: usize| -> Option<u32> {
            Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
        };
        let (stored_records, features) = match (header(0), header(4)) {
            (Some(r), Some(f)) => (r as usize, f as usize),
            _ => return Err(fail(format!("{len} bytes cannot hold a block header"))),
        };
        if stored_records != records {
            return Err(fail(format!("holds {stored_records} records, the index says {records}")));
        }
        if features != schema.features().len() {
            return Err(fail(format!(
                "has {features} columns, the schema has {} features",
                schema.features().len()
            )));
        }
        let mut columns = Vec::with_capacity(features);
        let mut floor = 8 + 8 * features;
        for (i, feature) in schema.features().iter().enumerate() {
            let start = u64_at(bytes, 8 + 8 * i)
                .and_then(|s| usize::try_from(s).ok())
                .filter(|&s| s >= floor && s % COLUMN_ALIGN == 0 && s <= len)
                .ok_or_else(|| {
                    fail(format!("column {i} (`{}`) starts outside the block", feature.name))
                })?;
            let (view, end) = Self::column(bytes, start, records, feature)
                .map_err(|what| fail(format!("column `{}`: {what}", feature.name)))?;
            columns.push(view);
            floor = end;
        }
        if floor != len {
            return Err(fail(format!("the columns end at byte {floor} of a {len}-byte block")));
        }
        Ok(Block { data, bytes: len, records, first_record, schema, columns })
    }

    /// Validates one column starting at `start`; returns its view and where it ends.
    fn column(
        bytes: &[u8],
        start: usize,
        records: usize,
        feature: &Feature,
    ) -> std::result::Result<(ColumnView, usize), String> {
        let size = feature.dtype.size();
        let within = |end: Option<usize>, what: &str| {
            end.filter(|&e| e <= bytes.len())
                .ok_or_else(|| format!("{what} runs past the end of the block"))
        };
        match feature.kind {
            Kind::Dense { .. } => {
                let per_record = feature.dense_bytes().unwrap_or(usize::MAX);
                let end = within(
                    records.checked_mul(per_record).and_then(|b| b.checked_add(start)),
                    "data",
                )?;
                Ok((ColumnView::Dense { start, end }, end))
            }
            Kind::Bytes | Kind::Image | Kind::Sparse { .. } => {
                let ends_end = within(
                    records
                        .checked_add(1)
                        .and_then(|n| n.checked_mul(8))
                        .and_then(|b| b.checked_add(start)),
                    "the offset table",
                )?;
                let ends: &[u8] = &bytes[start..ends_end];
                let mut previous = 0u64;
                for (row, chunk) in ends.chunks_exact(8).enumerate() {
                    let end = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
                    if (row == 0 && end != 0) || end < previous {
                        return Err(format!(
                            "offset {row} is {end}, after {previous}: offsets must start at 0 and not decrease"
                        ));
                    }
                    previous = end;
                }
                let count =
                    usize::try_from(previous).map_err(|_| "absurd element count".to_string())?;
                if feature.kind == Kind::Bytes {
                    let end = within(ends_end.checked_add(count), "the bytes")?;
                    return Ok((ColumnView::Bytes { ends: start, data: ends_end }, end));
                }
                if feature.kind == Kind::Image {
                    let end = within(ends_end.checked_add(count), "the images")?;
                    let offset = |row: usize| u64_at(ends, 8 * row).unwrap_or(0) as usize;
                    for row in 0..records {
                        let image = &bytes[ends_end + offset(row)..ends_end + offset(row + 1)];
                        ImageInfo::stored(image)
                            .map_err(|what| format!("record {row}: the image {what}"))?;
                    }
                    return Ok((ColumnView::Bytes { ends: start, data: ends_end }, end));
                }
                let values = within(
                    count.checked_mul(8).and_then(|b| b.checked_add(ends_end)),
                    "the positions",
                )?;
                let end = within(
                    count.checked_mul(size).and_then(|b| b.checked_add(values)),
                    "the values",
                )?;
                let elements = feature.elements().unwrap_or(usize::MAX) as u64;
                let positions: &[u8] = &bytes[ends_end..values];
                let row_ends: Vec<u64> = ends
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
                    .collect();
                for row in 0..records {
                    let (a, b) = (row_ends[row] as usize, row_ends[row + 1] as usize);
                    let mut last = None;
                    for k in a..b {
                        let p = u64::from_le_bytes(
                            positions[8 * k..8 * k + 8].try_into().unwrap_or_default(),
                        );
                        if p >= elements || last.is_some_and(|l| p <= l) {
                            return Err(format!(
                                "record {row}: position {p} is out of range or out of order"
                            ));
                        }
                        last = Some(p);
                    }
                }
                Ok((ColumnView::Sparse { ends: start, indices: ends_end, values }, end))
            }
        }
    }

    /// The block's uncompressed bytes, as stored in a shard before compression.
    pub(crate) fn raw(&self) -> &[u8] {
        &self.data[..self.bytes]
    }

    /// Records in the block.
    pub fn len(&self) -> usize {
        self.records
    }

    /// Whether the block holds no records.
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// The dataset index of the block's first record.
    pub fn first_record(&self) -> u64 {
        self.first_record
    }

    /// The dataset's schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    fn lookup(&self, name: &str) -> Result<(&Feature, ColumnView)> {
        let index = self.schema.index_of(name).ok_or_else(|| Error::Access {
            feature: name.to_string(),
            what: format!("no such feature (the schema is: {})", self.schema),
        })?;
        Ok((&self.schema.features()[index], self.columns[index]))
    }

    fn wrong(feature: &Feature, what: &str) -> Error {
        Error::Access { feature: feature.name.clone(), what: format!("{feature} {what}") }
    }

    fn typed<'a, T: Element>(&self, feature: &Feature, bytes: &'a [u8]) -> Result<&'a [T]> {
        if !T::matches(feature.dtype) {
            return Err(Self::wrong(
                feature,
                &format!("cannot be read as {}", std::any::type_name::<T>()),
            ));
        }
        bytemuck::try_cast_slice(bytes)
            .map_err(|e| Self::wrong(feature, &format!("is misaligned: {e}")))
    }

    fn end_at(&self, table: usize, row: usize) -> usize {
        u64_at(&self.data[..self.bytes], table + 8 * row).unwrap_or(0) as usize
    }

    /// The raw little-endian bytes of a dense feature for all records (`len() x` one record):
    /// what a batch copies.
    pub fn dense_bytes(&self, name: &str) -> Result<&[u8]> {
        let (feature, view) = self.lookup(name)?;
        match view {
            ColumnView::Dense { start, end } => Ok(&self.data[start..end]),
            _ => Err(Self::wrong(feature, "is not dense")),
        }
    }

    /// The raw bytes of dense feature number `feature` for all records; the pipeline resolves
    /// names once and uses this per record.
    pub(crate) fn dense_column(&self, feature: usize) -> &[u8] {
        match self.columns[feature] {
            ColumnView::Dense { start, end } => &self.data[start..end],
            _ => &[],
        }
    }

    /// Record `row`'s positions (u64, little-endian) and value bytes of sparse feature number
    /// `feature`; empty for another kind. The pipeline resolves names once and uses this per
    /// record.
    pub(crate) fn sparse_column_row(&self, feature: usize, row: usize) -> (&[u8], &[u8]) {
        match self.columns[feature] {
            ColumnView::Sparse { ends, indices, values } => {
                let (a, b) = (self.end_at(ends, row), self.end_at(ends, row + 1));
                let size = self.schema.features()[feature].dtype.size();
                (
                    &self.data[indices + 8 * a..indices + 8 * b],
                    &self.data[values + size * a..values + size * b],
                )
            }
            _ => (&[], &[]),
        }
    }

    /// A dense feature for all records, shaped `[len(), shape...]`.
    pub fn dense<T: Element>(&self, name: &str) -> Result<ArrayViewD<'_, T>> {
        let (feature, _) = self.lookup(name)?;
        let values = self.typed::<T>(feature, self.dense_bytes(name)?)?;
        let Kind::Dense { shape } = &feature.kind else {
            unreachable!("dense_bytes checked the kind")
        };
        let mut dims = vec![self.records];
        dims.extend_from_slice(shape);
        ArrayViewD::from_shape(IxDyn(&dims), values)
            .map_err(|e| Self::wrong(feature, &e.to_string()))
    }

    /// One record's value of a dense feature, shaped like the feature.
    pub fn dense_row<T: Element>(&self, name: &str, row: usize) -> Result<ArrayViewD<'_, T>> {
        self.check_row(row)?;
        let all = self.dense::<T>(name)?;
        Ok(all.index_axis_move(ndarray::Axis(0), row))
    }

    /// One record's value of a bytes feature.
    pub fn bytes(&self, name: &str, row: usize) -> Result<&[u8]> {
        self.check_row(row)?;
        let (feature, view) = self.lookup(name)?;
        match view {
            ColumnView::Bytes { ends, data } => {
                let (a, b) = (self.end_at(ends, row), self.end_at(ends, row + 1));
                Ok(&self.data[data + a..data + b])
            }
            _ => Err(Self::wrong(feature, "is not a bytes feature")),
        }
    }

    /// Where record `row` came from, when the dataset keeps it (a bytes feature
    /// [`SOURCE_FEATURE`](crate::SOURCE_FEATURE), as the image-folder importer writes): for
    /// an error about the record to name the file, not a record number after the import's
    /// shuffle. `None` otherwise.
    pub fn source(&self, row: usize) -> Option<String> {
        self.bytes(crate::schema::SOURCE_FEATURE, row)
            .ok()
            .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
    }

    /// One record's image: what its header records, and its encoded bytes as they were.
    pub fn image(&self, name: &str, row: usize) -> Result<(ImageInfo, &[u8])> {
        let (feature, _) = self.lookup(name)?;
        if feature.kind != Kind::Image {
            return Err(Self::wrong(feature, "is not an image feature"));
        }
        let stored = self.bytes(name, row)?;
        // Checked when the block was read.
        ImageInfo::stored(stored).map_err(|what| Self::wrong(feature, &what))
    }

    /// Record `row`'s value of bytes or image feature number `feature` (an image's stored
    /// form); empty for another kind. The pipeline resolves names once and uses this per
    /// record.
    pub(crate) fn bytes_column_row(&self, feature: usize, row: usize) -> &[u8] {
        match self.columns[feature] {
            ColumnView::Bytes { ends, data } => {
                let (a, b) = (self.end_at(ends, row), self.end_at(ends, row + 1));
                &self.data[data + a..data + b]
            }
            _ => &[],
        }
    }

    /// One record's value of a sparse feature: positions (row-major flat indices into the
    /// feature's shape) and values.
    pub fn sparse<T: Element>(&self, name: &str, row: usize) -> Result<(&[u64], &[T])> {
        self.check_row(row)?;
        let (feature, view) = self.lookup(name)?;
        let ColumnView::Sparse { .. } = view else {
            return Err(Self::wrong(feature, "is not sparse"));
        };
        let index = self.schema.index_of(name).unwrap_or_default();
        let (positions, values) = self.sparse_column_row(index, row);
        let positions = bytemuck::try_cast_slice(positions)
            .map_err(|e| Self::wrong(feature, &format!("is misaligned: {e}")))?;
        Ok((positions, self.typed::<T>(feature, values)?))
    }

    /// Appends record `row`'s raw bytes, feature after feature (dense elements; bytes; sparse
    /// positions then values): the record as a row-oriented format would store it.
    #[cfg(feature = "bench")]
    pub(crate) fn append_record_bytes(&self, row: usize, out: &mut Vec<u8>) {
        for (feature, view) in self.schema.features().iter().zip(&self.columns) {
            let size = feature.dtype.size();
            match *view {
                ColumnView::Dense { start, .. } => {
                    let per = feature.dense_bytes().unwrap_or(0);
                    out.extend_from_slice(&self.data[start + row * per..start + (row + 1) * per]);
                }
                ColumnView::Bytes { ends, data } => {
                    let (a, b) = (self.end_at(ends, row), self.end_at(ends, row + 1));
                    out.extend_from_slice(&self.data[data + a..data + b]);
                }
                ColumnView::Sparse { ends, indices, values } => {
                    let (a, b) = (self.end_at(ends, row), self.end_at(ends, row + 1));
                    out.extend_from_slice(&self.data[indices + 8 * a..indices + 8 * b]);
                    out.extend_from_slice(&self.data[values + size * a..values + size * b]);
                }
            }
        }
    }

    fn check_row(&self, row: usize) -> Result<()> {
        if row < self.records {
            Ok(())
        } else {
            Err(Error::RowOutOfRange { row, records: self.records })
        }
    }
}
