//! A small autograd model layer for data-parallel training.
//!
//! A [`ModelSpec`] (built in, or read from TOML/JSON) compiles to a static tape of
//! layer-level ops whose shapes are all checked once, at build time. **All parameters live in
//! one contiguous buffer and all gradients in another with the same layout** ([`ParamLayout`]),
//! so a data-parallel all-reduce is one call over one slice and a bucket is a sub-range.
//! Activations live in a workspace sized once for the largest batch, so a training step
//! allocates nothing; every buffer comes from a [`dp_mem::Pool`] and is accounted by role.
//!
//! ```
//! use dp_mem::{Pool, Tracker};
//! use dp_model::{Model, ModelOptions, ModelSpec, Optimizer, Sgd, SgdConfig, StepOptions, Targets};
//! use ndarray::Array2;
//!
//! let tracker = Tracker::new();
//! let pool = Pool::new(&tracker);
//! let spec = ModelSpec::mlp(4, &[16], 3);
//! let mut model = Model::<f32>::new(&spec, &pool, ModelOptions::new(8, 42))?;
//! let momentum = SgdConfig { momentum: 0.9, ..SgdConfig::default() };
//! let mut sgd = Sgd::new(model.params().len(), momentum, &pool)?;
//!
//! let x = Array2::from_shape_fn((8, 4), |(i, j)| ((i + j) % 3) as f32);
//! let y: Vec<i64> = (0..8).map(|i| i % 3).collect();
//! let first = model.forward_backward(x.view(), Targets::Classes(&y), &StepOptions::default())?;
//! for step in 0..50 {
//!     model.forward_backward(x.view(), Targets::Classes(&y), &StepOptions { step, ..Default::default() })?;
//!     let (params, grads) = model.params_and_grads();
//!     sgd.step(params, grads, 0.1)?;
//! }
//! let last = model.evaluate(x.view(), Targets::Classes(&y))?;
//! assert!(last.mean_loss() < first.mean_loss());
//! # Ok::<(), dp_model::Error>(())
//! ```
//!
//! Layers: Linear, Conv2d (im2col + GEMM, stride and padding, optional bias), MaxPool2d,
//! global average pooling, batch norm (running statistics as [`Model::buffers`], optionally
//! synchronized across replicas through a [`NormSync`]), residual blocks, Flatten, ReLU,
//! GELU, Tanh, Dropout, and as a first layer over sparse inputs ([`SparseInput`], CSR)
//! SparseLinear and EmbeddingBag; for language models, token and position embeddings, layer
//! norm, causal self-attention (a streaming softmax over blocks of keys: memory grows with the
//! context, not its square) and an output head tied to the token embedding; losses: softmax
//! cross-entropy (with optional label smoothing; per token for a language model) and mean
//! squared error. Built-ins: MLPs, LeNet, a small CNN, ResNet-20/56, ResNet-18, and GPTs
//! ([`GptShape`]: `gpt-mini`, `gpt2-small`). Optimizers work
//! on flat slices (any sub-range, for sharded optimizer state): [`Sgd`] and [`Adam`], with
//! [`Schedule`]s and [`clip_grad_norm`]. Memory techniques: [`Recompute`] (activation
//! recomputation), [`SavedPrecision`] (activations kept for backward in bf16),
//! [`Model::memory_for`] (a model's bytes, predicted without building it), [`Pruner`] (magnitude pruning with compressed checkpoints) and
//! [`QuantizedModel`] (int8 weights).

#[cfg(feature = "bench")]
mod bare;
mod checkpoint;
mod cuda;
mod error;
mod float;
mod generate;
mod hash;
mod init;
mod layout;
mod liveness;
mod model;
mod ops;
mod optim;
mod prune;
mod quant;
mod saved;
mod shared;
mod spec;
mod tape;
mod zoo;

#[cfg(feature = "bench")]
pub use bare::{BareConv, BareGemm};
pub use checkpoint::{
    CheckpointHeader, CheckpointInfo, CheckpointReader, CheckpointWriter, ModelSnapshot,
    OptimizerMeta, OptimizerSnapshot, ShardFile, params_checksum, save_optimizer_shard,
};
#[cfg(feature = "cuda")]
pub use cuda::CudaKernels;
pub use cuda::{
    CUDA_KERNEL_SOURCE, CUDA_KERNELS, CudaGenerator, CudaModel, CudaQuantizedBuf, CudaRuntime,
    DeviceNormSync, GpuMemory, GpuState, cuda_kernels_ptx,
};
pub use error::{Error, Result};
pub use float::Float;
pub use generate::Generator;
pub use layout::{ParamLayout, ParamRole, ParamTensor};
pub use model::{
    Model, ModelMemory, ModelOptions, Recompute, SavedPrecision, SparseGrads, StepOptions,
};
pub use ops::dropout::DropoutStream;
pub use ops::gemm::{Bf16Kernels, GemmBackend, GemmShape, Precision};
pub use ops::loss::{LossTotals, Targets};
pub use ops::norm_sync::NormSync;
pub use ops::sparse::SparseInput;
pub use optim::{
    Adam, AdamConfig, Optimizer, OptimizerState, OptimizerStateMut, QuantizedState,
    QuantizedStateMut, STATE_BLOCK, Schedule, Sgd, SgdConfig, StateCodebook, StatePrecision,
    clip_grad_norm, grad_norm, state_kernels,
};
pub use prune::{PruneSchedule, Pruner, Sparsity};
pub use quant::QuantizedModel;
pub use shared::SharedParams;
pub use spec::{BagMode, LayerSpec, ModelSpec};
pub use zoo::GptShape;
