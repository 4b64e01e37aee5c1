//! zstd stream operations over contexts made fallibly and owned by the stream. The zstd
//! crate's own stream constructors panic when zstd cannot allocate a context ("zstd returned
//! null pointer"); a checkpoint then fails like any other allocation that fails.

use std::io;

use zstd::stream::raw::{InBuffer, Operation, OutBuffer, WriteBuf};
use zstd::zstd_safe::{self, CCtx, CParameter, DCtx, ResetDirective};

fn out_of_memory(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::OutOfMemory, format!("zstd cannot allocate a {what} context"))
}

fn zstd_error(code: zstd_safe::ErrorCode) -> io::Error {
    io::Error::other(zstd_safe::get_error_name(code))
}

/// Compression into one checksummed frame at one level.
pub(super) struct Compress(CCtx<'static>);

impl Compress {
    pub(super) fn new(level: i32) -> io::Result<Self> {
        let mut context = CCtx::try_create().ok_or_else(|| out_of_memory("compression"))?;
        context.set_parameter(CParameter::CompressionLevel(level)).map_err(zstd_error)?;
        context.set_parameter(CParameter::ChecksumFlag(true)).map_err(zstd_error)?;
        Ok(Self(context))
    }
}

impl Operation for Compress {
    fn run<C: WriteBuf + ?Sized>(
        &mut self,
        input: &mut InBuffer<'_>,
        output: &mut OutBuffer<'_, C>,
    ) -> io::Result<usize> {
        self.0.compress_stream(output, input).map_err(zstd_error)
    }

    fn flush<C: WriteBuf + ?Sized>(&mut self, output: &mut OutBuffer<'_, C>) -> io::Result<usize> {
        self.0.flush_stream(output).map_err(zstd_error)
    }

    fn finish<C: WriteBuf + ?Sized>(
        &mut self,
        output: &mut OutBuffer<'_, C>,
        _finished_frame: bool,
    ) -> io::Result<usize> {
        self.0.end_stream(output).map_err(zstd_error)
    }

    fn reinit(&mut self) -> io::Result<()> {
        self.0.reset(ResetDirective::SessionOnly).map_err(zstd_error)?;
        Ok(())
    }
}

/// Decompression of frames, each checked against its checksum.
pub(super) struct Decompress(DCtx<'static>);

impl Decompress {
    pub(super) fn new() -> io::Result<Self> {
        let context = DCtx::try_create().ok_or_else(|| out_of_memory("decompression"))?;
        Ok(Self(context))
    }
}

impl Operation for Decompress {
    fn run<C: WriteBuf + ?Sized>(
        &mut self,
        input: &mut InBuffer<'_>,
        output: &mut OutBuffer<'_, C>,
    ) -> io::Result<usize> {
        self.0.decompress_stream(output, input).map_err(zstd_error)
    }

    fn flush<C: WriteBuf + ?Sized>(&mut self, output: &mut OutBuffer<'_, C>) -> io::Result<usize> {
        // Offered no more input, it writes what it holds; whether more remains is known only
        // when the output had room to spare.
        self.run(&mut InBuffer::around(&[]), output)?;
        Ok(usize::from(output.pos() == output.capacity()))
    }

    fn reinit(&mut self) -> io::Result<()> {
        self.0.reset(ResetDirective::SessionOnly).map_err(zstd_error)?;
        Ok(())
    }
}
