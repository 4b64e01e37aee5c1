//! zstd compression and decompression through contexts made fallibly. The zstd crate's own
//! constructors panic when zstd cannot allocate a context ("zstd returned null pointer");
//! here that is an out-of-memory error like any other failed allocation.

use std::io;

use zstd::zstd_safe::{self, CCtx, DCtx};

fn out_of_memory(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::OutOfMemory, format!("zstd cannot allocate a {what} context"))
}

fn zstd_error(code: zstd_safe::ErrorCode) -> io::Error {
    io::Error::other(zstd_safe::get_error_name(code))
}

/// A compression context at one level, reused across blocks.
pub(crate) struct Compressor {
    context: CCtx<'static>,
    level: i32,
}

impl Compressor {
    pub(crate) fn new(level: i32) -> io::Result<Self> {
        let context = CCtx::try_create().ok_or_else(|| out_of_memory("compression"))?;
        Ok(Self { context, level })
    }

    /// `data` compressed into one zstd frame.
    pub(crate) fn compress(&mut self, data: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        out.try_reserve_exact(zstd_safe::compress_bound(data.len()))
            .map_err(|_| out_of_memory("compression output"))?;
        self.context.compress(&mut out, data, self.level).map_err(zstd_error)?;
        Ok(out)
    }
}

/// A decompression context, reused across blocks.
pub(crate) struct Decompressor {
    context: DCtx<'static>,
}

impl Decompressor {
    pub(crate) fn new() -> io::Result<Self> {
        let context = DCtx::try_create().ok_or_else(|| out_of_memory("decompression"))?;
        Ok(Self { context })
    }

    /// Decompresses the frame `data` into `out`; returns the bytes written.
    pub(crate) fn decompress_to_buffer(
        &mut self,
        data: &[u8],
        out: &mut [u8],
    ) -> io::Result<usize> {
        self.context.decompress(out, data).map_err(zstd_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_round_trip_and_damage_is_an_error() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let compressed = Compressor::new(3).unwrap().compress(&data).unwrap();
        assert!(compressed.len() < data.len() / 10);
        assert_eq!(zstd::bulk::decompress(&compressed, data.len()).unwrap(), data);
        let mut decompressor = Decompressor::new().unwrap();
        let mut out = vec![0u8; data.len()];
        assert_eq!(decompressor.decompress_to_buffer(&compressed, &mut out).unwrap(), data.len());
        assert_eq!(out, data);
        let error = decompressor.decompress_to_buffer(&compressed[..100], &mut out).unwrap_err();
        assert!(!error.to_string().is_empty());
    }
}
