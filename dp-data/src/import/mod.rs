//! Importers from the formats people already have: NumPy `.npy`, MNIST-style IDX, CSV,
//! TFRecord files of `tf.train.Example`, svmlight / libsvm text, and plain text as token
//! streams.
//!
//! Every importer streams its input through a [`DatasetWriter`](crate::DatasetWriter) and
//! returns the finished dataset's [`Manifest`](crate::Manifest). Headers are read and checked
//! (declared sizes against the file's length, dtypes, record counts) before the output
//! directory is created, and no buffer is sized by a length field before that length has been
//! checked against what the file can hold, so a malformed file gives an
//! [`Error::Corrupt`](crate::Error::Corrupt) naming the file, the byte offset and what was
//! expected, never a panic or an absurd allocation. If a file turns out to be malformed after
//! writing has started (a CSV row or a TFRecord record deep in the file), the error is returned
//! and nothing is left at the output path (see [`DatasetWriter`](crate::DatasetWriter)).
//! Errors quote at most 40 bytes of the input's text, with the full length of what they cut.
//!
//! Every input may also be gzip-compressed (MNIST's `.gz` files, `.csv.gz`, GZIP TFRecords):
//! a file that starts with the gzip magic is decompressed as it is read. Offsets in errors
//! about such a file count bytes of the decompressed stream, and the message says so. Since
//! deflate expands at most 1032-fold, a declared size above 1032 times the compressed file's
//! length is refused as a lie before anything is allocated for it.

mod csv;
mod idx;
#[cfg(feature = "images")]
mod image_folder;
mod npy;
mod svmlight;
#[cfg(feature = "text")]
mod text;
#[cfg(feature = "text")]
mod text_out;
mod tfrecord;

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek};
use std::path::{Path, PathBuf};

use flate2::bufread::MultiGzDecoder;

use crate::{DatasetWriter, Error, Manifest, Result, Value};

pub use self::csv::{CsvOptions, import_csv};
pub use self::idx::import_idx;
#[cfg(feature = "images")]
pub use self::image_folder::{ImageFolderOptions, ImageFolderReport, import_image_folder};
pub use self::npy::import_npy;
pub use self::svmlight::{SvmlightOptions, import_svmlight, import_svmlight_splits};
#[cfg(feature = "text")]
pub use self::text::{
    TextOptions, TextProgress, TextReport, TextStage, TextTokenizer, import_text,
    import_text_with_progress,
};
pub use self::tfrecord::{
    SparseFeature, TfRecordCompression, TfRecordOptions, VarLenFeature, import_tfrecord,
};

/// One input file of an importer that reads a record from each of its files in turn (the
/// `.npy` and IDX importers).
pub(crate) trait RecordInput {
    /// The file being read.
    fn source(&mut self) -> &mut Source;
    /// Reads record `record` (the next one) into the input's buffer.
    fn read_record(&mut self, record: u64) -> Result<()>;
    /// The record last read, as the writer takes it.
    fn value(&self) -> Value<'_>;
}

/// Writes `records` records, each made of one record of every input, then checks that every
/// input ends there, and finishes the dataset.
pub(crate) fn write_records(
    mut writer: DatasetWriter,
    inputs: &mut [impl RecordInput],
    records: u64,
) -> Result<Manifest> {
    for record in 0..records {
        for input in inputs.iter_mut() {
            input.read_record(record)?;
        }
        let values: Vec<Value<'_>> = inputs.iter().map(RecordInput::value).collect();
        writer.append(&values)?;
    }
    for input in inputs.iter_mut() {
        input.source().expect_end(&format!("{records} records"))?;
    }
    writer.finish()
}

/// A zeroed buffer for one record of `path`, or an out-of-memory error instead of an abort
/// when the machine (or an address-space limit) cannot hold it: a record may be as large as
/// the format allows.
pub(crate) fn record_buffer(bytes: usize, path: &Path) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    buf.try_reserve_exact(bytes).map_err(|_| no_memory(bytes, path))?;
    buf.resize(bytes, 0);
    Ok(buf)
}

