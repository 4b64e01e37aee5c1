//! MNIST-style IDX files: [`import_idx`].
//!
//! An IDX file is a magic number (two zero bytes, a type code, the number of dimensions),
//! the dimensions as big-endian `u32`s, then the elements, big-endian, in C order. The first
//! dimension is the records.

use std::path::Path;

use super::{RecordInput, Source, checked_bytes, record_buffer, show_dims, write_records};
use crate::{
    DType, DatasetWriter, Feature, MAX_FEATURE_BYTES, Manifest, Result, Schema, Value,
    WriterOptions,
};

/// The element types an IDX file can declare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IdxType {
    U8,
    I8,
    I16,
    I32,
    F32,
    F64,
}

impl IdxType {
    fn from_code(code: u8) -> Option<IdxType> {
        Some(match code {
            0x08 => IdxType::U8,
            0x09 => IdxType::I8,
            0x0B => IdxType::I16,
            0x0C => IdxType::I32,
            0x0D => IdxType::F32,
            0x0E => IdxType::F64,
            _ => return None,
        })
    }

    fn size(self) -> usize {
        match self {
            IdxType::U8 | IdxType::I8 => 1,
            IdxType::I16 => 2,
            IdxType::I32 | IdxType::F32 => 4,
            IdxType::F64 => 8,
        }
    }

    fn name(self) -> &'static str {
        match self {
            IdxType::U8 => "unsigned byte",
            IdxType::I8 => "signed byte",
            IdxType::I16 => "short",
            IdxType::I32 => "int",
            IdxType::F32 => "float",
            IdxType::F64 => "double",
        }
    }

    /// The dtype image-like features are stored as: the same type, little-endian, with the
    /// small signed integers widened to i32 (the narrowest signed type a schema has).
    fn dtype(self) -> DType {
        match self {
            IdxType::U8 => DType::U8,
            IdxType::I8 | IdxType::I16 | IdxType::I32 => DType::I32,
            IdxType::F32 => DType::F32,
            IdxType::F64 => DType::F64,
        }
    }

    fn is_integer(self) -> bool {
        !matches!(self, IdxType::F32 | IdxType::F64)
    }

    /// Converts big-endian elements of this type in `src` to little-endian elements of `to`
    /// (this type's [`dtype`](Self::dtype), or i64 for integers) appended to `dst`.
    fn convert(self, src: &[u8], to: DType, dst: &mut Vec<u8>) {
        dst.clear();
        if self == IdxType::U8 && to == DType::U8 {
            dst.extend_from_slice(src);
            return;
        }
        for element in src.chunks_exact(self.size()) {
            let integer = match self {
                IdxType::U8 => i64::from(element[0]),
                IdxType::I8 => i64::from(element[0] as i8),
                IdxType::I16 => i64::from(i16::from_be_bytes([element[0], element[1]])),
                IdxType::I32 => {
                    i64::from(i32::from_be_bytes(element.try_into().unwrap_or_default()))
                }
                IdxType::F32 | IdxType::F64 => 0,
            };
            match to {
                DType::I32 => dst.extend_from_slice(&(integer as i32).to_le_bytes()),
                DType::I64 => dst.extend_from_slice(&integer.to_le_bytes()),
                DType::F32 => {
                    let bits = u32::from_be_bytes(element.try_into().unwrap_or_default());
                    dst.extend_from_slice(&bits.to_le_bytes());
                }
                DType::F64 => {
                    let bits = u64::from_be_bytes(element.try_into().unwrap_or_default());
                    dst.extend_from_slice(&bits.to_le_bytes());
                }
                _ => dst.push(integer as u8),
            }
        }
    }
}

/// What an IDX header declares.
#[derive(Debug, Clone, PartialEq, Eq)]
struct IdxHeader {
    kind: IdxType,
    dims: Vec<u64>,
}

impl IdxHeader {
    /// Bytes of one record in the file (bounded by [`read_header`]).
    fn record_bytes(&self) -> usize {
        checked_bytes(&self.dims[1..], self.kind.size()).unwrap_or(0) as usize
    }
}

