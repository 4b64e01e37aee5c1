//! A model's training step on one GPU: the same tape as the CPU's, its flat parameter and
//! gradient buffers in device memory from a dp-mem pool, GEMMs (in bf16 on the tensor cores
//! with `Precision::Bf16`) and the kernels of the CUDA source, all queued on one stream.
//! Activations live where the CPU's plan puts them (`buffers.rs`); convolutions are unfolded a
//! chunk of images at a time (`conv.rs`); batch norm keeps the CPU's statistics and running
//! buffers (`norm.rs`); a GPT's embedding, layer norm, attention and tied head are in
//! `sequence.rs`.
//!
//! The step is written once over a [`Device`]: CUDA (`cuda.rs`), or in tests the CPU running
//! the same kernels compiled as C++ and a plain GEMM (`emulator.rs`), which runs every line of
//! the step, its buffer plans, offsets and leading dimensions included, on machines without a
//! GPU.

// Without the `cuda` feature only the tests build this (on the emulator), and reach none of
// what CUDA builds export.
#![cfg_attr(not(feature = "cuda"), allow(dead_code, unreachable_pub))]

#[macro_use]
mod launch;
mod backward;
#[cfg(feature = "cuda")]
mod blas;
mod buffers;
mod conv;
#[cfg(feature = "cuda")]
mod cuda;
mod decode;
#[cfg(test)]
mod emulator;
mod forward;
mod gemm;
mod norm;
mod optim;
mod optim8;
#[cfg(test)]
mod predicted;
#[cfg(feature = "cuda")]
mod runtime;
mod sequence;
mod staging;
mod tokens;

use std::cell::RefCell;
use std::ffi::c_void;
use std::ops::Range;

#[cfg(feature = "cuda")]
pub use cuda::{CudaGenerator, CudaKernels, CudaModel, CudaQuantizedBuf};
use dp_mem::{Backend, HostMemory, Pool, PoolBuf, PoolConfig, Tag, Tracker};
use gemm::Gemm;
use ndarray::ArrayView2;
#[cfg(feature = "cuda")]
pub use runtime::CudaRuntime;

use self::buffers::{Buffers, fits};
use self::staging::{STAGING_PIECE, Staged};
use self::tokens::TokenSort;
use crate::cuda::DeviceNormSync;
use crate::cuda::device_memory::{GpuState, Held, predict};
use crate::error::{Error, Result};
use crate::liveness::recomputation;
use crate::model::{Model, ModelMemory, StepOptions};
use crate::ops::Op;
use crate::ops::batch_norm::NormPass;
use crate::ops::dropout::DropoutStream;
use crate::ops::gemm::Precision;
use crate::ops::loss::{LossTotals, Targets};
use crate::tape::Tape;

/// What a GPU step needs of the device it runs on. Work is queued in order and runs in that
/// order; `synchronize` waits for all of it. Addresses are the device's, as `u64`.
pub trait Device {
    /// The device's memory.
    type Memory: Backend;
    /// Host memory batches and losses go to and from the device through.
    type Staging: HostMemory;
    /// Values of unfolded convolution input taken at a time.
    const CHUNK_VALUES: usize;

