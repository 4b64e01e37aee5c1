//! The container every checkpoint file shares: an 8-byte magic, a version, then one zstd frame
//! (with its content checksum) holding a length-prefixed postcard header and, after it, raw
//! little-endian values. Both ways stream through 64 KiB buffers straight from and into the
//! buffers that hold the values, so saving or loading never holds a model's values twice.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

use zstd::stream::zio::{Reader, Writer};

use super::zstd_stream::{Compress, Decompress};
use dp_mem::AtomicFile;

use crate::error::{Error, Result};

/// The format both checkpoint files are in. Version 5 added the optimizer state's bits (8-bit
/// state is stored as codes and scales); version 4 files, whose state is unquantised, are
/// still read.
const VERSION: u32 = 5;
const ZSTD_LEVEL: i32 = 3;
/// What a file holds of its bytes or their encoding at once while streaming.
const STREAM_BUFFER: usize = 64 << 10;
/// The largest header a reader takes: names, the layout and the caller's state, never values.
const MAX_HEADER: u64 = 64 << 20;

/// A file's header, decodable from this format version and from version 4.
pub(super) trait Header: Serialize + DeserializeOwned {
    /// Decodes a version 4 header (before the optimizer state's bits were recorded).
    fn decode_v4(bytes: &[u8]) -> postcard::Result<Self>;
}

/// Writes `header`, then whatever `body` writes, atomically to `path`; returns the file's bytes.
pub(super) fn write<H: Serialize>(
    path: &Path,
    magic: &[u8; 8],
    header: &H,
    body: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<u64> {
    write_version(path, magic, VERSION, header, body)
}

/// [`write`] in format `version` (tests write older files with it).
pub(super) fn write_version<H: Serialize>(
    path: &Path,
    magic: &[u8; 8],
    version: u32,
    header: &H,
    body: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<u64> {
    let header = postcard::to_allocvec(header).expect("checkpoint headers always serialize");
    write_atomic(path, |out| {
        out.write_all(magic)?;
        out.write_all(&version.to_le_bytes())?;
        let encoder = Writer::new(out, Compress::new(ZSTD_LEVEL)?);
        // The values arrive a tensor or a chunk at a time: batch them before zstd sees them.
        let mut frame = BufWriter::with_capacity(STREAM_BUFFER, encoder);
        frame.write_all(&(header.len() as u64).to_le_bytes())?;
        frame.write_all(&header)?;
        body(&mut frame)?;
        let mut encoder = frame.into_inner().map_err(|e| e.into_error())?;
        encoder.finish()?;
        Ok(())
    })
}

/// An open checkpoint file, positioned after its header.
pub(super) struct Frame {
    input: BufReader<Reader<BufReader<File>, Decompress>>,
    path: PathBuf,
}

impl Frame {
    /// Opens `path`, checks its magic (`what` names the kind of file in errors) and version,
    /// and reads its header.
    pub(super) fn open<H: Header>(path: &Path, magic: &[u8; 8], what: &str) -> Result<(H, Self)> {
        let file = File::open(path).map_err(|e| Error::io(path, "read", e))?;
        Self::reopen(file, path, magic, what)
    }

    /// [`Frame::open`] on `file` (`path` names it in errors), read from its start.
    pub(super) fn reopen<H: Header>(
        mut file: File,
        path: &Path,
        magic: &[u8; 8],
        what: &str,
    ) -> Result<(H, Self)> {
        use std::io::Seek;
        file.rewind().map_err(|e| Error::io(path, "read", e))?;
        let mut input = BufReader::with_capacity(STREAM_BUFFER, file);
        let fail = |what: String| Error::Checkpoint { path: path.to_path_buf(), what };
        let mut start = [0u8; 12];
        if input.read_exact(&mut start).is_err() || &start[..8] != magic {
            return Err(fail(format!("not a {what} (bad magic)")));
        }
        let version = u32::from_le_bytes(start[8..].try_into().expect("4 bytes"));
        if version != VERSION && version != 4 {
            return Err(fail(format!(
                "{what} format version {version}, this build reads 4 and {VERSION}"
            )));
        }
        let decoder =
            Reader::new(input, Decompress::new().map_err(|e| Error::io(path, "read", e))?);
        let mut frame =
            Frame { input: BufReader::with_capacity(STREAM_BUFFER, decoder), path: path.into() };
        let mut len = [0u8; 8];
        frame.read(&mut len)?;
        let len = u64::from_le_bytes(len);
        if len > MAX_HEADER {
            return Err(fail(format!("damaged (a header of {len} bytes)")));
        }
        let mut bytes = vec![0u8; len as usize];
        frame.read(&mut bytes)?;
        let header = match version {
            VERSION => postcard::from_bytes(&bytes),
            _ => H::decode_v4(&bytes),
        };
        let header = header.map_err(|e| fail(format!("damaged (header: {e})")))?;
        Ok((header, frame))
    }

    /// Fills `dst` with the next bytes.
    pub(super) fn read(&mut self, dst: &mut [u8]) -> Result<()> {
        self.input.read_exact(dst).map_err(|e| self.damaged(&e))
    }

    /// Passes over the next `bytes` bytes.
    pub(super) fn skip(&mut self, bytes: u64) -> Result<()> {
        let skipped = std::io::copy(&mut (&mut self.input).take(bytes), &mut std::io::sink())
            .map_err(|e| self.damaged(&e))?;
        if skipped < bytes {
            return Err(self.fail("damaged (truncated)".into()));
        }
        Ok(())
    }

    /// Checks that the frame ends here: reading to its end checks its checksum, and finds
    /// anything written after the data. Returns the file, to read again.
    pub(super) fn finish(mut self) -> Result<File> {
        let mut rest = [0u8; 1];
        match self.input.read(&mut rest) {
            Ok(0) => Ok(self.input.into_inner().into_inner().into_inner()),
            Ok(_) => Err(self.fail("damaged (bytes after the data)".into())),
            Err(e) => Err(self.damaged(&e)),
        }
    }

    pub(super) fn fail(&self, what: String) -> Error {
        Error::Checkpoint { path: self.path.clone(), what }
    }

    fn damaged(&self, e: &std::io::Error) -> Error {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            self.fail("damaged (truncated)".into())
        } else {
            self.fail(format!("damaged (zstd: {e})"))
        }
    }
}

/// Writes `path` whole or not at all, through dp-mem's [`AtomicFile`] (buffered by
/// [`STREAM_BUFFER`]), the one way the workspace writes files. Returns the file's bytes.
fn write_atomic(
    path: &Path,
    write: impl FnOnce(&mut AtomicFile) -> std::io::Result<()>,
) -> Result<u64> {
    let mut file = AtomicFile::with_capacity(path, STREAM_BUFFER)?;
    write(&mut file).map_err(|e| Error::io(file.temp_path(), "write", e))?;
    Ok(file.commit()?)
}