/// Reads and checks the header at the start of `source`, leaving it at the first element.
fn read_header(source: &mut Source) -> Result<IdxHeader> {
    let mut magic = [0u8; 4];
    source.read_exact(&mut magic, "the IDX magic number")?;
    if magic[..2] != [0, 0] {
        return Err(source.corrupt(
            0,
            format!(
                "expected an IDX magic number 00 00 <type> <dimensions>, found {:02x} {:02x} {:02x} \
                 {:02x}",
                magic[0], magic[1], magic[2], magic[3]
            ),
        ));
    }
    let kind = IdxType::from_code(magic[2]).ok_or_else(|| {
        source.corrupt(
            2,
            format!("expected an IDX type code 08, 09, 0b, 0c, 0d or 0e, found {:02x}", magic[2]),
        )
    })?;
    if magic[3] == 0 {
        return Err(source.corrupt(3, "expected at least one dimension (the records), found 0"));
    }
    let mut raw = vec![0u8; 4 * usize::from(magic[3])];
    source.read_exact(&mut raw, format_args!("the {} dimensions", magic[3]))?;
    let dims: Vec<u64> = raw
        .chunks_exact(4)
        .map(|d| u64::from(u32::from_be_bytes(d.try_into().unwrap_or_default())))
        .collect();
    let header = IdxHeader { kind, dims };
    let record = checked_bytes(&header.dims[1..], kind.size())
        .filter(|&b| b <= MAX_FEATURE_BYTES as u64)
        .ok_or_else(|| {
            source.corrupt(
                4,
                format!(
                    "dimensions {} of {} have records over {MAX_FEATURE_BYTES} bytes",
                    show_dims(&header.dims),
                    kind.name()
                ),
            )
        })?;
    let what = format!("the dimensions {} of {}", show_dims(&header.dims), kind.name());
    source.check_declared(record.checked_mul(header.dims[0]), 4, &what)?;
    Ok(header)
}

/// One IDX file being imported.
struct Input {
    source: Source,
    header: IdxHeader,
    dtype: DType,
    raw: Vec<u8>,
    converted: Vec<u8>,
}

impl RecordInput for Input {
    fn source(&mut self) -> &mut Source {
        &mut self.source
    }

    fn read_record(&mut self, record: u64) -> Result<()> {
        self.source.read_exact(&mut self.raw, format_args!("record {record}"))?;
        self.header.kind.convert(&self.raw, self.dtype, &mut self.converted);
        Ok(())
    }

    fn value(&self) -> Value<'_> {
        Value::Dense(&self.converted)
    }
}

impl Input {
    fn open(path: &Path) -> Result<Input> {
        let mut source = Source::open(path, None)?;
        let header = read_header(&mut source)?;
        let dtype = header.kind.dtype();
        Ok(Input { source, header, dtype, raw: Vec::new(), converted: Vec::new() })
    }
}

