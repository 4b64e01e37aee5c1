//! A model's training step on one GPU: the same tape as the CPU's, its flat parameter and
//! gradient buffers in device memory from a dp-mem pool, GEMMs through cuBLAS and the rest
//! through the kernels of `kernels.cu`, all queued on one stream.

use std::ops::Range;
use std::sync::Arc;

use cudarc::cublas::result as cublas;
use cudarc::cublas::sys::{cublasHandle_t, cublasOperation_t};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaStream, DriverError, LaunchConfig, PushKernelArg, result, sys,
};
use cudarc::nvrtc::Ptx;
use dp_mem::{CudaBackend, PinnedBackend, Pool, PoolBuf, PoolConfig, Tag, Tracker};
use ndarray::ArrayView2;

use super::{activation_kind, cuda_kernels_ptx};
use crate::error::{Error, Result};
use crate::model::{Model, ModelMemory, StepOptions};
use crate::ops::Op;
use crate::ops::dropout::DropoutStream;
use crate::ops::loss::{LossTotals, Targets};
use crate::optim::{AdamConfig, AdamUpdate, SgdConfig};
use crate::tape::Tape;

type DeviceBuf<T> = PoolBuf<T, CudaBackend>;
type PinnedBuf<T> = PoolBuf<T, PinnedBackend>;

/// Threads per block of every elementwise kernel, and the most blocks one launch takes (the
/// kernels loop over the rest).
const THREADS: u32 = 256;
const MAX_BLOCKS: u32 = 4096;

fn driver(call: &str, error: DriverError) -> Error {
    let text = error.error_string().map_or_else(|_| String::new(), |t| t.to_string_lossy().into());
    Error::CudaUnavailable { what: format!("{call} failed: {:?} {text}", error.0) }
}

fn blas_error(call: &str, error: cudarc::cublas::result::CublasError) -> Error {
    Error::CudaUnavailable { what: format!("{call} failed: {error:?}") }
}

/// The kernels, loaded once per model.
struct Kernels {
    activation_forward: CudaFunction,
    activation_backward: CudaFunction,
    dropout: CudaFunction,
    add_bias: CudaFunction,
    bias_activation: CudaFunction,
    fill: CudaFunction,
    softmax_cross_entropy: CudaFunction,
    squared_error: CudaFunction,
    sgd_step: CudaFunction,
    adam_step: CudaFunction,
}

/// Values a batch goes through the page-locked staging buffer in: 1 MiB, small enough that
/// the copy to the device of one piece overlaps the host's copy of the next, large enough that
/// each copy runs near the bus's rate.
const STAGING_PIECE: usize = 1 << 18;

/// Whether `values` lie in page-locked host memory, which the device reads without staging.
/// A slice is one allocation, so its two ends tell. Asking is cheap (the driver looks the
/// address up), and a wrong "no" only costs the staging copy.
fn page_locked<T>(values: &[T]) -> bool {
    let is_host = |address: *const T| {
        let mut kind = 0u32;
        // SAFETY: the attribute is an unsigned int the driver writes to `kind`; the address
        // is only looked up, never dereferenced.
        let found = unsafe {
            sys::cuPointerGetAttribute(
                (&raw mut kind).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                address as usize as u64,
            )
        };
        found == sys::CUresult::CUDA_SUCCESS && kind == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32
    };
    match values {
        [] => false,
        [first, .., last] => is_host(first) && is_host(last),
        [only] => is_host(only),
    }
}

/// The device address of a buffer, as the kernels take it.
fn ptr<T: bytemuck::Pod>(buf: &DeviceBuf<T>) -> u64 {
    buf.as_ptr() as usize as u64
}

