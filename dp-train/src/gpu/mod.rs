//! A replica's step on a GPU (`device = "cuda"`): forward, backward and the optimizer's update
//! run there (dp-model's [`CudaModel`]), with the optimizer state in device memory. The
//! replica's CPU model and optimizer hold the parameters and state only when something reads
//! them (evaluation, checksums, checkpoints), copied back then; a resumed run copies them in.
//! A run of several processes, one GPU each, all-reduces the gradients on the devices
//! (`reduce.rs`).

// Used by the NCCL reducer only; its tests run in every build.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod buckets;
#[cfg(feature = "cuda")]
mod compress;
#[cfg(feature = "cuda")]
mod norms;
#[cfg(feature = "cuda")]
mod reduce;
#[cfg(not(feature = "cuda"))]
mod reduce_stub;

use std::ops::Range;
use std::time::Duration;

use dp_mem::{ByTag, CudaBackend, PoolBuf, Tracker};
use dp_model::{
    CudaModel, CudaQuantizedBuf, LossTotals, Model, Optimizer, OptimizerState, OptimizerStateMut,
    Pruner, SgdConfig, StateCodebook, StatePrecision, StepOptions, Targets,
};
use ndarray::ArrayView2;
#[cfg(feature = "cuda")]
use reduce::DeviceReducer;
#[cfg(not(feature = "cuda"))]
use reduce_stub::DeviceReducer;

use crate::config::OptimizerConfig;
use crate::error::Result;
use crate::plan::RunPlan;
use crate::processes::GpuPeers;
use crate::zero::{decayed_in, zero_shard};

/// Optimizer state on the device, as the CPU optimizer of the same config keeps it: f32, or
/// 8-bit (`optimizer_bits = 8`) in the CPU's codes and scales.
enum State {
    Sgd(Option<PoolBuf<f32, CudaBackend>>),
    Adam(PoolBuf<f32, CudaBackend>, PoolBuf<f32, CudaBackend>),
    Sgd8(CudaQuantizedBuf),
    Adam8(CudaQuantizedBuf, CudaQuantizedBuf),
}

impl State {
    /// Zeroed state on `model`'s device for `config` at `precision`.
    fn new(model: &CudaModel, config: &OptimizerConfig, precision: StatePrecision) -> Result<Self> {
        let int8 = precision == StatePrecision::Int8;
        Ok(match config {
            OptimizerConfig::Sgd(SgdConfig { momentum, .. }) if *momentum == 0.0 => {
                State::Sgd(None)
            }
            OptimizerConfig::Sgd(_) if int8 => {
                State::Sgd8(model.quantized_state(StateCodebook::Signed)?)
            }
            OptimizerConfig::Sgd(_) => State::Sgd(Some(model.state_buffer()?)),
            OptimizerConfig::Adam(_) if int8 => State::Adam8(
                model.quantized_state(StateCodebook::Signed)?,
                model.quantized_state(StateCodebook::Unsigned)?,
            ),
            OptimizerConfig::Adam(_) => State::Adam(model.state_buffer()?, model.state_buffer()?),
        })
    }

    /// Its f32 buffers and its 8-bit ones, each in the CPU optimizer's order.
    fn buffers(&mut self) -> (Vec<&mut PoolBuf<f32, CudaBackend>>, Vec<&mut CudaQuantizedBuf>) {
        match self {
            State::Sgd(velocity) => (velocity.iter_mut().collect(), vec![]),
            State::Adam(m, v) => (vec![m, v], vec![]),
            State::Sgd8(velocity) => (vec![], vec![velocity]),
            State::Adam8(m, v) => (vec![], vec![m, v]),
        }
    }

    /// Copies the CPU optimizer's `saved` state in.
    fn restore(&mut self, model: &CudaModel, saved: &OptimizerState<'_, f32>) -> Result<()> {
        let (f32s, int8s) = self.buffers();
        for (device, host) in f32s.into_iter().zip(&saved.buffers) {
            model.upload_buffer(device, host)?;
        }
        for (device, host) in int8s.into_iter().zip(&saved.quantized) {
            model.upload_quantized(device, *host)?;
        }
        Ok(())
    }