/// Imports MNIST-style IDX files as a dataset at `out`: `images` becomes the dense feature
/// `image` shaped like its dimensions after the first (`u8[28, 28]` for MNIST), and `labels`,
/// if given, the scalar feature `label: i64[]`.
///
/// Images may have any IDX type: unsigned bytes stay `u8`, signed bytes, shorts and ints
/// become `i32`, floats `f32` and doubles `f64`, all converted from big-endian. Labels must be
/// one-dimensional integers, and as many as the images. Either file may be gzip-compressed
/// (MNIST's `.gz` downloads import as they are).
///
/// ```no_run
/// use std::path::Path;
/// use dp_data::{WriterOptions, import_idx};
///
/// let manifest = import_idx(
///     Path::new("train-images-idx3-ubyte.gz"),
///     Some(Path::new("train-labels-idx1-ubyte.gz")),
///     Path::new("mnist-train"),
///     WriterOptions::default(),
/// )?;
/// # Ok::<(), dp_data::Error>(())
/// ```
pub fn import_idx(
    images: &Path,
    labels: Option<&Path>,
    out: &Path,
    options: WriterOptions,
) -> Result<Manifest> {
    let mut inputs = vec![Input::open(images)?];
    let records = inputs[0].header.dims[0];
    let shape: Vec<usize> = inputs[0].header.dims[1..].iter().map(|&d| d as usize).collect();
    let mut schema = vec![Feature::dense("image", inputs[0].dtype, &shape)];
    if let Some(labels) = labels {
        let mut input = Input::open(labels)?;
        let header = &input.header;
        if header.dims.len() != 1 || !header.kind.is_integer() {
            return Err(input.source.corrupt(
                2,
                format!(
                    "expected labels as one dimension of integers, found dimensions {} of {}",
                    show_dims(&header.dims),
                    header.kind.name()
                ),
            ));
        }
        if header.dims[0] != records {
            return Err(input.source.corrupt(
                4,
                format!(
                    "declares {} labels, but {} declares {records} images",
                    header.dims[0],
                    images.display()
                ),
            ));
        }
        input.dtype = DType::I64;
        schema.push(Feature::dense("label", DType::I64, &[]));
        inputs.push(input);
    }
    if records > 0 && inputs.iter().all(|i| i.header.record_bytes() == 0) {
        return Err(inputs[0].source.corrupt(
            4,
            format!("declares {records} records of zero bytes each: a dimension is 0"),
        ));
    }
    let schema = Schema::new(schema)?;
    if records > 0 {
        // One record each; the header check proved the files hold `records` of them.
        for input in &mut inputs {
            input.raw = record_buffer(input.header.record_bytes(), input.source.path())?;
        }
    }
    write_records(DatasetWriter::create(out, schema, options)?, &mut inputs, records)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::Error;

    fn idx(code: u8, dims: &[u32], data: &[u8]) -> Vec<u8> {
        let mut file = vec![0, 0, code, dims.len() as u8];
        for d in dims {
            file.extend_from_slice(&d.to_be_bytes());
        }
        file.extend_from_slice(data);
        file
    }

    fn parse(bytes: Vec<u8>) -> Result<IdxHeader> {
        read_header(&mut Source::from_bytes(bytes, false))
    }

    fn corrupt(result: Result<IdxHeader>) -> (u64, String) {
        match result {
            Err(Error::Corrupt { offset, what, .. }) => (offset, what),
            other => panic!("expected a Corrupt error, got {other:?}"),
        }
    }

    #[test]
    fn reads_headers() {
        let header = parse(idx(0x08, &[3, 2, 2], &[0; 12])).unwrap();
        assert_eq!((header.kind, header.dims.as_slice()), (IdxType::U8, &[3u64, 2, 2][..]));
        assert_eq!(header.record_bytes(), 4);
        let header = parse(idx(0x0E, &[2, 5], &[0; 80])).unwrap();
        assert_eq!((header.kind, header.record_bytes()), (IdxType::F64, 40));
        assert_eq!(parse(idx(0x08, &[0, 28, 28], &[])).unwrap().dims[0], 0);
    }

    #[test]
    fn rejects_bad_headers_with_offsets() {
        let cases: [(Vec<u8>, u64, &str); 9] = [
            (vec![0, 1, 8, 1, 0, 0, 0, 0], 0, "magic"),
            (vec![0, 0, 7, 1, 0, 0, 0, 0], 2, "type code"),
            (vec![0, 0, 8, 0], 3, "at least one dimension"),
            (vec![0, 0, 8], 3, "ends 3 bytes into"),
            (vec![0, 0, 8, 2, 0, 0, 0, 1], 8, "dimensions"),
            (idx(0x08, &[3, 2], &[0; 5]), 4, "6 bytes of data, but 5"),
            (idx(0x08, &[3, 2], &[0; 7]), 4, "6 bytes of data, but 7"),
            (idx(0x0E, &[u32::MAX, u32::MAX, u32::MAX], &[]), 4, "over"),
            (idx(0x0D, &[u32::MAX, 1 << 20], &[0; 8]), 4, "bytes of data, but 8 bytes follow"),
        ];
        for (file, offset, expect) in cases {
            let (at, what) = corrupt(parse(file.clone()));
            assert_eq!(at, offset, "{file:?}: {what}");
            assert!(what.contains(expect), "{file:?}: {what}");
        }
    }

    #[test]
    fn converts_every_type_from_big_endian() {
        let mut out = Vec::new();
        IdxType::U8.convert(&[1, 255], DType::U8, &mut out);
        assert_eq!(out, [1, 255]);
        IdxType::U8.convert(&[1, 255], DType::I64, &mut out);
        assert_eq!(out, bytemuck::cast_slice::<i64, u8>(&[1, 255]));
        IdxType::I8.convert(&[1, 255], DType::I32, &mut out);
        assert_eq!(out, bytemuck::cast_slice::<i32, u8>(&[1, -1]));
        IdxType::I16.convert(&(-300i16).to_be_bytes(), DType::I64, &mut out);
        assert_eq!(out, (-300i64).to_le_bytes());
        IdxType::I32.convert(&(-70000i32).to_be_bytes(), DType::I32, &mut out);
        assert_eq!(out, (-70000i32).to_le_bytes());
        IdxType::F32.convert(&1.5f32.to_be_bytes(), DType::F32, &mut out);
        assert_eq!(out, 1.5f32.to_le_bytes());
        IdxType::F64.convert(&(-2.25f64).to_be_bytes(), DType::F64, &mut out);
        assert_eq!(out, (-2.25f64).to_le_bytes());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn mutated_headers_never_panic(
            dims in proptest::collection::vec(0u32..4, 1..4),
            code in prop::sample::select(vec![0x08u8, 0x09, 0x0B, 0x0C, 0x0D, 0x0E]),
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
            cut in any::<Option<usize>>(),
        ) {
            let kind = IdxType::from_code(code).unwrap();
            let elements: u32 = dims.iter().product();
            let mut file = idx(code, &dims, &vec![3; elements as usize * kind.size()]);
            for (at, byte) in edits {
                let at = at % file.len();
                file[at] = byte;
            }
            if let Some(cut) = cut {
                file.truncate(cut % (file.len() + 1));
            }
            let len = file.len() as u64;
            match parse(file) {
                Ok(header) => {
                    let data = header.record_bytes() as u64 * header.dims[0];
                    prop_assert_eq!(4 + 4 * header.dims.len() as u64 + data, len);
                }
                Err(Error::Corrupt { offset, .. }) => prop_assert!(offset <= len),
                Err(other) => prop_assert!(false, "unexpected error {}", other),
            }
        }
    }
}
