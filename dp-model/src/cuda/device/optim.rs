//! The optimizers' updates and gradient clipping on the GPU, over the flat buffers, as the
//! CPU's `Sgd`, `Adam` and `clip_grad_norm`.

use std::ops::Range;

use dp_mem::Tag;

use super::buffers::CLIP_PARTS;
use super::{Device, DeviceBuf, GpuModel, ptr};
use crate::error::{Error, Result};
use crate::optim::{AdamConfig, AdamUpdate, SgdConfig};

impl<D: Device> GpuModel<D> {
    /// Makes the optimizer's updates cover only the parameters in `range` (a ZeRO-1 shard:
    /// the state buffers made after this are as long as the range, and decay ranges count
    /// from its start), as an optimizer built for a shard does on the CPU.
    pub fn set_update_range(&mut self, range: Range<usize>) -> Result<()> {
        if range.start > range.end || range.end > self.params.len() {
            return Err(Error::shape(
                "update range",
                format!("a range within {} parameters", self.params.len()),
                format!("{range:?}"),
            ));
        }
        self.update = range;
        Ok(())
    }

    /// The parameters and gradients the updates cover, as the kernels take them, and how
    /// many.
    pub(super) fn update_args(&self) -> (u64, u64, i64) {
        let start = 4 * self.update.start as u64;
        (ptr(&self.params) + start, ptr(&self.grads) + start, self.update.len() as i64)
    }

    /// Applies weight decay only to `ranges` of the updated parameters (sorted, disjoint,
    /// counted from the update range's start), as
    /// [`Optimizer::decay_only`](crate::Optimizer::decay_only) does: the usual exclusion of
    /// biases and norms ([`crate::ParamLayout::decayed_ranges`]).
    pub fn decay_only(&mut self, ranges: &[Range<usize>]) -> Result<()> {
        let sorted = ranges.windows(2).all(|w| w[0].end <= w[1].start);
        let len = self.update.len();
        if !sorted || ranges.iter().any(|r| r.start > r.end || r.end > len) {
            return Err(Error::shape(
                "decayed ranges",
                format!("sorted, disjoint ranges within {len} updated parameters"),
                format!("{ranges:?}"),
            ));
        }
        let pairs: Vec<i64> = ranges.iter().flat_map(|r| [r.start as i64, r.end as i64]).collect();
        let buf = self.pool.alloc::<i64>(pairs.len().max(1), Tag::OptState)?;
        self.copy_in(ptr(&buf), &pairs)?;
        self.synchronize()?;
        self.decayed = Some((buf, ranges.len() as i64));
        Ok(())
    }

    /// The decay ranges as the update kernels take them.
    pub(super) fn decay_args(&self) -> (u64, i64) {
        self.decayed.as_ref().map_or((0, -1), |(buf, count)| (ptr(buf), *count))
    }

    /// One SGD step over all parameters with the gradients on the device, as [`Sgd`]
    /// (`velocity`: its momentum buffer, from [`CudaModel::state_buffer`]; `None` without
    /// momentum).
    ///
    /// [`Sgd`]: crate::Sgd
    pub fn sgd_step(
        &mut self,
        velocity: Option<&mut DeviceBuf<f32, D>>,
        lr: f64,
        config: &SgdConfig,
    ) -> Result<()> {
        let (p, g, n) = self.update_args();
        let v = velocity.map_or(0, |v| ptr(v));
        let (lr, wd, mu, nesterov) = (
            lr as f32,
            config.weight_decay as f32,
            config.momentum as f32,
            i32::from(config.nesterov),
        );
        let (decayed, ranges) = self.decay_args();
        launch!(self, "dp_sgd_step", n as usize; p, g, v, n, lr, wd, mu, nesterov, decayed, ranges);
        Ok(())
    }

    /// One Adam (or AdamW) step, as [`Adam`] with its moments `m` and `v` (from
    /// [`CudaModel::state_buffer`]) after `steps` steps including this one.
    ///
    /// [`Adam`]: crate::Adam
    pub fn adam_step(
        &mut self,
        (m, v): (&mut DeviceBuf<f32, D>, &mut DeviceBuf<f32, D>),
        steps: u64,
        lr: f64,
        config: &AdamConfig,
    ) -> Result<()> {
        let s = AdamUpdate::new(config, steps, lr);
        let (p, g, n) = self.update_args();
        let (m, v) = (ptr(m), ptr(v));
        let (step_size, sqrt_c2) = (s.step_size as f32, s.sqrt_c2 as f32);
        let (b1, b2, eps) = (s.beta1 as f32, s.beta2 as f32, s.eps as f32);
        let (coupled_wd, shrink) = (s.coupled_wd as f32, s.shrink as f32);
        let (decayed, ranges) = self.decay_args();
        launch!(self, "dp_adam_step", n as usize; p, g, m, v, n, step_size, sqrt_c2, b1, b2, eps, coupled_wd, shrink, decayed, ranges);
        Ok(())
    }

    /// Queues the scaling of the gradients so their global L2 norm is at most `max_norm`, as
    /// [`clip_grad_norm`](crate::clip_grad_norm) (a non-finite norm leaves them as they are),
    /// without waiting for the device: the norm stays there.
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> Result<()> {
        let (g, n) = (ptr(&self.grads), self.grads.len() as i64);
        let (partials, parts) = (ptr(&self.work.clip), CLIP_PARTS as i64);
        let norm = partials + 8 * CLIP_PARTS as u64;
        launch!(self, "dp_square_partials", CLIP_PARTS; g, n, partials, parts);
        launch!(self, "dp_norm", 1; partials, parts, norm);
        launch!(self, "dp_clip", n as usize; g, n, norm, max_norm);
        Ok(())
    }

    /// Sets the pruning mask the parameters are held to (`words`: [`Pruner::mask_words`]) and
    /// applies it.
    ///
    /// [`Pruner::mask_words`]: crate::Pruner::mask_words
    pub fn set_prune_mask(&mut self, words: &[u64]) -> Result<()> {
        if words.len() != self.params.len().div_ceil(64) {
            return Err(Error::shape(
                "pruning mask",
                format!("{} words", self.params.len().div_ceil(64)),
                words.len(),
            ));
        }
        if self.prune_mask.as_ref().is_none_or(|m| m.len() != words.len()) {
            self.prune_mask = Some(self.pool.alloc::<u64>(words.len().max(1), Tag::OptState)?);
        }
        let mask = ptr(self.prune_mask.as_ref().expect("allocated above"));
        self.copy_in(mask, words)?;
        self.apply_prune_mask()?;
        self.synchronize()
    }

    /// Zeroes the pruned parameters again (after an update moved them), if a mask is set.
    pub fn apply_prune_mask(&mut self) -> Result<()> {
        let Some(mask) = &self.prune_mask else { return Ok(()) };
        let (p, mask, n) = (ptr(&self.params), ptr(mask), self.params.len() as i64);
        launch!(self, "dp_apply_mask", n as usize; p, mask, n);
        Ok(())
    }

    /// A zeroed device buffer as long as the updated parameters, for optimizer state (tag
    /// `OptState`).
    pub fn state_buffer(&self) -> Result<DeviceBuf<f32, D>> {
        let buf = self.pool.alloc::<f32>(self.update.len(), Tag::OptState)?;
        // SAFETY: a live device buffer of `len * 4` bytes; the device orders it before use.
        unsafe { self.device.zero(ptr(&buf), buf.len() * 4)? };
        Ok(buf)
    }
}