fn no_memory(bytes: usize, path: &Path) -> Error {
    Error::Memory(dp_mem::Error::Backend {
        backend: "system",
        bytes,
        message: format!("no memory for a record of {}", path.display()).into(),
        tag: Some(dp_mem::Tag::Data),
    })
}

/// The most a deflate stream can expand: 258 bytes from about two bits.
const MAX_DEFLATE_RATIO: u64 = 1032;

/// The longest line a text format may have (64 MiB: a million numeric columns fit easily).
const MAX_LINE: u64 = 64 << 20;

/// The gzip magic bytes.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Whether a [`Source`] is decompressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compression {
    None,
    Gzip,
}

/// An input file read front to back, decompressed if it is gzip, counting the offset of the
/// next byte so that every error can name it.
pub(crate) struct Source {
    reader: BufReader<Box<dyn Read>>,
    path: PathBuf,
    compression: Compression,
    /// The file's length on disk.
    file_len: u64,
    /// The offset of the next unread byte (of the decompressed stream for gzip).
    offset: u64,
}

impl Source {
    /// Opens `path`, decompressing it if it starts with the gzip magic and `gzip` allows
    /// (`None`: detect, `Some(b)`: force).
    fn open(path: &Path, gzip: Option<bool>) -> Result<Source> {
        let mut file = File::open(path).map_err(|e| Error::io(path, "open", e))?;
        let file_len = file.metadata().map_err(|e| Error::io(path, "stat", e))?.len();
        let gzip = match gzip {
            Some(gzip) => gzip,
            None => {
                let mut magic = [0u8; 2];
                let mut got = 0;
                while got < 2 {
                    match file.read(&mut magic[got..]) {
                        Ok(0) => break,
                        Ok(n) => got += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(Error::io(path, "read", e)),
                    }
                }
                file.rewind().map_err(|e| Error::io(path, "seek", e))?;
                got == 2 && magic == GZIP_MAGIC
            }
        };
        // Buffers no larger than the file, so a tiny file costs a tiny buffer.
        let capacity = file_len.clamp(64, 1 << 16) as usize;
        let (inner, compression): (Box<dyn Read>, _) = if gzip {
            let decoder = MultiGzDecoder::new(BufReader::with_capacity(capacity, file));
            (Box::new(decoder), Compression::Gzip)
        } else {
            (Box::new(file), Compression::None)
        };
        let reader = BufReader::with_capacity(capacity, inner);
        Ok(Source { reader, path: path.to_path_buf(), compression, file_len, offset: 0 })
    }

    /// A source over bytes in memory, for the parsers' unit tests.
    #[cfg(test)]
    fn from_bytes(bytes: Vec<u8>, gzip: bool) -> Source {
        let file_len = bytes.len() as u64;
        let cursor = io::Cursor::new(bytes);
        let (inner, compression): (Box<dyn Read>, _) = if gzip {
            (Box::new(MultiGzDecoder::new(io::BufReader::new(cursor))), Compression::Gzip)
        } else {
            (Box::new(cursor), Compression::None)
        };
        let reader = BufReader::new(inner);
        Source { reader, path: PathBuf::from("t"), compression, file_len, offset: 0 }
    }

    fn path(&self) -> &Path {
        &self.path
    }

    /// The offset of the next unread byte.
    fn offset(&self) -> u64 {
        self.offset
    }

    /// A corrupt-input error at `offset` of this source.
    fn corrupt(&self, offset: u64, what: impl Into<String>) -> Error {
        let mut what = what.into();
        if self.compression == Compression::Gzip {
            what.push_str(" (the offset counts bytes of the gzip-decompressed stream)");
        }
        Error::corrupt(&self.path, offset, what)
    }

    /// Bytes left to read, if known exactly (an uncompressed file).
    fn remaining(&self) -> Option<u64> {
        match self.compression {
            Compression::None => Some(self.file_len.saturating_sub(self.offset)),
            Compression::Gzip => None,
        }
    }

