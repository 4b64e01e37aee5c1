//! How a replica's gradients are averaged with the other replicas': bucket by bucket on a
//! communication thread while backward goes on, or all at once in place after it.

use std::time::Instant;

use dp_comm::{BucketConfig, BucketReducer, Communicator, Compression, ReduceOp};
use dp_mem::{Pool, PoolBuf, Tag, Tracker};
use dp_model::{LossTotals, Model, Optimizer, StepOptions, Targets};

use crate::config::Device;
use crate::error::Result;
use crate::input::Input;
use crate::plan::RunPlan;
use crate::touched_rows::TouchedRows;

/// The gradient buffer the all-reduce works on, from the replica's pool (tag `Comm`).
pub(super) struct CommBuffer(pub(super) PoolBuf<f32>);

impl AsRef<[f32]> for CommBuffer {
    fn as_ref(&self) -> &[f32] {
        &self.0
    }
}

impl AsMut<[f32]> for CommBuffer {
    fn as_mut(&mut self) -> &mut [f32] {
        &mut self.0
    }
}

/// How a replica's gradients are averaged with the other replicas'.
pub(super) enum GradSync {
    /// Bucket by bucket on a communication thread, while backward goes on.
    Buckets {
        reducer: BucketReducer<CommBuffer>,
        /// Where each gradient bucket ends, in the order backward finishes them.
        ends: Vec<usize>,
        /// Accounts the reducer's compression scratch under `Comm`.
        _scratch: dp_mem::Reservation,
    },
    /// All at once after backward, in place in the model's gradient buffer, on the replica's
    /// own thread.
    InPlace,
}

impl GradSync {
    /// Bucket by bucket over `grad_comm`, in a gradient buffer from `pool`.
    pub(super) fn buckets<G>(
        grad_comm: G,
        plan: &RunPlan,
        pool: &Pool,
        tracker: &Tracker,
    ) -> Result<Self>
    where
        G: Communicator + Send + 'static,
    {
        let len = plan.spec.layout()?.len();
        let buffer = CommBuffer(pool.alloc_zeroed(len, Tag::Comm)?);
        let reducer = BucketReducer::new(buffer, grad_comm, plan.config.buckets()?)?;
        // The compression scratch lives on the communication thread, outside the pool;
        // account it here so the memory report adds up.
        let scratch = tracker.reserve(Tag::Comm, reducer.scratch_bytes() as u64)?;
        let ends =
            (0..reducer.buckets()).filter_map(|b| reducer.bucket_range(b)).map(|r| r.end).collect();
        Ok(GradSync::Buckets { reducer, ends, _scratch: scratch })
    }
}

/// Whether `params` gradients are averaged in place once backward is done, rather than bucket
/// by bucket on a communication thread (which then needs a group of its own). A gradient that
/// fits in one bucket cannot be reduced while backward goes on, so a communication thread
/// would only add a copy of the gradients and two hand-offs between threads to every step;
/// replicas that share their parameters update them only once every gradient is reduced,
/// and a communication thread's copy of the gradients would cost each of them what sharing
/// saves; and a world of one replica has nobody to send them to (nor a reason to compress
/// them).
pub(crate) fn reduces_in_place(params: usize, bucket: &BucketConfig, plan: &RunPlan) -> bool {
    let one_bucket = params * size_of::<f32>() <= bucket.bucket_bytes;
    let uncompressed = bucket.compression == Compression::None;
    // GPUs reduce on the devices, through NCCL (`gpu::reduce`).
    let on_gpus = plan.config.device == Device::Cuda;
    plan.world() == 1 || on_gpus || (uncompressed && (one_bucket || plan.shares_params()))
}

/// What a step's reduction works on, borrowed from the replica.
pub(super) struct Reducing<'a, C> {
    pub(super) model: &'a mut Model<f32>,
    pub(super) ctl: &'a mut C,
    /// With a sparse first layer reduced in place: its touched rows only, when few are.
    pub(super) touched_rows: Option<&'a mut TouchedRows>,
    pub(super) optimizer: &'a mut dyn Optimizer<f32>,
    /// Set once an update has begun: the parameters then match no step boundary.
    pub(super) updating: &'a mut bool,
}

impl GradSync {
    /// The last micro-batch of a step: forward and backward, then the gradients' all-reduce.
    /// With buckets, each finished bucket goes to the communication thread while backward
    /// goes on, and (given `update`, the learning rate) each bucket's parameters are updated
    /// as soon as it is reduced; otherwise the gradients are reduced in place once backward is done.
    /// Returns the loss and the seconds spent waiting for reductions.
    pub(super) fn backward_and_reduce<C: Communicator>(
        &mut self,
        on: Reducing<'_, C>,
        x: Input<'_>,
        targets: Targets<'_, f32>,
        options: &StepOptions,
        update: Option<f64>,
    ) -> Result<(LossTotals, f64)> {
        let Reducing { model, ctl, touched_rows, optimizer, updating } = on;
        let (reducer, bucket_ends) = match self {
            GradSync::Buckets { reducer, ends, .. } => (reducer, ends),
            GradSync::InPlace => {
                let loss = x.forward_backward(model, targets, options)?;
                let reducing = Instant::now();
                match touched_rows {
                    Some(rows) => {
                        rows.all_reduce(model, ctl)?;
                    }
                    // Alone, there is nothing to sum (and lending the gradients out would make
                    // a sparse first layer clear its whole table next step).
                    None if ctl.world_size() == 1 => {}
                    None => ctl.all_reduce(model.grads_mut(), ReduceOp::Sum)?,
                }
                return Ok((loss, reducing.elapsed().as_secs_f64()));
            }
        };
        let mut reduce = reducer.begin()?;
        let (mut copied, mut next_bucket, mut failed) = (0usize, 0usize, None);
        let mut hand_over = |done: &[f32]| {
            if failed.is_some() {
                return;
            }
            let result = reduce
                .slice_mut(copied..done.len())
                .map(|dst| dst.copy_from_slice(&done[copied..]));
            copied = done.len();
            let result = result.and_then(|()| {
                while next_bucket < bucket_ends.len() && bucket_ends[next_bucket] <= copied {
                    reduce.mark_ready(next_bucket)?;
                    next_bucket += 1;
                }
                Ok(())
            });
            failed = result.err();
        };
        let loss = x.forward_backward_with(model, targets, options, &mut hand_over);
        if let Some(error) = failed {
            return Err(error.into());
        }
        let loss = loss?;
        let mut waited = 0.0;
        if let Some(lr) = update {
            let params = model.params_mut();
            let mut start = 0;
            for (b, &end) in bucket_ends.iter().enumerate() {
                let waiting = Instant::now();
                let grads = reduce.reduced_bucket(b)?;
                waited += waiting.elapsed().as_secs_f64();
                // From the first update until the step ends, the parameters match no step
                // boundary: no emergency checkpoint may save them.
                *updating = true;
                optimizer.step_part(&mut params[start..end], grads, start, lr, b == 0)?;
                start = end;
            }
        }
        let waiting = Instant::now();
        reduce.wait()?;
        Ok((loss, waited + waiting.elapsed().as_secs_f64()))
    }
}
