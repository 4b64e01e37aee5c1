//! [`DeviceReducer`] in a build without the `cuda` feature, where no GPU step is ever made.

use std::convert::Infallible;
use std::ops::Range;
use std::time::Duration;

use dp_model::CudaModel;

use crate::error::{Error, Result};
use crate::processes::GpuPeers;

pub(crate) struct DeviceReducer(Infallible);

impl DeviceReducer {
    pub(crate) fn new(
        _peers: &GpuPeers,
        _model: &CudaModel,
        _reducing: (usize, dp_comm::Compression),
        _timeout: Duration,
    ) -> Result<Self> {
        Err(Error::Comm(dp_comm::Error::CudaNotCompiled))
    }

    pub(crate) fn ready(&mut self, _range: Range<usize>) {
        match self.0 {}
    }

    pub(crate) fn finish(&mut self) -> Result<()> {
        match self.0 {}
    }

    pub(crate) fn broadcast_shards(&mut self, _shards: &[Range<usize>]) -> Result<()> {
        match self.0 {}
    }
}