    /// The most bytes that can be left to read: what follows in an uncompressed file, or what
    /// the compressed file can expand to.
    fn max_remaining(&self) -> u64 {
        match self.compression {
            Compression::None => self.file_len.saturating_sub(self.offset),
            Compression::Gzip => {
                self.file_len.saturating_mul(MAX_DEFLATE_RATIO).saturating_sub(self.offset)
            }
        }
    }

    /// Checks that `declared` more bytes (`None`: more than 2^64) can follow: exactly what is
    /// left of an uncompressed file, or at most what a compressed one can hold. `at` and `what`
    /// describe the field that declared them.
    fn check_declared(&self, declared: Option<u64>, at: u64, what: &str) -> Result<()> {
        let shown = declared.map_or("more than 2^64".to_string(), |d| d.to_string());
        match self.remaining() {
            Some(left) if declared != Some(left) => Err(self.corrupt(
                at,
                format!("{what} declares {shown} bytes of data, but {left} bytes follow"),
            )),
            None if declared.is_none_or(|d| d > self.max_remaining()) => Err(self.corrupt(
                at,
                format!(
                    "{what} declares {shown} bytes of data, more than the {}-byte compressed \
                     file can hold",
                    self.file_len
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Maps a read error: malformed compressed data is corrupt input, the rest is I/O.
    fn read_error(&self, e: io::Error, what: impl fmt::Display) -> Error {
        match e.kind() {
            io::ErrorKind::InvalidData
            | io::ErrorKind::InvalidInput
            | io::ErrorKind::UnexpectedEof => {
                self.corrupt(self.offset, format!("cannot read {what}: {e}"))
            }
            _ => Error::io(&self.path, "read", e),
        }
    }

    /// Reads into `buf` until it is full or the stream ends; returns the bytes read.
    fn fill(&mut self, buf: &mut [u8], what: impl fmt::Display) -> Result<usize> {
        let mut filled = 0;
        while filled < buf.len() {
            match self.reader.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => {
                    filled += n;
                    self.offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.read_error(e, what)),
            }
        }
        Ok(filled)
    }

    /// Fills `buf`. A stream that ends first is corrupt at the offset where `what` was
    /// expected.
    fn read_exact(&mut self, buf: &mut [u8], what: impl fmt::Display) -> Result<()> {
        let filled = self.fill(buf, &what)?;
        if filled < buf.len() {
            return Err(self.corrupt(
                self.offset,
                format!(
                    "the file ends {filled} bytes into {what} ({} bytes were expected)",
                    buf.len()
                ),
            ));
        }
        Ok(())
    }

    /// Replaces `buf` with the next `len` bytes, growing it only as the bytes arrive, so a
    /// length field that lies about a compressed stream costs no more memory than the stream
    /// really holds.
    fn read_into(&mut self, buf: &mut Vec<u8>, len: u64, what: impl fmt::Display) -> Result<()> {
        const CHUNK: u64 = 1 << 20;
        buf.clear();
        while (buf.len() as u64) < len {
            let old = buf.len();
            let step = (len - old as u64).min(CHUNK.max(old as u64)) as usize;
            if buf.try_reserve_exact(step).is_err() {
                return Err(no_memory(old + step, &self.path));
            }
            buf.resize(old + step, 0);
            let filled = self.fill(&mut buf[old..], &what)?;
            if filled < step {
                let got = old + filled;
                return Err(self.corrupt(
                    self.offset,
                    format!("the file ends {got} bytes into {what} ({len} bytes were expected)"),
                ));
            }
        }
        Ok(())
    }

    /// Whether the stream has no more bytes.
    fn at_end(&mut self) -> Result<bool> {
        loop {
            match self.reader.fill_buf() {
                Ok(bytes) => return Ok(bytes.is_empty()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.read_error(e, "the end of the file")),
            }
        }
    }

    /// Fails if anything follows what the header declared (only possible for compressed
    /// streams; for plain files the length was checked up front).
    fn expect_end(&mut self, what: &str) -> Result<()> {
        if self.at_end()? {
            Ok(())
        } else {
            Err(self.corrupt(self.offset, format!("expected the end of the file after {what}")))
        }
    }

    /// Reads up to and including the next `\n` into `line` (cleared first); returns the bytes
    /// read, 0 at the end. A line longer than [`MAX_LINE`] is an error, so a file without line
    /// ends is not read into memory whole.
    fn read_line(&mut self, line: &mut Vec<u8>) -> Result<usize> {
        line.clear();
        let start = self.offset;
        match (&mut self.reader).take(MAX_LINE + 1).read_until(b'\n', line) {
            Ok(n) => {
                self.offset += n as u64;
                if n as u64 > MAX_LINE {
                    return Err(self.corrupt(
                        start,
                        format!("expected a line end within {MAX_LINE} bytes of the line's start"),
                    ));
                }
                Ok(n)
            }
            Err(e) => Err(self.read_error(e, "a line")),
        }
    }
}

/// The most bytes of an input's text an error message quotes: a token, key or name longer
/// than that is cut, with an ellipsis and its full length, so that a malformed 11 MB token
/// does not become an 11 MB message.
const QUOTE_MAX: usize = 40;

/// The most names an error message lists (the columns of a table, the keys of a record).
const LIST_MAX: usize = 20;

/// Input bytes as an error message quotes them: escaped, in double quotes, and cut after
/// [`QUOTE_MAX`] bytes (`"12:0.512:0.5..." (11534336 bytes)`).
pub(crate) fn quote(text: &[u8]) -> String {
    if text.len() <= QUOTE_MAX {
        return format!("\"{}\"", text.escape_ascii());
    }
    format!("\"{}...\" ({} bytes)", text[..QUOTE_MAX].escape_ascii(), text.len())
}

/// A name from an input (a column, a key) as an error message shows it: in backticks, as
/// UTF-8 (invalid bytes replaced), cut after [`QUOTE_MAX`] bytes like [`quote`].
pub(crate) fn quote_name(name: &[u8]) -> String {
    let text = String::from_utf8_lossy(name);
    if text.len() <= QUOTE_MAX {
        return format!("`{text}`");
    }
    let mut cut = QUOTE_MAX;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("`{}...` ({} bytes)", &text[..cut], name.len())
}

/// Names from an input, each as [`quote_name`] shows it, comma-separated; after
/// [`LIST_MAX`] of them, how many more there are.
pub(crate) fn list_names<T: AsRef<[u8]>>(names: impl IntoIterator<Item = T>) -> String {
    let mut shown = Vec::new();
    let mut more = 0usize;
    for name in names {
        if shown.len() < LIST_MAX {
            shown.push(quote_name(name.as_ref()));
        } else {
            more += 1;
        }
    }
    let mut list = shown.join(", ");
    if more > 0 {
        list.push_str(&format!(" and {more} more"));
    }
    list
}

/// The product of `dims` times `size`, or `None` if it overflows `u64`.
fn checked_bytes(dims: &[u64], size: usize) -> Option<u64> {
    dims.iter().try_fold(size as u64, |acc, &d| acc.checked_mul(d))
}

/// Formats dims as `[a, b, c]` for messages.
fn show_dims(dims: &[u64]) -> String {
    let inner: Vec<String> = dims.iter().map(u64::to_string).collect();
    format!("[{}]", inner.join(", "))
}

#[cfg(test)]
mod tests {

    #[test]
    fn quoted_input_is_cut_to_a_readable_length_with_its_full_length() {
        assert_eq!(quote(b"1:x"), "\"1:x\"");
        assert_eq!(quote(b"a\tb"), "\"a\\tb\"");
        let long = "12:0.5".repeat(2_000_000);
        let shown = quote(long.as_bytes());
        assert_eq!(shown, format!("\"{}...\" (12000000 bytes)", &long[..40]));
        assert_eq!(quote(&long.as_bytes()[..40]), format!("\"{}\"", &long[..40]));
        assert_eq!(quote_name(b"image/encoded"), "`image/encoded`");
        // A cut never splits a character.
        let wide = "é".repeat(30);
        assert_eq!(quote_name(wide.as_bytes()), format!("`{}...` (60 bytes)", "é".repeat(20)));
        let keys: Vec<String> = (0..25).map(|i| format!("k{i}")).collect();
        let list = list_names(&keys);
        assert!(list.starts_with("`k0`, `k1`, ") && list.ends_with("`k19` and 5 more"), "{list}");
        assert_eq!(list_names(["a", "b"]), "`a`, `b`");
    }

    #[test]
    fn a_record_too_large_for_memory_is_an_error_naming_the_file() {
        let error = record_buffer(usize::MAX / 2, Path::new("huge.npy")).unwrap_err();
        let text = error.to_string();
        assert!(text.contains("for Data") && text.contains("huge.npy"), "{text}");
        assert_eq!(record_buffer(3, Path::new("x")).unwrap(), [0, 0, 0]);
    }

    use std::io::Write;

    use super::*;

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn reads_count_offsets_and_report_truncation() {
        for compressed in [false, true] {
            let data: Vec<u8> = (0..100u8).collect();
            let bytes = if compressed { gzip(&data) } else { data.clone() };
            let mut source = Source::from_bytes(bytes, compressed);
            let mut buf = [0u8; 30];
            source.read_exact(&mut buf, "a").unwrap();
            assert_eq!(&buf[..], &data[..30]);
            let mut grown = Vec::new();
            source.read_into(&mut grown, 60, "b").unwrap();
            assert_eq!(&grown[..], &data[30..90]);
            assert_eq!(source.offset(), 90);
            assert!(!source.at_end().unwrap());
            match source.read_into(&mut grown, 20, "c") {
                Err(Error::Corrupt { offset, what, .. }) => {
                    assert_eq!(offset, 100);
                    assert!(what.contains("10 bytes into c (20 bytes"), "{what}");
                    assert_eq!(what.contains("decompressed"), compressed, "{what}");
                }
                other => panic!("{other:?}"),
            }
            assert!(source.at_end().unwrap());
        }
    }

    #[test]
    fn declared_sizes_are_checked_against_the_file() {
        let source = Source::from_bytes(vec![0; 10], false);
        assert!(source.check_declared(Some(10), 0, "x").is_ok());
        assert!(source.check_declared(Some(9), 0, "x").is_err());
        assert!(source.check_declared(None, 0, "x").is_err());
        let source = Source::from_bytes(gzip(&[0; 10]), true);
        let len = source.file_len;
        assert!(source.check_declared(Some(5), 0, "x").is_ok());
        assert!(source.check_declared(Some(len * MAX_DEFLATE_RATIO), 0, "x").is_ok());
        assert!(source.check_declared(Some(len * MAX_DEFLATE_RATIO + 1), 0, "x").is_err());
    }

    #[test]
    fn lines_are_read_with_their_offsets_and_a_length_limit() {
        let mut source = Source::from_bytes(b"ab\r\ncd".to_vec(), false);
        let mut line = Vec::new();
        assert_eq!(source.read_line(&mut line).unwrap(), 4);
        assert_eq!(line, b"ab\r\n");
        assert_eq!(source.read_line(&mut line).unwrap(), 2);
        assert_eq!((line.as_slice(), source.offset()), (&b"cd"[..], 6));
        assert_eq!(source.read_line(&mut line).unwrap(), 0);
        let mut long = b"x\n".to_vec();
        long.resize(long.len() + MAX_LINE as usize + 1, b'y');
        let mut source = Source::from_bytes(long, false);
        source.read_line(&mut line).unwrap();
        match source.read_line(&mut line) {
            Err(Error::Corrupt { offset: 2, what, .. }) => {
                assert!(what.contains("line end"), "{what}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn corrupt_gzip_is_a_corrupt_error() {
        let mut bytes = gzip(&[7; 1000]);
        let n = bytes.len();
        bytes[n / 2] ^= 0xff;
        bytes[n - 6] ^= 0xff; // the CRC, in case the flipped byte still decodes
        let mut source = Source::from_bytes(bytes, true);
        let mut buf = vec![0; 1000];
        let result = source.read_exact(&mut buf, "everything");
        assert!(matches!(result, Err(Error::Corrupt { .. })), "{result:?}");
    }
}
