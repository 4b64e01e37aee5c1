//! NumPy `.npy` files: the header parser (format versions 1.0, 2.0 and 3.0) and
//! [`import_npy`]; the header writer the exporters share is `npy_format.rs`.
//!
//! A `.npy` file is the magic `\x93NUMPY`, a major and minor version byte, the header length
//! (`u16` little-endian for version 1, `u32` for versions 2 and 3), a Python dict literal such
//! as `{'descr': '<f4', 'fortran_order': False, 'shape': (5, 3), }` padded with spaces and a
//! newline, then the array's elements in C order. The dict is parsed by a small hand-written
//! parser: strings, `True`/`False` and tuples of integers, nothing is evaluated.

use std::path::{Path, PathBuf};

use super::{
    RecordInput, Source, checked_bytes, quote_name, record_buffer, show_dims, write_records,
};
use crate::npy_format::MAGIC;
#[cfg(test)]
use crate::npy_format::{npy_descr, npy_header};
use crate::{
    DType, DatasetWriter, Error, Feature, MAX_FEATURE_BYTES, Manifest, Result, Schema, Value,
    WriterOptions,
};

/// The largest header this parser reads. NumPy itself refuses headers over 10 000 bytes unless
/// told otherwise; a megabyte leaves room for any real shape while keeping the allocation small.
const MAX_HEADER: u64 = 1 << 20;

/// What a `.npy` header declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NpyHeader {
    /// The element type the `descr` maps to.
    pub(crate) dtype: DType,
    /// The array's shape; the first axis is the records.
    pub(crate) shape: Vec<u64>,
    /// Where the header dict starts (for errors about it).
    pub(crate) dict_offset: u64,
    /// Where the elements start.
    pub(crate) data_offset: u64,
}

impl NpyHeader {
    /// Bytes of one record (the product of the shape after the first axis, times the element
    /// size), or `None` if it overflows.
    fn record_bytes(&self) -> Option<u64> {
        checked_bytes(&self.shape[1..], self.dtype.size())
    }
}

/// The dtype a `descr` maps to, or a message saying why it is not supported.
fn parse_descr(descr: &str) -> std::result::Result<DType, String> {
    let supported = "supported: |u1, <i4, <i8, <f2, <f4, <f8 (little-endian, or `=` native)";
    let (order, code) = match descr.as_bytes().first() {
        Some(b'<' | b'>' | b'|' | b'=') => (descr.as_bytes()[0], &descr[1..]),
        _ => (b'=', descr),
    };
    let dtype = match code {
        "u1" | "B" => DType::U8,
        "i4" => DType::I32,
        "i8" => DType::I64,
        "f2" | "e" => DType::F16,
        "f4" | "f" => DType::F32,
        "f8" | "d" => DType::F64,
        _ => {
            return Err(format!(
                "dtype {} is not supported ({supported})",
                quote_name(descr.as_bytes())
            ));
        }
    };
    if dtype.size() > 1 && order == b'>' {
        return Err(format!("dtype `{descr}` is big-endian ({supported})"));
    }
    if dtype.size() > 1 && order == b'|' {
        return Err(format!("dtype `{descr}` has no byte order ({supported})"));
    }
    Ok(dtype)
}

