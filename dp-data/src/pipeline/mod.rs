//! The input pipeline: what tf.data with `distribute` does, without its failure modes.
//!
//! Every epoch has one global order of records, a pure function of (seed, epoch, position):
//! blocks in a computed random order, records shuffled within windows of a few blocks (see
//! `plan.rs`). The global order is cut into global batches of `batch_size * world_size`
//! records, and rank `r` takes the `r`-th slice of each. So every rank gets the same number of
//! batches, the ranks' slices of an epoch are disjoint and cover it (up to the tail policy),
//! and neither the worker count, the prefetch depth, nor resuming (even with another world
//! size, as long as the global batch is the same) changes what the model sees.
//!
//! Each worker thread makes whole batches (a batch is a function of its number), decoding the
//! blocks it needs into a table the workers share, and converting its records into a
//! contiguous batch in pooled buffers; the consumer takes the batches in order, with up to
//! `prefetch` more made ahead. Everything the pipeline holds (decoded blocks, the cache, batches
//! in flight) is sized at construction to fit `memory_budget`, and a dp-mem budget enforces it.
//!
//! While a window is batched, the next one is decoded a share per batch, so decoding never
//! comes in a burst that holds up one rank of a lockstep job. Every rank's slices draw on every
//! block of a window; the ranks of one process (a trainer's replica threads) share what they
//! decode, so each block is decompressed once for all of them (`shared_blocks.rs`). With
//! `partitions`, the order is one over fixed partitions of the blocks instead, and each rank
//! reads only its own partitions' blocks (`partitions.rs`).

mod batch;
mod blocks;
mod build;
mod columns;
mod config;
mod consumer;
mod disk_cache;
mod memory_plan;
mod order;
mod partitions;
pub(crate) mod permutation;
mod plan;
mod producer;
mod queue;
mod shared_blocks;
mod stats;
mod stream_hash;
mod transform;
mod tuning;
mod workers;

#[cfg(feature = "text")]
pub(crate) use batch::Inputs;
pub use batch::{Batch, CsrBatch};
pub use config::{CorruptionPolicy, PipelineConfig, PipelineState, TailPolicy};
pub use consumer::Pipeline;
pub use partitions::partition_records;
pub use stats::PipelineStats;
pub use transform::{FeatureScaling, Normalize, RandomCrop, RandomFlip, Sample, Transform};
