//! A replica's step on a GPU (`device = "cuda"`): forward, backward and the optimizer's update
//! run there (dp-model's [`CudaModel`]), with the optimizer state in device memory. The
//! replica's CPU model and optimizer hold the parameters and state only when something reads
//! them (evaluation, checksums, checkpoints), copied back then; a resumed run copies them in.

use dp_mem::{CudaBackend, PoolBuf, Tracker};
use dp_model::{CudaModel, LossTotals, Model, Optimizer, StepOptions, Targets};
use ndarray::ArrayView2;

use crate::config::OptimizerConfig;
use crate::error::Result;

/// Optimizer state on the device, as the CPU optimizer of the same config keeps it.
enum State {
    Sgd(Option<PoolBuf<f32, CudaBackend>>),
    Adam(PoolBuf<f32, CudaBackend>, PoolBuf<f32, CudaBackend>),
}

pub(crate) struct GpuStep {
    model: CudaModel,
    /// Accounts the device memory by tag.
    tracker: Tracker,
    state: State,
    config: OptimizerConfig,
    /// Optimizer steps taken (Adam's bias correction needs them).
    steps: u64,
    /// The CPU copies are behind the device's.
    host_stale: bool,
}

impl GpuStep {
    /// `host` and `optimizer` (its state restored or fresh) on GPU `device`.
    pub(crate) fn new(
        host: &Model<f32>,
        optimizer: &dyn Optimizer<f32>,
        config: &OptimizerConfig,
        device: usize,
    ) -> Result<Self> {
        let tracker = Tracker::new();
        let model = CudaModel::from_model(host, device, &tracker)?;
        let saved = optimizer.state();
        let state = match config {
            OptimizerConfig::Sgd { momentum, .. } if *momentum == 0.0 => State::Sgd(None),
            OptimizerConfig::Sgd { .. } => State::Sgd(Some(model.state_buffer()?)),
            OptimizerConfig::Adam { .. } => {
                State::Adam(model.state_buffer()?, model.state_buffer()?)
            }
        };
        let mut step = Self {
            model,
            tracker,
            state,
            config: config.clone(),
            steps: saved.steps,
            host_stale: false,
        };
        let buffers: Vec<&mut PoolBuf<f32, CudaBackend>> = match &mut step.state {
            State::Sgd(velocity) => velocity.iter_mut().collect(),
            State::Adam(m, v) => vec![m, v],
        };
        for (device, host) in buffers.into_iter().zip(&saved.buffers) {
            step.model.upload_buffer(device, host)?;
        }
        Ok(step)
    }

    pub(crate) fn forward_backward(
        &mut self,
        x: ArrayView2<'_, f32>,
        targets: Targets<'_, f32>,
        options: &StepOptions,
    ) -> Result<LossTotals> {
        self.host_stale = true;
        Ok(self.model.forward_backward(x, targets, options)?)
    }

    /// One update of every parameter with the gradients on the device.
    pub(crate) fn update(&mut self, lr: f64) -> Result<()> {
        self.steps += 1;
        match (&mut self.state, &self.config) {
            (State::Sgd(velocity), OptimizerConfig::Sgd { momentum, nesterov, weight_decay }) => {
                self.model.sgd_step(velocity.as_mut(), lr, *momentum, *nesterov, *weight_decay)?
            }
            (
                State::Adam(m, v),
                OptimizerConfig::Adam { beta1, beta2, eps, weight_decay, decoupled },
            ) => self.model.adam_step(
                (m, v),
                self.steps,
                lr,
                (*beta1, *beta2),
                *eps,
                *weight_decay,
                *decoupled,
            )?,
            _ => unreachable!("the state is made from the config"),
        }
        Ok(())
    }

    /// Brings the CPU model's parameters and the CPU optimizer's state up to the device's.
    pub(crate) fn sync_host(
        &mut self,
        host: &mut Model<f32>,
        optimizer: &mut dyn Optimizer<f32>,
    ) -> Result<()> {
        if !self.host_stale {
            return Ok(());
        }
        self.model.download_params(host)?;
        let state = optimizer.state_mut();
        *state.steps = self.steps;
        let buffers: Vec<&PoolBuf<f32, CudaBackend>> = match &self.state {
            State::Sgd(velocity) => velocity.iter().collect(),
            State::Adam(m, v) => vec![m, v],
        };
        for (device, host) in buffers.into_iter().zip(state.buffers) {
            self.model.download_buffer(device, host)?;
        }
        self.host_stale = false;
        Ok(())
    }

    /// Peak device bytes by tag (`Tag::ALL` order).
    pub(crate) fn peak(&self) -> [u64; 7] {
        let mut peak = [0u64; 7];
        for (slot, tag) in peak.iter_mut().zip(dp_mem::Tag::ALL) {
            *slot = self.tracker.tag_in_use(tag).1;
        }
        peak
    }
}
