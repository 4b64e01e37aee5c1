//! Compressed gradient all-reduce among GPUs (`compression = "bf16"` or `"int8"`), in
//! dp-comm's format with error feedback: each piece of a bucket is rounded by the model's
//! kernels into a payload, the payloads are all-gathered by NCCL, and every rank sums them in
//! rank order, so all get the same bits. Everything is queued on NCCL's stream, one piece
//! after another, so one piece's buffers serve them all and the model's backward goes on
//! meanwhile. An int8 piece has its own scale: pieces are at most a bucket's size, which
//! bounds the buffers (a layer larger than a bucket is several pieces).

use std::ffi::c_void;
use std::ops::Range;

use dp_comm::{Compression, NcclComm};
use dp_mem::{CudaBackend, PoolBuf, Tag};
use dp_model::{CudaKernels, CudaModel};

use crate::error::Result;

/// Threads taking an int8 piece's partial maxima (the memory plan sizes the buffer by it).
const PARTS: usize = crate::memory_plan::COMPRESSION_PARTS;

pub(crate) struct DeviceCompression {
    kind: Compression,
    kernels: CudaKernels,
    /// What rounding dropped, per gradient, added to the next step's.
    residual: PoolBuf<f32, CudaBackend>,
    /// This rank's payload of a piece, and every rank's.
    send: PoolBuf<u8, CudaBackend>,
    gathered: PoolBuf<u8, CudaBackend>,
    partials: PoolBuf<f32, CudaBackend>,
    /// Values per piece, at most.
    piece: usize,
    world: usize,
}

/// A kernel argument, as the launch takes it.
fn arg<T>(value: &mut T) -> *mut c_void {
    (value as *mut T).cast()
}

impl DeviceCompression {
    /// Buffers on `model`'s GPU (tag `Comm`) for pieces of at most `piece` values among
    /// `world` ranks, the kernels on `comm`'s stream.
    pub(crate) fn new(
        kind: Compression,
        model: &CudaModel,
        comm: &NcclComm,
        piece: usize,
        world: usize,
    ) -> Result<Self> {
        let (pool, payload) = (model.pool(), kind.payload_bytes(piece));
        let compression = DeviceCompression {
            kind,
            kernels: model.kernels_on(comm.stream().clone()),
            residual: pool.alloc::<f32>(model.grads().len().max(1), Tag::Comm)?,
            send: pool.alloc::<u8>(payload, Tag::Comm)?,
            gathered: pool.alloc::<u8>(payload * world, Tag::Comm)?,
            partials: pool.alloc::<f32>(PARTS, Tag::Comm)?,
            piece,
            world,
        };
        let (residual, bytes) =
            ((compression.residual.as_ptr() as usize as u64), 4 * compression.residual.len());
        // SAFETY: the residual's own bytes; the stream zeroes them before any piece uses them.
        unsafe { compression.kernels.zero(residual, bytes)? };
        Ok(compression)
    }

    /// Queues, on `comm`'s stream, the compressed sum over the ranks of the gradients in
    /// `bucket` of the buffer at `grads`, written back in place, piece by piece.
    ///
    /// # Safety
    ///
    /// `grads` must hold the gradients `bucket` lies in, written by work `comm`'s stream
    /// already waits for, and touched by nothing else until that stream has run this.
    pub(crate) unsafe fn all_reduce(
        &mut self,
        comm: &mut NcclComm,
        grads: u64,
        bucket: Range<usize>,
    ) -> Result<()> {
        let mut start = bucket.start;
        while start < bucket.end {
            let len = self.piece.min(bucket.end - start);
            // SAFETY: as the caller guarantees, for the piece.
            unsafe { self.piece(comm, grads, start..start + len)? };
            start += len;
        }
        Ok(())
    }

    /// [`DeviceCompression::all_reduce`] of one piece of at most `self.piece` values.
    unsafe fn piece(&mut self, comm: &mut NcclComm, grads: u64, piece: Range<usize>) -> Result<()> {
        let k = &self.kernels;
        let mut g = grads + 4 * piece.start as u64;
        let mut residual = (self.residual.as_ptr() as usize as u64) + 4 * piece.start as u64;
        let (mut send, mut gathered) =
            ((self.send.as_ptr() as usize as u64), (self.gathered.as_ptr() as usize as u64));
        let (mut n, len) = (piece.len() as i64, piece.len());
        let mut payload = self.kind.payload_bytes(len) as i64;
        let int8 = matches!(self.kind, Compression::Int8 { .. });
        // SAFETY: every address above lies in a live buffer of the sizes the kernels read
        // (the caller's gradients, this compressor's buffers), and each argument is the type
        // the kernel declares.
        unsafe {
            if int8 {
                let (mut partials, mut parts) =
                    ((self.partials.as_ptr() as usize as u64), PARTS as i64);
                let mut absmax = [
                    arg(&mut g),
                    arg(&mut residual),
                    arg(&mut n),
                    arg(&mut partials),
                    arg(&mut parts),
                ];
                k.launch("dp_compress_absmax", PARTS, &mut absmax)?;
                let mut scale = [arg(&mut partials), arg(&mut parts), arg(&mut send)];
                k.launch("dp_compress_scale", 1, &mut scale)?;
                let mut encode = [arg(&mut g), arg(&mut residual), arg(&mut send), arg(&mut n)];
                k.launch("dp_compress_int8", len, &mut encode)?;
            } else {
                let mut encode = [arg(&mut g), arg(&mut residual), arg(&mut send), arg(&mut n)];
                k.launch("dp_compress_bf16", len, &mut encode)?;
            }
            comm.all_gather_device_ptr::<u8>(send, gathered, payload as usize)?;
            let (mut ranks, mut int8) = (self.world as i64, i32::from(int8));
            let mut sum = [
                arg(&mut gathered),
                arg(&mut ranks),
                arg(&mut payload),
                arg(&mut int8),
                arg(&mut g),
                arg(&mut n),
            ];
            k.launch("dp_decompress_sum", len, &mut sum)?;
        }
        Ok(())
    }
}