    /// Queues kernel `name` (one of `CUDA_KERNELS`) over `n` elements; `params` points at each
    /// argument, as `cuLaunchKernel` takes them.
    ///
    /// # Safety
    ///
    /// `params` match the kernel's parameters one for one, and every address among them is
    /// live device memory of the sizes the kernel reads and writes.
    unsafe fn launch(&self, name: &'static str, n: usize, params: &mut [*mut c_void])
    -> Result<()>;

    /// Queues a GEMM.
    ///
    /// # Safety
    ///
    /// Its addresses are live device memory holding the matrices it describes.
    unsafe fn gemm(&self, gemm: Gemm) -> Result<()>;

    /// Queues a copy of `bytes` bytes from host memory at `src` to device memory at `dst`.
    ///
    /// # Safety
    ///
    /// Both hold `bytes` bytes; `src` does not change until the device is synchronized.
    unsafe fn copy_in(&self, dst: u64, src: *const u8, bytes: usize) -> Result<()>;

    /// Queues a copy of `bytes` bytes from device memory at `src` to host memory at `dst`.
    ///
    /// # Safety
    ///
    /// Both hold `bytes` bytes; `dst` is not used until the device is synchronized.
    unsafe fn copy_out(&self, dst: *mut u8, src: u64, bytes: usize) -> Result<()>;

    /// Queues the zeroing of `bytes` bytes of device memory at `dst`.
    ///
    /// # Safety
    ///
    /// `dst` holds `bytes` bytes.
    unsafe fn zero(&self, dst: u64, bytes: usize) -> Result<()>;

    /// Waits for everything queued.
    fn synchronize(&self) -> Result<()>;

    /// Whether `values` lie in host memory the device reads without staging.
    fn reads_directly<T>(&self, values: &[T]) -> bool;
}

/// A device buffer of `D`.
pub(crate) type DeviceBuf<T, D> = PoolBuf<T, <D as Device>::Memory>;

/// The device address of a buffer, as the kernels take it.
fn ptr<T: bytemuck::Pod, B: Backend>(buf: &PoolBuf<T, B>) -> u64 {
    buf.as_ptr() as usize as u64
}

/// Whether the GPU path runs `op`: every layer but a sparse first one (a CSR batch), and
/// attention with heads of at most `CUDA_MAX_HEAD_DIM` values (a thread keeps a row of one).
fn on_gpu_path(op: &Op) -> bool {
    match op {
        Op::Sparse(_) => false,
        Op::Attention(a) => a.head_dim <= crate::cuda::CUDA_MAX_HEAD_DIM,
        _ => true,
    }
}

/// Refuses a model with a layer the GPU path lacks, naming it.
fn check_spec(model: &Model<f32>) -> Result<()> {
    match model.tape().nodes.iter().find(|n| !on_gpu_path(&n.op)) {
        Some(node) => Err(Error::spec(
            format!("layers[{}]", node.layer),
            format!(
                "runs on the CPU only so far (the GPU path has every layer but a sparse first \
                 one, and attention heads of at most {} values)",
                crate::cuda::CUDA_MAX_HEAD_DIM
            ),
        )),
        None => Ok(()),
    }
}

/// A model whose training step runs on one GPU ([`CudaModel`] on CUDA), with the parameters
/// (and batch norms' running statistics) of a CPU [`Model`] of the same spec, and back:
/// checkpoints stay the CPU's. Dense, image and language models: every layer but a sparse
/// first one (refused, naming the layer).
pub struct GpuModel<D: Device> {
    tape: Tape,
    max_batch: usize,
    precision: Precision,
    smoothing: f32,
    dropout: DropoutStream,
    /// Wait for the device after every layer, so an error the device reports late names the
    /// layer that caused it (`DP_CUDA_SYNC=1`, as `CUDA_LAUNCH_BLOCKING` does for PyTorch).
    sync_each_layer: bool,
    pool: Pool<D::Memory>,
    params: DeviceBuf<f32, D>,
    grads: DeviceBuf<f32, D>,
    /// The batch norms' running statistics, in the CPU's layout.
    norm_buffers: DeviceBuf<f32, D>,
    /// The batch statistics forward saves for backward.
    norm_stats: DeviceBuf<f32, D>,
    /// Weight decay's ranges as [start, end) pairs (`None`: every parameter decays).
    decayed: Option<(DeviceBuf<i64, D>, i64)>,
    /// The pruning mask the parameters are held to, a bit each (`None`: no pruning).
    prune_mask: Option<DeviceBuf<u64, D>>,
    /// The parameters the optimizer's updates cover: all, or a ZeRO-1 shard.
    update: Range<usize>,
    input: DeviceBuf<f32, D>,
    labels: DeviceBuf<i64, D>,
    values: DeviceBuf<f32, D>,
    row_loss: DeviceBuf<f32, D>,
    row_counted: DeviceBuf<i32, D>,
    row_correct: DeviceBuf<i32, D>,
    work: Buffers<D::Memory>,
    staged: Staged<D::Staging>,
    /// Sums the batch norms' statistics over the replicas (`--sync-bn`), and its first failure.
    norm_sync: RefCell<NormSync>,
    /// A token batch's rows sorted by id, for the embedding table's gradient.
    token_sort: TokenSort,
    /// Dropped after every buffer above (fields drop in order).
    device: D,
}

impl<D: Device> std::fmt::Debug for GpuModel<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuModel")
            .field("params", &self.params.len())
            .field("max_batch", &self.max_batch)
            .field("precision", &self.precision)
            .finish()
    }
}