/// A launch over `n` elements (or rows).
fn config(n: usize) -> LaunchConfig {
    let blocks = (n as u64).div_ceil(u64::from(THREADS)).clamp(1, u64::from(MAX_BLOCKS)) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

/// Launches `$kernel` over `$n` elements with the arguments, which must be local variables
/// (a launch keeps their addresses until it is queued).
macro_rules! launch {
    ($self:ident, $kernel:ident, $n:expr; $($arg:ident),+) => {{
        let mut builder = $self.stream.launch_builder(&$self.kernels.$kernel);
        $(builder.arg(&$arg);)+
        // SAFETY: the arguments match the kernel's parameters in `kernels.cu` one for one,
        // and every pointer is a live device buffer of the sizes the kernel reads.
        unsafe { builder.launch(config($n)) }
            .map_err(|e| driver(concat!("launching ", stringify!($kernel)), e))?;
    }};
}

/// A model whose training step runs on one GPU, with the parameters of a CPU [`Model`] of the
/// same spec (and back: checkpoints and evaluation stay on the CPU path). Linear layers,
/// activations and dropout (the MLPs); a spec with convolutions is refused. See the crate's
/// CUDA notes for what is verified.
pub struct CudaModel {
    tape: Tape,
    max_batch: usize,
    dropout: DropoutStream,
    stream: Arc<CudaStream>,
    blas: cublasHandle_t,
    kernels: Kernels,
    pool: Pool<CudaBackend>,
    params: DeviceBuf<f32>,
    grads: DeviceBuf<f32>,
    input: DeviceBuf<f32>,
    /// Each node's output.
    acts: Vec<DeviceBuf<f32>>,
    /// The two buffers activation gradients alternate between.
    ping: [DeviceBuf<f32>; 2],
    labels: DeviceBuf<i64>,
    values: DeviceBuf<f32>,
    /// Ones, a batch long: the bias gradients are the GEMM `dy^T 1`.
    ones: DeviceBuf<f32>,
    row_loss: DeviceBuf<f32>,
    row_counted: DeviceBuf<i32>,
    row_correct: DeviceBuf<i32>,
    staged: Staged,
}

/// Page-locked host buffers that a batch goes to the device through, and each row's loss
/// comes back through. Copies from and to them are asynchronous, so the host fills the next
/// batch while the device still runs the last update, and a step waits for the device once.
struct Staged {
    input: PinnedBuf<f32>,
    labels: PinnedBuf<i64>,
    values: PinnedBuf<f32>,
    loss: PinnedBuf<f32>,
    counted: PinnedBuf<i32>,
    correct: PinnedBuf<i32>,
    /// Dropped after the buffers it holds.
    _pool: Pool<PinnedBackend>,
}

impl Staged {
    fn new(
        device: usize,
        host_tracker: &Tracker,
        batch: usize,
        spec: (usize, usize),
    ) -> Result<Self> {
        let (input_len, outputs) = spec;
        let backend = PinnedBackend::new(device).map_err(mem_error)?;
        let pool = Pool::with_backend(host_tracker, backend, PoolConfig::default());
        Ok(Staged {
            input: pool.alloc((batch * input_len).max(1), Tag::Data)?,
            labels: pool.alloc(batch, Tag::Data)?,
            values: pool.alloc((batch * outputs).max(1), Tag::Data)?,
            loss: pool.alloc(batch, Tag::Temp)?,
            counted: pool.alloc(batch, Tag::Temp)?,
            correct: pool.alloc(batch, Tag::Temp)?,
            _pool: pool,
        })
    }
}

/// Queues a copy of device memory at `src` into the page-locked `dst`.
///
/// # Safety
///
/// `src` holds at least `dst.len()` values of `T`; `dst` is not read, written or freed before
/// the caller has waited for `stream`.
unsafe fn copy_out_async<T>(stream: &CudaStream, dst: &mut [T], src: u64) -> Result<()> {
    // SAFETY: as the caller guarantees.
    unsafe { result::memcpy_dtoh_async(dst, src, stream.cu_stream()) }
        .map_err(|e| driver("cuMemcpyDtoHAsync", e))
}

/// dp-mem's CUDA errors as this crate's.
fn mem_error(error: dp_mem::Error) -> Error {
    match error {
        dp_mem::Error::CudaUnavailable { what } => Error::CudaUnavailable { what },
        dp_mem::Error::CudaNotCompiled => Error::CudaNotCompiled,
        other => Error::from(other),
    }
}

/// The CUDA libraries a GPU step uses, loaded and initialised on one device: the driver's
/// context, cuBLAS, the compiled kernels and whatever they set up on first use, through one
/// step of a small model. What they take from host memory (hundreds of MiB of driver state and
/// library code) is the process's before any real model exists; a run that holds this from
/// before it measures the process's starting memory counts it there.
#[derive(Debug)]
pub struct CudaRuntime {
    _warm: CudaModel,
}

impl CudaRuntime {
    /// Loads the libraries on GPU `device` and takes one step with them.
    pub fn load(device: usize) -> Result<Self> {
        let (tracker, pool) = (Tracker::new(), Pool::new(&Tracker::new()));
        let spec = crate::ModelSpec::mlp(64, &[64], 10);
        let cpu = Model::<f32>::new(&spec, &pool, crate::ModelOptions::new(8, 1))?;
        let mut warm = CudaModel::from_model(&cpu, device, &tracker, pool.tracker())?;
        let x = ndarray::Array2::<f32>::zeros((8, 64));
        warm.forward_backward(x.view(), Targets::Classes(&[0; 8]), &StepOptions::default())?;
        warm.sgd_step(None, 0.0, &crate::SgdConfig::default())?;
        warm.wait()?;
        Ok(Self { _warm: warm })
    }
}

impl std::fmt::Debug for CudaModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaModel")
            .field("params", &self.params.len())
            .field("max_batch", &self.max_batch)
            .finish()
    }
}

