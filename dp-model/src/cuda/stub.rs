//! [`CudaModel`] in a build without the `cuda` feature: its constructor returns
//! [`Error::CudaNotCompiled`], so code that names it builds everywhere.

use std::convert::Infallible;
use std::ops::Range;

use dp_mem::{CudaBackend, Pool, PoolBuf, Tracker};
use ndarray::ArrayView2;

use crate::error::{Error, Result};
use crate::model::{Model, ModelMemory, StepOptions};
use crate::ops::loss::{LossTotals, Targets};

type DeviceBuf<T> = PoolBuf<T, CudaBackend>;

/// The CUDA libraries a GPU step uses (no value exists in this build).
#[derive(Debug)]
pub struct CudaRuntime(Infallible);

impl CudaRuntime {
    /// Fails with [`Error::CudaNotCompiled`].
    pub fn load(_device: usize) -> Result<Self> {
        Err(Error::CudaNotCompiled)
    }
}

/// A language model's generator on a GPU (no value exists in this build).
#[derive(Debug)]
pub struct CudaGenerator<'m>(Infallible, std::marker::PhantomData<&'m ()>);

#[allow(missing_docs)]
impl CudaGenerator<'_> {
    pub fn context(&self) -> usize {
        match self.0 {}
    }
    pub fn position(&self) -> usize {
        match self.0 {}
    }
    pub fn reset(&mut self) {
        match self.0 {}
    }
    pub fn next(&mut self, _token: usize) -> Result<&[f32]> {
        match self.0 {}
    }
}

/// An 8-bit optimizer state buffer on a GPU (no value exists in this build).
#[derive(Debug)]
pub struct CudaQuantizedBuf(Infallible);

/// A model whose training step runs on one GPU (no value exists in this build).
#[derive(Debug)]
pub struct CudaModel(Infallible);

#[allow(clippy::too_many_arguments, missing_docs)]
impl CudaModel {
    /// Fails with [`Error::CudaNotCompiled`].
    pub fn from_model(
        _model: &Model<f32>,
        _device: usize,
        _tracker: &Tracker,
        _host_tracker: &Tracker,
    ) -> Result<Self> {
        Err(Error::CudaNotCompiled)
    }
    pub fn with_precision(
        _model: &Model<f32>,
        _device: usize,
        _trackers: (&Tracker, &Tracker),
        _precision: crate::Precision,
    ) -> Result<Self> {
        Err(Error::CudaNotCompiled)
    }
    pub fn upload_params(&mut self, _model: &Model<f32>) -> Result<()> {
        match self.0 {}
    }
    pub fn download_params(&self, _model: &mut Model<f32>) -> Result<()> {
        match self.0 {}
    }
    pub fn download_grads(&self, _dst: &mut [f32]) -> Result<()> {
        match self.0 {}
    }
    pub fn upload_buffer(&self, _dst: &mut DeviceBuf<f32>, _src: &[f32]) -> Result<()> {
        match self.0 {}
    }
    pub fn download_buffer(&self, _src: &DeviceBuf<f32>, _dst: &mut [f32]) -> Result<()> {
        match self.0 {}
    }
    pub fn memory(&self) -> ModelMemory {
        match self.0 {}
    }
    pub fn pool(&self) -> &Pool<CudaBackend> {
        match self.0 {}
    }
    pub fn forward_backward(
        &mut self,
        _x: ArrayView2<'_, f32>,
        _targets: Targets<'_, f32>,
        _options: &StepOptions,
    ) -> Result<LossTotals> {
        match self.0 {}
    }
    pub fn forward_backward_with(
        &mut self,
        _x: ArrayView2<'_, f32>,
        _targets: Targets<'_, f32>,
        _options: &StepOptions,
        _grads_ready: &mut dyn FnMut(Range<usize>),
    ) -> Result<LossTotals> {
        match self.0 {}
    }
    pub fn grads(&self) -> &DeviceBuf<f32> {
        match self.0 {}
    }
    pub fn params(&self) -> &DeviceBuf<f32> {
        match self.0 {}
    }
    pub fn generator(&self) -> Result<CudaGenerator<'_>> {
        match self.0 {}
    }
    pub fn set_update_range(&mut self, _range: Range<usize>) -> Result<()> {
        match self.0 {}
    }
    pub fn sgd_step(
        &mut self,
        _velocity: Option<&mut DeviceBuf<f32>>,
        _lr: f64,
        _config: &crate::SgdConfig,
    ) -> Result<()> {
        match self.0 {}
    }
    pub fn adam_step(
        &mut self,
        _state: (&mut DeviceBuf<f32>, &mut DeviceBuf<f32>),
        _steps: u64,
        _lr: f64,
        _config: &crate::AdamConfig,
    ) -> Result<()> {
        match self.0 {}
    }
    pub fn state_buffer(&self) -> Result<DeviceBuf<f32>> {
        match self.0 {}
    }
    pub fn quantized_state(&self, _book: crate::StateCodebook) -> Result<CudaQuantizedBuf> {
        match self.0 {}
    }
    pub fn adam8_step(
        &mut self,
        _state: (&mut CudaQuantizedBuf, &mut CudaQuantizedBuf),
        _steps: u64,
        _lr: f64,
        _config: &crate::AdamConfig,
    ) -> Result<()> {
        match self.0 {}
    }
    pub fn sgd8_step(
        &mut self,
        _velocity: &mut CudaQuantizedBuf,
        _lr: f64,
        _config: &crate::SgdConfig,
    ) -> Result<()> {
        match self.0 {}
    }
    pub fn upload_quantized(
        &self,
        _dst: &mut CudaQuantizedBuf,
        _src: crate::QuantizedState<'_>,
    ) -> Result<()> {
        match self.0 {}
    }
    pub fn download_quantized(
        &self,
        _src: &CudaQuantizedBuf,
        _dst: crate::QuantizedStateMut<'_>,
    ) -> Result<()> {
        match self.0 {}
    }
    pub fn wait(&self) -> Result<()> {
        match self.0 {}
    }
    pub fn evaluate(
        &mut self,
        _x: ArrayView2<'_, f32>,
        _targets: Targets<'_, f32>,
    ) -> Result<LossTotals> {
        match self.0 {}
    }
    pub fn decay_only(&mut self, _ranges: &[Range<usize>]) -> Result<()> {
        match self.0 {}
    }
    pub fn clip_grad_norm(&mut self, _max_norm: f64) -> Result<()> {
        match self.0 {}
    }
    pub fn precision(&self) -> crate::Precision {
        match self.0 {}
    }
    pub fn set_prune_mask(&mut self, _words: &[u64]) -> Result<()> {
        match self.0 {}
    }
    pub fn apply_prune_mask(&mut self) -> Result<()> {
        match self.0 {}
    }
    pub fn set_norm_sync(&mut self, _sync: Option<Box<dyn crate::DeviceNormSync>>) {
        match self.0 {}
    }
}