impl<D: Device> Drop for GpuModel<D> {
    fn drop(&mut self) {
        // Nothing queued may outlive the buffers; a failed wait leaves nothing else to do.
        let _ = self.device.synchronize();
    }
}

/// A [`DeviceNormSync`] and the first error it gave in this step: the rest of the step's norms
/// then use their own replica's statistics (no more collectives, which the group could not
/// finish), and the step reports the failure instead of its results.
#[derive(Default)]
struct NormSync {
    sync: Option<Box<dyn DeviceNormSync>>,
    failure: Option<String>,
}

/// What a [`GpuModel`] is made of besides the CPU model: the device, its memory (and how much
/// of it is free), host staging memory, the trackers of both, and the products' precision.
pub struct Parts<'a, D: Device> {
    pub device: D,
    pub memory: D::Memory,
    pub free: u64,
    pub staging: D::Staging,
    pub trackers: (&'a Tracker, &'a Tracker),
    pub precision: Precision,
}

impl<D: Device> GpuModel<D> {
    /// `model` on `parts.device`: its spec, batch size, label smoothing, dropout stream,
    /// current parameters and running statistics; device memory accounted under the first
    /// tracker by tag (exactly what [`GpuMemory::predict`](crate::GpuMemory::predict) says
    /// with no optimizer state), the host staging buffers under the second. Fails before
    /// taking any device memory when the model and its largest batch do not fit the device's
    /// free memory (with room for Adam's state), or what the device tracker's budget leaves.
    pub fn build(model: &Model<f32>, parts: Parts<'_, D>) -> Result<Self> {
        let Parts { device, memory, free, staging, trackers: (tracker, host_tracker), precision } =
            parts;
        check_spec(model)?;
        let tape = model.tape().clone();
        let pool = Pool::with_backend(tracker, memory, PoolConfig::default());
        let options = model.options();
        let (batch, outputs) = (options.max_batch, model.outputs());
        let rows = batch * tape.out_rows;
        let held = tracker.snapshot();
        let room = match held.budget.map(|b| b.saturating_sub(held.held)) {
            Some(left) if left < free => (left, "left in the device memory budget"),
            _ => (free, "free on the GPU"),
        };
        // Recomputed as the CPU model recomputes (`ModelOptions::recompute`).
        let recomputation = recomputation(&tape, model.spec(), &options.recompute)?;
        let plan = (&tape, &recomputation, options.saved);
        // The optimizer state is taken after (`state_buffer`). Within a budget, the planner
        // sized it (`GpuMemory::predict`) and the pool holds it to the budget; on a GPU's free
        // memory, room is kept for the most any optimizer takes: Adam's two f32 moments.
        let state = match held.budget {
            Some(_) => GpuState::default(),
            None => GpuState { buffers: 2, ..GpuState::default() },
        };
        let memory = predict(plan, (batch, precision), state, D::CHUNK_VALUES);
        fits(&memory, room, batch)?;
        let work = Buffers::new(plan, (batch, precision), &pool, D::CHUNK_VALUES)?;
        let sizes = Held::new(&tape, batch);
        let f32s = |len: usize, tag: Tag| pool.alloc::<f32>(len, tag);
        let mut this = Self {
            max_batch: batch,
            precision,
            smoothing: options.label_smoothing as f32,
            dropout: DropoutStream { seed: options.seed, stream: options.replica },
            sync_each_layer: std::env::var_os("DP_CUDA_SYNC").is_some_and(|v| v != "0"),
            params: f32s(sizes.params, Tag::Param)?,
            grads: f32s(sizes.params, Tag::Grad)?,
            norm_buffers: f32s(sizes.norm_buffers, Tag::Param)?,
            norm_stats: f32s(sizes.norm_stats, Tag::Temp)?,
            decayed: None,
            prune_mask: None,
            update: 0..tape.layout.len(),
            input: f32s(sizes.input, Tag::Data)?,
            labels: pool.alloc::<i64>(sizes.rows, Tag::Data)?,
            values: f32s(sizes.values, Tag::Data)?,
            row_loss: f32s(sizes.rows, Tag::Temp)?,
            row_counted: pool.alloc::<i32>(sizes.rows, Tag::Temp)?,
            row_correct: pool.alloc::<i32>(sizes.rows, Tag::Temp)?,
            staged: Staged::new(staging, host_tracker, rows, (tape.input_len, outputs))?,
            norm_sync: RefCell::default(),
            token_sort: TokenSort::default(),
            work,
            tape,
            pool,
            device,
        };
        let (ones, n, one) = (ptr(&this.work.ones), this.work.ones.len() as i64, 1.0f32);
        launch!(this, "dp_fill", n as usize; ones, n, one);
        this.upload_params(model)?;
        Ok(this)
    }