    /// Copies the device's state into the CPU optimizer's `state`.
    fn save(&mut self, model: &CudaModel, state: OptimizerStateMut<'_, f32>) -> Result<()> {
        let (f32s, int8s) = self.buffers();
        for (device, host) in f32s.into_iter().zip(state.buffers) {
            model.download_buffer(device, host)?;
        }
        for (device, host) in int8s.into_iter().zip(state.quantized) {
            model.download_quantized(device, host)?;
        }
        Ok(())
    }
}

pub(crate) struct GpuStep {
    model: CudaModel,
    /// Accounts the device memory by tag.
    tracker: Tracker,
    state: State,
    config: OptimizerConfig,
    /// Optimizer steps taken (Adam's bias correction needs them).
    steps: u64,
    /// With other processes' GPUs: the gradients' all-reduce.
    reducer: Option<DeviceReducer>,
    /// Under ZeRO-1 over several GPUs: every rank's shard of the parameters, in rank order
    /// (this one updates its own, then each reaches the others); else empty.
    shards: Vec<Range<usize>>,
    /// The CPU copies are behind the device's.
    host_stale: bool,
}

impl GpuStep {
    /// `host` and `optimizer` (its state restored or fresh, for the parameters of `shard`:
    /// all, or this rank's ZeRO-1 shard) on this process's GPU, among `peers`' when other
    /// processes have GPUs too; the page-locked batch buffers are accounted under
    /// `host_tracker`.
    pub(crate) fn new(
        (host, optimizer, shard): (&Model<f32>, &dyn Optimizer<f32>, Range<usize>),
        plan: &RunPlan,
        peers: Option<&GpuPeers>,
        host_tracker: &Tracker,
    ) -> Result<Self> {
        let config = &plan.optimizer;
        let device = peers.map_or(0, |peers| peers.device);
        let tracker = Tracker::new();
        // Under device = cuda the memory budget is the GPU's.
        tracker.set_budget(plan.config.memory_budget.map(|b| b.0));
        let precision = plan.config.precision;
        let mut model =
            CudaModel::with_precision(host, device, (&tracker, host_tracker), precision)?;
        model.set_update_range(shard.clone())?;
        if plan.config.decay_bias_and_norm == Some(false) {
            model.decay_only(&decayed_in(&host.layout().decayed_ranges(), &shard))?;
        }
        let len = host.params().len();
        let shards: Vec<Range<usize>> = match peers {
            Some(peers) if shard != (0..len) => (0..peers.world)
                .map(|rank| zero_shard(len, peers.world, rank, plan.config.piece_align()))
                .collect(),
            _ => Vec::new(),
        };
        // The shard this rank's optimizer was built for must be the one the broadcasts take
        // from it: otherwise its update would go nowhere, and another's be overwritten.
        if let Some(peers) = peers.filter(|_| !shards.is_empty())
            && shards.get(peers.rank) != Some(&shard)
        {
            return Err(crate::error::Error::config(
                "zero_stage",
                format!(
                    "GPU rank {} of {} updates parameters {shard:?}, but its ZeRO-1 shard is {:?}",
                    peers.rank,
                    peers.world,
                    shards.get(peers.rank)
                ),
            ));
        }
        let timeout = Duration::from_secs_f64(plan.config.timeout_s);
        let reducer = match peers {
            None => None,
            Some(peers) => {
                let buckets = plan.config.buckets()?;
                let reducing = (buckets.bucket_bytes, buckets.compression);
                Some(DeviceReducer::new(peers, &model, reducing, timeout)?)
            }
        };
        #[cfg(feature = "cuda")]
        if let Some(peers) = peers
            && let Some(id) = &peers.norms
        {
            let norms = norms::NcclNorms::new(peers, id, &model, timeout)?;
            model.set_norm_sync(Some(Box::new(norms)));
        }
        let saved = optimizer.state();
        let mut state = State::new(&model, config, plan.config.state_precision())?;
        state.restore(&model, &saved)?;
        Ok(Self {
            model,
            tracker,
            state,
            config: config.clone(),
            steps: saved.steps,
            reducer,
            shards,
            host_stale: false,
        })
    }