impl Drop for CudaModel {
    fn drop(&mut self) {
        // Nothing queued may outlive the buffers; a failed wait leaves nothing else to do.
        let _ = self.stream.synchronize();
        // SAFETY: the handle was made by `create_handle` and is destroyed once.
        let _ = unsafe { cublas::destroy_handle(self.blas) };
    }
}

impl CudaModel {
    /// `model` on GPU `device`: its spec, batch size, dropout stream and current parameters;
    /// device memory accounted under `tracker` by tag, and the page-locked host buffers that
    /// batches go through under `host_tracker`.
    pub fn from_model(
        model: &Model<f32>,
        device: usize,
        tracker: &Tracker,
        host_tracker: &Tracker,
    ) -> Result<Self> {
        let tape = model.tape().clone();
        if let Some(node) = tape
            .nodes
            .iter()
            .find(|n| !matches!(n.op, Op::Linear(_) | Op::Activation(_) | Op::Dropout(_)))
        {
            return Err(Error::spec(
                format!("layers[{}]", node.layer),
                "runs on the CPU only so far (the GPU path has linear layers, activations and dropout)",
            ));
        }
        let ptx = cuda_kernels_ptx()?;
        let backend = CudaBackend::new(device).map_err(mem_error)?;
        let context: Arc<CudaContext> = Arc::clone(backend.context());
        let stream = context.new_stream().map_err(|e| driver("cuStreamCreate", e))?;
        let module = context
            .load_module(Ptx::from_src(ptx.to_string()))
            .map_err(|e| driver("cuModuleLoadData", e))?;
        let load =
            |name: &str| module.load_function(name).map_err(|e| driver("cuModuleGetFunction", e));
        let kernels = Kernels {
            activation_forward: load("dp_activation_forward")?,
            activation_backward: load("dp_activation_backward")?,
            dropout: load("dp_dropout")?,
            add_bias: load("dp_add_bias")?,
            bias_activation: load("dp_bias_activation")?,
            fill: load("dp_fill")?,
            softmax_cross_entropy: load("dp_softmax_cross_entropy")?,
            squared_error: load("dp_squared_error")?,
            sgd_step: load("dp_sgd_step")?,
            adam_step: load("dp_adam_step")?,
        };
        let blas = cublas::create_handle().map_err(|e| blas_error("cublasCreate", e))?;
        // SAFETY: a live handle and stream.
        let bound = unsafe { cublas::set_stream(blas, stream.cu_stream() as _) };
        if let Err(e) = bound {
            // SAFETY: made just above, destroyed once.
            let _ = unsafe { cublas::destroy_handle(blas) };
            return Err(blas_error("cublasSetStream", e));
        }
        let pool = Pool::with_backend(tracker, backend, PoolConfig::default());
        let batch = model.options().max_batch;
        let outputs = model.outputs();
        let alloc = |len: usize, tag: Tag| pool.alloc::<f32>(len.max(1), tag);
        let mut this = Self {
            max_batch: batch,
            dropout: DropoutStream { seed: model.options().seed, stream: model.options().replica },
            params: alloc(tape.layout.len(), Tag::Param)?,
            grads: alloc(tape.layout.len(), Tag::Grad)?,
            input: alloc(batch * tape.input_len, Tag::Data)?,
            acts: tape
                .nodes
                .iter()
                .map(|n| alloc(batch * n.out_len, Tag::Activation))
                .collect::<std::result::Result<_, _>>()?,
            ping: [
                alloc(tape.ping_len(batch), Tag::Activation)?,
                alloc(tape.ping_len(batch), Tag::Activation)?,
            ],
            labels: pool.alloc::<i64>(batch, Tag::Data)?,
            values: alloc(batch * outputs, Tag::Data)?,
            ones: alloc(batch, Tag::Temp)?,
            row_loss: alloc(batch, Tag::Temp)?,
            row_counted: pool.alloc::<i32>(batch, Tag::Temp)?,
            row_correct: pool.alloc::<i32>(batch, Tag::Temp)?,
            staged: Staged::new(device, host_tracker, batch, (tape.input_len, outputs))?,
            tape,
            stream,
            blas,
            kernels,
            pool,
        };
        let (ones, n, one) = (ptr(&this.ones), this.ones.len() as i64, 1.0f32);
        launch!(this, fill, n as usize; ones, n, one);
        this.upload_params(model)?;
        Ok(this)
    }