    /// Copies `model`'s parameters and running statistics to the device.
    pub fn upload_params(&mut self, model: &Model<f32>) -> Result<()> {
        self.check_layout(model)?;
        self.copy_in(ptr(&self.params), model.params())?;
        if !model.buffers().is_empty() {
            self.copy_in(ptr(&self.norm_buffers), model.buffers())?;
        }
        self.synchronize()
    }

    /// Copies the parameters and running statistics to `model` (to save a checkpoint, or
    /// evaluate on the CPU).
    pub fn download_params(&self, model: &mut Model<f32>) -> Result<()> {
        self.check_layout(model)?;
        if !model.buffers().is_empty() {
            self.copy_out(model.buffers_mut(), ptr(&self.norm_buffers))?;
        }
        self.copy_out(model.params_mut(), ptr(&self.params))
    }

    /// Copies the gradients to `dst` (as long as the parameters).
    pub fn download_grads(&self, dst: &mut [f32]) -> Result<()> {
        if dst.len() != self.grads.len() {
            return Err(Error::shape("gradients", self.grads.len(), dst.len()));
        }
        self.copy_out(dst, ptr(&self.grads))
    }

    /// Copies `src` into the device buffer `dst` (optimizer state restored from a checkpoint).
    pub fn upload_buffer(&self, dst: &mut DeviceBuf<f32, D>, src: &[f32]) -> Result<()> {
        if dst.len() != src.len() {
            return Err(Error::shape("device buffer", dst.len(), src.len()));
        }
        self.copy_in(ptr(dst), src)?;
        self.synchronize()
    }

    /// Copies the device buffer `src` into `dst` (optimizer state for a checkpoint).
    pub fn download_buffer(&self, src: &DeviceBuf<f32, D>, dst: &mut [f32]) -> Result<()> {
        if dst.len() != src.len() {
            return Err(Error::shape("device buffer", src.len(), dst.len()));
        }
        self.copy_out(dst, ptr(src))
    }

    /// Device bytes held, by use.
    pub fn memory(&self) -> ModelMemory {
        let bytes = |n: usize| (n * 4) as u64;
        let [saved, grads, scratch] = self.work.bytes;
        ModelMemory {
            params: bytes(self.params.len() + self.norm_buffers.len()),
            grads: bytes(self.grads.len()),
            saved_activations: saved + bytes(self.norm_stats.len()),
            workspace: grads + scratch,
            packing: 0,
        }
    }

    /// The device pool, for its statistics and `empty_cache`.
    pub fn pool(&self) -> &Pool<D::Memory> {
        &self.pool
    }