/// Reads and checks a header from the start of `source`, leaving it at the first element.
/// Checks that the elements the header declares fill the rest of the file exactly (or, for a
/// compressed file, could fit in it).
pub(crate) fn read_header(source: &mut Source) -> Result<NpyHeader> {
    let mut prefix = [0u8; 10];
    source.read_exact(&mut prefix, "the .npy magic, version and header length")?;
    if &prefix[..6] != MAGIC {
        return Err(source.corrupt(
            0,
            format!("expected the .npy magic \\x93NUMPY, found \"{}\"", prefix[..6].escape_ascii()),
        ));
    }
    let (major, minor) = (prefix[6], prefix[7]);
    let (header_len, dict_offset) = match (major, minor) {
        (1, 0) => (u64::from(u16::from_le_bytes([prefix[8], prefix[9]])), 10u64),
        (2 | 3, 0) => {
            let mut rest = [0u8; 2];
            source.read_exact(&mut rest, "the header length")?;
            (u64::from(u32::from_le_bytes([prefix[8], prefix[9], rest[0], rest[1]])), 12)
        }
        _ => {
            return Err(source.corrupt(
                6,
                format!("expected .npy format version 1.0, 2.0 or 3.0, found {major}.{minor}"),
            ));
        }
    };
    if header_len > MAX_HEADER {
        return Err(source.corrupt(
            8,
            format!("header length {header_len} is absurd (at most {MAX_HEADER} bytes accepted)"),
        ));
    }
    if header_len > source.max_remaining() {
        return Err(
            source.corrupt(8, format!("header length {header_len} runs past the end of the file"))
        );
    }
    let mut text = vec![0u8; header_len as usize];
    source.read_exact(&mut text, "the header")?;
    let dict = parse_dict(&text).map_err(|(pos, what)| {
        source.corrupt(dict_offset + pos as u64, format!("header: {what}"))
    })?;
    let dtype = parse_descr(&dict.descr)
        .map_err(|what| source.corrupt(dict_offset, format!("header: {what}")))?;
    if dict.fortran_order {
        return Err(source.corrupt(
            dict_offset,
            "header: fortran_order is True; expected a C-order array (save \
             numpy.ascontiguousarray(a) instead)",
        ));
    }
    if dict.shape.is_empty() {
        return Err(source.corrupt(
            dict_offset,
            "header: shape is () but the first axis must be the records (expected at least one \
             dimension)",
        ));
    }
    let header =
        NpyHeader { dtype, shape: dict.shape, dict_offset, data_offset: dict_offset + header_len };
    let record = header.record_bytes().filter(|&b| b <= MAX_FEATURE_BYTES as u64);
    let Some(record) = record else {
        return Err(source.corrupt(
            dict_offset,
            format!(
                "header: shape {} of {} has records over {MAX_FEATURE_BYTES} bytes",
                show_dims(&header.shape),
                dtype
            ),
        ));
    };
    let what = format!("header: shape {} of {}", show_dims(&header.shape), dtype);
    source.check_declared(record.checked_mul(header.shape[0]), header.data_offset, &what)?;
    Ok(header)
}

/// The three keys of a header dict.
struct Dict {
    descr: String,
    fortran_order: bool,
    shape: Vec<u64>,
}

/// A value in a header dict.
enum Literal {
    Str(String),
    Bool(bool),
    Tuple(Vec<u64>),
}

/// A cursor over the header text; errors carry the position.
struct Cursor<'a> {
    text: &'a [u8],
    pos: usize,
}

type Parse<T> = std::result::Result<T, (usize, String)>;

