//! Gradients all-reduced among the run's GPUs by NCCL, directly on the device gradient
//! buffer, in buckets that start while backward still runs: each bucket waits on the device
//! for the model's stream (not the host), on NCCL's stream, so reduction overlaps with the
//! earlier layers' backward. Under ZeRO-1, each rank's updated shard of the parameters then
//! reaches the others the same way.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaStream;
use dp_comm::{Compression, NcclComm, NcclConfig, ReduceOp};
use dp_model::CudaModel;

use super::buckets::Buckets;
use super::compress::DeviceCompression;
use crate::error::Result;
use crate::processes::GpuPeers;

pub(crate) struct DeviceReducer {
    comm: NcclComm,
    /// With `compression` set: the buffers and kernels of the compressed all-reduce.
    compression: Option<DeviceCompression>,
    /// The model's stream, which each bucket waits for.
    model_stream: Arc<CudaStream>,
    /// The device addresses of the flat parameters and gradients.
    params: u64,
    grads: u64,
    buckets: Buckets,
    /// The first failure while backward ran, which `finish` returns.
    failed: Option<crate::error::Error>,
}

impl DeviceReducer {
    /// Joins the NCCL group of `peers` (every process calls this at about the same time) to
    /// reduce `model`'s gradients in buckets of about `bucket_bytes`, compressed as
    /// `compression` says.
    pub(crate) fn new(
        peers: &GpuPeers,
        model: &CudaModel,
        (bucket_bytes, compression): (usize, Compression),
        timeout: Duration,
    ) -> Result<Self> {
        let mut config = NcclConfig::new(peers.device, timeout);
        // Only device buffers are reduced: the smallest host staging buffer will do.
        config.staging_bytes = 4096;
        let comm = NcclComm::from_id(&peers.id, peers.rank, peers.world, config)?;
        let piece = bucket_bytes / size_of::<f32>();
        let compression = match compression {
            Compression::None => None,
            kind => Some(DeviceCompression::new(kind, model, &comm, piece.max(1), peers.world)?),
        };
        Ok(DeviceReducer {
            comm,
            compression,
            model_stream: Arc::clone(model.stream()),
            params: model.params().as_ptr() as usize as u64,
            grads: model.grads().as_ptr() as usize as u64,
            buckets: Buckets::new(bucket_bytes / size_of::<f32>()),
            failed: None,
        })
    }

    /// Backward has queued the work writing the gradients in `range`.
    pub(crate) fn ready(&mut self, range: Range<usize>) {
        for bucket in self.buckets.ready(range).into_iter().flatten() {
            self.reduce(bucket);
        }
    }

    /// Hands `bucket` to NCCL, to reduce once the model's stream has written it.
    fn reduce(&mut self, bucket: Range<usize>) {
        if self.failed.is_some() {
            return;
        }
        if let Err(error) = self.queue(bucket) {
            self.failed = Some(error);
        }
    }

    /// [`DeviceReducer::reduce`], its failure returned.
    fn queue(&mut self, bucket: Range<usize>) -> Result<()> {
        self.comm.wait_for(&self.model_stream)?;
        // The SAFETY of both: the range lies in the model's gradient buffer, which outlives
        // this reducer's use of it (both belong to the replica's `GpuStep`); NCCL's stream
        // waits for the model's work that writes it, and the model touches it again only in
        // the update, which the host queues after `finish` has waited.
        match &mut self.compression {
            // SAFETY: as said above.
            Some(compression) => unsafe {
                compression.all_reduce(&mut self.comm, self.grads, bucket)
            },
            None => {
                let ptr = self.grads + (bucket.start * size_of::<f32>()) as u64;
                // SAFETY: as said above.
                let queued = unsafe {
                    self.comm.all_reduce_device_ptr::<f32>(ptr, bucket.len(), ReduceOp::Sum)
                };
                Ok(queued?)
            }
        }
    }

    /// Reduces what is still pending and waits until every bucket is reduced.
    pub(crate) fn finish(&mut self) -> Result<()> {
        if let Some(bucket) = self.buckets.rest() {
            self.reduce(bucket);
        }
        if let Some(error) = self.failed.take() {
            return Err(error);
        }
        Ok(self.comm.wait()?)
    }

    /// After each rank updated its shard of `shards` (every rank's, in rank order): each
    /// shard broadcast from its rank in place, an all-gather of uneven shards that needs no
    /// buffer (an empty shard is skipped by every rank alike). The model's later work waits
    /// for it on the device; the host waits in the next step's `finish`.
    pub(crate) fn broadcast_shards(&mut self, shards: &[Range<usize>]) -> Result<()> {
        self.comm.wait_for(&self.model_stream)?;
        for (owner, shard) in shards.iter().enumerate().filter(|(_, s)| !s.is_empty()) {
            let ptr = self.params + (shard.start * size_of::<f32>()) as u64;
            // SAFETY: the shard lies in the model's parameter buffer, which outlives this
            // reducer's use of it; NCCL's stream waits for the update that writes it, and the
            // model's stream waits for NCCL below before it reads the parameters again.
            unsafe { self.comm.broadcast_device_ptr::<f32>(ptr, shard.len(), owner)? };
        }
        let joined = self.model_stream.join(self.comm.stream());
        joined.map_err(|e| {
            dp_comm::Error::Cuda { call: "cuStreamWaitEvent", message: format!("{e:?}") }.into()
        })
    }
}