    /// What the GEMMs and convolutions multiply in.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    fn check_layout(&self, model: &Model<f32>) -> Result<()> {
        if model.layout() != &self.tape.layout || model.buffers().len() != self.tape.buffers.len() {
            return Err(Error::spec("params", "the CPU model has another layout than the GPU's"));
        }
        Ok(())
    }

    /// Queues the copy of `src` to the device buffer at `dst`, which holds as much. `src` must
    /// not change until the device is synchronized (every caller waits before returning).
    fn copy_in<T: bytemuck::Pod>(&self, dst: u64, src: &[T]) -> Result<()> {
        // SAFETY: as said above.
        unsafe { self.device.copy_in(dst, src.as_ptr().cast(), size_of_val(src)) }
    }

    /// Copies the device buffer at `src` into `dst`, waiting for it.
    fn copy_out<T: bytemuck::Pod>(&self, dst: &mut [T], src: u64) -> Result<()> {
        // SAFETY: `src` holds `dst`'s size (every caller checks); the wait comes before `dst`
        // is used.
        unsafe { self.device.copy_out(dst.as_mut_ptr().cast(), src, size_of_val(dst))? };
        self.synchronize()
    }

    fn synchronize(&self) -> Result<()> {
        self.device.synchronize()
    }

    /// Queues a GEMM of the step.
    fn gemm(&self, gemm: Gemm) -> Result<()> {
        // SAFETY: every GEMM of the step names live buffers of the shapes the tape checked.
        unsafe { self.device.gemm(gemm) }
    }

    /// Sums the batch norms' statistics over the replicas with `sync` (`None`: each replica
    /// normalizes by its own batch).
    pub fn set_norm_sync(&mut self, sync: Option<Box<dyn DeviceNormSync>>) {
        self.norm_sync = RefCell::new(NormSync { sync, failure: None });
    }

    /// Queues the sum over the replicas of the `len` `f64` values at device address `values`,
    /// if the norms are synchronized (and have not failed this step).
    fn sum_across(&self, values: u64, len: usize) {
        let mut guard = self.norm_sync.borrow_mut();
        let NormSync { sync: Some(sync), failure } = &mut *guard else { return };
        if failure.is_none()
            && let Err(what) = sync.sum(values, len)
        {
            *failure = Some(what);
        }
    }

    /// Waits for the step's synchronized statistics; the step's failure, if any.
    fn finish_norm_sync(&self) -> Result<()> {
        let mut guard = self.norm_sync.borrow_mut();
        let NormSync { sync: Some(sync), failure } = &mut *guard else { return Ok(()) };
        let done = sync.finish();
        match failure.take().or(done.err()) {
            Some(what) => Err(Error::NormSync { what }),
            None => Ok(()),
        }
    }

    /// Whether the GEMMs read bf16 operands.
    fn half(&self) -> bool {
        self.precision == Precision::Bf16
    }

    /// `len` values at `src` as the GEMMs read them: `src` itself in `f32`, else rounded to
    /// bf16 into `dst`.
    fn operand(&self, src: u64, len: usize, dst: Option<&DeviceBuf<u16, D>>) -> Result<u64> {
        let Some(dst) = dst.filter(|_| self.precision == Precision::Bf16) else { return Ok(src) };
        let (y, n) = (ptr(dst), len as i64);
        launch!(self, "dp_to_bf16", len; src, y, n);
        Ok(y)
    }

    /// Forward, loss and backward for one batch on the GPU, as [`Model::forward_backward`]
    /// does on the CPU: writes (or adds) the gradients on the device and returns the loss
    /// totals, waiting for the step to finish.
    pub fn forward_backward(
        &mut self,
        x: ArrayView2<'_, f32>,
        targets: Targets<'_, f32>,
        options: &StepOptions,
    ) -> Result<LossTotals> {
        self.forward_backward_with(x, targets, options, &mut |_| {})
    }

    /// [`GpuModel::forward_backward`], calling `grads_ready` with each layer's range of the
    /// flat gradients as soon as the work writing it is queued (on CUDA, on
    /// [`CudaModel::stream`]): the
    /// last layer's first, which the layout puts at the start, so the ranges follow each other
    /// up the buffer. Work queued on another stream after that stream waits on this one
    /// (an NCCL all-reduce of a bucket) runs while backward goes on.
    pub fn forward_backward_with(
        &mut self,
        x: ArrayView2<'_, f32>,
        targets: Targets<'_, f32>,
        options: &StepOptions,
        grads_ready: &mut dyn FnMut(Range<usize>),
    ) -> Result<LossTotals> {
        let batch = self.take_input(x)?;
        let rows = batch * self.tape.out_rows;
        targets.check(rows, self.tape.outputs())?;
        self.forward(batch, NormPass::Train, options.step)?;
        let counted = match targets {
            Targets::Classes(labels) => labels.iter().filter(|&&l| l >= 0).count(),
            Targets::Values(_) => rows,
        };
        let denominator = options.denominator.map(|d| d * self.tape.out_rows);
        let inv_denominator = 1.0 / denominator.unwrap_or(counted).max(1) as f32;
        // The gradient goes over the logits where nothing reads them after the loss.
        let last = self.tape.nodes.len() - 1;
        let grad = match self.work.grad_plan.logits_in_place {
            true => self.output_of(last),
            false => ptr(&self.work.dacts[self.work.grad_plan.grad_buf[last]]),
        };
        self.loss(rows, targets, Some((grad, inv_denominator)))?;
        self.backward(batch, options, grads_ready)?;
        self.finish_norm_sync()?;
        self.totals(rows, targets)
    }

    /// The loss totals of one batch in evaluation (batch norms use their running statistics,
    /// dropout passes everything): forward and the loss only, nothing written but the
    /// outputs.
    pub fn evaluate(
        &mut self,
        x: ArrayView2<'_, f32>,
        targets: Targets<'_, f32>,
    ) -> Result<LossTotals> {
        let batch = self.take_input(x)?;
        let rows = batch * self.tape.out_rows;
        targets.check(rows, self.tape.outputs())?;
        self.forward(batch, NormPass::Eval, 0)?;
        self.loss(rows, targets, None)?;
        self.totals(rows, targets)
    }

    /// Checks a batch and queues its copy to the device; returns its samples.
    fn take_input(&mut self, x: ArrayView2<'_, f32>) -> Result<usize> {
        let (batch, features) = x.dim();
        if features != self.tape.input_len || batch == 0 || batch > self.max_batch {
            return Err(Error::shape(
                "GPU input",
                format!("[1..={}, {}]", self.max_batch, self.tape.input_len),
                format!("[{batch}, {features}]"),
            ));
        }
        let x = x
            .as_slice()
            .ok_or_else(|| Error::shape("GPU input", "a contiguous array", "a strided view"))?;
        self.copy_input(x)?;
        self.take_tokens(x)?;
        Ok(batch)
    }

    /// Queues the copy of a batch to the device. A batch in page-locked memory (a
    /// [`dp_mem::PinnedBackend`] pool's, as a pipeline that feeds a GPU hands it over) is read
    /// straight from there; any other goes through the staging buffer a piece at a time, each
    /// piece's copy to the device running while the host copies the next. `x` must not change
    /// until the step has waited for the device, which every step does before it returns.
    fn copy_input(&mut self, x: &[f32]) -> Result<()> {
        let input = ptr(&self.input);
        if self.device.reads_directly(x) {
            return self.copy_in(input, x);
        }
        // The staging buffer is free: the last step waited for its copies.
        for (i, piece) in x.chunks(STAGING_PIECE).enumerate() {
            let at = i * STAGING_PIECE;
            let staged = &mut self.staged.input[at..at + piece.len()];
            staged.copy_from_slice(piece);
            // SAFETY: the piece of the staging buffer is not written again before the step
            // waits for the device.
            unsafe {
                self.device.copy_in(
                    input + 4 * at as u64,
                    staged.as_ptr().cast(),
                    4 * staged.len(),
                )?
            };
        }
        Ok(())
    }

    /// Queues the loss over the logits of `rows` rows, and with `grad` its gradient (at that
    /// device address, divided by the denominator given as its inverse).
    fn loss(
        &mut self,
        rows: usize,
        targets: Targets<'_, f32>,
        grad: Option<(u64, f32)>,
    ) -> Result<()> {
        let last = self.tape.nodes.len() - 1;
        let logits = ptr(&self.work.acts[self.work.plan.out_buf[last]]);
        let (grad, inv_denominator) = grad.unwrap_or((0, 1.0));
        let (n, cols) = (rows as i64, self.tape.outputs() as i64);
        let (row_loss, row_counted, row_correct) =
            (ptr(&self.row_loss), ptr(&self.row_counted), ptr(&self.row_correct));
        match targets {
            Targets::Classes(labels) => {
                self.staged.labels[..rows].copy_from_slice(labels);
                self.copy_in(ptr(&self.labels), &self.staged.labels[..rows])?;
                // Evaluation reports the plain cross-entropy.
                let smoothing = if grad == 0 { 0.0 } else { self.smoothing };
                let labels = ptr(&self.labels);
                launch!(self, "dp_softmax_cross_entropy", rows; logits, labels, grad, row_loss, row_counted, row_correct, n, cols, inv_denominator, smoothing);
            }
            Targets::Values(values) => {
                let values = values.as_slice().ok_or_else(|| {
                    Error::shape("GPU targets", "a contiguous array", "a strided view")
                })?;
                self.staged.values[..values.len()].copy_from_slice(values);
                self.copy_in(ptr(&self.values), &self.staged.values[..values.len()])?;
                let values = ptr(&self.values);
                launch!(self, "dp_squared_error", rows; logits, values, grad, row_loss, row_correct, n, cols, inv_denominator);
            }
        }
        Ok(())
    }

    /// Every row's loss, summed here in f64 as the CPU does, after one wait for the step.
    fn totals(&mut self, rows: usize, targets: Targets<'_, f32>) -> Result<LossTotals> {
        let staged = &mut self.staged;
        let (loss, correct) = (&mut staged.loss[..rows], &mut staged.correct[..rows]);
        let counted = &mut staged.counted[..rows];
        // SAFETY: the per-row buffers hold `rows` values; the staging buffers are read only
        // after the wait below.
        unsafe {
            self.device.copy_out(loss.as_mut_ptr().cast(), ptr(&self.row_loss), 4 * rows)?;
            self.device.copy_out(correct.as_mut_ptr().cast(), ptr(&self.row_correct), 4 * rows)?;
            if let Targets::Classes(_) = targets {
                let from = ptr(&self.row_counted);
                self.device.copy_out(counted.as_mut_ptr().cast(), from, 4 * rows)?;
            }
        }
        self.synchronize()?;
        let staged = &self.staged;
        let mut totals = LossTotals::default();
        for r in 0..rows {
            let counts = match targets {
                Targets::Classes(_) => staged.counted[r] != 0,
                Targets::Values(_) => true,
            };
            if counts {
                totals.loss_sum += f64::from(staged.loss[r]);
                totals.samples += 1;
                totals.correct += usize::from(staged.correct[r] != 0);
            }
        }
        Ok(totals)
    }

    /// The flat parameters in device memory (for the broadcast of a ZeRO-1 shard).
    pub fn params(&self) -> &DeviceBuf<f32, D> {
        &self.params
    }

    /// The flat gradients in device memory (the layout of [`Model::layout`]).
    pub fn grads(&self) -> &DeviceBuf<f32, D> {
        &self.grads
    }

    /// Waits for every step queued so far.
    pub fn wait(&self) -> Result<()> {
        self.synchronize()
    }

    /// An error of layer `node`'s work, naming it; with `DP_CUDA_SYNC` set, waits for the
    /// layer first so an error the device reports late is caught here.
    fn after_layer<T>(&self, node: usize, done: Result<T>) -> Result<T> {
        let done = done.and_then(|v| {
            if self.sync_each_layer { self.synchronize().map(|()| v) } else { Ok(v) }
        });
        done.map_err(|error| match error {
            Error::CudaStep { what } => {
                let node = &self.tape.nodes[node];
                Error::CudaStep { what: format!("{} ({}): {what}", node.name, kind(&node.op)) }
            }
            other => other,
        })
    }
}

/// What kind of layer `op` is, for messages.
fn kind(op: &Op) -> &'static str {
    match op {
        Op::Linear(_) => "linear",
        Op::Conv2d(_) => "conv2d",
        Op::MaxPool2d(_) => "max_pool2d",
        Op::Transpose(_) => "layout change",
        Op::Activation(_) => "activation",
        Op::Dropout(_) => "dropout",
        Op::BatchNorm(_) => "batch_norm",
        Op::GlobalAvgPool(_) => "global_avg_pool",
        Op::Add(_) => "residual sum",
        Op::LayerNorm(_) => "layer_norm",
        Op::Attention(_) => "attention",
        Op::Embedding(_) => "embedding",
        Op::TiedHead(_) => "tied head",
        Op::Sparse(_) => "sparse linear",
    }
}