    /// Forward and backward of one micro-batch; with `reduce` (the step's last), the
    /// gradients are then summed over the processes' GPUs.
    pub(crate) fn forward_backward(
        &mut self,
        x: ArrayView2<'_, f32>,
        targets: Targets<'_, f32>,
        options: &StepOptions,
        reduce: bool,
    ) -> Result<LossTotals> {
        self.host_stale = true;
        match &mut self.reducer {
            Some(reducer) if reduce => {
                let ready = &mut |range| reducer.ready(range);
                let totals = self.model.forward_backward_with(x, targets, options, ready)?;
                reducer.finish()?;
                Ok(totals)
            }
            _ => Ok(self.model.forward_backward(x, targets, options)?),
        }
    }

    /// One update of every parameter with the gradients on the device, clipped first to
    /// `clip` (a global norm) if given.
    pub(crate) fn update(&mut self, lr: f64, clip: Option<f64>) -> Result<()> {
        self.steps += 1;
        if let Some(max_norm) = clip {
            self.model.clip_grad_norm(max_norm)?;
        }
        match (&mut self.state, &self.config) {
            (State::Sgd(velocity), OptimizerConfig::Sgd(sgd)) => {
                self.model.sgd_step(velocity.as_mut(), lr, sgd)?
            }
            (State::Adam(m, v), OptimizerConfig::Adam(adam)) => {
                self.model.adam_step((m, v), self.steps, lr, adam)?
            }
            (State::Sgd8(velocity), OptimizerConfig::Sgd(sgd)) => {
                self.model.sgd8_step(velocity, lr, sgd)?
            }
            (State::Adam8(m, v), OptimizerConfig::Adam(adam)) => {
                self.model.adam8_step((m, v), self.steps, lr, adam)?
            }
            _ => unreachable!("the state is made from the config"),
        }
        if let Some(reducer) = self.reducer.as_mut().filter(|_| !self.shards.is_empty()) {
            reducer.broadcast_shards(&self.shards)?;
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
        self.state.save(&self.model, state)?;
        self.host_stale = false;
        Ok(())
    }

    /// Holds the device's parameters to `pruner`'s mask from now on.
    pub(crate) fn hold_to(&mut self, pruner: &Pruner) -> Result<()> {
        Ok(self.model.set_prune_mask(pruner.mask_words())?)
    }

    /// After the update of step `step`: at a step the schedule grows the mask at, the mask is
    /// grown on the host from the device's parameters (brought to `host` first) and the pruned
    /// parameters and the mask go back to the device; at any other, the device zeroes the
    /// pruned weights the update moved.
    pub(crate) fn prune(
        &mut self,
        pruner: &mut Pruner,
        step: u64,
        host: &mut Model<f32>,
        optimizer: &mut dyn Optimizer<f32>,
    ) -> Result<()> {
        if !pruner.is_due(step) {
            return Ok(self.model.apply_prune_mask()?);
        }
        self.sync_host(host, optimizer)?;
        pruner.update(step, host.params_mut());
        self.model.upload_params(host)?;
        self.hold_to(pruner)
    }

    /// The loss totals of an evaluation batch, on the device.
    pub(crate) fn evaluate(
        &mut self,
        x: ArrayView2<'_, f32>,
        targets: Targets<'_, f32>,
    ) -> Result<LossTotals> {
        Ok(self.model.evaluate(x, targets)?)
    }

    /// Copies `host`'s parameters and running statistics to the device (after they were
    /// brought up to it and changed there: the running statistics broadcast from rank 0).
    pub(crate) fn reload(&mut self, host: &Model<f32>) -> Result<()> {
        Ok(self.model.upload_params(host)?)
    }

    /// Peak device bytes by tag.
    pub(crate) fn peak(&self) -> ByTag<u64> {
        ByTag::from_fn(|tag| self.tracker.tag_in_use(tag).1)
    }
}
