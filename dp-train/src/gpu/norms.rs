//! Synchronized batch norm on GPUs (`sync_bn`): each batch norm's statistics summed over the
//! processes' GPUs by NCCL, on a communicator of their own (so that they never queue behind a
//! gradient bucket of the other communicator, or it behind them), between the model's kernels:
//! NCCL's stream waits on the device for the model's work so far, and the model's later work
//! for the sum. The host never waits but once a step, under NCCL's watchdog, so a dead peer is
//! an error within the run's timeout, not a hang.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaStream;
use dp_comm::{NcclComm, NcclConfig, NcclId, ReduceOp};
use dp_model::{CudaModel, DeviceNormSync};

use crate::error::Result;
use crate::processes::GpuPeers;

pub(crate) struct NcclNorms {
    comm: NcclComm,
    model_stream: Arc<CudaStream>,
}

impl NcclNorms {
    /// Joins the norms' NCCL group `id` among `peers` (every process calls this at about the
    /// same time) for `model`.
    pub(crate) fn new(
        peers: &GpuPeers,
        id: &NcclId,
        model: &CudaModel,
        timeout: Duration,
    ) -> Result<Self> {
        let mut config = NcclConfig::new(peers.device, timeout);
        // Only device buffers are reduced: the smallest host staging buffer will do.
        config.staging_bytes = 4096;
        let comm = NcclComm::from_id(id, peers.rank, peers.world, config)?;
        Ok(NcclNorms { comm, model_stream: Arc::clone(model.stream()) })
    }
}

impl DeviceNormSync for NcclNorms {
    fn sum(&mut self, values: u64, len: usize) -> std::result::Result<(), String> {
        self.comm.wait_for(&self.model_stream).map_err(|e| e.to_string())?;
        // SAFETY: the model hands the address of `len` f64 values of its own device scratch,
        // which its later work touches only after the join below has made it wait for NCCL.
        unsafe { self.comm.all_reduce_device_ptr::<f64>(values, len, ReduceOp::Sum) }
            .map_err(|e| e.to_string())?;
        self.model_stream
            .join(self.comm.stream())
            .map_err(|e| format!("the model's stream waiting for NCCL's: {e:?}"))
    }

    fn finish(&mut self) -> std::result::Result<(), String> {
        self.comm.wait().map_err(|e| e.to_string())
    }
}