    /// Copies `model`'s parameters to the device.
    pub fn upload_params(&mut self, model: &Model<f32>) -> Result<()> {
        self.check_layout(model)?;
        self.copy_in(ptr(&self.params), model.params())?;
        self.synchronize()
    }

    /// Copies the parameters to `model` (to save a checkpoint, or evaluate on the CPU).
    pub fn download_params(&self, model: &mut Model<f32>) -> Result<()> {
        self.check_layout(model)?;
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
    pub fn upload_buffer(&self, dst: &mut DeviceBuf<f32>, src: &[f32]) -> Result<()> {
        if dst.len() != src.len() {
            return Err(Error::shape("device buffer", dst.len(), src.len()));
        }
        self.copy_in(ptr(dst), src)?;
        self.synchronize()
    }

    /// Copies the device buffer `src` into `dst` (optimizer state for a checkpoint).
    pub fn download_buffer(&self, src: &DeviceBuf<f32>, dst: &mut [f32]) -> Result<()> {
        if dst.len() != src.len() {
            return Err(Error::shape("device buffer", src.len(), dst.len()));
        }
        self.copy_out(dst, ptr(src))
    }

    /// Device bytes held, by use.
    pub fn memory(&self) -> ModelMemory {
        let bytes = |n: usize| (n * 4) as u64;
        ModelMemory {
            params: bytes(self.params.len()),
            grads: bytes(self.grads.len()),
            saved_activations: self.acts.iter().map(|a| bytes(a.len())).sum(),
            workspace: bytes(self.ping[0].len() + self.ping[1].len()),
            packing: 0,
        }
    }

    /// The device pool, for its statistics and `empty_cache`.
    pub fn pool(&self) -> &Pool<CudaBackend> {
        &self.pool
    }

    fn check_layout(&self, model: &Model<f32>) -> Result<()> {
        if model.layout() != &self.tape.layout {
            return Err(Error::spec("params", "the CPU model has another layout than the GPU's"));
        }
        Ok(())
    }

    fn copy_in<T>(&self, dst: u64, src: &[T]) -> Result<()> {
        // SAFETY: `dst` is a device buffer at least `src`'s size; the stream is synchronized
        // before `src` can change (every caller waits for the stream before returning).
        unsafe { result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }
            .map_err(|e| driver("cuMemcpyHtoDAsync", e))
    }

    fn copy_out<T>(&self, dst: &mut [T], src: u64) -> Result<()> {
        // SAFETY: `src` is a device buffer at least `dst`'s size; the stream is synchronized
        // before returning.
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }
            .map_err(|e| driver("cuMemcpyDtoHAsync", e))?;
        self.synchronize()
    }

    fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(|e| driver("cuStreamSynchronize", e))
    }

    /// `C = op(A) op(B)` (+ `beta C`) for column-major `m x n` C, as cuBLAS takes it.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        (ta, tb): (bool, bool),
        (m, n, k): (usize, usize, usize),
        a: u64,
        lda: usize,
        b: u64,
        ldb: usize,
        beta: f32,
        c: u64,
        ldc: usize,
    ) -> Result<()> {
        let op = |t: bool| {
            if t { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N }
        };
        let (alpha, beta) = (1.0f32, beta);
        // SAFETY: the pointers are live device buffers of the shapes the layer checked when
        // the tape was built; alpha and beta are host values that outlive the call.
        unsafe {
            cublas::sgemm(
                self.blas,
                op(ta),
                op(tb),
                m as i32,
                n as i32,
                k as i32,
                &alpha,
                a as usize as *const f32,
                lda as i32,
                b as usize as *const f32,
                ldb as i32,
                &beta,
                c as usize as *mut f32,
                ldc as i32,
            )
        }
        .map_err(|e| blas_error("cublasSgemm", e))
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

    /// [`CudaModel::forward_backward`], calling `grads_ready` with each layer's range of the
    /// flat gradients as soon as the work writing it is queued on [`CudaModel::stream`]: the
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
        let outputs = self.tape.outputs();
        targets.check(batch, outputs)?;
        self.copy_input(x)?;
        let mut i = 0;
        while i < self.tape.nodes.len() {
            i += self.forward_node(i, batch, options.step)?;
        }

        let counted = match targets {
            Targets::Classes(labels) => labels.iter().filter(|&&l| l >= 0).count(),
            Targets::Values(_) => batch,
        };
        let inv_denominator = 1.0 / options.denominator.unwrap_or(counted).max(1) as f32;
        let last = self.tape.nodes.len() - 1;
        let (logits, grad) = (ptr(&self.acts[last]), ptr(&self.ping[0]));
        let (rows, cols) = (batch as i64, outputs as i64);
        let (row_loss, row_counted, row_correct) =
            (ptr(&self.row_loss), ptr(&self.row_counted), ptr(&self.row_correct));
        match targets {
            Targets::Classes(labels) => {
                self.staged.labels[..batch].copy_from_slice(labels);
                self.copy_in(ptr(&self.labels), &self.staged.labels[..batch])?;
                let labels = ptr(&self.labels);
                let smoothing = 0.0f32;
                launch!(self, softmax_cross_entropy, batch; logits, labels, grad, row_loss, row_counted, row_correct, rows, cols, inv_denominator, smoothing);
            }
            Targets::Values(values) => {
                let values = values.as_slice().ok_or_else(|| {
                    Error::shape("GPU targets", "a contiguous array", "a strided view")
                })?;
                self.staged.values[..values.len()].copy_from_slice(values);
                self.copy_in(ptr(&self.values), &self.staged.values[..values.len()])?;
                let values = ptr(&self.values);
                launch!(self, squared_error, batch; logits, values, grad, row_loss, row_correct, rows, cols, inv_denominator);
            }
        }

        for i in (0..self.tape.nodes.len()).rev() {
            if i == 0 && self.tape.nodes[i].params.is_empty() {
                break;
            }
            self.backward_node(i, batch, options)?;
            if !self.tape.nodes[i].params.is_empty() {
                grads_ready(self.tape.nodes[i].params.clone());
            }
        }

        // Every row's loss, summed here in f64 as the CPU does, after one wait.
        let n = batch;
        let staged = &mut self.staged;
        // SAFETY: the per-row buffers are a batch long; the staging buffers are read only
        // after the wait below.
        unsafe {
            copy_out_async(&self.stream, &mut staged.loss[..n], row_loss)?;
            copy_out_async(&self.stream, &mut staged.correct[..n], row_correct)?;
            if let Targets::Classes(_) = targets {
                copy_out_async(&self.stream, &mut staged.counted[..n], row_counted)?;
            }
        }
        self.synchronize()?;
        let staged = &self.staged;
        let mut totals = LossTotals::default();
        for r in 0..n {
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

    /// Queues the copy of a batch to the device. A batch in page-locked memory (a
    /// [`PinnedBackend`] pool's, as a pipeline that feeds a GPU hands it over) is read straight
    /// from there; any other goes through the staging buffer a piece at a time, each piece's
    /// copy to the device running while the host copies the next. `x` must not change until
    /// the step has waited for the device, which [`CudaModel::forward_backward_with`] does.
    fn copy_input(&mut self, x: &[f32]) -> Result<()> {
        let input = ptr(&self.input);
        if page_locked(x) {
            return self.copy_in(input, x);
        }
        // The staging buffer is free: the last step waited for its copies.
        for (i, piece) in x.chunks(STAGING_PIECE).enumerate() {
            let at = i * STAGING_PIECE;
            let staged = &mut self.staged.input[at..at + piece.len()];
            staged.copy_from_slice(piece);
            // SAFETY: as `copy_in`'s; the piece of the staging buffer is not written again
            // before the step waits for the stream.
            unsafe {
                result::memcpy_htod_async(input + 4 * at as u64, &*staged, self.stream.cu_stream())
            }
            .map_err(|e| driver("cuMemcpyHtoDAsync", e))?;
        }
        Ok(())
    }

    /// The device address of node `i`'s input.
    fn input_of(&self, i: usize) -> u64 {
        if i == 0 { ptr(&self.input) } else { ptr(&self.acts[i - 1]) }
    }

    /// Queues node `i`'s forward and returns how many nodes that covered: a linear layer
    /// followed by an activation is one kernel after its GEMM.
    fn forward_node(&mut self, i: usize, batch: usize, step: u64) -> Result<usize> {
        let node = &self.tape.nodes[i];
        let (x, y) = (self.input_of(i), ptr(&self.acts[i]));
        let n = (batch * node.out_len) as i64;
        match &node.op {
            Op::Linear(l) => {
                let w = ptr(&self.params) + 4 * l.offset as u64;
                let bias = w + 4 * (l.outputs * l.inputs) as u64;
                // Row-major y[batch, out] = x[batch, in] W^T is column-major Y' = W'^T X'.
                self.gemm(
                    (true, false),
                    (l.outputs, batch, l.inputs),
                    w,
                    l.inputs,
                    x,
                    l.inputs,
                    0.0,
                    y,
                    l.outputs,
                )?;
                let (rows, cols) = (batch as i64, l.outputs as i64);
                if let Some(Op::Activation(a)) = self.tape.nodes.get(i + 1).map(|n| &n.op) {
                    let (out, kind) = (ptr(&self.acts[i + 1]), activation_kind(*a));
                    launch!(self, bias_activation, batch * l.outputs; y, bias, out, rows, cols, kind);
                    return Ok(2);
                }
                launch!(self, add_bias, batch * l.outputs; y, bias, rows, cols);
            }
            Op::Activation(a) => {
                let kind = activation_kind(*a);
                launch!(self, activation_forward, n as usize; x, y, n, kind);
            }
            Op::Dropout(d) => {
                let key = d.key(self.dropout, step);
                let threshold = d.threshold();
                let scale = d.scale() as f32;
                launch!(self, dropout, n as usize; x, y, n, key, threshold, scale);
            }
            _ => unreachable!("refused when the model was built"),
        }
        Ok(1)
    }

    fn backward_node(&mut self, i: usize, batch: usize, options: &StepOptions) -> Result<()> {
        let nodes = self.tape.nodes.len();
        let node = &self.tape.nodes[i];
        let (x, y) = (self.input_of(i), ptr(&self.acts[i]));
        let (a, b) = (ptr(&self.ping[0]), ptr(&self.ping[1]));
        let (dy, dx) = if (nodes - 1 - i).is_multiple_of(2) { (a, b) } else { (b, a) };
        let n = (batch * node.out_len) as i64;
        match &node.op {
            Op::Linear(l) => {
                let w = ptr(&self.params) + 4 * l.offset as u64;
                let dw = ptr(&self.grads) + 4 * l.offset as u64;
                let db = dw + 4 * (l.outputs * l.inputs) as u64;
                let beta = if options.accumulate { 1.0 } else { 0.0 };
                // dW[out, in] = dy^T x: column-major dW' = X' DY'^T.
                self.gemm(
                    (false, true),
                    (l.inputs, l.outputs, batch),
                    x,
                    l.inputs,
                    dy,
                    l.outputs,
                    beta,
                    dw,
                    l.inputs,
                )?;
                // db[out] = dy^T 1: column-major DY' (out x batch) times ones (batch x 1).
                self.gemm(
                    (false, false),
                    (l.outputs, 1, batch),
                    dy,
                    l.outputs,
                    ptr(&self.ones),
                    batch,
                    beta,
                    db,
                    l.outputs,
                )?;
                if i > 0 {
                    // dx[batch, in] = dy W: column-major dX' = W' DY'.
                    self.gemm(
                        (false, false),
                        (l.inputs, batch, l.outputs),
                        w,
                        l.inputs,
                        dy,
                        l.outputs,
                        0.0,
                        dx,
                        l.inputs,
                    )?;
                }
            }
            Op::Activation(act) => {
                let kind = activation_kind(*act);
                launch!(self, activation_backward, n as usize; x, y, dy, dx, n, kind);
            }
            Op::Dropout(d) => {
                let key = d.key(self.dropout, options.step);
                let threshold = d.threshold();
                let scale = d.scale() as f32;
                launch!(self, dropout, n as usize; dy, dx, n, key, threshold, scale);
            }
            _ => unreachable!("refused when the model was built"),
        }
        Ok(())
    }

    /// One SGD step over all parameters with the gradients on the device, as [`Sgd`]
    /// (`velocity`: its momentum buffer, from [`CudaModel::state_buffer`]; `None` without
    /// momentum).
    ///
    /// [`Sgd`]: crate::Sgd
    pub fn sgd_step(
        &mut self,
        velocity: Option<&mut DeviceBuf<f32>>,
        lr: f64,
        config: &SgdConfig,
    ) -> Result<()> {
        let (p, g) = (ptr(&self.params), ptr(&self.grads));
        let v = velocity.map_or(0, |v| ptr(v));
        let n = self.params.len() as i64;
        let (lr, wd, mu, nesterov) = (
            lr as f32,
            config.weight_decay as f32,
            config.momentum as f32,
            i32::from(config.nesterov),
        );
        let (decayed, ranges) = (0u64, -1i64);
        launch!(self, sgd_step, n as usize; p, g, v, n, lr, wd, mu, nesterov, decayed, ranges);
        Ok(())
    }

    /// One Adam (or AdamW) step, as [`Adam`] with its moments `m` and `v` (from
    /// [`CudaModel::state_buffer`]) after `steps` steps including this one.
    ///
    /// [`Adam`]: crate::Adam
    pub fn adam_step(
        &mut self,
        (m, v): (&mut DeviceBuf<f32>, &mut DeviceBuf<f32>),
        steps: u64,
        lr: f64,
        config: &AdamConfig,
    ) -> Result<()> {
        let s = AdamUpdate::new(config, steps, lr);
        let (p, g, m, v) = (ptr(&self.params), ptr(&self.grads), ptr(m), ptr(v));
        let n = self.params.len() as i64;
        let (step_size, sqrt_c2) = (s.step_size as f32, s.sqrt_c2 as f32);
        let (b1, b2, eps) = (s.beta1 as f32, s.beta2 as f32, s.eps as f32);
        let (coupled_wd, shrink) = (s.coupled_wd as f32, s.shrink as f32);
        let (decayed, ranges) = (0u64, -1i64);
        launch!(self, adam_step, n as usize; p, g, m, v, n, step_size, sqrt_c2, b1, b2, eps, coupled_wd, shrink, decayed, ranges);
        Ok(())
    }

    /// A zeroed device buffer as long as the parameters, for optimizer state (tag `OptState`).
    pub fn state_buffer(&self) -> Result<DeviceBuf<f32>> {
        let buf = self.pool.alloc::<f32>(self.params.len(), Tag::OptState)?;
        // SAFETY: a live device buffer of `len * 4` bytes; the stream orders it before use.
        unsafe { result::memset_d8_async(ptr(&buf), 0, buf.len() * 4, self.stream.cu_stream()) }
            .map_err(|e| driver("cuMemsetD8Async", e))?;
        Ok(buf)
    }

    /// The stream every step's work is queued on, for work on other streams to wait on (see
    /// [`CudaModel::forward_backward_with`]). Only with the `cuda` feature.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The flat gradients in device memory (the layout of [`Model::layout`]).
    pub fn grads(&self) -> &DeviceBuf<f32> {
        &self.grads
    }

    /// Waits for every step queued so far.
    pub fn wait(&self) -> Result<()> {
        self.synchronize()
    }
}