impl Cursor<'_> {
    fn skip_space(&mut self) {
        while self.text.get(self.pos).is_some_and(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn fail<T>(&self, what: impl Into<String>) -> Parse<T> {
        let found = match self.text.get(self.pos) {
            Some(c) => format!("`{}`", [*c].escape_ascii()),
            None => "the end of the header".to_string(),
        };
        Err((self.pos, format!("expected {}, found {found}", what.into())))
    }

    fn eat(&mut self, c: u8) -> bool {
        self.skip_space();
        if self.text.get(self.pos) == Some(&c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: u8) -> Parse<()> {
        if self.eat(c) { Ok(()) } else { self.fail(format!("`{}`", c as char)) }
    }

    fn string(&mut self) -> Parse<String> {
        self.skip_space();
        let quote = match self.text.get(self.pos) {
            Some(&q @ (b'\'' | b'"')) => q,
            _ => return self.fail("a quoted string"),
        };
        self.pos += 1;
        let mut out = Vec::new();
        loop {
            match self.text.get(self.pos) {
                None => return self.fail("the closing quote"),
                Some(&c) if c == quote => {
                    self.pos += 1;
                    return Ok(String::from_utf8_lossy(&out).into_owned());
                }
                Some(b'\\') => {
                    let Some(&next) = self.text.get(self.pos + 1) else {
                        self.pos += 1;
                        return self.fail("a character after `\\`");
                    };
                    out.push(next);
                    self.pos += 2;
                }
                Some(&c) => {
                    out.push(c);
                    self.pos += 1;
                }
            }
        }
    }

    fn integer(&mut self) -> Parse<u64> {
        self.skip_space();
        let start = self.pos;
        let mut value: u64 = 0;
        while let Some(&c @ b'0'..=b'9') = self.text.get(self.pos) {
            value = match value.checked_mul(10).and_then(|v| v.checked_add(u64::from(c - b'0'))) {
                Some(v) => v,
                None => {
                    self.pos = start;
                    return self.fail("a dimension below 2^64");
                }
            };
            self.pos += 1;
        }
        if self.pos == start {
            return self.fail("a non-negative integer dimension");
        }
        // Python 2 wrote longs as `3L`.
        if self.text.get(self.pos) == Some(&b'L') {
            self.pos += 1;
        }
        Ok(value)
    }

    fn literal(&mut self) -> Parse<Literal> {
        self.skip_space();
        let rest = &self.text[self.pos.min(self.text.len())..];
        if rest.starts_with(b"True") {
            self.pos += 4;
            return Ok(Literal::Bool(true));
        }
        if rest.starts_with(b"False") {
            self.pos += 5;
            return Ok(Literal::Bool(false));
        }
        match rest.first() {
            Some(b'\'' | b'"') => self.string().map(Literal::Str),
            Some(b'(') => {
                self.pos += 1;
                let mut dims = Vec::new();
                loop {
                    if self.eat(b')') {
                        return Ok(Literal::Tuple(dims));
                    }
                    if dims.len() >= 64 {
                        return self.fail("at most 64 dimensions");
                    }
                    dims.push(self.integer()?);
                    if !self.eat(b',') {
                        self.expect(b')')?;
                        return Ok(Literal::Tuple(dims));
                    }
                }
            }
            Some(b'[') => self.fail("a simple dtype string (structured dtypes are not supported)"),
            _ => self.fail("a string, True, False or a tuple"),
        }
    }
}

/// Parses the header dict (with its padding) into its three required keys.
fn parse_dict(text: &[u8]) -> Parse<Dict> {
    let mut cursor = Cursor { text, pos: 0 };
    cursor.expect(b'{')?;
    let (mut descr, mut fortran_order, mut shape) = (None, None, None);
    loop {
        if cursor.eat(b'}') {
            break;
        }
        let key_at = {
            cursor.skip_space();
            cursor.pos
        };
        let key = cursor.string()?;
        if !matches!(key.as_str(), "descr" | "fortran_order" | "shape") {
            return Err((
                key_at,
                format!(
                    "unexpected key {} (expected descr, fortran_order and shape)",
                    quote_name(key.as_bytes())
                ),
            ));
        }
        cursor.expect(b':')?;
        let value_at = {
            cursor.skip_space();
            cursor.pos
        };
        let value = cursor.literal()?;
        let slot_taken = match key.as_str() {
            "descr" => descr.is_some(),
            "fortran_order" => fortran_order.is_some(),
            _ => shape.is_some(),
        };
        if slot_taken {
            return Err((key_at, format!("key {} appears twice", quote_name(key.as_bytes()))));
        }
        match (key.as_str(), value) {
            ("descr", Literal::Str(s)) => descr = Some(s),
            ("fortran_order", Literal::Bool(b)) => fortran_order = Some(b),
            ("shape", Literal::Tuple(t)) => shape = Some(t),
            ("descr", _) => return Err((value_at, "expected a dtype string for `descr`".into())),
            ("fortran_order", _) => {
                return Err((value_at, "expected True or False for `fortran_order`".into()));
            }
            _ => return Err((value_at, "expected a tuple of dimensions for `shape`".into())),
        }
        if !cursor.eat(b',') {
            cursor.expect(b'}')?;
            break;
        }
    }
    cursor.skip_space();
    if cursor.pos != text.len() {
        return cursor.fail("only padding after the header dict");
    }
    match (descr, fortran_order, shape) {
        (Some(descr), Some(fortran_order), Some(shape)) => Ok(Dict { descr, fortran_order, shape }),
        _ => Err((0, "expected the keys descr, fortran_order and shape".to_string())),
    }
}

/// One input array being imported.
struct Input {
    source: Source,
    /// Bytes of one record in the file.
    record_bytes: usize,
    /// Whether f64 elements are narrowed to f32.
    narrow: bool,
    buf: Vec<u8>,
    narrowed: Vec<u8>,
}

impl RecordInput for Input {
    fn source(&mut self) -> &mut Source {
        &mut self.source
    }

    fn read_record(&mut self, record: u64) -> Result<()> {
        self.source.read_exact(&mut self.buf, format_args!("record {record}"))?;
        if self.narrow {
            self.narrowed.clear();
            for chunk in self.buf.chunks_exact(8) {
                let value = f64::from_le_bytes(chunk.try_into().unwrap_or_default());
                self.narrowed.extend_from_slice(&(value as f32).to_le_bytes());
            }
        }
        Ok(())
    }

    fn value(&self) -> Value<'_> {
        Value::Dense(if self.narrow { &self.narrowed } else { &self.buf })
    }
}

/// Imports `.npy` arrays as a dataset at `out`: one dense feature per `(name, path)`, in that
/// order, whose per-record shape is the array's shape after the first axis. Every array must
/// have the same first dimension (the record count).
///
/// Supported dtypes: `|u1` (u8), `<i4` (i32), `<i8` (i64), `<f2` (f16), `<f4` (f32) and `<f8`
/// (f64, kept as f64 unless `narrow_f64` converts it to f32 with round-to-nearest). Arrays must
/// be in C order. Format versions 1.0, 2.0 and 3.0 are read. The files are streamed a record at a
/// time; every header is checked (declared size against the file's length) before the output is
/// created.
///
/// ```no_run
/// use std::path::{Path, PathBuf};
/// use dp_data::{WriterOptions, import_npy};
///
/// let features = [
///     ("image".to_string(), PathBuf::from("x_train.npy")),
///     ("label".to_string(), PathBuf::from("y_train.npy")),
/// ];
/// let manifest = import_npy(&features, Path::new("mnist"), true, WriterOptions::default())?;
/// # Ok::<(), dp_data::Error>(())
/// ```
pub fn import_npy(
    features: &[(String, PathBuf)],
    out: &Path,
    narrow_f64: bool,
    options: WriterOptions,
) -> Result<Manifest> {
    if features.is_empty() {
        return Err(Error::Config {
            field: "features",
            what: "at least one (name, .npy file) pair is needed".into(),
        });
    }
    let mut inputs = Vec::with_capacity(features.len());
    let mut schema = Vec::with_capacity(features.len());
    let mut records: Option<(u64, &Path)> = None;
    for (name, path) in features {
        let mut source = Source::open(path, None)?;
        let header = read_header(&mut source)?;
        let count = header.shape[0];
        match records {
            None => records = Some((count, path)),
            Some((expected, first)) if expected != count => {
                return Err(Error::corrupt(
                    path,
                    header.dict_offset,
                    format!(
                        "has {count} records along its first axis, but {} has {expected}",
                        first.display()
                    ),
                ));
            }
            Some(_) => {}
        }
        let narrow = narrow_f64 && header.dtype == DType::F64;
        let dtype = if narrow { DType::F32 } else { header.dtype };
        // `read_header` bounded the record size by MAX_FEATURE_BYTES, so these fit.
        let record_bytes = header.record_bytes().unwrap_or(0) as usize;
        let shape: Vec<usize> = header.shape[1..].iter().map(|&d| d as usize).collect();
        schema.push(Feature::dense(name.clone(), dtype, &shape));
        inputs.push(Input { source, record_bytes, narrow, buf: Vec::new(), narrowed: Vec::new() });
    }
    let records = records.map_or(0, |(n, _)| n);
    if records > 0 && inputs.iter().all(|i| i.record_bytes == 0) {
        return Err(Error::corrupt(
            inputs[0].source.path(),
            0,
            format!("{records} records of zero bytes each: every array has an empty dimension"),
        ));
    }
    let schema = Schema::new(schema)?;
    if records > 0 {
        // Each buffer is one record, and the header check proved the file holds `records` of
        // them, so these allocations are bounded by the files' sizes.
        for input in &mut inputs {
            input.buf = record_buffer(input.record_bytes, input.source.path())?;
        }
    }
    write_records(DatasetWriter::create(out, schema, options)?, &mut inputs, records)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    // Headers written by numpy 2.4.6 `np.save` (and `write_array` with an explicit version).
    const NUMPY_F4_5X3: &[u8] = b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (5, 3), }                                                          \n";
    const NUMPY_U1_0: &[u8] = b"\x93NUMPY\x01\x00v\x00{'descr': '|u1', 'fortran_order': False, 'shape': (0,), }                                                            \n";
    const NUMPY_I8_7: &[u8] = b"\x93NUMPY\x01\x00v\x00{'descr': '<i8', 'fortran_order': False, 'shape': (7,), }                                                            \n";

    fn parse(bytes: &[u8]) -> Result<NpyHeader> {
        read_header(&mut Source::from_bytes(bytes.to_vec(), false))
    }

    fn corrupt_at(result: Result<NpyHeader>) -> (u64, String) {
        match result {
            Err(Error::Corrupt { path, offset, what }) => {
                assert_eq!(path, Path::new("t"));
                (offset, what)
            }
            other => panic!("expected a Corrupt error, got {other:?}"),
        }
    }

    #[test]
    fn writes_the_headers_numpy_writes() {
        assert_eq!(npy_header("<f4", &[5, 3]), NUMPY_F4_5X3);
        assert_eq!(npy_header("|u1", &[0]), NUMPY_U1_0);
        assert_eq!(npy_header("<i8", &[7]), NUMPY_I8_7);
        for shape in [&[1u64][..], &[12345678901234, 2, 3], &[3; 40]] {
            let header = npy_header("<f8", shape);
            assert_eq!(header.len() % 64, 0);
            assert_eq!(header.last(), Some(&b'\n'));
        }
    }

    #[test]
    fn reads_what_it_writes_and_what_numpy_writes() {
        let mut file = NUMPY_F4_5X3.to_vec();
        file.resize(file.len() + 60, 0);
        let header = parse(&file).unwrap();
        assert_eq!((header.dtype, header.shape.as_slice()), (DType::F32, &[5u64, 3][..]));
        assert_eq!(header.data_offset, 128);
        for dtype in [DType::U8, DType::I32, DType::I64, DType::F16, DType::F32, DType::F64] {
            let mut file = npy_header(npy_descr(dtype).unwrap(), &[2, 3, 4]);
            file.resize(file.len() + 24 * dtype.size(), 7);
            let header = parse(&file).unwrap();
            assert_eq!((header.dtype, header.shape), (dtype, vec![2, 3, 4]));
        }
    }

    #[test]
    fn reads_versions_2_and_3_and_hand_written_dicts() {
        let dicts: [&[u8]; 4] = [
            b"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }         \n",
            b"{\"shape\":(2,3),\"descr\":\"<f4\",\"fortran_order\":False}",
            b"  { 'fortran_order' : False , 'shape' : ( 2L , 3L , ) , 'descr' : 'f' }\n\n",
            b"{'descr': '=f4', 'fortran_order': False, 'shape': (2, 3)}",
        ];
        for dict in dicts {
            for major in [1u8, 2, 3] {
                let mut file = b"\x93NUMPY".to_vec();
                file.extend_from_slice(&[major, 0]);
                if major == 1 {
                    file.extend_from_slice(&(dict.len() as u16).to_le_bytes());
                } else {
                    file.extend_from_slice(&(dict.len() as u32).to_le_bytes());
                }
                file.extend_from_slice(dict);
                let data_offset = file.len() as u64;
                file.resize(file.len() + 24, 0);
                let header =
                    parse(&file).unwrap_or_else(|e| panic!("{e}: {:?}", dict.escape_ascii()));
                assert_eq!(header.shape, vec![2, 3]);
                assert_eq!(header.dtype, DType::F32);
                assert_eq!(header.data_offset, data_offset);
            }
        }
    }

    fn with_dict(dict: &str, data: usize) -> Vec<u8> {
        let mut file = b"\x93NUMPY\x01\x00".to_vec();
        file.extend_from_slice(&(dict.len() as u16).to_le_bytes());
        file.extend_from_slice(dict.as_bytes());
        file.resize(file.len() + data, 0);
        file
    }

    #[test]
    fn rejects_malformed_headers_with_offsets() {
        let (offset, what) = corrupt_at(parse(b"\x93NUMPX\x01\x00\x10\x00"));
        assert_eq!(offset, 0);
        assert!(what.contains("magic"), "{what}");
        let (offset, what) = corrupt_at(parse(b"\x93NUMPY\x04\x00\x10\x00"));
        assert_eq!(offset, 6);
        assert!(what.contains("4.0"), "{what}");
        let (offset, what) = corrupt_at(parse(b"\x93NUMPY\x01\x00\xff\x00{}"));
        assert_eq!(offset, 8);
        assert!(what.contains("past the end"), "{what}");
        let (offset, _) = corrupt_at(parse(b"\x93NUMPY"));
        assert_eq!(offset, 6);
        let bad = [
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}",
                58,
                "unexpected key",
            ),
            ("{'descr': '<f4', 'fortran_order': False}", 0, "shape"),
            ("{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3)}", 34, "True, False"),
            ("{'descr': '<f4', 'fortran_order': 'no', 'shape': (2, 3)}", 34, "True or False"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3)}", 54, "integer"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)} x", 58, "padding"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)", 56, "`}`"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3", 55, "`)`"),
            ("{'descr': '<f4, 'fortran_order': False, 'shape': (2, 3)}", 17, "`}`"),
            ("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}", 10, "structured"),
            (
                "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}",
                17,
                "twice",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}",
                51,
                "2^64",
            ),
        ];
        for (dict, pos, expect) in bad {
            let (offset, what) = corrupt_at(parse(&with_dict(dict, 24)));
            assert_eq!(offset, 10 + pos, "{dict}: {what}");
            assert!(what.contains(expect), "{dict}: {what}");
        }
    }

    #[test]
    fn rejects_unsupported_dtypes_orders_and_shapes() {
        let cases = [
            ("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3)}", 24, "big-endian"),
            ("{'descr': '|f4', 'fortran_order': False, 'shape': (2, 3)}", 24, "byte order"),
            ("{'descr': '<i2', 'fortran_order': False, 'shape': (2, 3)}", 12, "not supported"),
            ("{'descr': '|b1', 'fortran_order': False, 'shape': (2, 3)}", 6, "not supported"),
            ("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3)}", 24, "C-order"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': ()}", 4, "first axis"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", 23, "but 23 bytes"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", 25, "but 25 bytes"),
            (
                "{'descr': '|u1', 'fortran_order': False, 'shape': (4611686018427387904, 1048576)}",
                8,
                "more than 2^64",
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 4294967296, 4294967296)}",
                8,
                "over",
            ),
            ("{'descr': '<u1', 'fortran_order': False, 'shape': (0, 2147483648)}", 0, "over"),
        ];
        for (dict, data, expect) in cases {
            let (_, what) = corrupt_at(parse(&with_dict(dict, data)));
            assert!(what.contains(expect), "{dict}: {what}");
        }
        // Single-byte dtypes take any byte-order character.
        for descr in ["<u1", ">u1", "|u1", "=u1", "u1", "B"] {
            let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': (2, 3)}}");
            assert_eq!(parse(&with_dict(&dict, 6)).unwrap().dtype, DType::U8, "{descr}");
        }
    }

    #[test]
    fn absurd_header_lengths_are_refused_before_allocating() {
        let mut file = b"\x93NUMPY\x02\x00".to_vec();
        file.extend_from_slice(&u32::MAX.to_le_bytes());
        file.resize(1 << 16, 0);
        let (offset, what) = corrupt_at(parse(&file));
        assert_eq!(offset, 8);
        assert!(what.contains("absurd"), "{what}");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn mutated_headers_never_panic(
            dims in proptest::collection::vec(0u64..5, 1..4),
            dtype in 0usize..6,
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6),
            cut in any::<Option<usize>>(),
        ) {
            let dtype = [DType::U8, DType::I32, DType::I64, DType::F16, DType::F32, DType::F64][dtype];
            let mut file = npy_header(npy_descr(dtype).unwrap(), &dims);
            let data = checked_bytes(&dims, dtype.size()).unwrap() as usize;
            file.resize(file.len() + data, 1);
            for (at, byte) in edits {
                let at = at % file.len();
                file[at] = byte;
            }
            if let Some(cut) = cut {
                file.truncate(cut % (file.len() + 1));
            }
            match parse(&file) {
                Ok(header) => {
                    let record = header.record_bytes().unwrap();
                    prop_assert_eq!(header.data_offset + record * header.shape[0], file.len() as u64);
                }
                Err(Error::Corrupt { offset, .. }) => prop_assert!(offset <= file.len() as u64),
                Err(other) => prop_assert!(false, "unexpected error {}", other),
            }
        }
    }
}
